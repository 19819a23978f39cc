//! LayerNorm's CPU forwards: rows in parallel over sinter-cpu's vectorised row kernels
//! (`sinter_cpu::math::layer_norm`, which the CPU decode path also uses). Statistics and
//! arithmetic in f32 whatever the inputs' dtype; parameter-gradient sums over fixed row chunks,
//! so results do not depend on the thread count.

use rayon::prelude::*;
use sinter_cpu::math::layer_norm as rows_k;
use sinter_cpu::Isa;

use crate::cpu::nn::{fixed_chunks, rows_per_task, sum_partials, CHUNK_ROWS};
use crate::cpu::{output_vec, CpuStorage};
use crate::custom_op::{HostInput, HostOutput};
use crate::Result;

/// Rows of `x` (the last dimension being n).
fn rows_n(x: &HostInput<'_>) -> (usize, usize) {
    let n = x.shape().last().copied().unwrap_or(1);
    (x.shape().iter().product::<usize>() / n.max(1), n)
}

/// Inputs (x, gamma, beta); outputs (y in x's dtype, mean, rstd).
pub(super) fn forward(x: &[HostInput<'_>], eps: f32) -> Result<Vec<HostOutput>> {
    let (rows, n) = rows_n(&x[0]);
    let (xs, gamma, beta) = (x[0].f32_values()?, x[1].f32_values()?, x[2].f32_values()?);
    // Every row's output and statistics are written below: no zero fill.
    let mut y = output_vec(xs.len());
    let (mut mean, mut rstd) = (output_vec(rows), output_vec(rows));
    if rows > 0 {
        let isa = Isa::get();
        let per = rows_per_task(xs.len(), n);
        y.par_chunks_mut(per * n)
            .zip(mean.par_chunks_mut(per))
            .zip(rstd.par_chunks_mut(per))
            .enumerate()
            .for_each(|(i, ((o, m), rs))| {
                let at = i * per * n..i * per * n + o.len();
                rows_k::layer_norm_rows(isa, &xs[at], &gamma, &beta, eps, o, m, rs);
            });
    }
    Ok(vec![
        HostOutput::new(CpuStorage::from_f32(y, x[0].dtype()), x[0].shape()),
        HostOutput::f32(mean, &[rows]),
        HostOutput::f32(rstd, &[rows]),
    ])
}

/// Inputs (x, residual, gamma, beta); outputs (h = x + residual and LayerNorm(h) in x's dtype,
/// mean, rstd).
pub(super) fn residual_forward(x: &[HostInput<'_>], eps: f32) -> Result<Vec<HostOutput>> {
    let (rows, n) = rows_n(&x[0]);
    let (xs, res) = (x[0].f32_values()?, x[1].f32_values()?);
    let (gamma, beta) = (x[2].f32_values()?, x[3].f32_values()?);
    let (mut sum, mut y) = (output_vec(xs.len()), output_vec(xs.len()));
    let (mut mean, mut rstd) = (output_vec(rows), output_vec(rows));
    if rows > 0 {
        let isa = Isa::get();
        let per = rows_per_task(xs.len(), n);
        sum.par_chunks_mut(per * n)
            .zip(y.par_chunks_mut(per * n))
            .zip(mean.par_chunks_mut(per).zip(rstd.par_chunks_mut(per)))
            .enumerate()
            .for_each(|(i, ((s, o), (m, rs)))| {
                let at = i * per * n..i * per * n + s.len();
                let (xr, rr) = (&xs[at.clone()], &res[at]);
                rows_k::residual_layer_norm_rows(isa, xr, rr, &gamma, &beta, eps, s, o, m, rs);
            });
    }
    let (dtype, shape) = (x[0].dtype(), x[0].shape());
    Ok(vec![
        HostOutput::new(CpuStorage::from_f32(sum, dtype), shape),
        HostOutput::new(CpuStorage::from_f32(y, dtype), shape),
        HostOutput::f32(mean, &[rows]),
        HostOutput::f32(rstd, &[rows]),
    ])
}

/// Inputs (gy, x, gamma, mean, rstd); outputs (dx in x's dtype, dgamma and dbeta in f32), all
/// from one pass over the rows.
pub(super) fn backward(x: &[HostInput<'_>]) -> Result<Vec<HostOutput>> {
    let (rows, n) = rows_n(&x[1]);
    let (g, xs, gamma) = (x[0].f32_values()?, x[1].f32_values()?, x[2].f32_values()?);
    let (mean, rstd) = (x[3].f32()?, x[4].f32()?);
    // Every row of dx is written below: no zero fill.
    let mut dx = output_vec(xs.len());
    let (dg, db) = if rows == 0 {
        (vec![0f32; n], vec![0f32; n])
    } else {
        let isa = Isa::get();
        let partials = fixed_chunks(&mut dx, n, |c, d| {
            let (r0, rs) = (c * CHUNK_ROWS, d.len() / n);
            let at = r0 * n..r0 * n + d.len();
            let (mut dg, mut db) = (vec![0f32; n], vec![0f32; n]);
            rows_k::layer_norm_backward_rows(
                isa,
                &xs[at.clone()],
                &gamma,
                &mean[r0..r0 + rs],
                &rstd[r0..r0 + rs],
                &g[at],
                d,
                &mut dg,
                &mut db,
            );
            (dg, db)
        });
        let (dg, db): (Vec<_>, Vec<_>) = partials.into_iter().unzip();
        (sum_partials(dg, n), sum_partials(db, n))
    };
    Ok(vec![
        HostOutput::new(CpuStorage::from_f32(dx, x[1].dtype()), x[1].shape()),
        HostOutput::f32(dg, &[n]),
        HostOutput::f32(db, &[n]),
    ])
}
