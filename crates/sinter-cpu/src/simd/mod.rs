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

mod ops;
mod scalar;
pub use ops::Simd;
pub use scalar::Scalar;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
pub use avx2::Avx2;
#[cfg(target_arch = "x86_64")]
pub use avx512::Avx512;

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
