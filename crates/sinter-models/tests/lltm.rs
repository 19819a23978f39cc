//! The LLTM cell three ways — (a) composite tensor ops, (b) the `lltm_cell` custom op on the
//! CPU (fused loops), (c) the same custom op on the CUDA device (its kernels; the real GPU when
//! present, else the emulated CUDA device, required in CI by SINTER_REQUIRE_EMU=1):
//!
//! - values and the gradients of every input and parameter against central finite differences
//!   of an f64 reference written here in plain loops (step 1e-6; agreement within 1e-4 of the
//!   largest element of each tensor, the f32 rounding of the forward);
//! - (a) = (b) = (c) within 2e-6 of each tensor's largest element, on shapes that exercise the
//!   vector tails (state 33) and, for (a) = (b), the parallel rows (batch 136 × state 128).

use sinter_core::{Device, Rng, Tensor};
use sinter_models::lltm::{Lltm, LltmImpl};

fn cuda() -> Option<Device> {
    sinter_cuda::testing::gpu_tests(1).map(|_| Device::Cuda(0))
}

/// One problem: inputs, state, parameters and the loss weights, as host values.
struct Case {
    batch: usize,
    input: usize,
    state: usize,
    x: Vec<f32>,
    h: Vec<f32>,
    c: Vec<f32>,
    w: Vec<f32>,
    b: Vec<f32>,
    /// loss = Σ h'·wh + Σ c'·wc
    wh: Vec<f32>,
    wc: Vec<f32>,
}

impl Case {
    fn new(batch: usize, input: usize, state: usize, seed: u64) -> Case {
        let mut r = Rng::new(seed);
        let mut v = |n: usize, a: f64| (0..n).map(|_| r.uniform(-a, a) as f32).collect::<Vec<_>>();
        let wb = 1.0 / (state as f64).sqrt();
        Case {
            batch,
            input,
            state,
            // Inputs of ±2 put gate pre-activations on both sides of 0 (both ELU branches).
            x: v(batch * input, 2.0),
            h: v(batch * state, 1.0),
            c: v(batch * state, 1.0),
            w: v(3 * state * (state + input), 2.0 * wb),
            b: v(3 * state, wb),
            wh: v(batch * state, 1.0),
            wc: v(batch * state, 1.0),
        }
    }
}

/// [h', c', dx, dh, dc, dW, db] through `imp` on `dev`.
fn run(case: &Case, imp: LltmImpl, dev: Device) -> Vec<Vec<f32>> {
    let (b, i, s) = (case.batch, case.input, case.state);
    let t = |v: &[f32], shape: &[usize]| Tensor::from_slice(v, shape, dev).unwrap();
    let var = |v: &[f32], shape: &[usize]| t(v, shape).to_var().unwrap();
    let (x, h, c) = (
        var(&case.x, &[b, i]),
        var(&case.h, &[b, s]),
        var(&case.c, &[b, s]),
    );
    let cell = Lltm {
        weights: var(&case.w, &[3 * s, s + i]),
        bias: var(&case.b, &[3 * s]),
    };
    let (h2, c2) = cell.forward(&x, &h, &c, imp).unwrap();
    assert_eq!((h2.device(), c2.device()), (dev, dev));
    let loss = h2
        .mul(&t(&case.wh, &[b, s]))
        .unwrap()
        .sum_all()
        .unwrap()
        .add(&c2.mul(&t(&case.wc, &[b, s])).unwrap().sum_all().unwrap())
        .unwrap();
    loss.backward().unwrap();
    let grad = |v: &Tensor| v.grad().expect("a gradient").to_vec_f32().unwrap();
    vec![
        h2.to_vec_f32().unwrap(),
        c2.to_vec_f32().unwrap(),
        grad(&x),
        grad(&h),
        grad(&c),
        grad(&cell.weights),
        grad(&cell.bias),
    ]
}

// ---- the f64 reference ----------------------------------------------------------------------

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// (h', c') of the LLTM cell in f64, from [x, h, c, W, b].
fn reference(case: &Case, p: &[Vec<f64>]) -> (Vec<f64>, Vec<f64>) {
    let (bs, ni, s) = (case.batch, case.input, case.state);
    let (x, h, c, w, b) = (&p[0], &p[1], &p[2], &p[3], &p[4]);
    let k = s + ni;
    let (mut h2, mut c2) = (vec![0.0; bs * s], vec![0.0; bs * s]);
    for r in 0..bs {
        let xc: Vec<f64> = h[r * s..][..s]
            .iter()
            .chain(&x[r * ni..][..ni])
            .copied()
            .collect();
        let g = |row: usize| b[row] + (0..k).map(|m| w[row * k + m] * xc[m]).sum::<f64>();
        for j in 0..s {
            let (ig, og, z) = (sigmoid(g(j)), sigmoid(g(s + j)), g(2 * s + j));
            let cand = if z > 0.0 { z } else { z.exp_m1() };
            let nc = c[r * s + j] + cand * ig;
            c2[r * s + j] = nc;
            h2[r * s + j] = nc.tanh() * og;
        }
    }
    (h2, c2)
}

