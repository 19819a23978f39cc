//! sinter-cuda: the CUDA layer under sinter's tensor crate.
//!
//! - [`runtime`]: guarded dynamic loading — [`is_available`] never panics, [`report`] says what is
//!   missing and how to fix it — and the process's [`Mode`]: real GPUs, or emulated devices.
//! - [`nvrtc`]: the kernels in `kernels/*.cu`, compiled by NVRTC at first use for the device's own
//!   `sm_XY` and cached on disk.
//! - [`ops`]: one Rust wrapper module per kernel file; each op is a pure plan plus a launch.
//! - [`cudnn`]: conv2d forward / backward-data / backward-filter through cuDNN when it loads
//!   (the CUDA convolution path; im2col + GEMM is the fall-back).
//! - [`gemm`]: row-major GEMM (+ bias / GELU epilogues) through cuBLASLt.
//! - [`alloc`]: the caching allocator with `Permanent` and `Temporary` pools.
//! - [`graph`]: CUDA graph capture and replay.
//! - [`comm`]: NCCL's collectives behind a driver-neutral API.
//! - [`CudaDevice`]: one device — its [`driver`], compute [`Stream`], allocator and GEMM engine.
//! - [`emu`]: the CPU kernel emulator (kernels compiled by the host C++ compiler, threads as
//!   fibers); [`emulated`]: the emulated CUDA device built on it; [`testing`]: the device the
//!   GPU tests run on.
//! - [`user_kernel`]: custom ops' CUDA C++ kernels, compiled by NVRTC at run time and launched
//!   on the device stream ([`CudaDevice::launch_user`]).
//!
//! # Layers
//!
//! Bottom up, each importing only from below (`.ci/check-cycles`): errors, dtypes, library
//! probing (`libs.rs`) and operand checks; the descriptors (launch plans and their by-value
//! struct arguments in [`launch`], GEMM and convolution descriptors in `gemm/desc.rs` and
//! `cudnn/desc.rs`, custom kernel sources in [`user_kernel`]) and NVRTC; the kernel emulator;
//! the process's mode and device description (`mode.rs`); the driver traits ([`driver`]:
//! streams, events, copies, launches, graphs) and the collectives trait (`comm/api.rs`); their
//! implementations, the real GPU's (`driver/real.rs`, `comm/nccl.rs`) and the emulated
//! device's ([`emulated`]), which do not know each other; above both, what picks one:
//! [`runtime`], the device ([`CudaDevice::new`]) and the communicator ([`comm`]); then the
//! libraries (cuBLASLt, cuDNN) and the kernel wrappers ([`ops`]).
//!
//! # The emulated CUDA device
//!
//! `SINTER_CUDA_EMU=1` (or `=N` for N devices), or [`enable_emulation`] before the first use of
//! CUDA (what `--device cuda-emu` calls), makes [`is_available`], [`device_count`] and
//! [`CudaDevice::get`] serve emulated devices instead of GPUs; [`report`] and `sinter info`
//! say "emulated CUDA device (CPU kernel emulator); not a GPU". It is never chosen as a
//! fall-back; without a C++ compiler, selecting it is an error that says so.
//!
//! The split between a GPU and the emulation is only in the implementations of [`driver`]'s
//! traits (and of the collectives'): device memory is host
//! memory (256-byte aligned, 0xFF-filled when fresh, bounded by `SINTER_CUDA_EMU_MEMORY_GIB`,
//! default 4), copies are `memcpy`, every launch plan runs the real kernel in the kernel
//! emulator on a device of 2 SMs, cuBLASLt and cuDNN are host reference implementations of
//! the same descriptors, NCCL is host collectives over loopback TCP, CUDA graphs are recorded
//! and replayed, and all work runs on one worker thread per device in submission order while
//! the host goes on (events are positions in that order; `CUDA_LAUNCH_BLOCKING=1` makes each
//! call wait). The allocator, plans, sinter-core's storage, autograd, the trainer and the NCCL
//! backend above are the same code as on a GPU.
//!
//! What it does not prove: real timing and occupancy; real races and concurrency (one thread
//! per device, streams serialised, no memory-model races beyond a missing barrier); the GPU's
//! approximate intrinsics (`__expf`, `rsqrtf` are exact here) and FMA contraction; cuBLASLt's,
//! cuDNN's and NCCL's own numerics and algorithm choices (TF32 is computed as f32; sums run in
//! another order); memory limits, registers and shared-memory capacity of a real part;
//! out-of-bounds reads (host memory is readable); multi-node NCCL.
//!
//! Nothing here depends on another sinter crate. The binary links no CUDA library: everything is
//! loaded with `dlopen` at run time, so it builds and runs where CUDA is absent.

pub mod alloc;
pub mod check;
pub mod comm;
pub mod cudnn;
pub mod device;
pub mod driver;
pub mod dtype;
pub mod emu;
pub mod emulated;
pub mod error;
pub mod gemm;
pub mod golden;
pub mod graph;
pub mod launch;
mod libs;
mod mode;
pub mod nvrtc;
pub mod ops;
mod pool;
pub mod runtime;
pub mod testing;
pub mod user_kernel;

pub use alloc::{
    CachingAllocator, CaptureId, DevSlice, DeviceBuffer, MemoryStats, Pool, PoolStats,
};
pub use device::CudaDevice;
pub use driver::{Event, Stream};
pub use dtype::{DType, DeviceScalar};
pub use error::{CudaError, Result};
pub use gemm::{Epilogue, GemmDType, GemmDesc, GemmShape};
pub use runtime::{
    device_count, device_info, enable_emulation, is_available, is_emulated, libraries, report,
    DeviceInfo, Libraries, Mode,
};

#[cfg(test)]
mod tests {
    #[test]
    fn handles_are_thread_safe() {
        fn check<T: Send + Sync>() {}
        check::<crate::CudaDevice>();
        check::<std::sync::Arc<crate::DeviceBuffer>>();
        check::<crate::CudaError>();
    }
}
