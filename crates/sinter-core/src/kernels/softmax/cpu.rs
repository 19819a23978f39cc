//! Softmax's CPU side: rows in parallel over sinter-cpu's vectorised row kernels
//! (`sinter_cpu::math::softmax`, which the CPU attention also uses), in f32 whatever the dtype.

use sinter_cpu::math::softmax as rows_k;
use sinter_cpu::Isa;

use crate::cpu::nn::row_tasks;
use crate::cpu::{output_vec, CpuStorage};
use crate::custom_op::{HostInput, HostOutput};
use crate::Result;

fn last_dim(x: &HostInput<'_>) -> usize {
    x.shape().last().copied().unwrap_or(1)
}

/// Input x; output softmax(x) (or log_softmax) in x's dtype.
pub(super) fn forward(x: &[HostInput<'_>], log: bool) -> Result<Vec<HostOutput>> {
    let (xs, n) = (x[0].f32_values()?, last_dim(&x[0]));
    // Every row is written below: no zero fill.
    let mut y = output_vec(xs.len());
    let isa = Isa::get();
    row_tasks(&mut y, n, |r, o| {
        rows_k::softmax_rows(isa, &xs[r * n..r * n + o.len()], o, n, log)
    });
    let y = CpuStorage::from_f32(y, x[0].dtype());
    Ok(vec![HostOutput::new(y, x[0].shape())])
}

/// Inputs (y, gy); output gx in y's dtype.
pub(super) fn backward(x: &[HostInput<'_>], log: bool) -> Result<Vec<HostOutput>> {
    let (y, g, n) = (x[0].f32_values()?, x[1].f32_values()?, last_dim(&x[0]));
    let mut dx = output_vec(y.len());
    let isa = Isa::get();
    row_tasks(&mut dx, n, |r, o| {
        let at = r * n..r * n + o.len();
        rows_k::softmax_rows_backward(isa, &y[at.clone()], &g[at], o, n, log)
    });
    let dx = CpuStorage::from_f32(dx, x[0].dtype());
    Ok(vec![HostOutput::new(dx, x[0].shape())])
}
