//! Multi-head self-attention straight from a packed qkv projection.
//!
//! Reads: qkv [b, t, 3·c] (c = heads · head_dim), the output of one Linear: q, k and v side by
//! side, each split into heads along its c columns (GPT-2's layout).
//! Writes: y [b, t, c], the heads merged, ready for the output projection; backward writes
//! dqkv [b, t, 3·c].
//! Why it is fast: the composite splits the heads with narrow + transpose views and merges
//! them with transpose + reshape; flash attention reads the split views in place, but the
//! merge is a copy, dy reaches the kernel as a transposed view (a copy), and each of q, k
//! and v gets its own gradient: three zero-filled [b, t, 3·c] tensors with one third
//! written, summed into dqkv (three fills, three strided copies, two adds over the whole
//! projection). Here the kernel reads every operand and writes every result in these packed
//! layouts: none of those passes (CPU: its own packed kernel; CUDA: the flash kernels reading
//! q, k, v as strided thirds of qkv and writing y and dq, dk, dv in place). The attention
//! itself is [`super::attention`]'s (same tiles, same values). Where the backend declines
//! (CUDA: f32, head dims other than 64 and 128) the op is [`attention_packed_reference`], the
//! composite over `attention`.

use super::{attention, float_input};
use crate::backend::AttnGeom;
use crate::tensor::output;
use crate::{bail, Result, Tensor};

/// Heads, time and head dimension of a [b, t, 3·c] projection split into `n_head` heads.
fn geom(qkv: &Tensor, n_head: usize, causal: bool, scale: f32) -> Result<AttnGeom> {
    float_input("attention", qkv)?;
    let s = qkv.shape();
    if qkv.rank() != 3 || n_head == 0 || !s[2].is_multiple_of(3 * n_head) || s[2] == 0 {
        bail!(
            "attention: expected a packed qkv projection [batch, time, 3·heads·head_dim] with {n_head} heads, got {:?}",
            s
        );
    }
    Ok(AttnGeom {
        b: s[0],
        h: n_head,
        tq: s[1],
        tk: s[1],
        d: s[2] / (3 * n_head),
        causal,
        scale,
    })
}

/// Self-attention of a packed projection qkv [b, t, 3·c] with `n_head` heads: [b, t, c]
/// (heads merged), differentiable in qkv. Equal to [`attention_packed_reference`].
/// Under autocast qkv is cast to the region's dtype first, as in [`attention`].
pub fn attention_packed(qkv: &Tensor, n_head: usize, causal: bool, scale: f32) -> Result<Tensor> {
    if let Some(c) = crate::amp::autocast_inputs(&[qkv])? {
        return attention_packed(&c[0], n_head, causal, scale);
    }
    let g = geom(qkv, n_head, causal, scale)?;
    let Some((y, lse)) = qkv.storage().attention_packed(qkv.layout(), &g)? else {
        return attention_packed_reference(qkv, n_head, causal, scale);
    };
    let x = qkv.clone();
    Ok(output(
        y,
        &[g.b, g.tq, g.h * g.d],
        "attention_packed",
        &[qkv],
        move |grad, y| {
            let dqkv = x.storage().attention_packed_backward(
                x.layout(),
                (&y.storage(), y.layout()),
                (&grad.storage(), grad.layout()),
                &lse,
                &g,
            )?;
            Ok(vec![Some(Tensor::from_storage(dqkv, x.shape()))])
        },
    ))
}

/// The composite: q, k and v as [b, h, t, d] views of qkv, [`attention`], and the heads
/// merged back to [b, t, c].
pub fn attention_packed_reference(
    qkv: &Tensor,
    n_head: usize,
    causal: bool,
    scale: f32,
) -> Result<Tensor> {
    let g = geom(qkv, n_head, causal, scale)?;
    let (b, t, h, d) = (g.b, g.tq, g.h, g.d);
    let packed = qkv.reshape(&[b, t, 3, h, d])?;
    let head = |i: usize| -> Result<Tensor> { packed.narrow(2, i, 1)?.squeeze(2)?.transpose(1, 2) };
    let y = attention(&head(0)?, &head(1)?, &head(2)?, causal, scale)?;
    y.transpose(1, 2)?.reshape(&[b, t, h * d])
}
