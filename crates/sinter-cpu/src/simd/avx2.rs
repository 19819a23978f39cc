//! AVX2 + FMA: 8 lanes in a `__m256`; masks are all-ones/all-zeros lanes.

use std::arch::x86_64::*;

use super::ops::Simd;

#[derive(Clone, Copy, Debug)]
pub struct Avx2;

/// An integer mask whose first `n` lanes are set (for the partial loads and stores).
#[inline(always)]
unsafe fn first_lanes(n: usize) -> __m256i {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), idx)
}

/// 2^n for integral n (as f32) in [−126, 127], built from the exponent bits.
#[inline(always)]
unsafe fn pow2i(n: __m256) -> __m256 {
    let e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e))
}

// SAFETY: used only behind Isa::Avx2 (AVX2 + FMA detected).
unsafe impl Simd for Avx2 {
    type V = __m256;
    type M = __m256;
    const LANES: usize = 8;

    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        _mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        _mm256_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn load_partial(p: *const f32, n: usize) -> __m256 {
        _mm256_maskload_ps(p, first_lanes(n))
    }
    #[inline(always)]
    unsafe fn store_partial(p: *mut f32, v: __m256, n: usize) {
        _mm256_maskstore_ps(p, first_lanes(n), v)
    }
    #[inline(always)]
    unsafe fn keep_first(v: __m256, n: usize) -> __m256 {
        _mm256_and_ps(v, _mm256_castsi256_ps(first_lanes(n)))
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        _mm256_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn div(a: __m256, b: __m256) -> __m256 {
        _mm256_div_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn fnma(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fnmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        // maxps returns its second operand when either is NaN: put a NaN back explicitly.
        let m = _mm256_max_ps(a, b);
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(a, b);
        _mm256_blendv_ps(m, _mm256_add_ps(a, b), nan)
    }
    #[inline(always)]
    unsafe fn min(a: __m256, b: __m256) -> __m256 {
        let m = _mm256_min_ps(a, b);
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(a, b);
        _mm256_blendv_ps(m, _mm256_add_ps(a, b), nan)
    }
    #[inline(always)]
    unsafe fn max_fast(a: __m256, b: __m256) -> __m256 {
        _mm256_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn min_fast(a: __m256, b: __m256) -> __m256 {
        _mm256_min_ps(a, b)
    }
    #[inline(always)]
    unsafe fn pow2i(n: __m256) -> __m256 {
        pow2i(n)
    }
    #[inline(always)]
    unsafe fn sqrt(a: __m256) -> __m256 {
        _mm256_sqrt_ps(a)
    }
    #[inline(always)]
    unsafe fn abs(a: __m256) -> __m256 {
        _mm256_andnot_ps(_mm256_set1_ps(-0.0), a)
    }
    #[inline(always)]
    unsafe fn copysign(mag: __m256, sign: __m256) -> __m256 {
        let s = _mm256_set1_ps(-0.0);
        _mm256_or_ps(_mm256_andnot_ps(s, mag), _mm256_and_ps(s, sign))
    }
    #[inline(always)]
    unsafe fn round(a: __m256) -> __m256 {
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a)
    }
    #[inline(always)]
    unsafe fn ldexp(a: __m256, n: __m256) -> __m256 {
        let n1 = _mm256_floor_ps(_mm256_mul_ps(n, _mm256_set1_ps(0.5)));
        let n2 = _mm256_sub_ps(n, n1);
        _mm256_mul_ps(_mm256_mul_ps(a, pow2i(n1)), pow2i(n2))
    }
    #[inline(always)]
    unsafe fn frexp(a: __m256) -> (__m256, __m256) {
        let bits = _mm256_castps_si256(a);
        let e = _mm256_sub_epi32(_mm256_srli_epi32::<23>(bits), _mm256_set1_epi32(127));
        let m = _mm256_or_si256(
            _mm256_and_si256(bits, _mm256_set1_epi32(0x007f_ffff)),
            _mm256_set1_epi32(0x3f80_0000),
        );
        (_mm256_castsi256_ps(m), _mm256_cvtepi32_ps(e))
    }
    #[inline(always)]
    unsafe fn lt(a: __m256, b: __m256) -> __m256 {
        _mm256_cmp_ps::<_CMP_LT_OQ>(a, b)
    }
    #[inline(always)]
    unsafe fn le(a: __m256, b: __m256) -> __m256 {
        _mm256_cmp_ps::<_CMP_LE_OQ>(a, b)
    }
    #[inline(always)]
    unsafe fn eq(a: __m256, b: __m256) -> __m256 {
        _mm256_cmp_ps::<_CMP_EQ_OQ>(a, b)
    }
    #[inline(always)]
    unsafe fn is_nan(a: __m256) -> __m256 {
        _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a)
    }
    #[inline(always)]
    unsafe fn select(m: __m256, a: __m256, b: __m256) -> __m256 {
        _mm256_blendv_ps(b, a, m)
    }
    #[inline(always)]
    unsafe fn vectorize<R>(f: impl FnOnce() -> R) -> R {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn inner<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        inner(f)
    }
    #[inline(always)]
    unsafe fn reduce_add(a: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
    #[inline(always)]
    unsafe fn reduce_max(a: __m256) -> f32 {
        let s = Self::max(a, _mm256_permute2f128_ps::<1>(a, a));
        let s = Self::max(s, _mm256_permute_ps::<0b01_00_11_10>(s));
        let s = Self::max(s, _mm256_permute_ps::<0b10_11_00_01>(s));
        _mm256_cvtss_f32(s)
    }
}
