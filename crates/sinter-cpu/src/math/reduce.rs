//! Row reductions shared by the fused row kernels: one vector accumulator per pass and a
//! masked tail, so a row of any length is read once per pass in vector loads.

use crate::simd::Simd;
pub(crate) use crate::simd::{load_lanes, store_lanes};

/// Calls `f(offset, vector, lanes)` over `n` values in full vectors and one masked tail
/// (lanes past `lanes` are zero in the tail vector).
#[inline(always)]
pub(crate) unsafe fn for_vectors<S: Simd>(
    p: *const f32,
    n: usize,
    mut f: impl FnMut(usize, S::V, usize),
) {
    let l = S::LANES;
    let mut i = 0;
    while i + l <= n {
        f(i, S::load(p.add(i)), l);
        i += l;
    }
    if i < n {
        f(i, S::load_partial(p.add(i), n - i), n - i);
    }
}

/// max over n ≥ 1 values (NaN if any is NaN).
#[inline(always)]
pub(crate) unsafe fn max<S: Simd>(p: *const f32, n: usize) -> f32 {
    let mut m = S::splat(f32::NEG_INFINITY);
    let l = S::LANES;
    let mut i = 0;
    while i + l <= n {
        m = S::max(m, S::load(p.add(i)));
        i += l;
    }
    let mut r = S::reduce_max(m);
    while i < n {
        let v = *p.add(i);
        r = if v.is_nan() || r.is_nan() {
            f32::NAN
        } else {
            r.max(v)
        };
        i += 1;
    }
    r
}

/// Σ values.
#[inline(always)]
pub(crate) unsafe fn sum<S: Simd>(p: *const f32, n: usize) -> f32 {
    let mut s = S::zero();
    for_vectors::<S>(
        p,
        n,
        #[inline(always)]
        |_, v, _| s = S::add(s, v),
    );
    S::reduce_add(s)
}

/// Σ a·b.
#[inline(always)]
pub(crate) unsafe fn dot<S: Simd>(a: *const f32, b: *const f32, n: usize) -> f32 {
    let mut s = S::zero();
    for_vectors::<S>(
        a,
        n,
        #[inline(always)]
        |i, v, lanes| s = S::fma(v, load_lanes::<S>(b, i, lanes), s),
    );
    S::reduce_add(s)
}

/// Σ a·b over slices in eight running sums: portable code the compiler vectorises at the
/// build's baseline ISA (an in-order f32 sum does not vectorise), with a fixed summation
/// order, so results are deterministic. For f32 or int8 values a (as f32).
#[inline]
pub fn dot_lanes<T: Copy + Into<f32>>(a: &[T], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(&x, &y)| x.into() * y)
        .sum();
    for (xs, ys) in ac.zip(bc) {
        for ((s, &x), &y) in acc.iter_mut().zip(xs).zip(ys) {
            *s += x.into() * y;
        }
    }
    acc.iter().sum::<f32>() + tail
}
