//! Cross-entropy's per-row losses and their gradient against the f64 [`reference`], in f32,
//! bf16 and f16, on the CPU and the CUDA device (the real GPU when present, else the emulated
//! one: the kernel emulator runs `cross_entropy.cu`): ignored rows, one-class rows, short rows
//! (several rows a block), rows longer than a block's first sweep, per-row upstream gradients,
//! confident predictions (the loss keeps its digits), and bad targets.

use super::*;
use crate::kernels::test_support::{assert_close, devices, f64s, values, var, Tol};
use crate::kernels::FLOATS;

/// (relative, absolute) tolerance of a value stored in each dtype.
const TOL: Tol = Tol {
    f32: (2e-5, 2e-6),
    bf16: (1.6e-2, 2e-3),
    f16: (2e-3, 2e-4),
};

const IGNORE: i64 = -100;

#[test]
fn row_losses_and_their_gradient_match_f64() {
    for dev in devices() {
        for d in FLOATS {
            for (k, &(rows, c)) in [
                (1usize, 1usize),
                (33, 2),
                (300, 5),
                (19, 100),
                (7, 1000),
                (3, 3001),
            ]
            .iter()
            .enumerate()
            {
                let s = 10 * k as u64;
                let (x, xv) = var(values(s, rows * c, -4.0, 4.0), &[rows, c], d, dev);
                // Every third row ignored; the others pick a class spread over the row.
                let tv: Vec<i64> = (0..rows)
                    .map(|r| {
                        if r % 3 == 1 {
                            IGNORE
                        } else {
                            ((r * 7 + 3) % c) as i64
                        }
                    })
                    .collect();
                let t = Tensor::from_vec(tv.clone(), &[rows], dev).unwrap();
                let loss = row_losses(&x, &t, false, IGNORE).unwrap();
                let what = format!("cross_entropy {dev} {d} {rows}x{c}");
                assert_eq!(
                    (loss.dtype(), loss.shape()),
                    (DType::F32, &[rows][..]),
                    "{what}"
                );
                let want = reference::forward(&xv, &tv, c, IGNORE);
                assert_close(&what, &f64s(&loss), &want, (2e-6, 2e-6));
                // A different upstream gradient per row (reduction "none").
                let gv: Vec<f64> = values(s + 1, rows, -1.0, 1.0)
                    .iter()
                    .map(|&v| v as f64)
                    .collect();
                let g =
                    Tensor::from_vec(gv.iter().map(|&v| v as f32).collect(), &[rows], dev).unwrap();
                loss.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
                let dx = x.grad().unwrap();
                assert_eq!(dx.dtype(), d, "{what}: dlogits in the logits' dtype");
                let want = reference::backward(&xv, &tv, c, IGNORE, &gv);
                let (rt, at) = TOL.of(d);
                assert_close(
                    &format!("{what} dlogits"),
                    &f64s(&dx),
                    &want,
                    (rt * 2.0, at * 2.0),
                );
            }
        }
    }
}

/// One logit far above the others, at lengths that use one warp, several warps and a whole
/// block per row: the confident class's small loss keeps its digits (`lse − x_t` would not).
/// PyTorch (float64): logits [88, 80 x 9], target 0 → 0.0030146151294003338.
#[test]
fn confident_predictions_keep_their_digits() {
    let mut rows: Vec<(Vec<f32>, i64)> = Vec::new();
    let mut row = vec![80.0; 10];
    row[0] = 88.0;
    rows.push((row.clone(), 0));
    rows.push((row, 1));
    for (k, (n, at)) in [(33usize, 17usize), (700, 3), (3001, 2999)]
        .into_iter()
        .enumerate()
    {
        let mut r = values(k as u64 + 40, n, 70.0, 72.0);
        r[at] = 90.0;
        rows.push((r, at as i64));
    }
    let want = reference::forward(
        &[88.0, 80.0, 80.0, 80.0, 80.0, 80.0, 80.0, 80.0, 80.0, 80.0],
        &[0],
        10,
        IGNORE,
    );
    assert!(
        (want[0] - 0.0030146151294003338).abs() <= 1e-12 * want[0],
        "reference {want:?}"
    );
    for dev in devices() {
        for d in FLOATS {
            for (k, (xv, target)) in rows.iter().enumerate() {
                let n = xv.len();
                let (x, xq) = var(xv.clone(), &[1, n], d, dev);
                let t = Tensor::from_vec(vec![*target], &[1], dev).unwrap();
                let loss = f64s(&row_losses(&x, &t, false, IGNORE).unwrap());
                let want = reference::forward(&xq, &[*target], n, IGNORE);
                let what = format!("cross_entropy {dev} {d} confident row {k} (n {n})");
                assert_close(&what, &loss, &want, (2e-6, 0.0));
            }
        }
    }
}

#[test]
fn bad_targets_are_errors_naming_them() {
    // On the CPU at once (CUDA reports one at the next read of device values, from a per-device
    // slot that the parallel tests of this binary would race for: `cuda::checks` tests it).
    let x = Tensor::zeros(&[2, 3], DType::F32, Device::Cpu).unwrap();
    let t = Tensor::from_vec(vec![1i64, 3], &[2], Device::Cpu).unwrap();
    let e = row_losses(&x, &t, false, IGNORE).unwrap_err().to_string();
    assert!(e.contains("cross_entropy") && e.contains("target 3"), "{e}");
    for dev in devices() {
        // No class at all: every row must be ignored, and then the losses are 0.
        let x0 = Tensor::zeros(&[2, 0], DType::F32, dev).unwrap();
        let ignored = Tensor::from_vec(vec![IGNORE, IGNORE], &[2], dev).unwrap();
        let l = row_losses(&x0, &ignored, false, IGNORE).unwrap();
        assert_eq!(l.to_vec_f32().unwrap(), [0.0, 0.0], "{dev}");
    }
}

#[test]
fn nvrtc_compiles_the_kernels_for_sm80_and_sm90() {
    if !crate::kernels::test_support::nvrtc_available() {
        return;
    }
    let src =
        sinter_cuda::user_kernel::KernelSource::new("cross_entropy.cu", CROSS_ENTROPY_CU).unwrap();
    for arch in ["sm_80", "sm_90"] {
        let ptx = src.ptx(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        for sfx in ["f32", "f16", "bf16"] {
            for (kernel, params) in [("cross_entropy_fwd", 7), ("cross_entropy_bwd", 8)] {
                let name = format!("{kernel}_{sfx}");
                let e = ptx.entries.iter().find(|e| e.name == name);
                let e = e.unwrap_or_else(|| panic!("{arch}: no entry {name}"));
                assert_eq!(e.params.len(), params, "{arch}: {name}'s parameters");
            }
        }
    }
}
