//! CUDA graphs: a captured step replays with the values in device memory, the allocator serves
//! a capture from its cache only, and host waits during a capture are errors. On the real GPU
//! when there is one, else on the emulated CUDA device (see `sinter_cuda::testing`).

use sinter_cuda::ops::adamw::{self, ctl, ScalerCfg};
use sinter_cuda::{graph, testing, CudaDevice, DType, Pool};

#[test]
fn a_captured_step_replays_with_device_state() {
    if testing::gpu_tests(1).is_none() {
        return;
    }
    // A device of its own: the capture must not see other tests' work on the shared stream.
    let d = std::sync::Arc::new(CudaDevice::new(0).unwrap());
    let mut c0 = vec![0f32; ctl::LEN];
    c0[ctl::SCALE] = 1024.0;
    c0[ctl::LR] = 0.5;
    let c = d.htod(&c0, Pool::Permanent).unwrap();
    let lrs = d
        .htod(&[0.5f32, 0.25, 0.125, 0.0625], Pool::Permanent)
        .unwrap();
    let scaler = Some(ScalerCfg {
        growth: 2.0,
        backoff: 0.5,
        interval: 2,
    });
    // Warm-up: an eager step leaves a 1-element block cached for the capture to use.
    drop(d.alloc(1, DType::F32, Pool::Temporary).unwrap());
    adamw::step_finish(&d, c.as_slice(), lrs.as_slice(), scaler).unwrap();
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
    adamw::step_finish(&d, c.as_slice(), lrs.as_slice(), scaler).unwrap();
    drop(tmp);
    let g = cap.finish().unwrap();
    // Capturing did not run the step.
    assert_eq!(d.dtoh::<f32>(c.as_slice()).unwrap()[ctl::ITER], 1.0);
    for _ in 0..3 {
        g.replay().unwrap();
    }
    let v = d.dtoh::<f32>(c.as_slice()).unwrap();
    assert_eq!(v[ctl::ITER], 4.0);
    assert_eq!(v[ctl::STEPS], 4.0);
    assert_eq!(
        v[ctl::LR],
        0.0625,
        "each replay loads the next lr from the table"
    );
    assert_eq!(v[ctl::SCALE], 4096.0, "grown twice (interval 2)");
    drop(g);
    assert_eq!(d.allocator().graph_reserved_bytes(), 0);
}
