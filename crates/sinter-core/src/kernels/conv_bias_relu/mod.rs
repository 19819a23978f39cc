//! Conv2d + bias + ReLU: y = relu(conv2d(x, w) + b[o]) (or without the ReLU), one op, and
//! everything about it in this folder (issue 26 item 1; no `BackendStorage` method).
//!
//! Reads: x [n, c, h, w], the weight [o, c/groups, kh, kw] and the bias [o]. Writes: y
//! [n, o, oh, ow]; keeps x, w and y for the backward (not the pre-activation: the ReLU's
//! derivative is 0 exactly where y <= 0, so y tells it). Why it is fast on the CPU (`cpu.rs`):
//! the convolution's output pass adds the bias and applies the ReLU as it stores each row (the
//! composite writes the convolution, reads it to add the bias, writes, reads it for the ReLU,
//! writes again), and the backward computes the ReLU's gradient and the bias gradient in one
//! pass before the two convolution gradients (the seam's `conv2d_backward_data` / `_filter`).
//! CUDA has no such kernel today: there the op is [`conv2d_bias_relu_reference`], the
//! composite (conv2d, add, relu) it is tested against.

mod cpu;

use crate::backend::ConvGeom;
use crate::op::UnaryOp;
use crate::storage::Storage;
use crate::tensor::output;
use crate::{Conv2dParams, Error, Result, Tensor};

/// The fused forward where the operands' device has it (the CPU): y, else None.
fn fused_forward(x: &Tensor, w: &Tensor, b: &Tensor, relu: bool, g: &ConvGeom) -> Option<Storage> {
    let (xs, ws, bs) = (x.storage(), w.storage(), b.storage());
    match (&*xs, &*ws, &*bs) {
        (Storage::Cpu(xc), Storage::Cpu(wc), Storage::Cpu(bc)) => Some(Storage::Cpu(cpu::forward(
            (xc, x.layout()),
            (wc, w.layout()),
            (bc, b.layout()),
            relu,
            g,
        ))),
        _ => None,
    }
}

/// The epilogue's backward, (dpre, dbias [o]) from the output gradient and y: one pass on the
/// CPU, the ReLU backward and a sum elsewhere.
fn epilogue_backward(gr: &Tensor, y: &Tensor, relu: bool, o: usize) -> Result<(Tensor, Tensor)> {
    if let (Storage::Cpu(gc), Storage::Cpu(yc)) = (&*gr.storage(), &*y.storage()) {
        let (d, db) = cpu::backward((gc, gr.layout()), (yc, y.layout()), relu, o);
        return Ok((
            Tensor::from_storage(Storage::Cpu(d), gr.shape()),
            Tensor::from_storage(Storage::Cpu(db), &[o]),
        ));
    }
    let d = if relu {
        Tensor::unary_backward(UnaryOp::Relu, y, y, gr)?
    } else {
        gr.clone()
    };
    let db = d.sum_to_shape(&[1, o, 1, 1])?.reshape(&[o])?;
    Ok((d, db))
}

/// relu?(conv2d(x, w, p) + b) with the bias broadcast over [n, ·, oh, ow]; differentiable in
/// x, w and b.
pub fn conv2d_bias_relu(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    p: Conv2dParams,
    relu: bool,
) -> Result<Tensor> {
    let g = x.conv_geom(w, p)?;
    x.float_op("conv2d_bias_relu")?;
    if b.shape() != [g.o] {
        return Err(Error::ShapeMismatch {
            op: "conv2d_bias_relu",
            lhs: w.shape().to_vec(),
            rhs: b.shape().to_vec(),
        });
    }
    let same = [w, b]
        .iter()
        .all(|t| t.dtype() == x.dtype() && t.device() == x.device());
    let fused = if same && crate::amp::autocast_dtype().is_none() {
        fused_forward(x, w, b, relu, &g)
    } else {
        None
    };
    let Some(y) = fused else {
        return conv2d_bias_relu_reference(x, w, b, p, relu);
    };
    let (xt, wt, bt) = (x.clone(), w.clone(), b.clone());
    Ok(output(
        y,
        &[g.n, g.o, g.oh, g.ow],
        "conv2d_bias_relu",
        &[x, w, b],
        move |gr, y| {
            let (dpre, db) = epilogue_backward(gr, y, relu, g.o)?;
            Ok(vec![
                xt.conv2d_grad_input(&dpre, &wt, &g)?,
                wt.conv2d_grad_weight(&dpre, &xt, &g)?,
                bt.tracks_grad().then_some(db),
            ])
        },
    ))
}

/// The composite reference: `x.conv2d(w, p) + b` (and `.relu()`) from unfused ops.
pub fn conv2d_bias_relu_reference(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    p: Conv2dParams,
    relu: bool,
) -> Result<Tensor> {
    let y = x.conv2d(w, p)?.add(&b.reshape(&[1, b.numel(), 1, 1])?)?;
    if relu {
        y.relu()
    } else {
        Ok(y)
    }
}
