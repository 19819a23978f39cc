//! Optimizer updates (AdamW, SGD with and without momentum/Nesterov) and the device step
//! control block (loss scaling, clipping, skipped steps, the learning-rate schedule), against
//! the f64 reference of the update rules; parameters in the permanent pool on CUDA.

use crate::harness::*;
use crate::reference::{self as r, Arr, StepControl};
use sinter_core::kernels::optimizer::{adamw_step_many, AdamWSlot};
use sinter_core::step_ctl::{ctl, grad_sum_squares, ScalerCfg};
use sinter_core::{cuda, AdamWParams, DType, Error, SgdParams, Tensor};

pub fn cases() -> Vec<Case> {
    vec![
        case("adamw", FLOATS, adamw),
        case("adamw_many", F32, adamw_many),
        case("sgd", F32, sgd),
        case("misuse", F32, misuse),
        case("step_control", F32, step_control),
        case("permanent_pool", F32, permanent_pool).cuda_only(),
    ]
}

const F32_TOL: fn() -> Tol = || tol(DType::F32, 1.0);

/// An f32 parameter with storage of its own on the device (optimizers update in place).
fn param(t: &Target, a: &Arr) -> Tensor {
    make(a, DType::F32, t.dev).to_var().unwrap()
}

/// Three AdamW steps with gradients of the target dtype on an f32 parameter.
fn adamw(t: &Target) {
    let mut rng = t.rng(80);
    let p0 = uniform(&mut rng, &[7, 9], -1.0, 1.0);
    let grads: Vec<Arr> = (0..3)
        .map(|_| t.round(&uniform(&mut rng, &[7, 9], -1.0, 1.0)))
        .collect();
    let h = |step| AdamWParams {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
        step,
    };
    let p = param(t, &p0);
    let (m, v) = (p.zeros_like().unwrap(), p.zeros_like().unwrap());
    for (i, g) in grads.iter().enumerate() {
        p.adamw_step(&t.tensor(g), &m, &v, h(i as u64 + 1)).unwrap();
    }
    let mut want = (p0.clone(), p0.map(|_| 0.0), p0.map(|_| 0.0));
    for (i, g) in grads.iter().enumerate() {
        for j in 0..p0.numel() {
            let (a, b, c) = r::adamw(
                want.0.data[j],
                g.data[j],
                want.1.data[j],
                want.2.data[j],
                1e-2,
                (0.9, 0.999),
                1e-8,
                0.1,
                i as i32 + 1,
            );
            (want.0.data[j], want.1.data[j], want.2.data[j]) = (a, b, c);
        }
    }
    for (name, got, want) in [
        ("param", &p, &want.0),
        ("m", &m, &want.1),
        ("v", &v, &want.2),
    ] {
        assert_eq!((got.device(), got.dtype()), (t.dev, DType::F32), "{name}");
        assert_close(
            &format!("adamw {name}"),
            &arr(got).data,
            &want.data,
            F32_TOL(),
        );
    }
}

