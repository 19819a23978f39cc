//! LayerNorm over the last dimension, and the pre-LN Transformer's residual add + LayerNorm in
//! one pass: everything about the op in this folder.
//!
//! - `mod.rs` (here): the typed ops on the custom-op mechanism (no `BackendStorage` method),
//!   the one backward rule (for both ops: the residual op's backward is LayerNorm's on the saved
//!   sum), the composite [`residual_layer_norm_reference`], and [`reference`], the f64 values
//!   every kernel test of every crate checks against.
//! - `cpu.rs`: the CPU forwards over sinter-cpu's vectorised row kernels.
//! - `cuda.rs` and `layer_norm.cu`: the CUDA kernels, their launches and declared traffic.
//! - `tests.rs`: both devices (the emulated one in CI) against [`reference`].
//!
//! Statistics are f32 (mean and 1/std per row, saved for the backward) whatever the dtype. On
//! the CPU the arithmetic is f32 throughout and the parameter gradients come out in f32; on
//! CUDA the kernels read f32 gamma and beta as they are (autocast's half-precision activations
//! with f32 master parameters: no cast kernels, and dgamma/dbeta summed and stored in f32),
//! and parameters of any other dtype in x's dtype. Gradients are cast to the parameters'
//! dtypes where they differ.

mod cpu;
mod cuda;

use std::sync::OnceLock;

use super::{cached, OpCache, FLOATS};
use crate::custom_op::{CustomOp, OutputSpec, TensorMeta};
use crate::tensor::output_of;
use crate::{no_grad, DType, Device, Error, Result, Tensor};
pub use cuda::LAYER_NORM_CU;

/// The per-row statistics output of x (`[rows]` f32).
fn stats_spec(x: &TensorMeta) -> OutputSpec {
    let n = x.shape.last().copied().unwrap_or(1).max(1);
    OutputSpec::new(&[x.numel() / n], DType::F32)
}

/// (x, gamma, beta) → (y, mean, rstd); `dt`: x's and the parameters' dtypes (on CUDA).
fn forward_op(dt: (DType, DType), eps: f32) -> Result<CustomOp> {
    static OPS: OpCache<(DType, DType, u32)> = OnceLock::new();
    cached(&OPS, (dt.0, dt.1, eps.to_bits()), || {
        CustomOp::builder("layer_norm")
            .inputs(3)
            .dtypes(&FLOATS)
            .outputs(|m| {
                let s = stats_spec(&m[0]);
                Ok(vec![OutputSpec::new(&m[0].shape, m[0].dtype), s.clone(), s])
            })
            .cpu(move |x| cpu::forward(x, eps))
            .cuda(cuda::forward_kernel(dt, eps)?)
            .build()
    })
}

/// (x, residual, gamma, beta) → (x + residual, LayerNorm of it, mean, rstd); `dt` as for
/// [`forward_op`].
fn residual_op(dt: (DType, DType), eps: f32) -> Result<CustomOp> {
    static OPS: OpCache<(DType, DType, u32)> = OnceLock::new();
    cached(&OPS, (dt.0, dt.1, eps.to_bits()), || {
        CustomOp::builder("residual_layer_norm")
            .inputs(4)
            .dtypes(&FLOATS)
            .outputs(|m| {
                let (y, s) = (OutputSpec::new(&m[0].shape, m[0].dtype), stats_spec(&m[0]));
                Ok(vec![y.clone(), y, s.clone(), s])
            })
            .cpu(move |x| cpu::residual_forward(x, eps))
            .cuda(cuda::residual_forward_kernel(dt, eps)?)
            .build()
    })
}

/// The CPU backward, one pass: (gy, x, gamma, mean, rstd) → (dx, dgamma f32, dbeta f32).
fn cpu_backward_op() -> Result<CustomOp> {
    static OPS: OpCache<()> = OnceLock::new();
    cached(&OPS, (), || {
        let n = |m: &TensorMeta| m.shape.last().copied().unwrap_or(1);
        CustomOp::builder("layer_norm_backward")
            .inputs(5)
            .dtypes(&FLOATS)
            .outputs(move |m| {
                let p = OutputSpec::new(&[n(&m[1])], DType::F32);
                Ok(vec![OutputSpec::new(&m[1].shape, m[1].dtype), p.clone(), p])
            })
            .cpu(cpu::backward)
            .build()
    })
}

