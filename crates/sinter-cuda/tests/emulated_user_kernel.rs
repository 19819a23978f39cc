//! Custom kernels (`user_kernel`): CUDA C++ text compiled at run time and launched on the
//! device stream — on the real GPU when present, else on the emulated CUDA device (required in
//! CI by SINTER_REQUIRE_EMU=1). Checks the values a kernel computes, that compile errors carry
//! the compiler's log, and that a launch that does not fit its kernel is refused before it runs.

use sinter_cuda::launch::Arg;
use sinter_cuda::user_kernel::{KernelSource, UserLaunch};
use sinter_cuda::{CudaDevice, Pool};

const AXPY: &str = r#"
// y = a * x + y over n elements, grid-stride; and a second kernel in the same source.
extern "C" __global__ void axpy(const float* x, float* y, float a, i64 n) {
    for (i64 i = global_tid(); i < n; i += global_stride()) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void fill(float* y, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = v;
}
"#;

fn device() -> Option<std::sync::Arc<CudaDevice>> {
    sinter_cuda::testing::gpu_tests(1)?;
    Some(CudaDevice::get(0).unwrap())
}

fn launch(kernel: &str, grid: u32, block: u32, args: Vec<Arg>) -> UserLaunch {
    UserLaunch {
        kernel: kernel.into(),
        grid: (grid, 1, 1),
        block: (block, 1, 1),
        shared_mem: 0,
        args,
        declared: None,
    }
}

#[test]
fn a_custom_kernel_computes_on_the_device_stream() {
    let Some(d) = device() else { return };
    let src = KernelSource::new("axpy_test.cu", AXPY).unwrap();
    let n = 1000usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let xb = d.htod(&x, Pool::Temporary).unwrap();
    let yb = d
        .alloc(n, sinter_cuda::DType::F32, Pool::Temporary)
        .unwrap();
    // Two kernels of one source, queued in order: fill y with 2, then y = 3x + y twice (the
    // second launch reuses the compiled module). A grid smaller than n exercises the stride.
    d.launch_user(
        &src,
        &launch(
            "fill",
            n.div_ceil(128) as u32,
            128,
            vec![Arg::Ptr(yb.ptr()), Arg::F32(2.0), Arg::I32(n as i32)],
        ),
    )
    .unwrap();
    for _ in 0..2 {
        d.launch_user(
            &src,
            &launch(
                "axpy",
                2,
                64,
                vec![
                    Arg::Ptr(xb.ptr()),
                    Arg::Ptr(yb.ptr()),
                    Arg::F32(3.0),
                    Arg::I64(n as i64),
                ],
            ),
        )
        .unwrap();
    }
    let y = d.dtoh::<f32>(yb.as_slice()).unwrap();
    for (i, (&yi, &xi)) in y.iter().zip(&x).enumerate() {
        assert_eq!(yi, 2.0 + 6.0 * xi, "element {i}");
    }
}

#[test]
fn a_compile_error_carries_the_compiler_log() {
    let Some(d) = device() else { return };
    let src = KernelSource::new(
        "broken.cu",
        "extern \"C\" __global__ void k(float* y) { y[0] = undefined_thing; }\n",
    )
    .unwrap();
    let e = d
        .launch_user(&src, &launch("k", 1, 1, vec![Arg::Ptr(0)]))
        .unwrap_err()
        .to_string();
    // NVRTC's log (or, on the emulated device without NVRTC, the host compiler's) names the
    // file, the line and the undefined name.
    assert!(e.contains("broken"), "{e}");
    assert!(e.contains("undefined_thing"), "{e}");
}

#[test]
fn a_launch_that_does_not_fit_its_kernel_is_refused() {
    let Some(d) = device() else { return };
    let src = KernelSource::new("axpy_test.cu", AXPY).unwrap();
    let yb = d
        .alloc(4, sinter_cuda::DType::F32, Pool::Temporary)
        .unwrap();
    let y = Arg::Ptr(yb.ptr());
    let err = |l: UserLaunch| d.launch_user(&src, &l).unwrap_err().to_string();
    let e = err(launch("fill", 1, 4, vec![y, Arg::F32(1.0)]));
    assert!(e.contains("takes 3 parameters"), "{e}");
    let e = err(launch("nope", 1, 4, vec![y]));
    assert!(e.contains("nope"), "{e}");
    let e = err(launch("fill", 1, 2048, vec![y, Arg::F32(1.0), Arg::I32(4)]));
    assert!(e.contains("out of limits"), "{e}");
    if sinter_cuda::nvrtc::nvrtc_present() {
        // The PTX check sees kinds: an int where the kernel takes a float.
        let e = err(launch("fill", 1, 4, vec![y, Arg::I32(1), Arg::I32(4)]));
        assert!(e.contains("parameter 1"), "{e}");
    }
    assert!(KernelSource::new("../escape.cu", AXPY).is_err());
    // Every refusal came before anything was queued: the device has no error to report.
    d.synchronize().unwrap();
}
