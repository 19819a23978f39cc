//! erf, erfc and the normal CDF Φ as vector functions.
//!
//! |x| < 1: erf(x) = x + x·(Q(x²) − 1), Q of degree 6 (near-minimax fit, 1.2e-9 relative).
//! |x| ≥ 1: erfc(x) = (1/x)·exp(R(1/x) − x²), R of degree 11 in u = (1/x − 0.55)/0.45 (fit to
//! 7.5e-9 absolute on 1/x in [0.1, 1], i.e. |x| up to 10; beyond it erfc underflows). x² is
//! carried as an exact sum p + e (FMA) and the exponent's rounding error is folded back in,
//! so erfc keeps its relative accuracy in the tail (where GELU-erf of negative inputs lives).

use super::exp_log::exp;
use crate::simd::Simd;

/// Q(z) − 1: the leading 1 is added as x itself, exactly (x + x·(Q − 1)).
const ERF_Q1: [f32; 7] = [
    0.128_379_17,
    -0.376_126_26,
    0.112_835_854,
    -0.026_853_813,
    0.005_188_328,
    -0.000_801_019_2,
    7.853_848e-5,
];

const ERFC_R: [f32; 12] = [
    -0.688_451_35,
    -0.152_314_71,
    -0.019_809_125,
    0.015_413_822,
    -0.005_554_401,
    0.001_128_736,
    0.000_139_533_12,
    -0.000_297_406_83,
    0.000_240_857_7,
    -0.000_107_641_87,
    -2.020_826_3e-5,
    2.640_481_4e-5,
];

#[inline(always)]
unsafe fn horner<S: Simd>(c: &[f32], x: S::V) -> S::V {
    let mut p = S::splat(c[c.len() - 1]);
    for &k in c[..c.len() - 1].iter().rev() {
        p = S::fma(p, x, S::splat(k));
    }
    p
}

/// erf(x) for |x| < 1 (odd, keeps the sign of x).
#[inline(always)]
unsafe fn erf_small<S: Simd>(x: S::V) -> S::V {
    S::fma(x, horner::<S>(&ERF_Q1, S::mul(x, x)), x)
}

/// erfc(a) for a ≥ 1 (any larger a, inf included).
#[inline(always)]
unsafe fn erfc_large<S: Simd>(a: S::V) -> S::V {
    // erfc(10.5) < 1e-48 is 0 in f32; the cap keeps inf out of the exact-square trick.
    let a = S::min(a, S::splat(10.5));
    let t = S::div(S::splat(1.0), a);
    let u = S::fma(
        S::max(t, S::splat(0.1)),
        S::splat(1.0 / 0.45),
        S::splat(-0.55 / 0.45),
    );
    let r = horner::<S>(&ERFC_R, u);
    // a² = p + e exactly; s + d = r − p exactly (two-sum); exp(r − a²) = e^s · (1 + d − e).
    let p = S::mul(a, a);
    let e = S::fma(a, a, S::sub(S::zero(), p));
    let s = S::sub(r, p);
    let bp = S::sub(s, r);
    let d = S::add(S::sub(r, S::sub(s, bp)), S::sub(S::sub(S::zero(), p), bp));
    let corr = S::add(S::splat(1.0), S::sub(d, e));
    S::mul(S::mul(t, exp::<S>(s)), corr)
}

#[inline(always)]
pub(crate) unsafe fn erf<S: Simd>(x: S::V) -> S::V {
    let a = S::abs(x);
    let large = S::copysign(
        S::sub(S::splat(1.0), erfc_large::<S>(S::max(a, S::splat(1.0)))),
        x,
    );
    let y = S::select(S::lt(a, S::splat(1.0)), erf_small::<S>(x), large);
    S::select(S::is_nan(x), x, y)
}

/// Φ(x) = P(N(0,1) ≤ x) = erfc(−x/√2)/2, relative accuracy kept for very negative x.
#[inline(always)]
pub(crate) unsafe fn normal_cdf<S: Simd>(x: S::V) -> S::V {
    let z = S::mul(x, S::splat(std::f32::consts::FRAC_1_SQRT_2));
    let a = S::abs(z);
    let half = S::splat(0.5);
    let small = S::fma(half, erf_small::<S>(z), half);
    let ec = S::mul(half, erfc_large::<S>(S::max(a, S::splat(1.0))));
    let large = S::select(S::lt(z, S::zero()), ec, S::sub(S::splat(1.0), ec));
    let y = S::select(S::lt(a, S::splat(1.0)), small, large);
    S::select(S::is_nan(x), x, y)
}

/// The standard normal density φ(x) = e^(−x²/2)/√(2π), with x² carried exactly.
#[inline(always)]
pub(crate) unsafe fn normal_pdf<S: Simd>(x: S::V) -> S::V {
    // φ(15) is 0 in f32; the cap keeps inf out of the exact-square trick.
    let x = S::min(S::abs(x), S::splat(15.0));
    let p = S::mul(x, x);
    let e = S::fma(x, x, S::sub(S::zero(), p));
    let g = exp::<S>(S::mul(S::splat(-0.5), p));
    let g = S::fnma(S::mul(S::splat(0.5), e), g, g);
    S::mul(g, S::splat(0.398_942_3)) // 1/√(2π)
}
