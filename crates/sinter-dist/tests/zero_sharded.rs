//! ZeRO stages 1 and 2 on the thread backend: equal to data parallel (and serial), silent on
//! accumulating micro-steps, world-size-independent state (save on 4 ranks, resume on 2 and
//! on 1), the bytes per rank beside the ZeRO paper's formulas, and the shard on a CUDA device
//! (emulated without a GPU) equal to the shard on the CPU.

mod dp_common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dp_common::*;
use sinter_core::{DType, Device, Tensor};
use sinter_dist::data_parallel::shared;
use sinter_dist::scaling::zero_bytes_per_rank;
use sinter_dist::{
    run_on_threads, AsyncCommunicator, Communicator, DataParallel, ShardedAlgo, ZeroOptimizer,
    ZeroOptions,
};
use sinter_nn::{clip_grad_norm, AdamW, Module, Optimizer, ParamGroup, Sgd};

const B: usize = 6;
const LR: f64 = 1e-2;
const WD: f64 = 0.01;

#[derive(Clone, Copy, Debug)]
struct Case {
    sgd: bool,
    clip: Option<f64>,
    /// Use ZeroOptimizer::backward (overlapped reduce-scatter) rather than plain backward.
    overlapped: bool,
}

fn algo(c: Case) -> ShardedAlgo {
    if c.sgd {
        ShardedAlgo::Sgd {
            momentum: 0.9,
            nesterov: false,
            weight_decay: WD,
        }
    } else {
        ShardedAlgo::adamw(WD)
    }
}

fn plain(m: &dyn Module, c: Case) -> Box<dyn Optimizer> {
    if c.sgd {
        Box::new(Sgd::new(m.parameters(), LR, 0.9, false, WD).unwrap())
    } else {
        Box::new(AdamW::new(m.parameters(), LR, WD).unwrap())
    }
}

/// Data parallel with the plain optimizer: the weights after `steps`.
fn data_parallel(n: usize, c: Case, steps: usize) -> Vec<Vec<f32>> {
    data_parallel_with(n, c, steps, &|m| plain(m, c))
}

/// Data parallel with the optimizer `make` builds.
fn data_parallel_with(
    n: usize,
    c: Case,
    steps: usize,
    make: &(dyn Fn(&dyn Module) -> Box<dyn Optimizer> + Sync),
) -> Vec<Vec<f32>> {
    run_on_threads(n, T, |comm| {
        let r = comm.rank();
        let m = model(7 + r as u64);
        let mut dp = DataParallel::new(shared(comm), m.parameters(), 1024).unwrap();
        let mut opt = make(m.as_ref());
        for s in 0..steps {
            dp.backward(&loss(m.as_ref(), s, r * B..(r + 1) * B).unwrap())
                .unwrap();
            if let Some(max) = c.clip {
                clip_grad_norm(opt.params(), max).unwrap();
            }
            opt.step().unwrap();
            opt.zero_grad();
        }
        weights(m.as_ref())
    })
    .swap_remove(0)
}

fn zero_opts(stage: u8, c: Case) -> ZeroOptions {
    ZeroOptions {
        stage,
        bucket_bytes: 1024,
        grad_clip: c.clip,
    }
}

/// Runs `steps` steps of ZeRO on rank `r` of `n`, starting at step `first`.
fn zero_steps(
    m: &dyn Module,
    z: &mut ZeroOptimizer,
    c: Case,
    r: usize,
    first: usize,
    steps: usize,
) {
    for s in first..first + steps {
        let l = loss(m, s, r * B..(r + 1) * B).unwrap();
        if c.overlapped {
            z.backward(&l).unwrap();
        } else {
            l.backward().unwrap();
        }
        z.step().unwrap();
        z.zero_grad();
    }
}

