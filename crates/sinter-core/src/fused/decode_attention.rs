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
//! Inference only (no gradient is recorded). On the CPU with f32 caches it runs the kernel
//! below; elsewhere (CUDA, f16/bf16) it is the composite of device ops
//! (`decode_attention_reference`), which is also the reference it is tested against.

use rayon::prelude::*;

use crate::cpu::CpuStorage;
use crate::storage::Storage;
use crate::{bail, is_grad_enabled, DType, Result, Tensor};

/// Below this many multiply-adds a step runs on the calling thread (rayon's fork/join costs
/// more than it saves).
const PAR_WORK: usize = 1 << 20;

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
        if kc.shares_storage_with(vc) || [q, k, v].iter().any(|t| t.shares_storage_with(kc)) {
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
    let all_f32 = [q, k, v]
        .iter()
        .chain(k_caches)
        .chain(v_caches)
        .all(|t| t.dtype() == DType::F32);
    let unit_last = k_caches
        .iter()
        .chain(v_caches)
        .all(|t| t.layout().strides()[3] == 1);
    if q.device().is_cuda() || !all_f32 || !unit_last {
        return decode_attention_reference(q, k, v, k_caches, v_caches, lens, scale);
    }
    let (qv, kv, vv) = (q.to_vec_f32()?, k.to_vec_f32()?, v.to_vec_f32()?);
    let row = g.h * g.d;
    let mut out = vec![0f32; g.n * row];
    let work: usize = lens.iter().map(|&l| (l + 1) * row * 2).sum();
    let one = |(i, o): (usize, &mut [f32])| {
        let rows = i * row..(i + 1) * row;
        let mut kc = k_caches[i]
            .0
            .storage
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let mut vc = v_caches[i]
            .0
            .storage
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let (Storage::Cpu(CpuStorage::F32(kc)), Storage::Cpu(CpuStorage::F32(vc))) =
            (&mut *kc, &mut *vc)
        else {
            unreachable!("checked: f32 caches on the CPU")
        };
        let cache = CacheGeom::of(k_caches[i], v_caches[i], lens[i]);
        cache.append(kc, vc, &kv[rows.clone()], &vv[rows.clone()]);
        cache.attend(kc, vc, &qv[rows], scale, o);
    };
    // Sequences run in parallel only when no two of them share a cache storage (views of one
    // pool): each task locks its own two caches, and shared ones could lock in a cycle.
    let mut storages: Vec<*const _> = k_caches
        .iter()
        .chain(v_caches)
        .map(|t| std::sync::Arc::as_ptr(&t.0.storage))
        .collect();
    storages.sort();
    storages.dedup();
    if work >= PAR_WORK && g.n > 1 && storages.len() == 2 * g.n {
        out.par_chunks_mut(row).enumerate().for_each(one);
    } else {
        out.chunks_mut(row).enumerate().for_each(one);
    }
    Ok(Tensor::from_storage(
        Storage::Cpu(CpuStorage::F32(out)),
        &[g.n, g.h, g.d],
    ))
}

/// Where one sequence's cached rows live: element (0, head, t, j) of the key cache is at
/// `k_off + head·k_sh + t·k_st + j` (likewise for values); `len` positions are filled before
/// this step's.
struct CacheGeom {
    h: usize,
    d: usize,
    len: usize,
    k: (usize, usize, usize),
    v: (usize, usize, usize),
}

impl CacheGeom {
    fn of(k: &Tensor, v: &Tensor, len: usize) -> CacheGeom {
        let at = |t: &Tensor| {
            let l = t.layout();
            (l.offset(), l.strides()[1], l.strides()[2])
        };
        CacheGeom {
            h: k.shape()[1],
            d: k.shape()[3],
            len,
            k: at(k),
            v: at(v),
        }
    }
    fn row(&self, (off, sh, st): (usize, usize, usize), head: usize, t: usize) -> usize {
        off + head * sh + t * st
    }
    /// Writes the new position's keys and values ([h·d] each) at `len`.
    fn append(&self, kc: &mut [f32], vc: &mut [f32], k: &[f32], v: &[f32]) {
        let d = self.d;
        for j in 0..self.h {
            let (ka, va) = (self.row(self.k, j, self.len), self.row(self.v, j, self.len));
            kc[ka..ka + d].copy_from_slice(&k[j * d..(j + 1) * d]);
            vc[va..va + d].copy_from_slice(&v[j * d..(j + 1) * d]);
        }
    }
    /// o[j] = softmax over t ≤ len of scale·q[j]·K[j, t], applied to V[j, t], per head j.
    fn attend(&self, kc: &[f32], vc: &[f32], q: &[f32], scale: f32, o: &mut [f32]) {
        let (d, n) = (self.d, self.len + 1);
        let mut p = vec![0f32; n];
        for j in 0..self.h {
            let qj = &q[j * d..(j + 1) * d];
            let mut max = f32::NEG_INFINITY;
            for (t, pt) in p.iter_mut().enumerate() {
                let ka = self.row(self.k, j, t);
                *pt = scale * dot(qj, &kc[ka..ka + d]);
                max = max.max(*pt);
            }
            let mut sum = 0f32;
            for pt in p.iter_mut() {
                *pt = (*pt - max).exp();
                sum += *pt;
            }
            let oj = &mut o[j * d..(j + 1) * d];
            for (t, &pt) in p.iter().enumerate() {
                let va = self.row(self.v, j, t);
                axpy(pt / sum, &vc[va..va + d], oj);
            }
        }
    }
}

/// Σ a·b in 8 independent partial sums (vectorisable; the order is fixed, so results are
/// deterministic).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// y += alpha · x.
#[inline]
fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
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
