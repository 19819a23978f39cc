//! Fused Transformer row kernels on the CPU: residual add + LayerNorm, and bias + GELU
//! (tanh form) with its backward, over sinter-cpu's vectorised row kernels (the same
//! arithmetic as the unfused layer_norm and GELU paths, so fused and composite agree). Rows
//! run on all cores; parameter-gradient sums use fixed row chunks, so results do not depend
//! on the thread count.

use rayon::prelude::*;
use sinter_cpu::math::{bias_act, layer_norm, Activation};
use sinter_cpu::Isa;

use super::nn::{fixed_chunks, rows_per_task, sum_partials, CHUNK_ROWS};
use super::output_vec;

/// Returns (sum, normed) for rows of length n: sum = x + r, normed = LN(sum), and the
/// per-row (mean, rstd).
pub fn residual_layer_norm(
    x: &[f32],
    r: &[f32],
    gamma: &[f32],
    beta: &[f32],
    n: usize,
    eps: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len() / n.max(1);
    if n == 0 || rows == 0 {
        let zeros = |len: usize| vec![0f32; len];
        return (zeros(x.len()), zeros(x.len()), zeros(rows), zeros(rows));
    }
    // Every row's sum, output and statistics are written below: no zero fill.
    let (mut sum, mut y) = (output_vec(x.len()), output_vec(x.len()));
    let (mut mean, mut rstd) = (output_vec(rows), output_vec(rows));
    let isa = Isa::get();
    let per = rows_per_task(x.len(), n);
    sum.par_chunks_mut(per * n)
        .zip(y.par_chunks_mut(per * n))
        .zip(mean.par_chunks_mut(per).zip(rstd.par_chunks_mut(per)))
        .enumerate()
        .for_each(|(i, ((s, o), (m, rs)))| {
            let at = i * per * n..i * per * n + s.len();
            let (xs, res) = (&x[at.clone()], &r[at]);
            layer_norm::residual_layer_norm_rows(isa, xs, res, gamma, beta, eps, s, o, m, rs);
        });
    (sum, y, mean, rstd)
}

/// y = gelu_tanh(x + bias) for rows of length n (bias [n]).
pub fn bias_gelu(x: &[f32], bias: &[f32], n: usize) -> Vec<f32> {
    if n == 0 || x.is_empty() {
        return vec![0f32; x.len()];
    }
    let mut y = output_vec(x.len());
    let isa = Isa::get();
    let block = rows_per_task(x.len(), n) * n;
    y.par_chunks_mut(block).enumerate().for_each(|(i, o)| {
        let xs = &x[i * block..i * block + o.len()];
        bias_act::bias_act_rows(isa, xs, bias, Activation::GeluTanh, o);
    });
    y
}

/// (dx, dbias) of [`bias_gelu`] from the output gradient `g`; the pre-activation x + bias is
/// re-derived (one add per element) instead of stored.
pub fn bias_gelu_backward(x: &[f32], bias: &[f32], g: &[f32], n: usize) -> (Vec<f32>, Vec<f32>) {
    if n == 0 || x.is_empty() {
        return (vec![0f32; x.len()], vec![0f32; n]);
    }
    let mut dx = output_vec(x.len());
    let isa = Isa::get();
    let partials = fixed_chunks(&mut dx, n, |c, d| {
        let start = c * CHUNK_ROWS * n;
        let at = start..start + d.len();
        let mut db = vec![0f32; n];
        let (xs, gs) = (&x[at.clone()], &g[at]);
        bias_act::bias_act_backward_rows(isa, xs, bias, Activation::GeluTanh, gs, d, &mut db);
        db
    });
    (dx, sum_partials(partials, n))
}
