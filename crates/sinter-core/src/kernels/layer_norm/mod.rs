//! LayerNorm over the last dimension, and the pre-LN Transformer's residual add + LayerNorm in
//! one pass: everything about the op in this folder.
//!
//! - `mod.rs` (here): the typed ops on the custom-op mechanism (no `BackendStorage` method),
//!   the one backward rule (for both ops: the residual op's backward is LayerNorm's on the saved
//!   sum), the composite [`residual_layer_norm_reference`], and [`reference`], the f64 values
//!   every kernel test of every crate checks against.
//! - `cpu.rs`: the CPU forwards over sinter-cpu's vectorised row kernels.
//! - `cuda.rs` and `layer_norm.cu`: the CUDA kernels, their launches and declared traffic.
//! - the tests (below the op, here): both devices (the emulated one in CI) against
//!   [`reference`].
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
mod tests {
    //! LayerNorm and residual add + LayerNorm against the f64 [`reference`], values and every
    //! gradient, in f32, bf16 and f16 (the half types with parameters in their dtype and in f32,
    //! autocast's case), on the CPU and the CUDA device (the real GPU when present,
    //! else the emulated one: the kernel emulator runs `layer_norm.cu`): one-element rows, short
    //! rows (warp-sized row groups), rows longer than a block, many row chunks for the parameter
    //! sums, and a residual whose memory is not 16-byte aligned (the kernels' scalar path).

    use super::*;
    use crate::kernels::test_support::{
        assert_close, assert_grad_close, backward_with, devices, f64s, values, var, Tol,
    };

    /// (relative, absolute) tolerance of a value stored in each dtype.
    const TOL: Tol = Tol {
        f32: (1e-5, 1e-5),
        bf16: (1.0 / 128.0, 1.0 / 128.0),
        f16: (1.0 / 1024.0, 1.0 / 1024.0),
    };

    /// The last, rows of 7000, are too long for the one-pass CUDA backward's shared memory: the
    /// two-kernel backward serves them.
    const SHAPES: [(usize, usize); 7] = [
        (1, 1),
        (3, 2),
        (300, 5),
        (19, 100),
        (7, 1000),
        (3, 3001),
        (2, 7000),
    ];

    /// (activations' dtype, parameters' dtype) pairs: every float dtype with parameters of its own
    /// dtype, and the half types with f32 parameters (autocast's master weights).
    fn dtype_pairs() -> Vec<(DType, DType)> {
        let mut v: Vec<_> = FLOATS.iter().map(|&d| (d, d)).collect();
        v.extend([(DType::BF16, DType::F32), (DType::F16, DType::F32)]);
        v
    }

    #[test]
    fn layer_norm_and_its_gradients_match_f64() {
        for dev in devices() {
            for (d, pd) in dtype_pairs() {
                for (k, &(rows, n)) in SHAPES.iter().enumerate() {
                    let s = 10 * k as u64;
                    let (x, xv) = var(values(s, rows * n, -2.0, 3.0), &[rows, n], d, dev);
                    let (g, gv) = var(values(s + 1, n, 0.5, 1.5), &[n], pd, dev);
                    let (b, bv) = var(values(s + 2, n, -0.5, 0.5), &[n], pd, dev);
                    let (gy, gyv) = var(values(s + 3, rows * n, -1.0, 1.0), &[rows, n], d, dev);
                    let y = x.layer_norm(&g, &b, 1e-5).unwrap();
                    let what = format!("layer_norm {dev} {d} (parameters {pd}) {rows}x{n}");
                    let (rt, at) = TOL.of(d);
                    let (want, _, _) = reference::forward(&xv, &gv, &bv, n, 1e-5);
                    assert_eq!(y.dtype(), d, "{what}: y in x's dtype");
                    assert_close(&what, &f64s(&y), &want, (rt * 2.0, at * 4.0));
                    backward_with(&y, &gy);
                    let (dx, dg, db) = reference::backward(&xv, &gv, &gyv, n, 1e-5);
                    let ra = at * (rows as f64).sqrt() * 8.0;
                    assert_grad_close(&format!("{what} dx"), &x, &dx, (rt * 4.0, at * 20.0));
                    assert_grad_close(&format!("{what} dgamma"), &g, &dg, (rt * 2.0, ra));
                    assert_grad_close(&format!("{what} dbeta"), &b, &db, (rt * 2.0, ra));
                    for p in [&g, &b] {
                        assert_eq!(p.grad().unwrap().dtype(), pd, "{what}: parameter gradients");
                    }
                }
            }
        }
    }

