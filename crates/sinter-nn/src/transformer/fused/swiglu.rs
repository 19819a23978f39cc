//! SwiGLU's gate, y = silu(gate)·up for h = [gate | up] along the last dimension, as one
//! custom op; its backward, one more, writes d[gate | up] in one pass (the composite's
//! `narrow` backward zero-fills and copies each half instead). With s = sigmoid(gate):
//! dgate = dy·up·s·(1 + gate·(1 − s)), dup = dy·gate·s.

use std::sync::OnceLock;

use sinter_core::custom_op::{CustomOp, HostOutput, OutputSpec, TensorMeta};
use sinter_core::{bail, DType, Result, Tensor};
use sinter_cpu::math::{output_vec, swiglu_backward_isa, swiglu_isa};
use sinter_cpu::Isa;

use super::for_rows;

/// The branch width n of h [.., 2n], or why h does not split.
fn branch(h: &TensorMeta) -> Result<usize> {
    match h.shape.last() {
        Some(&w) if w > 0 && w % 2 == 0 => Ok(w / 2),
        _ => bail!(
            "swiglu: expected [.., 2·n] (gate and up side by side), got {:?}",
            h.shape
        ),
    }
}

fn halved(shape: &[usize]) -> Vec<usize> {
    let mut s = shape.to_vec();
    if let Some(last) = s.last_mut() {
        *last /= 2;
    }
    s
}

/// silu(gate)·up of h [.., 2n] → [.., n].
pub(crate) fn swiglu(h: &Tensor) -> Result<Tensor> {
    Ok(forward_op()?.apply(&[h])?.remove(0))
}

fn forward_op() -> Result<&'static CustomOp> {
    static OP: OnceLock<CustomOp> = OnceLock::new();
    if let Some(op) = OP.get() {
        return Ok(op);
    }
    let backward = backward_op()?;
    let op = CustomOp::builder("swiglu")
        .inputs(1)
        .outputs(|m| {
            branch(&m[0])?;
            Ok(vec![OutputSpec::new(&halved(&m[0].shape), DType::F32)])
        })
        .cpu(|x| {
            let h = x[0].f32()?;
            let n = x[0].shape().last().copied().unwrap_or(0) / 2;
            let mut y = output_vec(h.len() / 2);
            let isa = Isa::get();
            for_rows(h, 2 * n, &mut y, n, |_, hr, yr| {
                let (gate, up) = hr.split_at(n);
                swiglu_isa(isa, gate, up, yr);
            });
            Ok(vec![HostOutput::f32(y, &halved(x[0].shape()))])
        })
        .backward(move |ctx| {
            let dh = backward.apply(&[ctx.grad(0), ctx.input(0)])?.remove(0);
            Ok(vec![Some(dh)])
        })
        .build()?;
    Ok(OP.get_or_init(|| op))
}

/// (dy [.., n], h [.., 2n]) → dh [.., 2n].
fn backward_op() -> Result<&'static CustomOp> {
    static OP: OnceLock<CustomOp> = OnceLock::new();
    if let Some(op) = OP.get() {
        return Ok(op);
    }
    let op = CustomOp::builder("swiglu_backward")
        .inputs(2)
        .outputs(|m| {
            branch(&m[1])?;
            if m[0].shape != halved(&m[1].shape) {
                bail!(
                    "swiglu_backward: dy {:?} must be h {:?} with the last dimension halved",
                    m[0].shape,
                    m[1].shape
                );
            }
            Ok(vec![OutputSpec::new(&m[1].shape, DType::F32)])
        })
        .cpu(|x| {
            let (dy, h) = (x[0].f32()?, x[1].f32()?);
            let n = x[1].shape().last().copied().unwrap_or(0) / 2;
            let mut dh = output_vec(h.len());
            let isa = Isa::get();
            for_rows(h, 2 * n, &mut dh, 2 * n, |r, hr, dhr| {
                let (gate, up) = hr.split_at(n);
                let (dgate, dup) = dhr.split_at_mut(n);
                swiglu_backward_isa(isa, gate, up, &dy[r * n..][..n], dgate, dup);
            });
            Ok(vec![HostOutput::f32(dh, x[1].shape())])
        })
        .build()?;
    Ok(OP.get_or_init(|| op))
}