/// The multi-tensor step equals `adamw_step` per parameter bit for bit: 37 parameters (two
/// launches of 32 slots on CUDA; sizes off the vector width, one spanning several 4096-element
/// chunks, one without a gradient left alone), each with its own weight decay and learning-rate
/// factor; plain, then driven by a step control block (whose rate the factor scales in f32, as
/// the per-parameter path with a scaled block).
fn adamw_many(t: &Target) {
    let mut rng = t.rng(83);
    let sizes: Vec<usize> = (0..37).map(|i| [1, 3, 4, 17, 64, 130][i % 6] + i).collect();
    let sizes = [sizes, vec![9000]].concat();
    let h = |lr, step| AdamWParams {
        lr,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        step,
    };
    let settings = |i: usize| (0.01 * (i % 3) as f64, [1.0, 0.5, 2.5][i % 3]);
    let p0: Vec<Arr> = sizes
        .iter()
        .map(|&n| uniform(&mut rng, &[n], -1.0, 1.0))
        .collect();
    let state = |ps: &[Arr]| -> Vec<[Tensor; 3]> {
        ps.iter()
            .map(|a| {
                let p = param(t, a);
                let (m, v) = (p.zeros_like().unwrap(), p.zeros_like().unwrap());
                [p, m, v]
            })
            .collect()
    };
    let (many, one) = (state(&p0), state(&p0));
    let mut c0 = vec![0f32; ctl::LEN];
    (c0[ctl::LR], c0[ctl::GRAD_FACTOR], c0[ctl::STEPS]) = (0.03, 0.5, 2.0);
    let c = Tensor::from_vec(c0.clone(), &[ctl::LEN], t.dev).unwrap();
    for step in 1..=3u64 {
        let grads: Vec<Tensor> = sizes
            .iter()
            .map(|&n| t.tensor(&uniform(&mut rng, &[n], -1.0, 1.0)))
            .collect();
        let with_ctl = step == 3;
        // Parameter 5 has no gradient this step: neither path touches it.
        let live: Vec<usize> = (0..sizes.len()).filter(|&i| i != 5).collect();
        let slots: Vec<AdamWSlot> = live
            .iter()
            .map(|&i| AdamWSlot {
                param: &many[i][0],
                grad: &grads[i],
                m: &many[i][1],
                v: &many[i][2],
                weight_decay: settings(i).0,
                lr_scale: settings(i).1,
            })
            .collect();
        adamw_step_many(&slots, h(1e-2, step), with_ctl.then_some(&c)).unwrap();
        for &i in &live {
            let (wd, scale) = settings(i);
            let [p, m, v] = &one[i];
            if with_ctl {
                let mut f = vec![1f32; ctl::LEN];
                f[ctl::LR] = scale as f32;
                let f = Tensor::from_vec(f, &[ctl::LEN], t.dev).unwrap();
                let hs = AdamWParams {
                    weight_decay: wd,
                    ..h(0.0, 1)
                };
                p.adamw_step_ctl(&grads[i], m, v, hs, &c.mul(&f).unwrap())
                    .unwrap();
            } else {
                let hs = AdamWParams {
                    weight_decay: wd,
                    ..h(1e-2 * scale, step)
                };
                p.adamw_step(&grads[i], m, v, hs).unwrap();
            }
        }
    }
    for (i, (a, b)) in many.iter().zip(&one).enumerate() {
        for k in 0..3 {
            let (x, y) = (a[k].to_vec_f32().unwrap(), b[k].to_vec_f32().unwrap());
            let same = x.iter().zip(&y).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "adamw_many: parameter {i} tensor {k} differs from adamw_step"
            );
        }
    }
    assert_eq!(
        many[5][0].to_vec_f32().unwrap(),
        p0[5].data.iter().map(|&x| x as f32).collect::<Vec<_>>(),
        "a parameter without a slot is left alone"
    );
    // Misuse: a moment shared by two slots is refused before anything runs.
    let g = t.zeros(&[sizes[0]], DType::F32);
    let twice = [0, 1].map(|_| AdamWSlot {
        param: &many[0][0],
        grad: &g,
        m: &many[0][1],
        v: &many[0][2],
        weight_decay: 0.0,
        lr_scale: 1.0,
    });
    let e = adamw_step_many(&twice, h(1e-2, 1), None).unwrap_err();
    assert!(e.to_string().contains("share"), "{e}");
}

fn sgd(t: &Target) {
    let mut rng = t.rng(81);
    let p0 = uniform(&mut rng, &[7, 9], -1.0, 1.0);
    let grads: Vec<Arr> = (0..3)
        .map(|_| uniform(&mut rng, &[7, 9], -1.0, 1.0))
        .collect();
    for (momentum, nesterov) in [(0.0, false), (0.9, false), (0.9, true)] {
        let hs = SgdParams {
            lr: 0.1,
            momentum,
            nesterov,
            weight_decay: 0.01,
        };
        let p = param(t, &p0);
        let buf = p.zeros_like().unwrap();
        for g in &grads {
            let g = t.tensor(g);
            p.sgd_step(&g, (momentum > 0.0).then_some(&buf), hs)
                .unwrap();
        }
        let mut want = (p0.clone(), p0.map(|_| 0.0));
        for g in &grads {
            for j in 0..p0.numel() {
                let (a, b) = r::sgd(
                    want.0.data[j],
                    g.data[j],
                    want.1.data[j],
                    0.1,
                    momentum as f64,
                    nesterov,
                    0.01f32 as f64,
                );
                (want.0.data[j], want.1.data[j]) = (a, b);
            }
        }
        assert_close(
            &format!("sgd momentum {momentum} nesterov {nesterov}"),
            &arr(&p).data,
            &want.0.data,
            F32_TOL(),
        );
    }
}

