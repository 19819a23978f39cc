//! Bias + GELU and Linear + bias + GELU against the f64 [`reference`], values and every
//! gradient, on the CPU (the fused row kernels; f32, bf16, f16) and the CUDA device (the real
//! GPU when present, else the emulated one: the composite alone, the cuBLASLt epilogue GEMM
//! for Linear in bf16/f16 at widths that are multiples of 8, the composite at others).

use super::*;
use crate::kernels::test_support::{devices, values};

/// (relative, absolute) tolerance of a value stored in `d`.
fn tol(d: DType) -> (f64, f64) {
    match d {
        DType::F32 => (1e-5, 1e-5),
        DType::BF16 => (1.0 / 64.0, 1.0 / 64.0),
        _ => (1.0 / 512.0, 1.0 / 512.0),
    }
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_vec_f32().unwrap().iter().map(|&v| v as f64).collect()
}

fn assert_close(what: &str, got: &Tensor, want: &[f64], (rel, abs): (f64, f64)) {
    let got = f64s(got);
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
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
    let f = f64s(&t);
    (t.to_device(dev).unwrap().to_var().unwrap(), f)
}

#[test]
fn bias_gelu_and_its_gradients_match_f64() {
    for dev in devices() {
        for d in FLOATS {
            // One element; short rows; more rows than one fixed chunk of the bias sum.
            for (k, &(rows, n)) in [(1usize, 1usize), (7, 3), (130, 40)].iter().enumerate() {
                let s = 10 * k as u64;
                let (x, xv) = var(values(s, rows * n, -4.0, 4.0), &[rows, n], d, dev);
                let (b, bv) = var(values(s + 1, n, -1.0, 1.0), &[n], d, dev);
                let (gy, gyv) = var(values(s + 2, rows * n, -1.0, 1.0), &[rows, n], d, dev);
                let y = bias_gelu(&x, &b).unwrap();
                let what = format!("bias_gelu {dev} {d} {rows}x{n}");
                let (rt, at) = tol(d);
                assert_eq!(y.dtype(), d, "{what}: y in x's dtype");
                assert_close(&what, &y, &reference::forward(&xv, &bv, n), (rt, at));
                y.mul(&gy.detach())
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                let (dx, db) = reference::backward(&xv, &bv, &gyv, n);
                let ra = at * (rows as f64).sqrt() * 4.0;
                assert_close(
                    &format!("{what} dx"),
                    &x.grad().unwrap(),
                    &dx,
                    (rt * 2.0, at),
                );
                assert_close(
                    &format!("{what} dbias"),
                    &b.grad().unwrap(),
                    &db,
                    (rt * 2.0, ra),
                );
            }
        }
    }
}

#[test]
fn linear_bias_gelu_and_its_gradients_match_f64() {
    for dev in devices() {
        for d in FLOATS {
            // Widths the CUDA epilogue takes (16) and one it does not (12).
            for (k, &(rows, inp, out)) in [(5usize, 7usize, 16usize), (6, 9, 12)].iter().enumerate()
            {
                let s = 100 + 10 * k as u64;
                let (x, xv) = var(values(s, rows * inp, -1.0, 1.0), &[rows, inp], d, dev);
                let (w, wv) = var(values(s + 1, out * inp, -0.5, 0.5), &[out, inp], d, dev);
                let (b, bv) = var(values(s + 2, out, -0.5, 0.5), &[out], d, dev);
                let (gy, gyv) = var(values(s + 3, rows * out, -1.0, 1.0), &[rows, out], d, dev);
                let y = linear_bias_gelu(&x, &w, &b).unwrap();
                let what = format!("linear_bias_gelu {dev} {d} {rows}x{inp}->{out}");
                // x Wᵀ in f64, then bias + GELU's reference.
                let xw: Vec<f64> = (0..rows * out)
                    .map(|i| {
                        let (r, o) = (i / out, i % out);
                        (0..inp).map(|j| xv[r * inp + j] * wv[o * inp + j]).sum()
                    })
                    .collect();
                let (rt, at) = tol(d);
                let ab = at * 2.0;
                assert_close(
                    &what,
                    &y,
                    &reference::forward(&xw, &bv, out),
                    (rt * 2.0, ab),
                );
                y.mul(&gy.detach())
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                let (du, db) = reference::backward(&xw, &bv, &gyv, out);
                let dx: Vec<f64> = (0..rows * inp)
                    .map(|i| {
                        let (r, j) = (i / inp, i % inp);
                        (0..out).map(|o| du[r * out + o] * wv[o * inp + j]).sum()
                    })
                    .collect();
                let dw: Vec<f64> = (0..out * inp)
                    .map(|i| {
                        let (o, j) = (i / inp, i % inp);
                        (0..rows).map(|r| du[r * out + o] * xv[r * inp + j]).sum()
                    })
                    .collect();
                let gt = (rt * 4.0, at * 8.0);
                assert_close(&format!("{what} dx"), &x.grad().unwrap(), &dx, gt);
                assert_close(&format!("{what} dw"), &w.grad().unwrap(), &dw, gt);
                assert_close(&format!("{what} db"), &b.grad().unwrap(), &db, gt);
            }
        }
    }
}
