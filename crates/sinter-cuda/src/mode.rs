//! The process's choice between real GPUs and emulated devices ([`Mode`], fixed once) and what
//! a device is ([`DeviceInfo`]): below both drivers, which read them, and the runtime, which
//! makes the choice and answers the queries (`crate::runtime` re-exports all of it).

use std::sync::OnceLock;

use crate::error::{CudaError, Result};

/// How this process serves CUDA devices: the GPUs the driver sees, or emulated devices (see
/// [`crate::emulated`]). Chosen once per process, explicitly: by `SINTER_CUDA_EMU` or by
/// [`enable_emulation`](crate::runtime::enable_emulation) before the first use; never as a fall-back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Real GPUs through the CUDA driver.
    Real,
    /// `devices` emulated CUDA devices (the CPU kernel emulator and host libraries); not a GPU.
    Emulated { devices: usize },
}

/// The environment variable that selects emulated devices: `1` (or `N` for N devices); unset or
/// `0` for real GPUs.
pub const EMU_VAR: &str = "SINTER_CUDA_EMU";

/// At most this many emulated devices.
pub const MAX_EMULATED_DEVICES: usize = 64;

/// The mode `SINTER_CUDA_EMU=value` asks for (`None`: unset), or why the value is bad.
pub fn parse_emu_var(value: Option<&str>) -> std::result::Result<Mode, String> {
    match value.map(str::trim) {
        None | Some("") | Some("0") => Ok(Mode::Real),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=MAX_EMULATED_DEVICES).contains(&n) => Ok(Mode::Emulated { devices: n }),
            _ => Err(format!(
                "{EMU_VAR}={v}: expected the number of emulated CUDA devices (1 to {MAX_EMULATED_DEVICES}), or 0 for real GPUs"
            )),
        },
    }
}

fn mode_cell() -> &'static OnceLock<std::result::Result<Mode, String>> {
    static MODE: OnceLock<std::result::Result<Mode, String>> = OnceLock::new();
    &MODE
}

/// The process's mode, fixed at the first call (from `SINTER_CUDA_EMU`) unless
/// [`enable_emulation`](crate::runtime::enable_emulation) fixed it before. `Err` says what is wrong with the variable.
pub fn mode() -> std::result::Result<Mode, String> {
    mode_cell()
        .get_or_init(|| parse_emu_var(std::env::var(EMU_VAR).ok().as_deref()))
        .clone()
}

/// Fix the process's mode to `devices` emulated devices (`runtime::enable_emulation` without
/// its check that the emulator can run here): an error when the mode is already fixed to real
/// GPUs or to fewer emulated devices.
pub(crate) fn select_emulation(devices: usize) -> Result<()> {
    if !(1..=MAX_EMULATED_DEVICES).contains(&devices) {
        return Err(CudaError::invalid(
            "enable_emulation",
            format!("{devices} devices: between 1 and {MAX_EMULATED_DEVICES}"),
        ));
    }
    let _ = mode_cell().set(Ok(Mode::Emulated { devices }));
    match mode() {
        Ok(Mode::Emulated { devices: n }) if n >= devices => Ok(()),
        Ok(Mode::Emulated { devices: n }) => Err(CudaError::invalid(
            "enable_emulation",
            format!("{devices} emulated devices asked for, but this process already serves {n} ({EMU_VAR}={n})"),
        )),
        Ok(Mode::Real) => Err(CudaError::invalid(
            "enable_emulation",
            "this process already uses real CUDA devices; select the emulated device before the first use of CUDA (or set SINTER_CUDA_EMU=1)",
        )),
        Err(m) => Err(CudaError::invalid("enable_emulation", m)),
    }
}

/// True when this process serves emulated CUDA devices (fixes the mode, see [`mode`]).
pub fn is_emulated() -> bool {
    matches!(mode(), Ok(Mode::Emulated { .. }))
}

/// What one device is, and which library versions it would run with.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// Bytes of device memory.
    pub total_memory: usize,
    /// (major, minor), e.g. (9, 0) for H100/H200.
    pub compute_capability: (u32, u32),
    pub multiprocessors: u32,
    pub driver_version: Option<(u32, u32)>,
    /// The CUDA runtime cuBLASLt was built for.
    pub cuda_runtime_version: Option<(u32, u32)>,
    pub nvrtc_version: Option<(u32, u32)>,
    pub cublas_version: Option<(u32, u32, u32)>,
    pub cudnn_version: Option<(u32, u32, u32)>,
    pub nccl_version: Option<(u32, u32, u32)>,
}

impl DeviceInfo {
    /// NVRTC architecture name for this device, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        arch_name(self.compute_capability)
    }
}

/// `sm_XY` from a compute capability.
pub fn arch_name((major, minor): (u32, u32)) -> String {
    format!("sm_{major}{minor}")
}
