//! One decoding step of attention for a batch of independent sequences, each against its own
//! KV cache (continuous batching: sequences of different lengths decode together).
//!
//! Reads: q, k, v [n, h, d] — one new position per sequence (views whose last dimension is
//! contiguous, e.g. thirds of a packed qkv projection, are fine) — and, for sequence i, its
//! cache k_i, v_i [1, h, capacity, d] of which the first `lens[i]` positions are filled.
//! Writes: k[i], v[i] into cache i at position lens[i] (in place; the caller then counts one
//! more cached position), and o [n, h, d] with
//! o[i, j] = softmax(scale · q[i, j] · K_i[j, 0..=lens[i]]ᵀ) · V_i[j, 0..=lens[i]].
//! Why: the projections, MLP and head of all n sequences run as one GEMM each; attention is
//! the one part that differs per sequence (its own cache and length). Doing it here in one
//! op costs one call per layer instead of several small ops per sequence. Each (sequence,
//! head) is a dot product per cached key and an axpy per cached value, read once.
//!
//! Inference only (no gradient is recorded). The step is one backend primitive
//! (`BackendStorage::decode_attention`: the CPU's kernel for f32 caches, `cpu/decode_attention.rs`);
//! where a backend declines it (CUDA, f16/bf16) the op runs the composite of device ops
//! (`decode_attention_reference`), which is also the reference it is tested against.

use std::sync::Arc;

use crate::backend::DecodeSeq;
use crate::storage::Storage;
use crate::{bail, is_grad_enabled, Result, Tensor};

/// Geometry of one step: n sequences, h heads of width d.
#[derive(Clone, Copy)]
struct Geom {
    n: usize,
    h: usize,
    d: usize,
}

fn check(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    k_caches: &[&Tensor],
    v_caches: &[&Tensor],
    lens: &[usize],
) -> Result<Geom> {
    if q.rank() != 3 || k.shape() != q.shape() || v.shape() != q.shape() {
        bail!(
            "decode_attention: q, k, v must be [n, heads, head_dim] alike, got {:?}, {:?}, {:?}",
            q.shape(),
            k.shape(),
            v.shape()
        );
    }
    let g = Geom {
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

/// Appends this step's keys and values to every sequence's cache and returns the attention
/// output [n, h, d] (see the module comment). Inference only: call it under `no_grad`.
pub fn decode_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    k_caches: &[&Tensor],
    v_caches: &[&Tensor],
    lens: &[usize],
    scale: f32,
) -> Result<Tensor> {
    let g = check(q, k, v, k_caches, v_caches, lens)?;
    if is_grad_enabled() && [q, k, v].iter().any(|t| t.tracks_grad()) {
        bail!("decode_attention: inference only; run it under no_grad");
    }
    // Every cache storage once (sequences may hold views of one pool), locked for writing in
    // address order, so that two steps over the same caches cannot deadlock.
    let mut storages: Vec<&Arc<crate::tensor::StorageCell>> = k_caches
        .iter()
        .chain(v_caches)
        .map(|t| &t.0.storage)
        .collect();
    storages.sort_by_key(|a| Arc::as_ptr(a));
    storages.dedup_by(|a, b| Arc::ptr_eq(a, b));
    let index = |t: &Tensor| {
        storages
            .iter()
            .position(|a| Arc::ptr_eq(a, &t.0.storage))
            .expect("every cache is listed")
    };
    let seqs: Vec<DecodeSeq<'_>> = (0..g.n)
        .map(|i| DecodeSeq {
            k: index(k_caches[i]),
            kl: k_caches[i].layout(),
            v: index(v_caches[i]),
            vl: v_caches[i].layout(),
            len: lens[i],
        })
        .collect();
    let out = {
        let mut guards: Vec<_> = storages
            .iter()
            .map(|a| a.write().unwrap_or_else(|e| e.into_inner()))
            .collect();
        let mut caches: Vec<&mut Storage> = guards.iter_mut().map(|g| &mut **g).collect();
        q.storage().decode_attention(
            q.layout(),
            &k.storage(),
            k.layout(),
            &v.storage(),
            v.layout(),
            &mut caches,
            &seqs,
            scale,
        )?
    };
    match out {
        Some(o) => Ok(Tensor::from_storage(o, &[g.n, g.h, g.d])),
        // This backend has no kernel for these operands.
        None => decode_attention_reference(q, k, v, k_caches, v_caches, lens, scale),
    }
}

/// The composite of device ops: per sequence, the new keys and values are assigned into the
/// cache and `fused::attention` runs the one query row against the filled positions. The
/// reference for the kernel above and the path on CUDA and for half-precision caches.
pub fn decode_attention_reference(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    k_caches: &[&Tensor],
    v_caches: &[&Tensor],
    lens: &[usize],
    scale: f32,
) -> Result<Tensor> {
    let g = check(q, k, v, k_caches, v_caches, lens)?;
    let mut rows = Vec::with_capacity(g.n);
    for (i, &len) in lens.iter().enumerate() {
        // [1, h, d] → [1, h, 1, d]: the cache's layout for one position.
        let at = |t: &Tensor| t.narrow(0, i, 1)?.unsqueeze(2);
        k_caches[i].narrow(2, len, 1)?.assign(&at(k)?)?;
        v_caches[i].narrow(2, len, 1)?.assign(&at(v)?)?;
        let (kc, vc) = (
            k_caches[i].narrow(2, 0, len + 1)?,
            v_caches[i].narrow(2, 0, len + 1)?,
        );
        rows.push(super::attention(&at(q)?, &kc, &vc, false, scale)?);
    }
    if rows.is_empty() {
        return Tensor::zeros(&[0, g.h, g.d], q.dtype(), q.device());
    }
    Tensor::cat(&rows, 0)?.reshape(&[g.n, g.h, g.d])
}
