//! Which CUDA libraries load here and their versions: probed with `dlopen` once, never
//! panicking (cudarc panics on a missing library, so each call first asks
//! `is_culib_present()` and wraps the real call in [`guard`](crate::error)). The bottom of the
//! crate's layers: NVRTC, the drivers and the report ask it; it asks nothing above the errors.

use std::sync::OnceLock;

use cudarc::driver::sys as ds;

use crate::error::{guard, CudaError, DriverResultExt, Result};

/// Which CUDA libraries `dlopen` can find (cached after the first call).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Libraries {
    /// `libcuda.so.1` — the driver (comes with the NVIDIA driver, not the toolkit).
    pub driver: bool,
    /// `libnvrtc.so.13` — runtime compilation of our kernels. Required.
    pub nvrtc: bool,
    /// `libcublas.so.13`.
    pub cublas: bool,
    /// `libcublasLt.so.13` — every GEMM. Required.
    pub cublaslt: bool,
    /// `libcudnn.so.9` — optional.
    pub cudnn: bool,
    /// `libnccl.so` — optional, needed for multi-GPU.
    pub nccl: bool,
}

/// Probe the libraries once; never panics.
pub fn libraries() -> Libraries {
    static LIBS: OnceLock<Libraries> = OnceLock::new();
    *LIBS.get_or_init(|| {
        // SAFETY: `is_culib_present` only tries `dlopen` on candidate names.
        let present =
            |f: unsafe fn() -> bool| std::panic::catch_unwind(|| unsafe { f() }).unwrap_or(false);
        Libraries {
            driver: present(ds::is_culib_present),
            nvrtc: present(cudarc::nvrtc::sys::is_culib_present),
            cublas: present(cudarc::cublas::sys::is_culib_present),
            cublaslt: present(cudarc::cublaslt::sys::is_culib_present),
            cudnn: present(cudarc::cudnn::sys::is_culib_present),
            nccl: present(cudarc::nccl::sys::is_culib_present),
        }
    })
}

pub(crate) fn need_driver() -> Result<()> {
    if libraries().driver {
        Ok(())
    } else {
        Err(CudaError::LibraryNotFound {
            lib: "libcuda.so.1",
            hint: "install the NVIDIA driver, or add the folder holding libcuda.so.1 to LD_LIBRARY_PATH".into(),
        })
    }
}

/// Driver API version as (major, minor), e.g. (13, 0). Does not need a device.
pub fn driver_version() -> Result<(u32, u32)> {
    need_driver()?;
    guard(|| {
        let mut v: std::ffi::c_int = 0;
        // SAFETY: writes one int.
        unsafe { ds::cuDriverGetVersion(&mut v) }
            .result()
            .ctx("cuDriverGetVersion")?;
        Ok(((v / 1000) as u32, ((v % 1000) / 10) as u32))
    })
}

/// NVRTC version as (major, minor).
pub fn nvrtc_version() -> Result<(u32, u32)> {
    if !libraries().nvrtc {
        return Err(CudaError::LibraryNotFound {
            lib: "libnvrtc.so.13",
            hint: nvrtc_hint(),
        });
    }
    guard(|| {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
            .result()
            .map_err(|e| CudaError::Nvrtc {
                op: "nvrtcVersion",
                msg: format!("{e:?}"),
            })?;
        Ok((major as u32, minor as u32))
    })
}

/// cuBLASLt version as (major, minor, patch), or None if it does not load.
pub fn cublas_version() -> Option<(u32, u32, u32)> {
    if !libraries().cublaslt {
        return None;
    }
    // SAFETY: plain getter.
    guard(|| Ok(unsafe { cudarc::cublaslt::sys::cublasLtGetVersion() }))
        .ok()
        .map(split_version_10000)
}

/// The CUDA runtime version cuBLASLt was built for, as (major, minor).
pub fn cuda_runtime_version() -> Option<(u32, u32)> {
    if !libraries().cublaslt {
        return None;
    }
    // SAFETY: plain getter.
    let v = guard(|| Ok(unsafe { cudarc::cublaslt::sys::cublasLtGetCudartVersion() })).ok()?;
    Some(((v / 1000) as u32, ((v % 1000) / 10) as u32))
}

/// cuDNN version, or None if it does not load.
pub fn cudnn_version() -> Option<(u32, u32, u32)> {
    if !libraries().cudnn {
        return None;
    }
    // SAFETY: plain getter.
    let v = guard(|| Ok(unsafe { cudarc::cudnn::sys::cudnnGetVersion() })).ok()?;
    // cuDNN 9: major*10000 + minor*100 + patch.
    Some(split_version_10000(v))
}

/// NCCL version, or None if it does not load.
pub fn nccl_version() -> Option<(u32, u32, u32)> {
    if !libraries().nccl {
        return None;
    }
    guard(|| {
        let mut v: std::ffi::c_int = 0;
        // SAFETY: writes one int.
        let r = unsafe { cudarc::nccl::sys::ncclGetVersion(&mut v) };
        if r == cudarc::nccl::sys::ncclResult_t::ncclSuccess {
            Ok(v)
        } else {
            Err(CudaError::Panicked(format!("{r:?}")))
        }
    })
    .ok()
    .map(|v| split_version_10000(v as usize))
}

/// Split a `major*10000 + minor*100 + patch` (or `major*1000 + minor*100 + patch` for old NCCL)
/// version number.
pub fn split_version_10000(v: usize) -> (u32, u32, u32) {
    if v >= 10000 {
        (
            (v / 10000) as u32,
            ((v % 10000) / 100) as u32,
            (v % 100) as u32,
        )
    } else {
        (
            (v / 1000) as u32,
            ((v % 1000) / 100) as u32,
            (v % 100) as u32,
        )
    }
}

pub(crate) fn nvrtc_hint() -> String {
    "add the folder holding libnvrtc.so.13 and libnvrtc-builtins.so.13.* to LD_LIBRARY_PATH \
     (/usr/local/cuda/lib64, python's site-packages/nvidia/cu13/lib, or run .ci/nvrtc-setup)"
        .into()
}
