//! The CUDA backend: `CudaStorage` and its implementation of the backend seam's primitives
//! (`crate::backend`) over `sinter-cuda` (NVRTC kernels, cuBLASLt, cuDNN, the caching
//! allocator), plus the process-wide device functions (availability, memory statistics,
//! synchronisation, TF32 and conv2d choices). Nothing here sees a tensor or records a gradient:
//! the ops and their backward rules live once, above the seam.
//!
//! One file per primitive family: `elementwise`, `reduce`, `matmul` (with the GELU epilogue),
//! `conv` (cuDNN when it loads, else im2col + cuBLASLt), `nn` (row kernels and index gathers /
//! scatter-adds), `random` (Philox dropout), `creation` (fills,
//! uploads, downloads, the permanent pool); the optimizer steps live in
//! `kernels/optimizer/` (issue 26 item 1). i64 tensors live on the device too (`kernels/int.cu`); device-resident
//! indices are validated on the device and a bad one is reported at the next read (`checks`).
//!
//! Memory: everything is allocated from the allocator's `Temporary` pool; the first
//! `adamw_step` / `sgd_step` moves each parameter and its optimizer state (in place, for all
//! views) into the `Permanent` pool, where they stay for the run.
//! All work of a device is ordered on its one stream; only reading values back
//! (`to_vec_*`, `to_device(Cpu)`) waits for it.

pub(crate) mod checks;
pub(crate) mod conv;
pub(crate) mod creation;
pub(crate) mod elementwise;
mod gemm_align;
pub(crate) mod matmul;
pub(crate) mod nn;
mod primitives;
pub(crate) mod random;
pub(crate) mod reduce;
pub mod runtime;
pub mod storage;

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use sinter_cuda::{CudaDevice, CudaError, DeviceBuffer};

pub use checks::synchronize;
pub use sinter_cuda::Pool;
pub use storage::CudaStorage;

use crate::{DType, Device, Error, Result};

/// True when CUDA can be used here: the driver, NVRTC and cuBLASLt load and a device is visible.
/// Never panics.
pub fn is_available() -> bool {
    sinter_cuda::is_available()
}

/// Number of visible CUDA devices (0 where CUDA cannot be used).
pub fn device_count() -> usize {
    if is_available() {
        sinter_cuda::device_count().unwrap_or(0)
    } else {
        0
    }
}

/// What loads, what is missing and how to fix it (the text of `Error::DeviceUnavailable`).
pub fn report() -> String {
    sinter_cuda::report()
}

/// Device memory held by sinter's caching allocator on one GPU, in bytes (bucket sizes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Held by live tensors (and the cuBLASLt workspace).
    pub in_use: usize,
    /// Obtained from the driver: in use plus cached free blocks.
    pub reserved: usize,
    /// Highest `in_use` since the device was first used (or the last `reset_peak_memory`).
    pub peak: usize,
    /// `in_use` of the permanent pool (parameters, optimizer state).
    pub permanent: usize,
    /// `in_use` of the temporary pool (activations, gradients, workspaces).
    pub temporary: usize,
}

/// Memory statistics of CUDA device `ordinal` (for the trainer's `peak_device_memory_bytes`).
pub fn memory_stats(ordinal: usize) -> Result<DeviceMemory> {
    let s = device(ordinal)?.memory_stats();
    Ok(DeviceMemory {
        in_use: s.in_use(),
        reserved: s.reserved(),
        peak: s.peak_in_use,
        permanent: s.permanent.in_use,
        temporary: s.temporary.in_use,
    })
}

/// Restart the peak of [`memory_stats`] from the current use.
pub fn reset_peak_memory(ordinal: usize) -> Result<()> {
    device(ordinal)?.allocator().reset_peak();
    Ok(())
}

/// Return the allocator's cached (free) blocks of device `ordinal` to the driver.
pub fn empty_cache(ordinal: usize) -> Result<()> {
    device(ordinal)?
        .empty_cache()
        .map_err(op_err("empty_cache"))
}