/// The CUDA backward's kernels for x in `dt.0` and the parameters in `dt.1`: dx from (x,
/// gamma, gy, mean, rstd); the partial column sums from (x, gy, mean, rstd); (dgamma, dbeta),
/// in the parameters' dtype, from the partial sums; and dx with the partial sums in one pass
/// (where its shared memory fits), from dx's inputs.
fn cuda_backward_ops(dt: (DType, DType)) -> Result<[CustomOp; 4]> {
    static OPS: OpCache<(DType, DType), [CustomOp; 4]> = OnceLock::new();
    let (dtype, param) = dt;
    cached(&OPS, dt, || {
        let like_x = |m: &[TensorMeta]| Ok(vec![OutputSpec::new(&m[0].shape, m[0].dtype)]);
        let dx = CustomOp::builder("layer_norm_backward_dx")
            .inputs(5)
            .dtypes(&FLOATS)
            .outputs(like_x)
            .cuda(cuda::dx_kernel(dt)?)
            .build()?;
        let params = CustomOp::builder("layer_norm_backward_params")
            .inputs(4)
            .dtypes(&FLOATS)
            .outputs(|m| {
                let (chunks, _) = cuda::param_chunks(&m[0])?;
                let n = m[0].shape.last().copied().unwrap_or(1);
                let part = OutputSpec::new(&[chunks, n], DType::F32);
                Ok(vec![part.clone(), part])
            })
            .cuda(cuda::params_kernel(dtype)?)
            .build()?;
        let finish = CustomOp::builder("layer_norm_backward_finish")
            .inputs(2)
            .dtypes(&FLOATS)
            .outputs(move |m| {
                let p = OutputSpec::new(&m[0].shape[1..], param);
                Ok(vec![p.clone(), p])
            })
            .cuda(cuda::finish_kernel(param)?)
            .build()?;
        let fused = CustomOp::builder("layer_norm_backward")
            .inputs(5)
            .dtypes(&FLOATS)
            .outputs(|m| {
                let n = m[0].shape.last().copied().unwrap_or(1);
                let blocks = cuda::fused_partials(&m[0])?.ok_or_else(|| {
                    Error::Msg("layer_norm backward: the one-pass kernel does not fit".into())
                })?;
                let part = OutputSpec::new(&[blocks, n], DType::F32);
                Ok(vec![
                    OutputSpec::new(&m[0].shape, m[0].dtype),
                    part.clone(),
                    part,
                ])
            })
            .cuda(cuda::fused_backward_kernel(dt)?)
            .build()?;
        Ok([dx, params, finish, fused])
    })
}

/// `t` in `dtype` (itself when it already is).
fn as_dtype(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype {
        Ok(t.clone())
    } else {
        t.to_dtype(dtype)
    }
}

/// An operand as the op's kernels take it: detached, and on CUDA in `dtype` (the CPU reads
/// every float dtype as f32 itself).
fn operand(t: &Tensor, x: &Tensor, dtype: DType) -> Result<Tensor> {
    match x.device() {
        Device::Cpu => Ok(t.detach()),
        _ => as_dtype(&t.detach(), dtype),
    }
}

/// The dtypes the kernels run in: x's, and the parameters': f32 when gamma and beta are both
/// f32 (autocast's master parameters, read without a cast), else x's.
fn kernel_dtypes(x: &Tensor, gamma: &Tensor, beta: &Tensor) -> (DType, DType) {
    let f32_params = gamma.dtype() == DType::F32 && beta.dtype() == DType::F32;
    (x.dtype(), if f32_params { DType::F32 } else { x.dtype() })
}

/// The forward's row statistics, kept for the backward.
struct Stats {
    mean: Tensor,
    rstd: Tensor,
}

/// The one backward rule (LayerNorm's and the residual op's): the gradients of x (when
/// `want_x`), gamma and beta from the output gradient `g`, the parameters' in their dtypes.
fn grads(
    (x, gamma, beta): (&Tensor, &Tensor, &Tensor),
    stats: &Stats,
    g: &Tensor,
    want_x: bool,
) -> Result<Vec<Option<Tensor>>> {
    let (want_g, want_b) = (gamma.tracks_grad(), beta.tracks_grad());
    let dt = kernel_dtypes(x, gamma, beta);
    let (xd, gam, gy) = (x.detach(), operand(gamma, x, dt.1)?, operand(g, x, dt.0)?);
    let (mean, rstd) = (&stats.mean, &stats.rstd);
    let (dx, dg, db) = if x.device() == Device::Cpu {
        let [dx, dg, db]: [Tensor; 3] = cpu_backward_op()?
            .apply(&[&gy, &xd, &gam, mean, rstd])?
            .try_into()
            .map_err(|_| Error::Msg("layer_norm_backward: three outputs".into()))?;
        (Some(dx), Some(dg), Some(db))
    } else {
        cuda_grads(dt, (&xd, &gam, &gy), stats, want_x, want_g || want_b)?
    };
    let param = |d: Option<Tensor>, want: bool, like: &Tensor| {
        d.filter(|_| want)
            .map(|d| as_dtype(&d, like.dtype()))
            .transpose()
    };
    Ok(vec![
        dx.filter(|_| want_x),
        param(dg, want_g, gamma)?,
        param(db, want_b, beta)?,
    ])
}

