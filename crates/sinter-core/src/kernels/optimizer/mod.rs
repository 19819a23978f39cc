//! The optimizer as one kernel folder (issue 26 item 1): AdamW, SGD and the step control block,
//! in place on f32 parameters and their state, outside autograd. No `BackendStorage` method: the
//! ops below check their operands once and call the CPU loops or the CUDA kernels directly.
//!
//! - `mod.rs` (here): `Tensor::adamw_step` / `sgd_step` (and their step-control forms in
//!   [`step_ctl`]), their checks, and the one match on the device.
//! - [`cpu`]: the host loops (also what ZeRO steps its host shards with), the step control
//!   block's two updates in host memory.
//! - `cuda.rs`: the device side: the storages' windows handed to the launches of `plans.rs`.
//! - `plans.rs`: `optimizer.cu`'s kernels as rows of sinter-cuda's kernel table (updates, step
//!   control block, grad norm), the checks of their operands, and their device functions.
//! - `control.rs`: the step control block's slots and the loss scaler's settings (shared by
//!   the CPU loops and the kernels).
//! - [`grad_norm`]: the global gradient norm in one pass (one multi-tensor launch on CUDA).
//! - [`step_ctl`]: the step control block (found_inf, clip factor, loss scale, lr, counters).
//!
//! The arithmetic of AdamW is written once, `sinter_types::AdamW` (f64 hyper-parameters, each
//! scalar factor rounded to f32 once, as PyTorch); the CPU loop and the kernel follow it bit
//! for bit, and `tests/conformance/optim.rs` holds both to the f64 reference.

mod control;
pub mod cpu;
mod cuda;
pub mod grad_norm;
mod plans;
pub mod step_ctl;
#[cfg(test)]
mod tests;

use crate::backend::{AdamWParams, SgdParams};
use control::ScalerCfg;
use std::collections::HashSet;

use crate::storage::Storage;
use crate::{bail, DType, Device, Error, Layout, Result, Tensor};

/// The device mismatch of an update whose operands live apart (the ops check devices first, so
/// this is only reached by a misuse of the storages' own functions).
fn apart(op: &'static str, lhs: Device, rhs: &Storage) -> Error {
    Error::DeviceMismatch {
        op,
        lhs,
        rhs: rhs.device(),
    }
}

/// `ctl` as the backend's storage `$v` of `first`'s device, else a device mismatch.
macro_rules! ctl_on {
    ($op:expr, $first:expr, $ctl:expr, $v:path) => {
        match $ctl {
            None => None,
            Some(($v(c), l)) => Some((c, l)),
            Some((other, _)) => return Err(apart($op, $first, other)),
        }
    };
}

/// AdamW of the parameter `p` with moments `m`, `v` (see [`Tensor::adamw_step`]).
fn adamw_storage(
    (p, l): (&mut Storage, &Layout),
    grad: (&Storage, &Layout),
    m: (&mut Storage, &Layout),
    v: (&mut Storage, &Layout),
    h: AdamWParams,
    ctl: Option<(&Storage, &Layout)>,
) -> Result<()> {
    let op = "adamw_step";
    let dev = p.device();
    match (&mut *p, grad.0, &mut *m.0, &mut *v.0) {
        (Storage::Cpu(ps), Storage::Cpu(g), Storage::Cpu(ms), Storage::Cpu(vs)) => {
            let c = ctl_on!(op, dev, ctl, Storage::Cpu);
            cpu::adamw_storage((ps, l), (g, grad.1), (ms, m.1), (vs, v.1), (h, 1.0), c)
        }
        (Storage::Cuda(ps), Storage::Cuda(g), Storage::Cuda(ms), Storage::Cuda(vs)) => {
            let c = ctl_on!(op, dev, ctl, Storage::Cuda);
            cuda::adamw_storage((ps, l), (g, grad.1), (ms, m.1), (vs, v.1), h, c)
        }
        _ => Err(apart(op, dev, grad.0)),
    }
}

/// One parameter of [`adamw_step_many`]: the f32 parameter, its gradient (any float dtype) and
/// moments, and its parameter group's settings.
#[derive(Clone, Copy, Debug)]
pub struct AdamWSlot<'a> {
    pub param: &'a Tensor,
    pub grad: &'a Tensor,
    pub m: &'a Tensor,
    pub v: &'a Tensor,
    /// Replaces `h.weight_decay` for this parameter.
    pub weight_decay: f64,
    /// This parameter's learning rate over `h.lr` (its group's factor); with a step control
    /// block, the block's rate times it (in f32).
    pub lr_scale: f64,
}

