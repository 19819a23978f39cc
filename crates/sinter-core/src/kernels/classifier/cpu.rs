//! The fused classifier's CPU loops: rows in parallel, each row read twice (max and sum of
//! exponentials, then the gradient) and its gradient written once, in the logits' dtype.

use half::{bf16, f16};
use rayon::prelude::*;

use crate::cpu::CpuStorage;
use crate::custom_op::{HostInput, HostOutput, HostSlice};
use crate::{bail, Result};

/// Rows per parallel task: enough work to pay for the task (vocabularies are large).
const ROWS_PER_TASK: usize = 4;

/// One row: its loss and, written into `d`, (softmax − onehot)·scale over the first `valid`
/// columns (0 beyond, and everywhere for an ignored row). Same formulas as `classifier.cu`.
fn row<T: Copy>(
    x: &[T],
    d: &mut [T],
    t: i64,
    (scale, valid, ignore): (f32, usize, i64),
    to: impl Fn(T) -> f32,
    from: impl Fn(f32) -> T,
) -> f32 {
    let zero = from(0.0);
    if t == ignore {
        d.fill(zero);
        return 0.0;
    }
    let xs = &x[..valid];
    let m = xs.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(to(v)));
    let sum: f32 = xs.iter().map(|&v| (to(v) - m).exp()).sum();
    let log_sum = sum.ln();
    for (j, (o, &v)) in d.iter_mut().zip(x).enumerate() {
        *o = if j < valid {
            let z = (to(v) - m) - log_sum;
            from(if j as i64 == t { z.exp_m1() } else { z.exp() } * scale)
        } else {
            zero
        };
    }
    if t < 0 || t as usize >= valid {
        return f32::NAN;
    }
    log_sum - (to(x[t as usize]) - m)
}

/// All rows of `x` ([rows, n]): per-row losses and the gradient, in `T`.
fn rows<T: Copy + Send + Sync>(
    x: &[T],
    targets: &[i64],
    scale: f32,
    (n, valid, ignore): (usize, usize, i64),
    to: impl Fn(T) -> f32 + Sync,
    from: impl Fn(f32) -> T + Sync,
) -> (Vec<f32>, Vec<T>) {
    let mut loss = vec![0f32; targets.len()];
    let mut d = vec![from(0.0); x.len()];
    d.par_chunks_mut(n * ROWS_PER_TASK)
        .zip(loss.par_chunks_mut(ROWS_PER_TASK))
        .enumerate()
        .for_each(|(c, (dc, lc))| {
            let r0 = c * ROWS_PER_TASK;
            for (k, (dr, l)) in dc.chunks_mut(n).zip(lc).enumerate() {
                let r = r0 + k;
                *l = row(
                    &x[r * n..(r + 1) * n],
                    dr,
                    targets[r],
                    (scale, valid, ignore),
                    &to,
                    &from,
                );
            }
        });
    (loss, d)
}

/// The CPU forward of the op: inputs (logits [rows, n], targets [rows], scale [1]), outputs
/// (loss [rows] f32, dlogits [rows, n] in the logits' dtype).
pub(super) fn forward(x: &[HostInput<'_>], valid: usize, ignore: i64) -> Result<Vec<HostOutput>> {
    let shape = x[0].shape();
    let n = shape[1];
    let (targets, scale) = (x[1].i64()?, x[2].f32()?[0]);
    let g = (n, valid, ignore);
    let (loss, d) = match x[0].data() {
        HostSlice::F32(v) => {
            let (l, d) = rows(v, targets, scale, g, |a| a, |a| a);
            (l, CpuStorage::F32(d))
        }
        HostSlice::BF16(v) => {
            let (l, d) = rows(v, targets, scale, g, bf16::to_f32, bf16::from_f32);
            (l, CpuStorage::BF16(d))
        }
        HostSlice::F16(v) => {
            let (l, d) = rows(v, targets, scale, g, f16::to_f32, f16::from_f32);
            (l, CpuStorage::F16(d))
        }
        _ => bail!("fused_classifier: logits must be f32, bf16 or f16"),
    };
    Ok(vec![
        HostOutput::f32(loss, &shape[..1]),
        HostOutput::new(d, shape),
    ])
}

/// The CPU forward of the gradient scale: d · g[0] (a copy when g[0] == 1).
pub(super) fn grad_scale(x: &[HostInput<'_>]) -> Result<Vec<HostOutput>> {
    let k = x[1].f32()?[0];
    let d = match x[0].data() {
        HostSlice::F32(v) => CpuStorage::F32(v.iter().map(|a| a * k).collect()),
        HostSlice::BF16(v) => {
            CpuStorage::BF16(v.iter().map(|a| bf16::from_f32(a.to_f32() * k)).collect())
        }
        HostSlice::F16(v) => {
            CpuStorage::F16(v.iter().map(|a| f16::from_f32(a.to_f32() * k)).collect())
        }
        _ => bail!("fused_classifier: its gradient must be f32, bf16 or f16"),
    };
    Ok(vec![HostOutput::new(d, x[0].shape())])
}
