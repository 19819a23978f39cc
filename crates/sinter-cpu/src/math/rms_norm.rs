//! RMSNorm over rows (Llama, Mistral, Qwen): y = x / √(mean(x²) + eps) · weight.
//!
//! Reads x [rows, n] and weight [n]; writes y [rows, n]. One pass for the sum of squares,
//! one to scale, each row while in L1. No mean subtraction and no bias (unlike LayerNorm).

use super::reduce::{for_vectors, load_lanes, store_lanes};
use crate::simd::Simd;
use crate::{with_isa, Isa};

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
    // The reciprocal of the root, as the tensor path computes it (sqrt, then 1/·).
    let inv = 1.0 / (S::reduce_add(acc) / n as f32 + eps).sqrt();
    let iv = S::splat(inv);
    let wp = w.as_ptr();
    for_vectors::<S>(
        x,
        n,
        #[inline(always)]
        |i, v, lanes| {
            let o = S::mul(S::mul(v, iv), load_lanes::<S>(wp, i, lanes));
            store_lanes::<S>(y.add(i), o, lanes)
        },
    );
}

/// y = x / √(mean(x²) + eps) · weight per row of n = weight.len(), on `isa`.
///
/// # Panics
/// If x and y do not hold the same whole number of rows (a caller bug).
pub fn rms_norm_rows(isa: Isa, x: &[f32], weight: &[f32], eps: f32, y: &mut [f32]) {
    let n = weight.len();
    assert!(
        n > 0 && x.len() == y.len() && x.len().is_multiple_of(n),
        "rms_norm_rows: x {} and y {} are not rows of {n}",
        x.len(),
        y.len()
    );
    let rows = x.len() / n;
    // SAFETY: x and y hold `rows` rows of n values.
    with_isa!(isa, S => {
        for r in 0..rows {
            rms_row::<S>(x.as_ptr().add(r * n), weight, eps, y.as_mut_ptr().add(r * n));
        }
    })
}