#[test]
fn zero_1_and_2_equal_data_parallel() {
    let cases = [
        Case {
            sgd: false,
            clip: None,
            overlapped: true,
        },
        Case {
            sgd: false,
            clip: Some(0.05),
            overlapped: false,
        },
        Case {
            sgd: true,
            clip: None,
            overlapped: false,
        },
    ];
    for c in cases {
        for n in [2, 4] {
            let want = data_parallel(n, c, 5);
            for stage in [1u8, 2] {
                let got = run_on_threads(n, T, |comm| {
                    let r = comm.rank();
                    let m = model(7 + r as u64);
                    let mut z = ZeroOptimizer::new(
                        shared(comm),
                        m.parameters(),
                        LR,
                        algo(c),
                        zero_opts(stage, c),
                    )
                    .unwrap();
                    assert!(z.layout().buckets.len() >= 3);
                    zero_steps(m.as_ref(), &mut z, c, r, 0, 5);
                    if c.overlapped {
                        let t = z.last_trace();
                        assert!(t.submitted_during_backward() >= 2, "{t:?}");
                    }
                    if let Some(max) = c.clip {
                        assert!(
                            z.last_grad_norm().unwrap() > max,
                            "the clip should bite in this case"
                        );
                    }
                    weights(m.as_ref())
                });
                for (r, w) in got.iter().enumerate() {
                    assert_close(
                        w,
                        &want,
                        1e-5,
                        &format!("{c:?} stage {stage}, {n} ranks, rank {r} vs data parallel"),
                    );
                }
                assert!(got.iter().all(|w| w == &got[0]), "replicas diverged");
            }
        }
    }
}

/// Two groups unlike the default one: the first half of the parameters at 3× the rate and
/// without decay, the rest (biases too) decayed by 0.2.
fn groups(m: &dyn Module) -> Vec<ParamGroup> {
    let mut first = m.parameters();
    let rest = first.split_off(first.len() / 2);
    vec![
        ParamGroup::new(first)
            .with_lr(3.0 * LR)
            .with_weight_decay(0.0),
        ParamGroup::new(rest).with_weight_decay(0.2),
    ]
}

#[test]
fn zero_with_parameter_groups_equals_data_parallel() {
    for sgd in [false, true] {
        let c = Case {
            sgd,
            clip: None,
            overlapped: true,
        };
        let plain_groups = |m: &dyn Module| -> Box<dyn Optimizer> {
            if sgd {
                Box::new(Sgd::with_groups(groups(m), LR, 0.9, false, WD).unwrap())
            } else {
                Box::new(AdamW::with_groups(groups(m), LR, WD).unwrap())
            }
        };
        let want = data_parallel_with(2, c, 4, &plain_groups);
        // The groups make a difference, or this test could not fail.
        let default = data_parallel(2, c, 4);
        assert!(want != default);
        for stage in [1u8, 2] {
            let got = run_on_threads(2, T, |comm| {
                let r = comm.rank();
                let m = model(7 + r as u64);
                let mut z = ZeroOptimizer::with_groups(
                    shared(comm),
                    groups(m.as_ref()),
                    LR,
                    algo(c),
                    zero_opts(stage, c),
                )
                .unwrap();
                zero_steps(m.as_ref(), &mut z, c, r, 0, 4);
                weights(m.as_ref())
            });
            for (r, w) in got.iter().enumerate() {
                assert_close(w, &want, 1e-5, &format!("sgd {sgd} stage {stage} rank {r}"));
            }
        }
    }
}

