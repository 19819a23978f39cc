//! The fused classifier against its composite [`reference`] (autograd's gradient), in f32, bf16
//! and f16, on the CPU and the CUDA device (the real GPU when present, else the emulated one:
//! the kernel emulator runs `classifier.cu`, NVRTC compiles it first where present): rows at
//! the ignore index, a vocabulary that is not a multiple of the row group, the kernel's
//! vector width or 128, padding columns, a scaled upstream gradient, and its errors.

use super::*;
use crate::kernels::test_support::{assert_close, devices, Tol};

/// Deterministic logits in about [-6, 6] (a few rows confident), `rows` × `n`.
fn values(rows: usize, n: usize) -> Vec<f32> {
    // Seed 1: the logits these cases were chosen with.
    let spread = crate::kernels::test_support::values(1, rows * n, -6.0, 6.0);
    let spike = |i: usize| if i.is_multiple_of(97) { 8.0 } else { 0.0 };
    spread
        .iter()
        .enumerate()
        .map(|(i, v)| v + spike(i))
        .collect()
}

/// (relative, absolute) tolerance of a gradient stored in each dtype.
const TOL: Tol = Tol {
    f32: (2e-6, 1e-7),
    bf16: (1.0 / 128.0, 1e-7),
    f16: (1.0 / 1024.0, 1e-7),
};

/// One case: loss and dlogits of the fused op against the reference's, the padding's gradient
/// exactly 0, and on CUDA the logits' own memory holding the gradient.
fn case(dev: Device, d: DType, rows: usize, n: usize, valid: usize, scale: f32) {
    let ignore = -100;
    let targets: Vec<i64> = (0..rows)
        .map(|r| {
            if r % 3 == 1 {
                ignore
            } else {
                ((r * 7919) % valid) as i64
            }
        })
        .collect();
    let host = Tensor::from_vec(values(rows, n), &[rows, n], Device::Cpu).unwrap();
    let t = Tensor::from_vec(targets, &[rows], dev).unwrap();
    let make = || {
        host.to_dtype(d)
            .unwrap()
            .to_device(dev)
            .unwrap()
            .to_var()
            .unwrap()
    };
    let (xf, xr) = (make(), make());
    let fused = fused_classifier(&xf, &t, valid, ignore).unwrap();
    let want = reference(&xr, &t, valid, ignore).unwrap();
    let what = format!("{dev} {d} {rows}x{n} valid {valid}");
    let (lf, lw) = (
        fused.loss.to_scalar_f32().unwrap(),
        want.to_scalar_f32().unwrap(),
    );
    assert!(
        (lf - lw).abs() <= 1e-5 * lw.abs(),
        "{what}: loss {lf}, reference {lw}"
    );
    fused.loss.mul_scalar(scale).unwrap().backward().unwrap();
    want.mul_scalar(scale).unwrap().backward().unwrap();
    let gf = xf.grad().unwrap();
    assert_eq!(
        gf.dtype(),
        d,
        "{what}: the gradient is in the logits' dtype"
    );
    let gf = gf.to_vec_f32().unwrap();
    let gw = xr.grad().unwrap().to_vec_f32().unwrap();
    assert_close(&what, &gf, &gw, TOL.of(d));
    for r in 0..rows {
        assert!(
            gf[r * n + valid..(r + 1) * n].iter().all(|&v| v == 0.0),
            "{what}: padding columns of row {r} got a gradient"
        );
    }
    let rows_loss = fused.rows.to_vec_f32().unwrap();
    assert!(rows_loss.iter().skip(1).step_by(3).all(|&l| l == 0.0));
    if dev != Device::Cpu {
        // Consumed in place: the logits' memory is the gradient handed on (scaled in place).
        assert_eq!(xf.to_vec_f32().unwrap(), gf, "{what}: not written in place");
    }
}

#[test]
fn matches_the_composite_in_every_dtype_on_every_device() {
    for dev in devices() {
        for d in [DType::F32, DType::BF16, DType::F16] {
            // 50257 → 50304 in miniature: 201 valid of 256 (padded_vocab(201)), odd sizes.
            case(dev, d, 7, padded_vocab(201), 201, 1.0);
            case(dev, d, 5, 37, 37, 1.0);
        }
    }
}

#[test]
fn a_scaled_loss_scales_the_gradient() {
    for dev in devices() {
        case(dev, DType::F32, 4, 256, 250, 3.0);
        case(dev, DType::BF16, 4, 130, 129, 0.5);
    }
}

#[test]
fn pads_the_vocabulary_to_a_multiple_of_128() {
    assert_eq!(padded_vocab(50257), 50304);
    assert_eq!(padded_vocab(128), 128);
    assert_eq!(padded_vocab(1), 128);
}

#[test]
fn refuses_bad_targets_shapes_and_a_second_backward() {
    let x = || {
        Tensor::from_vec(values(2, 8), &[2, 8], Device::Cpu)
            .unwrap()
            .to_var()
            .unwrap()
    };
    let t = Tensor::from_vec(vec![1i64, 7], &[2], Device::Cpu).unwrap();
    let e = fused_classifier(&x(), &t, 6, -100)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("target 7 at position 1"), "{e}");
    let e = fused_classifier(&x(), &t, 9, -100)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("9 valid classes"), "{e}");
    let e = fused_classifier(&x().reshape(&[16]).unwrap(), &t, 8, -100)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("[rows, vocab]"), "{e}");
    let xv = x();
    let l = fused_classifier(&xv, &t, 8, -100).unwrap().loss;
    l.backward().unwrap();
    if let Err(e) = l.backward() {
        assert!(e.to_string().contains("second backward"), "{e}");
    } else {
        panic!("a second backward through the fused classifier was not refused");
    }
}

#[test]
fn a_batch_of_ignored_rows_has_a_nan_mean_and_no_gradient() {
    for dev in devices() {
        let x = Tensor::from_vec(values(3, 40), &[3, 40], dev)
            .unwrap()
            .to_var()
            .unwrap();
        let t = Tensor::from_vec(vec![-1i64; 3], &[3], dev).unwrap();
        let l = fused_classifier(&x, &t, 40, -1).unwrap().loss;
        assert!(l.to_scalar_f32().unwrap().is_nan());
        l.backward().unwrap();
        assert!(x
            .grad()
            .unwrap()
            .to_vec_f32()
            .unwrap()
            .iter()
            .all(|&g| g == 0.0));
    }
}

/// NVRTC compiles `classifier.cu` for sm_80 and sm_90 with every kernel's parameter list as
/// the launches pass it (skipped without NVRTC unless SINTER_REQUIRE_NVRTC=1, as
/// sinter-cuda's `nvrtc_compile` test).
#[test]
fn nvrtc_compiles_the_kernels_for_sm80_and_sm90() {
    if !crate::kernels::test_support::nvrtc_available() {
        return;
    }
    let src = sinter_cuda::user_kernel::KernelSource::new("classifier.cu", CLASSIFIER_CU).unwrap();
    for arch in ["sm_80", "sm_90"] {
        let ptx = src.ptx(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        for sfx in ["f32", "f16", "bf16"] {
            for (kernel, params) in [("fused_classifier", 9), ("classifier_grad_scale", 4)] {
                let name = format!("{kernel}_{sfx}");
                let e = ptx.entries.iter().find(|e| e.name == name);
                let e = e.unwrap_or_else(|| panic!("{arch}: no entry {name}"));
                assert_eq!(e.params.len(), params, "{arch}: {name}'s parameters");
            }
        }
    }
}
