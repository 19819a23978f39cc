//! BatchNorm folding and the fused Conv+BatchNorm training op, each against the separate
//! layers: folded outputs equal `bn(conv(x))` in evaluation mode within 1e-5 relative, and the
//! fused op's outputs, gradients (input, conv weight and bias, γ, β) and running statistics
//! equal the unfused layers' within f32 rounding.

use sinter_core::{no_grad, Conv2dParams, DType, Device, Hw, Rng, Tensor};
use sinter_nn::conv_bn::conv_bn_training;
use sinter_nn::fold::{fold_conv_bn, fold_for_inference, fold_linear_bn};
use sinter_nn::{BatchNorm2d, Conv2d, ConvBn, Linear, Module, Sequential};

fn randn(shape: &[usize], rng: &mut Rng) -> Tensor {
    Tensor::randn(shape, 0.0, 1.0, rng, DType::F32, Device::Cpu).unwrap()
}

fn uniform(n: usize, lo: f64, hi: f64, rng: &mut Rng) -> Tensor {
    Tensor::rand_uniform(&[n], lo, hi, rng, DType::F32, Device::Cpu).unwrap()
}

/// A BatchNorm whose affine parameters and running statistics are all far from 1 and 0.
fn trained_bn(c: usize, rng: &mut Rng) -> BatchNorm2d {
    let bn = BatchNorm2d::new(c).unwrap();
    bn.weight.assign(&uniform(c, 0.3, 2.5, rng)).unwrap();
    bn.bias.assign(&uniform(c, -1.0, 1.0, rng)).unwrap();
    bn.running_mean.assign(&uniform(c, -2.0, 2.0, rng)).unwrap();
    bn.running_var.assign(&uniform(c, 0.05, 4.0, rng)).unwrap();
    bn
}

/// max |a − b| / max |b|: a norm-wise relative error that near-zero elements cannot inflate.
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    let scale = max_abs(b);
    assert!(scale > 0.0, "reference is all zeros");
    max_abs(&a.sub(b).unwrap()) / scale
}

fn max_abs(t: &Tensor) -> f64 {
    t.to_vec_f64()
        .unwrap()
        .iter()
        .map(|v| v.abs())
        .fold(0.0, f64::max)
}

fn conv_cases() -> Vec<(usize, usize, Hw, Conv2dParams)> {
    let p = Conv2dParams::square;
    // (input channels, output channels, kernel, params)
    vec![
        (3, 8, 3.into(), p(1, 1, 1, 1)),
        (4, 6, 3.into(), p(2, 0, 1, 1)),
        (4, 8, 3.into(), p(1, 2, 2, 2)),
        (5, 7, 1.into(), p(2, 0, 1, 1)),
        (
            3,
            4,
            (3, 1).into(),
            Conv2dParams {
                stride: (1, 2).into(),
                padding: (1, 0).into(),
                dilation: (2, 1).into(),
                groups: 1,
            },
        ),
    ]
}

#[test]
fn folded_conv_equals_conv_then_batch_norm() {
    let mut rng = Rng::new(7);
    for (cin, cout, k, params) in conv_cases() {
        for bias in [false, true] {
            let conv = Conv2d::new(cin, cout, k, params, bias, &mut rng).unwrap();
            let bn = trained_bn(cout, &mut rng);
            bn.set_training(false);
            let x = randn(&[3, cin, 9, 9], &mut rng);
            let want = bn.forward(&conv.forward(&x).unwrap()).unwrap();
            let folded = fold_conv_bn(&conv, &bn).unwrap();
            let got = folded.forward(&x).unwrap();
            let e = rel_err(&got, &want);
            assert!(e <= 1e-5, "{params:?} bias {bias}: relative error {e:e}");
            // The originals are untouched.
            assert_eq!(conv.bias.is_some(), bias);
        }
    }
}

#[test]
fn folded_linear_equals_linear_then_batch_norm() {
    let mut rng = Rng::new(8);
    for bias in [false, true] {
        let lin = Linear::new(12, 5, bias, &mut rng).unwrap();
        let bn = trained_bn(5, &mut rng);
        bn.set_training(false);
        let x = randn(&[4, 12], &mut rng);
        let y = lin.forward(&x).unwrap().reshape(&[4, 5, 1, 1]).unwrap();
        let want = bn.forward(&y).unwrap().reshape(&[4, 5]).unwrap();
        let got = fold_linear_bn(&lin, &bn).unwrap().forward(&x).unwrap();
        let e = rel_err(&got, &want);
        assert!(e <= 1e-5, "bias {bias}: relative error {e:e}");
    }
}