    #[test]
    fn residual_layer_norm_and_its_gradients_match_f64() {
        for dev in devices() {
            for (d, pd) in dtype_pairs() {
                for (k, &(rows, n)) in SHAPES.iter().enumerate() {
                    // The CPU takes a half-precision row's statistics over the f32 sum but stores h
                    // rounded (as before the move), so a one-element row's dx, scaled by
                    // rstd = 1/√eps, is off by that rounding there: checked on CUDA only.
                    if n == 1 && dev == Device::Cpu && d != DType::F32 {
                        continue;
                    }
                    let s = 10 * k as u64 + 5;
                    let (x, xv) = var(values(s, rows * n, -2.0, 3.0), &[rows, n], d, dev);
                    // The residual one element into its buffer: its rows are not 16-byte aligned.
                    let (rbuf, rbv) = var(
                        values(s + 1, rows * n + 1, -1.0, 1.0),
                        &[rows * n + 1],
                        d,
                        dev,
                    );
                    let r = rbuf
                        .narrow(0, 1, rows * n)
                        .unwrap()
                        .reshape(&[rows, n])
                        .unwrap();
                    let (g, gv) = var(values(s + 2, n, 0.5, 1.5), &[n], pd, dev);
                    let (b, bv) = var(values(s + 3, n, -0.5, 0.5), &[n], pd, dev);
                    let (gh, ghv) = var(values(s + 4, rows * n, -1.0, 1.0), &[rows, n], d, dev);
                    let (gy, gyv) = var(values(s + 5, rows * n, -1.0, 1.0), &[rows, n], d, dev);
                    let (h, y) = residual_layer_norm(&x, &r, &g, &b, 1e-5).unwrap();
                    let what =
                        format!("residual_layer_norm {dev} {d} (parameters {pd}) {rows}x{n}");
                    let (rt, at) = TOL.of(d);
                    // h is x + r rounded to d; the statistics are those of the rounded h.
                    let sum = Tensor::from_vec(
                        xv.iter()
                            .zip(&rbv[1..])
                            .map(|(a, b)| (a + b) as f32)
                            .collect(),
                        &[rows, n],
                        Device::Cpu,
                    )
                    .unwrap()
                    .to_dtype(d)
                    .unwrap();
                    let hv = f64s(&sum);
                    assert_close(&format!("{what} h"), &f64s(&h), &hv, (0.0, 0.0));
                    let (want, _, _) = reference::forward(&hv, &gv, &bv, n, 1e-5);
                    assert_close(&format!("{what} y"), &f64s(&y), &want, (rt * 2.0, at * 4.0));
                    let loss = h.mul(&gh.detach()).unwrap().sum_all().unwrap();
                    let loss = loss
                        .add(&y.mul(&gy.detach()).unwrap().sum_all().unwrap())
                        .unwrap();
                    loss.backward().unwrap();
                    let (dh, dg, db) = reference::backward(&hv, &gv, &gyv, n, 1e-5);
                    // Both inputs get the sum's whole gradient: its own plus LayerNorm's.
                    let dh: Vec<f64> = dh.iter().zip(&ghv).map(|(a, b)| a + b).collect();
                    let ra = at * (rows as f64).sqrt() * 8.0;
                    assert_grad_close(&format!("{what} dx"), &x, &dh, (rt * 4.0, at * 20.0));
                    let dr = rbuf.grad().unwrap().narrow(0, 1, rows * n).unwrap();
                    assert_close(
                        &format!("{what} dr"),
                        &f64s(&dr),
                        &dh,
                        (rt * 4.0, at * 20.0),
                    );
                    assert_grad_close(&format!("{what} dgamma"), &g, &dg, (rt * 2.0, ra));
                    assert_grad_close(&format!("{what} dbeta"), &b, &db, (rt * 2.0, ra));
                    for p in [&g, &b] {
                        assert_eq!(p.grad().unwrap().dtype(), pd, "{what}: parameter gradients");
                    }
                }
            }
        }
    }