#[test]
fn zero_accumulates_without_communicating() {
    const N: usize = 2;
    const A: usize = 3;
    let comms = sinter_dist::ThreadGroup::with_timeout(N, T);
    let counts: Vec<Arc<AtomicUsize>> = (0..N).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    let got: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .zip(&counts)
            .enumerate()
            .map(|(r, (comm, count))| {
                s.spawn(move || {
                    let comm = Arc::new(AsyncCommunicator::new(Counting {
                        inner: comm,
                        count: count.clone(),
                    }));
                    let m = model(7);
                    let c = Case {
                        sgd: false,
                        clip: None,
                        overlapped: true,
                    };
                    let mut z =
                        ZeroOptimizer::new(comm, m.parameters(), LR, algo(c), zero_opts(2, c))
                            .unwrap();
                    for s in 0..3 {
                        for k in 0..A {
                            let rows = (k * N + r) * B..(k * N + r + 1) * B;
                            let l = loss(m.as_ref(), s, rows)
                                .unwrap()
                                .mul_scalar(1.0 / A as f32)
                                .unwrap();
                            let before = count.load(Ordering::SeqCst);
                            z.backward_with(&l, k + 1 == A).unwrap();
                            let delta = count.load(Ordering::SeqCst) - before;
                            if k + 1 < A {
                                assert_eq!(
                                    delta, 0,
                                    "a collective ran on accumulating micro-step {k}"
                                );
                            } else {
                                assert_eq!(
                                    delta,
                                    z.layout().buckets.len(),
                                    "one reduce-scatter per bucket"
                                );
                            }
                        }
                        z.step().unwrap();
                        z.zero_grad();
                    }
                    weights(m.as_ref())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Serial: one step of the whole N·A·B batch.
    let m = model(7);
    let mut opt = AdamW::new(m.parameters(), LR, WD).unwrap();
    for s in 0..3 {
        loss(m.as_ref(), s, 0..N * A * B)
            .unwrap()
            .backward()
            .unwrap();
        opt.step().unwrap();
        opt.zero_grad();
    }
    // Three thirds of a loss summed round differently from the whole; AdamW divides each
    // gradient by its own running magnitude, so that rounding reaches the weights at ~1e-5.
    for w in &got {
        assert_close(
            w,
            &weights(m.as_ref()),
            2e-5,
            "ZeRO-2 with accumulation vs one big batch",
        );
    }
}

type Saved = (Vec<Vec<f32>>, HashMap<String, Tensor>, u64);

/// Trains `steps` from `first` on `n` ranks with `stage` (0 = plain AdamW, data parallel),
/// optionally starting from a saved state; returns weights, full optimizer state and steps.
fn train(n: usize, stage: u8, from: Option<&Saved>, first: usize, steps: usize) -> Saved {
    let c = Case {
        sgd: false,
        clip: None,
        overlapped: true,
    };
    run_on_threads(n, T, |comm| {
        let r = comm.rank();
        let m = model(7);
        if let Some((w, _, _)) = from {
            for ((_, t), v) in m.parameters().iter().zip(w) {
                t.assign(&Tensor::from_slice(v, t.shape(), sinter_core::Device::Cpu).unwrap())
                    .unwrap();
            }
        }
        let comm = shared(comm);
        let (state, steps_done) = if stage == 0 {
            let mut dp = DataParallel::new(comm, m.parameters(), 1024).unwrap();
            let mut opt = AdamW::new(m.parameters(), LR, WD).unwrap();
            if let Some((_, st, k)) = from {
                opt.load_state(*k, st).unwrap();
            }
            for s in first..first + steps {
                dp.backward(&loss(m.as_ref(), s, r * (B * 4 / n)..(r + 1) * (B * 4 / n)).unwrap())
                    .unwrap();
                opt.step().unwrap();
                opt.zero_grad();
            }
            (opt.state(), opt.steps())
        } else {
            // A different bucket size than the saving run: the layout must not matter.
            let opts = ZeroOptions {
                stage,
                bucket_bytes: 512 * n,
                grad_clip: None,
            };
            let mut z = ZeroOptimizer::new(comm, m.parameters(), LR, algo(c), opts).unwrap();
            if let Some((_, st, k)) = from {
                z.load_state(*k, st).unwrap();
            }
            for s in first..first + steps {
                let l = loss(m.as_ref(), s, r * (B * 4 / n)..(r + 1) * (B * 4 / n)).unwrap();
                z.backward(&l).unwrap();
                z.step().unwrap();
                z.zero_grad();
            }
            (z.state(), z.steps())
        };
        (
            weights(m.as_ref()),
            state.into_iter().collect::<HashMap<_, _>>(),
            steps_done,
        )
    })
    .swap_remove(0)
}

fn state_close(got: &HashMap<String, Tensor>, want: &HashMap<String, Tensor>, what: &str) {
    let mut keys: Vec<&String> = want.keys().collect();
    keys.sort();
    let mut got_keys: Vec<&String> = got.keys().collect();
    got_keys.sort();
    assert_eq!(got_keys, keys, "{what}: state names");
    let g: Vec<Vec<f32>> = keys.iter().map(|k| got[*k].to_vec_f32().unwrap()).collect();
    let w: Vec<Vec<f32>> = keys
        .iter()
        .map(|k| want[*k].to_vec_f32().unwrap())
        .collect();
    assert_close(&g, &w, 1e-4, what);
}

#[test]
fn zero_state_reshards_from_4_ranks_to_2_and_1() {
    // The global batch is 4·B rows in every layout.
    let whole = train(4, 2, None, 0, 6);
    let half = train(4, 2, None, 0, 3);
    // Names and shapes are those of plain AdamW.
    let plain_names: Vec<String> = {
        let m = model(7);
        let mut v: Vec<String> = AdamW::new(m.parameters(), LR, WD)
            .unwrap()
            .state()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        v.sort();
        v
    };
    let mut names: Vec<String> = half.1.keys().cloned().collect();
    names.sort();
    assert_eq!(names, plain_names);
    for (n, stage, what) in [
        (2, 2, "ZeRO-2 on 2 ranks"),
        (2, 1, "ZeRO-1 on 2 ranks"),
        (1, 0, "plain AdamW on 1 rank"),
        (1, 2, "ZeRO-2 on 1 rank"),
    ] {
        let resumed = train(n, stage, Some(&half), 3, 3);
        assert_eq!(resumed.2, 6);
        assert_close(
            &resumed.0,
            &whole.0,
            1e-5,
            &format!("weights: 4 ranks → {what} vs uninterrupted"),
        );
        state_close(
            &resumed.1,
            &whole.1,
            &format!("optimizer state: 4 ranks → {what}"),
        );
    }
    // And the other way: plain AdamW's state loads into ZeRO on 4 ranks.
    let single = train(1, 0, None, 0, 3);
    let up = train(4, 1, Some(&single), 3, 3);
    assert_close(&up.0, &whole.0, 1e-5, "1 rank (plain) → ZeRO-1 on 4 ranks");
}

#[test]
fn zero_bytes_per_rank_follow_the_paper() {
    let mut lines = Vec::new();
    for n in [1usize, 2, 4, 8] {
        let reports = run_on_threads(n, T, |comm| {
            let m = model(7);
            let c = Case {
                sgd: false,
                clip: None,
                overlapped: true,
            };
            let mut out = Vec::new();
            let comm = shared(comm);
            for stage in [1u8, 2] {
                let mut z = ZeroOptimizer::new(
                    comm.clone(),
                    m.parameters(),
                    LR,
                    algo(c),
                    zero_opts(stage, c),
                )
                .unwrap();
                zero_steps(m.as_ref(), &mut z, c, comm.rank(), 0, 1);
                out.push(z.memory());
            }
            out
        });
        for mem in &reports[0] {
            let psi = mem.params as f64;
            let buckets = 8.0; // upper bound on buckets × padding slots below
            let pad = buckets * n as f64;
            assert_eq!(mem.param_bytes, 4 * mem.params);
            // Our fp32 allocation: params 4Ψ; grads 4Ψ (stage 1) or 4Ψ/N (stage 2); AdamW m, v 8Ψ/N.
            let (g, o) = (mem.grad_bytes as f64, mem.optimizer_bytes as f64);
            let g_want = if mem.stage == 1 {
                4.0 * psi
            } else {
                4.0 * psi / n as f64
            };
            assert!(
                (g - g_want).abs() <= 4.0 * pad,
                "stage {} N {n}: grads {g} vs {g_want}",
                mem.stage
            );
            assert!(
                (o - 8.0 * psi / n as f64).abs() <= 8.0 * pad,
                "stage {} N {n}: state {o}",
                mem.stage
            );
            // Priced as mixed precision they follow 4Ψ + 12Ψ/N and 2Ψ + 14Ψ/N.
            let f = zero_bytes_per_rank(psi, mem.stage, n);
            assert_eq!(mem.formula_bytes, f);
            assert!(
                (mem.mixed_precision_bytes - f).abs() <= 14.0 * pad,
                "stage {} N {n}: {} vs formula {f}",
                mem.stage,
                mem.mixed_precision_bytes
            );
            lines.push(format!(
                "stage {} N={n}: Ψ={} fp32 params {} B, grads {} B, optimizer {} B, total {} B (in flight ≤ {} B); as mixed precision {:.0} B, formula {:.0} B",
                mem.stage, mem.params, mem.param_bytes, mem.grad_bytes, mem.optimizer_bytes, mem.total_bytes, mem.peak_in_flight_bytes, mem.mixed_precision_bytes, f
            ));
        }
        // Stage 2 needs less than stage 1 once there is more than one rank.
        if n > 1 {
            assert!(reports[0][1].total_bytes < reports[0][0].total_bytes);
        }
    }
    println!("{}", lines.join("\n"));
}

/// A two-layer net as raw parameters on `dev` (the test MLP cannot move devices).
fn device_net(dev: Device) -> Vec<(String, Tensor)> {
    let mut rng = sinter_core::Rng::new(11);
    [
        ("w1", vec![IN, 16]),
        ("b1", vec![16]),
        ("w2", vec![16, CLASSES]),
        ("b2", vec![CLASSES]),
    ]
    .into_iter()
    .map(|(n, shape)| {
        let t = Tensor::randn(&shape, 0.0, 0.3, &mut rng, DType::F32, Device::Cpu).unwrap();
        (n.to_string(), t.to_device(dev).unwrap().to_var().unwrap())
    })
    .collect()
}

fn device_loss(p: &[(String, Tensor)], step: usize, rows: std::ops::Range<usize>) -> Tensor {
    let dev = p[0].1.device();
    let (x, y) = batch(step, rows);
    let (x, y) = (x.to_device(dev).unwrap(), y.to_device(dev).unwrap());
    let h = x
        .matmul(&p[0].1)
        .unwrap()
        .add(&p[1].1)
        .unwrap()
        .tanh()
        .unwrap();
    let o = h.matmul(&p[2].1).unwrap().add(&p[3].1).unwrap();
    o.cross_entropy(&y, -100).unwrap()
}

/// ZeRO on 2 ranks with the shard on `dev(rank)`: weights and full optimizer state after 4
/// steps, and (rank 0) the kernels one step launched on a CUDA device.
fn zero_on(
    dev: fn(usize) -> Device,
    stage: u8,
    c: Case,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>, Vec<String>) {
    use sinter_core::cuda::runtime::gpu_model::cost;
    run_on_threads(2, T, |comm| {
        let r = comm.rank();
        let p = device_net(dev(r));
        let mut z = ZeroOptimizer::new(
            shared(comm),
            p.clone(),
            LR,
            algo(c),
            ZeroOptions {
                stage,
                bucket_bytes: 256,
                grad_clip: c.clip,
            },
        )
        .unwrap();
        let mut kernels = Vec::new();
        for s in 0..4 {
            z.backward(&device_loss(&p, s, r * B..(r + 1) * B)).unwrap();
            let record = r == 0 && s == 3 && dev(0) != Device::Cpu;
            if record {
                cost::start_recording();
            }
            z.step().unwrap();
            if record {
                kernels = cost::stop_recording(0).into_iter().map(|k| k.key).collect();
            }
            z.zero_grad();
        }
        if let Some(max) = c.clip {
            assert!(z.last_grad_norm().unwrap() > max, "the clip should bite");
        }
        let w = p.iter().map(|(_, t)| t.to_vec_f32().unwrap()).collect();
        let st = z
            .state()
            .iter()
            .map(|(_, t)| t.to_vec_f32().unwrap())
            .collect();
        (w, st, kernels)
    })
    .swap_remove(0)
}

#[test]
fn zero_on_the_device_equals_zero_on_the_cpu() {
    use sinter_cuda::testing::{gpu_tests, TestDevice};
    match gpu_tests(2) {
        None => return,
        Some(TestDevice::Real) if sinter_cuda::device_count().unwrap_or(0) < 2 => {
            println!("skipped: two ranks need two GPUs here (rank r steps on cuda:r)");
            return;
        }
        Some(_) => {}
    }
    let cases = [(false, Some(0.05)), (false, None), (true, None)];
    for (sgd, clip) in cases {
        let c = Case {
            sgd,
            clip,
            overlapped: true,
        };
        for stage in [1u8, 2] {
            let what = format!("sgd {sgd} clip {clip:?} stage {stage}");
            let (want_w, want_s, _) = zero_on(|_| Device::Cpu, stage, c);
            let (got_w, got_s, kernels) = zero_on(Device::Cuda, stage, c);
            assert_close(&got_w, &want_w, 1e-5, &format!("{what}: weights"));
            assert_close(&got_s, &want_s, 1e-4, &format!("{what}: optimizer state"));
            // The update ran on the device: AdamW as one multi-tensor launch for the rank's
            // pieces (fewer than 32), not on the host.
            let adamw = kernels.iter().filter(|k| k.starts_with("adamw")).count();
            if sgd {
                assert!(
                    kernels.iter().any(|k| k.starts_with("sgd")),
                    "{what}: {kernels:?}"
                );
            } else {
                assert_eq!(adamw, 1, "{what}: {kernels:?}");
            }
        }
    }
}
