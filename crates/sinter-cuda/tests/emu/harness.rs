//! Shared helpers of the emulated-kernel tests: guarded host buffers, the emulator, tolerances.
// Each emulated_*.rs test binary includes this module and uses part of it.
#![allow(dead_code)]

use std::sync::OnceLock;

use half::{bf16, f16};
use sinter_cuda::emu::{Emulator, Order};
use sinter_cuda::launch::{Launch, LaunchTarget, Step};
use sinter_cuda::{DType, DevSlice};

/// Small targets, so grid-stride loops run more than one sweep.
pub const T1: LaunchTarget = LaunchTarget { sm_count: 1 };
pub const T2: LaunchTarget = LaunchTarget { sm_count: 2 };
pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The emulator, or None (test skipped) when no C++ compiler is installed; with
/// SINTER_REQUIRE_EMU=1 a missing compiler fails the test instead.
pub fn emu() -> Option<&'static Emulator> {
    static E: OnceLock<Option<Emulator>> = OnceLock::new();
    let e = E.get_or_init(|| {
        // The emulated CUDA device's cache: every kernel file is built once for all tests.
        match Emulator::new(sinter_cuda::emu::default_cache_dir()) {
            Ok(e) => Some(e),
            Err(err) => {
                if std::env::var("SINTER_REQUIRE_EMU").as_deref() == Ok("1") {
                    panic!("SINTER_REQUIRE_EMU=1 but the emulator is unavailable: {err}");
                }
                None
            }
        }
    });
    if e.is_none() {
        eprintln!("skipped: no C++ compiler");
    }
    e.as_ref()
}

const GUARD: usize = 64;
const CANARY: u8 = 0xA5;

/// A host buffer laid out like device memory: 64-byte aligned, optionally shifted by whole
/// elements (an unaligned view), between two canary zones checked after every run.
pub struct Buf {
    mem: Vec<u8>,
    start: usize,
    pub len: usize,
    pub dtype: DType,
}

impl Buf {
    /// A buffer the kernel is to write, filled with 0xFF bytes (NaN for floats, -1 for
    /// integers) like uninitialised device memory, so an element a kernel forgets to write
    /// cannot pass for a correct zero.
    pub fn zeros(dtype: DType, len: usize, shift: usize) -> Buf {
        Buf::filled(dtype, len, shift, 0xFF)
    }
    fn filled(dtype: DType, len: usize, shift: usize, byte: u8) -> Buf {
        let bytes = len * dtype.size();
        let mut mem = vec![CANARY; bytes + shift * dtype.size() + 2 * GUARD + 128];
        let base = mem.as_ptr() as usize;
        let start = (base.div_ceil(64) * 64 - base) + GUARD + shift * dtype.size();
        mem[start..start + bytes].fill(byte);
        Buf {
            mem,
            start,
            len,
            dtype,
        }
    }
    pub fn from_f64(dtype: DType, v: &[f64], shift: usize) -> Buf {
        let mut b = Buf::filled(dtype, v.len(), shift, 0);
        b.set(v);
        b
    }
    pub fn from_i64(v: &[i64]) -> Buf {
        let mut b = Buf::filled(DType::I64, v.len(), 0, 0);
        for (i, x) in v.iter().enumerate() {
            b.bytes_mut()[i * 8..i * 8 + 8].copy_from_slice(&x.to_le_bytes());
        }
        b
    }
    pub fn bytes(&self) -> &[u8] {
        &self.mem[self.start..self.start + self.len * self.dtype.size()]
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.len * self.dtype.size();
        &mut self.mem[self.start..self.start + n]
    }
    pub fn ptr(&self) -> u64 {
        self.mem.as_ptr() as u64 + self.start as u64
    }
    pub fn slice(&self) -> DevSlice<'static> {
        // SAFETY: the slice addresses this buffer, which outlives every run in the tests.
        unsafe { DevSlice::from_raw(self.ptr(), self.len, self.dtype) }
    }
    pub fn set(&mut self, v: &[f64]) {
        assert_eq!(v.len(), self.len);
        let d = self.dtype;
        let b = self.bytes_mut();
        for (i, &x) in v.iter().enumerate() {
            match d {
                DType::F32 => b[i * 4..i * 4 + 4].copy_from_slice(&(x as f32).to_le_bytes()),
                DType::F16 => {
                    b[i * 2..i * 2 + 2].copy_from_slice(&f16::from_f32(x as f32).to_le_bytes())
                }
                DType::BF16 => {
                    b[i * 2..i * 2 + 2].copy_from_slice(&bf16::from_f32(x as f32).to_le_bytes())
                }
                DType::I64 => b[i * 8..i * 8 + 8].copy_from_slice(&(x as i64).to_le_bytes()),
                DType::I32 => b[i * 4..i * 4 + 4].copy_from_slice(&(x as i32).to_le_bytes()),
                DType::U8 => b[i] = x as u8,
                DType::Bool => b[i] = (x != 0.0) as u8,
            }
        }
    }
    pub fn get(&self) -> Vec<f64> {
        let b = self.bytes();
        (0..self.len)
            .map(|i| match self.dtype {
                DType::F32 => f32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()) as f64,
                DType::F16 => f16::from_le_bytes(b[i * 2..i * 2 + 2].try_into().unwrap()).to_f64(),
                DType::BF16 => {
                    bf16::from_le_bytes(b[i * 2..i * 2 + 2].try_into().unwrap()).to_f64()
                }
                DType::I64 => i64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()) as f64,
                DType::I32 => i32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()) as f64,
                DType::U8 | DType::Bool => b[i] as f64,
            })
            .collect()
    }
    pub fn get_i64(&self) -> Vec<i64> {
        assert_eq!(self.dtype, DType::I64);
        self.bytes()
            .chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
    /// Panics when a kernel wrote outside the buffer.
    pub fn check_guards(&self, what: &str) {
        let n = self.len * self.dtype.size();
        let before = &self.mem[self.start - GUARD..self.start];
        let after = &self.mem[self.start + n..self.start + n + GUARD];
        assert!(
            before.iter().chain(after).all(|&b| b == CANARY),
            "{what}: a kernel wrote outside a buffer of {} x {:?}",
            self.len,
            self.dtype
        );
    }
}