#[test]
fn folding_checks_its_inputs() {
    let mut rng = Rng::new(9);
    let conv = Conv2d::new(2, 4, 3, Conv2dParams::default(), false, &mut rng).unwrap();
    let e = fold_conv_bn(&conv, &trained_bn(5, &mut rng))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("5 channels") && e.contains("4 outputs"), "{e}");
    let bn = trained_bn(4, &mut rng);
    bn.running_var
        .assign(&Tensor::from_vec(vec![1.0f32, -3.0, 1.0, 1.0], &[4], Device::Cpu).unwrap())
        .unwrap();
    let e = fold_conv_bn(&conv, &bn).err().unwrap().to_string();
    assert!(e.contains("channel 1") && e.contains("-3"), "{e}");
    assert!(ConvBn::new(conv, Some(trained_bn(3, &mut rng))).is_err());
}

#[test]
fn conv_bn_folds_in_eval_mode_and_unfolds_for_training() {
    let mut rng = Rng::new(10);
    let conv = Conv2d::new(3, 6, 3, Conv2dParams::default(), false, &mut rng).unwrap();
    let m = ConvBn::new(conv, Some(trained_bn(6, &mut rng))).unwrap();
    let x = randn(&[2, 3, 7, 7], &mut rng);
    // Training mode: folding would use the wrong statistics, so it is refused.
    let e = m.fold_batch_norm().unwrap_err().to_string();
    assert!(e.contains("training mode"), "{e}");

    m.set_training(false);
    let unfused = m.forward_relu(&x).unwrap();
    assert_eq!(fold_for_inference(&m).unwrap(), 1);
    assert!(m.folded().is_some());
    let folded = m.forward_relu(&x).unwrap();
    assert!(rel_err(&folded, &unfused) <= 1e-5);
    // The folded path differs in rounding: proof that it is the one running.
    assert_ne!(folded.to_vec_f32().unwrap(), unfused.to_vec_f32().unwrap());

    m.set_training(true);
    assert!(m.folded().is_none());
    // Checkpoint names are the separate layers', under the names the parent gives.
    let m = m.named("conv1", "bn1");
    let names: Vec<String> = m.named_tensors().into_iter().map(|t| t.name).collect();
    assert_eq!(
        names,
        [
            "conv1.weight",
            "bn1.weight",
            "bn1.bias",
            "bn1.running_mean",
            "bn1.running_var"
        ]
    );
    // A container passes folding on; a conv without BatchNorm has nothing to fold.
    let plain = Conv2d::new(3, 4, 3, Conv2dParams::default(), true, &mut rng).unwrap();
    let seq = Sequential::new()
        .add(m)
        .add(ConvBn::new(plain, None).unwrap());
    seq.set_training(false);
    assert_eq!(seq.fold_batch_norm().unwrap(), 1);
}

#[test]
fn an_int8_conv_folds_with_its_batch_norm_into_an_int8_conv_with_the_same_outputs() {
    let mut rng = Rng::new(11);
    let conv = Conv2d::new(3, 6, 3, Conv2dParams::default(), false, &mut rng).unwrap();
    let bn = trained_bn(6, &mut rng);
    // One negative γ: the fold negates that channel's int8 weights instead of its scale.
    let mut gamma = bn.weight.to_vec_f32().unwrap();
    gamma[2] = -gamma[2];
    bn.weight
        .assign(&Tensor::from_vec(gamma, &[6], Device::Cpu).unwrap())
        .unwrap();
    let m = ConvBn::new(conv, Some(bn)).unwrap();
    m.set_training(false);
    let x = randn(&[2, 3, 9, 9], &mut rng);
    let _g = no_grad();
    let f32_out = m.forward_relu(&x).unwrap();
    sinter_nn::quant::quantize(&m, &mut |model: &dyn Module| {
        model.forward(&randn(&[4, 3, 9, 9], &mut Rng::new(12)))?;
        Ok(())
    })
    .unwrap();
    let unfolded = m.forward_relu(&x).unwrap();
    assert_eq!(fold_for_inference(&m).unwrap(), 1);
    let folded_conv = m.folded().expect("folded");
    assert!(
        folded_conv.quant.int8().is_some(),
        "the folded convolution stays int8"
    );
    let folded = m.forward_relu(&x).unwrap();
    // Same u8 input, same int8 products: only the f32 epilogue's rounding differs, where an
    // f32 fold would differ by the int8 quantization error (checked to be far larger).
    let e = rel_err(&folded, &unfolded);
    assert!(
        e <= 1e-5,
        "folded int8 vs unfolded int8: relative error {e:e}"
    );
    let q = rel_err(&unfolded, &f32_out);
    assert!(q > 1e-4, "the int8 path must be the one running ({q:e})");
}

