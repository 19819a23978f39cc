//! The CUDA backend of the tensors, over `sinter-cuda` (NVRTC kernels, cuBLASLt, the caching
//! allocator).
//!
//! Dispatch: every op in `tensor.rs`, `ops.rs`, `nn_ops.rs` and `fused/` checks
//! `device().is_cuda()` and, for device tensors, calls into this module instead of a CPU kernel.
//! Ops whose backward is written in terms of other tensor ops (binary, unary, reductions,
//! matmul, where, cast, contiguous) only swap the storage they produce; ops whose backward calls
//! a fused kernel (softmax, layer norm, cross-entropy, conv2d, pooling, index_select/index_add,
//! cat, dropout) are implemented here whole, autograd node included. i64 tensors live on the
//! device too: creation, arithmetic, comparisons, where, reductions, gathers and casts run in
//! kernels (`kernels/int.cu`); device-resident indices (cross-entropy targets, index_select /
//! embedding / index_add ids) are validated on the device and a bad one is reported at the next
//! read (see `checks`). conv2d runs through cuDNN when it loads, else im2col + cuBLASLt (`conv`).
//!
//! Memory: everything is allocated from the allocator's `Temporary` pool; the first
//! `adamw_step` / `sgd_step` moves each parameter and its optimizer state (in place, for all
//! views) into the `Permanent` pool, where they stay for the run.
//! All work of a device is ordered on its one stream; only reading values back
//! (`to_vec_*`, `to_device(Cpu)`) and the host-checked index ops wait for it.

pub(crate) mod checks;
pub(crate) mod conv;
pub(crate) mod creation;
pub(crate) mod elementwise;
pub(crate) mod fused;
pub(crate) mod matmul;
pub(crate) mod nn;
pub(crate) mod optim;
pub(crate) mod random;
pub(crate) mod reduce;
pub mod storage;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use sinter_cuda::{CudaDevice, CudaError, DevSlice, DeviceBuffer};

pub use sinter_cuda::Pool;
pub use storage::CudaStorage;

use crate::storage::Storage;
use crate::{DType, Device, Error, Result, Tensor};

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

/// The allocator pool holding a CUDA tensor's buffer (None for a CPU tensor).
pub fn buffer_pool(t: &Tensor) -> Option<Pool> {
    t.storage().as_cuda().map(|s| s.pool())
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

/// Wait until all queued work on device `ordinal` has finished (for timings).
/// Also returns the error of a bad device-resident index found since the last read (see
/// `checks`).
pub fn synchronize(ordinal: usize) -> Result<()> {
    let dev = device(ordinal)?;
    dev.synchronize().map_err(op_err("synchronize"))?;
    checks::take_error(&dev)
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

/// A window of device memory: `len` elements of `buf` from element `off`. Holding it keeps the
/// buffer alive; kernels read it through [`DevView::slice`].
#[derive(Clone, Debug)]
pub(crate) struct DevView {
    pub buf: Arc<DeviceBuffer>,
    pub off: usize,
    pub len: usize,
}

impl DevView {
    pub fn whole(buf: Arc<DeviceBuffer>) -> DevView {
        let len = buf.len();
        DevView { buf, off: 0, len }
    }
    pub fn slice(&self) -> DevSlice<'_> {
        self.buf
            .slice(self.off, self.len)
            .expect("a DevView lies inside its buffer")
    }
}

/// `buf` from element `off` to its end (a strided operand's data).
pub(crate) fn tail_of<'a>(
    buf: &'a DeviceBuffer,
    off: usize,
    op: &'static str,
) -> Result<DevSlice<'a>> {
    buf.slice(off, buf.len().saturating_sub(off)).on(op)
}

/// The whole of an optional buffer.
pub(crate) fn opt_slice(b: &Option<Arc<DeviceBuffer>>) -> Option<DevSlice<'_>> {
    b.as_ref().map(|b| b.as_slice())
}