/// [h', c', dx, dh, dc, dW, db] of the reference: the values, then central differences.
fn reference_grads(case: &Case) -> Vec<Vec<f64>> {
    let f64s = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<_>>();
    let mut p = vec![
        f64s(&case.x),
        f64s(&case.h),
        f64s(&case.c),
        f64s(&case.w),
        f64s(&case.b),
    ];
    let (wh, wc) = (f64s(&case.wh), f64s(&case.wc));
    let loss = |p: &[Vec<f64>]| {
        let (h2, c2) = reference(case, p);
        h2.iter()
            .zip(&wh)
            .chain(c2.iter().zip(&wc))
            .map(|(a, b)| a * b)
            .sum::<f64>()
    };
    let (h2, c2) = reference(case, &p);
    let mut out = vec![h2, c2];
    let eps = 1e-6;
    for t in 0..p.len() {
        let mut g = vec![0.0; p[t].len()];
        for (e, ge) in g.iter_mut().enumerate() {
            let v = p[t][e];
            p[t][e] = v + eps;
            let up = loss(&p);
            p[t][e] = v - eps;
            let down = loss(&p);
            p[t][e] = v;
            *ge = (up - down) / (2.0 * eps);
        }
        out.push(g);
    }
    out
}

const NAMES: [&str; 7] = ["h'", "c'", "dx", "dh", "dc", "dW", "db"];

/// Every tensor of `got` within `tol` times the largest element of `want`'s.
fn assert_close(got: &[Vec<f32>], want: &[Vec<f64>], tol: f64, what: &str) {
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{what} {}", NAMES[k]);
        let scale = w.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-3);
        for (e, (a, b)) in g.iter().zip(w).enumerate() {
            let d = (*a as f64 - b).abs();
            assert!(
                d <= tol * scale,
                "{what}: {} element {e}: {a} vs {b} (|diff| {d:.3e} > {tol} × {scale:.3})",
                NAMES[k]
            );
        }
    }
}

fn widen(v: &[Vec<f32>]) -> Vec<Vec<f64>> {
    v.iter()
        .map(|t| t.iter().map(|&a| a as f64).collect())
        .collect()
}

#[test]
fn gradients_of_all_three_match_finite_differences() {
    let case = Case::new(3, 4, 5, 7);
    let want = reference_grads(&case);
    let mut runs = vec![
        ("composite", LltmImpl::Composite, Device::Cpu),
        ("custom op, cpu", LltmImpl::CustomOp, Device::Cpu),
    ];
    if let Some(dev) = cuda() {
        runs.push(("custom op, cuda", LltmImpl::CustomOp, dev));
    }
    for (what, imp, dev) in runs {
        assert_close(&run(&case, imp, dev), &want, 1e-4, what);
    }
}

#[test]
fn the_three_agree() {
    // State 33: the vector loops' masked tails; batch 5.
    let case = Case::new(5, 7, 33, 11);
    let composite = widen(&run(&case, LltmImpl::Composite, Device::Cpu));
    assert_close(
        &run(&case, LltmImpl::CustomOp, Device::Cpu),
        &composite,
        2e-6,
        "custom op on the cpu vs composite",
    );
    if let Some(dev) = cuda() {
        assert_close(
            &run(&case, LltmImpl::CustomOp, dev),
            &composite,
            2e-6,
            "custom op on cuda vs composite",
        );
    }
}

#[test]
fn the_fused_cpu_rows_agree_when_they_run_in_parallel() {
    // 136 × 128 elements: above the fused loops' threshold for parallel rows.
    let case = Case::new(136, 32, 128, 3);
    let composite = widen(&run(&case, LltmImpl::Composite, Device::Cpu));
    assert_close(
        &run(&case, LltmImpl::CustomOp, Device::Cpu),
        &composite,
        2e-6,
        "parallel custom op vs composite",
    );
}

#[test]
fn gates_and_cell_of_different_batches_are_an_error() {
    let g = Tensor::zeros(&[2, 9], sinter_core::DType::F32, Device::Cpu).unwrap();
    let c = Tensor::zeros(&[3, 3], sinter_core::DType::F32, Device::Cpu).unwrap();
    let e = sinter_models::lltm::cell_fused(&g, &c)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("lltm_cell") && e.contains("[2, 9]") && e.contains("[3, 3]"),
        "{e}"
    );
}
