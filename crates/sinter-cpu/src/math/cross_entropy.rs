//! Cross-entropy rows: softmax + negative log-likelihood of the target class, fused.
//!
//! Reads logits [rows, c] and one target per row; writes each row's loss and its statistics
//! (max, ln Σ e^(x − max)), all the backward pass needs besides the logits. The loss is
//! computed as ln Σ e^(x − max) − (x_t − max), never as lse − x_t: for a confident prediction
//! lse and x_t are large and nearly equal, and subtracting them after rounding loses the
//! loss's leading digits (issue 14). The log-sum is ln_1p of the sum without the max's own
//! term ([`shifted_log_sum`]), so a loss of 1e-13 keeps its digits too. One max pass and one
//! exp pass per row.
//! Backward: dx = (e^((x − max) − ln Σ) − onehot(t))·scale for counted rows, 0 for ignored
//! ones; the target's p − 1 is expm1 of its exponent. The max and the log-sum stay apart
//! because their f32 sum (the log-sum-exp) rounds at the max's scale: at logits ~1000 that
//! moved every probability by up to 6e-5 of itself and a confident target's gradient by 10 %
//! (issue 30).

use super::exp_log::exp;
use super::reduce::{for_vectors, max, store_lanes};
use super::softmax::shifted_log_sum;
use crate::simd::Simd;
use crate::{with_isa, Isa};

/// A target that is neither a class index nor the ignore index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadTarget {
    pub row: usize,
    pub target: i64,
    pub classes: usize,
}

impl std::fmt::Display for BadTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cross_entropy: target {} at row {} is not a class index in 0..{} (nor the ignore index)", self.target, self.row, self.classes)
    }
}

impl std::error::Error for BadTarget {}

/// How many f32 statistics [`cross_entropy_rows`] saves per row: its max, then
/// ln Σ e^(x − max).
pub const STATS_PER_ROW: usize = 2;

fn target_of(t: i64, row: usize, c: usize, ignore: i64) -> Result<Option<usize>, BadTarget> {
    if t == ignore {
        Ok(None)
    } else if t < 0 || t as usize >= c {
        Err(BadTarget {
            row,
            target: t,
            classes: c,
        })
    } else {
        Ok(Some(t as usize))
    }
}

/// For each row r of `logits` ([targets.len(), c]): loss[r] (0 for an ignored row) and
/// stats[2r..2r + 2] = (max, ln Σ e^(x − max)). Checks every target first; on an error
/// nothing is written.
///
/// # Panics
/// If the slice lengths do not match `targets.len()` rows of `c` (a caller bug).
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_rows(
    isa: Isa,
    logits: &[f32],
    c: usize,
    targets: &[i64],
    ignore_index: i64,
    loss: &mut [f32],
    stats: &mut [f32],
) -> Result<(), BadTarget> {
    let rows = targets.len();
    assert!(
        c > 0
            && logits.len() == rows * c
            && loss.len() == rows
            && stats.len() == rows * STATS_PER_ROW,
        "cross_entropy_rows: {} logits, {} losses and {} statistics for {rows} targets of {c} classes",
        logits.len(),
        loss.len(),
        stats.len()
    );
    for (r, &t) in targets.iter().enumerate() {
        target_of(t, r, c, ignore_index)?;
    }
    with_isa!(isa, S => {
        for r in 0..rows {
            let row = logits.as_ptr().add(r * c);
            let m = max::<S>(row, c);
            let log_sum = shifted_log_sum::<S>(row, c, m);
            stats[r * STATS_PER_ROW] = m;
            stats[r * STATS_PER_ROW + 1] = log_sum;
            loss[r] = match target_of(targets[r], r, c, ignore_index) {
                Ok(Some(t)) => log_sum - (logits[r * c + t] - m),
                _ => 0.0,
            };
        }
    });
    Ok(())
}

/// dx (rows × c) = (softmax(logits) − onehot(target))·scale; rows with the ignore index get 0.
/// `stats` is [`cross_entropy_rows`]'s output; targets were checked there.
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_rows_backward(
    isa: Isa,
    logits: &[f32],
    c: usize,
    targets: &[i64],
    ignore_index: i64,
    stats: &[f32],
    scale: f32,
    dx: &mut [f32],
) -> Result<(), BadTarget> {
    let rows = targets.len();
    assert!(
        c > 0
            && logits.len() == rows * c
            && dx.len() == rows * c
            && stats.len() == rows * STATS_PER_ROW,
        "cross_entropy_rows_backward: lengths do not match {rows} rows of {c}"
    );
    for (r, &t) in targets.iter().enumerate() {
        target_of(t, r, c, ignore_index)?;
    }
    with_isa!(isa, S => {
        let sv = S::splat(scale);
        for r in 0..rows {
            let d = &mut dx[r * c..(r + 1) * c];
            let Ok(Some(t)) = target_of(targets[r], r, c, ignore_index) else {
                d.fill(0.0);
                continue;
            };
            let (m, log_sum) = (stats[r * STATS_PER_ROW], stats[r * STATS_PER_ROW + 1]);
            let (mv, lv) = (S::splat(m), S::splat(log_sum));
            let dp = d.as_mut_ptr();
            for_vectors::<S>(logits.as_ptr().add(r * c), c, #[inline(always)] |i, v, lanes| {
                let p = exp::<S>(S::sub(S::sub(v, mv), lv));
                store_lanes::<S>(dp.add(i), S::mul(p, sv), lanes)
            });
            // p − 1 as expm1: a confident target's p is within an ulp of 1, and p − 1 would
            // keep only the digits above that ulp.
            let z = (logits[r * c + t] as f64 - m as f64) - log_sum as f64;
            d[t] = (z.exp_m1() * scale as f64) as f32;
        }
    });
    Ok(())
}