/// The device and buffer of a CUDA tensor.
pub(crate) fn parts(t: &Tensor) -> Result<(Arc<CudaDevice>, Arc<DeviceBuffer>)> {
    let s = t.storage();
    match s.as_cuda() {
        Some(c) => Ok((c.device().clone(), c.buffer().clone())),
        None => Err(Error::Msg(format!(
            "internal error: expected a CUDA tensor, got one on {}",
            t.device()
        ))),
    }
}

/// Both tensors on the same device, else `Error::DeviceMismatch`.
pub(crate) fn same_device(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.device() != b.device() {
        return Err(Error::DeviceMismatch {
            op,
            lhs: a.device(),
            rhs: b.device(),
        });
    }
    Ok(())
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

/// Storage owning `buf` on `dev`.
pub(crate) fn storage_of(dev: &Arc<CudaDevice>, buf: Arc<DeviceBuffer>, dtype: DType) -> Storage {
    Storage::Cuda(CudaStorage::new(dev.clone(), buf, dtype))
}

/// A fresh contiguous tensor of `shape` owning `buf`, recording nothing.
pub(crate) fn tensor_of(
    dev: &Arc<CudaDevice>,
    buf: Arc<DeviceBuffer>,
    dtype: DType,
    shape: &[usize],
) -> Tensor {
    Tensor::from_storage(storage_of(dev, buf, dtype), shape)
}

/// Element strides of a layout as the kernels take them.
pub(crate) fn strides_i64(l: &crate::Layout) -> Vec<i64> {
    l.strides().iter().map(|&s| s as i64).collect()
}

/// The tensor's elements as a contiguous device window: the tensor's own memory when it is
/// contiguous, else a gathered copy.
pub(crate) fn contig(t: &Tensor) -> Result<DevView> {
    let (dev, buf) = parts(t)?;
    let l = t.layout();
    if let Some(r) = l.contiguous_range() {
        return Ok(DevView {
            buf,
            off: r.start,
            len: r.len(),
        });
    }
    let n = l.numel();
    let out = alloc(&dev, n, t.dtype())?;
    gather_into(&dev, &buf, l, &out, 0)?;
    Ok(DevView::whole(out))
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

/// Contiguous and of `dtype` (cast on the device when it differs).
pub(crate) fn contig_as(t: &Tensor, dtype: DType) -> Result<DevView> {
    let v = contig(t)?;
    if t.dtype() == dtype {
        return Ok(v);
    }
    let (dev, _) = parts(t)?;
    let out = alloc(&dev, v.len, dtype)?;
    sinter_cuda::ops::copy::cast(&dev, v.slice(), out.as_slice()).on("to_dtype")?;
    Ok(DevView::whole(out))
}

/// The tensor's values as a CPU tensor (contiguous, detached): a device-to-host copy.
pub(crate) fn to_host(t: &Tensor) -> Result<Tensor> {
    creation::download(t)
}

// ---- for the distributed layer (NCCL reads and writes gradients in place) ----------------------

/// The device, the buffer and the element range of a CUDA tensor whose elements are contiguous
/// (`None` for a CPU tensor or a strided view: call `contiguous()` first).
pub fn contiguous_parts(
    t: &Tensor,
) -> Option<(Arc<CudaDevice>, Arc<DeviceBuffer>, std::ops::Range<usize>)> {
    let range = t.layout().contiguous_range()?;
    let s = t.storage();
    let c = s.as_cuda()?;
    Some((c.device().clone(), c.buffer().clone(), range))
}

/// A contiguous tensor of `shape` owning `buf` on `dev` (its dtype must match `dtype`).
pub fn tensor_from_buffer(
    dev: &Arc<CudaDevice>,
    buf: Arc<DeviceBuffer>,
    dtype: DType,
    shape: &[usize],
) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    if buf.dtype() != dtype || buf.len() != n {
        return Err(Error::Msg(format!(
            "tensor_from_buffer: a {} x {:?} buffer cannot hold a {dtype:?} tensor of shape {shape:?}",
            buf.len(),
            buf.dtype()
        )));
    }
    Ok(tensor_of(dev, buf, dtype, shape))
}

/// The process-wide device for `ordinal` (the one whose stream every tensor op is ordered on).
pub fn shared_device(ordinal: usize) -> Result<Arc<CudaDevice>> {
    device(ordinal)
}