    #[test]
    fn half_precision_input_with_f32_parameters_gives_f32_parameter_gradients() {
        // Autocast's case: bf16 activations, f32 LayerNorm parameters.
        for dev in devices() {
            let (rows, n) = (4, 33);
            let (x, xv) = var(values(1, rows * n, -2.0, 3.0), &[rows, n], DType::BF16, dev);
            let (g, gv) = var(values(2, n, 0.5, 1.5), &[n], DType::F32, dev);
            let (b, bv) = var(values(3, n, -0.5, 0.5), &[n], DType::F32, dev);
            let y = x.layer_norm(&g, &b, 1e-5).unwrap();
            assert_eq!(y.dtype(), DType::BF16);
            // Both devices read gamma and beta in f32: only y's own rounding to bf16 is left.
            let (want, _, _) = reference::forward(&xv, &gv, &bv, n, 1e-5);
            assert_close(&format!("{dev} y"), &f64s(&y), &want, TOL.bf16);
            y.sum_all().unwrap().backward().unwrap();
            let (_, _, db) = reference::backward(&xv, &gv, &vec![1.0; rows * n], n, 1e-5);
            for p in [&g, &b] {
                assert_eq!(
                    p.grad().unwrap().dtype(),
                    DType::F32,
                    "{dev}: a parameter's gradient"
                );
            }
            assert_grad_close(&format!("{dev} dbeta"), &b, &db, (0.0, 0.0));
        }
    }

    #[test]
    fn parameter_gradients_of_a_constant_input_match_f64() {
        // No dx wanted: the CUDA backward's dx-less path (the params kernel and finish).
        for dev in devices() {
            for (d, pd) in dtype_pairs() {
                let (rows, n) = (37, 70);
                let (x, xv) = var(values(7, rows * n, -2.0, 3.0), &[rows, n], d, dev);
                let (g, gv) = var(values(8, n, 0.5, 1.5), &[n], pd, dev);
                let (b, _) = var(values(9, n, -0.5, 0.5), &[n], pd, dev);
                let (gy, gyv) = var(values(10, rows * n, -1.0, 1.0), &[rows, n], d, dev);
                let y = x.detach().layer_norm(&g, &b, 1e-5).unwrap();
                backward_with(&y, &gy);
                let (_, dg, db) = reference::backward(&xv, &gv, &gyv, n, 1e-5);
                let (rt, at) = TOL.of(d);
                let ra = at * (rows as f64).sqrt() * 8.0;
                let what = format!("{dev} {d} (parameters {pd})");
                assert_grad_close(&format!("{what} dgamma"), &g, &dg, (rt * 2.0, ra));
                assert_grad_close(&format!("{what} dbeta"), &b, &db, (rt * 2.0, ra));
                assert!(
                    x.grad().is_none(),
                    "{what}: no gradient for the detached input"
                );
            }
        }
    }

    #[test]
    fn bad_operands_are_errors_that_say_what() {
        let x = Tensor::zeros(&[2, 3], DType::F32, Device::Cpu).unwrap();
        let p3 = Tensor::ones(&[3], DType::F32, Device::Cpu).unwrap();
        let p4 = Tensor::ones(&[4], DType::F32, Device::Cpu).unwrap();
        let e = x.layer_norm(&p4, &p3, 1e-5).unwrap_err().to_string();
        assert!(e.contains("layer_norm") && e.contains("[4]"), "{e}");
        let empty = Tensor::zeros(&[2, 0], DType::F32, Device::Cpu).unwrap();
        let e = empty.layer_norm(&p3, &p3, 1e-5).unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
        let ints = Tensor::zeros(&[2, 3], DType::I64, Device::Cpu).unwrap();
        assert!(ints.layer_norm(&p3, &p3, 1e-5).is_err());
        let r = Tensor::zeros(&[3, 2], DType::F32, Device::Cpu).unwrap();
        let e = residual_layer_norm(&x, &r, &p3, &p3, 1e-5)
            .unwrap_err()
            .to_string();
        assert!(e.contains("residual_layer_norm"), "{e}");
    }

