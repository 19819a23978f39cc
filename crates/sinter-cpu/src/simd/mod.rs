//! One vector vocabulary for every kernel: the [`Simd`] trait names the operations the GEMM
//! micro-kernels and the math polynomials need, and each instruction set implements it once
//! ([`Avx512`]: 16 lanes, [`Avx2`]: 8 lanes with FMA, [`Scalar`]: 1 lane, portable). A kernel
//! is written once as a generic `#[inline(always)]` function over `S: Simd` and instantiated
//! inside a `#[target_feature]` entry point per ISA (see [`with_isa!`]), so the intrinsics are
//! inlined into code compiled for that ISA and never called on a CPU that lacks it.
//!
//! Every method is `unsafe`: it may only run when the CPU has the type's ISA (the dispatch
//! checks [`crate::Isa`]) and, for loads and stores, when the pointers are valid for the lanes
//! touched.

mod scalar;
pub use scalar::Scalar;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
pub use avx2::Avx2;
#[cfg(target_arch = "x86_64")]
pub use avx512::Avx512;

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

/// `lanes` values from `p + i`: a full vector, or a zero-padded tail when `lanes < LANES`.
///
/// # Safety
/// `p + i .. p + i + lanes` is readable; the CPU has `S`'s ISA.
#[inline(always)]
pub(crate) unsafe fn load_lanes<S: Simd>(p: *const f32, i: usize, lanes: usize) -> S::V {
    if lanes == S::LANES {
        S::load(p.add(i))
    } else {
        S::load_partial(p.add(i), lanes)
    }
}

/// Writes the first `lanes` lanes of `v` at `p`.
///
/// # Safety
/// `p .. p + lanes` is writable; the CPU has `S`'s ISA.
#[inline(always)]
pub(crate) unsafe fn store_lanes<S: Simd>(p: *mut f32, v: S::V, lanes: usize) {
    if lanes == S::LANES {
        S::store(p, v)
    } else {
        S::store_partial(p, v, lanes)
    }
}

/// Runs `$body` with the type alias `$S` bound to the [`Simd`] implementation of `$isa`,
/// inside a function compiled for that instruction set ([`Simd::vectorize`]). The generic
/// kernels `$body` calls are `#[inline(always)]`, so they are compiled for the ISA too.
/// `$body` runs in an `unsafe` context: the caller states the safety of what it calls.
#[macro_export]
#[doc(hidden)]
macro_rules! with_isa {
    ($isa:expr, $S:ident => $body:expr) => {{
        match $isa {
            #[cfg(target_arch = "x86_64")]
            $crate::Isa::Avx512 => {
                type $S = $crate::simd::Avx512;
                // SAFETY: Isa::Avx512 is only chosen when the CPU has it.
                unsafe {
                    <$S as $crate::simd::Simd>::vectorize(
                        #[inline(always)]
                        || $body,
                    )
                }
            }
            #[cfg(target_arch = "x86_64")]
            $crate::Isa::Avx2 => {
                type $S = $crate::simd::Avx2;
                // SAFETY: Isa::Avx2 is only chosen when the CPU has AVX2 and FMA.
                unsafe {
                    <$S as $crate::simd::Simd>::vectorize(
                        #[inline(always)]
                        || $body,
                    )
                }
            }
            _ => {
                type $S = $crate::simd::Scalar;
                #[allow(unused_unsafe)]
                unsafe {
                    $body
                }
            }
        }
    }};
}
