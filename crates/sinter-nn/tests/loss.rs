//! The loss objects pass their options through: values worked out by hand from PyTorch's
//! definitions (uniform logits make every log-probability −ln C), and option errors.

use sinter_core::{Device, Reduction, Result, Tensor};
use sinter_nn::{CrossEntropyLoss, MseLoss};

fn close(got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (*g as f64 - w).abs() <= 1e-6 * w.abs().max(1.0),
            "{got:?} vs {want:?}"
        );
    }
}

/// Logits all 0 over 4 classes (lse = ln 4), targets [0, 3], weights [1, 2, 3, 4], ε = 0.1:
/// row 0 is 0.9·1·ln4 + 0.1/4·(1+2+3+4)·ln4 = 1.15 ln4, row 1 0.9·4·ln4 + 0.25 ln4 = 3.85 ln4;
/// the weighted mean divides the sum (5 ln4) by w[0] + w[3] = 5.
#[test]
fn cross_entropy_loss_applies_weights_smoothing_and_reduction() -> Result<()> {
    let d = Device::Cpu;
    let x = Tensor::zeros(&[2, 4], sinter_core::DType::F32, d)?;
    let t = Tensor::from_slice(&[0i64, 3], &[2], d)?;
    let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4], d)?;
    let ln4 = 4f64.ln();
    let loss = CrossEntropyLoss::new().weight(w).label_smoothing(0.1)?;
    let per_row = loss.clone().reduction(Reduction::None).forward(&x, &t)?;
    assert_eq!(per_row.shape(), [2]);
    close(&per_row.to_vec_f32()?, &[1.15 * ln4, 3.85 * ln4]);
    let sum = loss.clone().reduction(Reduction::Sum).forward(&x, &t)?;
    close(&sum.to_vec_f32()?, &[5.0 * ln4]);
    close(&loss.forward(&x, &t)?.to_vec_f32()?, &[ln4]);
    // Ignoring target 3 leaves row 0 alone: the mean is its loss over its weight.
    let ignore3 = loss.clone().ignore_index(3);
    close(&ignore3.forward(&x, &t)?.to_vec_f32()?, &[1.15 * ln4]);
    Ok(())
}

#[test]
fn bad_options_are_refused() -> Result<()> {
    let e = CrossEntropyLoss::new().label_smoothing(-0.1).unwrap_err();
    assert!(e.to_string().contains("label_smoothing"), "{e}");
    let x = Tensor::zeros(&[2, 4], sinter_core::DType::F32, Device::Cpu)?;
    let t = Tensor::from_slice(&[0i64, 3], &[2], Device::Cpu)?;
    let w = Tensor::ones(&[3], sinter_core::DType::F32, Device::Cpu)?;
    let e = CrossEntropyLoss::new()
        .weight(w)
        .forward(&x, &t)
        .unwrap_err();
    assert!(e.to_string().contains("one value per class ([4])"), "{e}");
    Ok(())
}

#[test]
fn mse_loss_reductions() -> Result<()> {
    let d = Device::Cpu;
    let a = Tensor::from_slice(&[1.0f32, 2.0, 4.0], &[3], d)?;
    let b = Tensor::from_slice(&[0.0f32, 2.0, 1.0], &[3], d)?;
    let f = |r| MseLoss { reduction: r }.forward(&a, &b);
    close(&f(Reduction::None)?.to_vec_f32()?, &[1.0, 0.0, 9.0]);
    close(&f(Reduction::Sum)?.to_vec_f32()?, &[10.0]);
    close(&f(Reduction::Mean)?.to_vec_f32()?, &[10.0 / 3.0]);
    assert!(
        f(Reduction::Mean).is_ok()
            && a.mse_loss_with(&b.reshape(&[3, 1])?, Reduction::Sum)
                .is_err()
    );
    Ok(())
}