fn tf32_flag() -> &'static AtomicBool {
    static FLAG: OnceLock<AtomicBool> = OnceLock::new();
    FLAG.get_or_init(|| {
        let on = matches!(
            std::env::var("SINTER_CUDA_TF32").as_deref(),
            Ok("1" | "true" | "on")
        );
        AtomicBool::new(on)
    })
}

/// Let f32 matrix products (matmul, conv2d) use TF32 tensor cores: about 8x the FP32 rate, with
/// 10-bit-mantissa products (relative error around 1e-3). Off by default (exact FP32 math);
/// the environment variable `SINTER_CUDA_TF32=1` turns it on at start-up.
pub fn set_allow_tf32(on: bool) {
    tf32_flag().store(on, Ordering::Relaxed);
}

/// Whether f32 matrix products use TF32 (see [`set_allow_tf32`]).
pub fn allow_tf32() -> bool {
    tf32_flag().load(Ordering::Relaxed)
}

/// Which implementation conv2d uses on CUDA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvBackend {
    /// cuDNN when it loads and supports the shape, else im2col + GEMM (the default).
    Auto,
    /// Always im2col + cuBLASLt GEMM (for comparisons; `SINTER_CONV=im2col` at start-up).
    Im2col,
}

fn conv_flag() -> &'static AtomicBool {
    static FLAG: OnceLock<AtomicBool> = OnceLock::new();
    FLAG.get_or_init(|| {
        AtomicBool::new(matches!(
            std::env::var("SINTER_CONV").as_deref(),
            Ok("im2col")
        ))
    })
}

/// Chooses the CUDA conv2d implementation for the following calls (process-wide).
pub fn set_conv_backend(b: ConvBackend) {
    conv_flag().store(b == ConvBackend::Im2col, Ordering::Relaxed);
}

/// The CUDA conv2d implementation in use (see [`set_conv_backend`]).
pub fn conv_backend() -> ConvBackend {
    if conv_flag().load(Ordering::Relaxed) {
        ConvBackend::Im2col
    } else {
        ConvBackend::Auto
    }
}

/// When a GEMM whose sizes or rows are not 16-byte aligned runs on zero-padded copies of its
/// operands (see `gemm_align`: cuBLASLt's fast Hopper kernels need aligned m, n, k and rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmPadding {
    /// When the GEMM is large enough for the faster kernel to repay the copies (the default).
    Auto,
    /// Whenever an operand is misaligned (for tests and comparisons; `SINTER_GEMM_PAD=always`).
    Always,
    /// Never: cuBLASLt reads the operands as they are (`SINTER_GEMM_PAD=never`).
    Never,
}

fn gemm_padding_flag() -> &'static AtomicU8 {
    static FLAG: OnceLock<AtomicU8> = OnceLock::new();
    FLAG.get_or_init(|| {
        let mode = match std::env::var("SINTER_GEMM_PAD").as_deref() {
            Ok("always") => GemmPadding::Always,
            Ok("never") => GemmPadding::Never,
            _ => GemmPadding::Auto,
        };
        AtomicU8::new(mode as u8)
    })
}

/// Chooses when matmuls pad misaligned operands, for the following calls (process-wide).
pub fn set_gemm_padding(mode: GemmPadding) {
    gemm_padding_flag().store(mode as u8, Ordering::Relaxed);
}

/// The padding rule in use (see [`set_gemm_padding`]).
pub fn gemm_padding() -> GemmPadding {
    match gemm_padding_flag().load(Ordering::Relaxed) {
        x if x == GemmPadding::Always as u8 => GemmPadding::Always,
        x if x == GemmPadding::Never as u8 => GemmPadding::Never,
        _ => GemmPadding::Auto,
    }
}

