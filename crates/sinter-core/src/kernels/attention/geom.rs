//! What every attention kernel of this folder is given: the geometry of a call ([`AttnGeom`],
//! [`DecodeSeq`]) and the checks that derive it from the operands, once for every device. Below
//! `cpu.rs`, `cpu_decode.rs`, `cuda.rs` and `mod.rs`, which all read it.

use crate::{bail, Error, Layout, Result, Tensor};

/// Attention over q [b, h, tq, d] and k, v [b, kv_h, tk, d]: softmax(scale · q kᵀ) v, with
/// `causal` masking aligned bottom-right (query i sits at position tk − tq + i and sees keys
/// 0..=tk − tq + i). Query head i reads key/value head i / (h / kv_h) (grouped-query
/// attention; kv_h = h is multi-head).
#[derive(Clone, Copy, Debug)]
pub struct AttnGeom {
    pub b: usize,
    pub h: usize,
    pub kv_h: usize,
    pub tq: usize,
    pub tk: usize,
    pub d: usize,
    pub causal: bool,
    pub scale: f32,
}

impl AttnGeom {
    /// Query heads per key/value head.
    #[inline]
    pub fn group(&self) -> usize {
        self.h / self.kv_h
    }
    /// Query row `i` sees keys 0..limit(i).
    #[inline]
    pub fn limit(&self, i: usize) -> usize {
        if self.causal {
            (i + self.tk + 1).saturating_sub(self.tq).min(self.tk)
        } else {
            self.tk
        }
    }
    /// The first query row that sees key `j`.
    pub fn first_row_seeing(&self, j: usize) -> usize {
        if self.causal {
            (j + self.tq).saturating_sub(self.tk)
        } else {
            0
        }
    }
}

/// One sequence of a decoding step (`decode_attention`): its key and value caches
/// [1, h, capacity, d] as indices into the step's list of cache storages, their layouts, and
/// how many positions are filled before this step's.
#[derive(Clone, Copy, Debug)]
pub struct DecodeSeq<'a> {
    pub k: usize,
    pub kl: &'a Layout,
    pub v: usize,
    pub vl: &'a Layout,
    pub len: usize,
}

/// The geometry of `attention(q, k, v)`, or an error naming what does not fit.
pub(super) fn of_qkv(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    scale: f32,
) -> Result<AttnGeom> {
    for (t, what) in [(q, "q"), (k, "k"), (v, "v")] {
        if t.rank() != 4 {
            bail!(
                "attention: {what} must be [batch, heads, time, head_dim], got {:?}",
                t.shape()
            );
        }
        t.float_op("attention")?;
        if t.device() != q.device() {
            return Err(Error::DeviceMismatch {
                op: "attention",
                lhs: q.device(),
                rhs: t.device(),
            });
        }
    }
    let (qs, ks) = (q.shape(), k.shape());
    if k.shape() != v.shape() || qs[0] != ks[0] || qs[1] != ks[1] || qs[3] != ks[3] {
        bail!("attention: q {:?}, k {:?} and v {:?} do not agree (k and v [b, h, tk, d], q [b, h, tq, d])", qs, ks, v.shape());
    }
    if q.dtype() != k.dtype() || q.dtype() != v.dtype() {
        return Err(Error::DTypeMismatch {
            op: "attention",
            expected: q.dtype(),
            got: if k.dtype() != q.dtype() {
                k.dtype()
            } else {
                v.dtype()
            },
        });
    }
    if qs[3] == 0 {
        bail!("attention: head dimension is 0");
    }
    Ok(AttnGeom {
        b: qs[0],
        h: qs[1],
        kv_h: qs[1],
        tq: qs[2],
        tk: ks[2],
        d: qs[3],
        causal,
        scale,
    })
}

/// Heads, time and head dimension of a packed projection [b, t, (h + 2·kv)·d]: `n_head` query
/// heads, then `n_kv_head` key heads and as many value heads, each of d columns.
pub(super) fn of_packed(
    qkv: &Tensor,
    n_head: usize,
    n_kv_head: usize,
    causal: bool,
    scale: f32,
) -> Result<AttnGeom> {
    qkv.float_op("attention")?;
    let s = qkv.shape();
    if n_head == 0 || n_kv_head == 0 || !n_head.is_multiple_of(n_kv_head) {
        bail!(
            "attention: {n_head} query heads cannot share {n_kv_head} key/value heads (the query heads must be a whole multiple of them)"
        );
    }
    let heads = n_head + 2 * n_kv_head;
    if qkv.rank() != 3 || s[2] == 0 || !s[2].is_multiple_of(heads) {
        bail!(
            "attention: expected a packed qkv projection [batch, time, (heads + 2·kv_heads)·head_dim] with {n_head} heads and {n_kv_head} kv heads, got {:?}",
            s
        );
    }
    Ok(AttnGeom {
        b: s[0],
        h: n_head,
        kv_h: n_kv_head,
        tq: s[1],
        tk: s[1],
        d: s[2] / heads,
        causal,
        scale,
    })
}

/// Geometry of one decoding step: n sequences, h heads of width d.
#[derive(Clone, Copy)]
pub(super) struct DecodeGeom {
    pub n: usize,
    pub h: usize,
    pub d: usize,
}

/// The geometry of `decode_attention`, or an error naming the operand or sequence that does not
/// fit.
pub(super) fn of_decode(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    k_caches: &[&Tensor],
    v_caches: &[&Tensor],
    lens: &[usize],
) -> Result<DecodeGeom> {
    if q.rank() != 3 || k.shape() != q.shape() || v.shape() != q.shape() {
        bail!(
            "decode_attention: q, k, v must be [n, heads, head_dim] alike, got {:?}, {:?}, {:?}",
            q.shape(),
            k.shape(),
            v.shape()
        );
    }
    let g = DecodeGeom {
        n: q.shape()[0],
        h: q.shape()[1],
        d: q.shape()[2],
    };
    if k_caches.len() != g.n || v_caches.len() != g.n || lens.len() != g.n {
        bail!(
            "decode_attention: {} sequences but {} key caches, {} value caches and {} lengths",
            g.n,
            k_caches.len(),
            v_caches.len(),
            lens.len()
        );
    }
    for (i, ((kc, vc), &len)) in k_caches.iter().zip(v_caches).zip(lens).enumerate() {
        let s = kc.shape();
        if s.len() != 4 || s[0] != 1 || s[1] != g.h || s[3] != g.d || vc.shape() != s {
            bail!(
                "decode_attention: sequence {i}: caches {:?} and {:?} do not fit [1, {}, capacity, {}]",
                s,
                vc.shape(),
                g.h,
                g.d
            );
        }
        if len >= s[2] {
            bail!(
                "decode_attention: sequence {i}: its cache holds {} positions, all filled",
                s[2]
            );
        }
        if kc.shares_storage_with(vc)
            || [q, k, v]
                .iter()
                .any(|t| t.shares_storage_with(kc) || t.shares_storage_with(vc))
        {
            bail!("decode_attention: sequence {i}: a cache shares storage with another operand");
        }
        if kc.device() != q.device() || vc.device() != q.device() {
            bail!("decode_attention: sequence {i}: cache and queries on different devices");
        }
    }
    Ok(g)
}
