//! The [`Simd`] trait, apart from the instruction sets that implement it and the dispatch
//! over them in `mod.rs`, so that neither needs the other.

/// The operations of one SIMD instruction set over f32 lanes.
///
/// # Safety
/// Implementations may only be used on CPUs that support their instruction set.
pub unsafe trait Simd: Copy + Send + Sync + 'static {
    /// A vector of `LANES` f32.
    type V: Copy;
    /// A per-lane boolean.
    type M: Copy;
    const LANES: usize;

    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn zero() -> Self::V {
        Self::splat(0.0)
    }
    /// `LANES` values from `p` (unaligned).
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    /// The first `n < LANES` values from `p`, zero in the other lanes; reads only those `n`.
    unsafe fn load_partial(p: *const f32, n: usize) -> Self::V;
    /// Writes only the first `n < LANES` lanes of `v`.
    unsafe fn store_partial(p: *mut f32, v: Self::V, n: usize);

    /// `v` with lanes `n..` set to zero (n < LANES).
    unsafe fn keep_first(v: Self::V, n: usize) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V;
    /// a·b + c with one rounding.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// c − a·b with one rounding.
    unsafe fn fnma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// Lane-wise maximum; NaN in either operand gives NaN (like `f32::maximum`).
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise minimum; NaN in either operand gives NaN.
    unsafe fn min(a: Self::V, b: Self::V) -> Self::V;
    /// `a > b ? a : b` per lane, one instruction on x86: a NaN in either operand gives `b`
    /// (for hot loops whose NaN is caught another way; see [`Simd::max`] for the strict one).
    unsafe fn max_fast(a: Self::V, b: Self::V) -> Self::V;
    /// `a < b ? a : b` per lane: a NaN in either operand gives `b`.
    unsafe fn min_fast(a: Self::V, b: Self::V) -> Self::V;
    /// 2^n for integral `n` (as f32) in [−126, 127], from the exponent bits.
    unsafe fn pow2i(n: Self::V) -> Self::V;
    unsafe fn sqrt(a: Self::V) -> Self::V;
    unsafe fn abs(a: Self::V) -> Self::V;
    /// The sign bit of `sign` on the magnitude of `mag`.
    unsafe fn copysign(mag: Self::V, sign: Self::V) -> Self::V;
    /// Round to the nearest integer, ties to even.
    unsafe fn round(a: Self::V) -> Self::V;
    /// a · 2^n for integral `n` (as f32) in [−252, 252], rounded once: overflow gives ±inf,
    /// underflow gives the correctly rounded subnormal or zero.
    unsafe fn ldexp(a: Self::V, n: Self::V) -> Self::V;
    /// For finite positive normal `a`: (m, e) with a = m · 2^e, m in [1, 2), e integral.
    unsafe fn frexp(a: Self::V) -> (Self::V, Self::V);

    unsafe fn lt(a: Self::V, b: Self::V) -> Self::M;
    unsafe fn le(a: Self::V, b: Self::V) -> Self::M;
    unsafe fn eq(a: Self::V, b: Self::V) -> Self::M;
    unsafe fn is_nan(a: Self::V) -> Self::M;
    /// `m ? a : b` per lane.
    unsafe fn select(m: Self::M, a: Self::V, b: Self::V) -> Self::V;

    unsafe fn reduce_add(a: Self::V) -> f32;
    /// Runs `f` inside a function compiled for this instruction set, so that the
    /// `#[inline(always)]` kernels `f` calls are compiled for it (a rayon task must re-enter
    /// through here: a closure does not inherit its creator's target features).
    unsafe fn vectorize<R>(f: impl FnOnce() -> R) -> R;
    /// Maximum over the lanes (NaN if any lane is NaN).
    unsafe fn reduce_max(a: Self::V) -> f32;
}
