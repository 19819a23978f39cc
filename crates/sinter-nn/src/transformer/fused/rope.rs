//! Rotary positions as one custom op: y = x·cos + rotate_half(x)·sin per head vector, with
//! rotate_half(x) = (−x₂, x₁) (Hugging Face's layout; see `../rope.rs`). The rotation is
//! orthogonal, so its backward is the inverse rotation, the same kernel with sin's sign flipped
//! (in the kernel, not by negating the table each step): dx = dy·cos + rotate_halfᵀ(dy·sin),
//! rotate_halfᵀ(z) = (z₂, −z₁). The inverse's backward is the forward rotation again.
//!
//! Two layouts: heads [b, h, t, d] (`rope`), and the packed projection [b, t, (h + 2·kv)·d]
//! (`rope_packed`), whose q and k heads are rotated in place of the split, rotate and re-pack
//! (and the zero-filled gradients of those splits) before attention reads the packed heads.
//!
//! On CUDA both launch `llama_fused.cu`'s `rope_<t>` (f32, f16, bf16; one thread per element,
//! the tables in x's dtype): heads are rows of one head, the packed projection rows of `rotated`
//! heads followed by the columns that pass through.

use std::collections::HashMap;
use std::sync::Mutex;

use sinter_core::custom_op::{CustomOp, HostOutput, OutputSpec, TensorMeta};
use sinter_core::{bail, DType, Result, Tensor};
use sinter_cpu::math::output_vec;
use sinter_cpu::math::rope::rope_rotate_isa;
use sinter_cpu::Isa;

use super::{cuda, for_rows, in_dtype, FLOATS};

/// Rotates heads x [b, h, t, d] by the angle tables cos, sin [t, d] of their positions.
pub(crate) fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    Ok(op(false, x.dtype())?.apply(&[x, cos, sin])?.remove(0))
}

/// An error unless the tables have x's dtype (the kernels read one type).
fn same_dtype(op: &str, m: &[TensorMeta]) -> Result<()> {
    if m[1].dtype != m[0].dtype || m[2].dtype != m[0].dtype {
        bail!(
            "{op}: the tables ({}, {}) must have x's dtype {}",
            m[1].dtype,
            m[2].dtype,
            m[0].dtype
        );
    }
    Ok(())
}

/// The rotation (`inverse` false) or its inverse for x in `dtype`, each built once.
fn op(inverse: bool, dtype: DType) -> Result<CustomOp> {
    static OPS: Mutex<Option<HashMap<(bool, DType), CustomOp>>> = Mutex::new(None);
    let mut all = OPS.lock().unwrap_or_else(|e| e.into_inner());
    let all = all.get_or_insert_with(HashMap::new);
    if let Some(op) = all.get(&(inverse, dtype)) {
        return Ok(op.clone());
    }
    let sign = if inverse { -1.0 } else { 1.0 };
    let name = if inverse { "rope_inverse" } else { "rope" };
    let op = CustomOp::builder(name)
        .inputs(3)
        .dtypes(&FLOATS)
        .outputs(move |m| {
            let (x, c, s) = (&m[0].shape, &m[1].shape, &m[2].shape);
            match &x[..] {
                &[_, _, t, d] if d % 2 == 0 && c[..] == [t, d] && s[..] == [t, d] => {}
                _ => bail!(
                    "rope: heads must be [batch, heads, time, even head_dim] and the tables [time, head_dim]; got {x:?}, {c:?} and {s:?}"
                ),
            }
            same_dtype(name, m)?;
            Ok(vec![OutputSpec::new(x, m[0].dtype)])
        })
        .cpu(move |x| {
            let (xs, cos, sin) = (x[0].f32()?, x[1].f32()?, x[2].f32()?);
            let shape = x[0].shape();
            let (t, d) = (shape[2], shape[3]);
            let mut y = output_vec(xs.len());
            for_rows(xs, d, &mut y, d, |r, xr, yr| {
                let p = r % t;
                rotate(xr, &cos[p * d..][..d], &sin[p * d..][..d], sign, yr)
            });
            Ok(vec![HostOutput::f32(y, shape)])
        })
        .cuda(cuda::rope(dtype, 1, sign)?)
        .backward(move |ctx| {
            let dy = in_dtype(ctx.grad(0), dtype)?;
            let back = op(!inverse, dtype)?.apply(&[&dy, ctx.input(1), ctx.input(2)])?;
            Ok(vec![back.into_iter().next(), None, None])
        })
        .build()?;
    all.insert((inverse, dtype), op.clone());
    Ok(op)
}

