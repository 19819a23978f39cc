//! Timing of each fused op against its composite (not a test: run by hand with
//! `cargo test -p sinter-core --test fused_ops -- --ignored --nocapture`). Their correctness is
//! checked by the conformance suite (`conformance::fused`) on every device and dtype.

use sinter_core::fused;
use sinter_core::{DType, Device, Rng, Tensor};

fn randn(shape: &[usize], rng: &mut Rng) -> Tensor {
    Tensor::randn(shape, 0.0, 1.0, rng, DType::F32, Device::Cpu).unwrap()
}

/// Forward + backward time of each fused op against its composite. Run with
/// `cargo test -p sinter-core --test fused_ops -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_fused_against_composite() {
    use std::time::Instant;
    let time = |f: &dyn Fn()| {
        f();
        let reps = 5;
        let t0 = Instant::now();
        for _ in 0..reps {
            f();
        }
        t0.elapsed().as_secs_f64() * 1e3 / reps as f64
    };
    for &(b, h, t, d) in &[(12, 4, 64, 32), (2, 12, 256, 64), (1, 12, 1024, 64)] {
        let mut rng = Rng::new(0);
        let q = randn(&[b, h, t, d], &mut rng).to_var().unwrap();
        let k = randn(&[b, h, t, d], &mut rng).to_var().unwrap();
        let v = randn(&[b, h, t, d], &mut rng).to_var().unwrap();
        let run = |fused_path: bool| {
            let out = if fused_path {
                fused::attention(&q, &k, &v, true, 0.125)
            } else {
                fused::attention_reference(&q, &k, &v, true, 0.125)
            }
            .unwrap();
            out.sum_all().unwrap().backward().unwrap();
        };
        let (f, c) = (time(&|| run(true)), time(&|| run(false)));
        eprintln!("attention causal [b {b}, h {h}, t {t}, d {d}] fwd+bwd: fused {f:.2} ms, composite {c:.2} ms ({:.1}x)", c / f);
    }
    let mut rng = Rng::new(1);
    let (rows, n) = (768, 512);
    let x = randn(&[rows, n], &mut rng).to_var().unwrap();
    let bias = randn(&[n], &mut rng).to_var().unwrap();
    let f = time(&|| {
        fused::bias_gelu(&x, &bias)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap()
    });
    let c = time(&|| {
        fused::bias_gelu_reference(&x, &bias)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap()
    });
    eprintln!(
        "bias_gelu [{rows}, {n}] fwd+bwd: fused {f:.2} ms, composite {c:.2} ms ({:.1}x)",
        c / f
    );
    let n = 128;
    let (x, r) = (
        randn(&[rows, n], &mut rng).to_var().unwrap(),
        randn(&[rows, n], &mut rng).to_var().unwrap(),
    );
    let (g, bb) = (
        randn(&[n], &mut rng).to_var().unwrap(),
        randn(&[n], &mut rng).to_var().unwrap(),
    );
    let body = |fp: bool| {
        let (s, y) = if fp {
            fused::residual_layer_norm(&x, &r, &g, &bb, 1e-5)
        } else {
            fused::residual_layer_norm_reference(&x, &r, &g, &bb, 1e-5)
        }
        .unwrap();
        s.add(&y).unwrap().sum_all().unwrap().backward().unwrap();
    };
    let (f, c) = (time(&|| body(true)), time(&|| body(false)));
    eprintln!(
        "residual_layer_norm [{rows}, {n}] fwd+bwd: fused {f:.2} ms, composite {c:.2} ms ({:.1}x)",
        c / f
    );
    let grads: Vec<Tensor> = (0..40).map(|_| randn(&[128, 512], &mut rng)).collect();
    let f = time(&|| {
        fused::global_grad_norm(&grads);
    });
    let c = time(&|| {
        let _: f64 = grads
            .iter()
            .map(|g| g.to_vec_f64().unwrap().iter().map(|x| x * x).sum::<f64>())
            .sum::<f64>()
            .sqrt();
    });
    eprintln!("global_grad_norm 40 x [128, 512]: fused {f:.2} ms, per-tensor f64 copies (clip_grad_norm's way) {c:.2} ms ({:.1}x)", c / f);
}
