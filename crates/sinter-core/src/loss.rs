//! Losses: cross-entropy with PyTorch's options (`reduction`, class `weight`, `label_smoothing`,
//! `ignore_index`) and mean squared error.
//!
//! Cross-entropy runs one fused primitive: each row's loss, computed as
//! ln Σ e^(x − max) − (x_t − max) so that a confident prediction keeps its digits, and its
//! log-sum-exp; the backward takes one gradient per row. What the options add is tensor ops on
//! those per-row losses, so each rule is written once and differentiable on every backend:
//! - `weight`: row r's loss is scaled by w[t_r], and the mean divides by Σ w[t_r] over the
//!   counted rows (PyTorch's weighted mean, not the plain one);
//! - `label_smoothing` ε: the target is (1 − ε)·onehot + ε/C, so a row's loss is
//!   (1 − ε)·w[t]·(−log p_t) + ε/C · Σ_c w_c·(−log p_c) (the second term from an f32
//!   log-softmax), reduced with the same denominator;
//! - `ignore_index`: such rows have loss 0 and are not in the mean's denominator; a mean over
//!   no counted row is NaN (0 / 0), as in PyTorch.
//!
//! The loss is f32 whatever the logits' dtype.

use crate::backend::IndexUse;
use crate::{bail, DType, Error, Result, Tensor};

/// How a loss reduces its per-element values (PyTorch's `reduction`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduction {
    /// The mean over the counted elements (the weighted mean when classes have weights).
    #[default]
    Mean,
    /// The sum over the counted elements.
    Sum,
    /// One loss per element, in the targets' shape (0 where ignored).
    None,
}

impl Reduction {
    /// PyTorch's names: `mean`, `sum`, `none`.
    pub fn parse(s: &str) -> Option<Reduction> {
        match s {
            "mean" => Some(Reduction::Mean),
            "sum" => Some(Reduction::Sum),
            "none" => Some(Reduction::None),
            _ => None,
        }
    }
}

/// The options of [`Tensor::cross_entropy_with`]; `Default` is PyTorch's defaults.
#[derive(Clone, Debug)]
pub struct CrossEntropyOptions {
    pub reduction: Reduction,
    /// One weight per class ([c], float, on the logits' device), or None for all ones.
    pub weight: Option<Tensor>,
    /// ε in [0, 1]: how much of the target's probability is spread evenly over the classes.
    pub label_smoothing: f64,
    /// Targets equal to this count for nothing (PyTorch's default −100; may be a class id).
    pub ignore_index: i64,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions {
            reduction: Reduction::Mean,
            weight: None,
            label_smoothing: 0.0,
            ignore_index: -100,
        }
    }
}

/// An i64 scalar on `dev`: filled on the device where f64 holds the value exactly (no host
/// upload, which would wait for the device on every loss), uploaded otherwise.
fn scalar_i64(v: i64, dev: crate::Device) -> Result<Tensor> {
    if v.unsigned_abs() < 1 << 53 {
        Tensor::full(v as f64, &[], DType::I64, dev)
    } else {
        Tensor::from_slice(&[v], &[], dev)
    }
}

impl Tensor {
    /// Mean cross-entropy of logits [..., c] against i64 class indices [...]; targets equal to
    /// `ignore_index` count for nothing. [`Tensor::cross_entropy_with`] takes PyTorch's other
    /// options.
    pub fn cross_entropy(&self, targets: &Tensor, ignore_index: i64) -> Result<Tensor> {
        let o = CrossEntropyOptions {
            ignore_index,
            ..CrossEntropyOptions::default()
        };
        self.cross_entropy_with(targets, &o)
    }