pub(crate) static PADDED_GEMMS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// GEMMs (matmul, linear, conv2d's im2col) that ran on padded, 16-byte aligned copies in this
/// process (see [`GemmPadding`]).
pub fn padded_gemms() -> u64 {
    PADDED_GEMMS.load(Ordering::Relaxed)
}

/// True when `libcudnn` loads here (conv2d then runs through it unless told otherwise).
pub fn cudnn_available() -> bool {
    sinter_cuda::cudnn::available()
}

pub(crate) static CUDNN_PASSES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// conv2d passes (forward, backward-data, backward-filter) cuDNN has run in this process.
pub fn cudnn_conv_passes() -> u64 {
    CUDNN_PASSES.load(Ordering::Relaxed)
}

// ---- internal helpers ---------------------------------------------------------------------------

/// The device for `ordinal`, or `Error::DeviceUnavailable` with the loader's explanation.
pub(crate) fn device(ordinal: usize) -> Result<Arc<CudaDevice>> {
    let unavailable = |why: String| Error::DeviceUnavailable(Device::Cuda(ordinal), why);
    if !sinter_cuda::is_available() {
        return Err(unavailable(sinter_cuda::report()));
    }
    let count = sinter_cuda::device_count().unwrap_or(0);
    if ordinal >= count {
        return Err(unavailable(format!(
            "there is no CUDA device {ordinal}: {count} visible (cuda:0 .. cuda:{})",
            count.saturating_sub(1)
        )));
    }
    CudaDevice::get(ordinal).map_err(|e| unavailable(format!("{e}\n{}", sinter_cuda::report())))
}

/// Maps a sinter-cuda error to this crate's, naming the op.
pub(crate) fn op_err(op: &'static str) -> impl Fn(CudaError) -> Error {
    move |e| Error::Msg(format!("{op} (CUDA): {e}"))
}

/// `.on("op")?` on a sinter-cuda result.
pub(crate) trait OnOp<T> {
    fn on(self, op: &'static str) -> Result<T>;
}
impl<T> OnOp<T> for sinter_cuda::Result<T> {
    fn on(self, op: &'static str) -> Result<T> {
        self.map_err(op_err(op))
    }
}

/// A new uninitialised buffer from the temporary pool.
pub(crate) fn alloc(dev: &CudaDevice, len: usize, dtype: DType) -> Result<Arc<DeviceBuffer>> {
    Ok(Arc::new(
        dev.alloc(len, dtype, Pool::Temporary).on("alloc")?,
    ))
}

/// A new zero-filled buffer from the temporary pool.
pub(crate) fn alloc_zeros(dev: &CudaDevice, len: usize, dtype: DType) -> Result<Arc<DeviceBuffer>> {
    Ok(Arc::new(
        dev.alloc_zeros(len, dtype, Pool::Temporary).on("alloc")?,
    ))
}

/// Element strides of a layout as the kernels take them.
pub(crate) fn strides_i64(l: &crate::Layout) -> Vec<i64> {
    l.strides().iter().map(|&s| s as i64).collect()
}

/// `dst[dst_off ..]` (contiguous, `l.shape()`) = the elements `l` addresses in `src`.
pub(crate) fn gather_into(
    dev: &CudaDevice,
    src: &DeviceBuffer,
    l: &crate::Layout,
    dst: &DeviceBuffer,
    dst_off: usize,
) -> Result<()> {
    let n = l.numel();
    if n == 0 {
        return Ok(());
    }
    let s = src
        .slice(l.offset(), src.len() - l.offset())
        .on("contiguous")?;
    let d = dst.slice(dst_off, n).on("contiguous")?;
    sinter_cuda::ops::copy::contiguous(dev, s, &strides_i64(l), l.shape(), d).on("contiguous")
}

/// The process-wide device for `ordinal` (the one whose stream every tensor op is ordered on).
pub fn shared_device(ordinal: usize) -> Result<Arc<CudaDevice>> {
    device(ordinal)
}
