//! Bias add + activation over rows (the GEMM epilogue as a separate pass, for products that
//! ran elsewhere), forward and backward.
//!
//! Forward reads x [rows, n] and bias [n]; writes y = act(x + bias). Backward reads x, bias
//! and g; writes dx = g·act'(x + bias) and *adds* Σ_rows dx into dbias (callers split rows
//! in fixed chunks and add the partials in order: deterministic). The pre-activation is
//! recomputed (one add) instead of stored.

use super::activation::{apply, gelu_erf_grad, gelu_tanh_grad, Activation};
use super::reduce::{for_vectors, load_lanes, store_lanes};
use crate::simd::Simd;
use crate::{with_isa, Isa};

#[inline(always)]
unsafe fn grad<S: Simd>(act: Activation, u: S::V) -> S::V {
    match act {
        Activation::None => S::splat(1.0),
        Activation::Relu => S::select(
            S::lt(S::zero(), u),
            S::splat(1.0),
            S::select(S::is_nan(u), u, S::zero()),
        ),
        Activation::GeluTanh => gelu_tanh_grad::<S>(u),
        Activation::GeluErf => gelu_erf_grad::<S>(u),
    }
}

/// y = act(x + bias) over rows of n = bias.len().
///
/// # Panics
/// If x and y are not the same whole number of rows (a caller bug).
pub fn bias_act_rows(isa: Isa, x: &[f32], bias: &[f32], act: Activation, y: &mut [f32]) {
    let n = bias.len();
    assert!(
        n > 0 && x.len() == y.len() && x.len().is_multiple_of(n),
        "bias_act_rows: {} inputs, {} outputs, bias of {n}",
        x.len(),
        y.len()
    );
    with_isa!(isa, S => {
        let bp = bias.as_ptr();
        for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
            let yp = yr.as_mut_ptr();
            for_vectors::<S>(xr.as_ptr(), n, #[inline(always)] |i, v, lanes| {
                store_lanes::<S>(yp.add(i), apply::<S>(act, S::add(v, load_lanes::<S>(bp, i, lanes))), lanes)
            });
        }
    })
}

/// dx = g·act'(x + bias); dbias += Σ_rows dx.
pub fn bias_act_backward_rows(
    isa: Isa,
    x: &[f32],
    bias: &[f32],
    act: Activation,
    g: &[f32],
    dx: &mut [f32],
    dbias: &mut [f32],
) {
    let n = bias.len();
    assert!(
        n > 0
            && x.len() == dx.len()
            && g.len() == dx.len()
            && x.len().is_multiple_of(n)
            && dbias.len() == n,
        "bias_act_backward_rows: lengths do not match rows of {n}"
    );
    with_isa!(isa, S => {
        let (bp, dbp) = (bias.as_ptr(), dbias.as_mut_ptr());
        for r in 0..x.len() / n {
            let (gp, dp) = (g.as_ptr().add(r * n), dx.as_mut_ptr().add(r * n));
            for_vectors::<S>(x.as_ptr().add(r * n), n, #[inline(always)] |i, v, lanes| {
                let u = S::add(v, load_lanes::<S>(bp, i, lanes));
                let du = S::mul(load_lanes::<S>(gp, i, lanes), grad::<S>(act, u));
                store_lanes::<S>(dp.add(i), du, lanes);
                store_lanes::<S>(dbp.add(i), S::add(du, load_lanes::<S>(dbp, i, lanes)), lanes);
            });
        }
    })
}
