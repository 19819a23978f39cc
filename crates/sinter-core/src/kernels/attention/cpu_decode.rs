//! One decoding step of attention on the CPU (the kernel of `decode_attention`; see `mod.rs`
//! for what it computes): per sequence, this step's keys and values are written into its f32
//! caches at its length, then each head's query attends over the filled positions — a dot
//! product per cached key and an axpy per cached value, each row read once. Sequences run in
//! parallel when the step has enough work and no two of them share a cache storage.

use rayon::prelude::*;
use sinter_cpu::math::dot_lanes;

use super::geom::DecodeSeq;
use crate::backend::BackendStorage;
use crate::cpu::CpuStorage;
use crate::{Layout, Result};

/// Below this many multiply-adds a step runs on the calling thread (rayon's fork/join costs
/// more than it saves).
const PAR_WORK: usize = 1 << 20;

/// o [n, h, d] of the step, or None when an operand is not f32 or a cache row is not
/// contiguous (the op then runs its composite). `caches` holds every cache storage once.
pub(super) fn decode_attention(
    (q, ql): (&CpuStorage, &Layout),
    (k, kl): (&CpuStorage, &Layout),
    (v, vl): (&CpuStorage, &Layout),
    caches: &mut [&mut CpuStorage],
    seqs: &[DecodeSeq<'_>],
    scale: f32,
) -> Result<Option<CpuStorage>> {
    let f32_data = |s: &CpuStorage| matches!(s, CpuStorage::F32(_));
    let unit_last = seqs
        .iter()
        .all(|s| s.kl.strides()[3] == 1 && s.vl.strides()[3] == 1);
    if ![q, k, v].into_iter().all(f32_data) || !caches.iter().all(|c| f32_data(c)) || !unit_last {
        return Ok(None);
    }
    let f32s = |s: &CpuStorage, l: &Layout| -> Result<Vec<f32>> {
        match s.copy_strided(l)? {
            CpuStorage::F32(v) => Ok(v),
            _ => unreachable!("checked: f32"),
        }
    };
    let (qv, kv, vv) = (f32s(q, ql)?, f32s(k, kl)?, f32s(v, vl)?);
    let (h, d) = (ql.shape()[1], ql.shape()[2]);
    let row = h * d;
    let mut out = vec![0f32; seqs.len() * row];
    let one = |i: usize, o: &mut [f32], kc: &mut [f32], vc: &mut [f32]| {
        let rows = i * row..(i + 1) * row;
        let cache = CacheGeom::of(&seqs[i], h, d);
        cache.append(kc, vc, &kv[rows.clone()], &vv[rows.clone()]);
        cache.attend(kc, vc, &qv[rows], scale, o);
    };
    let work: usize = seqs.iter().map(|s| (s.len + 1) * row * 2).sum();
    let mut data: Vec<Option<&mut Vec<f32>>> = caches
        .iter_mut()
        .map(|c| match &mut **c {
            CpuStorage::F32(v) => Some(v),
            _ => unreachable!("checked: f32"),
        })
        .collect();
    if work >= PAR_WORK && seqs.len() > 1 && data.len() == 2 * seqs.len() {
        // Two storages per sequence, none shared: each task owns its pair.
        let pairs: Vec<(&mut Vec<f32>, &mut Vec<f32>)> = seqs
            .iter()
            .map(|s| {
                let kc = data[s.k].take().expect("a storage per cache");
                let vc = data[s.v].take().expect("a storage per cache");
                (kc, vc)
            })
            .collect();
        out.par_chunks_mut(row)
            .zip(pairs)
            .enumerate()
            .for_each(|(i, (o, (kc, vc)))| one(i, o, kc, vc));
    } else {
        for (i, o) in out.chunks_mut(row).enumerate() {
            let (kc, vc) = two_mut(&mut data, seqs[i].k, seqs[i].v);
            one(i, o, kc, vc);
        }
    }
    Ok(Some(CpuStorage::F32(out)))
}

/// The vectors at two different indices.
fn two_mut<'a>(
    data: &'a mut [Option<&mut Vec<f32>>],
    a: usize,
    b: usize,
) -> (&'a mut [f32], &'a mut [f32]) {
    assert_ne!(
        a, b,
        "a key cache is never its value cache (checked by the op)"
    );
    let (lo, hi) = data.split_at_mut(a.max(b));
    let (x, y) = (
        lo[a.min(b)].as_deref_mut().expect("present"),
        hi[0].as_deref_mut().expect("present"),
    );
    if a < b {
        (x, y)
    } else {
        (y, x)
    }
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
    fn of(s: &DecodeSeq<'_>, h: usize, d: usize) -> CacheGeom {
        let at = |l: &Layout| (l.offset(), l.strides()[1], l.strides()[2]);
        CacheGeom {
            h,
            d,
            len: s.len,
            k: at(s.kl),
            v: at(s.vl),
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
                *pt = scale * dot_lanes(qj, &kc[ka..ka + d]);
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

/// y += alpha · x.
#[inline]
fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}
