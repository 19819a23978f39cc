//! Residual add + LayerNorm in one pass.
//!
//! Reads: x and residual [..., n], gamma and beta [n].
//! Writes: sum = x + residual (the new residual stream) and normed = LayerNorm(sum)·gamma +
//! beta, plus one (mean, 1/std) pair per row for the backward pass.
//! Why it is fast: the composite reads x and residual, writes the sum, then reads the sum
//! again twice (statistics, normalisation). Here each row is added, reduced and normalised
//! while it is in cache: one read of each input, one write of each output. Rows run on all
//! cores. The backward pass is the LayerNorm backward (one pass, deterministic parameter
//! sums) whose gradient joins the sum's own gradient, and the add passes it through to both
//! inputs without a copy. The values are bit-identical to `x.add(residual)?.layer_norm(..)`.
//! The backward is `layer_norm`'s rule on the saved sum (one rule for both ops). On CUDA the
//! forward is one kernel (`kernels/residual_layernorm.cu`).

use super::{float_input, same_shape};
use crate::nn_ops::layer_norm_grads;
use crate::tensor::output;
use crate::{Error, Result, Tensor};

/// (x + residual, LayerNorm(x + residual)) over the last dimension, in one pass. Both outputs
/// are differentiable; gradients reaching either flow to x, residual, gamma and beta.
pub fn residual_layer_norm(
    x: &Tensor,
    residual: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    same_shape("residual_layer_norm", x, residual)?;
    float_input("residual_layer_norm", x)?;
    // Mixed floats (an f32 residual stream and a half-precision sub-layer output under
    // autocast) promote as the reference's `x + residual` does.
    if let Some((x, r)) = crate::amp::promote_operands(x, residual)? {
        return residual_layer_norm(&x, &r, gamma, beta, eps);
    }
    if x.dtype() != residual.dtype() {
        return Err(Error::DTypeMismatch {
            op: "residual_layer_norm",
            expected: x.dtype(),
            got: residual.dtype(),
        });
    }
    let n = *x
        .shape()
        .last()
        .ok_or_else(|| Error::Msg("residual_layer_norm: input is a scalar".into()))?;
    for p in [gamma, beta] {
        if p.shape() != [n] {
            return Err(Error::ShapeMismatch {
                op: "residual_layer_norm",
                lhs: x.shape().to_vec(),
                rhs: p.shape().to_vec(),
            });
        }
    }
    let (s, y, stats) = x.storage().residual_layer_norm(
        x.layout(),
        &residual.storage(),
        residual.layout(),
        &gamma.storage(),
        gamma.layout(),
        &beta.storage(),
        beta.layout(),
        eps,
    )?;
    let shape = x.shape().to_vec();
    let sum = output(s, &shape, "residual_add", &[x, residual], |g, _| {
        Ok(vec![Some(g.clone()), Some(g.clone())])
    });
    let (st, gt, bt) = (sum.clone(), gamma.clone(), beta.clone());
    let normed = output(
        y,
        &shape,
        "residual_layer_norm",
        &[&sum, gamma, beta],
        move |g, _| layer_norm_grads(&st, &gt, &bt, &stats, g, true),
    );
    Ok((sum, normed))
}

/// The composite reference: `(x + residual, (x + residual).layer_norm(gamma, beta, eps))`.
pub fn residual_layer_norm_reference(
    x: &Tensor,
    residual: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    let sum = x.add(residual)?;
    let normed = sum.layer_norm(gamma, beta, eps)?;
    Ok((sum, normed))
}
