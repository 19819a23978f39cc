//! The fused classifier (llm.c's `fused_classifier`, issue 24 item 2): the mean cross-entropy
//! of logits [rows, n] in the compute dtype (f32, bf16, f16) against class indices, with its
//! gradient dlogits = (softmax − onehot) · dloss_scale computed in the same pass and written in
//! the compute dtype over the logits themselves (on CUDA; the CPU writes a fresh buffer). No
//! fp32 probabilities, no second [rows, n] buffer, and the backward does nothing more when its
//! upstream gradient is 1.
//!
//! - `mod.rs` (here): the typed op on the custom-op mechanism (no `BackendStorage` method), its
//!   backward, and [`reference`], the composite it must match (log-softmax, pick, mean).
//! - `cpu.rs`: the CPU loops; `cuda.rs` and `classifier.cu`: the CUDA kernels.
//!
//! Columns `valid..n` are padding: a vocabulary rounded up to a multiple of 128 so the LM
//! head's GEMMs meet cuBLASLt's alignment (GPT-2's 50257 → 50304, [`padded_vocab`]); they
//! count as −∞ in the softmax and get gradient 0.
//!
//! The logits are consumed: after the call their memory holds the gradient (on CUDA). A second
//! backward pass through the same loss is refused (the gradient was handed on).

mod cpu;
mod cuda;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use super::{cached, OpCache};
use crate::backend::{check_indices, IndexUse};
use crate::custom_op::{CustomOp, OutputSpec};
use crate::{bail, no_grad, with_custom_backward, DType, Device, Result, Tensor};
pub use cuda::CLASSIFIER_CU;

/// The vocabulary rounded up to the next multiple of 128 (llm.c's padded vocabulary).
pub fn padded_vocab(v: usize) -> usize {
    v.div_ceil(128) * 128
}

/// What [`fused_classifier`] returns.
pub struct ClassifierLoss {
    /// The mean loss over the counted rows (f32, scalar); differentiable in the logits.
    pub loss: Tensor,
    /// Each row's loss (f32, [rows], 0 where ignored); not differentiable.
    pub rows: Tensor,
}

const DTYPES: [DType; 4] = [DType::F32, DType::BF16, DType::F16, DType::I64];

/// The forward op for (valid, ignore): inputs (logits, targets, scale [1] f32), outputs (loss
/// rows f32, dlogits in place of the logits). Built once per pair and cached.
fn forward_op(dtype: DType, valid: usize, ignore: i64) -> Result<CustomOp> {
    static OPS: OpCache<(DType, usize, i64)> = OnceLock::new();
    cached(&OPS, (dtype, valid, ignore), || {
        CustomOp::builder("fused_classifier")
            .inputs(3)
            .dtypes(&DTYPES)
            .outputs(|m| {
                Ok(vec![
                    OutputSpec::new(&m[0].shape[..1], DType::F32),
                    OutputSpec::new(&m[0].shape, m[0].dtype).in_place(0),
                ])
            })
            .cpu(move |x| cpu::forward(x, valid, ignore))
            .cuda(cuda::forward_kernel(dtype, valid, ignore)?)
            .build()
    })
}

/// The backward's op: d · g[0] (in place of d on CUDA; nothing runs when g[0] == 1).
fn grad_scale_op(dtype: DType) -> Result<CustomOp> {
    static OPS: OpCache<DType> = OnceLock::new();
    cached(&OPS, dtype, || {
        CustomOp::builder("fused_classifier_grad_scale")
            .inputs(2)
            .dtypes(&DTYPES)
            .outputs(|m| Ok(vec![OutputSpec::new(&m[0].shape, m[0].dtype).in_place(0)]))
            .cpu(cpu::grad_scale)
            .cuda(cuda::grad_scale_kernel(dtype)?)
            .build()
    })
}