/// The CUDA backward: (dx when `want_x`, dgamma and dbeta when `want_params`), the parameters'
/// in `dt.1`. One pass over x and gy for all three where the one-pass kernel fits, else dx and
/// the parameters' partial sums each from their own.
fn cuda_grads(
    dt: (DType, DType),
    (x, gamma, gy): (&Tensor, &Tensor, &Tensor),
    stats: &Stats,
    want_x: bool,
    want_params: bool,
) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    let [dx_op, params, finish, fused] = cuda_backward_ops(dt)?;
    let (mean, rstd) = (&stats.mean, &stats.rstd);
    let finish = |pg: &Tensor, pb: &Tensor| -> Result<(Option<Tensor>, Option<Tensor>)> {
        let mut f = finish.apply(&[pg, pb])?.into_iter();
        Ok((f.next(), f.next()))
    };
    let meta = TensorMeta {
        shape: x.shape().to_vec(),
        dtype: x.dtype(),
        device: x.device(),
    };
    if want_x && want_params && cuda::fused_partials(&meta)?.is_some() {
        let [dx, pg, pb]: [Tensor; 3] = fused
            .apply(&[x, gamma, gy, mean, rstd])?
            .try_into()
            .map_err(|_| Error::Msg("layer_norm_backward: three outputs".into()))?;
        let (dg, db) = finish(&pg, &pb)?;
        return Ok((Some(dx), dg, db));
    }
    let dx = want_x
        .then(|| dx_op.apply(&[x, gamma, gy, mean, rstd]))
        .transpose()?
        .map(|mut v| v.remove(0));
    let (dg, db) = if want_params {
        let p = params.apply(&[x, gy, mean, rstd])?;
        finish(&p[0], &p[1])?
    } else {
        (None, None)
    };
    Ok((dx, dg, db))
}

/// An error unless gamma and beta are `[n]`, n being x's (non-empty) last dimension.
fn check_params(op: &'static str, x: &Tensor, gamma: &Tensor, beta: &Tensor) -> Result<()> {
    let n = *x
        .shape()
        .last()
        .ok_or_else(|| Error::Msg(format!("{op}: input is a scalar")))?;
    if n == 0 {
        crate::bail!("{op}: the normalised dimension of {:?} is empty", x.shape());
    }
    for p in [gamma, beta] {
        if p.shape() != [n] {
            return Err(Error::ShapeMismatch {
                op,
                lhs: x.shape().to_vec(),
                rhs: p.shape().to_vec(),
            });
        }
    }
    for t in [x, gamma, beta] {
        t.float_op(op)?;
    }
    Ok(())
}

/// LayerNorm over the last dimension with affine gamma and beta of that size
/// (`Tensor::layer_norm`).
pub fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
    check_params("layer_norm", x, gamma, beta)?;
    let mut out = {
        let _g = no_grad();
        let dt = kernel_dtypes(x, gamma, beta);
        let (gam, bet) = (operand(gamma, x, dt.1)?, operand(beta, x, dt.1)?);
        forward_op(dt, eps)?.apply(&[&x.detach(), &gam, &bet])?
    };
    let stats = Stats {
        rstd: out.pop().expect("three outputs"),
        mean: out.pop().expect("three outputs"),
    };
    let y = out.pop().expect("three outputs");
    let (xt, gt, bt) = (x.clone(), gamma.clone(), beta.clone());
    Ok(output_of(
        &y,
        "layer_norm",
        &[x, gamma, beta],
        move |g, _| grads((&xt, &gt, &bt), &stats, g, xt.tracks_grad()),
    ))
}

