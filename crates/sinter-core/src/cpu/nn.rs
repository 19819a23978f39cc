//! Fused row kernels (softmax, log-softmax, layer norm, cross-entropy), index gather and
//! scatter-add, and the in-place optimizer updates. Rows are independent, so they are split
//! across cores; parameter-gradient sums use fixed row chunks so they are deterministic.

use rayon::prelude::*;

fn rows_mut(out: &mut [f32], n: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if out.len() >= super::PAR_THRESHOLD {
        out.par_chunks_mut(n)
            .with_min_len((4096 / n).max(1))
            .enumerate()
            .for_each(|(r, o)| f(r, o));
    } else {
        out.chunks_mut(n).enumerate().for_each(|(r, o)| f(r, o));
    }
}

pub fn softmax_rows(x: &[f32], n: usize, log: bool) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    rows_mut(&mut out, n, |r, o| {
        let row = &x[r * n..(r + 1) * n];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for (d, &v) in o.iter_mut().zip(row) {
            *d = (v - max).exp();
            sum += *d;
        }
        if log {
            let lse = sum.ln();
            for (d, &v) in o.iter_mut().zip(row) {
                *d = v - max - lse;
            }
        } else {
            let inv = 1.0 / sum;
            o.iter_mut().for_each(|d| *d *= inv);
        }
    });
    out
}

/// Backward of softmax (y = softmax) or log-softmax (y = log_softmax) over rows of length n.
pub fn softmax_rows_backward(y: &[f32], g: &[f32], n: usize, log: bool) -> Vec<f32> {
    let mut out = vec![0f32; y.len()];
    rows_mut(&mut out, n, |r, o| {
        let (yr, gr) = (&y[r * n..(r + 1) * n], &g[r * n..(r + 1) * n]);
        if log {
            let s: f32 = gr.iter().sum();
            for j in 0..n {
                o[j] = gr[j] - yr[j].exp() * s;
            }
        } else {
            let dot: f32 = yr.iter().zip(gr).map(|(a, b)| a * b).sum();
            for j in 0..n {
                o[j] = yr[j] * (gr[j] - dot);
            }
        }
    });
    out
}

/// Layer norm over rows of length n; returns (y, mean, rstd).
pub fn layer_norm(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    n: usize,
    eps: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len() / n.max(1);
    let mut y = vec![0f32; x.len()];
    let mut stats = vec![(0f32, 0f32); rows];
    let body = |(r, (o, st)): (usize, (&mut [f32], &mut (f32, f32)))| {
        let row = &x[r * n..(r + 1) * n];
        let mean = (row.iter().map(|&v| v as f64).sum::<f64>() / n as f64) as f32;
        let var = (row
            .iter()
            .map(|&v| ((v - mean) as f64).powi(2))
            .sum::<f64>()
            / n as f64) as f32;
        let rstd = 1.0 / (var + eps).sqrt();
        for j in 0..n {
            o[j] = (row[j] - mean) * rstd * gamma[j] + beta[j];
        }
        *st = (mean, rstd);
    };
    if x.len() >= super::PAR_THRESHOLD {
        y.par_chunks_mut(n)
            .zip(stats.par_iter_mut())
            .enumerate()
            .for_each(body);
    } else {
        y.chunks_mut(n)
            .zip(stats.iter_mut())
            .enumerate()
            .for_each(body);
    }
    let (mean, rstd) = stats.into_iter().unzip();
    (y, mean, rstd)
}

/// Returns (dx, dgamma, dbeta).
pub fn layer_norm_backward(
    x: &[f32],
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
    g: &[f32],
    n: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = mean.len();
    let mut dx = vec![0f32; x.len()];
    const CHUNK: usize = 64;
    let partials: Vec<(Vec<f32>, Vec<f32>)> = dx
        .par_chunks_mut(CHUNK * n)
        .enumerate()
        .map(|(c, dxc)| {
            let mut dg = vec![0f32; n];
            let mut db = vec![0f32; n];
            for (local, r) in (c * CHUNK..((c + 1) * CHUNK).min(rows)).enumerate() {
                let (xr, gr) = (&x[r * n..(r + 1) * n], &g[r * n..(r + 1) * n]);
                let (m, rs) = (mean[r], rstd[r]);
                let mut sum_dxhat = 0f32;
                let mut sum_dxhat_xhat = 0f32;
                for j in 0..n {
                    let xhat = (xr[j] - m) * rs;
                    let dxhat = gr[j] * gamma[j];
                    sum_dxhat += dxhat;
                    sum_dxhat_xhat += dxhat * xhat;
                    dg[j] += gr[j] * xhat;
                    db[j] += gr[j];
                }
                let (a, b) = (sum_dxhat / n as f32, sum_dxhat_xhat / n as f32);
                let d = &mut dxc[local * n..(local + 1) * n];
                for j in 0..n {
                    let xhat = (xr[j] - m) * rs;
                    d[j] = rs * (gr[j] * gamma[j] - a - xhat * b);
                }
            }
            (dg, db)
        })
        .collect();
    let mut dgamma = vec![0f32; n];
    let mut dbeta = vec![0f32; n];
    for (dg, db) in partials {
        for j in 0..n {
            dgamma[j] += dg[j];
            dbeta[j] += db[j];
        }
    }
    (dx, dgamma, dbeta)
}

