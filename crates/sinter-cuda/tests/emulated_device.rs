//! The emulated CUDA device as a device: memory through the caching allocator, real kernel
//! launches queued and run in order, launch errors at the call, streams and events, CUDA
//! graph capture and replay, the host GEMM and convolution behind the device API, and NCCL's
//! collectives between two emulated ranks in one process. This process always uses emulated
//! devices (it needs g++; skipped without it unless SINTER_REQUIRE_EMU=1).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sinter_cuda::comm::{self, Comm, Library, RedOp};
use sinter_cuda::cudnn::{self, ConvProblem, Ran};
use sinter_cuda::launch::{Arg, Launch};
use sinter_cuda::nvrtc::KernelFile;
use sinter_cuda::ops::unary::{self, UnaryOp};
use sinter_cuda::{
    graph, CudaDevice, CudaError, DType, DeviceBuffer, Epilogue, GemmDType, GemmDesc, GemmShape,
    Pool,
};

/// Two emulated devices, or None (skipped) without a C++ compiler.
fn emulated() -> Option<()> {
    match sinter_cuda::enable_emulation(2) {
        Ok(()) => Some(()),
        Err(e) => {
            if std::env::var("SINTER_REQUIRE_EMU").as_deref() == Ok("1") {
                panic!("SINTER_REQUIRE_EMU=1 but the emulated device cannot run: {e}");
            }
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// A device of the test's own (its queue sees no other test's work).
fn own_device(ordinal: usize) -> Option<Arc<CudaDevice>> {
    emulated()?;
    Some(Arc::new(CudaDevice::new(ordinal).unwrap()))
}

fn up(d: &CudaDevice, v: &[f32]) -> DeviceBuffer {
    d.htod(v, Pool::Temporary).unwrap()
}

fn down(d: &CudaDevice, b: &DeviceBuffer) -> Vec<f32> {
    d.dtoh::<f32>(b.as_slice()).unwrap()
}

#[test]
fn selection_and_report_say_emulated_not_a_gpu() {
    if emulated().is_none() {
        return;
    }
    assert!(sinter_cuda::is_available());
    assert!(sinter_cuda::is_emulated());
    assert_eq!(sinter_cuda::device_count().unwrap(), 2);
    let r = sinter_cuda::report();
    assert!(
        r.contains("emulated CUDA device (CPU kernel emulator); not a GPU"),
        "{r}"
    );
    assert!(r.contains("not a GPU") && r.contains("[1]"), "{r}");
    let info = sinter_cuda::device_info(1).unwrap();
    assert_eq!(info.multiprocessors, 2);
    assert!(matches!(
        sinter_cuda::device_info(2),
        Err(CudaError::NoDevice {
            ordinal: 2,
            count: 2
        })
    ));
    let d = CudaDevice::get(0).unwrap();
    assert!(d.is_emulated() && d.target().sm_count == 2);
    assert!(
        sinter_cuda::enable_emulation(1).is_ok(),
        "asking for fewer is fine"
    );
    assert!(
        sinter_cuda::enable_emulation(3).is_err(),
        "more than selected is not"
    );
    assert!(cudnn::available(), "cuDNN is served on the host");
    assert_eq!(comm::library(), Ok(Library::Emulated));
}

#[test]
fn memory_is_aligned_poisoned_bounded_and_copies_in_order() {
    let Some(d) = own_device(0) else { return };
    let a = d.alloc(1000, DType::U8, Pool::Temporary).unwrap();
    assert_eq!(a.ptr() % 256, 0);
    // Fresh memory reads as 0xFF (NaN for floats), not lucky zeros.
    assert!(d
        .dtoh::<u8>(a.as_slice())
        .unwrap()
        .iter()
        .all(|&b| b == 0xFF));
    d.zero(a.slice(10, 20).unwrap()).unwrap();
    let bytes = d.dtoh::<u8>(a.as_slice()).unwrap();
    assert!(bytes[10..30].iter().all(|&b| b == 0) && bytes[9] == 0xFF && bytes[30] == 0xFF);
    let x = up(&d, &[1.0, 2.0, 3.0]);
    let y = d.alloc(3, DType::F32, Pool::Temporary).unwrap();
    d.copy(x.as_slice(), y.as_slice()).unwrap();
    // The host may change its copy of the data at once: the upload was staged.
    let mut host = vec![7.0f32, 8.0, 9.0];
    d.copy_htod(&host, x.as_slice()).unwrap();
    host.fill(0.0);
    assert_eq!(down(&d, &y), [1.0, 2.0, 3.0]);
    assert_eq!(down(&d, &x), [7.0, 8.0, 9.0]);
    // The device's capacity is finite: the allocator's out-of-memory error, not an abort.
    let huge = sinter_cuda::emulated::memory_capacity() / 4 + 1;
    let e = d.alloc(huge, DType::F32, Pool::Temporary).unwrap_err();
    assert!(matches!(e, CudaError::OutOfMemory { .. }), "{e}");
    // Steady state: the same sizes again come from the cache.
    let before = d.memory_stats().temporary.device_allocs;
    drop((a, x, y));
    let _again = d.alloc(3, DType::F32, Pool::Temporary).unwrap();
    assert_eq!(d.memory_stats().temporary.device_allocs, before);
}

#[test]
fn real_kernels_run_queued_in_order_and_plans_are_checked_when_queued() {
    let Some(d) = own_device(0) else { return };
    let n = 5000;
    let xs: Vec<f32> = (0..n).map(|i| i as f32 * 0.01 - 20.0).collect();
    let x = up(&d, &xs);
    let y = d.alloc(n, DType::F32, Pool::Temporary).unwrap();
    let z = d.alloc(n, DType::F32, Pool::Temporary).unwrap();
    // Three dependent launches queued back to back; only the read waits.
    unary::unary(&d, UnaryOp::Neg, x.as_slice(), y.as_slice()).unwrap();
    unary::unary(&d, UnaryOp::Relu, y.as_slice(), z.as_slice()).unwrap();
    unary::unary(&d, UnaryOp::Abs, z.as_slice(), y.as_slice()).unwrap();
    let got = down(&d, &y);
    for (g, x) in got.iter().zip(&xs) {
        assert_eq!(*g, (-x).max(0.0));
    }
    // A plan the kernel does not take fails at the launch call, and the device stays usable.
    let bad_name = Launch::new(KernelFile::Unary, "no_such_kernel", 1, 32, vec![]);
    let e = d.launch(&bad_name).unwrap_err().to_string();
    assert!(e.contains("no_such_kernel"), "{e}");
    let bad_args = Launch::new(KernelFile::Unary, "neg_f32", 1, 32, vec![Arg::I32(3)]);
    let e = d.launch(&bad_args).unwrap_err().to_string();
    assert!(e.contains("neg_f32") && e.contains("parameters"), "{e}");
    let mut too_much_shared = Launch::new(KernelFile::Unary, "neg_f32", 1, 32, vec![]);
    too_much_shared.shared_mem = 64 << 10;
    assert!(d.launch(&too_much_shared).is_err());
    unary::unary(&d, UnaryOp::Neg, x.as_slice(), y.as_slice()).unwrap();
    assert_eq!(down(&d, &y)[0], 20.0);
    d.synchronize().unwrap();
}

#[test]
fn streams_and_events_order_work_and_check_their_device() {
    let Some(d0) = own_device(0) else { return };
    let d1 = CudaDevice::new(1).unwrap();
    let x = up(&d0, &vec![1.5; 100_000]);
    let y = d0.alloc(100_000, DType::F32, Pool::Temporary).unwrap();
    unary::unary(&d0, UnaryOp::Sqrt, x.as_slice(), y.as_slice()).unwrap();
    let e = d0.stream().record_event().unwrap();
    let side = d0.new_stream().unwrap();
    side.wait(&e).unwrap();
    let t0 = Instant::now();
    while !e.query().unwrap() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the event never completed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    side.synchronize().unwrap();
    assert!((down(&d0, &y)[99_999] - 1.5f32.sqrt()).abs() < 1e-6);
    // Another device's event cannot order this device's stream.
    let e1 = d1.stream().record_event().unwrap();
    assert!(side.wait(&e1).is_err());
}

#[test]
fn a_captured_graph_replays_on_the_current_contents_of_its_buffers() {
    let Some(d) = own_device(0) else { return };
    let (m, n, k) = (4, 8, 3);
    let a = up(&d, &[1.0; 12]);
    let b = up(&d, &(0..24).map(|i| i as f32).collect::<Vec<_>>());
    let c = d.alloc(m * n, DType::F32, Pool::Temporary).unwrap();
    let out = d.alloc(m * n, DType::F32, Pool::Temporary).unwrap();
    let step = |d: &CudaDevice| {
        let g = GemmDesc::new(
            GemmDType::F32,
            GemmShape::new(m, n, k),
            a.as_slice(),
            b.as_slice(),
            c.as_slice(),
        );
        d.gemm(&g).unwrap();
        unary::unary(d, UnaryOp::Neg, c.as_slice(), out.as_slice()).unwrap();
    };
    // Warm-up: the GEMM workspace and everything else allocated eagerly.
    step(&d);
    d.zero(out.as_slice()).unwrap();
    let cap = graph::begin_capture(&d).unwrap();
    step(&d);
    // Host waits and event records are refused while capturing.
    assert!(d.dtoh::<f32>(out.as_slice()).is_err());
    assert!(d.stream().record_event().is_err());
    let g = cap.finish().unwrap();
    assert!(
        down(&d, &out).iter().all(|&v| v == 0.0),
        "capturing does not run the work"
    );
    g.replay().unwrap();
    // out = -(1 · B) summed over k: column j of B's rows 0..3 is j, 8 + j, 16 + j.
    let want: Vec<f32> = (0..m * n).map(|i| -(24.0 + 3.0 * (i % n) as f32)).collect();
    assert_eq!(down(&d, &out), want);
    // New input contents, same buffers: the replay computes the new result.
    d.copy_htod(&[2.0f32; 12], a.as_slice()).unwrap();
    g.replay().unwrap();
    let want2: Vec<f32> = want.iter().map(|v| 2.0 * v).collect();
    assert_eq!(down(&d, &out), want2);
    drop(g);
    assert_eq!(d.allocator().graph_reserved_bytes(), 0);
    // An abandoned capture runs nothing and leaves the stream usable.
    d.zero(out.as_slice()).unwrap();
    let cap = graph::begin_capture(&d).unwrap();
    step(&d);
    drop(cap);
    assert!(down(&d, &out).iter().all(|&v| v == 0.0));
    // An empty capture is an error, as on a GPU.
    let cap = graph::begin_capture(&d).unwrap();
    assert!(cap.finish().is_err());
}

#[test]
fn the_gemm_epilogue_and_the_convolution_run_behind_the_device_api() {
    let Some(d) = own_device(1) else { return };
    // Linear + bias + GELU keeping the pre-activation (GELU_AUX_BIAS), bf16.
    let (m, n, k) = (3, 8, 5);
    let q = |v: f32| half::bf16::from_f32(v);
    let xv: Vec<half::bf16> = (0..m * k).map(|i| q(i as f32 * 0.1 - 0.7)).collect();
    let wv: Vec<half::bf16> = (0..k * n).map(|i| q(0.3 - i as f32 * 0.02)).collect();
    let bv: Vec<half::bf16> = (0..n).map(|i| q(i as f32 * 0.05)).collect();
    let x = d.htod(&xv, Pool::Temporary).unwrap();
    let w = d.htod(&wv, Pool::Temporary).unwrap();
    let bias = d.htod(&bv, Pool::Temporary).unwrap();
    let y = d.alloc(m * n, DType::BF16, Pool::Temporary).unwrap();
    let aux = d.alloc(m * n, DType::BF16, Pool::Temporary).unwrap();
    let mut g = GemmDesc::new(
        GemmDType::BF16,
        GemmShape::new(m, n, k),
        x.as_slice(),
        w.as_slice(),
        y.as_slice(),
    );
    g.epilogue = Epilogue::BiasGeluAux {
        bias: bias.as_slice(),
        aux: aux.as_slice(),
    };
    d.gemm(&g).unwrap();
    let (yh, ah) = (
        d.dtoh::<half::bf16>(y.as_slice()).unwrap(),
        d.dtoh::<half::bf16>(aux.as_slice()).unwrap(),
    );
    for i in 0..m {
        for j in 0..n {
            let pre: f64 = (0..k)
                .map(|kk| xv[i * k + kk].to_f64() * wv[kk * n + j].to_f64())
                .sum::<f64>()
                + bv[j].to_f64();
            let gelu = 0.5
                * pre
                * (1.0
                    + ((2.0 / std::f64::consts::PI).sqrt() * (pre + 0.044715 * pre.powi(3)))
                        .tanh());
            assert!((ah[i * n + j].to_f64() - pre).abs() < 1e-2 * (1.0 + pre.abs()));
            assert!((yh[i * n + j].to_f64() - gelu).abs() < 1e-2 * (1.0 + gelu.abs()));
        }
    }
    // cuDNN's forward pass, served on the host: a 1x1 convolution is a channel mix.
    let p = ConvProblem {
        n: 1,
        c: 2,
        h: 2,
        w: 2,
        o: 1,
        kh: 1,
        kw: 1,
        stride: sinter_types::Hw::square(1),
        padding: sinter_types::Hw::square(0),
        dilation: sinter_types::Hw::square(1),
        groups: 1,
        dtype: DType::F32,
        allow_tf32: false,
    };
    let xi = up(&d, &[1.0, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0, 40.0]);
    let wi = up(&d, &[1.0, 0.5]);
    let yo = d.alloc(4, DType::F32, Pool::Temporary).unwrap();
    let r = cudnn::conv2d_forward(&d, &p, xi.as_slice(), wi.as_slice(), yo.as_slice()).unwrap();
    assert_eq!(r, Ran::Done);
    assert_eq!(down(&d, &yo), [6.0, 12.0, 18.0, 24.0]);
    // A wrong operand size is refused before anything is queued.
    assert!(cudnn::conv2d_forward(&d, &p, xi.as_slice(), wi.as_slice(), xi.as_slice()).is_err());
}

/// Runs `f(rank, comm, device)` on two threads, one emulated device each.
fn two_ranks(f: impl Fn(usize, Comm, Arc<CudaDevice>) + Sync) {
    let id = comm::unique_id().unwrap();
    std::thread::scope(|s| {
        for rank in 0..2 {
            let f = &f;
            s.spawn(move || {
                let dev = CudaDevice::get(rank).unwrap();
                let c = Comm::init_rank(&dev, &id, 2, rank).unwrap();
                f(rank, c, dev)
            });
        }
    });
}

/// Waits for `stream`'s work with a deadline (as sinter-dist's NCCL backend does).
fn settle(c: &Comm, s: &sinter_cuda::Stream) {
    let e = s.record_event().unwrap();
    let t0 = Instant::now();
    while !e.query().unwrap() {
        assert!(c.async_error().is_none(), "{:?}", c.async_error());
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "collective never finished"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn two_emulated_ranks_run_nccl_collectives() {
    if emulated().is_none() {
        return;
    }
    two_ranks(|rank, c, dev| {
        let s = dev.new_stream().unwrap();
        let r = rank as f32;
        // all-reduce: the sum (and the mean) of both ranks' buffers, in place.
        let buf = up(&dev, &[1.0 + r, 10.0 * (1.0 + r), -r]);
        // The NCCL stream waits for the upload queued on the compute stream.
        s.wait(&dev.stream().record_event().unwrap()).unwrap();
        c.all_reduce(buf.as_slice(), buf.as_slice(), RedOp::Sum, &s)
            .unwrap();
        settle(&c, &s);
        assert_eq!(down(&dev, &buf), [3.0, 30.0, -1.0]);
        c.all_reduce(buf.as_slice(), buf.as_slice(), RedOp::Avg, &s)
            .unwrap();
        settle(&c, &s);
        assert_eq!(down(&dev, &buf), [3.0, 30.0, -1.0]);
        // bf16 all-reduce, into another buffer.
        let hb: Vec<half::bf16> = [0.5f32, 1.0 + r].map(half::bf16::from_f32).to_vec();
        let xb = dev.htod(&hb, Pool::Temporary).unwrap();
        let yb = dev.alloc(2, DType::BF16, Pool::Temporary).unwrap();
        c.all_reduce(xb.as_slice(), yb.as_slice(), RedOp::Sum, &s)
            .unwrap();
        settle(&c, &s);
        let got: Vec<f32> = dev
            .dtoh::<half::bf16>(yb.as_slice())
            .unwrap()
            .iter()
            .map(|v| v.to_f32())
            .collect();
        assert_eq!(got, [1.0, 3.0]);
        // reduce-scatter: rank r gets block r of the sum.
        let send = up(&dev, &[1.0, 2.0, 3.0, 4.0].map(|v| v * (1.0 + r)));
        let recv = dev.alloc(2, DType::F32, Pool::Temporary).unwrap();
        c.reduce_scatter(send.as_slice(), recv.as_slice(), RedOp::Sum, &s)
            .unwrap();
        settle(&c, &s);
        assert_eq!(
            down(&dev, &recv),
            if rank == 0 { [3.0, 6.0] } else { [9.0, 12.0] }
        );
        // all-gather: both ranks' buffers in rank order.
        let mine = up(&dev, &[r, r + 0.5]);
        let all = dev.alloc(4, DType::F32, Pool::Temporary).unwrap();
        c.all_gather(mine.as_slice(), all.as_slice(), &s).unwrap();
        settle(&c, &s);
        assert_eq!(down(&dev, &all), [0.0, 0.5, 1.0, 1.5]);
        // broadcast from rank 1.
        let b = up(&dev, &[r + 7.0; 3]);
        c.broadcast(b.as_slice(), b.as_slice(), 1, &s).unwrap();
        settle(&c, &s);
        assert_eq!(down(&dev, &b), [8.0; 3]);
        // send / recv.
        let p = up(&dev, &[42.0 + r, -1.0]);
        if rank == 0 {
            c.send(p.as_slice(), 1, &s).unwrap();
        } else {
            c.recv(p.as_slice(), 0, &s).unwrap();
        }
        settle(&c, &s);
        assert_eq!(down(&dev, &p), [42.0, -1.0]);
        // Wrong sizes are refused when queued.
        assert!(c.all_gather(mine.as_slice(), mine.as_slice(), &s).is_err());
        assert!(c.broadcast(b.as_slice(), b.as_slice(), 2, &s).is_err());
    });
}

#[test]
fn a_collective_without_its_peer_stays_pending_until_abort_and_breaks_the_peer() {
    if emulated().is_none() {
        return;
    }
    let gate = std::sync::Barrier::new(2);
    two_ranks(|rank, mut c, dev| {
        let s = dev.new_stream().unwrap();
        let buf = up(&dev, &[1.0]);
        if rank == 0 {
            c.all_reduce(buf.as_slice(), buf.as_slice(), RedOp::Sum, &s)
                .unwrap();
            let e = s.record_event().unwrap();
            std::thread::sleep(Duration::from_millis(200));
            assert!(!e.query().unwrap(), "the peer never came: still pending");
            c.abort();
            s.synchronize().unwrap();
            assert!(c
                .all_reduce(buf.as_slice(), buf.as_slice(), RedOp::Sum, &s)
                .is_err());
            gate.wait();
        } else {
            gate.wait();
            // Rank 0 aborted (its connection is gone): this rank's communicator is broken. The
            // first all-reduce may still meet rank 0's earlier contribution; the second cannot.
            for _ in 0..2 {
                c.all_reduce(buf.as_slice(), buf.as_slice(), RedOp::Sum, &s)
                    .unwrap();
            }
            s.synchronize().unwrap();
            let why = c.async_error().expect("an asynchronous error");
            assert!(why.contains("rank 0 left"), "{why}");
        }
    });
}

#[test]
fn ranks_issuing_different_collectives_break_the_communicator() {
    if emulated().is_none() {
        return;
    }
    two_ranks(|rank, c, dev| {
        let s = dev.new_stream().unwrap();
        let a = up(&dev, &[1.0, 2.0]);
        let b = dev.alloc(4, DType::F32, Pool::Temporary).unwrap();
        if rank == 0 {
            c.all_reduce(a.as_slice(), a.as_slice(), RedOp::Sum, &s)
                .unwrap();
        } else {
            c.all_gather(a.as_slice(), b.as_slice(), &s).unwrap();
        }
        s.synchronize().unwrap();
        let why = c.async_error().expect("an asynchronous error");
        assert!(why.contains("same collectives in the same order"), "{why}");
    });
}

#[test]
fn recording_counts_gemm_flops_kernel_bytes_and_graph_replays() {
    use sinter_cuda::emulated::cost::{self, OpClass};
    let Some(d) = own_device(1) else { return };
    // Shapes no other test uses: other tests' work on device 1 may be recorded too.
    let (m, n, k) = (37, 41, 43);
    let a = d.alloc(m * k, DType::F32, Pool::Temporary).unwrap();
    let b = d.alloc(k * n, DType::F32, Pool::Temporary).unwrap();
    let c = d.alloc(m * n, DType::F32, Pool::Temporary).unwrap();
    let x = d.alloc(1237, DType::F32, Pool::Temporary).unwrap();
    let y = d.alloc(1237, DType::F32, Pool::Temporary).unwrap();
    let step = |d: &CudaDevice, dtype: GemmDType| {
        let g = GemmDesc::new(
            dtype,
            GemmShape::new(m, n, k),
            a.as_slice(),
            b.as_slice(),
            c.as_slice(),
        );
        d.gemm(&g).unwrap();
        unary::unary(d, UnaryOp::Neg, x.as_slice(), y.as_slice()).unwrap();
    };
    step(&d, GemmDType::F32);
    cost::start_recording();
    step(&d, GemmDType::F32);
    step(&d, GemmDType::Tf32);
    let cap = graph::begin_capture(&d).unwrap();
    step(&d, GemmDType::F32);
    let g = cap.finish().unwrap();
    g.replay().unwrap();
    g.replay().unwrap();
    d.synchronize().unwrap();
    let calls = cost::stop_recording(1);
    let gemms: Vec<_> = calls
        .iter()
        .filter(|c| c.key == format!("gemm f32 {m}x{n}x{k}"))
        .collect();
    // Eager F32 and TF32, then two replays; the capture itself runs (and records) nothing.
    assert_eq!(gemms.len(), 4, "{calls:#?}");
    for (i, g) in gemms.iter().enumerate() {
        let flops = (2 * m * n * k) as u64;
        let tf32 = i == 1;
        assert_eq!(g.class, OpClass::Gemm);
        assert_eq!(
            (g.traffic.flops, g.traffic.tensor_flops),
            if tf32 { (0, flops) } else { (flops, 0) }
        );
        assert_eq!(g.traffic.read, ((m * k + k * n) * 4) as u64);
        assert_eq!(g.traffic.written, (m * n * 4) as u64);
        assert_eq!(g.in_graph, i >= 2);
        let dims = g.gemm.unwrap();
        assert_eq!((dims.m, dims.n, dims.k, dims.aligned), (m, n, k, false));
    }
    // neg_f32 over 1237 elements: one read and one write of 1237 f32, as its plan declares.
    let negs: Vec<_> = calls
        .iter()
        .filter(|c| c.key == "neg_f32" && c.traffic.read == 1237 * 4)
        .collect();
    assert_eq!(negs.len(), 4);
    assert!(negs
        .iter()
        .all(|c| c.declared && c.traffic.written == 1237 * 4 && c.class == OpClass::Elementwise));
    // Off again: nothing more is kept.
    step(&d, GemmDType::F32);
    d.synchronize().unwrap();
    assert!(cost::take(1).is_empty());
}

/// One backward GEMM with a gradient epilogue, bf16 or f16, checked against an f64 host
/// reference: DGELU_BGRAD (du = (g·W) ∘ gelu'(pre) and Σ_rows du) and BGRADB beside a weight
/// gradient (dW = gᵀ·x and Σ_rows g); the priced cost reads the aux matrix and writes the
/// bias gradient.
fn gradient_epilogues_match_a_host_reference<T: sinter_cuda::DeviceScalar + Copy>(
    d: &CudaDevice,
    dtype: GemmDType,
    to: fn(f32) -> T,
    from: fn(T) -> f64,
) {
    // rows, the projection's outputs, the hidden width (a multiple of 8: the aux rule).
    let (rows, out, hid) = (7, 5, 16);
    let q = |v: Vec<f32>| -> Vec<T> { v.into_iter().map(to).collect() };
    let gv = q((0..rows * out)
        .map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.13)
        .collect());
    let wv = q((0..out * hid)
        .map(|i| ((i * 5 % 13) as f32 - 6.0) * 0.09)
        .collect());
    let pv = q((0..rows * hid)
        .map(|i| ((i * 3 % 17) as f32 - 8.0) * 0.35)
        .collect());
    let (g, w, pre) = (
        d.htod(&gv, Pool::Temporary).unwrap(),
        d.htod(&wv, Pool::Temporary).unwrap(),
        d.htod(&pv, Pool::Temporary).unwrap(),
    );
    let st = dtype.storage();
    let du = d.alloc(rows * hid, st, Pool::Temporary).unwrap();
    let db = d.alloc(hid, st, Pool::Temporary).unwrap();
    let mut desc = GemmDesc::new(
        dtype,
        GemmShape::new(rows, hid, out),
        g.as_slice(),
        w.as_slice(),
        du.as_slice(),
    );
    desc.epilogue = Epilogue::DGeluBGrad {
        aux: pre.as_slice(),
        bias_grad: db.as_slice(),
    };
    d.gemm(&desc).unwrap();
    let tol = if dtype == GemmDType::BF16 { 2e-2 } else { 3e-3 };
    let (duh, dbh) = (
        d.dtoh::<T>(du.as_slice()).unwrap(),
        d.dtoh::<T>(db.as_slice()).unwrap(),
    );
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let dgelu = |x: f64| {
        let th = (c * (x + 0.044715 * x.powi(3))).tanh();
        0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * c * (1.0 + 3.0 * 0.044715 * x * x)
    };
    let mut want_db = vec![0.0f64; hid];
    for i in 0..rows {
        for j in 0..hid {
            let dh: f64 = (0..out)
                .map(|kk| from(gv[i * out + kk]) * from(wv[kk * hid + j]))
                .sum();
            let want = dh * dgelu(from(pv[i * hid + j]));
            want_db[j] += want;
            let got = from(duh[i * hid + j]);
            assert!(
                (got - want).abs() <= tol * (1.0 + want.abs()),
                "{dtype:?} du[{i},{j}]: {got} vs {want}"
            );
        }
    }
    for (j, want) in want_db.iter().enumerate() {
        let got = from(dbh[j]);
        assert!(
            (got - want).abs() <= tol * (1.0 + want.abs()),
            "{dtype:?} db_fc[{j}]: {got} vs {want}"
        );
    }
    // (What the device records per call: recording is process-wide, so this test prices the
    // descriptor directly rather than race the recording test.)
    let call = desc.cost();
    assert_eq!(
        call.key,
        format!("gemm {st} {rows}x{hid}x{out} +dgelu+bgrad")
    );
    let e = st.size() as u64;
    let (r, h, o) = (rows as u64, hid as u64, out as u64);
    assert_eq!(call.traffic.read, (r * o + o * h + r * h) * e);
    assert_eq!(call.traffic.written, (r * h + h) * e);

    // dW [out, hid] = gᵀ·x (x = pre, any [rows, hid] matrix) and db = Σ_rows g.
    let dw = d.alloc(out * hid, st, Pool::Temporary).unwrap();
    let dbp = d.alloc(out, st, Pool::Temporary).unwrap();
    let mut desc = GemmDesc::new(
        dtype,
        GemmShape::new(out, hid, rows).trans(true, false),
        g.as_slice(),
        pre.as_slice(),
        dw.as_slice(),
    );
    desc.epilogue = Epilogue::BGradA(dbp.as_slice());
    d.gemm(&desc).unwrap();
    let (dwh, dbph) = (
        d.dtoh::<T>(dw.as_slice()).unwrap(),
        d.dtoh::<T>(dbp.as_slice()).unwrap(),
    );
    for o in 0..out {
        for j in 0..hid {
            let want: f64 = (0..rows)
                .map(|i| from(gv[i * out + o]) * from(pv[i * hid + j]))
                .sum();
            let got = from(dwh[o * hid + j]);
            assert!(
                (got - want).abs() <= tol * (1.0 + want.abs()),
                "{dtype:?} dW[{o},{j}]: {got} vs {want}"
            );
        }
        let want: f64 = (0..rows).map(|i| from(gv[i * out + o])).sum();
        let got = from(dbph[o]);
        assert!(
            (got - want).abs() <= tol * (1.0 + want.abs()),
            "{dtype:?} db_proj[{o}]: {got} vs {want}"
        );
    }
    // β ≠ 0 with a gradient epilogue is refused before anything is queued.
    desc.beta = 1.0;
    assert!(d.gemm(&desc).is_err());
}

#[test]
fn the_gemm_gradient_epilogues_match_a_host_reference() {
    let Some(d) = own_device(1) else { return };
    gradient_epilogues_match_a_host_reference(
        &d,
        GemmDType::BF16,
        half::bf16::from_f32,
        half::bf16::to_f64,
    );
    gradient_epilogues_match_a_host_reference(
        &d,
        GemmDType::F16,
        half::f16::from_f32,
        half::f16::to_f64,
    );
}
