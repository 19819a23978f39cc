//! sinter-cuda: the CUDA layer under sinter's tensor crate.
//!
//! - [`runtime`]: guarded dynamic loading — [`is_available`] never panics, [`report`] says what is
//!   missing and how to fix it.
//! - [`nvrtc`]: the kernels in `kernels/*.cu`, compiled by NVRTC at first use for the device's own
//!   `sm_XY` and cached on disk.
//! - [`ops`]: one Rust wrapper module per kernel file; each op is a pure plan plus a launch.
//! - [`emu`]: a CPU emulator that runs the kernels of a launch plan on host memory (tests).
//! - [`cudnn`]: conv2d forward / backward-data / backward-filter through cuDNN when it loads
//!   (the CUDA convolution path; im2col + GEMM is the fall-back).
//! - [`gemm`]: row-major GEMM (+ bias / GELU epilogues) through cuBLASLt.
//! - [`alloc`]: the caching allocator with `Permanent` and `Temporary` pools.
//! - [`CudaDevice`]: context, stream, allocator, kernels and cuBLASLt of one GPU.
//!
//! Nothing here depends on another sinter crate. The binary links no CUDA library: everything is
//! loaded with `dlopen` at run time, so it builds and runs where CUDA is absent.

pub mod alloc;
pub mod comm;
pub mod cudnn;
pub mod device;
pub mod driver;
pub mod dtype;
pub mod emu;
pub mod emulated;
pub mod error;
pub mod gemm;
pub mod graph;
pub mod launch;
pub mod nvrtc;
pub mod ops;
pub mod runtime;
pub mod testing;

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
