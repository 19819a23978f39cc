//! Softmax and log-softmax against the f64 [`reference`], values and input gradients, in f32,
//! bf16 and f16, on the CPU and the CUDA device (the real GPU when present, else the emulated
//! one: the kernel emulator runs `softmax.cu`): one-element rows, short rows (several rows a
//! block), rows longer than a block's first sweep, a dimension other than the last, an empty
//! input and a non-float one.

use super::*;
use crate::kernels::test_support::{assert_close, backward_with, devices, f64s, values, var, Tol};

/// (relative, absolute) tolerance of a value stored in each dtype.
const TOL: Tol = Tol {
    f32: (2e-5, 2e-6),
    bf16: (1.6e-2, 2e-3),
    f16: (2e-3, 2e-4),
};

const SHAPES: [(usize, usize); 7] = [
    (1, 1),
    (33, 2),
    (300, 5),
    (19, 100),
    (7, 1000),
    (3, 3001),
    (2, 9000),
];

#[test]
fn softmax_and_log_softmax_and_their_gradients_match_f64() {
    for dev in devices() {
        for d in FLOATS {
            for (k, &(rows, n)) in SHAPES.iter().enumerate() {
                for log in [false, true] {
                    let s = 10 * k as u64 + log as u64;
                    let (x, xv) = var(values(s, rows * n, -4.0, 4.0), &[rows, n], d, dev);
                    let (gy, gyv) = var(values(s + 5, rows * n, -1.0, 1.0), &[rows, n], d, dev);
                    let y = if log {
                        x.log_softmax(-1)
                    } else {
                        x.softmax(-1)
                    }
                    .unwrap();
                    let what = format!("{} {dev} {d} {rows}x{n}", name(log));
                    let (rt, at) = TOL.of(d);
                    assert_eq!(y.dtype(), d, "{what}: y in x's dtype");
                    let yv = f64s(&y);
                    let want = reference::forward(&xv, n, log);
                    let fwd_abs = at * if log { 20.0 } else { 1.0 };
                    assert_close(&what, &yv, &want, (rt * 2.0, fwd_abs));
                    backward_with(&y, &gy);
                    // The backward reads the stored y, so the reference starts from it too.
                    let dx = reference::backward(&yv, &gyv, n, log);
                    let got = x.grad().unwrap();
                    assert_eq!(got.dtype(), d, "{what}: dx in x's dtype");
                    assert_close(
                        &format!("{what} dx"),
                        &f64s(&got),
                        &dx,
                        (rt * 4.0, at * 20.0),
                    );
                }
            }
        }
    }
}

#[test]
fn softmax_over_a_leading_dimension_normalises_its_columns() {
    let (m, n) = (5usize, 7usize);
    for dev in devices() {
        let (x, xv) = var(values(3, m * n, -3.0, 3.0), &[m, n], DType::F32, dev);
        let y = f64s(&x.softmax(0).unwrap());
        // Column j of x is row j of its transpose.
        let cols: Vec<f64> = (0..n * m).map(|i| xv[(i % m) * n + i / m]).collect();
        let want = reference::forward(&cols, m, false);
        let want: Vec<f64> = (0..m * n).map(|i| want[(i % n) * m + i / n]).collect();
        assert_close(&format!("softmax(0) {dev}"), &y, &want, (2e-6, 1e-7));
    }
}

#[test]
fn empty_and_integer_inputs() {
    for dev in devices() {
        let x = Tensor::zeros(&[0, 4], DType::F32, dev)
            .unwrap()
            .to_var()
            .unwrap();
        let y = x.log_softmax(-1).unwrap();
        assert_eq!(y.shape(), [0, 4]);
        y.sum_all().unwrap().backward().unwrap();
        assert_eq!(x.grad().unwrap().shape(), [0, 4]);
        let ints = Tensor::zeros(&[2, 3], DType::I64, dev).unwrap();
        let e = ints.softmax(-1).unwrap_err().to_string();
        assert!(e.contains("softmax"), "{e}");
        let e = ints.softmax(2).unwrap_err().to_string();
        assert!(e.contains("softmax"), "{e}");
    }
}

#[test]
fn nvrtc_compiles_the_kernels_for_sm80_and_sm90() {
    if !crate::kernels::test_support::nvrtc_available() {
        return;
    }
    let src = sinter_cuda::user_kernel::KernelSource::new("softmax.cu", SOFTMAX_CU).unwrap();
    let kernels = [
        ("softmax", 4),
        ("log_softmax", 4),
        ("softmax_bwd", 5),
        ("log_softmax_bwd", 5),
    ];
    for arch in ["sm_80", "sm_90"] {
        let ptx = src.ptx(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        for sfx in ["f32", "f16", "bf16"] {
            for (kernel, params) in kernels {
                let name = format!("{kernel}_{sfx}");
                let e = ptx.entries.iter().find(|e| e.name == name);
                let e = e.unwrap_or_else(|| panic!("{arch}: no entry {name}"));
                assert_eq!(e.params.len(), params, "{arch}: {name}'s parameters");
            }
        }
    }
}