/// Cross-entropy of logits rows [rows, c] against class indices. Returns (sum of losses over
/// counted rows, number counted, each row's log-sum-exp). Errors name a bad target.
pub fn cross_entropy(
    logits: &[f32],
    targets: &[i64],
    c: usize,
    ignore_index: i64,
) -> Result<(f64, usize, Vec<f32>), String> {
    if let Some((i, &t)) = targets
        .iter()
        .enumerate()
        .find(|(_, &t)| t != ignore_index && (t < 0 || t as usize >= c))
    {
        return Err(format!("cross_entropy: target {t} at position {i} is not a class index in 0..{c} (nor the ignore index {ignore_index})"));
    }
    let lse: Vec<f32> = logits
        .par_chunks(c)
        .with_min_len((4096 / c).max(1))
        .map(|row| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            max + row.iter().map(|&v| (v - max).exp()).sum::<f32>().ln()
        })
        .collect();
    let mut total = 0f64;
    let mut count = 0;
    for (r, &t) in targets.iter().enumerate() {
        if t != ignore_index {
            total += (lse[r] - logits[r * c + t as usize]) as f64;
            count += 1;
        }
    }
    Ok((total, count, lse))
}

/// d(loss)/d(logits) for a mean-reduced cross-entropy, scaled by the incoming gradient `scale`.
pub fn cross_entropy_backward(
    logits: &[f32],
    targets: &[i64],
    lse: &[f32],
    c: usize,
    ignore_index: i64,
    scale: f32,
) -> Vec<f32> {
    let mut out = vec![0f32; logits.len()];
    rows_mut(&mut out, c, |r, o| {
        let t = targets[r];
        if t == ignore_index {
            return;
        }
        let row = &logits[r * c..(r + 1) * c];
        for j in 0..c {
            o[j] = (row[j] - lse[r]).exp() * scale;
        }
        o[t as usize] -= scale;
    });
    out
}

/// out[o, j, i] = x[o, idx[j], i] for x viewed as [outer, n, inner].
pub fn index_select<T: Copy + Default + Send + Sync>(
    x: &[T],
    idx: &[usize],
    outer: usize,
    n: usize,
    inner: usize,
) -> Vec<T> {
    let m = idx.len();
    let mut out = vec![T::default(); outer * m * inner];
    out.par_chunks_mut(inner.max(1))
        .with_min_len(64)
        .enumerate()
        .for_each(|(r, o)| {
            let (oi, j) = (r / m, r % m);
            let src = (oi * n + idx[j]) * inner;
            o.copy_from_slice(&x[src..src + inner]);
        });
    out
}

/// dst[o, idx[j], i] += src[o, j, i]: the scatter-add that is index_select's backward.
/// Columns are split across cores; each column sums its rows in index order (deterministic).
pub fn index_add(
    dst: &mut [f32],
    src: &[f32],
    idx: &[usize],
    outer: usize,
    n: usize,
    inner: usize,
) {
    let m = idx.len();
    for oi in 0..outer {
        let d = &mut dst[oi * n * inner..(oi + 1) * n * inner];
        let s = &src[oi * m * inner..(oi + 1) * m * inner];
        if inner >= 64 && m * inner >= super::PAR_THRESHOLD {
            // Split the inner dimension into column blocks, each owned by one task.
            let block = 64;
            let nb = inner.div_ceil(block);
            let dptr = d.as_mut_ptr() as usize;
            (0..nb).into_par_iter().for_each(|b| {
                let lo = b * block;
                let hi = (lo + block).min(inner);
                for (j, &row) in idx.iter().enumerate() {
                    for col in lo..hi {
                        // SAFETY: each task writes only columns lo..hi of every row; blocks are disjoint.
                        unsafe { *(dptr as *mut f32).add(row * inner + col) += s[j * inner + col] };
                    }
                }
            });
        } else {
            for (j, &row) in idx.iter().enumerate() {
                for col in 0..inner {
                    d[row * inner + col] += s[j * inner + col];
                }
            }
        }
    }
}

/// AdamW's hyper-parameters, f64 like PyTorch's Python floats; the step's arithmetic is
/// PyTorch's, the shared rule of `sinter_types::AdamW` (also the CUDA kernel's).
pub use sinter_types::AdamW as AdamWParams;

/// One fused AdamW update (decoupled weight decay) over a flat parameter buffer.
pub fn adamw_step(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], h: AdamWParams) {
    adamw_step_scaled(p, g, m, v, h, 1.0)
}

