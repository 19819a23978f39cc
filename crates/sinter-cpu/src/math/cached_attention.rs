//! One query row of one attention head against a KV cache: the attention of a decode step
//! (one new position per sequence) and of a prefill (each position against the cache up to
//! itself).
//!
//! Reads: q [d]; keys and values of n cached positions, position t's row at `t·stride` of
//! `k` and `v` (one head of a [heads, capacity, d] cache: stride d; rows may be further
//! apart). Writes: o [d] = softmax(scale·q·Kᵀ)·V, with `p` (n values) as scratch.
//! Why here: one pass per cached row (a dot product for its key, an axpy for its value, both
//! in registers: d is a head width, 32–128), with the vectorised exp; decode is where a
//! Transformer reads its whole cache per token.

use super::reduce::{dot, for_vectors, load_lanes, max, store_lanes};
use super::softmax::exp_sum_row;
use crate::simd::Simd;
use crate::{with_isa, Isa};

/// One head's cached keys and values: position t's key at `k[t·stride..][..d]`, its value
/// at `v[t·stride..][..d]`, for the first `n` positions.
#[derive(Clone, Copy, Debug)]
pub struct CachedHead<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub n: usize,
    pub stride: usize,
}

/// o = softmax(scale · q · K[0..n]ᵀ) · V[0..n] (see the module comment); `p` holds ≥ n
/// values of scratch.
///
/// # Panics
/// If n is 0 or a slice is too short for n rows of `q.len()` values at `stride` (a caller
/// bug).
pub fn attend_row(
    isa: Isa,
    q: &[f32],
    cache: CachedHead,
    scale: f32,
    p: &mut [f32],
    o: &mut [f32],
) {
    let (d, CachedHead { k, v, n, stride }) = (q.len(), cache);
    let need = (n.max(1) - 1) * stride + d;
    assert!(
        n > 0 && d > 0 && stride >= d && k.len() >= need && v.len() >= need,
        "attend_row: {n} rows of {d} at stride {stride} do not fit keys of {} and values of {}",
        k.len(),
        v.len()
    );
    assert!(
        p.len() >= n && o.len() == d,
        "attend_row: scratch {} < {n} or output {} != {d}",
        p.len(),
        o.len()
    );
    with_isa!(isa, S => attend::<S>(q, cache, scale, &mut p[..n], o))
}

#[inline(always)]
unsafe fn attend<S: Simd>(q: &[f32], c: CachedHead, scale: f32, p: &mut [f32], o: &mut [f32]) {
    let d = q.len();
    // Scores four rows at a time: four independent sums and reductions in flight (one row's
    // horizontal reduction is a chain of shuffles that a lone dot product waits out).
    let key = |t: usize| c.k.as_ptr().add(t * c.stride);
    for (i, pq) in p.chunks_exact_mut(4).enumerate() {
        let mut sums = [S::zero(); 4];
        for_vectors::<S>(
            q.as_ptr(),
            d,
            #[inline(always)]
            |at, qv, lanes| {
                for (h, s) in sums.iter_mut().enumerate() {
                    *s = S::fma(qv, load_lanes::<S>(key(4 * i + h), at, lanes), *s);
                }
            },
        );
        for (pt, s) in pq.iter_mut().zip(sums) {
            *pt = scale * S::reduce_add(s);
        }
    }
    let done = p.len() / 4 * 4;
    for (t, pt) in p.iter_mut().enumerate().skip(done) {
        *pt = scale * dot::<S>(q.as_ptr(), key(t), d);
    }
    // The weights e^(s − max) stay unnormalised: o is scaled by 1/Σ once, d values instead
    // of n.
    let pp = p.as_mut_ptr();
    let total = exp_sum_row::<S, true>(pp, pp, c.n, max::<S>(pp, c.n));
    let inv = S::splat(1.0 / total);
    // o in registers, CHUNK vectors at a time, over every cached row (one store per chunk).
    const CHUNK: usize = 4;
    let (l, op) = (S::LANES, o.as_mut_ptr());
    let mut j = 0;
    while j < d {
        let width = (CHUNK * l).min(d - j);
        let vecs = width.div_ceil(l);
        let mut acc = [S::zero(); CHUNK];
        for (t, &pt) in p.iter().enumerate() {
            let (w, vt) = (S::splat(pt), c.v.as_ptr().add(t * c.stride + j));
            for (u, a) in acc.iter_mut().enumerate().take(vecs) {
                let lanes = l.min(width - u * l);
                *a = S::fma(w, load_lanes::<S>(vt, u * l, lanes), *a);
            }
        }
        for (u, a) in acc.iter().enumerate().take(vecs) {
            store_lanes::<S>(op.add(j + u * l), S::mul(*a, inv), l.min(width - u * l));
        }
        j += width;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f64 definition.
    fn reference(q: &[f32], k: &[f32], v: &[f32], n: usize, stride: usize, scale: f32) -> Vec<f64> {
        let d = q.len();
        let s: Vec<f64> = (0..n)
            .map(|t| {
                let kt = &k[t * stride..t * stride + d];
                scale as f64
                    * q.iter()
                        .zip(kt)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..d)
            .map(|j| (0..n).map(|t| e[t] / z * v[t * stride + j] as f64).sum())
            .collect()
    }

    #[test]
    fn matches_the_definition_on_every_isa() {
        // A small LCG: values in [-1, 1).
        let mut state = 7u64;
        let mut rng = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        for isa in Isa::available() {
            for &(d, n, stride) in &[
                (32, 1, 32),
                (32, 37, 32),
                (20, 5, 24),
                (64, 130, 64),
                (3, 17, 3),
            ] {
                let q: Vec<f32> = (0..d).map(|_| rng()).collect();
                let k: Vec<f32> = (0..n * stride).map(|_| 2.0 * rng()).collect();
                let v: Vec<f32> = (0..n * stride).map(|_| rng()).collect();
                let (mut p, mut o) = (vec![0f32; n + 3], vec![f32::NAN; d]);
                let cache = CachedHead {
                    k: &k,
                    v: &v,
                    n,
                    stride,
                };
                attend_row(isa, &q, cache, 0.3, &mut p, &mut o);
                let want = reference(&q, &k, &v, n, stride, 0.3);
                for (j, (&got, &w)) in o.iter().zip(&want).enumerate() {
                    assert!(
                        (got as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
                        "{} d {d} n {n} stride {stride} [{j}]: {got} vs {w}",
                        isa.name()
                    );
                }
            }
        }
    }
}
