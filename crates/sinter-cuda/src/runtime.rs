//! The process's CUDA: whether it serves real GPUs or emulated devices ([`Mode`]), how many,
//! what each is ([`device_info`]), and a [`report`] of what is missing and how to fix it. Never
//! panics. Which libraries load, and their versions, is `libs.rs` (below NVRTC and the
//! drivers); its functions are re-exported here.

use std::fmt::Write as _;
use std::sync::OnceLock;

use cudarc::driver::{result as dr, sys as ds};

use crate::error::{guard, CudaError, DriverResultExt, Result};
pub use crate::libs::{
    cublas_version, cuda_runtime_version, cudnn_version, driver_version, libraries, nccl_version,
    nvrtc_version, split_version_10000, Libraries,
};
use crate::libs::{need_driver, nvrtc_hint};
use crate::mode::select_emulation;
pub use crate::mode::{
    arch_name, is_emulated, mode, parse_emu_var, DeviceInfo, Mode, EMU_VAR, MAX_EMULATED_DEVICES,
};

/// Serve `devices` emulated CUDA devices in this process (what `--device cuda-emu` and the GPU
/// tests without a GPU call). Must come before the first use of CUDA: once the process has
/// answered a CUDA query with real devices it stays with them. Asking again for no more devices
/// than are emulated is fine. Fails, saying so, when no C++ compiler is installed.
pub fn enable_emulation(devices: usize) -> Result<()> {
    select_emulation(devices)?;
    crate::emulated::ready()
}

/// True when sinter can run on a CUDA device here: on real GPUs, the driver, NVRTC and cuBLASLt
/// load and at least one device is visible; emulated, a host C++ compiler is present. Never
/// panics; the answer is cached.
pub fn is_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| match mode() {
        Ok(Mode::Real) => real_gpu_usable(),
        Ok(Mode::Emulated { .. }) => crate::emulated::ready().is_ok(),
        Err(_) => false,
    })
}

/// Whether a real GPU is usable here (the driver, NVRTC and cuBLASLt load and a device is
/// visible), whatever the process's [`mode`] (which this does not fix). Never panics.
pub fn real_gpu_usable() -> bool {
    let libs = libraries();
    libs.driver && libs.nvrtc && libs.cublaslt && matches!(real_device_count(), Ok(n) if n > 0)
}

fn real_device_count() -> Result<usize> {
    need_driver()?;
    guard(|| {
        dr::init().ctx("cuInit")?;
        let n = dr::device::get_count().ctx("cuDeviceGetCount")?;
        Ok(n.max(0) as usize)
    })
}

/// Number of visible CUDA devices (`Err` when the driver is missing or fails to initialise), or
/// of emulated ones (`Err` when the emulator cannot run here).
pub fn device_count() -> Result<usize> {
    match mode() {
        Ok(Mode::Real) => {}
        Ok(Mode::Emulated { devices }) => {
            crate::emulated::ready()?;
            return Ok(devices);
        }
        Err(m) => return Err(CudaError::invalid(EMU_VAR, m)),
    }
    real_device_count()
}

/// Query one device. Never panics.
pub fn device_info(ordinal: usize) -> Result<DeviceInfo> {
    let count = device_count()?;
    if ordinal >= count {
        return Err(CudaError::NoDevice { ordinal, count });
    }
    if is_emulated() {
        return Ok(crate::emulated::device_info(ordinal));
    }
    let (name, total_memory, cc, sms) = guard(|| {
        let dev = dr::device::get(ordinal as i32).ctx("cuDeviceGet")?;
        let name = dr::device::get_name(dev).ctx("cuDeviceGetName")?;
        // SAFETY: `dev` is a valid device handle from cuDeviceGet.
        let total = unsafe { dr::device::total_mem(dev) }.ctx("cuDeviceTotalMem")?;
        let attr = |a| unsafe { dr::device::get_attribute(dev, a) }.ctx("cuDeviceGetAttribute");
        use ds::CUdevice_attribute as A;
        let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sms = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        Ok((name, total, (major as u32, minor as u32), sms as u32))
    })?;
    Ok(DeviceInfo {
        ordinal,
        name,
        total_memory,
        compute_capability: cc,
        multiprocessors: sms,
        driver_version: driver_version().ok(),
        cuda_runtime_version: cuda_runtime_version(),
        nvrtc_version: nvrtc_version().ok(),
        cublas_version: cublas_version(),
        cudnn_version: cudnn_version(),
        nccl_version: nccl_version(),
    })
}

