//! Fused Transformer row kernels on the CPU: residual add + LayerNorm, and bias + GELU
//! (tanh form) with its backward. Rows run on all cores; parameter-gradient sums use fixed row
//! chunks, so results do not depend on the thread count.

use rayon::prelude::*;

use crate::op::UnaryOp;

const GELU: UnaryOp = UnaryOp::GeluTanh;

/// Rows per task in bias + GELU's backward (also the fixed grouping of the bias-gradient sum).
const CHUNK_ROWS: usize = 64;

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
    let mut sum = vec![0f32; x.len()];
    let mut y = vec![0f32; x.len()];
    let mut stats = vec![(0f32, 0f32); rows];
    type Row<'a> = (usize, ((&'a mut [f32], &'a mut [f32]), &'a mut (f32, f32)));
    let body = |(i, ((s, o), st)): Row| {
        let (xr, rr) = (&x[i * n..(i + 1) * n], &r[i * n..(i + 1) * n]);
        let mut acc = 0f64;
        for j in 0..n {
            s[j] = xr[j] + rr[j];
            acc += s[j] as f64;
        }
        // The same arithmetic as super::nn::layer_norm, so the values match the composite exactly.
        let mean = (acc / n as f64) as f32;
        let var = (s.iter().map(|&v| ((v - mean) as f64).powi(2)).sum::<f64>() / n as f64) as f32;
        let rstd = 1.0 / (var + eps).sqrt();
        for j in 0..n {
            o[j] = (s[j] - mean) * rstd * gamma[j] + beta[j];
        }
        *st = (mean, rstd);
    };
    if n > 0 {
        if x.len() >= super::PAR_THRESHOLD {
            sum.par_chunks_mut(n)
                .zip(y.par_chunks_mut(n))
                .zip(stats.par_iter_mut())
                .with_min_len((4096 / n).max(1))
                .enumerate()
                .for_each(body);
        } else {
            sum.chunks_mut(n)
                .zip(y.chunks_mut(n))
                .zip(stats.iter_mut())
                .enumerate()
                .for_each(body);
        }
    }
    let (mean, rstd) = stats.into_iter().unzip();
    (sum, y, mean, rstd)
}

/// y = gelu_tanh(x + bias) for rows of length n (bias [n]).
pub fn bias_gelu(x: &[f32], bias: &[f32], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    let body = |(r, o): (usize, &mut [f32])| {
        for ((o, &xi), &bi) in o.iter_mut().zip(&x[r * n..(r + 1) * n]).zip(bias.iter()) {
            *o = GELU.apply(xi + bi);
        }
    };
    if n > 0 {
        if y.len() >= super::PAR_THRESHOLD {
            y.par_chunks_mut(n)
                .with_min_len((4096 / n).max(1))
                .enumerate()
                .for_each(body);
        } else {
            y.chunks_mut(n).enumerate().for_each(body);
        }
    }
    y
}

/// (dx, dbias) of [`bias_gelu`] from the output gradient `g`; the pre-activation x + bias is
/// re-derived (one add per element) instead of stored.
pub fn bias_gelu_backward(x: &[f32], bias: &[f32], g: &[f32], n: usize) -> (Vec<f32>, Vec<f32>) {
    let mut dx = vec![0f32; x.len()];
    if n == 0 {
        return (dx, Vec::new());
    }
    let partials: Vec<Vec<f32>> = dx
        .par_chunks_mut(CHUNK_ROWS * n)
        .enumerate()
        .map(|(c, d)| {
            let mut db = vec![0f32; n];
            for (local, row) in d.chunks_mut(n).enumerate() {
                let at = (c * CHUNK_ROWS + local) * n;
                let (xr, gr) = (&x[at..at + n], &g[at..at + n]);
                for j in 0..n {
                    let du = gr[j] * gelu_tanh_grad(xr[j] + bias[j]);
                    row[j] = du;
                    db[j] += du;
                }
            }
            db
        })
        .collect();
    let mut db = vec![0f32; n];
    for p in partials {
        db.iter_mut().zip(p).for_each(|(a, b)| *a += b);
    }
    (dx, db)
}

/// d gelu_tanh(u) / du in f32 (the composite evaluates the same formula in f64).
#[inline]
fn gelu_tanh_grad(u: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    let u2 = u * u;
    let t = (C * (u + 0.044715 * u2 * u)).tanh();
    0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * C * (1.0 + 3.0 * 0.044715 * u2)
}
