//! The device every crate's GPU tests run on (call [`gpu_tests`] before anything else touches
//! CUDA in the test process):
//!
//! - a real GPU when one is usable (and `SINTER_CUDA_EMU` does not ask for emulation);
//! - without one, the emulated CUDA device — unless `SINTER_REQUIRE_GPU=1` (the GPU machine's
//!   runbook), which makes the test fail instead;
//! - without a C++ compiler either, the test prints `skipped: …` and passes, unless
//!   `SINTER_REQUIRE_EMU=1` (CI), which makes it fail.
//!
//! Tests that only mean something on real hardware (timing, real concurrency) ask
//! [`real_gpu_only`] instead, and are listed with the reason in README's GPU status.

use std::sync::OnceLock;

use crate::runtime::{self, Mode};

/// What the GPU tests of this process run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestDevice {
    /// A real GPU.
    Real,
    /// `n` emulated CUDA devices (not a GPU).
    Emulated(usize),
}

fn flag(var: &str) -> bool {
    std::env::var(var).as_deref() == Ok("1")
}

/// `SINTER_REQUIRE_GPU=1`: a GPU test without a real GPU fails instead of running emulated
/// or skipping.
pub fn require_gpu() -> bool {
    flag("SINTER_REQUIRE_GPU")
}

/// Choose (once per process) and report the device of the GPU tests; `emulated` is the number
/// of emulated devices to serve when there is no GPU (tests with several ranks need 2). `None`:
/// skip the test (the reason was printed).
pub fn gpu_tests(emulated: usize) -> Option<TestDevice> {
    static CHOSEN: OnceLock<std::result::Result<TestDevice, String>> = OnceLock::new();
    let chosen = CHOSEN.get_or_init(|| {
        let d = choose(emulated);
        match &d {
            Ok(TestDevice::Real) => eprintln!("GPU tests: on the real GPU"),
            Ok(TestDevice::Emulated(n)) => eprintln!(
                "GPU tests: on {n} {} (SINTER_REQUIRE_GPU=1 requires a real GPU instead)",
                crate::emulated::DEVICE_NAME
            ),
            Err(why) => eprintln!("GPU tests: {why}"),
        }
        d
    });
    match chosen {
        Ok(TestDevice::Emulated(n)) if *n < emulated => panic!(
            "this test needs {emulated} emulated devices but the process serves {n}: ask gpu_tests() for the largest number first"
        ),
        Ok(d) => Some(*d),
        Err(why) => {
            eprintln!("skipped: {why}");
            None
        }
    }
}

fn choose(emulated: usize) -> std::result::Result<TestDevice, String> {
    let env = runtime::parse_emu_var(std::env::var(runtime::EMU_VAR).ok().as_deref());
    let asked_emulation = matches!(env, Ok(Mode::Emulated { .. }));
    if require_gpu() {
        if asked_emulation || !runtime::real_gpu_usable() {
            panic!(
                "SINTER_REQUIRE_GPU=1 but no real GPU is used:\n{}",
                runtime::report()
            );
        }
        return Ok(TestDevice::Real);
    }
    if !asked_emulation && runtime::real_gpu_usable() {
        return match runtime::mode() {
            Ok(Mode::Real) => Ok(TestDevice::Real),
            other => panic!("a GPU is present but the process is in mode {other:?}"),
        };
    }
    let want = match env {
        Ok(Mode::Emulated { devices }) => devices.max(emulated),
        _ => emulated,
    };
    match runtime::enable_emulation(want) {
        Ok(()) => match runtime::mode() {
            Ok(Mode::Emulated { devices }) => Ok(TestDevice::Emulated(devices)),
            other => panic!("emulation enabled but the mode is {other:?}"),
        },
        Err(e @ crate::CudaError::Emulator { .. }) => {
            if flag("SINTER_REQUIRE_EMU") {
                panic!("SINTER_REQUIRE_EMU=1 but the emulated CUDA device cannot run: {e}");
            }
            Err(format!("no GPU, and no emulated CUDA device: {e}"))
        }
        Err(e) => panic!(
            "cannot select the emulated CUDA device for the GPU tests (was CUDA used before testing::gpu_tests?): {e}"
        ),
    }
}

/// For a test that needs real hardware (timing, real concurrency): true on a real GPU; else
/// prints `skipped: <why>` and returns false, or fails under `SINTER_REQUIRE_GPU=1`.
pub fn real_gpu_only(why: &str) -> bool {
    if runtime::real_gpu_usable() && !runtime::is_emulated() {
        return true;
    }
    if require_gpu() {
        panic!("SINTER_REQUIRE_GPU=1 but no real GPU is used ({why})");
    }
    eprintln!("skipped: needs a real GPU ({why})");
    false
}
