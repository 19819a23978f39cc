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
//! On CUDA the forward is one kernel (`kernels/residual_layernorm.cu`) and the backward is
//! LayerNorm's deterministic kernels on the saved sum.

use rayon::prelude::*;

use super::{f32_values, float_input, same_shape};
use crate::cpu::{self, CpuStorage};
use crate::storage::Storage;
use crate::tensor::output;
use crate::{Error, Result, Tensor};

/// Returns (sum, normed) for rows of length n: sum = x + r, normed = LN(sum), and the
/// per-row (mean, rstd).
fn kernel(
    x: &[f32],
    r: &[f32],
    gamma: &[f32],
    beta: &[f32],
    n: usize,
    eps: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len() / n.max(1);
    let mut sum = vec![0f32; x.len()];
    let mut y = vec![0f32; x.len()];
    let mut stats = vec![(0f32, 0f32); rows];
    type Row<'a> = (usize, ((&'a mut [f32], &'a mut [f32]), &'a mut (f32, f32)));
    let body = |(i, ((s, o), st)): Row| {
        let (xr, rr) = (&x[i * n..(i + 1) * n], &r[i * n..(i + 1) * n]);
        let mut acc = 0f64;
        for j in 0..n {
            s[j] = xr[j] + rr[j];
            acc += s[j] as f64;
        }
        // The same arithmetic as cpu::nn::layer_norm, so the values match the composite exactly.
        let mean = (acc / n as f64) as f32;
        let var = (s.iter().map(|&v| ((v - mean) as f64).powi(2)).sum::<f64>() / n as f64) as f32;
        let rstd = 1.0 / (var + eps).sqrt();
        for j in 0..n {
            o[j] = (s[j] - mean) * rstd * gamma[j] + beta[j];
        }
        *st = (mean, rstd);
    };
    if n > 0 {
        if x.len() >= cpu::PAR_THRESHOLD {
            sum.par_chunks_mut(n)
                .zip(y.par_chunks_mut(n))
                .zip(stats.par_iter_mut())
                .with_min_len((4096 / n).max(1))
                .enumerate()
                .for_each(body);
        } else {
            sum.chunks_mut(n)
                .zip(y.chunks_mut(n))
                .zip(stats.iter_mut())
                .enumerate()
                .for_each(body);
        }
    }
    let (mean, rstd) = stats.into_iter().unzip();
    (sum, y, mean, rstd)
}

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
    if [x, residual, gamma, beta]
        .iter()
        .any(|t| t.device().is_cuda())
    {
        return crate::cuda::fused::residual_layer_norm(x, residual, gamma, beta, n, eps);
    }
    let (s, y, mean, rstd) = kernel(
        &f32_values(x),
        &f32_values(residual),
        &f32_values(gamma),
        &f32_values(beta),
        n,
        eps,
    );
    let dtype = x.dtype();
    let shape = x.shape().to_vec();
    let sum = output(
        Storage::Cpu(CpuStorage::from_f32(s, dtype)),
        &shape,
        "residual_add",
        &[x, residual],
        |g, _| Ok(vec![Some(g.clone()), Some(g.clone())]),
    );
    let (st, gt) = (sum.clone(), gamma.clone());
    let want = (gamma.tracks_grad(), beta.tracks_grad());
    let (gdt, bdt) = (gamma.dtype(), beta.dtype());
    let normed = output(
        Storage::Cpu(CpuStorage::from_f32(y, dtype)),
        &shape,
        "residual_layer_norm",
        &[&sum, gamma, beta],
        move |g, _| {
            let (dx, dg, db) = cpu::nn::layer_norm_backward(
                &f32_values(&st),
                &f32_values(&gt),
                &mean,
                &rstd,
                &f32_values(g),
                n,
            );
            Ok(vec![
                Some(Tensor::from_cpu(
                    CpuStorage::from_f32(dx, dtype),
                    st.shape(),
                )),
                want.0
                    .then(|| Tensor::from_cpu(CpuStorage::from_f32(dg, gdt), &[n])),
                want.1
                    .then(|| Tensor::from_cpu(CpuStorage::from_f32(db, bdt), &[n])),
            ])
        },
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
