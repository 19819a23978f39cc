//! The optimizer's CPU loops: AdamW and SGD over host slices (also what ZeRO steps its shards
//! with), and the step control block's two updates. The arithmetic is the kernels' in
//! `optimizer.cu`: AdamW is `sinter_types::AdamW`'s shared rule through sinter-cpu's vectorised
//! kernel, bit for bit on every ISA.

use rayon::prelude::*;
use sinter_cpu::math::adamw::adamw;
use sinter_cpu::Isa;

use super::control::{ctl, ScalerCfg};
use crate::backend::{AdamWParams, SgdParams};
use crate::cpu::reduce::sum_squares as sum_squares_f64;
use crate::cpu::{CpuStorage, PAR_THRESHOLD};
use crate::{DType, Error, Layout, Result};

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
    let isa = Isa::get();
    if p.len() >= PAR_THRESHOLD {
        const CHUNK: usize = 4096;
        p.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK))
            .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
            .for_each(|((p, g), (m, v))| adamw(isa, p, g, m, v, h, grad_scale));
    } else {
        adamw(isa, p, g, m, v, h, grad_scale);
    }
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

/// `step_prepare` (same arithmetic as the kernel in optimizer.cu): from the squared global norm of
/// the loss-scaled gradients, set found_inf (with dynamic scaling), the unscaled norm and the
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

/// `step_finish` (same arithmetic as the kernel): a skipped step shrinks the scale, a good one
/// counts (growing the scale after `interval` in a row) and advances the optimizer's step
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

/// Σ x² of the parts in f64 (each over fixed 16 Ki-element chunks added in order, so the result
/// does not depend on the thread count).
pub(super) fn sum_squares(parts: &[(&CpuStorage, &Layout)]) -> f64 {
    parts
        .iter()
        .map(|(s, l)| match (s, l.contiguous_range()) {
            (CpuStorage::F32(v), Some(r)) => sum_squares_f64(&v[r]),
            (other, _) => sum_squares_f64(&other.f32_contiguous(l)),
        })
        .sum()
}

/// [`sum_squares`] as a one-element f32 storage: through the norm and back (sqrt, then square,
/// in f64), the value runs have always seen, which resumed checkpoints compare bit for bit.
pub(super) fn sum_squares_storage(parts: &[(&CpuStorage, &Layout)]) -> CpuStorage {
    let n = sum_squares(parts).sqrt();
    CpuStorage::F32(vec![(n * n) as f32])
}

// ---- on storages (what `mod.rs` dispatches to) ----------------------------------------------

/// The f32 elements an optimizer updates in place: f32 and contiguous, else an error.
fn f32_mut<'a>(s: &'a mut CpuStorage, l: &Layout, op: &'static str) -> Result<&'a mut [f32]> {
    let r = l
        .contiguous_range()
        .ok_or_else(|| Error::Msg(format!("{op}: optimizer state must be contiguous")))?;
    match s {
        CpuStorage::F32(v) => Ok(&mut v[r]),
        other => Err(Error::DTypeMismatch {
            op,
            expected: DType::F32,
            got: other.dtype(),
        }),
    }
}

/// The values of a step control block (read before the update, as the kernels do).
fn ctl_values(c: Option<(&CpuStorage, &Layout)>) -> Option<Vec<f32>> {
    c.map(|(c, l)| c.f32_contiguous(l).into_owned())
}

/// AdamW of one parameter; with a control block its rate is `ctl[LR] * lr_scale` in f32 (a
/// parameter group's factor, as the kernels compute it).
pub(super) fn adamw_storage(
    (p, l): (&mut CpuStorage, &Layout),
    grad: (&CpuStorage, &Layout),
    m: (&mut CpuStorage, &Layout),
    v: (&mut CpuStorage, &Layout),
    (h, lr_scale): (AdamWParams, f32),
    ctl: Option<(&CpuStorage, &Layout)>,
) -> Result<()> {
    let op = "adamw_step";
    let (h, scale) = match ctl_values(ctl) {
        None => (h, 1.0),
        // A skipped step (found_inf) leaves the moments and the step count alone.
        Some(c) if c[ctl::FOUND_INF] != 0.0 => return Ok(()),
        Some(c) => (
            AdamWParams {
                lr: (c[ctl::LR] * lr_scale) as f64,
                step: c[ctl::STEPS] as u64 + 1,
                ..h
            },
            c[ctl::GRAD_FACTOR],
        ),
    };
    let g = grad.0.f32_contiguous(grad.1);
    let p = f32_mut(p, l, op)?;
    let (m, v) = (f32_mut(m.0, m.1, op)?, f32_mut(v.0, v.1, op)?);
    adamw_step_scaled(p, &g, m, v, h, scale);
    Ok(())
}

pub(super) fn sgd_storage(
    (p, l): (&mut CpuStorage, &Layout),
    grad: (&CpuStorage, &Layout),
    buf: Option<(&mut CpuStorage, &Layout)>,
    h: SgdParams,
    ctl: Option<(&CpuStorage, &Layout)>,
) -> Result<()> {
    let op = "sgd_step";
    let (h, scale) = match ctl_values(ctl) {
        None => (h, 1.0),
        Some(c) if c[ctl::FOUND_INF] != 0.0 => return Ok(()),
        Some(c) => (
            SgdParams {
                lr: c[ctl::LR],
                ..h
            },
            c[ctl::GRAD_FACTOR],
        ),
    };
    let g = grad.0.f32_contiguous(grad.1);
    let p = f32_mut(p, l, op)?;
    let b = buf.map(|(b, bl)| f32_mut(b, bl, op)).transpose()?;
    sgd_step_scaled(p, &g, b, h, scale);
    Ok(())
}

pub(super) fn step_prepare_storage(
    (c, l): (&mut CpuStorage, &Layout),
    sumsq: (&CpuStorage, &Layout),
    max_norm: f32,
    dynamic: bool,
) -> Result<()> {
    let s = sumsq.0.f32_contiguous(sumsq.1)[0];
    step_prepare(f32_mut(c, l, "step_prepare")?, s, max_norm, dynamic);
    Ok(())
}

pub(super) fn step_finish_storage(
    (c, l): (&mut CpuStorage, &Layout),
    lr_table: (&CpuStorage, &Layout),
    scaler: Option<ScalerCfg>,
) -> Result<()> {
    let table = lr_table.0.f32_contiguous(lr_table.1);
    step_finish(f32_mut(c, l, "step_finish")?, &table, scaler);
    Ok(())
}
