//! The training step's decisions on the tensors' device: a small f32 "step control block"
//! (slots in [`ctl`]) holds the loss scale, the found-inf flag, the clip factor, the learning
//! rate and the step counters, and is read and updated by the backend (kernels on CUDA, the
//! same arithmetic on host memory on the CPU: `super::cpu::{step_prepare, step_finish}`),
//! so a step never waits on the host (and a captured CUDA graph replays with current values).
//!
//! Per step: `backward(loss · ctl[SCALE])`; `ctl.step_prepare(&grad_sum_squares(grads)?, ..)`;
//! `p.adamw_step_ctl(.., &ctl)` for every parameter (skipped when found_inf is set; lr, bias
//! correction and the gradient factor read from the block); `ctl.step_finish(&lr_table, ..)`.

use crate::backend::{AdamWParams, SgdParams};
use crate::{bail, DType, Device, Error, Result, Tensor};

pub use super::control::{ctl, ScalerCfg};

/// Σ g² over all gradients as a 1-element f32 tensor on `device` (one deterministic pass; an
/// inf or NaN anywhere makes it non-finite). No host read where the data is not on the host.
pub fn grad_sum_squares(grads: &[Tensor], device: Device) -> Result<Tensor> {
    if let Some(g) = grads.iter().find(|g| g.device() != device) {
        return Err(Error::DeviceMismatch {
            op: "grad_sum_squares",
            lhs: device,
            rhs: g.device(),
        });
    }
    super::grad_norm::grad_sum_squares_on(grads, device)
}

impl Tensor {
    /// Checks that `self` is a step control block: f32, contiguous, [`ctl::LEN`] elements.
    fn check_ctl(&self, op: &'static str) -> Result<()> {
        if self.dtype() != DType::F32 {
            return Err(Error::DTypeMismatch {
                op,
                expected: DType::F32,
                got: self.dtype(),
            });
        }
        if self.numel() != ctl::LEN || self.layout().contiguous_range().is_none() {
            bail!(
                "{op}: the step control block must be a contiguous f32 tensor of {} elements, got shape {:?}",
                ctl::LEN,
                self.shape()
            );
        }
        Ok(())
    }

    pub(super) fn ctl_on(&self, op: &'static str, other: &Tensor) -> Result<()> {
        other.check_ctl(op)?;
        if other.device() != self.device() {
            return Err(Error::DeviceMismatch {
                op,
                lhs: self.device(),
                rhs: other.device(),
            });
        }
        Ok(())
    }

    /// [`Tensor::adamw_step`] driven by the step control block `ctl`: skipped (moments and step
    /// count untouched) when `ctl[FOUND_INF]` is set; the learning rate, the step number
    /// (`ctl[STEPS] + 1`, for the bias corrections) and a gradient factor (`ctl[GRAD_FACTOR]`:
    /// clip / loss scale) come from the block; `h.lr` and `h.step` are ignored.
    pub fn adamw_step_ctl(
        &self,
        grad: &Tensor,
        m: &Tensor,
        v: &Tensor,
        h: AdamWParams,
        ctl: &Tensor,
    ) -> Result<()> {
        self.ctl_on("adamw_step", ctl)?;
        self.adamw_update(grad, m, v, h, Some(ctl))
    }

    /// [`Tensor::sgd_step`] driven by the step control block (see [`Tensor::adamw_step_ctl`];
    /// `h.lr` is ignored).
    pub fn sgd_step_ctl(
        &self,
        grad: &Tensor,
        buf: Option<&Tensor>,
        h: SgdParams,
        ctl: &Tensor,
    ) -> Result<()> {
        self.ctl_on("sgd_step", ctl)?;
        self.sgd_update(grad, buf, h, Some(ctl))
    }

    /// On a step control block, after backward: found_inf (when `dynamic`), the gradient norm
    /// and the gradient factor from `sumsq` (see [`grad_sum_squares`]); `max_norm` ≤ 0 turns
    /// clipping off.
    pub fn step_prepare(&self, sumsq: &Tensor, max_norm: f32, dynamic: bool) -> Result<()> {
        self.check_ctl("step_prepare")?;
        if sumsq.dtype() != DType::F32 || sumsq.numel() != 1 || sumsq.device() != self.device() {
            bail!(
                "step_prepare: sumsq must be one f32 on {}, got {:?} {} on {}",
                self.device(),
                sumsq.shape(),
                sumsq.dtype(),
                sumsq.device()
            );
        }
        if self.shares_storage_with(sumsq) {
            bail!("step_prepare: sumsq must not share storage with the step control block");
        }
        let s = sumsq.storage();
        super::step_prepare_storage(
            (&mut self.write_storage(), self.layout()),
            (&s, sumsq.layout()),
            max_norm,
            dynamic,
        )
    }

    /// On a step control block, after the optimizer: loss-scale update (with `scaler`), step
    /// and schedule counters, and the next learning rate from `lr_table` (f32, one per step).
    pub fn step_finish(&self, lr_table: &Tensor, scaler: Option<ScalerCfg>) -> Result<()> {
        self.check_ctl("step_finish")?;
        if lr_table.dtype() != DType::F32
            || lr_table.numel() == 0
            || lr_table.device() != self.device()
            || lr_table.layout().contiguous_range().is_none()
        {
            bail!(
                "step_finish: the learning-rate table must be a non-empty contiguous f32 tensor on {}",
                self.device()
            );
        }
        if let Some(s) = scaler {
            if !(s.growth > 1.0 && s.backoff > 0.0 && s.backoff < 1.0 && s.interval >= 1) {
                bail!("step_finish: bad loss scaler settings {s:?} (need growth > 1, 0 < backoff < 1, interval ≥ 1)");
            }
        }
        if self.shares_storage_with(lr_table) {
            bail!("step_finish: the learning-rate table must not share storage with the step control block");
        }
        let t = lr_table.storage();
        super::step_finish_storage(
            (&mut self.write_storage(), self.layout()),
            (&t, lr_table.layout()),
            scaler,
        )
    }
}