fn misuse(t: &Target) {
    let h = AdamWParams {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        step: 1,
    };
    let p = t.zeros(&[4, 3], DType::F32).to_var().unwrap();
    let e = p
        .adamw_step(&p.ones_like().unwrap(), &p, &p.zeros_like().unwrap(), h)
        .unwrap_err();
    assert!(
        e.to_string().contains("share"),
        "state sharing the parameter's storage: {e}"
    );
    let pb = t.zeros(&[4, 3], DType::BF16).to_var().unwrap();
    let e = pb
        .adamw_step(
            &pb.zeros_like().unwrap(),
            &pb.zeros_like().unwrap(),
            &pb.zeros_like().unwrap(),
            h,
        )
        .unwrap_err();
    assert!(
        matches!(e, Error::DTypeMismatch { .. }),
        "a bf16 parameter: {e}"
    );
    expect_err(
        p.sgd_step(
            &t.zeros(&[3, 4], DType::F32),
            None,
            SgdParams {
                lr: 0.1,
                momentum: 0.0,
                nesterov: false,
                weight_decay: 0.0,
            },
        ),
        "sgd_step",
    );
}

/// Five steps of AdamW and Nesterov SGD driven by the step control block, with loss-scaled
/// gradients, clipping to norm 5, dynamic loss scaling (growth every 2 good steps) and a NaN
/// at step 2 (skipped: parameters and moments untouched, the scale halved).
fn step_control(t: &Target) {
    let mut rng = t.rng(82);
    let p0 = Arr::from_fn(&[64, 33], |_| rng.uniform(-1.0, 1.0));
    let lrs = [0.1, 0.05, 0.02, 0.01, 0.005];
    let (growth, backoff, interval) = (2.0, 0.5, 2);
    let mut grads: Vec<Arr> = (0..5)
        .map(|_| uniform(&mut rng, &[64, 33], -500.0, 500.0))
        .collect();
    grads[2].data[5] = f64::NAN;
    // On the device.
    let dev = t.dev;
    let (p, q) = (param(t, &p0), param(t, &p0));
    let (m, v, b) = (
        p.zeros_like().unwrap(),
        p.zeros_like().unwrap(),
        q.zeros_like().unwrap(),
    );
    let mut c0 = vec![0f32; ctl::LEN];
    c0[ctl::SCALE] = 256.0;
    c0[ctl::LR] = 0.1;
    c0[ctl::GRAD_FACTOR] = 1.0;
    let c = Tensor::from_vec(c0, &[ctl::LEN], dev).unwrap();
    let table = make(&Arr::new(&[5], lrs.to_vec()), DType::F32, dev);
    let scaler = Some(ScalerCfg {
        growth: growth as f32,
        backoff: backoff as f32,
        interval,
    });
    let ha = AdamWParams {
        lr: 0.0,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        step: 1,
    };
    let hs = SgdParams {
        lr: 0.0,
        momentum: 0.9,
        nesterov: true,
        weight_decay: 0.0,
    };
    for g in &grads {
        let g = make(g, DType::F32, dev);
        let s = grad_sum_squares(std::slice::from_ref(&g), dev).unwrap();
        c.step_prepare(&s, 5.0, true).unwrap();
        p.adamw_step_ctl(&g, &m, &v, ha, &c).unwrap();
        q.sgd_step_ctl(&g, Some(&b), hs, &c).unwrap();
        c.step_finish(&table, scaler).unwrap();
    }
    // The reference.
    let mut sc = StepControl {
        scale: 256.0,
        lr: 0.1,
        steps: 0.0,
        good: 0.0,
        iter: 0.0,
        skipped: 0.0,
        found_inf: false,
        grad_norm: 0.0,
        factor: 1.0,
    };
    let (mut wp, mut wm, mut wv, mut wq, mut wb) = (
        p0.clone(),
        p0.map(|_| 0.0),
        p0.map(|_| 0.0),
        p0.clone(),
        p0.map(|_| 0.0),
    );
    for g in &grads {
        let g = r::rounded(g, DType::F32);
        sc.prepare(g.data.iter().map(|x| x * x).sum(), 5.0, true);
        if !sc.found_inf {
            for j in 0..p0.numel() {
                let gj = g.data[j] * sc.factor;
                (wp.data[j], wm.data[j], wv.data[j]) = r::adamw(
                    wp.data[j],
                    gj,
                    wm.data[j],
                    wv.data[j],
                    sc.lr,
                    (0.9, 0.999),
                    1e-8,
                    0.01f32 as f64,
                    sc.steps as i32 + 1,
                );
                (wq.data[j], wb.data[j]) =
                    r::sgd(wq.data[j], gj, wb.data[j], sc.lr, 0.9f32 as f64, true, 0.0);
            }
        }
        sc.finish(
            &lrs.map(|x| x as f32 as f64),
            growth,
            backoff,
            interval as f64,
        );
    }
    for (name, got, want) in [
        ("p", &p, &wp),
        ("m", &m, &wm),
        ("v", &v, &wv),
        ("sgd p", &q, &wq),
        ("sgd buf", &b, &wb),
    ] {
        assert_close(
            &format!("step control: {name}"),
            &arr(got).data,
            &want.data,
            tol(DType::F32, 10.0),
        );
    }
    let cv = arr(&c).data;
    for (slot, name, want) in [
        (ctl::SCALE, "scale", sc.scale),
        (ctl::LR, "lr", sc.lr),
        (ctl::STEPS, "steps", sc.steps),
        (ctl::GOOD_STEPS, "good steps", sc.good),
        (ctl::ITER, "iter", sc.iter),
        (ctl::SKIPPED, "skipped", sc.skipped),
        (ctl::GRAD_NORM, "grad norm", sc.grad_norm),
        (ctl::GRAD_FACTOR, "grad factor", sc.factor),
        (ctl::FOUND_INF, "found inf", 0.0),
    ] {
        assert_close(
            &format!("step control: ctl {name}"),
            &[cv[slot]],
            &[want],
            F32_TOL(),
        );
    }
    assert_eq!(
        (sc.skipped, sc.steps),
        (1.0, 4.0),
        "test bug: the NaN step must be the one skipped"
    );
}

