//! The portable one-lane implementation: plain f32 arithmetic (with `mul_add` for FMA, so the
//! polynomials round exactly as the vector paths do).

use super::ops::Simd;

#[derive(Clone, Copy, Debug)]
pub struct Scalar;

// SAFETY: plain Rust, valid on every CPU.
unsafe impl Simd for Scalar {
    type V = f32;
    type M = bool;
    const LANES: usize = 1;

    #[inline(always)]
    unsafe fn splat(x: f32) -> f32 {
        x
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> f32 {
        *p
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: f32) {
        *p = v
    }
    #[inline(always)]
    unsafe fn load_partial(_p: *const f32, _n: usize) -> f32 {
        0.0 // n < 1 lane: nothing to read
    }
    #[inline(always)]
    unsafe fn store_partial(_p: *mut f32, _v: f32, _n: usize) {}
    #[inline(always)]
    unsafe fn keep_first(_v: f32, _n: usize) -> f32 {
        0.0 // n < 1 lane
    }
    #[inline(always)]
    unsafe fn add(a: f32, b: f32) -> f32 {
        a + b
    }
    #[inline(always)]
    unsafe fn sub(a: f32, b: f32) -> f32 {
        a - b
    }
    #[inline(always)]
    unsafe fn mul(a: f32, b: f32) -> f32 {
        a * b
    }
    #[inline(always)]
    unsafe fn div(a: f32, b: f32) -> f32 {
        a / b
    }
    #[inline(always)]
    unsafe fn fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
    #[inline(always)]
    unsafe fn fnma(a: f32, b: f32, c: f32) -> f32 {
        (-a).mul_add(b, c)
    }
    #[inline(always)]
    unsafe fn max(a: f32, b: f32) -> f32 {
        if a.is_nan() || b.is_nan() {
            f32::NAN
        } else {
            a.max(b)
        }
    }
    #[inline(always)]
    unsafe fn min(a: f32, b: f32) -> f32 {
        if a.is_nan() || b.is_nan() {
            f32::NAN
        } else {
            a.min(b)
        }
    }
    #[inline(always)]
    unsafe fn max_fast(a: f32, b: f32) -> f32 {
        if a > b {
            a
        } else {
            b
        }
    }
    #[inline(always)]
    unsafe fn min_fast(a: f32, b: f32) -> f32 {
        if a < b {
            a
        } else {
            b
        }
    }
    #[inline(always)]
    unsafe fn pow2i(n: f32) -> f32 {
        pow2i(n)
    }
    #[inline(always)]
    unsafe fn sqrt(a: f32) -> f32 {
        a.sqrt()
    }
    #[inline(always)]
    unsafe fn abs(a: f32) -> f32 {
        a.abs()
    }
    #[inline(always)]
    unsafe fn copysign(mag: f32, sign: f32) -> f32 {
        mag.copysign(sign)
    }
    #[inline(always)]
    unsafe fn round(a: f32) -> f32 {
        a.round_ties_even()
    }
    #[inline(always)]
    unsafe fn ldexp(a: f32, n: f32) -> f32 {
        // Two steps of 2^(n/2) keep each factor a normal number; the second product is the
        // only rounding (the first is exact) for every result, subnormal ones included.
        let n1 = (n * 0.5).floor();
        let n2 = n - n1;
        a * pow2i(n1) * pow2i(n2)
    }
    #[inline(always)]
    unsafe fn frexp(a: f32) -> (f32, f32) {
        let bits = a.to_bits();
        let e = ((bits >> 23) & 0xff) as i32 - 127;
        (f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000), e as f32)
    }
    #[inline(always)]
    unsafe fn lt(a: f32, b: f32) -> bool {
        a < b
    }
    #[inline(always)]
    unsafe fn le(a: f32, b: f32) -> bool {
        a <= b
    }
    #[inline(always)]
    unsafe fn eq(a: f32, b: f32) -> bool {
        a == b
    }
    #[inline(always)]
    unsafe fn is_nan(a: f32) -> bool {
        a.is_nan()
    }
    #[inline(always)]
    unsafe fn select(m: bool, a: f32, b: f32) -> f32 {
        if m {
            a
        } else {
            b
        }
    }
    #[inline(always)]
    unsafe fn vectorize<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
    #[inline(always)]
    unsafe fn reduce_add(a: f32) -> f32 {
        a
    }
    #[inline(always)]
    unsafe fn reduce_max(a: f32) -> f32 {
        a
    }
}

/// 2^n for integral n in [−126, 127], built from the exponent bits.
#[inline(always)]
fn pow2i(n: f32) -> f32 {
    f32::from_bits(((n as i32 + 127) as u32) << 23)
}
