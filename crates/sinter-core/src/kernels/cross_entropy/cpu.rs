//! Cross-entropy's CPU side: rows in parallel over sinter-cpu's vectorised row kernels
//! (`sinter_cpu::math::cross_entropy`), in f32 whatever the logits' dtype.

use rayon::prelude::*;
use sinter_cpu::math::cross_entropy as rows_k;
use sinter_cpu::Isa;

use crate::backend::{check_indices, IndexUse};
use crate::cpu::nn::{row_tasks, rows_per_task};
use crate::cpu::{output_vec, CpuStorage};
use crate::custom_op::{HostInput, HostOutput};
use crate::Result;
use sinter_cpu::math::cross_entropy::STATS_PER_ROW as STATS;

/// Inputs (logits [.., c], targets); outputs (each row's loss in the targets' shape, 0 where
/// ignored; each row's statistics [rows, 2], see `rows_k::cross_entropy_rows`). A target that
/// is neither a class nor `ignore` is an error naming it.
pub(super) fn forward(x: &[HostInput<'_>], ignore: i64) -> Result<Vec<HostOutput>> {
    let c = x[0].shape().last().copied().unwrap_or(1);
    let (logits, targets) = (x[0].f32_values()?, x[1].i64()?);
    check_indices(targets, c, Some(ignore), IndexUse::CrossEntropy)?;
    let rows = targets.len();
    let (mut loss, mut stats) = (vec![0f32; rows], vec![0f32; rows * STATS]);
    // No class at all: every row is ignored (checked above), its loss 0.
    if c > 0 && rows > 0 {
        let isa = Isa::get();
        let per = rows_per_task(logits.len(), c);
        loss.par_chunks_mut(per)
            .zip(stats.par_chunks_mut(per * STATS))
            .enumerate()
            .for_each(|(i, (l, s))| {
                let r = i * per..i * per + l.len();
                let x = &logits[r.start * c..r.end * c];
                rows_k::cross_entropy_rows(isa, x, c, &targets[r], ignore, l, s)
                    .expect("targets checked above");
            });
    }
    Ok(vec![
        HostOutput::f32(loss, x[1].shape()),
        HostOutput::f32(stats, &[rows, STATS]),
    ])
}

/// Inputs (logits, targets, stats, the per-row loss gradient g); output d(Σ_r g_r·loss_r)/d
/// logits = each row's (softmax − onehot)·g_r, in the logits' dtype.
pub(super) fn backward(x: &[HostInput<'_>], ignore: i64) -> Result<Vec<HostOutput>> {
    let c = x[0].shape().last().copied().unwrap_or(1);
    let (logits, targets) = (x[0].f32_values()?, x[1].i64()?);
    let (stats, grad) = (x[2].f32()?, x[3].f32()?);
    // Every row is written (an ignored target's with zeros): no zero fill.
    let mut out = output_vec(logits.len());
    let isa = Isa::get();
    row_tasks(&mut out, c, |r0, o| {
        let rows = r0..r0 + o.len() / c;
        // Runs of rows sharing one gradient (all of them for a mean or a sum) in one call.
        let mut start = rows.start;
        while start < rows.end {
            let scale = grad[start];
            let end = (start..rows.end)
                .find(|&r| grad[r].to_bits() != scale.to_bits())
                .unwrap_or(rows.end);
            let r = start..end;
            rows_k::cross_entropy_rows_backward(
                isa,
                &logits[r.start * c..r.end * c],
                c,
                &targets[r.clone()],
                ignore,
                &stats[r.start * STATS..r.end * STATS],
                scale,
                &mut o[(r.start - r0) * c..(r.end - r0) * c],
            )
            .expect("targets were checked by the forward pass");
            start = end;
        }
    });
    let d = CpuStorage::from_f32(out, x[0].dtype());
    Ok(vec![HostOutput::new(d, x[0].shape())])
}
