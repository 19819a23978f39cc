//! The optimizer steps on the device: one fused kernel per parameter (or per 32 of them), in
//! place (`optimizer.cu` of this folder through its kernel table rows, `plans.rs`). Parameter, moments and
//! momentum buffer are f32 and contiguous (as on the CPU); the gradient may be of any float
//! dtype or layout (it is made contiguous f32 first). On the first step the parameter and its
//! state are moved into the allocator's permanent pool. Also the step control block's kernels,
//! and the global gradient norm.

use super::control::ScalerCfg;
use super::plans as ka;
use crate::backend::{AdamWParams, SgdParams};
use crate::cuda::creation::{download, promote_in_place};
use crate::cuda::storage::{CudaStorage, DevView};
use crate::cuda::{alloc, OnOp};
use crate::{DType, Error, Layout, Result};

/// The storage's contiguous f32 window (what the kernels update in place), after moving the
/// storage into the permanent pool.
fn state(op: &'static str, s: &mut CudaStorage, l: &Layout) -> Result<DevView> {
    if s.dtype() != DType::F32 {
        return Err(Error::DTypeMismatch {
            op,
            expected: DType::F32,
            got: s.dtype(),
        });
    }
    let r = l
        .contiguous_range()
        .ok_or_else(|| Error::Msg(format!("{op}: optimizer state must be contiguous")))?;
    promote_in_place(s)?;
    Ok(DevView {
        buf: s.buffer().clone(),
        off: r.start,
        len: r.len(),
    })
}

/// Fused AdamW (decoupled weight decay) of `p` with moments `m`, `v`; with a step control
/// block, driven by it (see `step_ctl`).
pub(super) fn adamw_storage(
    p: (&mut CudaStorage, &Layout),
    grad: (&CudaStorage, &Layout),
    m: (&mut CudaStorage, &Layout),
    v: (&mut CudaStorage, &Layout),
    h: AdamWParams,
    ctl: Option<(&CudaStorage, &Layout)>,
) -> Result<()> {
    let op = "adamw_step";
    let (pv, mv, vv) = (
        state(op, p.0, p.1)?,
        state(op, m.0, m.1)?,
        state(op, v.0, v.1)?,
    );
    let dev = p.0.device();
    let g = grad.0.window_as(grad.1, DType::F32)?;
    let cfg = ka::AdamW {
        hyper: h,
        grad_scale: 1.0,
    };
    let (ps, gs, ms, vs) = (pv.slice(), g.slice(), mv.slice(), vv.slice());
    match ctl {
        None => ka::adamw(dev, ps, gs, ms, vs, &cfg),
        Some((c, cl)) => {
            let cv = c.window(cl)?;
            // The step number is read on the device; the plan only checks it is 1-based.
            ka::adamw_ctl(dev, ps, gs, ms, vs, &cfg.at_step(1), cv.slice())
        }
    }
    .on(op)
}

/// SGD (PyTorch's formulation) of `p`, with an optional momentum buffer.
pub(super) fn sgd_storage(
    p: (&mut CudaStorage, &Layout),
    grad: (&CudaStorage, &Layout),
    buf: Option<(&mut CudaStorage, &Layout)>,
    h: SgdParams,
    ctl: Option<(&CudaStorage, &Layout)>,
) -> Result<()> {
    let op = "sgd_step";
    let pv = state(op, p.0, p.1)?;
    let bv = buf.map(|(b, l)| state(op, b, l)).transpose()?;
    let dev = p.0.device();
    let g = grad.0.window_as(grad.1, DType::F32)?;
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
        None => ka::sgd(dev, pv.slice(), g.slice(), b, &cfg),
        Some((c, cl)) => {
            let cv = c.window(cl)?;
            ka::sgd_ctl(dev, pv.slice(), g.slice(), b, &cfg, cv.slice())
        }
    }
    .on(op)
}

/// The `step_prepare` kernel on the control block.
pub(super) fn step_prepare_storage(
    ctl: (&mut CudaStorage, &Layout),
    sumsq: (&CudaStorage, &Layout),
    max_norm: f32,
    dynamic: bool,
) -> Result<()> {
    let (cv, sv) = (ctl.0.window(ctl.1)?, sumsq.0.window(sumsq.1)?);
    ka::step_prepare(ctl.0.device(), cv.slice(), sv.slice(), max_norm, dynamic).on("step_prepare")
}

