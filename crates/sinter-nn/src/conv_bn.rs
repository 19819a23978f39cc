//! A Conv2d followed by an optional BatchNorm2d, as one module with three ways to run:
//!
//! - **unfused** (default): `bn(conv(x))`, each op recorded for autograd;
//! - **fused training** (`fused_training(true)`, sinter's `--fuse-conv-bn`): in training mode
//!   one recorded op ([`conv_bn_training`]) that keeps only the convolution's input and
//!   weights and recomputes the convolution in backward. Same values and gradients, less
//!   activation memory (PyTorch's "Fusing Convolution and Batch Norm using Custom Function");
//! - **folded** (after `fold_batch_norm` in evaluation mode, see `fold`): one convolution with
//!   the BatchNorm folded into its weights and bias; `set_training(true)` drops the fold.
//!
//! The parent model names the two layers (`conv1`/`bn1`, or `0`/`1` under `shortcut`), so
//! checkpoint keys are those of the separate layers.

use std::sync::{Arc, RwLock};

use sinter_core::{amp, bail, is_grad_enabled, no_grad, with_custom_backward, Result, Tensor};

use crate::fold::fold_conv_bn;
use crate::layers::{BatchNorm2d, Conv2d};
use crate::module::{join, Module, NamedTensor};
use crate::recompute::with_grad;

pub struct ConvBn {
    pub conv: Conv2d,
    pub bn: Option<BatchNorm2d>,
    names: [&'static str; 2],
    fused_training: bool,
    /// The folded convolution while folded (evaluation mode only).
    folded: RwLock<Option<Arc<Conv2d>>>,
}

impl ConvBn {
    /// Named `0` and `1` (as in a Sequential) until `named` says otherwise.
    pub fn new(conv: Conv2d, bn: Option<BatchNorm2d>) -> Result<Self> {
        if let Some(bn) = &bn {
            let (o, c) = (conv.weight.shape()[0], bn.weight.numel());
            if o != c {
                bail!("ConvBn: the convolution has {o} output channels but the BatchNorm {c}");
            }
        }
        Ok(ConvBn {
            conv,
            bn,
            names: ["0", "1"],
            fused_training: false,
            folded: RwLock::new(None),
        })
    }

    /// The names of the convolution and the BatchNorm under the parent's prefix.
    pub fn named(mut self, conv: &'static str, bn: &'static str) -> Self {
        self.names = [conv, bn];
        self
    }

    /// Train with the memory-saving fused op (no effect without a BatchNorm).
    pub fn fused_training(mut self, on: bool) -> Self {
        self.fused_training = on;
        self
    }

    /// The folded convolution, while folded.
    pub fn folded(&self) -> Option<Arc<Conv2d>> {
        self.folded
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `relu(self.forward(x))`: without a BatchNorm (or with it folded in) one fused conv +
    /// bias + ReLU op ([`Conv2d::forward_relu`]).
    pub fn forward_relu(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(f) = self.folded() {
            return f.forward_relu(x);
        }
        match &self.bn {
            None => self.conv.forward_relu(x),
            Some(_) => self.forward(x)?.relu(),
        }
    }
}

impl Module for ConvBn {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(f) = self.folded() {
            return f.forward(x);
        }
        let Some(bn) = &self.bn else {
            return self.conv.forward(x);
        };
        if self.fused_training && bn.is_training() && is_grad_enabled() {
            return conv_bn_training(x, &self.conv, bn);
        }
        bn.forward(&self.conv.forward(x)?)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.conv.collect(&join(prefix, self.names[0]), out);
        if let Some(bn) = &self.bn {
            bn.collect(&join(prefix, self.names[1]), out);
        }
    }
    fn set_training(&self, training: bool) {
        if training {
            *self.folded.write().unwrap_or_else(|e| e.into_inner()) = None;
        }
        if let Some(bn) = &self.bn {
            bn.set_training(training);
        }
    }
    fn fold_batch_norm(&self) -> Result<usize> {
        let Some(bn) = &self.bn else {
            return Ok(0);
        };
        if bn.is_training() {
            bail!("fold_batch_norm: the BatchNorm is in training mode; folding uses the running statistics of evaluation mode (call set_training(false) first)");
        }
        let f = fold_conv_bn(&self.conv, bn)?;
        *self.folded.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(f));
        Ok(1)
    }
}

