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

use super::float_input;
use crate::tensor::output;
use crate::{Error, Result, Tensor};

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
    if let Some((x, bias)) = crate::amp::promote_operands(x, bias)? {
        // Mixed floats (an autocast product and an f32 bias) promote as `x + bias` would.
        return bias_gelu(&x, &bias);
    }
    if x.dtype() != bias.dtype() {
        return Err(Error::DTypeMismatch {
            op: "bias_gelu",
            expected: x.dtype(),
            got: bias.dtype(),
        });
    }
    let fused = x
        .storage()
        .bias_gelu(x.layout(), &bias.storage(), bias.layout())?;
    let Some(y) = fused else {
        // This device runs it as the composite.
        return bias_gelu_reference(x, bias);
    };
    let (xt, bt) = (x.clone(), bias.clone());
    Ok(output(
        y,
        x.shape(),
        "bias_gelu",
        &[x, bias],
        move |g, _| {
            let (dx, db) = g.storage().bias_gelu_backward(
                g.layout(),
                &xt.storage(),
                xt.layout(),
                &bt.storage(),
                bt.layout(),
            )?;
            Ok(vec![
                Some(Tensor::from_storage(dx, xt.shape())),
                bt.tracks_grad()
                    .then(|| Tensor::from_storage(db, bt.shape())),
            ])
        },
    ))
}

/// The composite reference: `x.add(bias)?.gelu()`.
pub fn bias_gelu_reference(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.add(bias)?.gelu()
}