/// [`adamw_step`] of the gradient times `grad_scale` (unscaling and clipping folded into the
/// update's single pass; a factor of 1 leaves the gradient bit for bit as it is).
pub fn adamw_step_scaled(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    h: AdamWParams,
    grad_scale: f32,
) {
    let f = h.factors();
    let body = |((pi, gi), (mi, vi)): ((&mut f32, &f32), (&mut f32, &mut f32))| {
        (*pi, *mi, *vi) = f.update(*pi, gi * grad_scale, *mi, *vi);
    };
    if p.len() >= super::PAR_THRESHOLD {
        p.par_iter_mut()
            .zip(g.par_iter())
            .zip(m.par_iter_mut().zip(v.par_iter_mut()))
            .with_min_len(4096)
            .for_each(body);
    } else {
        p.iter_mut()
            .zip(g.iter())
            .zip(m.iter_mut().zip(v.iter_mut()))
            .for_each(body);
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdParams {
    pub lr: f32,
    pub momentum: f32,
    pub nesterov: bool,
    pub weight_decay: f32,
}

/// One SGD update (PyTorch's formulation: decay added to the gradient, buffer = μ·buf + g).
pub fn sgd_step(p: &mut [f32], g: &[f32], buf: Option<&mut [f32]>, h: SgdParams) {
    sgd_step_scaled(p, g, buf, h, 1.0)
}

/// [`sgd_step`] of the gradient times `grad_scale`.
pub fn sgd_step_scaled(
    p: &mut [f32],
    g: &[f32],
    buf: Option<&mut [f32]>,
    h: SgdParams,
    grad_scale: f32,
) {
    match buf {
        None => p
            .iter_mut()
            .zip(g)
            .for_each(|(pi, &gi)| *pi -= h.lr * (gi * grad_scale + h.weight_decay * *pi)),
        Some(b) => p
            .iter_mut()
            .zip(g)
            .zip(b.iter_mut())
            .for_each(|((pi, &gi), bi)| {
                let d = gi * grad_scale + h.weight_decay * *pi;
                *bi = h.momentum * *bi + d;
                let step = if h.nesterov {
                    d + h.momentum * *bi
                } else {
                    *bi
                };
                *pi -= h.lr * step;
            }),
    }
}

/// The step control block's slots (shared with the CUDA kernels).
pub use sinter_cuda::ops::adamw::{ctl, ScalerCfg};

/// CPU `step_prepare` (same arithmetic as the kernel in adamw.cu): from the squared global norm
/// of the loss-scaled gradients, set found_inf (with dynamic scaling), the unscaled norm and the
/// gradient factor min(1, max_norm / (norm + 1e-6)) / scale; `max_norm` ≤ 0: no clipping.
pub fn step_prepare(c: &mut [f32], sumsq: f32, max_norm: f32, dynamic: bool) {
    let scale = c[ctl::SCALE];
    let bad = !sumsq.is_finite();
    c[ctl::FOUND_INF] = if dynamic && bad { 1.0 } else { 0.0 };
    let norm = sumsq.sqrt() / scale;
    c[ctl::GRAD_NORM] = norm;
    let clip = if !bad && max_norm > 0.0 && norm > max_norm {
        max_norm / (norm + 1e-6)
    } else {
        1.0
    };
    c[ctl::GRAD_FACTOR] = clip / scale;
}

/// CPU `step_finish` (same arithmetic as the kernel): a skipped step shrinks the scale, a good
/// one counts (growing the scale after `interval` in a row) and advances the optimizer's step
/// count; then the schedule advances and the next learning rate is loaded from `lr_table`.
pub fn step_finish(c: &mut [f32], lr_table: &[f32], scaler: Option<ScalerCfg>) {
    match scaler {
        Some(s) if c[ctl::FOUND_INF] != 0.0 => {
            c[ctl::SCALE] = (c[ctl::SCALE] * s.backoff).max(f32::MIN_POSITIVE);
            c[ctl::GOOD_STEPS] = 0.0;
            c[ctl::SKIPPED] += 1.0;
        }
        _ => {
            c[ctl::STEPS] += 1.0;
            if let Some(s) = scaler {
                let good = c[ctl::GOOD_STEPS] + 1.0;
                if good >= s.interval as f32 {
                    let grown = c[ctl::SCALE] * s.growth;
                    if grown < f32::MAX {
                        c[ctl::SCALE] = grown;
                    }
                    c[ctl::GOOD_STEPS] = 0.0;
                } else {
                    c[ctl::GOOD_STEPS] = good;
                }
            }
        }
    }
    c[ctl::FOUND_INF] = 0.0;
    let it = c[ctl::ITER] + 1.0;
    c[ctl::ITER] = it;
    if let Some(last) = lr_table.len().checked_sub(1) {
        c[ctl::LR] = lr_table[(it as usize).min(last)];
    }
}
