//! The optimizer steps on the device: one fused kernel per parameter, in place. Parameter,
//! moments and momentum buffer are f32 and contiguous (as on the CPU); the gradient may be of
//! any float dtype or layout (it is made contiguous f32 first). On the first step the
//! parameter and its state are moved into the allocator's permanent pool.

use sinter_cuda::ops::adamw as ka;

use super::creation::promote_in_place;
use super::{contig_as, parts, OnOp};
use crate::cpu::nn::{AdamWParams, SgdParams};
use crate::{bail, DType, Error, Result, Tensor};

/// The tensor's contiguous f32 window (what the kernels update in place).
fn state(op: &'static str, t: &Tensor) -> Result<super::DevView> {
    if t.dtype() != DType::F32 {
        return Err(Error::DTypeMismatch {
            op,
            expected: DType::F32,
            got: t.dtype(),
        });
    }
    let (_, buf) = parts(t)?;
    let r = t
        .layout()
        .contiguous_range()
        .ok_or_else(|| Error::Msg(format!("{op}: optimizer state must be contiguous")))?;
    Ok(super::DevView {
        buf,
        off: r.start,
        len: r.len(),
    })
}

fn distinct(op: &'static str, ts: &[&Tensor]) -> Result<()> {
    for i in 0..ts.len() {
        for j in i + 1..ts.len() {
            if ts[i].shares_storage_with(ts[j]) {
                bail!("{op}: parameter and optimizer state must not share storage");
            }
        }
    }
    Ok(())
}

/// Fused AdamW (decoupled weight decay) of `p` with moments `m`, `v` (shapes and devices
/// checked by the caller); with a step control block, driven by it (see `tensor::step_ctl`).
pub(crate) fn adamw_step(
    p: &Tensor,
    grad: &Tensor,
    m: &Tensor,
    v: &Tensor,
    h: AdamWParams,
    ctl: Option<&Tensor>,
) -> Result<()> {
    distinct("adamw_step", &[p, m, v])?;
    for t in [p, m, v] {
        state("adamw_step", t)?;
        promote_in_place(t)?;
    }
    let (dev, _) = parts(p)?;
    let (pv, mv, vv) = (
        state("adamw_step", p)?,
        state("adamw_step", m)?,
        state("adamw_step", v)?,
    );
    let g = contig_as(grad, DType::F32)?;
    let cfg = ka::AdamW {
        lr: h.lr,
        beta1: h.beta1,
        beta2: h.beta2,
        eps: h.eps,
        weight_decay: h.weight_decay,
        step: h.step,
        grad_scale: 1.0,
    };
    match ctl {
        None => ka::adamw(
            &dev,
            pv.slice(),
            g.slice(),
            mv.slice(),
            vv.slice(),
            None,
            &cfg,
            None,
        ),
        Some(c) => {
            let cv = super::contig(c)?;
            // The step number is read on the device; the plan only checks it is 1-based.
            let cfg = ka::AdamW { step: 1, ..cfg };
            ka::adamw_ctl(
                &dev,
                pv.slice(),
                g.slice(),
                mv.slice(),
                vv.slice(),
                None,
                &cfg,
                cv.slice(),
            )
        }
    }
    .on("adamw_step")
}

/// SGD (PyTorch's formulation) of `p`, with an optional momentum buffer.
pub(crate) fn sgd_step(
    p: &Tensor,
    grad: &Tensor,
    buf: Option<&Tensor>,
    h: SgdParams,
    ctl: Option<&Tensor>,
) -> Result<()> {
    let mut all = vec![p];
    all.extend(buf);
    distinct("sgd_step", &all)?;
    for t in &all {
        state("sgd_step", t)?;
        promote_in_place(t)?;
    }
    let (dev, _) = parts(p)?;
    let pv = state("sgd_step", p)?;
    let bv = buf.map(|b| state("sgd_step", b)).transpose()?;
    let g = contig_as(grad, DType::F32)?;
    let cfg = ka::Sgd {
        lr: h.lr,
        momentum: h.momentum,
        dampening: 0.0,
        weight_decay: h.weight_decay,
        nesterov: h.nesterov,
        first_step: false,
        grad_scale: 1.0,
    };
    // Without momentum the buffer is not read by the update (the CPU still writes it; nothing
    // uses it), so it is only passed when it matters.
    let b = if h.momentum != 0.0 {
        bv.as_ref().map(|b| b.slice())
    } else {
        None
    };
    match ctl {
        None => ka::sgd(&dev, pv.slice(), g.slice(), b, &cfg, None),
        Some(c) => {
            let cv = super::contig(c)?;
            ka::sgd_ctl(&dev, pv.slice(), g.slice(), b, &cfg, cv.slice())
        }
    }
    .on("sgd_step")
}

/// `step_prepare` kernel on the control block `ctl` (checked by the caller).
pub(crate) fn step_prepare(
    ctl: &Tensor,
    sumsq: &Tensor,
    max_norm: f32,
    dynamic: bool,
) -> Result<()> {
    let (dev, _) = parts(ctl)?;
    let (cv, sv) = (super::contig(ctl)?, super::contig(sumsq)?);
    ka::step_prepare(&dev, cv.slice(), sv.slice(), max_norm, dynamic).on("step_prepare")
}

/// `step_finish` kernel on the control block `ctl` (checked by the caller).
pub(crate) fn step_finish(
    ctl: &Tensor,
    lr_table: &Tensor,
    scaler: Option<ka::ScalerCfg>,
) -> Result<()> {
    let (dev, _) = parts(ctl)?;
    let (cv, tv) = (super::contig(ctl)?, super::contig(lr_table)?);
    ka::step_finish(&dev, cv.slice(), tv.slice(), scaler).on("step_finish")
}
