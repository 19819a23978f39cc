//! Elementwise maps over slices: y = f(x) and dx = g · f'(x), one SIMD vector at a time with
//! a masked tail (no scalar remainder loop, so every element takes the same polynomial).

use super::activation::{gelu_erf, gelu_erf_grad, gelu_tanh, gelu_tanh_grad, relu};
use super::erf::{erf, normal_pdf};
use super::exp_log::{exp, ln};
use super::sigmoid_tanh::{sigmoid, sigmoid_pair, silu, silu_grad, tanh};
use crate::simd::Simd;
use crate::{with_isa, Isa};

/// The vectorised elementwise functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unary {
    Exp,
    Ln,
    Tanh,
    Sigmoid,
    Silu,
    Erf,
    Relu,
    GeluTanh,
    GeluErf,
}

impl Unary {
    pub const ALL: [Unary; 9] = [
        Unary::Exp,
        Unary::Ln,
        Unary::Tanh,
        Unary::Sigmoid,
        Unary::Silu,
        Unary::Erf,
        Unary::Relu,
        Unary::GeluTanh,
        Unary::GeluErf,
    ];
}

#[inline(always)]
unsafe fn value<S: Simd>(f: Unary, x: S::V) -> S::V {
    match f {
        Unary::Exp => exp::<S>(x),
        Unary::Ln => ln::<S>(x),
        Unary::Tanh => tanh::<S>(x),
        Unary::Sigmoid => sigmoid::<S>(x),
        Unary::Silu => silu::<S>(x),
        Unary::Erf => erf::<S>(x),
        Unary::Relu => relu::<S>(x),
        Unary::GeluTanh => gelu_tanh::<S>(x),
        Unary::GeluErf => gelu_erf::<S>(x),
    }
}

/// f'(x).
#[inline(always)]
unsafe fn derivative<S: Simd>(f: Unary, x: S::V) -> S::V {
    let one = S::splat(1.0);
    match f {
        Unary::Exp => exp::<S>(x),
        Unary::Ln => S::div(one, x),
        Unary::Tanh => {
            // 1 − tanh² = 4q/(1 + q)² with q = e^−2|x|: no cancellation as |tanh| → 1.
            let q = exp::<S>(S::mul(S::splat(-2.0), S::abs(x)));
            let d = S::add(one, q);
            S::div(S::mul(S::splat(4.0), q), S::mul(d, d))
        }
        Unary::Sigmoid => {
            let (s, c) = sigmoid_pair::<S>(x);
            S::mul(s, c)
        }
        Unary::Silu => silu_grad::<S>(x),
        // erf'(x) = 2/√π·e^(−x²) = 2√2·φ(√2·x).
        Unary::Erf => {
            let r2 = S::splat(std::f32::consts::SQRT_2);
            S::mul(S::mul(S::splat(2.0), r2), normal_pdf::<S>(S::mul(x, r2)))
        }
        Unary::Relu => S::select(
            S::lt(S::zero(), x),
            one,
            S::select(S::is_nan(x), x, S::zero()),
        ),
        Unary::GeluTanh => gelu_tanh_grad::<S>(x),
        Unary::GeluErf => gelu_erf_grad::<S>(x),
    }
}

/// Applies `op` to full vectors and a masked tail: out[i] = op(ins[..][i]) for i < n.
///
/// # Safety
/// Each input is readable and `out` writable for n values; an input may be `out` itself
/// (each element is read before it is written) but must not overlap it otherwise.
#[inline(always)]
pub(crate) unsafe fn zip_map<S: Simd, const N: usize>(
    ins: [*const f32; N],
    out: *mut f32,
    n: usize,
    op: impl Fn([S::V; N]) -> S::V,
) {
    let l = S::LANES;
    let mut i = 0;
    while i + l <= n {
        S::store(
            out.add(i),
            op(ins.map(
                #[inline(always)]
                |s| S::load(s.add(i)),
            )),
        );
        i += l;
    }
    if i < n {
        let r = n - i;
        S::store_partial(
            out.add(i),
            op(ins.map(
                #[inline(always)]
                |s| S::load_partial(s.add(i), r),
            )),
            r,
        );
    }
}

