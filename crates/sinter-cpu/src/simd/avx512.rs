//! AVX-512 (F/BW/VL/DQ): 16 lanes in a `__m512`; masks are `__mmask16` bit masks, so partial
//! loads and stores are single masked instructions and `ldexp` is one `vscalefps`.

use std::arch::x86_64::*;

use super::ops::Simd;

#[derive(Clone, Copy, Debug)]
pub struct Avx512;

#[inline(always)]
fn first_lanes(n: usize) -> __mmask16 {
    ((1u32 << n) - 1) as __mmask16
}

// SAFETY: used only behind Isa::Avx512 (F, BW, VL and DQ detected).
unsafe impl Simd for Avx512 {
    type V = __m512;
    type M = __mmask16;
    const LANES: usize = 16;

    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn load_partial(p: *const f32, n: usize) -> __m512 {
        _mm512_maskz_loadu_ps(first_lanes(n), p)
    }
    #[inline(always)]
    unsafe fn store_partial(p: *mut f32, v: __m512, n: usize) {
        _mm512_mask_storeu_ps(p, first_lanes(n), v)
    }
    #[inline(always)]
    unsafe fn keep_first(v: __m512, n: usize) -> __m512 {
        _mm512_maskz_mov_ps(first_lanes(n), v)
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        _mm512_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn div(a: __m512, b: __m512) -> __m512 {
        _mm512_div_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn fnma(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fnmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        let m = _mm512_max_ps(a, b);
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, b);
        _mm512_mask_blend_ps(nan, m, _mm512_add_ps(a, b))
    }
    #[inline(always)]
    unsafe fn min(a: __m512, b: __m512) -> __m512 {
        let m = _mm512_min_ps(a, b);
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, b);
        _mm512_mask_blend_ps(nan, m, _mm512_add_ps(a, b))
    }
    #[inline(always)]
    unsafe fn max_fast(a: __m512, b: __m512) -> __m512 {
        _mm512_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn min_fast(a: __m512, b: __m512) -> __m512 {
        _mm512_min_ps(a, b)
    }
    #[inline(always)]
    unsafe fn pow2i(n: __m512) -> __m512 {
        let e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
        _mm512_castsi512_ps(_mm512_slli_epi32::<23>(e))
    }
    #[inline(always)]
    unsafe fn sqrt(a: __m512) -> __m512 {
        _mm512_sqrt_ps(a)
    }
    #[inline(always)]
    unsafe fn abs(a: __m512) -> __m512 {
        _mm512_abs_ps(a)
    }
    #[inline(always)]
    unsafe fn copysign(mag: __m512, sign: __m512) -> __m512 {
        let s = _mm512_set1_ps(-0.0);
        _mm512_or_ps(_mm512_andnot_ps(s, mag), _mm512_and_ps(s, sign))
    }
    #[inline(always)]
    unsafe fn round(a: __m512) -> __m512 {
        _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a)
    }
    #[inline(always)]
    unsafe fn ldexp(a: __m512, n: __m512) -> __m512 {
        _mm512_scalef_ps(a, n)
    }
    #[inline(always)]
    unsafe fn frexp(a: __m512) -> (__m512, __m512) {
        (
            _mm512_getmant_ps::<_MM_MANT_NORM_1_2, _MM_MANT_SIGN_SRC>(a),
            _mm512_getexp_ps(a),
        )
    }
    #[inline(always)]
    unsafe fn lt(a: __m512, b: __m512) -> __mmask16 {
        _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b)
    }
    #[inline(always)]
    unsafe fn le(a: __m512, b: __m512) -> __mmask16 {
        _mm512_cmp_ps_mask::<_CMP_LE_OQ>(a, b)
    }
    #[inline(always)]
    unsafe fn eq(a: __m512, b: __m512) -> __mmask16 {
        _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, b)
    }
    #[inline(always)]
    unsafe fn is_nan(a: __m512) -> __mmask16 {
        _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a)
    }
    #[inline(always)]
    unsafe fn select(m: __mmask16, a: __m512, b: __m512) -> __m512 {
        _mm512_mask_blend_ps(m, b, a)
    }
    #[inline(always)]
    unsafe fn vectorize<R>(f: impl FnOnce() -> R) -> R {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
        unsafe fn inner<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        inner(f)
    }
    #[inline(always)]
    unsafe fn reduce_add(a: __m512) -> f32 {
        _mm512_reduce_add_ps(a)
    }
    #[inline(always)]
    unsafe fn reduce_max(a: __m512) -> f32 {
        if _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a) != 0 {
            return f32::NAN;
        }
        _mm512_reduce_max_ps(a)
    }
}
