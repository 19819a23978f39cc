//! LayerNorm and residual add + LayerNorm against the f64 [`reference`], values and every
//! gradient, in f32, bf16 and f16 (the half types with parameters in their dtype and in f32,
//! autocast's case), on the CPU and the CUDA device (the real GPU when present,
//! else the emulated one: the kernel emulator runs `layer_norm.cu`): one-element rows, short
//! rows (warp-sized row groups), rows longer than a block, many row chunks for the parameter
//! sums, and a residual whose memory is not 16-byte aligned (the kernels' scalar path).

use super::*;
use crate::kernels::test_support::{devices, values};

/// (relative, absolute) tolerance of a value stored in `d`.
fn tol(d: DType) -> (f64, f64) {
    match d {
        DType::F32 => (1e-5, 1e-5),
        DType::BF16 => (1.0 / 128.0, 1.0 / 128.0),
        _ => (1.0 / 1024.0, 1.0 / 1024.0),
    }
}

fn assert_close(what: &str, got: &Tensor, want: &[f64], (rel, abs): (f64, f64)) {
    let got = got.to_vec_f32().unwrap();
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, w)) in got.iter().zip(want).enumerate() {
        let g = g as f64;
        assert!(
            (g - w).abs() <= rel * w.abs() + abs,
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

/// A variable of `d` on `dev` holding `v` rounded to `d`, and the rounded values.
fn var(v: Vec<f32>, shape: &[usize], d: DType, dev: Device) -> (Tensor, Vec<f64>) {
    let t = Tensor::from_vec(v, shape, Device::Cpu)
        .unwrap()
        .to_dtype(d)
        .unwrap();
    let f = t.to_vec_f32().unwrap().iter().map(|&a| a as f64).collect();
    (t.to_device(dev).unwrap().to_var().unwrap(), f)
}

/// The last, rows of 7000, are too long for the one-pass CUDA backward's shared memory: the
/// two-kernel backward serves them.
const SHAPES: [(usize, usize); 7] = [
    (1, 1),
    (3, 2),
    (300, 5),
    (19, 100),
    (7, 1000),
    (3, 3001),
    (2, 7000),
];

/// (activations' dtype, parameters' dtype) pairs: every float dtype with parameters of its own
/// dtype, and the half types with f32 parameters (autocast's master weights).
fn dtype_pairs() -> Vec<(DType, DType)> {
    let mut v: Vec<_> = FLOATS.iter().map(|&d| (d, d)).collect();
    v.extend([(DType::BF16, DType::F32), (DType::F16, DType::F32)]);
    v
}

#[test]
fn layer_norm_and_its_gradients_match_f64() {
    for dev in devices() {
        for (d, pd) in dtype_pairs() {
            for (k, &(rows, n)) in SHAPES.iter().enumerate() {
                let s = 10 * k as u64;
                let (x, xv) = var(values(s, rows * n, -2.0, 3.0), &[rows, n], d, dev);
                let (g, gv) = var(values(s + 1, n, 0.5, 1.5), &[n], pd, dev);
                let (b, bv) = var(values(s + 2, n, -0.5, 0.5), &[n], pd, dev);
                let (gy, gyv) = var(values(s + 3, rows * n, -1.0, 1.0), &[rows, n], d, dev);
                let y = x.layer_norm(&g, &b, 1e-5).unwrap();
                let what = format!("layer_norm {dev} {d} (parameters {pd}) {rows}x{n}");
                let (rt, at) = tol(d);
                let (want, _, _) = reference::forward(&xv, &gv, &bv, n, 1e-5);
                assert_eq!(y.dtype(), d, "{what}: y in x's dtype");
                assert_close(&what, &y, &want, (rt * 2.0, at * 4.0));
                y.mul(&gy.detach())
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                let (dx, dg, db) = reference::backward(&xv, &gv, &gyv, n, 1e-5);
                let ra = at * (rows as f64).sqrt() * 8.0;
                assert_close(
                    &format!("{what} dx"),
                    &x.grad().unwrap(),
                    &dx,
                    (rt * 4.0, at * 20.0),
                );
                assert_close(
                    &format!("{what} dgamma"),
                    &g.grad().unwrap(),
                    &dg,
                    (rt * 2.0, ra),
                );
                assert_close(
                    &format!("{what} dbeta"),
                    &b.grad().unwrap(),
                    &db,
                    (rt * 2.0, ra),
                );
                for p in [&g, &b] {
                    assert_eq!(p.grad().unwrap().dtype(), pd, "{what}: parameter gradients");
                }
            }
        }
    }
}

#[test]
fn residual_layer_norm_and_its_gradients_match_f64() {
    for dev in devices() {
        for (d, pd) in dtype_pairs() {
            for (k, &(rows, n)) in SHAPES.iter().enumerate() {
                // The CPU takes a half-precision row's statistics over the f32 sum but stores h
                // rounded (as before the move), so a one-element row's dx, scaled by
                // rstd = 1/√eps, is off by that rounding there: checked on CUDA only.
                if n == 1 && dev == Device::Cpu && d != DType::F32 {
                    continue;
                }
                let s = 10 * k as u64 + 5;
                let (x, xv) = var(values(s, rows * n, -2.0, 3.0), &[rows, n], d, dev);
                // The residual one element into its buffer: its rows are not 16-byte aligned.
                let (rbuf, rbv) = var(
                    values(s + 1, rows * n + 1, -1.0, 1.0),
                    &[rows * n + 1],
                    d,
                    dev,
                );
                let r = rbuf
                    .narrow(0, 1, rows * n)
                    .unwrap()
                    .reshape(&[rows, n])
                    .unwrap();
                let (g, gv) = var(values(s + 2, n, 0.5, 1.5), &[n], pd, dev);
                let (b, bv) = var(values(s + 3, n, -0.5, 0.5), &[n], pd, dev);
                let (gh, ghv) = var(values(s + 4, rows * n, -1.0, 1.0), &[rows, n], d, dev);
                let (gy, gyv) = var(values(s + 5, rows * n, -1.0, 1.0), &[rows, n], d, dev);
                let (h, y) = residual_layer_norm(&x, &r, &g, &b, 1e-5).unwrap();
                let what = format!("residual_layer_norm {dev} {d} (parameters {pd}) {rows}x{n}");
                let (rt, at) = tol(d);
                // h is x + r rounded to d; the statistics are those of the rounded h.
                let sum = Tensor::from_vec(
                    xv.iter()
                        .zip(&rbv[1..])
                        .map(|(a, b)| (a + b) as f32)
                        .collect(),
                    &[rows, n],
                    Device::Cpu,
                )
                .unwrap()
                .to_dtype(d)
                .unwrap();
                let hv: Vec<f64> = sum
                    .to_vec_f32()
                    .unwrap()
                    .iter()
                    .map(|&a| a as f64)
                    .collect();
                assert_close(&format!("{what} h"), &h, &hv, (0.0, 0.0));
                let (want, _, _) = reference::forward(&hv, &gv, &bv, n, 1e-5);
                assert_close(&format!("{what} y"), &y, &want, (rt * 2.0, at * 4.0));
                let loss = h.mul(&gh.detach()).unwrap().sum_all().unwrap();
                let loss = loss
                    .add(&y.mul(&gy.detach()).unwrap().sum_all().unwrap())
                    .unwrap();
                loss.backward().unwrap();
                let (dh, dg, db) = reference::backward(&hv, &gv, &gyv, n, 1e-5);
                // Both inputs get the sum's whole gradient: its own plus LayerNorm's.
                let dh: Vec<f64> = dh.iter().zip(&ghv).map(|(a, b)| a + b).collect();
                let ra = at * (rows as f64).sqrt() * 8.0;
                assert_close(
                    &format!("{what} dx"),
                    &x.grad().unwrap(),
                    &dh,
                    (rt * 4.0, at * 20.0),
                );
                let dr = rbuf.grad().unwrap().narrow(0, 1, rows * n).unwrap();
                assert_close(&format!("{what} dr"), &dr, &dh, (rt * 4.0, at * 20.0));
                assert_close(
                    &format!("{what} dgamma"),
                    &g.grad().unwrap(),
                    &dg,
                    (rt * 2.0, ra),
                );
                assert_close(
                    &format!("{what} dbeta"),
                    &b.grad().unwrap(),
                    &db,
                    (rt * 2.0, ra),
                );
                for p in [&g, &b] {
                    assert_eq!(p.grad().unwrap().dtype(), pd, "{what}: parameter gradients");
                }
            }
        }
    }
}

#[test]
fn half_precision_input_with_f32_parameters_gives_f32_parameter_gradients() {
    // Autocast's case: bf16 activations, f32 LayerNorm parameters.
    for dev in devices() {
        let (rows, n) = (4, 33);
        let (x, xv) = var(values(1, rows * n, -2.0, 3.0), &[rows, n], DType::BF16, dev);
        let (g, gv) = var(values(2, n, 0.5, 1.5), &[n], DType::F32, dev);
        let (b, bv) = var(values(3, n, -0.5, 0.5), &[n], DType::F32, dev);
        let y = x.layer_norm(&g, &b, 1e-5).unwrap();
        assert_eq!(y.dtype(), DType::BF16);
        // Both devices read gamma and beta in f32: only y's own rounding to bf16 is left.
        let (want, _, _) = reference::forward(&xv, &gv, &bv, n, 1e-5);
        assert_close(&format!("{dev} y"), &y, &want, tol(DType::BF16));
        y.sum_all().unwrap().backward().unwrap();
        let (_, _, db) = reference::backward(&xv, &gv, &vec![1.0; rows * n], n, 1e-5);
        for p in [&g, &b] {
            assert_eq!(
                p.grad().unwrap().dtype(),
                DType::F32,
                "{dev}: a parameter's gradient"
            );
        }
        assert_close(&format!("{dev} dbeta"), &b.grad().unwrap(), &db, (0.0, 0.0));
    }
}

#[test]
fn parameter_gradients_of_a_constant_input_match_f64() {
    // No dx wanted: the CUDA backward's dx-less path (the params kernel and finish).
    for dev in devices() {
        for (d, pd) in dtype_pairs() {
            let (rows, n) = (37, 70);
            let (x, xv) = var(values(7, rows * n, -2.0, 3.0), &[rows, n], d, dev);
            let (g, gv) = var(values(8, n, 0.5, 1.5), &[n], pd, dev);
            let (b, _) = var(values(9, n, -0.5, 0.5), &[n], pd, dev);
            let (gy, gyv) = var(values(10, rows * n, -1.0, 1.0), &[rows, n], d, dev);
            let y = x.detach().layer_norm(&g, &b, 1e-5).unwrap();
            y.mul(&gy.detach())
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let (_, dg, db) = reference::backward(&xv, &gv, &gyv, n, 1e-5);
            let (rt, at) = tol(d);
            let ra = at * (rows as f64).sqrt() * 8.0;
            let what = format!("{dev} {d} (parameters {pd})");
            assert_close(
                &format!("{what} dgamma"),
                &g.grad().unwrap(),
                &dg,
                (rt * 2.0, ra),
            );
            assert_close(
                &format!("{what} dbeta"),
                &b.grad().unwrap(),
                &db,
                (rt * 2.0, ra),
            );
            assert!(
                x.grad().is_none(),
                "{what}: no gradient for the detached input"
            );
        }
    }
}

#[test]
fn bad_operands_are_errors_that_say_what() {
    let x = Tensor::zeros(&[2, 3], DType::F32, Device::Cpu).unwrap();
    let p3 = Tensor::ones(&[3], DType::F32, Device::Cpu).unwrap();
    let p4 = Tensor::ones(&[4], DType::F32, Device::Cpu).unwrap();
    let e = x.layer_norm(&p4, &p3, 1e-5).unwrap_err().to_string();
    assert!(e.contains("layer_norm") && e.contains("[4]"), "{e}");
    let empty = Tensor::zeros(&[2, 0], DType::F32, Device::Cpu).unwrap();
    let e = empty.layer_norm(&p3, &p3, 1e-5).unwrap_err().to_string();
    assert!(e.contains("empty"), "{e}");
    let ints = Tensor::zeros(&[2, 3], DType::I64, Device::Cpu).unwrap();
    assert!(ints.layer_norm(&p3, &p3, 1e-5).is_err());
    let r = Tensor::zeros(&[3, 2], DType::F32, Device::Cpu).unwrap();
    let e = residual_layer_norm(&x, &r, &p3, &p3, 1e-5)
        .unwrap_err()
        .to_string();
    assert!(e.contains("residual_layer_norm"), "{e}");
}

#[test]
fn nvrtc_compiles_the_kernels_for_sm80_and_sm90() {
    if !crate::kernels::test_support::nvrtc_available() {
        return;
    }
    let src = sinter_cuda::user_kernel::KernelSource::new("layer_norm.cu", LAYER_NORM_CU).unwrap();
    let kernels = [
        ("layernorm_fwd", 9),
        ("layernorm_bwd", 10),
        ("layernorm_bwd_dx", 8),
        ("layernorm_bwd_params", 9),
        ("layernorm_bwd_finish", 6),
        ("resln_fwd", 11),
    ];
    // The f32-parameter variants of the kernels that read gamma.
    let pf32 = [
        "layernorm_fwd",
        "layernorm_bwd",
        "layernorm_bwd_dx",
        "resln_fwd",
    ];
    for arch in ["sm_80", "sm_90"] {
        let ptx = src.ptx(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        for sfx in ["f32", "f16", "bf16", "f16_pf32", "bf16_pf32"] {
            let kernels = kernels
                .iter()
                .filter(|(k, _)| !sfx.ends_with("pf32") || pf32.contains(k));
            for &(kernel, params) in kernels {
                let name = format!("{kernel}_{sfx}");
                let e = ptx.entries.iter().find(|e| e.name == name);
                let e = e.unwrap_or_else(|| panic!("{arch}: no entry {name}"));
                assert_eq!(e.params.len(), params, "{arch}: {name}'s parameters");
            }
        }
    }
}