/// The `step_finish` kernel on the control block.
pub(super) fn step_finish_storage(
    ctl: (&mut CudaStorage, &Layout),
    lr_table: (&CudaStorage, &Layout),
    scaler: Option<ScalerCfg>,
) -> Result<()> {
    let (cv, tv) = (ctl.0.window(ctl.1)?, lr_table.0.window(lr_table.1)?);
    ka::step_finish(ctl.0.device(), cv.slice(), tv.slice(), scaler).on("step_finish")
}

/// One parameter of [`adamw_many_storage`]: (param, grad, m, v) and (weight decay, lr,
/// lr_scale).
pub(super) type CudaSlot<'a> = (
    (&'a mut CudaStorage, &'a Layout),
    (&'a CudaStorage, &'a Layout),
    (&'a mut CudaStorage, &'a Layout),
    (&'a mut CudaStorage, &'a Layout),
    (f64, f64, f32),
);

/// AdamW of many parameters of one device: one launch per `ka::ADAMW_SLOTS` of them.
pub(super) fn adamw_many_storage(
    slots: Vec<CudaSlot<'_>>,
    h: AdamWParams,
    ctl: Option<(&CudaStorage, &Layout)>,
) -> Result<()> {
    let op = "adamw_step";
    let Some(dev) = slots.first().map(|s| s.1 .0.device().clone()) else {
        return Ok(());
    };
    // The windows (a cast copy for a non-f32 gradient) live until the launches are queued.
    let mut views = Vec::with_capacity(slots.len());
    for (p, g, m, v, k) in slots {
        let st = (state(op, p.0, p.1)?, g.0.window_as(g.1, DType::F32)?);
        views.push((st.0, st.1, state(op, m.0, m.1)?, state(op, v.0, v.1)?, k));
    }
    let list: Vec<ka::AdamSlot<'_>> = views
        .iter()
        .map(|(p, g, m, v, (wd, lr, lr_scale))| ka::AdamSlot {
            param: p.slice(),
            grad: g.slice(),
            m: m.slice(),
            v: v.slice(),
            weight_decay: *wd,
            lr: *lr,
            lr_scale: *lr_scale,
        })
        .collect();
    let cfg = ka::AdamW {
        hyper: h,
        grad_scale: 1.0,
    };
    let cv = ctl.map(|(c, l)| c.window(l)).transpose()?;
    match &cv {
        // The step number is read on the device; the plan only checks it is 1-based.
        Some(c) => ka::adamw_multi(&dev, &list, &cfg.at_step(1), Some(c.slice())),
        None => ka::adamw_multi(&dev, &list, &cfg, None),
    }
    .on(op)
}

// ---- the global gradient norm (optimizer.cu) ------------------------------------------------

/// Σ x² over the parts (one device) as a one-element f32 storage there (see
/// [`ka::plan_sum_squares`]). Deterministic, and the same bits however the tensors are grouped.
pub(super) fn sum_squares(parts: &[(&CudaStorage, &Layout)]) -> Result<CudaStorage> {
    let op = "grad_sum_squares";
    let first = parts[0].0;
    let dev = first.device();
    let views = parts
        .iter()
        .map(|(s, l)| s.window(l))
        .collect::<Result<Vec<_>>>()?;
    let total: usize = views.iter().map(|v| ka::sumsq_blocks(v.len)).sum();
    let partial = alloc(dev, total, DType::F32)?;
    let out = alloc(dev, 1, DType::F32)?;
    let xs: Vec<_> = views.iter().map(|v| v.slice()).collect();
    ka::sum_squares(dev, &xs, partial.as_slice(), out.as_slice()).on(op)?;
    Ok(first.sibling(out, DType::F32))
}

/// [`sum_squares`] read back to the host.
pub(super) fn sum_squares_host(parts: &[(&CudaStorage, &Layout)]) -> Result<f64> {
    let s = sum_squares(parts)?;
    let one = Layout::contiguous(&[1]);
    Ok(download(&s, &one)?.f32_contiguous(&one)[0] as f64)
}