/// AdamW of many parameters at once (the multi-tensor step, issue 24 item 3), driven by the
/// step control block `ctl` when given (see [`Tensor::adamw_step_ctl`]): on CUDA one launch per
/// 32 parameters instead of one per parameter; on the CPU the same loop per parameter. Each
/// parameter gets exactly [`Tensor::adamw_step`]'s values with its slot's weight decay and
/// `h.lr · lr_scale`. All operands on one device; no two may share storage.
pub fn adamw_step_many(
    slots: &[AdamWSlot<'_>],
    h: AdamWParams,
    ctl: Option<&Tensor>,
) -> Result<()> {
    let op = "adamw_step";
    let Some(first) = slots.first() else {
        return Ok(());
    };
    let mut written = HashSet::new();
    for s in slots {
        for t in [s.grad, s.m, s.v] {
            s.param.check_in_place(op, t)?;
        }
        if s.param.device() != first.param.device() {
            return Err(Error::DeviceMismatch {
                op,
                lhs: first.param.device(),
                rhs: s.param.device(),
            });
        }
        for t in [s.param, s.m, s.v] {
            t.check_state(op)?;
            if !written.insert(t.storage_stamp().id) {
                bail!("{op}: parameter and optimizer state must not share storage");
            }
        }
    }
    let read: Vec<&Tensor> = slots.iter().map(|s| s.grad).chain(ctl).collect();
    if read.iter().any(|r| written.contains(&r.storage_stamp().id)) {
        bail!(
            "{op}: the gradient (and the step control block) must not share storage with the parameter or optimizer state"
        );
    }
    if let Some(c) = ctl {
        first.param.ctl_on(op, c)?;
    }
    let grads: Vec<_> = slots.iter().map(|s| s.grad.storage()).collect();
    let cs = ctl.map(|c| c.storage());
    let mut ps: Vec<_> = slots.iter().map(|s| s.param.write_storage()).collect();
    let mut ms: Vec<_> = slots.iter().map(|s| s.m.write_storage()).collect();
    let mut vs: Vec<_> = slots.iter().map(|s| s.v.write_storage()).collect();
    let c = cs.as_deref().zip(ctl.map(|c| c.layout()));
    let mut cuda_slots = Vec::new();
    let parts = ps
        .iter_mut()
        .zip(ms.iter_mut())
        .zip(vs.iter_mut())
        .zip(&grads);
    for (i, (((p, m), v), g)) in parts.enumerate() {
        let s = &slots[i];
        let hs = AdamWParams {
            lr: h.lr * s.lr_scale,
            weight_decay: s.weight_decay,
            ..h
        };
        let (pl, gl, ml, vl) = (
            s.param.layout(),
            s.grad.layout(),
            s.m.layout(),
            s.v.layout(),
        );
        match (&mut **p, &**g, &mut **m, &mut **v) {
            (Storage::Cpu(p), Storage::Cpu(g), Storage::Cpu(m), Storage::Cpu(v)) => {
                let c = ctl_on!(op, Device::Cpu, c, Storage::Cpu);
                let k = (hs, s.lr_scale as f32);
                cpu::adamw_storage((p, pl), (g, gl), (m, ml), (v, vl), k, c)?;
            }
            (Storage::Cuda(p), Storage::Cuda(g), Storage::Cuda(m), Storage::Cuda(v)) => {
                let k = (hs.weight_decay, hs.lr, s.lr_scale as f32);
                cuda_slots.push(((p, pl), (g, gl), (m, ml), (v, vl), k));
            }
            _ => return Err(apart(op, s.param.device(), g)),
        }
    }
    if cuda_slots.is_empty() {
        return Ok(());
    }
    let c = ctl_on!(op, first.param.device(), c, Storage::Cuda);
    cuda::adamw_many_storage(cuda_slots, h, c)
}

/// SGD of the parameter `p` with an optional momentum buffer.
fn sgd_storage(
    (p, l): (&mut Storage, &Layout),
    grad: (&Storage, &Layout),
    buf: Option<(&mut Storage, &Layout)>,
    h: SgdParams,
    ctl: Option<(&Storage, &Layout)>,
) -> Result<()> {
    let op = "sgd_step";
    let dev = p.device();
    match (&mut *p, grad.0) {
        (Storage::Cpu(ps), Storage::Cpu(g)) => {
            let b = match buf {
                None => None,
                Some((Storage::Cpu(b), bl)) => Some((b, bl)),
                Some((other, _)) => return Err(apart(op, dev, other)),
            };
            let c = ctl_on!(op, dev, ctl, Storage::Cpu);
            cpu::sgd_storage((ps, l), (g, grad.1), b, h, c)
        }
        (Storage::Cuda(ps), Storage::Cuda(g)) => {
            let b = match buf {
                None => None,
                Some((Storage::Cuda(b), bl)) => Some((b, bl)),
                Some((other, _)) => return Err(apart(op, dev, other)),
            };
            let c = ctl_on!(op, dev, ctl, Storage::Cuda);
            cuda::sgd_storage((ps, l), (g, grad.1), b, h, c)
        }
        _ => Err(apart(op, dev, grad.0)),
    }
}

/// `step_prepare` on the control block `c` (see [`Tensor::step_prepare`]).
fn step_prepare_storage(
    (c, l): (&mut Storage, &Layout),
    sumsq: (&Storage, &Layout),
    max_norm: f32,
    dynamic: bool,
) -> Result<()> {
    let dev = c.device();
    match (&mut *c, sumsq.0) {
        (Storage::Cpu(cs), Storage::Cpu(s)) => {
            cpu::step_prepare_storage((cs, l), (s, sumsq.1), max_norm, dynamic)
        }
        (Storage::Cuda(cs), Storage::Cuda(s)) => {
            cuda::step_prepare_storage((cs, l), (s, sumsq.1), max_norm, dynamic)
        }
        _ => Err(apart("step_prepare", dev, sumsq.0)),
    }
}

/// `step_finish` on the control block `c` (see [`Tensor::step_finish`]).
fn step_finish_storage(
    (c, l): (&mut Storage, &Layout),
    lr_table: (&Storage, &Layout),
    scaler: Option<ScalerCfg>,
) -> Result<()> {
    let dev = c.device();
    match (&mut *c, lr_table.0) {
        (Storage::Cpu(cs), Storage::Cpu(t)) => {
            cpu::step_finish_storage((cs, l), (t, lr_table.1), scaler)
        }
        (Storage::Cuda(cs), Storage::Cuda(t)) => {
            cuda::step_finish_storage((cs, l), (t, lr_table.1), scaler)
        }
        _ => Err(apart("step_finish", dev, lr_table.0)),
    }
}

impl Tensor {
    /// An error unless this tensor can be updated in place by an optimizer: f32, contiguous.
    fn check_state(&self, op: &'static str) -> Result<()> {
        if self.dtype() != DType::F32 {
            return Err(Error::DTypeMismatch {
                op,
                expected: DType::F32,
                got: self.dtype(),
            });
        }
        if self.layout().contiguous_range().is_none() {
            bail!("{op}: optimizer state must be contiguous");
        }
        Ok(())
    }

    /// The tensors an update writes must not share storage with each other or with what it
    /// reads: each is locked on its own (sharing would deadlock).
    fn check_apart(op: &'static str, written: &[&Tensor], read: &[&Tensor]) -> Result<()> {
        for (i, a) in written.iter().enumerate() {
            if written[i + 1..].iter().any(|b| a.shares_storage_with(b)) {
                bail!("{op}: parameter and optimizer state must not share storage");
            }
            if read.iter().any(|r| a.shares_storage_with(r)) {
                bail!(
                    "{op}: the gradient (and the step control block) must not share storage with the parameter or optimizer state"
                );
            }
        }
        Ok(())
    }

    /// Fused AdamW update of this f32 parameter with its moment buffers, in place.
    pub fn adamw_step(&self, grad: &Tensor, m: &Tensor, v: &Tensor, h: AdamWParams) -> Result<()> {
        self.adamw_update(grad, m, v, h, None)
    }

    /// AdamW, optionally driven by a step control block (see [`step_ctl`]): every check here,
    /// then one update.
    fn adamw_update(
        &self,
        grad: &Tensor,
        m: &Tensor,
        v: &Tensor,
        h: AdamWParams,
        ctl: Option<&Tensor>,
    ) -> Result<()> {
        let op = "adamw_step";
        for t in [grad, m, v] {
            self.check_in_place(op, t)?;
        }
        for t in [self, m, v] {
            t.check_state(op)?;
        }
        let read: Vec<&Tensor> = std::iter::once(grad).chain(ctl).collect();
        Tensor::check_apart(op, &[self, m, v], &read)?;
        let (gs, cs) = (grad.storage(), ctl.map(|c| c.storage()));
        let (mut ps, mut ms, mut vs) = (self.write_storage(), m.write_storage(), v.write_storage());
        adamw_storage(
            (&mut ps, self.layout()),
            (&gs, grad.layout()),
            (&mut ms, m.layout()),
            (&mut vs, v.layout()),
            h,
            cs.as_deref().zip(ctl.map(|c| c.layout())),
        )
    }

    /// SGD update of this f32 parameter, with an optional momentum buffer, in place.
    pub fn sgd_step(&self, grad: &Tensor, buf: Option<&Tensor>, h: SgdParams) -> Result<()> {
        self.sgd_update(grad, buf, h, None)
    }

    /// SGD, optionally driven by a step control block (see [`step_ctl`]).
    fn sgd_update(
        &self,
        grad: &Tensor,
        buf: Option<&Tensor>,
        h: SgdParams,
        ctl: Option<&Tensor>,
    ) -> Result<()> {
        let op = "sgd_step";
        self.check_in_place(op, grad)?;
        if let Some(b) = buf {
            self.check_in_place(op, b)?;
        }
        let written: Vec<&Tensor> = std::iter::once(self).chain(buf).collect();
        for t in &written {
            t.check_state(op)?;
        }
        let read: Vec<&Tensor> = std::iter::once(grad).chain(ctl).collect();
        Tensor::check_apart(op, &written, &read)?;
        let (gs, cs) = (grad.storage(), ctl.map(|c| c.storage()));
        let mut ps = self.write_storage();
        let mut bs = buf.map(|b| b.write_storage());
        sgd_storage(
            (&mut ps, self.layout()),
            (&gs, grad.layout()),
            bs.as_deref_mut().zip(buf.map(|b| b.layout())),
            h,
            cs.as_deref().zip(ctl.map(|c| c.layout())),
        )
    }
}
