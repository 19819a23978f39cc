//! Mixed-precision training on the CPU (where f16 and bf16 are real storage types): autocast
//! training tracks fp32, master weights keep f32 gradients, and fp16 loss scaling skips
//! overflowing steps and grows its scale after a run of good ones.

use sinter_core::{amp, DType, Device, Rng, Tensor};
use sinter_nn::{LossScaler, Module, Optimizer, PrecisionMode, Relu, Sequential, Sgd};

const IN: usize = 16;
const HIDDEN: usize = 32;
const CLASSES: usize = 4;
const BATCH: usize = 64;

fn mlp(seed: u64) -> Sequential {
    let mut rng = Rng::new(seed);
    Sequential::new()
        .add(sinter_nn::Linear::new(IN, HIDDEN, true, &mut rng).unwrap())
        .add(Relu)
        .add(sinter_nn::Linear::new(HIDDEN, CLASSES, true, &mut rng).unwrap())
}

/// Four Gaussian clusters (one per class) in IN dimensions; the same batches for every run.
fn batches(n: usize) -> Vec<(Tensor, Tensor)> {
    let mut rng = Rng::new(42);
    let centres: Vec<Vec<f64>> = (0..CLASSES)
        .map(|_| (0..IN).map(|_| rng.normal() * 1.5).collect())
        .collect();
    (0..n)
        .map(|_| {
            let mut x = Vec::with_capacity(BATCH * IN);
            let mut y = Vec::with_capacity(BATCH);
            for _ in 0..BATCH {
                let c = (rng.next_f64() * CLASSES as f64) as usize % CLASSES;
                y.push(c as i64);
                x.extend(centres[c].iter().map(|m| (m + rng.normal()) as f32));
            }
            (
                Tensor::from_vec(x, &[BATCH, IN], Device::Cpu).unwrap(),
                Tensor::from_vec(y, &[BATCH], Device::Cpu).unwrap(),
            )
        })
        .collect()
}