/// (x + residual, LayerNorm(x + residual)) over the last dimension, in one pass. Both outputs
/// are differentiable; gradients reaching either flow to x, residual, gamma and beta. The
/// values are bit-identical to [`residual_layer_norm_reference`]'s.
pub fn residual_layer_norm(
    x: &Tensor,
    residual: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    let op = "residual_layer_norm";
    if x.shape() != residual.shape() {
        return Err(Error::ShapeMismatch {
            op,
            lhs: x.shape().to_vec(),
            rhs: residual.shape().to_vec(),
        });
    }
    // Mixed floats (an f32 residual stream and a half-precision sub-layer output under
    // autocast) promote as the reference's `x + residual` does.
    if let Some((x, r)) = crate::amp::promote_operands(x, residual)? {
        return residual_layer_norm(&x, &r, gamma, beta, eps);
    }
    if x.dtype() != residual.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            expected: x.dtype(),
            got: residual.dtype(),
        });
    }
    check_params(op, x, gamma, beta)?;
    let mut out = {
        let _g = no_grad();
        let dt = kernel_dtypes(x, gamma, beta);
        let (gam, bet) = (operand(gamma, x, dt.1)?, operand(beta, x, dt.1)?);
        residual_op(dt, eps)?.apply(&[&x.detach(), &residual.detach(), &gam, &bet])?
    };
    let stats = Stats {
        rstd: out.pop().expect("four outputs"),
        mean: out.pop().expect("four outputs"),
    };
    let (y, s) = (
        out.pop().expect("four outputs"),
        out.pop().expect("four outputs"),
    );
    // The add passes the sum's gradient through to both inputs without a copy.
    let sum = output_of(&s, "residual_add", &[x, residual], |g, _| {
        Ok(vec![Some(g.clone()), Some(g.clone())])
    });
    let (st, gt, bt) = (sum.clone(), gamma.clone(), beta.clone());
    let normed = output_of(&y, op, &[&sum, gamma, beta], move |g, _| {
        grads((&st, &gt, &bt), &stats, g, true)
    });
    Ok((sum, normed))
}

/// The composite [`residual_layer_norm`] must match: `(x + residual, (x + residual).layer_norm(
/// gamma, beta, eps))`.
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

/// LayerNorm in f64 over row-major rows of n (biased variance), written from its definition:
/// the one reference of the op's kernel tests in every crate.
pub mod reference {
    /// (y, mean, rstd) with y = (x − mean)·rstd·gamma + beta, rstd = 1/√(var + eps).
    pub fn forward(
        x: &[f64],
        gamma: &[f64],
        beta: &[f64],
        n: usize,
        eps: f64,
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let (mut y, mut mean, mut rstd) = (Vec::with_capacity(x.len()), vec![], vec![]);
        for row in x.chunks(n) {
            let mu = row.iter().sum::<f64>() / n as f64;
            let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / n as f64;
            let rs = 1.0 / (var + eps).sqrt();
            y.extend(
                row.iter()
                    .enumerate()
                    .map(|(j, v)| (v - mu) * rs * gamma[j] + beta[j]),
            );
            mean.push(mu);
            rstd.push(rs);
        }
        (y, mean, rstd)
    }

    /// (dx, dgamma, dbeta) of Σ gy·y: dx = rstd·(g − mean(g) − xhat·mean(g·xhat)) with
    /// g = gy·gamma; dgamma = Σ_rows gy·xhat; dbeta = Σ_rows gy.
    pub fn backward(
        x: &[f64],
        gamma: &[f64],
        gy: &[f64],
        n: usize,
        eps: f64,
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let (_, mean, rstd) = forward(x, gamma, &vec![0.0; n], n, eps);
        let (mut dx, mut dg, mut db) = (vec![0.0; x.len()], vec![0.0; n], vec![0.0; n]);
        for (r, (mu, rs)) in mean.into_iter().zip(rstd).enumerate() {
            let at = r * n..(r + 1) * n;
            let xh: Vec<f64> = x[at.clone()].iter().map(|v| (v - mu) * rs).collect();
            let g: Vec<f64> = gy[at.clone()]
                .iter()
                .zip(gamma)
                .map(|(a, b)| a * b)
                .collect();
            let a = g.iter().sum::<f64>() / n as f64;
            let b = g.iter().zip(&xh).map(|(p, q)| p * q).sum::<f64>() / n as f64;
            for (j, d) in dx[at.clone()].iter_mut().enumerate() {
                *d = rs * (g[j] - a - xh[j] * b);
                dg[j] += gy[r * n + j] * xh[j];
                db[j] += gy[r * n + j];
            }
        }
        (dx, dg, db)
    }
}

#[cfg(test)]
mod tests;