/// Rotates the first `rotated` heads (of d = cos's width) of every position of a packed
/// projection qkv [b, t, w] by the tables cos, sin [t, d]; columns rotated·d.. (v) pass
/// through unchanged.
pub(crate) fn rope_packed(
    qkv: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    rotated: usize,
) -> Result<Tensor> {
    Ok(packed_op(false, rotated, qkv.dtype())?
        .apply(&[qkv, cos, sin])?
        .remove(0))
}

/// The packed rotation or its inverse for `rotated` heads in `dtype`, each built once.
fn packed_op(inverse: bool, rotated: usize, dtype: DType) -> Result<CustomOp> {
    type Key = (bool, usize, DType);
    static OPS: Mutex<Option<HashMap<Key, CustomOp>>> = Mutex::new(None);
    let mut all = OPS.lock().unwrap_or_else(|e| e.into_inner());
    let all = all.get_or_insert_with(HashMap::new);
    if let Some(op) = all.get(&(inverse, rotated, dtype)) {
        return Ok(op.clone());
    }
    let sign = if inverse { -1.0 } else { 1.0 };
    let name = if inverse {
        "rope_packed_inverse"
    } else {
        "rope_packed"
    };
    let op = CustomOp::builder(name)
        .inputs(3)
        .dtypes(&FLOATS)
        .outputs(move |m| {
            let (x, c, s) = (&m[0].shape, &m[1].shape, &m[2].shape);
            match (&x[..], &c[..]) {
                (&[_, t, w], &[tc, d])
                    if d % 2 == 0 && d > 0 && tc == t && s == c && rotated * d <= w => {}
                _ => bail!(
                    "rope_packed: expected a projection [batch, time, width] whose first {rotated} heads are rotated by tables [time, even head_dim] with {rotated}·head_dim ≤ width; got {x:?}, {c:?} and {s:?}"
                ),
            }
            same_dtype(name, m)?;
            Ok(vec![OutputSpec::new(x, m[0].dtype)])
        })
        .cpu(move |x| {
            let (xs, cos, sin) = (x[0].f32()?, x[1].f32()?, x[2].f32()?);
            let shape = x[0].shape();
            let (t, w, d) = (shape[1], shape[2], x[1].shape()[1]);
            let mut y = output_vec(xs.len());
            for_rows(xs, w, &mut y, w, |r, xr, yr| {
                let p = r % t;
                let (c, s) = (&cos[p * d..][..d], &sin[p * d..][..d]);
                let (xq, xv) = xr.split_at(rotated * d);
                let (yq, yv) = yr.split_at_mut(rotated * d);
                rotate(xq, c, s, sign, yq);
                yv.copy_from_slice(xv);
            });
            Ok(vec![HostOutput::f32(y, shape)])
        })
        .cuda(cuda::rope(dtype, rotated, sign)?)
        .backward(move |ctx| {
            let back = packed_op(!inverse, rotated, dtype)?.apply(&[
                &in_dtype(ctx.grad(0), dtype)?,
                ctx.input(1),
                ctx.input(2),
            ])?;
            Ok(vec![back.into_iter().next(), None, None])
        })
        .build()?;
    all.insert((inverse, rotated, dtype), op.clone());
    Ok(op)
}

/// One position's heads (x holds whole heads of d = cos.len()): y₁ = x₁·cos₁ − x₂·s₁,
/// y₂ = x₂·cos₂ + x₁·s₂ with s = sign·sin (sinter-cpu's vectorised kernel).
fn rotate(x: &[f32], cos: &[f32], sin: &[f32], sign: f32, y: &mut [f32]) {
    rope_rotate_isa(Isa::get(), x, cos, sin, sign, y)
}
