//! Fused Transformer row kernels on the CPU: bias + GELU (tanh form) with its backward, over
//! sinter-cpu's vectorised row kernels (the same arithmetic as the unfused GELU path, so fused
//! and composite agree). Rows
//! run on all cores; parameter-gradient sums use fixed row chunks, so results do not depend
//! on the thread count.

use rayon::prelude::*;
use sinter_cpu::math::{bias_act, Activation};
use sinter_cpu::Isa;

use super::nn::{fixed_chunks, rows_per_task, sum_partials, CHUNK_ROWS};
use super::output_vec;

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
