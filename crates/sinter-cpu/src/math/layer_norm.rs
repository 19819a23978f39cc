//! Layer norm over rows (optionally of a residual sum), forward and backward.
//!
//! Forward reads x (and the residual r) [rows, n], gamma and beta [n]; writes y [rows, n]
//! (and the sum s = x + r, the new residual stream) and one (mean, 1/std) per row. Each row
//! is read, reduced and normalised while in L1: mean, then the variance about the mean (two
//! passes: no E[x²] − E[x]² cancellation), then y.
//! Backward reads x (the normalised input), gamma, the saved statistics and g; writes dx and
//! *adds* the row sums into dgamma and dbeta (so callers can split rows into fixed chunks
//! and add the chunk partials in order: deterministic).

use super::reduce::{for_vectors, load_lanes, store_lanes, sum};
use crate::simd::Simd;
use crate::{with_isa, Isa};

/// Normalises one row at `x` into `y`; returns (mean, rstd).
#[inline(always)]
unsafe fn norm_row<S: Simd>(
    x: *const f32,
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    y: *mut f32,
) -> (f32, f32) {
    let n = gamma.len();
    let mean = sum::<S>(x, n) / n as f32;
    let mv = S::splat(mean);
    let mut acc = S::zero();
    for_vectors::<S>(
        x,
        n,
        #[inline(always)]
        |_, v, lanes| {
            let d = S::sub(v, mv);
            let d = if lanes == S::LANES {
                d
            } else {
                S::keep_first(d, lanes)
            };
            acc = S::fma(d, d, acc);
        },
    );
    let rstd = 1.0 / (S::reduce_add(acc) / n as f32 + eps).sqrt();
    let rv = S::splat(rstd);
    let (gp, bp) = (gamma.as_ptr(), beta.as_ptr());
    for_vectors::<S>(
        x,
        n,
        #[inline(always)]
        |i, v, lanes| {
            let xh = S::mul(S::sub(v, mv), rv);
            let o = S::fma(
                xh,
                load_lanes::<S>(gp, i, lanes),
                load_lanes::<S>(bp, i, lanes),
            );
            store_lanes::<S>(y.add(i), o, lanes)
        },
    );
    (mean, rstd)
}

fn check(what: &str, n: usize, rows: usize, lens: &[usize]) {
    assert!(
        n > 0 && lens.iter().all(|&l| l == rows * n),
        "{what}: slice lengths {lens:?} do not hold {rows} rows of {n}"
    );
}

/// y = LayerNorm(x)·gamma + beta per row of n = gamma.len(); mean and rstd per row.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_rows(
    isa: Isa,
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    y: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
) {
    let (n, rows) = (gamma.len(), mean.len());
    check(
        "layer_norm_rows",
        n,
        rows,
        &[x.len(), y.len(), beta.len() * rows],
    );
    assert_eq!(rstd.len(), rows, "layer_norm_rows: rstd length");
    with_isa!(isa, S => {
        for r in 0..rows {
            (mean[r], rstd[r]) = norm_row::<S>(x.as_ptr().add(r * n), gamma, beta, eps, y.as_mut_ptr().add(r * n));
        }
    })
}

/// s = x + residual and y = LayerNorm(s)·gamma + beta per row, in one pass over each row.
#[allow(clippy::too_many_arguments)]
pub fn residual_layer_norm_rows(
    isa: Isa,
    x: &[f32],
    residual: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    s: &mut [f32],
    y: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
) {
    let (n, rows) = (gamma.len(), mean.len());
    check(
        "residual_layer_norm_rows",
        n,
        rows,
        &[x.len(), residual.len(), s.len(), y.len(), beta.len() * rows],
    );
    assert_eq!(rstd.len(), rows, "residual_layer_norm_rows: rstd length");
    with_isa!(isa, S => {
        for r in 0..rows {
            let (sp, rp) = (s.as_mut_ptr().add(r * n), residual.as_ptr().add(r * n));
            for_vectors::<S>(x.as_ptr().add(r * n), n, #[inline(always)] |i, v, lanes| {
                store_lanes::<S>(sp.add(i), S::add(v, load_lanes::<S>(rp, i, lanes)), lanes)
            });
            (mean[r], rstd[r]) = norm_row::<S>(sp, gamma, beta, eps, y.as_mut_ptr().add(r * n));
        }
    })
}

/// dx per row, and dgamma += Σ_rows g·x̂, dbeta += Σ_rows g (x̂ = (x − mean)·rstd).
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward_rows(
    isa: Isa,
    x: &[f32],
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
    g: &[f32],
    dx: &mut [f32],
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) {
    let (n, rows) = (gamma.len(), mean.len());
    check(
        "layer_norm_backward_rows",
        n,
        rows,
        &[
            x.len(),
            g.len(),
            dx.len(),
            dgamma.len() * rows,
            dbeta.len() * rows,
        ],
    );
    assert_eq!(rstd.len(), rows, "layer_norm_backward_rows: rstd length");
    with_isa!(isa, S => {
        let (gp, dgp, dbp) = (gamma.as_ptr(), dgamma.as_mut_ptr(), dbeta.as_mut_ptr());
        for r in 0..rows {
            let (xp, gr, dp) = (x.as_ptr().add(r * n), g.as_ptr().add(r * n), dx.as_mut_ptr().add(r * n));
            let (mv, rv) = (S::splat(mean[r]), S::splat(rstd[r]));
            // Pass 1: Σ g·γ and Σ g·γ·x̂, and the parameter sums.
            let (mut a1, mut a2) = (S::zero(), S::zero());
            for_vectors::<S>(xp, n, #[inline(always)] |i, v, lanes| {
                let xh = S::mul(S::sub(v, mv), rv);
                let gv = load_lanes::<S>(gr, i, lanes);
                let dxh = S::mul(gv, load_lanes::<S>(gp, i, lanes));
                a1 = S::add(a1, dxh);
                a2 = S::fma(dxh, if lanes == S::LANES { xh } else { S::keep_first(xh, lanes) }, a2);
                store_lanes::<S>(dgp.add(i), S::fma(gv, xh, load_lanes::<S>(dgp, i, lanes)), lanes);
                store_lanes::<S>(dbp.add(i), S::add(gv, load_lanes::<S>(dbp, i, lanes)), lanes);
            });
            let (m1, m2) = (S::splat(S::reduce_add(a1) / n as f32), S::splat(S::reduce_add(a2) / n as f32));
            // Pass 2: dx = rstd·(g·γ − mean(g·γ) − x̂·mean(g·γ·x̂)).
            for_vectors::<S>(xp, n, #[inline(always)] |i, v, lanes| {
                let xh = S::mul(S::sub(v, mv), rv);
                let dxh = S::mul(load_lanes::<S>(gr, i, lanes), load_lanes::<S>(gp, i, lanes));
                store_lanes::<S>(dp.add(i), S::mul(rv, S::fnma(xh, m2, S::sub(dxh, m1))), lanes)
            });
        }
    })
}
