//! A Linear layer as one op: y = x Wᵀ + b (nn.Linear's weight layout [out, in]).
//!
//! Reads: x [..., in], the weight [out, in] and an optional bias [out]. Writes: y [..., out].
//! Backward: dx = dy W, dW = dyᵀ x and db = Σ_rows dy.
//! Why it is fast: the composite `x.matmul(w.t()).add(b)` stores x Wᵀ and reads it back to add
//! the bias (a second pass over the output), and its backward goes through the transpose view:
//! dWᵀ is computed as xᵀ dy, then transposed back, so the weight's gradient arrives as a
//! strided view that every later pass (accumulation, clipping, the optimizer) reads across
//! rows. Here the bias is added in the GEMM's epilogue (the backend's `linear`; CPU, f32) and
//! dW is written in the weight's own layout. Where the backend has no epilogue the op is
//! [`linear_reference`], the composite.

use super::float_input;
use crate::storage::Storage;
use crate::tensor::output;
use crate::{bail, Error, Result, Tensor};

/// x Wᵀ + b over the last dimension of x (b optional), differentiable in x, W and b.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    // Under autocast the whole layer runs in the region's dtype, bias included (PyTorch's
    // rule): the output stays in that dtype instead of promoting back to f32 at the bias add.
    let inputs: Vec<&Tensor> = [Some(x), Some(w), b].into_iter().flatten().collect();
    if let Some(c) = crate::amp::autocast_inputs(&inputs)? {
        return linear(&c[0], &c[1], c.get(2));
    }
    let (rows, inp, out) = check("linear", x, w, b)?;
    let x2 = x.reshape(&[rows, inp])?;
    let (bs, bl) = match b {
        Some(b) => (Some(b.storage()), Some(b.layout())),
        None => (None, None),
    };
    let bias = bs.as_deref().zip(bl);
    let fused = x2
        .storage()
        .linear(x2.layout(), &w.storage(), w.layout(), bias, rows, inp, out)?;
    let Some(y) = fused else {
        return linear_reference(x, w, b);
    };
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank checked") = out;
    let (xt, wt, bt) = (x2.clone(), w.clone(), b.cloned());
    let inputs: Vec<&Tensor> = [Some(&x2), Some(w), b].into_iter().flatten().collect();
    let y = output(y, &[rows, out], "linear", &inputs, move |g, _| {
        let dx = xt.tracks_grad().then(|| g.matmul(&wt)).transpose()?;
        let both = wt.tracks_grad() && bt.as_ref().is_some_and(|b| b.tracks_grad());
        if both {
            if let Some((dw, db)) = weight_bias_grad(g, &xt)? {
                return Ok(vec![dx, Some(dw), Some(db)]);
            }
        }
        let dw = wt.tracks_grad().then(|| g.t()?.matmul(&xt)).transpose()?;
        let mut grads = vec![dx, dw];
        if let Some(bt) = &bt {
            grads.push(
                bt.tracks_grad()
                    .then(|| g.sum_to_shape(&[out]))
                    .transpose()?,
            );
        }
        Ok(grads)
    });
    y.reshape(&shape)
}

/// (dW, db) = (gᵀ x, Σ_rows g) for g [rows, out] and x [rows, in] in one GEMM whose epilogue
/// reduces the bias gradient (CUDA, f16/bf16: `cuda::matmul::linear_weight_bias_grad`); None
/// elsewhere, for the separate product and reduction. Backward passes only (the results are
/// untracked), as autograd runs them with grad mode off.
pub(crate) fn weight_bias_grad(g: &Tensor, x: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    let (&[rows, out], &[xr, inp]) = (g.shape(), x.shape()) else {
        return Ok(None);
    };
    if crate::is_grad_enabled() || xr != rows {
        return Ok(None);
    }
    let (gs, xs) = (g.storage(), x.storage());
    let (Storage::Cuda(gc), Storage::Cuda(xc)) = (&*gs, &*xs) else {
        return Ok(None);
    };
    let fused = crate::cuda::matmul::linear_weight_bias_grad(
        gc,
        g.layout(),
        xc,
        x.layout(),
        rows,
        inp,
        out,
    )?;
    Ok(fused.map(|(dw, db)| {
        (
            Tensor::from_storage(Storage::Cuda(dw), &[out, inp]),
            Tensor::from_storage(Storage::Cuda(db), &[out]),
        )
    }))
}

/// The composite reference: `x.matmul(w.t())` (+ b), the leading dims folded into rows.
pub fn linear_reference(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let (rows, inp, out) = check("linear", x, w, b)?;
    let y = x.reshape(&[rows, inp])?.matmul(&w.t()?)?;
    let y = match b {
        Some(b) => y.add(b)?,
        None => y,
    };
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank checked") = out;
    y.reshape(&shape)
}

/// (rows, in, out) of a Linear after checking ranks, shapes, dtypes and devices.
pub(crate) fn check(
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
) -> Result<(usize, usize, usize)> {
    float_input(op, x)?;
    if w.rank() != 2 {
        bail!(
            "{op}: the weight must be [out, in], got shape {:?}",
            w.shape()
        );
    }
    let (out, inp) = (w.shape()[0], w.shape()[1]);
    if x.rank() == 0 || x.shape().last() != Some(&inp) {
        bail!(
            "{op}: expected inputs with last dimension {inp} (the weight is {:?}), got shape {:?}",
            w.shape(),
            x.shape()
        );
    }
    if let Some(b) = b {
        if b.shape() != [out] {
            return Err(Error::ShapeMismatch {
                op,
                lhs: w.shape().to_vec(),
                rhs: b.shape().to_vec(),
            });
        }
    }
    // Under autocast the operands may differ (f32 master weights, half activations): the
    // region casts them, as it does for the composite's matmul and add.
    let autocast = crate::amp::autocast_dtype().is_some();
    for t in [Some(w), b].into_iter().flatten() {
        if !autocast && t.dtype() != x.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                expected: x.dtype(),
                got: t.dtype(),
            });
        }
        if t.device() != x.device() {
            return Err(Error::DeviceMismatch {
                op,
                lhs: x.device(),
                rhs: t.device(),
            });
        }
    }
    Ok((x.numel() / inp.max(1), inp, out))
}
