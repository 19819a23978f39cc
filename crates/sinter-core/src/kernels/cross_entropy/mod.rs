//! Cross-entropy's fused primitive: each row's loss of logits [.., c] against i64 class
//! indices, softmax and negative log-likelihood in one pass that keeps only two f32 statistics
//! a row (max, ln Σ e^(x − max)) for the backward; everything about it in this folder.
//! `Tensor::cross_entropy_with` (in `loss.rs`) adds PyTorch's options on top in tensor ops.
//!
//! - `mod.rs` (here): the typed ops on the custom-op mechanism (no `BackendStorage` method),
//!   the one backward ((softmax − onehot)·g per row, from the saved statistics), and
//!   [`reference`], the f64 values every kernel test of every crate checks against.
//! - `cpu.rs`: the CPU rows over sinter-cpu's vectorised row kernels.
//! - `cuda.rs` and `cross_entropy.cu`: the CUDA kernels, their launches and declared traffic.
//! - `tests.rs`: both devices (the emulated one in CI) against [`reference`].
//!
//! A row's loss is ln Σ e^(x − max) − (x_t − max), never lse − x_t, so that a confident
//! prediction keeps its digits (issue 14). The llm.c-style classifier (`kernels/classifier/`)
//! computes the same loss in the compute dtype with its gradient in the same pass.

mod cpu;
mod cuda;

use std::sync::OnceLock;

use super::{cached, OpCache};
use crate::backend::{check_indices, IndexUse};
use crate::custom_op::{CustomOp, OutputSpec, TensorMeta};
use crate::tensor::output_of;
use crate::{no_grad, DType, Device, Result, Tensor};
pub use cuda::CROSS_ENTROPY_CU;

/// f32 statistics saved per row: the max, then ln Σ e^(x − max) (kept apart: their f32 sum
/// rounds at the max's scale, issue 30).
const STATS: usize = sinter_cpu::math::cross_entropy::STATS_PER_ROW;

const DTYPES: [DType; 4] = [DType::F32, DType::BF16, DType::F16, DType::I64];

/// (logits, targets) → (each row's loss, the rows' statistics).
fn forward_op(dtype: DType, ignore: i64) -> Result<CustomOp> {
    static OPS: OpCache<(DType, i64)> = OnceLock::new();
    cached(&OPS, (dtype, ignore), || {
        CustomOp::builder("cross_entropy")
            .inputs(2)
            .dtypes(&DTYPES)
            .outputs(|m: &[TensorMeta]| {
                Ok(vec![
                    OutputSpec::new(&m[1].shape, DType::F32),
                    OutputSpec::new(&[m[1].numel(), STATS], DType::F32),
                ])
            })
            .cpu(move |x| cpu::forward(x, ignore))
            .cuda(cuda::forward_kernel(dtype, ignore)?)
            .build()
    })
}

/// (logits, targets, stats, per-row loss gradient f32) → dlogits in the logits' dtype.
fn backward_op(dtype: DType, ignore: i64) -> Result<CustomOp> {
    static OPS: OpCache<(DType, i64)> = OnceLock::new();
    cached(&OPS, (dtype, ignore), || {
        CustomOp::builder("cross_entropy_backward")
            .inputs(4)
            .dtypes(&DTYPES)
            .outputs(|m| Ok(vec![OutputSpec::new(&m[0].shape, m[0].dtype)]))
            .cpu(move |x| cpu::backward(x, ignore))
            .cuda(cuda::backward_kernel(dtype, ignore)?)
            .build()
    })
}

/// Each row's loss (f32, in the targets' shape; 0 where the target is `ignore`) of float
/// `logits` [.., c] against i64 `targets` [..] on the same device, whose shapes the caller
/// checked (`checked`: the targets were also validated, on the host). Differentiable in the
/// logits. A target that is neither a class nor `ignore` is an error (on CUDA reported by the
/// next call that waits for the device).
pub(crate) fn row_losses(
    logits: &Tensor,
    targets: &Tensor,
    checked: bool,
    ignore: i64,
) -> Result<Tensor> {
    let c = logits.shape().last().copied().unwrap_or(1);
    if !checked {
        match targets.device() {
            Device::Cpu => {} // the CPU forward checks them on its way
            _ => super::launch::check_device_targets("cross_entropy", targets, c, ignore)?,
        }
    }
    if targets.numel() == 0 || c == 0 {
        // No row, or no class (so every row must be ignored): losses 0, no kernel.
        if c == 0 && targets.device() == Device::Cpu {
            check_indices(
                &targets.to_vec_i64()?,
                c,
                Some(ignore),
                IndexUse::CrossEntropy,
            )?;
        }
        let zero = Tensor::zeros(targets.shape(), DType::F32, targets.device())?;
        let x = logits.detach();
        return Ok(output_of(&zero, "cross_entropy", &[logits], move |_, _| {
            Ok(vec![Some(x.zeros_like()?)])
        }));
    }
    let mut out = {
        let _g = no_grad();
        forward_op(logits.dtype(), ignore)?.apply(&[&logits.detach(), &targets.detach()])?
    };
    let stats = out.pop().expect("two outputs");
    let loss = out.pop().expect("two outputs");
    let (x, t) = (logits.detach(), targets.detach());
    Ok(output_of(&loss, "cross_entropy", &[logits], move |g, _| {
        let g = if g.dtype() == DType::F32 {
            g.detach()
        } else {
            g.detach().to_dtype(DType::F32)?
        };
        let d = backward_op(x.dtype(), ignore)?.apply(&[&x, &t, &stats, &g])?;
        Ok(vec![d.into_iter().next()])
    }))
}

/// Cross-entropy in f64 over row-major rows of c, written from its definition: the one
/// reference of the op's kernel tests in every crate.
pub mod reference {
    /// Each row's loss ln Σ e^(x − max) − (x_t − max) (−log softmax(x)_t; 0 for an ignored
    /// row, NaN for a target out of range).
    pub fn forward(logits: &[f64], targets: &[i64], c: usize, ignore: i64) -> Vec<f64> {
        logits
            .chunks(c.max(1))
            .zip(targets)
            .map(|(row, &t)| {
                if t == ignore {
                    return 0.0;
                }
                if t < 0 || t as usize >= c {
                    return f64::NAN;
                }
                let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let log_sum = row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
                log_sum - (row[t as usize] - m)
            })
            .collect()
    }

    /// d Σ_r g_r·loss_r / d logits = (softmax(x_r) − onehot(t_r))·g_r (0 for ignored rows).
    pub fn backward(logits: &[f64], targets: &[i64], c: usize, ignore: i64, g: &[f64]) -> Vec<f64> {
        let mut d = Vec::with_capacity(logits.len());
        for ((row, &t), &gr) in logits.chunks(c.max(1)).zip(targets).zip(g) {
            if t == ignore {
                d.extend(std::iter::repeat_n(0.0, row.len()));
                continue;
            }
            let p = crate::kernels::softmax::reference::forward(row, c, false);
            d.extend(
                p.iter()
                    .enumerate()
                    .map(|(j, p)| (p - (j as i64 == t) as u8 as f64) * gr),
            );
        }
        d
    }
}

#[cfg(test)]
mod tests;