/// y = f(x), elementwise, on the instruction set `isa`.
///
/// # Panics
/// If the lengths differ (a caller bug, not an input error).
pub fn unary_isa(isa: Isa, f: Unary, x: &[f32], y: &mut [f32]) {
    assert_eq!(
        x.len(),
        y.len(),
        "unary {f:?}: input and output lengths differ"
    );
    let (n, x, y) = (y.len(), x.as_ptr(), y.as_mut_ptr());
    // SAFETY: both slices hold n values.
    with_isa!(isa, S => zip_map::<S, 1>([x], y, n, #[inline(always)] |[v]| value::<S>(f, v)))
}

/// y = SiLU(gate) · up, elementwise (SwiGLU's gate), on `isa`.
///
/// # Panics
/// If the lengths differ (a caller bug).
pub fn swiglu_isa(isa: Isa, gate: &[f32], up: &[f32], y: &mut [f32]) {
    assert!(
        gate.len() == y.len() && up.len() == y.len(),
        "swiglu: gate {}, up {} and output {} lengths differ",
        gate.len(),
        up.len(),
        y.len()
    );
    let (n, g, u, y) = (y.len(), gate.as_ptr(), up.as_ptr(), y.as_mut_ptr());
    // SAFETY: the three slices hold n values.
    with_isa!(isa, S => zip_map::<S, 2>([g, u], y, n, #[inline(always)] |[gv, uv]| S::mul(silu::<S>(gv), uv)))
}

/// The backward of [`swiglu_isa`] given dy, in one pass: with s = sigmoid(gate),
/// dgate = dy·up·s·(1 + gate·(1 − s)) and dup = dy·gate·s (no fused multiply-adds, so the
/// values are those of the same formulas in scalar code).
///
/// # Panics
/// If the lengths differ (a caller bug).
pub fn swiglu_backward_isa(
    isa: Isa,
    gate: &[f32],
    up: &[f32],
    dy: &[f32],
    dgate: &mut [f32],
    dup: &mut [f32],
) {
    let n = dy.len();
    assert!(
        [gate.len(), up.len(), dgate.len(), dup.len()]
            .iter()
            .all(|&l| l == n),
        "swiglu_backward: gate {}, up {}, dy {n}, dgate {} and dup {} lengths differ",
        gate.len(),
        up.len(),
        dgate.len(),
        dup.len()
    );
    let (g, u, d) = (gate.as_ptr(), up.as_ptr(), dy.as_ptr());
    let (dg, du) = (dgate.as_mut_ptr(), dup.as_mut_ptr());
    // SAFETY: the five slices hold n values and the outputs are distinct &mut slices.
    with_isa!(isa, S => {
        let one = S::splat(1.0);
        let l = S::LANES;
        let mut i = 0;
        while i < n {
            let lanes = (n - i).min(l);
            let ld = |p: *const f32| if lanes == l { S::load(p.add(i)) } else { S::load_partial(p.add(i), lanes) };
            let (gv, uv, dv) = (ld(g), ld(u), ld(d));
            let sv = sigmoid::<S>(gv);
            let dgv = S::mul(S::mul(S::mul(dv, uv), sv), S::add(one, S::mul(gv, S::sub(one, sv))));
            let duv = S::mul(S::mul(dv, gv), sv);
            if lanes == l {
                S::store(dg.add(i), dgv);
                S::store(du.add(i), duv);
            } else {
                S::store_partial(dg.add(i), dgv, lanes);
                S::store_partial(du.add(i), duv, lanes);
            }
            i += l;
        }
    })
}

/// y = f(x) on [`Isa::get`]'s instruction set.
pub fn unary(f: Unary, x: &[f32], y: &mut [f32]) {
    unary_isa(Isa::get(), f, x, y)
}

/// x = f(x) in place.
pub fn unary_in_place(f: Unary, x: &mut [f32]) {
    let (n, p) = (x.len(), x.as_mut_ptr());
    // SAFETY: zip_map reads each element before writing it.
    with_isa!(Isa::get(), S => zip_map::<S, 1>([p as *const f32], p, n, #[inline(always)] |[v]| value::<S>(f, v)))
}

/// dx = g · f'(x), elementwise (the backward of [`unary`]), on `isa`.
pub fn unary_backward_isa(isa: Isa, f: Unary, x: &[f32], g: &[f32], dx: &mut [f32]) {
    assert!(
        x.len() == dx.len() && g.len() == dx.len(),
        "unary_backward {f:?}: lengths differ"
    );
    let (n, x, g, dx) = (dx.len(), x.as_ptr(), g.as_ptr(), dx.as_mut_ptr());
    // SAFETY: the three slices hold n values.
    with_isa!(isa, S => zip_map::<S, 2>([x, g], dx, n, #[inline(always)] |[v, gv]| S::mul(gv, derivative::<S>(f, v))))
}

/// dx = g · f'(x) on [`Isa::get`]'s instruction set.
pub fn unary_backward(f: Unary, x: &[f32], g: &[f32], dx: &mut [f32]) {
    unary_backward_isa(Isa::get(), f, x, g, dx)
}
