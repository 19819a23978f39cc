//! Rotary positions as one custom op: y = x·cos + rotate_half(x)·sin per head vector, with
//! rotate_half(x) = (−x₂, x₁) (Hugging Face's layout; see `../rope.rs`). The rotation is
//! orthogonal, so its backward is the inverse rotation, the same kernel with sin's sign flipped
//! (in the kernel, not by negating the table each step): dx = dy·cos + rotate_halfᵀ(dy·sin),
//! rotate_halfᵀ(z) = (z₂, −z₁). The inverse's backward is the forward rotation again.
//!
//! Two layouts: heads [b, h, t, d] (`rope`), and the packed projection [b, t, (h + 2·kv)·d]
//! (`rope_packed`), whose q and k heads are rotated in place of the split, rotate and re-pack
//! (and the zero-filled gradients of those splits) before attention reads the packed heads.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use sinter_core::custom_op::{CustomOp, HostOutput, OutputSpec};
use sinter_core::{bail, DType, Result, Tensor};
use sinter_cpu::math::output_vec;
use sinter_cpu::math::rope::rope_rotate_isa;
use sinter_cpu::Isa;

use super::for_rows;

/// Rotates heads x [b, h, t, d] by the angle tables cos, sin [t, d] of their positions.
pub(crate) fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    Ok(op(false)?.apply(&[x, cos, sin])?.remove(0))
}

/// The rotation (`inverse` false) or its inverse, each built once.
fn op(inverse: bool) -> Result<&'static CustomOp> {
    static OPS: [OnceLock<CustomOp>; 2] = [OnceLock::new(), OnceLock::new()];
    let slot = &OPS[inverse as usize];
    if let Some(op) = slot.get() {
        return Ok(op);
    }
    let sign = if inverse { -1.0 } else { 1.0 };
    let op = CustomOp::builder(if inverse { "rope_inverse" } else { "rope" })
        .inputs(3)
        .outputs(|m| {
            let (x, c, s) = (&m[0].shape, &m[1].shape, &m[2].shape);
            match &x[..] {
                &[_, _, t, d] if d % 2 == 0 && c[..] == [t, d] && s[..] == [t, d] => {}
                _ => bail!(
                    "rope: heads must be [batch, heads, time, even head_dim] and the tables [time, head_dim]; got {x:?}, {c:?} and {s:?}"
                ),
            }
            Ok(vec![OutputSpec::new(x, DType::F32)])
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
        .backward(move |ctx| {
            let back = op(!inverse)?.apply(&[ctx.grad(0), ctx.input(1), ctx.input(2)])?;
            Ok(vec![back.into_iter().next(), None, None])
        })
        .build()?;
    Ok(slot.get_or_init(|| op))
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
    Ok(packed_op(false, rotated)?
        .apply(&[qkv, cos, sin])?
        .remove(0))
}

/// The packed rotation or its inverse for `rotated` heads, each built once.
fn packed_op(inverse: bool, rotated: usize) -> Result<CustomOp> {
    static OPS: Mutex<Option<HashMap<(bool, usize), CustomOp>>> = Mutex::new(None);
    let mut all = OPS.lock().unwrap_or_else(|e| e.into_inner());
    let all = all.get_or_insert_with(HashMap::new);
    if let Some(op) = all.get(&(inverse, rotated)) {
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
        .outputs(move |m| {
            let (x, c, s) = (&m[0].shape, &m[1].shape, &m[2].shape);
            match (&x[..], &c[..]) {
                (&[_, t, w], &[tc, d])
                    if d % 2 == 0 && d > 0 && tc == t && s == c && rotated * d <= w => {}
                _ => bail!(
                    "rope_packed: expected a projection [batch, time, width] whose first {rotated} heads are rotated by tables [time, even head_dim] with {rotated}·head_dim ≤ width; got {x:?}, {c:?} and {s:?}"
                ),
            }
            Ok(vec![OutputSpec::new(x, DType::F32)])
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
        .backward(move |ctx| {
            let back = packed_op(!inverse, rotated)?.apply(&[
                ctx.grad(0),
                ctx.input(1),
                ctx.input(2),
            ])?;
            Ok(vec![back.into_iter().next(), None, None])
        })
        .build()?;
    all.insert((inverse, rotated), op.clone());
    Ok(op)
}

/// One position's heads (x holds whole heads of d = cos.len()): y₁ = x₁·cos₁ − x₂·s₁,
/// y₂ = x₂·cos₂ + x₁·s₂ with s = sign·sin (sinter-cpu's vectorised kernel).
fn rotate(x: &[f32], cos: &[f32], sin: &[f32], sign: f32, y: &mut [f32]) {
    rope_rotate_isa(Isa::get(), x, cos, sin, sign, y)
}
