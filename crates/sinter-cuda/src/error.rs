//! The one error type of this crate. Nothing here panics on a driver, NVRTC or cuBLAS failure:
//! every such failure becomes a [`CudaError`].

use crate::pool::Pool;

/// Everything that can go wrong in sinter-cuda.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A CUDA shared library could not be loaded (`dlopen` failed for every candidate name).
    #[error("CUDA library `{lib}` not found: {hint}")]
    LibraryNotFound { lib: &'static str, hint: String },
    /// A CUDA driver API call failed.
    #[error("CUDA driver error in {op}: {msg}")]
    Driver { op: &'static str, msg: String },
    /// The driver loaded but there is no device with this ordinal.
    #[error("no CUDA device {ordinal} ({count} present)")]
    NoDevice { ordinal: usize, count: usize },
    /// NVRTC rejected a kernel file; `log` is NVRTC's program log.
    #[error("NVRTC failed to compile {file} for {arch}:\n{log}")]
    Compile {
        file: String,
        arch: String,
        log: String,
    },
    /// Any other NVRTC failure.
    #[error("NVRTC error in {op}: {msg}")]
    Nvrtc { op: &'static str, msg: String },
    /// `cuda_fp16.h` / `cuda_bf16.h` were not found for NVRTC.
    #[error("CUDA headers (cuda_fp16.h) not found; searched: {searched}. Set SINTER_CUDA_INCLUDE to a folder holding cuda_fp16.h (CUDA_HOME/include, or run .ci/nvrtc-setup)")]
    HeadersNotFound { searched: String },
    /// A cuBLAS / cuBLASLt call failed.
    #[error("cuBLASLt error in {op}: {msg}")]
    Blas { op: &'static str, msg: String },
    /// A kernel is missing from its compiled module (a name mismatch between Rust and the .cu file).
    #[error("kernel `{name}` not found in {file}: {msg}")]
    KernelNotFound {
        file: &'static str,
        name: String,
        msg: String,
    },
    /// Arguments failed validation before anything was launched.
    #[error("invalid argument to {op}: {msg}")]
    InvalidArgument { op: &'static str, msg: String },
    /// The device is out of memory even after the allocator released its cached blocks.
    #[error("CUDA out of memory: requested {requested} bytes for the {pool:?} pool; in use {in_use}, reserved {reserved}")]
    OutOfMemory {
        requested: usize,
        pool: Pool,
        in_use: usize,
        reserved: usize,
    },
    /// Reading or writing the kernel cache failed.
    #[error("kernel cache I/O at {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// The CPU kernel emulator ([`crate::emu`]) failed: no C++ compiler, a compile error, or a
    /// kernel that did something the hardware leaves undefined (divergent barrier, exited lane).
    #[error("kernel emulator, {op}: {msg}")]
    Emulator { op: &'static str, msg: String },
    /// A library call panicked (a missing symbol in an unexpected library version); caught so
    /// the caller can fall back to the CPU.
    #[error("a CUDA library call panicked: {0}")]
    Panicked(String),
    /// A cuDNN call failed with a status other than NOT_SUPPORTED (which falls back instead).
    #[error("cuDNN error in {op}: {msg}")]
    Cudnn { op: &'static str, msg: String },
}

/// `Result` with [`CudaError`].
pub type Result<T> = std::result::Result<T, CudaError>;

impl CudaError {
    /// An invalid argument of `op` (what is wrong and what to do, in `msg`).
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        CudaError::InvalidArgument {
            op,
            msg: msg.into(),
        }
    }
}

/// Attach the operation name to a driver error.
pub(crate) trait DriverResultExt<T> {
    fn ctx(self, op: &'static str) -> Result<T>;
}

impl<T> DriverResultExt<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn ctx(self, op: &'static str) -> Result<T> {
        self.map_err(|e| CudaError::Driver {
            op,
            msg: format!("{e:?}"),
        })
    }
}

impl<T> DriverResultExt<T> for std::result::Result<T, cudarc::cublaslt::result::CublasError> {
    fn ctx(self, op: &'static str) -> Result<T> {
        self.map_err(|e| CudaError::Blas {
            op,
            msg: format!("{:?}", e.0),
        })
    }
}

/// Run `f`, turning a panic inside a CUDA library wrapper into [`CudaError::Panicked`].
pub(crate) fn guard<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = if let Some(s) = p.downcast_ref::<&str>() {
                (*s).to_string()
            } else if let Some(s) = p.downcast_ref::<String>() {
                s.clone()
            } else {
                "unknown panic".to_string()
            };
            Err(CudaError::Panicked(msg))
        }
    }
}
