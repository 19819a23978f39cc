//! SwiGLU's gate, y = silu(gate)·up for h = [gate | up] along the last dimension, as one
//! custom op; its backward, one more, writes d[gate | up] in one pass (the composite's
//! `narrow` backward zero-fills and copies each half instead). With s = sigmoid(gate):
//! dgate = dy·up·s·(1 + gate·(1 − s)), dup = dy·gate·s. On CUDA both launch
//! `llama_fused.cu`'s kernels (f32, f16, bf16; one thread per output element).

use std::collections::HashMap;
use std::sync::Mutex;

use sinter_core::custom_op::{CustomOp, HostOutput, OutputSpec, TensorMeta};
use sinter_core::{bail, DType, Result, Tensor};
use sinter_cpu::math::{output_vec, swiglu_backward_isa, swiglu_isa};
use sinter_cpu::Isa;

use super::{cuda, for_rows, in_dtype, FLOATS};

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
    Ok(ops(h.dtype())?.0.apply(&[h])?.remove(0))
}

/// The forward and backward ops for h in `dtype`, built once.
fn ops(dtype: DType) -> Result<(CustomOp, CustomOp)> {
    static OPS: Mutex<Option<HashMap<DType, (CustomOp, CustomOp)>>> = Mutex::new(None);
    let mut all = OPS.lock().unwrap_or_else(|e| e.into_inner());
    let all = all.get_or_insert_with(HashMap::new);
    if let Some(ops) = all.get(&dtype) {
        return Ok(ops.clone());
    }
    let backward = backward_op(dtype)?;
    let ops = (forward_op(dtype, backward.clone())?, backward);
    all.insert(dtype, ops.clone());
    Ok(ops)
}

fn forward_op(dtype: DType, backward: CustomOp) -> Result<CustomOp> {
    CustomOp::builder("swiglu")
        .inputs(1)
        .dtypes(&FLOATS)
        .outputs(|m| {
            branch(&m[0])?;
            Ok(vec![OutputSpec::new(&halved(&m[0].shape), m[0].dtype)])
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
        .cuda(cuda::swiglu_forward(dtype)?)
        .backward(move |ctx| {
            let dy = in_dtype(ctx.grad(0), dtype)?;
            let dh = backward.apply(&[&dy, ctx.input(0)])?.remove(0);
            Ok(vec![Some(dh)])
        })
        .build()
}

/// (dy [.., n], h [.., 2n]) → dh [.., 2n].
fn backward_op(dtype: DType) -> Result<CustomOp> {
    CustomOp::builder("swiglu_backward")
        .inputs(2)
        .dtypes(&FLOATS)
        .outputs(|m| {
            branch(&m[1])?;
            if m[0].shape != halved(&m[1].shape) {
                bail!(
                    "swiglu_backward: dy {:?} must be h {:?} with the last dimension halved",
                    m[0].shape,
                    m[1].shape
                );
            }
            Ok(vec![OutputSpec::new(&m[1].shape, m[1].dtype)])
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
        .cuda(cuda::swiglu_backward(dtype)?)
        .build()
}