/// On CUDA the first optimizer step moves the parameter and its state (made with zeros_like)
/// from the temporary to the permanent pool, in place: views and clones taken before follow.
fn permanent_pool(t: &Target) {
    let w = Tensor::ones(&[1024, 1024], DType::F32, t.dev)
        .unwrap()
        .to_var()
        .unwrap();
    let grad = w.mul_scalar(0.5).unwrap();
    assert_eq!(w.cuda_pool(), Some(cuda::Pool::Temporary));
    let view = w.t().unwrap();
    let (m, v) = (w.zeros_like().unwrap(), w.zeros_like().unwrap());
    w.adamw_step(
        &grad,
        &m,
        &v,
        AdamWParams {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            step: 1,
        },
    )
    .unwrap();
    for (name, x) in [("param", &w), ("its view", &view), ("m", &m), ("v", &v)] {
        assert_eq!(x.cuda_pool(), Some(cuda::Pool::Permanent), "{name}");
    }
    assert_eq!(grad.cuda_pool(), Some(cuda::Pool::Temporary));
    // The update reached the moved buffer (AdamW's first step moves each weight by about lr).
    let vals = arr(&view).data;
    assert!(
        vals.iter().all(|&x| (x - (1.0 - 1e-3)).abs() < 1e-5),
        "{:?}",
        &vals[..4]
    );
    let s = cuda::memory_stats(0).unwrap();
    assert!(s.permanent >= 3 * (4 << 20), "{s:?}");
    assert!(
        s.peak >= s.in_use && s.reserved >= s.in_use && s.in_use >= s.permanent,
        "{s:?}"
    );
    assert_eq!(
        Tensor::zeros(&[2], DType::F32, sinter_core::Device::Cpu)
            .unwrap()
            .cuda_pool(),
        None
    );
}
