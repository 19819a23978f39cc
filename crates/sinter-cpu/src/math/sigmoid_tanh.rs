//! tanh, the logistic sigmoid and SiLU as vector functions.
//!
//! sigmoid(z) = 1/(1 + e^−z) for z ≥ 0 and e^z/(1 + e^z) for z < 0, both from q = e^−|z| in
//! (0, 1], so neither overflows and 1 − sigmoid(z) comes out of the same quotient without
//! cancellation ([`sigmoid_pair`]).
//! tanh: for |x| < 0.625, x + x³·P(x²) (P of degree 5, fitted near-minimax: 2e-10 relative);
//! above, 1 − 2/(e^2|x| + 1) (no cancellation there: the result is ≥ 0.55). The sign is put
//! back last, so tanh(−0) = −0.

use super::exp_log::exp;
use crate::simd::Simd;

/// (sigmoid(z), 1 − sigmoid(z)) per lane, both to a few ulp, never NaN for non-NaN z.
#[inline(always)]
pub(crate) unsafe fn sigmoid_pair<S: Simd>(z: S::V) -> (S::V, S::V) {
    let q = exp::<S>(S::sub(S::zero(), S::abs(z)));
    let d = S::div(S::splat(1.0), S::add(S::splat(1.0), q));
    let qd = S::mul(q, d);
    let pos = S::le(S::zero(), z);
    // NaN fails `0 ≤ z`: both come out of qd, which is NaN.
    (S::select(pos, d, qd), S::select(pos, qd, d))
}

/// sigmoid(z) with one division, 1/(1 + q) or q/(1 + q): ≤ 2.1 ulp (the pair's product form
/// reaches 2.4 on the negative side).
#[inline(always)]
pub(crate) unsafe fn sigmoid<S: Simd>(z: S::V) -> S::V {
    let q = exp::<S>(S::sub(S::zero(), S::abs(z)));
    let num = S::select(S::le(S::zero(), z), S::splat(1.0), q);
    S::div(num, S::add(S::splat(1.0), q))
}

/// x · sigmoid(x) (−0 at −inf, where the product would be NaN).
#[inline(always)]
pub(crate) unsafe fn silu<S: Simd>(x: S::V) -> S::V {
    let y = S::mul(x, sigmoid::<S>(x));
    S::select(S::eq(x, S::splat(f32::NEG_INFINITY)), S::splat(-0.0), y)
}

/// d silu / dx = s · (1 + x · (1 − s)).
#[inline(always)]
pub(crate) unsafe fn silu_grad<S: Simd>(x: S::V) -> S::V {
    let (s, c) = sigmoid_pair::<S>(x);
    S::mul(s, S::fma(x, c, S::splat(1.0)))
}

const TANH_P: [f32; 6] = [
    -0.333_333_3,
    0.133_332_06,
    -0.053_946_76,
    0.021_700_693,
    -0.008_177_374,
    0.002_142_941,
];

#[inline(always)]
pub(crate) unsafe fn tanh<S: Simd>(x: S::V) -> S::V {
    let a = S::abs(x);
    let z = S::mul(a, a);
    let mut p = S::splat(TANH_P[5]);
    for &c in TANH_P[..5].iter().rev() {
        p = S::fma(p, z, S::splat(c));
    }
    let small = S::fma(S::mul(a, z), p, a);
    let e = exp::<S>(S::add(a, a));
    let large = S::sub(
        S::splat(1.0),
        S::div(S::splat(2.0), S::add(e, S::splat(1.0))),
    );
    let y = S::select(S::lt(a, S::splat(0.625)), small, large);
    // NaN: both branches are NaN; copysign keeps it NaN.
    S::copysign(y, x)
}
