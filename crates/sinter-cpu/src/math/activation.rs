//! The activations a GEMM epilogue or an elementwise kernel applies, and their derivatives.
//!
//! GELU, tanh form (GPT-2's): gelu(x) = x/2·(1 + tanh(u)), u = √(2/π)(x + 0.044715x³). Since
//! 1 + tanh(u) = 2·sigmoid(2u), it is computed as x·sigmoid(2u): no cancellation for negative
//! x, where the textbook form loses all relative precision. Its derivative is
//! s + x·2u'·s·(1 − s) with s = sigmoid(2u) and 1 − s from the same quotient.
//! GELU, erf form: x·Φ(x) with Φ the normal CDF (relative accuracy kept for negative x), and
//! derivative Φ(x) + x·φ(x).

use super::erf::{normal_cdf, normal_pdf};
use super::sigmoid_tanh::sigmoid_pair;
use crate::simd::Simd;

/// An activation fused after a GEMM's bias add.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    #[default]
    None,
    Relu,
    /// GELU, tanh approximation.
    GeluTanh,
    /// GELU, exact (erf) form.
    GeluErf,
}

#[inline(always)]
pub(crate) unsafe fn apply<S: Simd>(act: Activation, x: S::V) -> S::V {
    match act {
        Activation::None => x,
        Activation::Relu => relu::<S>(x),
        Activation::GeluTanh => gelu_tanh::<S>(x),
        Activation::GeluErf => gelu_erf::<S>(x),
    }
}

/// max(x, 0), NaN propagated.
#[inline(always)]
pub(crate) unsafe fn relu<S: Simd>(x: S::V) -> S::V {
    S::max(x, S::zero())
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_C: f32 = 0.044_715;

/// (2u, 2u') for the tanh-form GELU.
#[inline(always)]
unsafe fn gelu_tanh_inner<S: Simd>(x: S::V) -> (S::V, S::V) {
    let x2 = S::mul(x, x);
    let k = S::splat(2.0 * SQRT_2_OVER_PI);
    let u2 = S::mul(k, S::fma(S::mul(S::splat(GELU_C), x2), x, x));
    let du2 = S::mul(k, S::fma(S::splat(3.0 * GELU_C), x2, S::splat(1.0)));
    (u2, du2)
}

/// Below −20 both GELUs (and their derivatives) are −0 (0) in f32 and above 20 they are x
/// (1): clamping there keeps x³ and x·φ(x) finite (no inf·0), and [`negative_tail`] gives the
/// forward value for x < −20 (also for −inf, where x·0 would be NaN).
#[inline(always)]
unsafe fn clamp20<S: Simd>(x: S::V) -> S::V {
    // The one-instruction forms return their second operand on NaN: x goes second, so a NaN
    // x stays x (the strict forms cost three instructions each on x86).
    S::min_fast(S::splat(20.0), S::max_fast(S::splat(-20.0), x))
}

#[inline(always)]
unsafe fn negative_tail<S: Simd>(x: S::V, y: S::V) -> S::V {
    S::select(S::lt(x, S::splat(-20.0)), S::splat(-0.0), y)
}

#[inline(always)]
pub(crate) unsafe fn gelu_tanh<S: Simd>(x: S::V) -> S::V {
    let (u2, _) = gelu_tanh_inner::<S>(clamp20::<S>(x));
    negative_tail::<S>(x, S::mul(x, sigmoid_pair::<S>(u2).0))
}

#[inline(always)]
pub(crate) unsafe fn gelu_tanh_grad<S: Simd>(x: S::V) -> S::V {
    let x = clamp20::<S>(x);
    let (u2, du2) = gelu_tanh_inner::<S>(x);
    let (s, c) = sigmoid_pair::<S>(u2);
    // s + x·2u'·s·(1 − s)
    S::fma(S::mul(x, du2), S::mul(s, c), s)
}

#[inline(always)]
pub(crate) unsafe fn gelu_erf<S: Simd>(x: S::V) -> S::V {
    negative_tail::<S>(x, S::mul(x, normal_cdf::<S>(x)))
}

#[inline(always)]
pub(crate) unsafe fn gelu_erf_grad<S: Simd>(x: S::V) -> S::V {
    let x = clamp20::<S>(x);
    S::fma(x, normal_pdf::<S>(x), normal_cdf::<S>(x))
}
