//! Cross-entropy rows: softmax + negative log-likelihood of the target class, fused.
//!
//! Reads logits [rows, c] and one target per row; writes each row's loss and log-sum-exp
//! (all the backward pass needs besides the logits). The loss is computed as
//! ln Σ e^(x − max) − (x_t − max), never as lse − x_t: for a confident prediction lse and
//! x_t are large and nearly equal, and subtracting them after rounding loses the loss's
//! leading digits (issue 14). The sum is split as 1 + rest (the max's own term kept out) and
//! its log taken as ln_1p(rest), so a loss of 1e-13 keeps its digits too. One max pass and
//! one exp pass per row.
//! Backward: dx = (e^(x − lse) − onehot(t))·scale for counted rows, 0 for ignored ones.

use super::exp_log::exp;
use super::reduce::{for_vectors, max, store_lanes};
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
/// lse[r] = ln Σ e^x. Checks every target first; on an error nothing is written.
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
    lse: &mut [f32],
) -> Result<(), BadTarget> {
    let rows = targets.len();
    assert!(
        c > 0 && logits.len() == rows * c && loss.len() == rows && lse.len() == rows,
        "cross_entropy_rows: {} logits, {} losses and {} lse for {rows} targets of {c} classes",
        logits.len(),
        loss.len(),
        lse.len()
    );
    for (r, &t) in targets.iter().enumerate() {
        target_of(t, r, c, ignore_index)?;
    }
    with_isa!(isa, S => {
        for r in 0..rows {
            let row = logits.as_ptr().add(r * c);
            let m = max::<S>(row, c);
            let mv = S::splat(m);
            // Σ e^(x − max) = 1 + rest, with the max's own 1 kept out of the vector sum (and
            // ties added back exactly), so ln(1 + rest) keeps rest's digits when it is tiny.
            let (mut acc, mut ties) = (S::zero(), S::zero());
            for_vectors::<S>(row, c, #[inline(always)] |_, v, lanes| {
                let at_max = S::eq(v, mv);
                let e = S::select(at_max, S::zero(), exp::<S>(S::sub(v, mv)));
                let t = S::select(at_max, S::splat(1.0), S::zero());
                let (e, t) = if lanes == S::LANES { (e, t) } else { (S::keep_first(e, lanes), S::keep_first(t, lanes)) };
                acc = S::add(acc, e);
                ties = S::add(ties, t);
            });
            let rest = S::reduce_add(acc) as f64 + (S::reduce_add(ties) as f64 - 1.0).max(0.0);
            let log_sum = rest.ln_1p() as f32;
            lse[r] = m + log_sum;
            loss[r] = match target_of(targets[r], r, c, ignore_index) {
                Ok(Some(t)) => log_sum - (logits[r * c + t] - m),
                _ => 0.0,
            };
        }
    });
    Ok(())
}

/// dx (rows × c) = (softmax(logits) − onehot(target))·scale; rows with the ignore index get 0.
/// `lse` is [`cross_entropy_rows`]'s output; targets were checked there.
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_rows_backward(
    isa: Isa,
    logits: &[f32],
    c: usize,
    targets: &[i64],
    ignore_index: i64,
    lse: &[f32],
    scale: f32,
    dx: &mut [f32],
) -> Result<(), BadTarget> {
    let rows = targets.len();
    assert!(
        c > 0 && logits.len() == rows * c && dx.len() == rows * c && lse.len() == rows,
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
            let lv = S::splat(lse[r]);
            let dp = d.as_mut_ptr();
            for_vectors::<S>(logits.as_ptr().add(r * c), c, #[inline(always)] |i, v, lanes| {
                store_lanes::<S>(dp.add(i), S::mul(exp::<S>(S::sub(v, lv)), sv), lanes)
            });
            d[t] -= scale;
        }
    });
    Ok(())
}
