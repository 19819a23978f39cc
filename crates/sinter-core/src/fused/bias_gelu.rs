//! Bias add + GELU (tanh approximation, GPT-2's) in one pass.
//!
//! Reads: x [..., n] (a matrix product without its bias) and bias [n].
//! Writes: y = gelu(x + bias). The backward pass needs the pre-activation u = x + bias; the
//! graph already keeps x (it is this op's input), so u is re-derived from x and bias in the
//! backward pass (one add per element) instead of being stored a second time.
//! Why it is fast: the composite `x.add(bias)?.gelu()` writes the pre-activation to memory
//! and reads it back, and keeps both x and x + bias alive for backward; here each element is
//! biased and activated in registers (one read, one write, half the saved activations), and
//! the backward pass produces dx and the bias gradient together, the latter summed over fixed
//! row chunks so it is deterministic. Values are bit-identical to the composite.

use rayon::prelude::*;

use super::float_input;
use crate::cpu::{self, CpuStorage};
use crate::op::UnaryOp;
use crate::storage::Storage;
use crate::tensor::output;
use crate::{Error, Result, Tensor};

const GELU: UnaryOp = UnaryOp::GeluTanh;

/// Rows per task in the backward pass (also the fixed grouping of the bias-gradient sum).
const CHUNK_ROWS: usize = 64;

/// gelu(x + bias) with `bias` broadcast over the last dimension; differentiable in both.
pub fn bias_gelu(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    float_input("bias_gelu", x)?;
    let n = *x
        .shape()
        .last()
        .ok_or_else(|| Error::Msg("bias_gelu: input is a scalar".into()))?;
    if bias.shape() != [n] {
        return Err(Error::ShapeMismatch {
            op: "bias_gelu",
            lhs: x.shape().to_vec(),
            rhs: bias.shape().to_vec(),
        });
    }
    if x.dtype() != bias.dtype() {
        return Err(Error::DTypeMismatch {
            op: "bias_gelu",
            expected: x.dtype(),
            got: bias.dtype(),
        });
    }
    if x.device().is_cuda() || bias.device().is_cuda() {
        return bias_gelu_reference(x, bias);
    }
    let y = {
        let (xs, bs) = (x.storage(), bias.storage());
        let (xv, bv) = (
            xs.cpu().f32_contiguous(x.layout()),
            bs.cpu().f32_contiguous(bias.layout()),
        );
        let mut y = vec![0f32; xv.len()];
        let body = |(r, o): (usize, &mut [f32])| {
            for ((o, &xi), &bi) in o.iter_mut().zip(&xv[r * n..(r + 1) * n]).zip(bv.iter()) {
                *o = GELU.apply(xi + bi);
            }
        };
        if n > 0 {
            if y.len() >= cpu::PAR_THRESHOLD {
                y.par_chunks_mut(n)
                    .with_min_len((4096 / n).max(1))
                    .enumerate()
                    .for_each(body);
            } else {
                y.chunks_mut(n).enumerate().for_each(body);
            }
        }
        y
    };
    let (xt, bt) = (x.clone(), bias.clone());
    let dtype = x.dtype();
    Ok(output(
        Storage::Cpu(CpuStorage::from_f32(y, dtype)),
        x.shape(),
        "bias_gelu",
        &[x, bias],
        move |g, _| {
            let (xs, bs, gs) = (xt.storage(), bt.storage(), g.storage());
            let (xv, bv, gv) = (
                xs.cpu().f32_contiguous(xt.layout()),
                bs.cpu().f32_contiguous(bt.layout()),
                gs.cpu().f32_contiguous(g.layout()),
            );
            let mut dx = vec![0f32; xv.len()];
            if n == 0 {
                return Ok(vec![
                    Some(Tensor::from_cpu(
                        CpuStorage::from_f32(dx, dtype),
                        xt.shape(),
                    )),
                    Some(bt.zeros_like()?),
                ]);
            }
            let partials: Vec<Vec<f32>> = dx
                .par_chunks_mut(CHUNK_ROWS * n)
                .enumerate()
                .map(|(c, d)| {
                    let mut db = vec![0f32; n];
                    for (local, row) in d.chunks_mut(n).enumerate() {
                        let at = (c * CHUNK_ROWS + local) * n;
                        let (xr, gr) = (&xv[at..at + n], &gv[at..at + n]);
                        for j in 0..n {
                            let du = gr[j] * gelu_tanh_grad(xr[j] + bv[j]);
                            row[j] = du;
                            db[j] += du;
                        }
                    }
                    db
                })
                .collect();
            let mut db = vec![0f32; n];
            for p in partials {
                db.iter_mut().zip(p).for_each(|(a, b)| *a += b);
            }
            Ok(vec![
                Some(Tensor::from_cpu(
                    CpuStorage::from_f32(dx, dtype),
                    xt.shape(),
                )),
                bt.tracks_grad()
                    .then(|| Tensor::from_cpu(CpuStorage::from_f32(db, bt.dtype()), &[n])),
            ])
        },
    ))
}

/// d gelu_tanh(u) / du in f32 (the composite evaluates the same formula in f64).
#[inline]
fn gelu_tanh_grad(u: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    let u2 = u * u;
    let t = (C * (u + 0.044715 * u2 * u)).tanh();
    0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * C * (1.0 + 3.0 * 0.044715 * u2)
}

/// The composite reference: `x.add(bias)?.gelu()`.
pub fn bias_gelu_reference(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.add(bias)?.gelu()
}