fn v2(v: Option<(u32, u32)>) -> String {
    v.map(|(a, b)| format!("{a}.{b}"))
        .unwrap_or_else(|| "?".into())
}
fn v3(v: Option<(u32, u32, u32)>) -> String {
    v.map(|(a, b, c)| format!("{a}.{b}.{c}"))
        .unwrap_or_else(|| "?".into())
}

/// A human-readable report: which libraries load (with versions), which devices are visible,
/// where the CUDA headers are, and — for everything missing — how to fix it.
pub fn report() -> String {
    match mode() {
        Ok(Mode::Real) => {}
        Ok(Mode::Emulated { devices }) => return crate::emulated::report(devices),
        Err(m) => return format!("sinter CUDA report\n  status: CUDA NOT available: {m}\n"),
    }
    let libs = libraries();
    let mut out = String::from("sinter CUDA report\n");
    let mut fixes: Vec<String> = Vec::new();
    let mark = |ok: bool| if ok { "found  " } else { "MISSING" };

    let drv = if libs.driver {
        driver_version().ok()
    } else {
        None
    };
    let _ = writeln!(
        out,
        "  driver   libcuda.so.1        {} {}",
        mark(libs.driver),
        if libs.driver { v2(drv) } else { String::new() }
    );
    if !libs.driver {
        fixes.push("libcuda.so.1 (the NVIDIA driver) is not loadable: install the driver, or add its folder (often /usr/lib/x86_64-linux-gnu or /usr/local/cuda/compat) to LD_LIBRARY_PATH".into());
    }
    let nv = if libs.nvrtc {
        nvrtc_version().ok()
    } else {
        None
    };
    let _ = writeln!(
        out,
        "  NVRTC    libnvrtc.so.13      {} {}",
        mark(libs.nvrtc),
        if libs.nvrtc { v2(nv) } else { String::new() }
    );
    if !libs.nvrtc {
        fixes.push(format!(
            "NVRTC (required, compiles the kernels): {}",
            nvrtc_hint()
        ));
    }
    let _ = writeln!(out, "  cuBLAS   libcublas.so.13     {}", mark(libs.cublas));
    let _ = writeln!(
        out,
        "  cuBLASLt libcublasLt.so.13   {} {}",
        mark(libs.cublaslt),
        if libs.cublaslt {
            format!(
                "{} (CUDA runtime {})",
                v3(cublas_version()),
                v2(cuda_runtime_version())
            )
        } else {
            String::new()
        }
    );
    if !libs.cublaslt {
        fixes.push("cuBLASLt (required, every GEMM): add the folder holding libcublasLt.so.13 (/usr/local/cuda/lib64 or site-packages/nvidia/cu13/lib) to LD_LIBRARY_PATH".into());
    }
    let _ = writeln!(
        out,
        "  cuDNN    libcudnn.so.9       {} {}",
        mark(libs.cudnn),
        if libs.cudnn {
            format!("{} (conv2d runs through cuDNN)", v3(cudnn_version()))
        } else {
            "(optional: conv2d falls back to im2col + GEMM)".into()
        }
    );
    let _ = writeln!(
        out,
        "  NCCL     libnccl.so          {} {}",
        mark(libs.nccl),
        if libs.nccl {
            v3(nccl_version())
        } else {
            "(optional: needed for multi-GPU)".into()
        }
    );
    if !libs.nccl {
        fixes.push("NCCL: cudarc opens `libnccl.so` (not `libnccl.so.2`): create a symlink `ln -s /path/to/libnccl.so.2 <dir>/libnccl.so` in a folder on LD_LIBRARY_PATH".into());
    }
    match crate::nvrtc::find_cuda_include() {
        Ok(p) => {
            let _ = writeln!(
                out,
                "  headers  cuda_fp16.h         found   {}",
                p.display()
            );
        }
        Err(_) => {
            let _ = writeln!(out, "  headers  cuda_fp16.h         MISSING");
            fixes.push("CUDA headers for NVRTC: set SINTER_CUDA_INCLUDE (or CUDA_HOME) to a folder holding cuda_fp16.h and cuda_bf16.h (/usr/local/cuda/include, site-packages/nvidia/cu13/include, or run .ci/nvrtc-setup)".into());
        }
    }
    if libs.driver {
        match device_count() {
            Ok(0) => {
                let _ = writeln!(out, "  devices: none visible");
                fixes.push(
                    "the driver loads but sees no GPU: check CUDA_VISIBLE_DEVICES and nvidia-smi"
                        .into(),
                );
            }
            Ok(n) => {
                let _ = writeln!(out, "  devices: {n}");
                for i in 0..n {
                    match device_info(i) {
                        Ok(d) => {
                            let _ = writeln!(
                                out,
                                "    [{i}] {}  {:.1} GiB  {}  {} SMs",
                                d.name,
                                d.total_memory as f64 / (1u64 << 30) as f64,
                                d.arch(),
                                d.multiprocessors
                            );
                        }
                        Err(e) => {
                            let _ = writeln!(out, "    [{i}] error: {e}");
                        }
                    }
                }
            }
            Err(e) => {
                let _ = writeln!(out, "  devices: error: {e}");
                fixes.push(format!("the driver failed to initialise ({e}): check the driver install and that /dev/nvidia* is accessible"));
            }
        }
    }
    let _ = writeln!(
        out,
        "  status: {}",
        if is_available() {
            "CUDA available"
        } else {
            "CUDA NOT available (CPU only)"
        }
    );
    if !fixes.is_empty() {
        out.push_str("to fix:\n");
        for f in fixes {
            let _ = writeln!(out, "  - {f}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probing_never_panics() {
        // On a machine without CUDA these are all "missing"; with CUDA they work. Either way: no panic.
        let _ = libraries();
        let _ = is_available();
        let _ = device_count();
        let _ = driver_version();
        let r = report();
        assert!(r.contains("sinter CUDA report"));
        assert!(r.contains("status:"));
    }

    #[test]
    fn the_emulation_variable_is_explicit() {
        assert_eq!(parse_emu_var(None), Ok(Mode::Real));
        assert_eq!(parse_emu_var(Some("")), Ok(Mode::Real));
        assert_eq!(parse_emu_var(Some("0")), Ok(Mode::Real));
        assert_eq!(parse_emu_var(Some("1")), Ok(Mode::Emulated { devices: 1 }));
        assert_eq!(
            parse_emu_var(Some(" 4 ")),
            Ok(Mode::Emulated { devices: 4 })
        );
        for bad in ["yes", "-1", "65", "1.5"] {
            let e = parse_emu_var(Some(bad)).unwrap_err();
            assert!(e.contains(EMU_VAR) && e.contains(bad.trim()), "{e}");
        }
    }

    #[test]
    fn versions_split() {
        assert_eq!(split_version_10000(90100), (9, 1, 0));
        assert_eq!(split_version_10000(22703), (2, 27, 3));
        assert_eq!(split_version_10000(130002), (13, 0, 2));
        assert_eq!(arch_name((9, 0)), "sm_90");
        assert_eq!(arch_name((8, 6)), "sm_86");
    }
}
