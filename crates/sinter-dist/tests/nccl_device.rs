//! The NCCL backend on CUDA devices: the real GPU when there is one, else emulated CUDA devices
//! (see `sinter_cuda::testing`), which run the same code above the driver layer — unique-id
//! exchange through the TCP store, the NCCL stream ordered with events, completion polled
//! against the timeout, device gradient buckets. A world of one runs every collective; two
//! ranks (threads, one emulated device each) agree on NCCL, reduce as the host ring does, and
//! a rank that never arrives ends in a timeout naming the op and the rank, not a hang.

use std::time::Duration;

use sinter_core::{DType, Device, Rng, Tensor};
use sinter_dist::nccl::{agree_backend, nccl_library, nccl_status, LocalSupport};
use sinter_dist::{
    run_on_threads, Backend, BackendChoice, Communicator, DistEnv, DistError, NcclCommunicator,
    ReduceOp, StoreServer,
};

const T: Duration = Duration::from_secs(60);

/// The ranks' devices (two emulated ones without a GPU), or None: skipped.
fn devices() -> Option<sinter_cuda::testing::TestDevice> {
    sinter_cuda::testing::gpu_tests(2)
}

/// Whether two ranks can each have a device (two emulated ones, or two GPUs).
fn two_devices() -> bool {
    match devices() {
        Some(sinter_cuda::testing::TestDevice::Real)
            if sinter_cuda::device_count().unwrap_or(0) < 2 =>
        {
            println!("skipped: two ranks need two GPUs here (NCCL takes one GPU per rank)");
            false
        }
        d => d.is_some(),
    }
}

fn env(rank: usize, world: usize, port: u16) -> DistEnv {
    DistEnv {
        rank,
        world_size: world,
        local_rank: rank,
        local_world_size: world,
        master_addr: Some("127.0.0.1".into()),
        master_port: port,
        source: sinter_dist::rendezvous::EnvSource::Torchrun,
    }
}

#[test]
fn world_of_one_runs_every_collective() {
    if devices().is_none() {
        return;
    }
    println!("collectives: {}", nccl_library().unwrap());
    let dev = sinter_core::cuda::shared_device(0).unwrap();
    let env = DistEnv::single();
    let mut c = NcclCommunicator::init(&env, dev.clone(), "test", T).unwrap();
    assert_eq!((c.rank(), c.world_size()), (0, 1));
    let mut v = vec![1.0f32, -2.0, 3.5];
    c.all_reduce(&mut v, ReduceOp::Sum).unwrap();
    assert_eq!(v, [1.0, -2.0, 3.5]);
    c.all_reduce(&mut v, ReduceOp::Avg).unwrap();
    assert_eq!(v, [1.0, -2.0, 3.5]);
    let mut g = vec![0.0; 3];
    c.all_gather(&v, &mut g).unwrap();
    assert_eq!(g, v);
    let mut o = vec![0.0; 3];
    c.reduce_scatter(&v, &mut o, ReduceOp::Sum).unwrap();
    assert_eq!(o, v);
    c.broadcast(&mut v, 0).unwrap();
    c.barrier().unwrap();
    let mut sub = c.new_group(&[0]).unwrap();
    let mut w = vec![4.0f32];
    sub.all_reduce(&mut w, ReduceOp::Sum).unwrap();
    assert_eq!(w, [4.0]);
    // Device memory in place, ordered with the compute stream.
    let buf = dev
        .htod(&[1.0f32, 2.0, 3.0], sinter_cuda::Pool::Temporary)
        .unwrap();
    let p = c.all_reduce_device(buf.as_slice(), ReduceOp::Sum).unwrap();
    c.wait(p, None).unwrap();
    assert_eq!(dev.dtoh::<f32>(buf.as_slice()).unwrap(), [1.0, 2.0, 3.0]);

    // Data parallel over NCCL device buckets: gradients equal plain backward's.
    let mut rng = Rng::new(3);
    let w = Tensor::randn(&[4, 3], 0.0, 1.0, &mut rng, DType::F32, Device::Cuda(0))
        .unwrap()
        .to_var()
        .unwrap();
    let x = Tensor::randn(&[5, 4], 0.0, 1.0, &mut rng, DType::F32, Device::Cuda(0)).unwrap();
    let loss = || x.matmul(&w).unwrap().sqr().unwrap().sum_all().unwrap();
    loss().backward().unwrap();
    let want = w.grad().unwrap().to_vec_f32().unwrap();
    w.set_grad(None);
    let host = sinter_dist::data_parallel::shared(
        sinter_dist::ThreadGroup::with_timeout(1, T).swap_remove(0),
    );
    let mut dp =
        sinter_dist::DataParallel::new(host, vec![("w".into(), w.clone())], 1 << 20).unwrap();
    let grads = NcclCommunicator::init(&env, dev, "test-grads", T).unwrap();
    dp.use_nccl(grads).unwrap();
    assert!(dp.uses_nccl());
    dp.backward(&loss()).unwrap();
    let got = w.grad().unwrap();
    assert_eq!(
        got.device(),
        Device::Cuda(0),
        "gradients stay on the device"
    );
    let got = got.to_vec_f32().unwrap();
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
    }
}

/// Rank `r`'s input of the data-parallel test.
fn batch(rank: usize) -> Vec<f32> {
    (0..20)
        .map(|i| ((i * 7 + rank * 13) % 11) as f32 * 0.1 - 0.5)
        .collect()
}

