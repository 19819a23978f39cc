//! What the layers above the engine ask of CUDA without naming the backend crate (issue 26,
//! "a clean top floor"): which libraries load and each device's facts (`sinter info`, `--device
//! auto`), the emulated device (`--device cuda-emu`), capturing a training step as a CUDA graph
//! (`--cuda-graph`), and the GPU cost model behind `sinter bench gpu-model`. Only sinter-core
//! depends on sinter-cuda; the binary and the model crates come through here.

use std::sync::Arc;

use sinter_cuda::CudaDevice;

use super::{device, op_err};
use crate::{Device, Error, Result};

pub use sinter_cuda::runtime::{DeviceInfo, Libraries};

/// The GPU cost model (emulated devices in trace-only mode record every launch's bytes and
/// FLOPs; a named GPU's rates turn the record into a predicted time).
pub mod gpu_model {
    pub use sinter_cuda::emulated::cost::{self, Call};
    pub use sinter_cuda::emulated::gpu_model::{predict, Efficiency, GpuSpec, Prediction, Row};

    /// Make every emulated device a trace-only device shaped like `gpu` (nothing runs; every
    /// launch is recorded). Call before the first use of CUDA.
    pub fn enable_trace(gpu: GpuSpec) -> crate::Result<()> {
        sinter_cuda::emulated::enable_trace(gpu).map_err(super::op_err("enable_trace"))
    }
}

/// Which CUDA libraries load here (driver, NVRTC, cuBLASLt, cuDNN, NCCL).
pub fn libraries() -> Libraries {
    sinter_cuda::runtime::libraries()
}

/// The CUDA driver's device count, also where sinter's libraries are incomplete (for
/// `sinter info`, which reports GPUs it cannot use); `super::device_count` is what can be used.
pub fn visible_devices() -> Result<usize> {
    sinter_cuda::runtime::device_count().map_err(op_err("device_count"))
}

/// One device's name, memory, compute capability and library versions.
pub fn device_info(ordinal: usize) -> Result<DeviceInfo> {
    sinter_cuda::runtime::device_info(ordinal).map_err(op_err("device_info"))
}

/// Serve `devices` emulated CUDA devices (the real kernels run on the CPU by the kernel
/// emulator). Call before the first use of CUDA.
pub fn enable_emulation(devices: usize) -> Result<()> {
    sinter_cuda::runtime::enable_emulation(devices).map_err(op_err("enable_emulation"))
}

/// A captured step: replays everything `capture_step`'s body enqueued, on the device's stream.
pub struct StepGraph(sinter_cuda::graph::Graph);

impl StepGraph {
    /// Enqueue one run of the captured work (asynchronous, like the ops it recorded).
    pub fn replay(&self) -> Result<()> {
        self.0.replay().map_err(op_err("graph replay"))
    }
}

/// Captures everything `body` enqueues on CUDA device `device`'s stream (nothing runs while
/// capturing) as one graph. An error from `body` or the capture ends the capture; nothing of it
/// ran.
pub fn capture_step<E: From<Error>>(
    on: Device,
    body: impl FnOnce() -> std::result::Result<(), E>,
) -> std::result::Result<StepGraph, E> {
    let Device::Cuda(ordinal) = on else {
        return Err(Error::Msg(format!("a step graph needs a CUDA device, not {on:?}")).into());
    };
    let dev: Arc<CudaDevice> = device(ordinal)?;
    let capture = sinter_cuda::graph::begin_capture(&dev).map_err(op_err("begin_capture"))?;
    body()?;
    Ok(StepGraph(capture.finish().map_err(op_err("end_capture"))?))
}

/// dst = src through the driver's device-to-device copy (no kernel): the practical bandwidth
/// ceiling `sinter bench gpu` holds kernels to. Both contiguous, one dtype, one CUDA device,
/// not overlapping.
pub fn driver_copy(dst: &crate::Tensor, src: &crate::Tensor) -> Result<()> {
    use crate::storage::Storage;
    if dst.shape() != src.shape() || dst.dtype() != src.dtype() || dst.shares_storage_with(src) {
        return Err(Error::Msg(format!(
            "driver_copy: needs two separate tensors of one shape and dtype; got {:?} {:?} and {:?} {:?}",
            dst.shape(),
            dst.dtype(),
            src.shape(),
            src.dtype()
        )));
    }
    let (Some(dr), Some(sr)) = (
        dst.layout().contiguous_range(),
        src.layout().contiguous_range(),
    ) else {
        return Err(Error::Msg(
            "driver_copy: both tensors must be contiguous".into(),
        ));
    };
    let (s, d) = (src.storage(), dst.write_storage());
    match (&*s, &*d) {
        (Storage::Cuda(s), Storage::Cuda(d)) if Arc::ptr_eq(s.device(), d.device()) => {
            let from = s
                .buffer()
                .slice(sr.start, sr.len())
                .map_err(op_err("driver_copy"))?;
            let to = d
                .buffer()
                .slice(dr.start, dr.len())
                .map_err(op_err("driver_copy"))?;
            d.device().copy(from, to).map_err(op_err("driver_copy"))
        }
        _ => Err(Error::Msg(format!(
            "driver_copy: both tensors must be on one CUDA device; got {:?} and {:?}",
            dst.device(),
            src.device()
        ))),
    }
}