/// One training-mode forward and backward through `f`, seeded with a fixed random gradient;
/// returns the output and the gradients of x, the conv weight and bias, γ and β.
fn run_step(
    f: impl Fn(&Tensor) -> Tensor,
    x: &Tensor,
    conv: &Conv2d,
    bn: &BatchNorm2d,
) -> Vec<Tensor> {
    for p in [&conv.weight, &bn.weight, &bn.bias]
        .into_iter()
        .chain(&conv.bias)
    {
        p.zero_grad();
    }
    let x = x.to_var().unwrap();
    let y = f(&x);
    let seed = randn(y.shape(), &mut Rng::new(99));
    y.backward_with_grad(&seed, |_, _| Ok(())).unwrap();
    let mut out = vec![y.detach(), x.grad().unwrap(), conv.weight.grad().unwrap()];
    out.extend(conv.bias.as_ref().map(|b| b.grad().unwrap()));
    out.extend([bn.weight.grad().unwrap(), bn.bias.grad().unwrap()]);
    out
}

#[test]
fn fused_training_equals_unfused_layers() {
    let mut rng = Rng::new(11);
    for (cin, cout, k, params) in conv_cases() {
        for bias in [false, true] {
            let conv = Conv2d::new(cin, cout, k, params, bias, &mut rng).unwrap();
            let bn_a = trained_bn(cout, &mut rng);
            // A twin BatchNorm with the same parameters and statistics.
            let bn_b = BatchNorm2d::new(cout).unwrap();
            for (a, b) in bn_a.named_tensors().iter().zip(bn_b.named_tensors()) {
                b.tensor.assign(&a.tensor).unwrap();
            }
            let x = randn(&[4, cin, 9, 9], &mut rng).mul_scalar(2.0).unwrap();
            // Two steps, so the running statistics compound.
            for step in 0..2 {
                let want = run_step(
                    |x| bn_a.forward(&conv.forward(x).unwrap()).unwrap(),
                    &x,
                    &conv,
                    &bn_a,
                );
                let got = run_step(
                    |x| conv_bn_training(x, &conv, &bn_b).unwrap(),
                    &x,
                    &conv,
                    &bn_b,
                );
                let what = ["output", "dx", "dW", "db", "dγ", "dβ"];
                let what: Vec<&str> = what
                    .iter()
                    .copied()
                    .filter(|w| bias || *w != "db")
                    .collect();
                for ((g, w), name) in got.iter().zip(&want).zip(&what) {
                    if *name == "db" {
                        // Zero in exact arithmetic (the batch mean removes the conv bias): both
                        // must be rounding noise next to the weight gradient.
                        let noise = 1e-5 * max_abs(&want[2]);
                        assert!(max_abs(g) <= noise && max_abs(w) <= noise, "{params:?}: db");
                        continue;
                    }
                    let e = rel_err(g, w);
                    assert!(
                        e <= 2e-5,
                        "{params:?} bias {bias} step {step}: {name} relative error {e:e}"
                    );
                }
                for (a, b) in [
                    (&bn_a.running_mean, &bn_b.running_mean),
                    (&bn_a.running_var, &bn_b.running_var),
                ] {
                    assert_eq!(a.to_vec_f32().unwrap(), b.to_vec_f32().unwrap());
                }
            }
        }
    }
}

#[test]
fn fused_training_module_uses_the_fused_op_only_when_training_with_gradients() {
    let mut rng = Rng::new(12);
    let conv = Conv2d::new(2, 4, 3, Conv2dParams::default(), false, &mut rng).unwrap();
    let m = ConvBn::new(conv, Some(trained_bn(4, &mut rng)))
        .unwrap()
        .fused_training(true);
    let x = randn(&[3, 2, 6, 6], &mut rng);
    // A constant input (the first layer's images): gradients still reach the parameters.
    let y = m.forward(&x).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    for (n, p) in m.parameters() {
        assert!(p.grad().is_some(), "{n} got no gradient");
    }
    // Training mode without gradients updates the statistics like the separate layers.
    let bn = m.bn.as_ref().unwrap();
    let before = bn.running_mean.to_vec_f32().unwrap();
    {
        let _g = no_grad();
        m.forward(&x).unwrap();
    }
    assert_ne!(bn.running_mean.to_vec_f32().unwrap(), before);
    // Evaluation mode uses the running statistics.
    m.set_training(false);
    let stats = bn.running_mean.to_vec_f32().unwrap();
    let a = m.forward(&x).unwrap();
    assert_eq!(bn.running_mean.to_vec_f32().unwrap(), stats);
    let b = bn.forward(&m.conv.forward(&x).unwrap()).unwrap();
    assert_eq!(a.to_vec_f32().unwrap(), b.to_vec_f32().unwrap());
}