/// `bn(conv(x))` in training mode (batch statistics; the running statistics are updated) as
/// one recorded op that keeps only `x`, the parameters and two per-channel vectors (mean and
/// 1/σ). Backward recomputes the convolution, applies BatchNorm's backward rule
/// `dy = γ/σ · (g − mean(g) − x̂·mean(g·x̂))` and back-propagates `dy` through the
/// convolution. Outputs and gradients equal the unfused layers' to f32 rounding.
pub fn conv_bn_training(x: &Tensor, conv: &Conv2d, bn: &BatchNorm2d) -> Result<Tensor> {
    let xd = x.detach();
    let (out, mean, inv_std, per_channel) = {
        let _g = no_grad();
        let y = conv.forward(&xd)?;
        if y.rank() != 4 || y.shape()[1] != bn.weight.numel() {
            bail!(
                "ConvBn: BatchNorm over {} channels cannot follow a convolution output of shape {:?}",
                bn.weight.numel(),
                y.shape()
            );
        }
        let bc = [1, y.shape()[1], 1, 1];
        let per_channel = y.numel() / bc[1];
        // The statistics as BatchNorm2d computes them, so the running averages agree exactly.
        let mean = y.mean(&[0, 2, 3], true)?;
        let centred = y.sub(&mean)?;
        drop(y);
        let var = centred.sqr()?.mean(&[0, 2, 3], true)?;
        bn.update_running_stats(&mean, &var, per_channel)?;
        let inv_std = var.add_scalar(bn.eps)?.sqrt()?.recip()?;
        let scale = inv_std.mul(&bn.weight.reshape(&bc)?)?;
        let out = centred.mul(&scale)?.add(&bn.bias.reshape(&bc)?)?;
        (out, mean, inv_std, per_channel)
    };
    let autocast = amp::autocast_dtype();
    let (w, b) = (conv.weight.clone(), conv.bias.clone());
    let (gamma, params) = (bn.weight.clone(), conv.params);
    let want_dx = x.tracks_grad();
    let mut inputs = vec![x, &conv.weight];
    inputs.extend(&conv.bias);
    inputs.extend([&bn.weight, &bn.bias]);
    let backward = move |g: &Tensor, _: &Tensor| {
        with_grad(|| {
            let _ac = autocast.map(amp::autocast);
            let xv = if want_dx { xd.to_var()? } else { xd.clone() };
            let wv = w.detach().to_var()?;
            let bv = b.as_ref().map(|b| b.detach().to_var()).transpose()?;
            let recomputed = Conv2d::from_weights(wv.clone(), bv.clone(), params);
            let y = recomputed.forward(&xv)?;
            let (dy, dgamma, dbeta) = {
                let _g = no_grad();
                let c = gamma.numel();
                let inv_n = 1.0 / per_channel as f32;
                let scale = inv_std.mul(&gamma.reshape(&[1, c, 1, 1])?)?;
                // One statement per full-size tensor, so each temporary is freed as soon as
                // it is used: at most three live beside `y` and `g`.
                let xhat = y.detach().sub(&mean)?;
                let xhat = xhat.mul(&inv_std)?;
                let dbeta = g.sum(&[0, 2, 3], true)?;
                let dgamma = g.mul(&xhat)?.sum(&[0, 2, 3], true)?;
                let t = xhat.mul(&dgamma.mul_scalar(inv_n)?)?;
                drop(xhat);
                let t = g.sub(&t)?;
                let t = t.mul(&scale)?;
                let dy = t.sub(&dbeta.mul(&scale)?.mul_scalar(inv_n)?)?;
                (dy, dgamma.reshape(&[c])?, dbeta.reshape(&[c])?)
            };
            y.backward_with_grad(&dy, |_, _| Ok(()))?;
            let mut grads = vec![want_dx.then(|| xv.grad()).flatten(), wv.grad()];
            if let Some(bv) = &bv {
                grads.push(bv.grad());
            }
            grads.extend([Some(dgamma), Some(dbeta)]);
            Ok(grads)
        })
    };
    Ok(with_custom_backward(&out, "conv_bn", &inputs, backward))
}
