//! The CPU side of conv2d + bias + ReLU: the convolution's own output pass adds the bias and
//! applies the ReLU as it stores each row (`cpu::conv`'s epilogue), and the backward's ReLU
//! gradient and bias sum run in one pass over dy and y.

use rayon::prelude::*;

use crate::backend::ConvGeom;
use crate::cpu::conv::{conv2d_forward_fused, Epilogue};
use crate::cpu::{output_vec, CpuStorage, PAR_THRESHOLD};
use crate::Layout;

/// y = relu?(conv2d(x, w) + bias) [n, o, oh, ow] in x's dtype.
pub(super) fn forward(
    (x, xl): (&CpuStorage, &Layout),
    (w, wl): (&CpuStorage, &Layout),
    (bias, bl): (&CpuStorage, &Layout),
    relu: bool,
    g: &ConvGeom,
) -> CpuStorage {
    let b = bias.f32_contiguous(bl);
    let e = Epilogue {
        bias: Some(&b),
        relu,
    };
    let y = conv2d_forward_fused(&x.f32_contiguous(xl), &w.f32_contiguous(wl), g, e);
    CpuStorage::from_f32(y, x.dtype())
}

/// (dpre, dbias [channels]) from dy and y [n, channels, ...], both in dy's dtype.
pub(super) fn backward(
    (dy, dyl): (&CpuStorage, &Layout),
    (y, yl): (&CpuStorage, &Layout),
    relu: bool,
    channels: usize,
) -> (CpuStorage, CpuStorage) {
    let hw: usize = dyl.shape().get(2..).map_or(1, |s| s.iter().product());
    let (dpre, db) = bias_relu_backward_rows(
        &dy.f32_contiguous(dyl),
        &y.f32_contiguous(yl),
        channels,
        hw,
        relu,
    );
    let dtype = dy.dtype();
    (
        CpuStorage::from_f32(dpre, dtype),
        CpuStorage::from_f32(db, dtype),
    )
}

/// Σ v: 16 f32 lanes (vectorised; each adds every 16th value), the lanes then summed in f64
/// in a fixed order.
fn lane_sum(v: &[f32]) -> f64 {
    let mut acc = [0f32; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&x| x as f64).sum();
    acc.iter().map(|&a| a as f64).sum::<f64>() + tail
}

/// (dpre, dbias) for y = relu?(pre), pre = conv + bias[c], over [n, c, hw]: dpre = dy where
/// the ReLU passed its input (y > 0, or NaN: PyTorch's threshold_backward), and dbias[c] the
/// sum of dpre over n and hw (f64 per image row, added in image order: deterministic).
fn bias_relu_backward_rows(
    dy: &[f32],
    y: &[f32],
    c: usize,
    hw: usize,
    relu_on: bool,
) -> (Vec<f32>, Vec<f32>) {
    let mut dpre = output_vec(dy.len());
    let rows = dy.len().checked_div(c * hw).unwrap_or(0);
    // Per image: each channel's row sum (f32 lanes summed into f64).
    let mut sums = vec![0f64; rows * c];
    let body = |(i, (d, s)): (usize, (&mut [f32], &mut [f64]))| {
        for ch in 0..c {
            let at = (i * c + ch) * hw;
            let (g, yy, out) = (
                &dy[at..at + hw],
                &y[at..at + hw],
                &mut d[ch * hw..(ch + 1) * hw],
            );
            if relu_on {
                for ((o, &gv), &yv) in out.iter_mut().zip(g).zip(yy) {
                    *o = if yv <= 0.0 { 0.0 } else { gv };
                }
            } else {
                out.copy_from_slice(g);
            }
            s[ch] = lane_sum(out);
        }
    };
    if c * hw > 0 {
        let work = dpre.chunks_mut(c * hw).zip(sums.chunks_mut(c)).enumerate();
        if dy.len() >= PAR_THRESHOLD * 2 {
            work.collect::<Vec<_>>().into_par_iter().for_each(body);
        } else {
            work.for_each(body);
        }
    }
    let mut db = vec![0f64; c];
    for s in sums.chunks(c.max(1)) {
        for (a, b) in db.iter_mut().zip(s) {
            *a += b;
        }
    }
    (dpre, db.into_iter().map(|v| v as f32).collect())
}
