//! RMSNorm over rows (Llama, Mistral, Qwen): y = x / √(mean(x²) + eps) · weight, its
//! residual form (s = x + residual, then the norm of s) and its backward.
//!
//! Reads x [rows, n] and weight [n]; writes y [rows, n]. One pass for the sum of squares,
//! one to scale, each row while in L1. No mean subtraction and no bias (unlike LayerNorm).

use super::reduce::{for_vectors, load_lanes, store_lanes};
use crate::simd::Simd;
use crate::{with_isa, Isa};

/// 1/√(mean + eps) from a vector of partial sums of squares over n values, as the tensor
/// path computes it (sqrt, then 1/·).
#[inline(always)]
unsafe fn inv_rms<S: Simd>(acc: S::V, n: usize, eps: f32) -> f32 {
    1.0 / (S::reduce_add(acc) / n as f32 + eps).sqrt()
}

/// y = x · inv · w over one row.
#[inline(always)]
unsafe fn scale_row<S: Simd>(x: *const f32, w: &[f32], inv: f32, y: *mut f32) {
    let iv = S::splat(inv);
    let wp = w.as_ptr();
    for_vectors::<S>(
        x,
        w.len(),
        #[inline(always)]
        |i, v, lanes| {
            let o = S::mul(S::mul(v, iv), load_lanes::<S>(wp, i, lanes));
            store_lanes::<S>(y.add(i), o, lanes)
        },
    );
}

#[inline(always)]
unsafe fn rms_row<S: Simd>(x: *const f32, w: &[f32], eps: f32, y: *mut f32) {
    let n = w.len();
    let mut acc = S::zero();
    for_vectors::<S>(
        x,
        n,
        #[inline(always)]
        |_, v, _| acc = S::fma(v, v, acc),
    );
    scale_row::<S>(x, w, inv_rms::<S>(acc, n, eps), y);
}

/// Panics unless every length in `lens` is `rows` rows of n > 0 (a caller bug).
fn check(what: &str, n: usize, rows: usize, lens: &[usize]) {
    assert!(
        n > 0 && lens.iter().all(|&l| l == rows * n),
        "{what}: buffers of lengths {lens:?} are not {rows} rows of {n}"
    );
}

/// y = x / √(mean(x²) + eps) · weight per row of n = weight.len(), on `isa`.
///
/// # Panics
/// If x and y do not hold the same whole number of rows (a caller bug).
pub fn rms_norm_rows(isa: Isa, x: &[f32], weight: &[f32], eps: f32, y: &mut [f32]) {
    let n = weight.len();
    let rows = x.len() / n.max(1);
    check("rms_norm_rows", n, rows, &[x.len(), y.len()]);
    // SAFETY: x and y hold `rows` rows of n values.
    with_isa!(isa, S => {
        for r in 0..rows {
            rms_row::<S>(x.as_ptr().add(r * n), weight, eps, y.as_mut_ptr().add(r * n));
        }
    })
}

/// s = x + residual and y = rms_norm(s)·weight per row, reading x and residual once: the sum
/// of squares is taken as s is written, in the order [`rms_norm_rows`] takes it, so y is
/// bit-identical to `rms_norm_rows(x + residual)`.
///
/// # Panics
/// If the buffers are not the same whole number of rows of weight.len() (a caller bug).
pub fn residual_rms_norm_rows(
    isa: Isa,
    x: &[f32],
    residual: &[f32],
    weight: &[f32],
    eps: f32,
    s: &mut [f32],
    y: &mut [f32],
) {
    let n = weight.len();
    let rows = x.len() / n.max(1);
    let lens = [x.len(), residual.len(), s.len(), y.len()];
    check("residual_rms_norm_rows", n, rows, &lens);
    // SAFETY: every buffer holds `rows` rows of n values.
    with_isa!(isa, S => {
        for r in 0..rows {
            let (sp, rp) = (s.as_mut_ptr().add(r * n), residual.as_ptr().add(r * n));
            let mut acc = S::zero();
            for_vectors::<S>(x.as_ptr().add(r * n), n, #[inline(always)] |i, v, lanes| {
                let sv = S::add(v, load_lanes::<S>(rp, i, lanes));
                acc = S::fma(sv, sv, acc);
                store_lanes::<S>(sp.add(i), sv, lanes)
            });
            scale_row::<S>(sp, weight, inv_rms::<S>(acc, n, eps), y.as_mut_ptr().add(r * n));
        }
    })
}

/// The backward of y = rms_norm(x)·weight per row, given dy: with r = 1/√(mean(x²) + eps)
/// and g = dy·weight, dx = r·g − x·r³·(g·x)/n (plus `dsum`, the gradient reaching x by
/// another path, such as the residual sum's own, when given), and dweight += Σ_rows dy·x·r.
/// The row's r is recomputed (cheaper than keeping it).
///
/// # Panics
/// If the buffers are not the same whole number of rows of weight.len() (a caller bug).
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_backward_rows(
    isa: Isa,
    x: &[f32],
    weight: &[f32],
    eps: f32,
    dy: &[f32],
    dsum: Option<&[f32]>,
    dx: &mut [f32],
    dweight: &mut [f32],
) {
    let n = weight.len();
    let rows = x.len() / n.max(1);
    let lens = [
        x.len(),
        dy.len(),
        dx.len(),
        dsum.map_or(x.len(), <[f32]>::len),
    ];
    check("rms_norm_backward_rows", n, rows, &lens);
    assert_eq!(dweight.len(), n, "rms_norm_backward_rows: dweight length");
    // SAFETY: every buffer holds `rows` rows of n values, the weights n.
    with_isa!(isa, S => {
        let (wp, dwp) = (weight.as_ptr(), dweight.as_mut_ptr());
        for r in 0..rows {
            let (xp, gp, dp) = (x.as_ptr().add(r * n), dy.as_ptr().add(r * n), dx.as_mut_ptr().add(r * n));
            // Pass 1: Σ x² and Σ dy·w·x (tail lanes load as zero, so add nothing).
            let (mut sq, mut dot) = (S::zero(), S::zero());
            for_vectors::<S>(xp, n, #[inline(always)] |i, v, lanes| {
                sq = S::fma(v, v, sq);
                let g = S::mul(load_lanes::<S>(gp, i, lanes), load_lanes::<S>(wp, i, lanes));
                dot = S::fma(g, v, dot);
            });
            let inv = inv_rms::<S>(sq, n, eps);
            let (iv, kv) = (S::splat(inv), S::splat(inv * inv * inv * S::reduce_add(dot) / n as f32));
            // Pass 2: dx and dweight.
            let sp = dsum.map(|d| d.as_ptr().add(r * n));
            for_vectors::<S>(xp, n, #[inline(always)] |i, v, lanes| {
                let gv = load_lanes::<S>(gp, i, lanes);
                let g = S::mul(S::mul(iv, gv), load_lanes::<S>(wp, i, lanes));
                let mut d = S::fnma(v, kv, g);
                if let Some(sp) = sp {
                    d = S::add(d, load_lanes::<S>(sp, i, lanes));
                }
                store_lanes::<S>(dp.add(i), d, lanes);
                let dwv = S::fma(S::mul(gv, v), iv, load_lanes::<S>(dwp, i, lanes));
                store_lanes::<S>(dwp.add(i), dwv, lanes);
            });
        }
    })
}
