//! Bias + GELU and Linear + bias + GELU against the f64 [`reference`], values and every
//! gradient, on the CPU (the fused row kernels; f32, bf16, f16) and the CUDA device (the real
//! GPU when present, else the emulated one: the composite alone, the cuBLASLt epilogue GEMM
//! for Linear in bf16/f16 at widths that are multiples of 8, the composite at others).

use super::*;
use crate::kernels::test_support::{
    assert_close, assert_grad_close, backward_with, devices, f64s, values, var, Tol,
};

/// (relative, absolute) tolerance of a value stored in each dtype.
const TOL: Tol = Tol {
    f32: (1e-5, 1e-5),
    bf16: (1.0 / 64.0, 1.0 / 64.0),
    f16: (1.0 / 512.0, 1.0 / 512.0),
};

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
                let (rt, at) = TOL.of(d);
                assert_eq!(y.dtype(), d, "{what}: y in x's dtype");
                assert_close(&what, &f64s(&y), &reference::forward(&xv, &bv, n), (rt, at));
                backward_with(&y, &gy);
                let (dx, db) = reference::backward(&xv, &bv, &gyv, n);
                let ra = at * (rows as f64).sqrt() * 4.0;
                assert_grad_close(&format!("{what} dx"), &x, &dx, (rt * 2.0, at));
                assert_grad_close(&format!("{what} dbias"), &b, &db, (rt * 2.0, ra));
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
                let (rt, at) = TOL.of(d);
                let ab = at * 2.0;
                assert_close(
                    &what,
                    &f64s(&y),
                    &reference::forward(&xw, &bv, out),
                    (rt * 2.0, ab),
                );
                backward_with(&y, &gy);
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
                assert_grad_close(&format!("{what} dx"), &x, &dx, gt);
                assert_grad_close(&format!("{what} dw"), &w, &dw, gt);
                assert_grad_close(&format!("{what} db"), &b, &db, gt);
            }
        }
    }
}
