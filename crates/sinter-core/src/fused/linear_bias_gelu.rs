//! Linear + bias + GELU (tanh approximation): y = gelu(x Wᵀ + b), the first half of a
//! Transformer MLP.
//!
//! Reads: x [..., in], the weight [out, in] (nn.Linear's layout) and the bias [out].
//! Writes: y [..., out]. On CUDA (f16/bf16, out a multiple of 8) it is one cuBLASLt GEMM whose
//! GELU_AUX_BIAS epilogue adds the bias, applies GELU and also stores the pre-activation
//! u = x Wᵀ + b, which is all the backward pass needs: du = dy ∘ gelu'(u) (one elementwise
//! kernel), db = Σ_rows du (deterministic column sum), dx = du W and dW = duᵀ x (two GEMMs).
//! Why it is fast: the composite writes x Wᵀ, reads it back to add the bias and apply GELU and
//! writes again; here the bias and the activation happen in the GEMM's registers before the
//! single store. Elsewhere (CPU, f32, other widths) it is the composite: the matmul and then
//! the fused `bias_gelu` (which itself avoids storing the pre-activation).

use super::bias_gelu;
use super::linear::check;
use crate::op::UnaryOp;
use crate::tensor::output;
use crate::{Result, Tensor};

/// gelu(x Wᵀ + b) over the last dimension of x, differentiable in x, w and b.
pub fn linear_bias_gelu(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    // Under autocast the whole layer runs in the region's dtype (PyTorch casts a Linear's
    // input, weight and bias alike), so the fused half-precision kernel applies.
    if let Some(c) = crate::amp::autocast_inputs(&[x, w, b])? {
        return linear_bias_gelu(&c[0], &c[1], &c[2]);
    }
    let (rows, inp, out) = check("linear_bias_gelu", x, w, Some(b))?;
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank checked") = out;
    let fused = x.storage().linear_bias_gelu(
        x.layout(),
        &w.storage(),
        w.layout(),
        &b.storage(),
        b.layout(),
        rows,
        inp,
        out,
    )?;
    let Some((y, pre)) = fused else {
        return bias_gelu(&x.reshape(&[rows, inp])?.matmul(&w.t()?)?, b)?.reshape(&shape);
    };
    // The backward needs only the saved pre-activation u = x Wᵀ + b: du = dy ∘ gelu'(u),
    // dx = du W, dW = duᵀ x, db = Σ_rows du.
    let pre = Tensor::from_storage(pre, &[rows, out]);
    let (xt, wt, bt) = (x.clone(), w.clone(), b.clone());
    let y = output(
        y,
        &[rows, out],
        "linear_bias_gelu",
        &[x, w, b],
        move |g, _| {
            let du = Tensor::unary_backward(UnaryOp::GeluTanh, &pre, &pre, g)?;
            let dx = xt
                .tracks_grad()
                .then(|| du.matmul(&wt)?.reshape(xt.shape()))
                .transpose()?;
            let dw = wt
                .tracks_grad()
                .then(|| du.t()?.matmul(&xt.reshape(&[rows, inp])?))
                .transpose()?;
            let db = bt
                .tracks_grad()
                .then(|| du.sum_to_shape(&[out]))
                .transpose()?;
            Ok(vec![dx, dw, db])
        },
    );
    y.reshape(&shape)
}

/// The composite reference: `(x Wᵀ).add(b).gelu()` from unfused ops.
pub fn linear_bias_gelu_reference(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (rows, inp, out) = check("linear_bias_gelu", x, w, Some(b))?;
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank checked") = out;
    x.reshape(&[rows, inp])?
        .matmul(&w.t()?)?
        .add(b)?
        .gelu()?
        .reshape(&shape)
}