/// Trains a fresh MLP (same init every time) in `mode`; returns the loss at each step.
fn train(mode: PrecisionMode, steps: usize, scaler: Option<&mut LossScaler>) -> Vec<f64> {
    let model = mlp(7);
    let mut opt = Sgd::new(model.parameters(), 0.1, 0.9, false, 0.0).unwrap();
    let mut scaler = scaler;
    let mut losses = Vec::new();
    for (x, y) in batches(steps) {
        let loss = {
            let _ac = mode.autocast();
            model.forward(&x).unwrap().cross_entropy(&y, -100).unwrap()
        };
        assert_eq!(loss.dtype(), DType::F32);
        losses.push(loss.to_scalar_f32().unwrap() as f64);
        match scaler.as_deref_mut() {
            Some(s) => {
                s.scale_loss(&loss).unwrap().backward().unwrap();
                s.step(&mut opt).unwrap();
            }
            None => {
                loss.backward().unwrap();
                opt.step().unwrap();
            }
        }
        // Master weights and their gradients stay f32.
        for (name, p) in model.parameters() {
            assert_eq!(p.dtype(), DType::F32, "{name}");
            if let Some(g) = p.grad() {
                assert_eq!(g.dtype(), DType::F32, "gradient of {name}");
            }
        }
        opt.zero_grad();
    }
    losses
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn bf16_autocast_training_tracks_fp32() {
    let steps = 60;
    let fp32 = train(PrecisionMode::Fp32, steps, None);
    let bf16 = train(PrecisionMode::Bf16, steps, None);
    // Both learn: the last ten steps are far below the first.
    assert!(
        mean(&fp32[50..]) < 0.5 * fp32[0],
        "fp32 did not learn: {fp32:?}"
    );
    assert!(
        mean(&bf16[50..]) < 0.5 * bf16[0],
        "bf16 did not learn: {bf16:?}"
    );
    // Same start (bf16 rounding of the first products only) and the same curve within bf16's
    // 8-bit mantissa.
    assert!(
        (fp32[0] - bf16[0]).abs() < 0.02,
        "{} vs {}",
        fp32[0],
        bf16[0]
    );
    for (i, (a, b)) in fp32.iter().zip(&bf16).enumerate() {
        assert!(
            (a - b).abs() < 0.05 + 0.1 * a.abs(),
            "step {i}: fp32 {a} vs bf16 {b}"
        );
    }
    // tf32 on the CPU is fp32: the same numbers exactly.
    assert_eq!(train(PrecisionMode::Tf32, 10, None), fp32[..10].to_vec());
}

#[test]
fn fp16_with_loss_scaling_tracks_fp32() {
    let steps = 60;
    let fp32 = train(PrecisionMode::Fp32, steps, None);
    let mut scaler = LossScaler::new(1024.0);
    let fp16 = train(PrecisionMode::Fp16, steps, Some(&mut scaler));
    assert_eq!(
        scaler.skipped_steps(),
        0,
        "no overflow expected at scale 1024"
    );
    for (i, (a, b)) in fp32.iter().zip(&fp16).enumerate() {
        assert!(
            (a - b).abs() < 0.02 + 0.05 * a.abs(),
            "step {i}: fp32 {a} vs fp16 {b}"
        );
    }
}

#[test]
fn autocast_gradients_of_master_weights_are_f32_and_match_fp32() {
    let (x, y) = batches(1).remove(0);
    let grads = |mode: PrecisionMode| -> Vec<(String, Tensor)> {
        let model = mlp(3);
        let loss = {
            let _ac = mode.autocast();
            model.forward(&x).unwrap().cross_entropy(&y, -100).unwrap()
        };
        loss.backward().unwrap();
        model
            .parameters()
            .into_iter()
            .map(|(n, p)| (n, p.grad().unwrap()))
            .collect()
    };
    let exact = grads(PrecisionMode::Fp32);
    for mode in [PrecisionMode::Bf16, PrecisionMode::Fp16] {
        for ((name, g), (_, e)) in grads(mode).iter().zip(&exact) {
            assert_eq!(g.dtype(), DType::F32, "{mode}: {name}");
            let (g, e) = (g.to_vec_f32().unwrap(), e.to_vec_f32().unwrap());
            let scale = e.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
            let err = g
                .iter()
                .zip(&e)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
                / scale;
            // Relative to the largest gradient of the tensor: bias gradients are sums with
            // cancellation, so they keep less than the dtype's own relative precision.
            let tol = if mode == PrecisionMode::Bf16 {
                0.08
            } else {
                0.03
            };
            eprintln!("{mode}: {name} relative error {err:.2e}");
            assert!(err < tol, "{mode}: {name} relative error {err}");
        }
    }
}

#[test]
fn fp16_overflow_skips_the_step_halves_the_scale_and_keeps_the_weights() {
    let model = mlp(11);
    let mut opt = Sgd::new(model.parameters(), 0.1, 0.0, false, 0.0).unwrap();
    // 2^40: the scaled loss is fine in f32, but its gradient overflows f16 (max 65504) on the
    // way into the f16 matrix products.
    let mut scaler = LossScaler::new(2f64.powi(40));
    let before: Vec<Vec<f32>> = model
        .parameters()
        .iter()
        .map(|(_, p)| p.to_vec_f32().unwrap())
        .collect();
    let (x, y) = batches(1).remove(0);
    let loss = {
        let _ac = amp::autocast(DType::F16);
        model.forward(&x).unwrap().cross_entropy(&y, -100).unwrap()
    };
    assert!(
        loss.to_scalar_f32().unwrap().is_finite(),
        "the loss itself is finite"
    );
    scaler.scale_loss(&loss).unwrap().backward().unwrap();
    let params = model.parameters();
    let any_inf = params.iter().any(|(_, p)| {
        p.grad()
            .unwrap()
            .to_vec_f32()
            .unwrap()
            .iter()
            .any(|v| !v.is_finite())
    });
    assert!(any_inf, "the forced overflow should reach some gradient");
    let stepped = scaler.step(&mut opt).unwrap();
    assert!(!stepped);
    assert_eq!(opt.steps(), 0, "the optimizer must not step");
    assert_eq!(scaler.scale, 2f64.powi(39));
    assert_eq!(scaler.good_steps(), 0);
    assert_eq!(scaler.skipped_steps(), 1);
    let after: Vec<Vec<f32>> = model
        .parameters()
        .iter()
        .map(|(_, p)| p.to_vec_f32().unwrap())
        .collect();
    assert_eq!(before, after, "weights must be untouched by a skipped step");

    // The same check by hand reports the overflow; a NaN anywhere does too.
    assert!(!scaler.unscale_and_check(&params).unwrap());
    opt.zero_grad();
    let w = &params[0].1;
    let mut g = vec![0f32; w.numel()];
    g[3] = f32::NAN;
    w.set_grad(Some(Tensor::from_vec(g, w.shape(), Device::Cpu).unwrap()));
    assert!(!scaler.unscale_and_check(&params).unwrap());
}

#[test]
fn scale_grows_after_growth_interval_good_steps_and_unscales_exactly() {
    let model = mlp(5);
    let mut opt = Sgd::new(model.parameters(), 0.05, 0.0, false, 0.0).unwrap();
    let mut scaler = LossScaler::new(256.0);
    scaler.growth_interval = 4;
    let data = batches(9);
    for (i, (x, y)) in data.iter().enumerate() {
        let loss = {
            let _ac = amp::autocast(DType::F16);
            model.forward(x).unwrap().cross_entropy(y, -100).unwrap()
        };
        scaler.scale_loss(&loss).unwrap().backward().unwrap();
        if i == 0 {
            // Unscaled gradients equal those of the unscaled loss (same forward, f16 products),
            // up to f16 rounding of the scaled values.
            let scaled: Vec<Vec<f32>> = model
                .parameters()
                .iter()
                .map(|(_, p)| p.grad().unwrap().to_vec_f32().unwrap())
                .collect();
            assert!(scaler.unscale_and_check(opt.params()).unwrap());
            for ((_, p), s) in model.parameters().iter().zip(&scaled) {
                let g = p.grad().unwrap().to_vec_f32().unwrap();
                for (a, b) in g.iter().zip(s) {
                    assert!(
                        (a * 256.0 - b).abs() <= 1e-3 * b.abs() + 1e-6,
                        "{a} · 256 vs {b}"
                    );
                }
            }
            assert!(scaler.last_grad_norm().unwrap().is_finite());
            opt.step().unwrap();
            scaler.update(false);
        } else {
            assert!(
                scaler.step(&mut opt).unwrap(),
                "step {i} overflowed at scale {}",
                scaler.scale
            );
        }
        opt.zero_grad();
        let expect = match i + 1 {
            1..=3 => 256.0,
            4..=7 => 512.0,
            _ => 1024.0,
        };
        assert_eq!(scaler.scale, expect, "after {} good steps", i + 1);
    }
    assert_eq!(opt.steps(), 9);
    assert_eq!(scaler.good_steps(), 1);
    let st = scaler.state();
    assert_eq!((st.scale, st.good_steps), (1024.0, 1));
}