    #[test]
    fn nvrtc_compiles_the_kernels_for_sm80_and_sm90() {
        if !crate::kernels::test_support::nvrtc_available() {
            return;
        }
        let src =
            sinter_cuda::user_kernel::KernelSource::new("layer_norm.cu", LAYER_NORM_CU).unwrap();
        let kernels = [
            ("layernorm_fwd", 9),
            ("layernorm_bwd", 10),
            ("layernorm_bwd_dx", 8),
            ("layernorm_bwd_params", 9),
            ("layernorm_bwd_finish", 6),
            ("resln_fwd", 11),
        ];
        // The f32-parameter variants of the kernels that read gamma.
        let pf32 = [
            "layernorm_fwd",
            "layernorm_bwd",
            "layernorm_bwd_dx",
            "resln_fwd",
        ];
        for arch in ["sm_80", "sm_90"] {
            let ptx = src.ptx(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
            for sfx in ["f32", "f16", "bf16", "f16_pf32", "bf16_pf32"] {
                let kernels = kernels
                    .iter()
                    .filter(|(k, _)| !sfx.ends_with("pf32") || pf32.contains(k));
                for &(kernel, params) in kernels {
                    let name = format!("{kernel}_{sfx}");
                    let e = ptx.entries.iter().find(|e| e.name == name);
                    let e = e.unwrap_or_else(|| panic!("{arch}: no entry {name}"));
                    assert_eq!(e.params.len(), params, "{arch}: {name}'s parameters");
                }
            }
        }
    }

    /// The CPU row kernels themselves on every instruction set this CPU has (the seam picks
    /// one), against the same f64 reference: row lengths that are not multiples of any vector,
    /// the residual form's sum and values bit-identical to the plain kernel's, and the backward.
    #[test]
    fn cpu_row_kernels_match_the_reference_on_every_isa() {
        use sinter_cpu::math::layer_norm::{
            layer_norm_backward_rows, layer_norm_rows, residual_layer_norm_rows,
        };
        let wide = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<f64>>();
        let (rows, eps) = (5, 1e-5f32);
        for isa in sinter_cpu::Isa::available() {
            for n in [1usize, 7, 17, 63, 129] {
                let x = values(3 + n as u64, rows * n, -3.0, 3.0);
                let res = values(5, rows * n, -1.0, 1.0);
                let (gamma, beta) = (values(11, n, -1.0, 1.0), values(13, n, -1.0, 1.0));
                let g = values(17, rows * n, -1.0, 1.0);
                let s: Vec<f32> = x.iter().zip(&res).map(|(a, b)| a + b).collect();
                let [mut y, mut y2, mut sum] = [0; 3].map(|_| vec![0f32; x.len()]);
                let [mut mean, mut rstd, mut mean2, mut rstd2] = [0; 4].map(|_| vec![0f32; rows]);
                layer_norm_rows(isa, &s, &gamma, &beta, eps, &mut y, &mut mean, &mut rstd);
                residual_layer_norm_rows(
                    isa, &x, &res, &gamma, &beta, eps, &mut sum, &mut y2, &mut mean2, &mut rstd2,
                );
                assert_eq!(sum, s, "{isa:?} residual sum n={n}");
                assert_eq!(y, y2, "{isa:?} residual form n={n}");
                let (sf, gf) = (wide(&s), wide(&gamma));
                let (want, _, _) = reference::forward(&sf, &gf, &wide(&beta), n, eps as f64);
                assert_close(&format!("{isa:?} n={n}"), &y, &want, (1e-5, 2e-6));
                let [mut dx, mut dg, mut db] = [x.len(), n, n].map(|l| vec![0f32; l]);
                layer_norm_backward_rows(
                    isa, &s, &gamma, &mean, &rstd, &g, &mut dx, &mut dg, &mut db,
                );
                let (wdx, wdg, wdb) = reference::backward(&sf, &gf, &wide(&g), n, eps as f64);
                // n = 1 normalises to 0 with a huge rstd: an absolute floor scaled by it.
                let floor = if n == 1 { 1e-2 } else { 1e-5 };
                assert_close(&format!("{isa:?} dx n={n}"), &dx, &wdx, (1e-4, floor));
                assert_close(&format!("{isa:?} dgamma n={n}"), &dg, &wdg, (1e-4, 1e-5));
                assert_close(&format!("{isa:?} dbeta n={n}"), &db, &wdb, (1e-5, 1e-6));
            }
        }
    }
}
