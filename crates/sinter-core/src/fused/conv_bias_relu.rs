//! Conv2d + bias + ReLU: y = relu(conv2d(x, w) + b[o]) (or without the ReLU), one op.
//!
//! Reads: x [n, c, h, w], the weight [o, c/groups, kh, kw] and the bias [o]. Writes: y
//! [n, o, oh, ow]; keeps x, w and y for the backward (not the pre-activation: the ReLU's
//! derivative is 0 exactly where y <= 0, so y tells it). Why it is fast on the CPU: the
//! convolution's output pass adds the bias and applies the ReLU as it stores each row (the
//! composite writes the convolution, reads it to add the bias, writes, reads it for the ReLU,
//! writes again), and the backward computes the ReLU's gradient and the bias gradient in one
//! pass (`bias_relu_backward`) before the two convolution gradients. A backend without these
//! kernels (CUDA today) runs the composite: conv2d, add, relu.

use super::float_input;
use crate::op::UnaryOp;
use crate::tensor::output;
use crate::{Conv2dParams, Error, Result, Tensor};

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
    float_input("conv2d_bias_relu", x)?;
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
        x.storage().conv2d_bias_relu(
            x.layout(),
            &w.storage(),
            w.layout(),
            &b.storage(),
            b.layout(),
            relu,
            &g,
        )?
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
            let fused = gr.storage().bias_relu_backward(
                gr.layout(),
                &y.storage(),
                y.layout(),
                relu,
                g.o,
            )?;
            let (dpre, db) = match fused {
                Some((d, db)) => (
                    Tensor::from_storage(d, gr.shape()),
                    Tensor::from_storage(db, &[g.o]),
                ),
                None => {
                    let d = if relu {
                        Tensor::unary_backward(UnaryOp::Relu, y, y, gr)?
                    } else {
                        gr.clone()
                    };
                    let db = d.sum_to_shape(&[1, g.o, 1, 1])?.reshape(&[g.o])?;
                    (d, db)
                }
            };
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