/// The value `x` becomes when stored as `d` (so references start from the same inputs).
pub fn q(d: DType, x: f64) -> f64 {
    match d {
        DType::F32 => x as f32 as f64,
        DType::F16 => f16::from_f32(x as f32).to_f64(),
        DType::BF16 => bf16::from_f32(x as f32).to_f64(),
        _ => x,
    }
}

/// (relative, absolute) tolerance for results stored as `d`: two units in the last place of the
/// storage type, plus room for f32 arithmetic.
pub fn tol(d: DType) -> (f64, f64) {
    match d {
        DType::F32 => (2e-5, 2e-6),
        DType::F16 => (2e-3, 2e-4),
        DType::BF16 => (1.6e-2, 2e-3),
        _ => (0.0, 0.0),
    }
}

pub fn assert_close(what: &str, got: &[f64], want: &[f64], (rtol, atol): (f64, f64)) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= atol + rtol * w.abs()
        };
        assert!(ok, "{what}: element {i}: got {g}, want {w}");
    }
}

/// A deterministic generator of test inputs.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
    pub fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Run steps once, threads in forward order; then check the canaries of `bufs`.
pub fn exec(e: &Emulator, steps: &[Step], bufs: &[&Buf]) {
    // SAFETY: every pointer in the steps comes from a live `Buf` of the calling test.
    run_once(
        &step_names(steps),
        |o| unsafe { e.run_steps(steps, o) },
        bufs,
    );
}

pub fn exec1(e: &Emulator, l: Launch, bufs: &[&Buf]) {
    exec(e, &[Step::Kernel(l)], bufs);
}

/// Run steps in forward thread order and again, from the same inputs, in reverse order; the
/// results must be bit-identical (a missing barrier or order-dependent sum would differ).
pub fn exec_both(e: &Emulator, steps: &[Step], bufs: &mut [&mut Buf]) {
    // SAFETY: as in `exec`.
    run_twice(
        &step_names(steps),
        |o| unsafe { e.run_steps(steps, o) },
        bufs,
    );
}

/// [`exec`] for any way of running kernels on the emulator (`run` gets the thread order), e.g.
/// a custom kernel source's launches: `names` names what ran, in messages.
pub fn run_once(names: &str, run: impl FnOnce(Order) -> sinter_cuda::Result<()>, bufs: &[&Buf]) {
    run(Order::Forward).unwrap_or_else(|err| panic!("{err}"));
    for b in bufs {
        b.check_guards(names);
    }
}

/// [`exec_both`] for any way of running kernels on the emulator (see [`run_once`]).
pub fn run_twice(
    names: &str,
    run: impl Fn(Order) -> sinter_cuda::Result<()>,
    bufs: &mut [&mut Buf],
) {
    let before: Vec<Vec<u8>> = bufs.iter().map(|b| b.bytes().to_vec()).collect();
    run(Order::Forward).unwrap_or_else(|err| panic!("{err}"));
    let fwd: Vec<Vec<u8>> = bufs.iter().map(|b| b.bytes().to_vec()).collect();
    for (b, s) in bufs.iter_mut().zip(&before) {
        b.bytes_mut().copy_from_slice(s);
    }
    run(Order::Reverse).unwrap_or_else(|err| panic!("{err}"));
    for (k, (b, f)) in bufs.iter().zip(&fwd).enumerate() {
        b.check_guards(names);
        assert!(
            b.bytes() == f.as_slice(),
            "{names}: buffer {k} differs between forward and reverse thread order (missing barrier?)"
        );
    }
}

pub fn step_names(steps: &[Step]) -> String {
    steps
        .iter()
        .map(|s| match s {
            Step::Kernel(l) => l.name.clone(),
            Step::Zero { .. } => "memset".into(),
            Step::Copy { .. } => "memcpy".into(),
        })
        .collect::<Vec<_>>()
        .join("+")
}
