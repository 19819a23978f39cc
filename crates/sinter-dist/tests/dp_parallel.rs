//! Data parallel on the thread backend: N ranks of batch B equal one rank of batch N·B; the
//! bucket all-reduces start during backward; gradient accumulation communicates only on the
//! last micro-step.

mod dp_common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Summation-order rounding in the gradients (ranks add in another order than one process,
/// and the GEMM kernels block a batch of 6 differently from one of 36) reaches the weights
/// through AdamW's g/√v, which divides it by the gradient's own running magnitude: measured
/// up to 2.2e-5 relative (sinter_types::AdamW's PyTorch order, sinter-cpu's GEMM), so 5e-5.
/// A wrong reduction or a missed bucket is orders of magnitude larger.
const ADAMW_TOL: f64 = 5e-5;

use dp_common::*;
use sinter_dist::data_parallel::{bucket_bytes, shared};
use sinter_dist::{run_on_threads, AsyncCommunicator, DataParallel};
use sinter_nn::{AdamW, Module, Optimizer, Sgd};

const STEPS: usize = 5;
const B: usize = 6;

#[derive(Clone, Copy, Debug)]
enum Opt {
    AdamW,
    SgdMomentum,
}

fn optimizer(m: &dyn Module, o: Opt) -> Box<dyn Optimizer> {
    match o {
        Opt::AdamW => Box::new(AdamW::new(m.parameters(), 1e-2, 0.01).unwrap()),
        Opt::SgdMomentum => Box::new(Sgd::new(m.parameters(), 5e-2, 0.9, true, 1e-3).unwrap()),
    }
}

/// One rank, batch `global` per step, `accum` micro-steps per step.
fn serial(o: Opt, global: usize, accum: usize) -> Vec<Vec<f32>> {
    let m = model(7);
    let mut opt = optimizer(m.as_ref(), o);
    let micro = global / accum;
    for s in 0..STEPS {
        for k in 0..accum {
            loss(m.as_ref(), s, k * micro..(k + 1) * micro)
                .unwrap()
                .mul_scalar(1.0 / accum as f32)
                .unwrap()
                .backward()
                .unwrap();
        }
        opt.step().unwrap();
        opt.zero_grad();
    }
    weights(m.as_ref())
}

#[test]
fn data_parallel_equals_serial_with_2_and_4_ranks() {
    for o in [Opt::AdamW, Opt::SgdMomentum] {
        for n in [2, 4] {
            let want = serial(o, n * B, 1);
            let got = run_on_threads(n, T, |c| {
                let r = c_rank(&c);
                // Different initial weights on every rank: the broadcast must fix them.
                let m = model(7 + 100 * r as u64);
                let mut dp = DataParallel::new(shared(c), m.parameters(), 1024).unwrap();
                assert!(dp.layout().buckets.len() >= 3, "several buckets");
                let mut opt = optimizer(m.as_ref(), o);
                for s in 0..STEPS {
                    let l = loss(m.as_ref(), s, r * B..(r + 1) * B).unwrap();
                    dp.backward(&l).unwrap();
                    opt.step().unwrap();
                    opt.zero_grad();
                }
                weights(m.as_ref())
            });
            for (r, w) in got.iter().enumerate() {
                assert_close(
                    w,
                    &want,
                    ADAMW_TOL,
                    &format!("{o:?}, {n} ranks, rank {r} vs serial"),
                );
            }
            // Replicas stay bit-identical.
            assert!(got.iter().all(|w| w == &got[0]), "{o:?}: replicas diverged");
        }
    }
}

fn c_rank(c: &sinter_dist::HostCommunicator) -> usize {
    use sinter_dist::Communicator;
    c.rank()
}

#[test]
fn bucket_all_reduces_start_during_backward() {
    let traces = run_on_threads(2, T, |c| {
        let r = c_rank(&c);
        let m = model(7);
        // 1 KiB buckets: the 1,693 parameters form several buckets.
        let mut dp = DataParallel::new(shared(c), m.parameters(), 1024).unwrap();
        let nb = dp.layout().buckets.len();
        let l = loss(m.as_ref(), 0, r * B..(r + 1) * B).unwrap();
        dp.backward(&l).unwrap();
        (nb, dp.last_trace().clone())
    });
    for (nb, t) in traces {
        assert!(nb >= 3, "{nb} buckets");
        assert!(t.synced);
        assert_eq!(t.events.len(), nb, "one all-reduce per bucket");
        // Submitted in bucket order (the last layers' bucket first) ...
        assert!(t.events.iter().enumerate().all(|(i, e)| e.bucket == i));
        // ... and all but possibly the last one while backward was still running.
        let during = t.submitted_during_backward();
        assert!(
            during >= 2 && during + 1 >= nb,
            "only {during} of {nb} buckets submitted during backward: {t:?}"
        );
        assert!(
            t.events[0].submitted < t.backward,
            "first bucket at {:?}, backward took {:?}",
            t.events[0].submitted,
            t.backward
        );
        assert!(t.events[0].submitted < t.events[nb - 1].submitted);
    }
}

#[test]
fn gradient_accumulation_equals_one_big_batch_and_communicates_once() {
    const N: usize = 2;
    const A: usize = 3;
    let want = serial(Opt::AdamW, N * A * B, 1);
    let counts: Vec<Arc<AtomicUsize>> = (0..N).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    let comms = sinter_dist::ThreadGroup::with_timeout(N, T);
    let results: Vec<(Vec<Vec<f32>>, Vec<usize>)> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .zip(&counts)
            .enumerate()
            .map(|(r, (c, count))| {
                s.spawn(move || {
                    let count = count.clone();
                    let comm = Arc::new(AsyncCommunicator::new(Counting {
                        inner: c,
                        count: count.clone(),
                    }));
                    let m = model(7 + r as u64);
                    let mut dp =
                        DataParallel::new(comm, m.parameters(), bucket_bytes(0.001)).unwrap();
                    let nb = dp.layout().buckets.len();
                    let mut opt = optimizer(m.as_ref(), Opt::AdamW);
                    let mut seen = Vec::new();
                    for s in 0..STEPS {
                        for k in 0..A {
                            let rows = (k * N + r) * B..(k * N + r + 1) * B;
                            let l = loss(m.as_ref(), s, rows)
                                .unwrap()
                                .mul_scalar(1.0 / A as f32)
                                .unwrap();
                            let before = count.load(Ordering::SeqCst);
                            dp.backward_with(&l, k + 1 == A).unwrap();
                            let after = count.load(Ordering::SeqCst);
                            seen.push(after - before);
                            if k + 1 < A {
                                assert_eq!(
                                    after, before,
                                    "a collective ran on accumulating micro-step {k}"
                                );
                                assert!(!dp.last_trace().synced);
                            } else {
                                assert_eq!(
                                    after - before,
                                    nb,
                                    "one all-reduce per bucket on the last micro-step"
                                );
                            }
                        }
                        opt.step().unwrap();
                        opt.zero_grad();
                    }
                    (weights(m.as_ref()), seen)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, (w, seen)) in results.iter().enumerate() {
        assert_close(
            w,
            &want,
            ADAMW_TOL,
            &format!(
                "rank {r}: {A} micro-steps of {B} on {N} ranks vs one step of {}",
                N * A * B
            ),
        );
        assert_eq!(seen.iter().filter(|&&c| c > 0).count(), STEPS, "{seen:?}");
    }
    // The single-rank form of the claim: A micro-steps of B with accumulation = one step of A·B.
    let accum = serial(Opt::AdamW, A * B, A);
    let big = serial(Opt::AdamW, A * B, 1);
    assert_close(&accum, &big, ADAMW_TOL, "accumulation on one rank");
}
