//! CUDA graphs: a captured step replays with the values in device memory, the allocator serves
//! a capture from its cache only, and host waits during a capture are errors. On the real GPU
//! when there is one, else on the emulated CUDA device (see `sinter_cuda::testing`).

use sinter_cuda::launch::Arg;
use sinter_cuda::user_kernel::{KernelSource, UserLaunch};
use sinter_cuda::{graph, testing, CudaDevice, DType, DevSlice, Pool};

/// A one-thread step over a small block of device state: c[0] += 1 (the step count), c[1] =
/// table[min(c[0], n - 1)] (the schedule), c[2] *= 2. A replayed graph must see the values the
/// previous run left.
const STEP_CU: &str = r#"
extern "C" __global__ void tick(float* c, const float* table, i64 n) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const float it = c[0] + 1.f;
    c[0] = it;
    i64 k = (i64)it;
    if (k > n - 1) k = n - 1;
    c[1] = table[k];
    c[2] *= 2.f;
}
"#;

fn tick(d: &CudaDevice, src: &KernelSource, c: DevSlice<'_>, table: DevSlice<'_>) {
    let l = UserLaunch {
        kernel: "tick".into(),
        grid: (1, 1, 1),
        block: (32, 1, 1),
        shared_mem: 0,
        args: vec![
            Arg::Ptr(c.ptr()),
            Arg::Ptr(table.ptr()),
            Arg::I64(table.len() as i64),
        ],
        declared: None,
    };
    d.launch_user(src, &l).unwrap();
}

#[test]
fn a_captured_step_replays_with_device_state() {
    if testing::gpu_tests(1).is_none() {
        return;
    }
    // A device of its own: the capture must not see other tests' work on the shared stream.
    let d = std::sync::Arc::new(CudaDevice::new(0).unwrap());
    let src = KernelSource::new("graph_step.cu", STEP_CU).unwrap();
    let c = d.htod(&[0f32, 0.5, 1024.0], Pool::Permanent).unwrap();
    let lrs = d
        .htod(&[0.5f32, 0.25, 0.125, 0.0625], Pool::Permanent)
        .unwrap();
    // Warm-up: an eager step leaves a 1-element block cached for the capture to use.
    drop(d.alloc(1, DType::F32, Pool::Temporary).unwrap());
    tick(&d, &src, c.as_slice(), lrs.as_slice());
    let cap = graph::begin_capture(&d).unwrap();
    let tmp = d.alloc(1, DType::F32, Pool::Temporary).unwrap();
    assert!(
        d.dtoh::<f32>(c.as_slice()).is_err(),
        "a host read during capture is refused"
    );
    assert!(
        d.alloc(1 << 20, DType::F32, Pool::Temporary).is_err(),
        "no cuMemAlloc during capture"
    );
    tick(&d, &src, c.as_slice(), lrs.as_slice());
    drop(tmp);
    let g = cap.finish().unwrap();
    // Capturing did not run the step.
    assert_eq!(d.dtoh::<f32>(c.as_slice()).unwrap()[0], 1.0);
    for _ in 0..3 {
        g.replay().unwrap();
    }
    let v = d.dtoh::<f32>(c.as_slice()).unwrap();
    assert_eq!(v[0], 4.0);
    assert_eq!(
        v[1], 0.0625,
        "each replay loads the next entry of the table"
    );
    assert_eq!(
        v[2],
        1024.0 * 16.0,
        "doubled by the eager run and each replay"
    );
    drop(g);
    assert_eq!(d.allocator().graph_reserved_bytes(), 0);
}
