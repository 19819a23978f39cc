//! RMSNorm, y = x / √(mean(x²) + eps) · w over the last dimension, as one custom op: the
//! forward is sinter-cpu's vectorised row kernel, the backward one pass per row that
//! recomputes the row's 1/rms (cheaper than keeping it) and gives dx and this row's share of dw.
//!
//! With r = 1/√(mean(x²) + eps) and g = dy·w: dx = r·g − x·r³·(g·x)/n, dw = Σ_rows dy·x·r.

use std::collections::HashMap;
use std::sync::Mutex;

use rayon::prelude::*;
use sinter_core::custom_op::{CustomOp, HostOutput, OutputSpec, TensorMeta};
use sinter_core::{bail, DType, Result, Tensor};
use sinter_cpu::math::rms_norm::rms_norm_rows;
use sinter_cpu::Isa;

use super::for_rows;

/// Rows per partial sum of dw: fixed (not per thread), so the result does not depend on the
/// thread count.
const DW_ROWS: usize = 64;

/// The width n of x [.., n] against w [n], or why they do not fit.
fn width(x: &TensorMeta, w: &TensorMeta) -> Result<usize> {
    match (x.shape.last(), &w.shape[..]) {
        (Some(&n), &[m]) if n == m && n > 0 => Ok(n),
        _ => bail!(
            "rms_norm: x must be [.., n] and the weight [n]; got {:?} and {:?}",
            x.shape,
            w.shape
        ),
    }
}

/// y = rms_norm(x, w) (fused forward and backward on the CPU, f32).
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    Ok(ops(eps)?.0.apply(&[x, w])?.remove(0))
}

/// The (forward, backward) pair for one eps (models have one or two; built once each).
fn ops(eps: f32) -> Result<(CustomOp, CustomOp)> {
    static OPS: Mutex<Option<HashMap<u32, (CustomOp, CustomOp)>>> = Mutex::new(None);
    let mut all = OPS.lock().unwrap_or_else(|e| e.into_inner());
    let all = all.get_or_insert_with(HashMap::new);
    if let Some(p) = all.get(&eps.to_bits()) {
        return Ok(p.clone());
    }
    let backward = backward_op(eps)?;
    let bw = backward.clone();
    let forward = CustomOp::builder("rms_norm")
        .inputs(2)
        .outputs(|m| {
            width(&m[0], &m[1])?;
            Ok(vec![OutputSpec::new(&m[0].shape, DType::F32)])
        })
        .cpu(move |x| {
            let (xs, w) = (x[0].f32()?, x[1].f32()?);
            let n = w.len();
            let mut y = vec![0f32; xs.len()];
            let isa = Isa::get();
            for_rows(xs, n, &mut y, n, |_, xr, yr| {
                rms_norm_rows(isa, xr, w, eps, yr)
            });
            Ok(vec![HostOutput::f32(y, x[0].shape())])
        })
        .backward(move |ctx| {
            let mut g = bw.apply(&[ctx.grad(0), ctx.input(0), ctx.input(1)])?;
            let dw = g.pop();
            let dx = g.pop();
            Ok(vec![dx, dw])
        })
        .build()?;
    all.insert(eps.to_bits(), (forward.clone(), backward.clone()));
    Ok((forward, backward))
}

/// (dy, x, w) → (dx, dw).
fn backward_op(eps: f32) -> Result<CustomOp> {
    CustomOp::builder("rms_norm_backward")
        .inputs(3)
        .outputs(|m| {
            let n = width(&m[1], &m[2])?;
            if m[0].shape != m[1].shape {
                bail!(
                    "rms_norm_backward: dy {:?} must have x's shape {:?}",
                    m[0].shape,
                    m[1].shape
                );
            }
            Ok(vec![
                OutputSpec::new(&m[1].shape, DType::F32),
                OutputSpec::new(&[n], DType::F32),
            ])
        })
        .cpu(move |x| {
            let (dy, xs, w) = (x[0].f32()?, x[1].f32()?, x[2].f32()?);
            let n = w.len();
            let mut dx = vec![0f32; xs.len()];
            // Chunks of DW_ROWS rows, each giving its rows' dx and its partial dw; the partials
            // are summed in chunk order.
            let chunk = |(c, dxc): (usize, &mut [f32])| -> Vec<f32> {
                let mut dw = vec![0f32; n];
                let first = c * DW_ROWS;
                for (i, dxr) in dxc.chunks_mut(n).enumerate() {
                    let (xr, dyr) = (&xs[(first + i) * n..][..n], &dy[(first + i) * n..][..n]);
                    backward_row(xr, dyr, w, eps, dxr, &mut dw);
                }
                dw
            };
            let partials: Vec<Vec<f32>> = if xs.len() >= super::PARALLEL_FROM {
                dx.par_chunks_mut(DW_ROWS * n)
                    .enumerate()
                    .map(chunk)
                    .collect()
            } else {
                dx.chunks_mut(DW_ROWS * n).enumerate().map(chunk).collect()
            };
            let mut dw = vec![0f32; n];
            for p in partials {
                for (a, v) in dw.iter_mut().zip(p) {
                    *a += v;
                }
            }
            Ok(vec![
                HostOutput::f32(dx, x[1].shape()),
                HostOutput::f32(dw, &[n]),
            ])
        })
        .build()
}

/// One row: dx from dy, x and w, and the row's share of dw added to `dw`.
fn backward_row(xr: &[f32], dyr: &[f32], w: &[f32], eps: f32, dxr: &mut [f32], dw: &mut [f32]) {
    let n = w.len() as f32;
    let (sq, dot) = xr
        .iter()
        .zip(dyr.iter().zip(w))
        .fold((0f32, 0f32), |(s, d), (&xv, (&g, &wv))| {
            (s + xv * xv, d + g * wv * xv)
        });
    let inv = 1.0 / (sq / n + eps).sqrt();
    let k = inv * inv * inv * dot / n;
    for ((o, &xv), (&g, &wv)) in dxr.iter_mut().zip(xr).zip(dyr.iter().zip(w)) {
        *o = inv * g * wv - xv * k;
    }
    for ((acc, &g), &xv) in dw.iter_mut().zip(dyr).zip(xr) {
        *acc += g * xv * inv;
    }
}