/// Checks the operands; returns (rows, n).
fn check(logits: &Tensor, targets: &Tensor, valid: usize) -> Result<(usize, usize)> {
    let (rows, n) = match logits.shape() {
        &[r, n] => (r, n),
        s => bail!("fused_classifier: logits must be [rows, vocab], got {s:?}"),
    };
    if ![DType::F32, DType::BF16, DType::F16].contains(&logits.dtype()) {
        bail!(
            "fused_classifier: logits are {}; use f32, bf16 or f16",
            logits.dtype()
        );
    }
    if targets.dtype() != DType::I64 || targets.shape() != [rows] {
        bail!(
            "fused_classifier: targets must be i64 [{rows}] (one class per logits row), got {} {:?}",
            targets.dtype(),
            targets.shape()
        );
    }
    if valid == 0 || valid > n {
        bail!("fused_classifier: {valid} valid classes for logits {n} wide; need 1..={n}");
    }
    if targets.device() != logits.device() {
        bail!(
            "fused_classifier: targets are on {}, the logits on {}; move them with to_device",
            targets.device(),
            logits.device()
        );
    }
    Ok((rows, n))
}

/// The mean cross-entropy of `logits` [rows, n] (columns `valid..n` padding) against
/// `targets` [rows] (i64; rows at `ignore_index` count for nothing, a mean over none is NaN,
/// as in PyTorch), and each row's loss. The logits' memory is consumed (see the module docs).
pub fn fused_classifier(
    logits: &Tensor,
    targets: &Tensor,
    valid: usize,
    ignore_index: i64,
) -> Result<ClassifierLoss> {
    let (rows, _) = check(logits, targets, valid)?;
    let what = IndexUse::CrossEntropy;
    match targets.device() {
        Device::Cpu => check_indices(&targets.to_vec_i64()?, valid, Some(ignore_index), what)?,
        _ => super::launch::check_device_targets("fused_classifier", targets, valid, ignore_index)?,
    }
    let dev = logits.device();
    let (out, count) = {
        let _g = no_grad();
        let ignore = Tensor::full(ignore_index as f64, &[], DType::I64, dev)?;
        let count = targets.ne(&ignore)?.sum_all()?.to_dtype(DType::F32)?;
        let scale = count.recip()?.reshape(&[1])?;
        let op = forward_op(logits.dtype(), valid, ignore_index)?;
        (op.apply(&[&logits.detach(), targets, &scale])?, count)
    };
    let (loss_rows, dlogits) = (out[0].clone(), out[1].clone());
    let mean = {
        let _g = no_grad();
        loss_rows.sum_all()?.div(&count)?
    };
    debug_assert_eq!(loss_rows.shape(), [rows]);
    let loss = if logits.tracks_grad() && crate::is_grad_enabled() {
        let used = Arc::new(AtomicBool::new(false));
        with_custom_backward(&mean, "fused_classifier", &[logits], move |g, _| {
            if used.swap(true, Ordering::SeqCst) {
                bail!(
                    "fused_classifier: a second backward through the same loss (its gradient was handed on in place); compute the loss again"
                );
            }
            let g = g.to_dtype(DType::F32)?.reshape(&[1])?;
            let d = grad_scale_op(dlogits.dtype())?.apply(&[&dlogits, &g])?;
            Ok(vec![d.into_iter().next()])
        })
    } else {
        mean
    };
    Ok(ClassifierLoss {
        loss,
        rows: loss_rows,
    })
}

/// The composite the fused op must match: f32 log-softmax over the first `valid` columns, the
/// target's log-probability picked by a one-hot mask, the mean over counted rows. Autograd
/// gives its gradient (0 in the padding columns).
pub fn reference(
    logits: &Tensor,
    targets: &Tensor,
    valid: usize,
    ignore_index: i64,
) -> Result<Tensor> {
    let (rows, _) = check(logits, targets, valid)?;
    let dev = logits.device();
    let lp = logits
        .narrow(1, 0, valid)?
        .to_dtype(DType::F32)?
        .log_softmax(-1)?;
    let classes = Tensor::arange(0.0, valid as f64, 1.0, DType::I64, dev)?.reshape(&[1, valid])?;
    let onehot = targets
        .reshape(&[rows, 1])?
        .eq(&classes)?
        .to_dtype(DType::F32)?;
    let ignore = Tensor::full(ignore_index as f64, &[], DType::I64, dev)?;
    let count = targets.ne(&ignore)?.to_dtype(DType::F32)?.sum_all()?;
    lp.mul(&onehot)?.sum_all()?.neg()?.div(&count)
}

#[cfg(test)]
mod tests;