    /// `torch.nn.functional.cross_entropy` of logits [..., c] against i64 class indices [...]
    /// with `o`'s reduction, class weights, label smoothing and ignore index (see the module
    /// docs for the formulas). Differentiable in the logits (and the weights).
    pub fn cross_entropy_with(&self, targets: &Tensor, o: &CrossEntropyOptions) -> Result<Tensor> {
        let c = self.check_cross_entropy(targets, o)?;
        let what = IndexUse::CrossEntropy;
        let (targets, checked) = self.indices_here(targets, c, Some(o.ignore_index), what)?;
        let rows =
            crate::kernels::cross_entropy::row_losses(self, &targets, checked, o.ignore_index)?;
        let dev = self.device();
        let counted = targets.ne(&scalar_i64(o.ignore_index, dev)?)?;
        let weight = o
            .weight
            .as_ref()
            .map(|w| w.to_dtype(DType::F32))
            .transpose()?;
        // Each row's weight w[t] (0 where ignored); None: all ones.
        let row_weight = match &weight {
            None => None,
            Some(w) => {
                let safe = Tensor::where_cond(&counted, &targets, &scalar_i64(0, dev)?)?;
                let wt = w.index_select(0, &safe.reshape(&[safe.numel()])?)?;
                Some(wt.reshape(targets.shape())?.mul(&counted)?)
            }
        };
        let nll = match &row_weight {
            None => rows,
            Some(wt) => rows.mul(wt)?,
        };
        let eps = o.label_smoothing;
        let loss = if eps == 0.0 {
            nll
        } else {
            let lp = self.to_dtype(DType::F32)?.log_softmax(-1)?;
            let lp = match &weight {
                None => lp,
                Some(w) => lp.mul(w)?,
            };
            // Ignored rows are selected out, not multiplied by 0: a mean over no counted row
            // sends them an infinite gradient, and inf · 0 would make every gradient NaN
            // (PyTorch's are 0 there).
            let row_sum = lp.sum(&[-1], false)?.neg()?;
            let smooth = Tensor::where_cond(&counted, &row_sum, &row_sum.zeros_like()?)?;
            nll.mul_scalar((1.0 - eps) as f32)?
                .add(&smooth.mul_scalar((eps / c as f64) as f32)?)?
        };
        match o.reduction {
            Reduction::None => Ok(loss),
            Reduction::Sum => loss.sum_all(),
            Reduction::Mean => {
                let denominator = match &row_weight {
                    None => counted.sum_all()?.to_dtype(DType::F32)?,
                    Some(wt) => wt.sum_all()?,
                };
                loss.sum_all()?.div(&denominator)
            }
        }
    }

    /// Validates cross-entropy's operands and options; returns the number of classes.
    fn check_cross_entropy(&self, targets: &Tensor, o: &CrossEntropyOptions) -> Result<usize> {
        let c = *self
            .shape()
            .last()
            .ok_or_else(|| Error::Msg("cross_entropy: logits are a scalar".into()))?;
        if targets.dtype() != DType::I64 {
            return Err(Error::DTypeMismatch {
                op: "cross_entropy",
                expected: DType::I64,
                got: targets.dtype(),
            });
        }
        if targets.shape() != &self.shape()[..self.rank() - 1] {
            return Err(Error::ShapeMismatch {
                op: "cross_entropy",
                lhs: self.shape().to_vec(),
                rhs: targets.shape().to_vec(),
            });
        }
        self.float_op("cross_entropy")?;
        if !(0.0..=1.0).contains(&o.label_smoothing) {
            bail!(
                "cross_entropy: label_smoothing must be in [0, 1], got {}",
                o.label_smoothing
            );
        }
        if let Some(w) = &o.weight {
            if w.shape() != [c] || !w.dtype().is_float() {
                bail!(
                    "cross_entropy: weight must be a float tensor of one value per class ([{c}]), got {} {:?}",
                    w.dtype(),
                    w.shape()
                );
            }
            if w.device() != self.device() {
                return Err(Error::DeviceMismatch {
                    op: "cross_entropy",
                    lhs: self.device(),
                    rhs: w.device(),
                });
            }
        }
        Ok(c)
    }

    /// Mean squared error against a target of the same shape.
    pub fn mse_loss(&self, target: &Tensor) -> Result<Tensor> {
        self.mse_loss_with(target, Reduction::Mean)
    }

    /// Squared error against a target of the same shape (no broadcasting, as PyTorch warns),
    /// reduced by `reduction`.
    pub fn mse_loss_with(&self, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
        if self.shape() != target.shape() {
            return Err(Error::ShapeMismatch {
                op: "mse_loss",
                lhs: self.shape().to_vec(),
                rhs: target.shape().to_vec(),
            });
        }
        let sq = self.sub(target)?.sqr()?;
        match reduction {
            Reduction::Mean => sq.mean_all(),
            Reduction::Sum => sq.sum_all(),
            Reduction::None => Ok(sq),
        }
    }
}
