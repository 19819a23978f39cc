//! exp and ln as vector polynomials, with their edge cases handled in the same pass.
//!
//! exp: x = n·ln2 + r with n = round(x·log2 e) and r in [−ln2/2, ln2/2] (ln 2 split in a high
//! part exact in f32 and a low part, so r carries no cancellation error), e^r by its Taylor
//! polynomial of degree 7 (truncation < 5e-9 relative), then scaled by 2^n with one rounding
//! (`Simd::ldexp`, so overflow gives inf and results down to the subnormals are rounded
//! once). Measured max error: see the tests (≤ 1 ulp over the normal range).
//!
//! ln: x = m·2^e with m in [√½, √2); with f = m − 1 and s = f/(2+f), ln m = f − (f²/2 −
//! s·(f²/2 + R(s²))) (R: the classic degree-8 odd series in s, fdlibm's arrangement), so the
//! leading terms are exact. Subnormal inputs are scaled by 2^23 first.

use crate::simd::Simd;

pub(crate) const LN2_HI: f32 = 0.693_145_75; // 0x3f317200: exact in f32, n·LN2_HI exact
pub(crate) const LN2_LO: f32 = 1.428_606_8e-6;
const LOG2E: f32 = std::f32::consts::LOG2_E;

/// (e^r, n) with x = n·ln2 + r for a clamped x: the reduction and polynomial [`exp`] and
/// [`exp_softmax`] share (they differ in the clamp and in how 2^n is applied).
#[inline(always)]
unsafe fn reduced<S: Simd>(xc: S::V) -> (S::V, S::V) {
    let n = S::round(S::mul(xc, S::splat(LOG2E)));
    let r = S::fnma(n, S::splat(LN2_HI), xc);
    let r = S::fnma(n, S::splat(LN2_LO), r);
    let mut p = S::splat(1.0 / 5040.0);
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = S::fma(p, r, S::splat(c));
    }
    (p, n)
}

/// e^x per lane.
#[inline(always)]
pub(crate) unsafe fn exp<S: Simd>(x: S::V) -> S::V {
    // Beyond these e^x is inf or 0 in f32; clamping keeps 2^n in ldexp's range. The
    // one-instruction clamps return their second operand on NaN: x goes second.
    let xc = S::min_fast(S::splat(89.0), S::max_fast(S::splat(-104.0), x));
    let (p, n) = reduced::<S>(xc);
    let y = S::ldexp(p, n);
    // NaN in, NaN out (the clamp above already made it NaN, this keeps its payload).
    S::select(S::is_nan(x), x, y)
}

/// e^x per lane for the exponentials of a softmax (x = a score minus its row's maximum, so
/// x ≤ 0): the same reduction and polynomial as [`exp`] (≤ 1 ulp), with the range handled in
/// half the instructions. x is clamped to [−87.3, 88], so 2^n is built from its exponent
/// bits in one step: results below 2^−126 (x < −87.3) come out as ≈ 1.2e−38 instead of a
/// subnormal or 0 — nothing beside a softmax's sum, which is ≥ 1 — and nothing overflows. A
/// NaN stays NaN (the clamps keep a NaN x as x).
#[inline(always)]
pub(crate) unsafe fn exp_softmax<S: Simd>(x: S::V) -> S::V {
    // max_fast/min_fast return their second operand when either is NaN: x goes second.
    let xc = S::min_fast(S::splat(88.0), S::max_fast(S::splat(-87.3), x));
    let (p, n) = reduced::<S>(xc);
    S::mul(p, S::pow2i(n))
}

/// ln x per lane: ln(±0) = −inf, ln(x < 0) = NaN, ln(inf) = inf.
#[inline(always)]
pub(crate) unsafe fn ln<S: Simd>(x: S::V) -> S::V {
    let tiny = S::lt(x, S::splat(f32::MIN_POSITIVE));
    let xs = S::select(tiny, S::mul(x, S::splat(8_388_608.0)), x); // 2^23
    let (m, e) = S::frexp(xs);
    let e = S::sub(e, S::select(tiny, S::splat(23.0), S::zero()));
    let big = S::lt(S::splat(std::f32::consts::SQRT_2), m);
    let m = S::select(big, S::mul(m, S::splat(0.5)), m);
    let e = S::add(e, S::select(big, S::splat(1.0), S::zero()));
    let f = S::sub(m, S::splat(1.0));
    let s = S::div(f, S::add(f, S::splat(2.0)));
    let z = S::mul(s, s);
    let w = S::mul(z, z);
    // R(z) = z·(L1 + w·L3) + w·(L2 + w·L4): the series 2/3, 2/5, 2/7, 2/9 fitted for f32.
    let t1 = S::mul(w, S::fma(w, S::splat(0.242_790_79), S::splat(0.400_009_72)));
    let t2 = S::mul(z, S::fma(w, S::splat(0.284_987_87), S::splat(0.666_666_6)));
    let r = S::add(t1, t2);
    let hfsq = S::mul(S::splat(0.5), S::mul(f, f));
    // e·ln2_hi − ((hfsq − (s·(hfsq + R) + e·ln2_lo)) − f)
    let inner = S::fma(e, S::splat(LN2_LO), S::mul(s, S::add(hfsq, r)));
    let y = S::fma(e, S::splat(LN2_HI), S::sub(f, S::sub(hfsq, inner)));
    // Edge cases: 0 → −inf, negative → NaN, +inf → +inf, NaN → NaN.
    let y = S::select(S::eq(x, S::zero()), S::splat(f32::NEG_INFINITY), y);
    let y = S::select(S::lt(x, S::zero()), S::splat(f32::NAN), y);
    let y = S::select(S::eq(x, S::splat(f32::INFINITY)), x, y);
    S::select(S::is_nan(x), x, y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{with_isa, Isa};

    /// exp_softmax against f64 on every ISA: ≤ 1.5 ulp over [−87.3, 88] (dense), the floor
    /// below it, NaN kept.
    #[test]
    fn exp_softmax_matches_f64() {
        let mut xs: Vec<f32> = (0..200_000)
            .map(|i| -87.3 + 175.3 * i as f32 / 200_000.0)
            .collect();
        xs.extend([
            0.0,
            -0.0,
            -1e-30,
            1e-30,
            -88.0,
            -100.0,
            -1e30,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        xs.resize(xs.len().next_multiple_of(16), 0.5);
        for isa in Isa::available() {
            let mut ys = vec![0f32; xs.len()];
            with_isa!(isa, S => {
                for (x, y) in xs.chunks_exact(S::LANES).zip(ys.chunks_exact_mut(S::LANES)) {
                    S::store(y.as_mut_ptr(), exp_softmax::<S>(S::load(x.as_ptr())));
                }
            });
            for (&x, &y) in xs.iter().zip(&ys) {
                if x.is_nan() {
                    assert!(y.is_nan(), "{isa:?}: exp_softmax(NaN) = {y}");
                } else if x < -87.3 {
                    assert!(
                        (0.0..=1.3e-38).contains(&y),
                        "{isa:?}: exp_softmax({x}) = {y}"
                    );
                } else {
                    let want = (x as f64).exp();
                    let ulp = (want as f32).abs() * f32::EPSILON;
                    let err = (y as f64 - want).abs() / ulp as f64;
                    assert!(
                        err <= 1.5,
                        "{isa:?}: exp_softmax({x}) = {y}, want {want} ({err} ulp)"
                    );
                }
            }
        }
    }
}
