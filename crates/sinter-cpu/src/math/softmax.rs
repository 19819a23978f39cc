//! Softmax and log-softmax over rows, forward and backward.
//!
//! Reads x [rows, n]; writes y [rows, n]. Each row is read twice (max, then exp and sum
//! while writing) and its output scaled in place: three vector passes over data in L1,
//! one exp per element. Log-softmax writes (x − max) − ln Σ e^(x − max), with the log-sum
//! from [`shifted_log_sum`] (exact-ish for a confident row). Backward reads y and g, writes dx: softmax dx = y·(g − Σ y·g),
//! log-softmax dx = g − e^y·Σ g.
//!
//! The online softmax of FlashAttention's tiles (a running max and sum rescaled block by
//! block instead of whole rows normalised) is in [`super::flash_tiles`].

use super::exp_log::exp;
use super::reduce::{dot, for_vectors, load_lanes, max, store_lanes, sum};
use crate::simd::Simd;
use crate::{with_isa, Isa};

fn check(what: &str, n: usize, lens: &[usize]) {
    assert!(
        n > 0 && lens.iter().all(|&l| l == lens[0] && l % n == 0),
        "{what}: slice lengths {lens:?} are not the same whole number of rows of {n}"
    );
}

/// y = softmax(x) (or log_softmax when `log`) over each row of length n.
///
/// # Panics
/// If the slices are not the same whole number of rows (a caller bug).
pub fn softmax_rows(isa: Isa, x: &[f32], y: &mut [f32], n: usize, log: bool) {
    check("softmax_rows", n, &[x.len(), y.len()]);
    with_isa!(isa, S => {
        for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
            softmax_row::<S>(xr.as_ptr(), yr.as_mut_ptr(), n, log)
        }
    })
}

#[inline(always)]
pub(super) unsafe fn softmax_row<S: Simd>(x: *const f32, y: *mut f32, n: usize, log: bool) {
    let m = max::<S>(x, n);
    if log {
        // (x − max) − ln Σ, never x − (max + ln Σ): max + ln Σ rounds at max's scale, which
        // for [88, 80×9] moved the confident class's −3.0e-3 by 3.3e-4 of itself (issue 30).
        let (mv, lv) = (S::splat(m), S::splat(shifted_log_sum::<S>(x, n, m)));
        for_vectors::<S>(
            x,
            n,
            #[inline(always)]
            |i, v, lanes| store_lanes::<S>(y.add(i), S::sub(S::sub(v, mv), lv), lanes),
        );
    } else {
        let total = exp_sum_row::<S, true>(x, y, n, m);
        let inv = S::splat(1.0 / total);
        for_vectors::<S>(
            y,
            n,
            #[inline(always)]
            |i, v, lanes| store_lanes::<S>(y.add(i), S::mul(v, inv), lanes),
        );
    }
}

/// dx from y = softmax(x) (or log_softmax when `log`) and the output gradient g.
pub fn softmax_rows_backward(isa: Isa, y: &[f32], g: &[f32], dx: &mut [f32], n: usize, log: bool) {
    check("softmax_rows_backward", n, &[y.len(), g.len(), dx.len()]);
    with_isa!(isa, S => {
        for ((yr, gr), dr) in y.chunks_exact(n).zip(g.chunks_exact(n)).zip(dx.chunks_exact_mut(n)) {
            let (yp, gp, dp) = (yr.as_ptr(), gr.as_ptr(), dr.as_mut_ptr());
            if log {
                let s = S::splat(sum::<S>(gp, n));
                for_vectors::<S>(yp, n, #[inline(always)] |i, v, lanes| {
                    let gv = load_lanes::<S>(gp, i, lanes);
                    store_lanes::<S>(dp.add(i), S::fnma(exp::<S>(v), s, gv), lanes)
                });
            } else {
                let d = S::splat(dot::<S>(yp, gp, n));
                for_vectors::<S>(yp, n, #[inline(always)] |i, v, lanes| {
                    let gv = load_lanes::<S>(gp, i, lanes);
                    store_lanes::<S>(dp.add(i), S::mul(v, S::sub(gv, d)), lanes)
                });
            }
        }
    })
}

/// ln Σ e^(x − m) over a row whose maximum is m, taken as ln_1p of the sum without one
/// maximum's own 1 (the other maxima added back exactly): when every other term is tiny next
/// to the max, ln(1 + rest) keeps rest's digits, where ln of the rounded total would keep only
/// those above the total's last bit. −inf rows give ln n (and NaN downstream, as in PyTorch).
#[inline(always)]
pub(super) unsafe fn shifted_log_sum<S: Simd>(x: *const f32, n: usize, m: f32) -> f32 {
    let mv = S::splat(m);
    let (mut acc, mut ties) = (S::zero(), S::zero());
    for_vectors::<S>(
        x,
        n,
        #[inline(always)]
        |_, v, lanes| {
            let at_max = S::eq(v, mv);
            let e = S::select(at_max, S::zero(), exp::<S>(S::sub(v, mv)));
            let t = S::select(at_max, S::splat(1.0), S::zero());
            let (e, t) = if lanes == S::LANES {
                (e, t)
            } else {
                (S::keep_first(e, lanes), S::keep_first(t, lanes))
            };
            acc = S::add(acc, e);
            ties = S::add(ties, t);
        },
    );
    let rest = S::reduce_add(acc) as f64 + (S::reduce_add(ties) as f64 - 1.0).max(0.0);
    rest.ln_1p() as f32
}

/// Σ e^(x[i] − shift) over the row, also stored into y when `STORE` (y may be x).
#[inline(always)]
pub(super) unsafe fn exp_sum_row<S: Simd, const STORE: bool>(
    x: *const f32,
    y: *mut f32,
    n: usize,
    shift: f32,
) -> f32 {
    let sv = S::splat(shift);
    let mut acc = S::zero();
    for_vectors::<S>(
        x,
        n,
        #[inline(always)]
        |i, v, lanes| {
            let e = exp::<S>(S::sub(v, sv));
            // Lanes past the row are exp(0 − shift): keep them out of the sum.
            let e = if lanes == S::LANES {
                e
            } else {
                S::keep_first(e, lanes)
            };
            acc = S::add(acc, e);
            if STORE {
                store_lanes::<S>(y.add(i), e, lanes);
            }
        },
    );
    S::reduce_add(acc)
}
