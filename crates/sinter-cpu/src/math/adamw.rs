//! AdamW over slices, with PyTorch's arithmetic (`torch.optim.AdamW`, single-tensor path).
//!
//! Reads and writes the parameters p, the moments m and v; reads the gradient g, scaled by
//! `grad_scale` (loss-scale unscaling and clipping folded into the one pass). Per element:
//! p ← p·(1 − lr·wd); m ← m + (1 − β1)(g − m); v ← β2·v + (1 − β2)·g²;
//! p ← p − (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + eps).
//! As in PyTorch the scalar factors (β powers, 1 − β, the bias corrections and their square
//! root, the step size) are computed in f64 and rounded to f32 once ([`AdamW::factors`]).
//! One read and write of each buffer, vectorised.

use super::reduce::{load_lanes, store_lanes};
use crate::simd::Simd;
use crate::{with_isa, Isa};

// The hyper-parameters and the factors are PyTorch's rule, written once in sinter-types.
pub use sinter_types::{AdamW, AdamWFactors};

/// One AdamW step over equal-length slices (see the module docs).
///
/// # Panics
/// If the slice lengths differ (a caller bug).
pub fn adamw(
    isa: Isa,
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    h: AdamW,
    grad_scale: f32,
) {
    let n = p.len();
    assert!(
        g.len() == n && m.len() == n && v.len() == n,
        "adamw: lengths {} {} {} {} differ",
        n,
        g.len(),
        m.len(),
        v.len()
    );
    let f = h.factors();
    with_isa!(isa, S => {
        let (pp, gp, mp, vp) = (p.as_mut_ptr(), g.as_ptr(), m.as_mut_ptr(), v.as_mut_ptr());
        let (decay, omb1, b2, omb2) = (S::splat(f.decay), S::splat(f.one_minus_beta1), S::splat(f.beta2), S::splat(f.one_minus_beta2));
        let (step, bc2s, eps, gs) = (S::splat(f.step_size), S::splat(f.bc2_sqrt), S::splat(f.eps), S::splat(grad_scale));
        let l = S::LANES;
        let mut i = 0;
        while i < n {
            let lanes = l.min(n - i);
            let gv = S::mul(load_lanes::<S>(gp, i, lanes), gs);
            let pv = S::mul(load_lanes::<S>(pp, i, lanes), decay);
            let mv = load_lanes::<S>(mp, i, lanes);
            // lerp(m, g, w) for w < 0.5: m + w·(g − m)
            let mv = S::fma(omb1, S::sub(gv, mv), mv);
            let vv = S::fma(omb2, S::mul(gv, gv), S::mul(load_lanes::<S>(vp, i, lanes), b2));
            let denom = S::add(S::div(S::sqrt(vv), bc2s), eps);
            let pv = S::fnma(step, S::div(mv, denom), pv);
            store_lanes::<S>(pp.add(i), pv, lanes);
            store_lanes::<S>(mp.add(i), mv, lanes);
            store_lanes::<S>(vp.add(i), vv, lanes);
            i += l;
        }
    })
}