#[test]
fn two_ranks_agree_on_nccl_and_reduce_like_the_host_ring() {
    if !two_devices() {
        return;
    }
    assert!(nccl_status().is_ok());
    let store = StoreServer::bind("127.0.0.1:0").unwrap();
    let port = store.local_addr().port();
    let results = run_on_threads(2, T, |host| {
        let rank = host.rank();
        let env = env(rank, 2, port);
        let host = sinter_dist::data_parallel::shared(host);
        // Both ranks can use NCCL (each on its own device): they agree on it.
        let local = LocalSupport::probe(Some(rank));
        let (backend, note) = agree_backend(&host, BackendChoice::Auto, &local, 0).unwrap();
        assert_eq!((backend, note), (Backend::Nccl, None));
        let dev = sinter_core::cuda::shared_device(rank).unwrap();
        let mut c = NcclCommunicator::init(&env, dev.clone(), "two", T).unwrap();
        let r = rank as f32;
        let mut v = vec![1.0 + r, -2.0 * r, 0.25];
        c.all_reduce(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v, [3.0, -2.0, 0.5], "all-reduce is the sum of the ranks");
        c.all_reduce(&mut v, ReduceOp::Avg).unwrap();
        assert_eq!(v, [3.0, -2.0, 0.5]);
        let mut out = vec![0.0; 2];
        c.reduce_scatter(
            &[1.0, 2.0, 3.0, 4.0].map(|x| x * (1.0 + r)),
            &mut out,
            ReduceOp::Sum,
        )
        .unwrap();
        assert_eq!(out, if rank == 0 { [3.0, 6.0] } else { [9.0, 12.0] });
        let mut all = vec![0.0; 4];
        c.all_gather(&[r, -r], &mut all).unwrap();
        assert_eq!(all, [0.0, 0.0, 1.0, -1.0]);
        let mut b = vec![r + 5.0; 2];
        c.broadcast(&mut b, 1).unwrap();
        assert_eq!(b, [6.0, 6.0]);
        if rank == 0 {
            c.send(&[9.0, 8.0], 1).unwrap();
        } else {
            let mut got = vec![0.0; 2];
            c.recv(&mut got, 0).unwrap();
            assert_eq!(got, [9.0, 8.0]);
        }
        let mut g = c.new_group(&[1, 0]).unwrap();
        let mut one = vec![1.0f32 + r];
        g.all_reduce(&mut one, ReduceOp::Sum).unwrap();
        assert_eq!(one, [3.0]);

        // Data parallel with device buckets: each rank's gradient is the mean over the ranks.
        let mut rng = Rng::new(5);
        let w = Tensor::randn(&[4, 3], 0.0, 1.0, &mut rng, DType::F32, Device::Cpu).unwrap();
        let w = w.to_device(Device::Cuda(rank)).unwrap().to_var().unwrap();
        let x = Tensor::from_vec(batch(rank), &[5, 4], Device::Cpu)
            .unwrap()
            .to_device(Device::Cuda(rank))
            .unwrap();
        let mut dp =
            sinter_dist::DataParallel::new(host.clone(), vec![("w".into(), w.clone())], 1 << 20)
                .unwrap();
        dp.use_nccl(NcclCommunicator::init(&env, dev, "two-grads", T).unwrap())
            .unwrap();
        let loss = x.matmul(&w).unwrap().sqr().unwrap().sum_all().unwrap();
        dp.backward(&loss).unwrap();
        let wc = w.to_device(Device::Cpu).unwrap();
        (
            w.grad().unwrap().to_vec_f32().unwrap(),
            wc.to_vec_f32().unwrap(),
        )
    });
    // Reference on the CPU: the mean of both ranks' gradients of sum((x w)^2).
    let w = Tensor::from_vec(results[0].1.clone(), &[4, 3], Device::Cpu).unwrap();
    let mut want = vec![0.0f32; 12];
    for rank in 0..2 {
        let wv = w.clone().to_var().unwrap();
        let x = Tensor::from_vec(batch(rank), &[5, 4], Device::Cpu).unwrap();
        x.matmul(&wv)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        for (a, g) in want
            .iter_mut()
            .zip(wv.grad().unwrap().to_vec_f32().unwrap())
        {
            *a += g / 2.0;
        }
    }
    for (rank, (got, _)) in results.iter().enumerate() {
        for (a, b) in got.iter().zip(&want) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "rank {rank}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn a_rank_that_never_arrives_is_a_timeout_naming_the_op_not_a_hang() {
    if !two_devices() {
        return;
    }
    let store = StoreServer::bind("127.0.0.1:0").unwrap();
    let port = store.local_addr().port();
    let errs: Vec<Option<String>> = run_on_threads(2, T, |host| {
        let rank = host.rank();
        let dev = sinter_core::cuda::shared_device(rank).unwrap();
        let mut c = NcclCommunicator::init(&env(rank, 2, port), dev, "late", T).unwrap();
        let mut host = host;
        if rank == 0 {
            c.set_timeout(Duration::from_millis(300));
            let e = c.all_reduce(&mut [1.0], ReduceOp::Sum).unwrap_err();
            assert!(matches!(e, DistError::Timeout { .. }), "{e}");
            // Once aborted, the communicator refuses further work with the reason.
            let again = c
                .all_reduce(&mut [1.0], ReduceOp::Sum)
                .unwrap_err()
                .to_string();
            assert!(again.contains("aborted"), "{again}");
            host.barrier().unwrap();
            Some(e.to_string())
        } else {
            // Rank 1 only arrives after rank 0 gave up: its collectives fail, naming why.
            host.barrier().unwrap();
            let e = (0..2)
                .find_map(|_| c.all_reduce(&mut [1.0], ReduceOp::Sum).err())
                .expect("the communicator is broken");
            Some(e.to_string())
        }
    });
    let m0 = errs[0].as_deref().unwrap();
    assert!(m0.contains("all_reduce") && m0.contains("rank 0"), "{m0}");
    let m1 = errs[1].as_deref().unwrap();
    assert!(m1.contains("rank 0 left"), "{m1}");
}
