//! BatchNorm folding for inference. In evaluation mode a BatchNorm is a per-channel affine
//! map, `y = (x − μ)·s + β` with `s = γ/√(σ²+ε)`, so after a Conv2d or Linear it folds into
//! that layer's weights: `W' = W·s` (per output channel) and `b' = (b − μ)·s + β`. The folded
//! layer computes the same outputs with one op instead of five full passes over the
//! activations.
//!
//! The fold is computed in f64 from the f32 parameters and rounded once, so the folded
//! weights are the nearest f32 values to the exact ones.

use sinter_core::{bail, Result, Tensor};

use crate::layers::{BatchNorm2d, Conv2d, Linear};
use crate::module::Module;

/// A BatchNorm's evaluation-mode map per channel: `y = (x − mean)·scale + beta`.
struct BnAffine {
    /// γ/√(σ²+ε).
    scale: Vec<f64>,
    /// The running mean μ.
    mean: Vec<f64>,
    beta: Vec<f64>,
}

impl BnAffine {
    fn of(bn: &BatchNorm2d) -> Result<BnAffine> {
        let gamma = bn.weight.to_vec_f64()?;
        let beta = bn.bias.to_vec_f64()?;
        let mean = bn.running_mean.to_vec_f64()?;
        let var = bn.running_var.to_vec_f64()?;
        let eps = bn.eps as f64;
        let mut scale = Vec::with_capacity(gamma.len());
        for (c, (&g, &v)) in gamma.iter().zip(&var).enumerate() {
            let d = v + eps;
            if !(d > 0.0 && d.is_finite() && g.is_finite() && mean[c].is_finite()) {
                bail!(
                    "cannot fold BatchNorm: channel {c} has running variance {v}, mean {}, weight {g} \
                     (variance + eps must be positive and all finite); the checkpoint's BatchNorm \
                     statistics are damaged",
                    mean[c]
                );
            }
            scale.push(g / d.sqrt());
        }
        Ok(BnAffine { scale, mean, beta })
    }

    fn channels(&self) -> usize {
        self.scale.len()
    }

    /// Folded bias of channel `c` for a layer bias `b`.
    fn bias(&self, c: usize, b: f64) -> f64 {
        (b - self.mean[c]) * self.scale[c] + self.beta[c]
    }
}

/// Weight and bias of a layer whose weight is [out, …] with `bn` applied to its output
/// channels, folded; both returned on the weight's device and in its dtype.
fn fold_weight_bias(
    what: &str,
    weight: &Tensor,
    bias: Option<&Tensor>,
    bn: &BatchNorm2d,
) -> Result<(Tensor, Tensor)> {
    let a = BnAffine::of(bn)?;
    let out = weight.shape()[0];
    if a.channels() != out {
        bail!(
            "cannot fold a BatchNorm over {} channels into a {what} with {out} outputs",
            a.channels()
        );
    }
    let w = weight.to_vec_f64()?;
    let per = w.len() / out.max(1);
    let b = match bias {
        Some(b) => b.to_vec_f64()?,
        None => vec![0.0; out],
    };
    let w2: Vec<f32> = w
        .iter()
        .enumerate()
        .map(|(i, &v)| (v * a.scale[i / per]) as f32)
        .collect();
    let b2: Vec<f32> = (0..out).map(|c| a.bias(c, b[c]) as f32).collect();
    let place = |v: Vec<f32>, shape: &[usize]| -> Result<Tensor> {
        Tensor::from_vec(v, shape, sinter_core::Device::Cpu)?
            .to_dtype(weight.dtype())?
            .to_device(weight.device())
    };
    Ok((place(w2, weight.shape())?, place(b2, &[out])?))
}

/// `conv` followed by `bn` in evaluation mode, as one Conv2d with a bias. The originals are
/// not changed; the new layer's tensors are plain (not trained) tensors.
pub fn fold_conv_bn(conv: &Conv2d, bn: &BatchNorm2d) -> Result<Conv2d> {
    let (weight, bias) = fold_weight_bias("Conv2d", &conv.weight, conv.bias.as_ref(), bn)?;
    Ok(Conv2d {
        weight,
        bias: Some(bias),
        params: conv.params,
    })
}

/// `linear` followed by `bn` over its output features (a BatchNorm1d, or a BatchNorm2d over
/// [n, features, 1, 1]) in evaluation mode, as one Linear with a bias.
pub fn fold_linear_bn(linear: &Linear, bn: &BatchNorm2d) -> Result<Linear> {
    let (weight, bias) = fold_weight_bias("Linear", &linear.weight, linear.bias.as_ref(), bn)?;
    Ok(Linear::from_weights(weight, Some(bias)))
}

/// Prepares `model` for inference: evaluation mode, then every Conv→BatchNorm pair folded
/// (`Module::fold_batch_norm`). Returns the number of BatchNorms folded. `set_training(true)`
/// brings the unfused layers back; fold again after changing the weights.
pub fn fold_for_inference(model: &dyn Module) -> Result<usize> {
    model.set_training(false);
    model.fold_batch_norm()
}
