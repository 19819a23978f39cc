//! The LLTM cell's pointwise part on the CPU, as fused loops over one batch row at a time: the
//! transcendentals through sinter-cpu's vectorised math (run-time ISA dispatch), the arithmetic
//! in plain loops the compiler vectorises, every intermediate in L1 (a row is 3·state floats).
//! Rows run in parallel (rayon) once a call has enough work to pay for the fork.
//! The same math as `lltm.cu`; see it for the layouts.

use rayon::prelude::*;
use sinter_cpu::math::{unary, unary_in_place, Unary};

/// Below this many elements (batch × state) a call runs on one thread: measured on the 2-core
/// dev machine, rayon's fork costs more than it saves up to batch 64 × 128 units (8192) and
/// pays from batch 256 (the backward 1.6× faster, the forward 1.2×).
const PARALLEL_FROM: usize = 1 << 14;

/// (new_h, new_cell, act) from gates [batch, 3s] and old_cell [batch, s].
pub fn forward(gates: &[f32], old_cell: &[f32], s: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let n = old_cell.len();
    let (mut h, mut c, mut act) = (vec![0.0; n], vec![0.0; n], vec![0.0; 3 * n]);
    if n == 0 {
        return (h, c, act);
    }
    let row = |b: usize, h: &mut [f32], c: &mut [f32], a: &mut [f32]| {
        forward_row(
            &gates[3 * s * b..][..3 * s],
            &old_cell[s * b..][..s],
            h,
            c,
            a,
        )
    };
    if n >= PARALLEL_FROM {
        (
            h.par_chunks_mut(s),
            c.par_chunks_mut(s),
            act.par_chunks_mut(3 * s),
        )
            .into_par_iter()
            .enumerate()
            .for_each(|(b, (h, c, a))| row(b, h, c, a));
    } else {
        h.chunks_mut(s)
            .zip(c.chunks_mut(s))
            .zip(act.chunks_mut(3 * s))
            .enumerate()
            .for_each(|(b, ((h, c), a))| row(b, h, c, a));
    }
    (h, c, act)
}

fn forward_row(g: &[f32], old_c: &[f32], h: &mut [f32], c: &mut [f32], act: &mut [f32]) {
    let s = old_c.len();
    let (ai, rest) = act.split_at_mut(s);
    let (ao, ac) = rest.split_at_mut(s);
    unary(Unary::Sigmoid, &g[..s], ai);
    unary(Unary::Sigmoid, &g[s..2 * s], ao);
    // ELU (alpha 1): exp(min(z, 0)) − 1 below zero, z above (a NaN stays NaN).
    let zc = &g[2 * s..];
    for (a, &z) in ac.iter_mut().zip(zc) {
        *a = if z > 0.0 { 0.0 } else { z };
    }
    unary_in_place(Unary::Exp, ac);
    for (a, &z) in ac.iter_mut().zip(zc) {
        *a = if z > 0.0 { z } else { *a - 1.0 };
    }
    for j in 0..s {
        c[j] = old_c[j] + ac[j] * ai[j];
    }
    unary(Unary::Tanh, c, h);
    for (h, o) in h.iter_mut().zip(ao.iter()) {
        *h *= o;
    }
}

/// (d_gates [batch, 3s], d_old_cell [batch, s]) from the gradients of h and c, the new cell
/// and the saved activations.
pub fn backward(
    grad_h: &[f32],
    grad_c: &[f32],
    new_cell: &[f32],
    act: &[f32],
    s: usize,
) -> (Vec<f32>, Vec<f32>) {
    let n = new_cell.len();
    let (mut dg, mut dc) = (vec![0.0; 3 * n], vec![0.0; n]);
    if n == 0 {
        return (dg, dc);
    }
    let row = |b: usize, dg: &mut [f32], dc: &mut [f32]| {
        let r = s * b..s * (b + 1);
        let a = &act[3 * s * b..][..3 * s];
        backward_row(
            &grad_h[r.clone()],
            &grad_c[r.clone()],
            &new_cell[r],
            a,
            dg,
            dc,
        )
    };
    if n >= PARALLEL_FROM {
        (dg.par_chunks_mut(3 * s), dc.par_chunks_mut(s))
            .into_par_iter()
            .enumerate()
            .for_each(|(b, (dg, dc))| row(b, dg, dc));
    } else {
        dg.chunks_mut(3 * s)
            .zip(dc.chunks_mut(s))
            .enumerate()
            .for_each(|(b, (dg, dc))| row(b, dg, dc));
    }
    (dg, dc)
}

fn backward_row(gh: &[f32], gc: &[f32], nc: &[f32], act: &[f32], dg: &mut [f32], dc: &mut [f32]) {
    let s = nc.len();
    let (i, rest) = act.split_at(s);
    let (o, c) = rest.split_at(s);
    let (dgi, rest) = dg.split_at_mut(s);
    let (dgo, dgc) = rest.split_at_mut(s);
    // tanh(new cell) goes through `dc` before `dc` receives the old cell's gradient.
    unary(Unary::Tanh, nc, dc);
    for j in 0..s {
        let t = dc[j];
        let d_nc = (1.0 - t * t) * o[j] * gh[j] + gc[j];
        dgi[j] = c[j] * d_nc * i[j] * (1.0 - i[j]);
        dgo[j] = t * gh[j] * o[j] * (1.0 - o[j]);
        dgc[j] = i[j] * d_nc * if c[j] > 0.0 { 1.0 } else { c[j] + 1.0 };
        dc[j] = d_nc;
    }
}
