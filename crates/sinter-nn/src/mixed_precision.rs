//! Mixed-precision training: the precision modes and dynamic loss scaling for fp16.
//!
//! Parameters (the master weights) and their gradients stay f32 in every mode; what changes is
//! the dtype the matrix products run in, through `sinter_core::amp::autocast`:
//!
//! | mode | matmul / conv2d                         | loss scaling |
//! |------|-----------------------------------------|--------------|
//! | fp32 | f32                                     | no           |
//! | tf32 | f32 storage, TF32 tensor cores on CUDA (f32 on the CPU) | no |
//! | bf16 | bf16 operands, f32 accumulation         | no (bf16 has f32's range) |
//! | fp16 | f16 operands, f32 accumulation          | yes: [`LossScaler`] |
//!
//! fp16 has 5 exponent bits: gradients below ~6e-8 flush to zero and above 65504 overflow.
//! Scaling the loss by `scale` before backward lifts small gradients into range; the optimizer
//! step then sees gradients multiplied by 1/scale, and a step whose gradients overflowed
//! (inf/NaN) is skipped and the scale halved. After `growth_interval` good steps in a row the
//! scale doubles, so it hovers just below the overflow point (PyTorch's `GradScaler`).
//!
//! [`LossScaler`] decides on the host (it reads the gradient norm back every step);
//! [`StepControl`] makes the same decisions on the tensors' device (a control block read and
//! written by kernels: found-inf flag, scale, growth tracker, clip factor, learning rate, step
//! counts), so a training step never waits for the device. The host reads it back only when it
//! wants to report or save it ([`StepControl::read`]).

use sinter_core::step_ctl::{ctl, grad_sum_squares, ScalerCfg};
use sinter_core::{amp, bail, no_grad, DType, Device, Result, Tensor};

use crate::optim::Optimizer;

/// How a model computes (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum PrecisionMode {
    #[default]
    Fp32,
    Tf32,
    Bf16,
    Fp16,
}

impl PrecisionMode {
    pub const ALL: [PrecisionMode; 4] = [
        PrecisionMode::Fp32,
        PrecisionMode::Tf32,
        PrecisionMode::Bf16,
        PrecisionMode::Fp16,
    ];

    /// Parses `fp32`, `tf32`, `bf16` or `fp16` (also `f32`, `float32`, `bfloat16`, `f16`,
    /// `float16`, `half`).
    pub fn parse(s: &str) -> Option<PrecisionMode> {
        Some(match s.to_ascii_lowercase().as_str() {
            "fp32" | "f32" | "float32" => PrecisionMode::Fp32,
            "tf32" => PrecisionMode::Tf32,
            "bf16" | "bfloat16" => PrecisionMode::Bf16,
            "fp16" | "f16" | "float16" | "half" => PrecisionMode::Fp16,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            PrecisionMode::Fp32 => "fp32",
            PrecisionMode::Tf32 => "tf32",
            PrecisionMode::Bf16 => "bf16",
            PrecisionMode::Fp16 => "fp16",
        }
    }
    /// The dtype matrix products run in under autocast (None: no autocast region).
    pub fn autocast_dtype(self) -> Option<DType> {
        match self {
            PrecisionMode::Fp32 | PrecisionMode::Tf32 => None,
            PrecisionMode::Bf16 => Some(DType::BF16),
            PrecisionMode::Fp16 => Some(DType::F16),
        }
    }
    /// Whether this mode needs dynamic loss scaling (fp16 only).
    pub fn needs_loss_scaling(self) -> bool {
        self == PrecisionMode::Fp16
    }
    /// Enters the autocast region for this mode (a no-op guard for fp32 and tf32).
    pub fn autocast(self) -> Option<amp::AutocastGuard> {
        self.autocast_dtype().map(amp::autocast)
    }
}

impl std::fmt::Display for PrecisionMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a checkpoint keeps of a [`LossScaler`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScalerState {
    pub scale: f64,
    /// Good (finite) steps since the scale last changed.
    pub good_steps: u64,
}

/// Dynamic loss scaling for fp16 training (PyTorch's `GradScaler`, same defaults).
///
/// Per step: `backward(scale_loss(loss))`, then `unscale_and_check(params)`; if it returns
/// true, (clip and) `optimizer.step()`; in any case `update(found_inf)` with its negation.
/// [`LossScaler::step`] does the three for the common case.
#[derive(Clone, Debug)]
pub struct LossScaler {
    /// The factor the loss is multiplied by (2^16 to start).
    pub scale: f64,
    /// Multiplies the scale after `growth_interval` good steps in a row (2).
    pub growth_factor: f64,
    /// Multiplies the scale after a step with inf/NaN gradients (0.5).
    pub backoff_factor: f64,
    /// Good steps in a row before the scale grows (2000).
    pub growth_interval: u64,
    good_steps: u64,
    skipped: u64,
    last_grad_norm: Option<f64>,
}

impl Default for LossScaler {
    fn default() -> Self {
        LossScaler::new(65536.0)
    }
}

impl LossScaler {
    /// A scaler starting at `init_scale`, with growth 2, backoff 0.5 and interval 2000.
    pub fn new(init_scale: f64) -> LossScaler {
        LossScaler {
            scale: init_scale,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            good_steps: 0,
            skipped: 0,
            last_grad_norm: None,
        }
    }

    /// Checks the settings (a positive finite scale, growth > 1, 0 < backoff < 1, interval ≥ 1).
    pub fn validate(&self) -> Result<()> {
        if !(self.scale.is_finite() && self.scale > 0.0) {
            bail!(
                "loss scaler: the scale must be positive and finite, got {}",
                self.scale
            );
        }
        if !(self.growth_factor > 1.0 && self.growth_factor.is_finite()) {
            bail!(
                "loss scaler: growth_factor must be above 1, got {}",
                self.growth_factor
            );
        }
        if !(self.backoff_factor > 0.0 && self.backoff_factor < 1.0) {
            bail!(
                "loss scaler: backoff_factor must be in (0, 1), got {}",
                self.backoff_factor
            );
        }
        if self.growth_interval == 0 {
            bail!("loss scaler: growth_interval must be at least 1");
        }
        Ok(())
    }

    /// `loss · scale` in f32 (differentiable), to call `backward` on. A half-precision loss is
    /// widened first so that the scaled value itself is representable (cross-entropy already
    /// returns f32; compute other losses in f32 too, or the scaled gradient may overflow on its
    /// way back into an f16 graph — which the scaler then detects and backs off from).
    pub fn scale_loss(&self, loss: &Tensor) -> Result<Tensor> {
        let loss = if loss.dtype().is_float() && loss.dtype() != DType::F32 {
            loss.to_dtype(DType::F32)?
        } else {
            loss.clone()
        };
        loss.mul_scalar(self.scale as f32)
    }

    /// Multiplies every gradient of `params` by 1/scale, in place (the gradients' storage is
    /// kept, so data-parallel buckets that alias it stay valid), and returns true when all of
    /// them are finite. The check is one fused pass over all gradients
    /// (`sinter_core::fused::global_grad_norm`: an inf or NaN anywhere makes the norm non-finite);
    /// when it fails nothing is unscaled (the step will be skipped and the gradients cleared).
    pub fn unscale_and_check(&mut self, params: &[(String, Tensor)]) -> Result<bool> {
        let _g = no_grad();
        let grads: Vec<Tensor> = params.iter().filter_map(|(_, p)| p.grad()).collect();
        let norm = sinter_core::fused::global_grad_norm(&grads);
        if !norm.is_finite() {
            self.last_grad_norm = None;
            return Ok(false);
        }
        let inv = (1.0 / self.scale) as f32;
        for g in &grads {
            g.assign(&g.mul_scalar(inv)?)?;
        }
        self.last_grad_norm = Some(norm / self.scale);
        Ok(true)
    }

    /// The global gradient norm after the last successful `unscale_and_check` (unscaled).
    pub fn last_grad_norm(&self) -> Option<f64> {
        self.last_grad_norm
    }

    /// Adjusts the scale after a step: on inf/NaN gradients, multiply by `backoff_factor` and
    /// restart the count of good steps; else count the step and, after `growth_interval` good
    /// steps in a row, multiply by `growth_factor` (as long as the scale stays finite in f32).
    pub fn update(&mut self, found_inf: bool) {
        if found_inf {
            self.scale *= self.backoff_factor;
            // Never reach zero: the smallest normal f32 keeps the loss representable.
            self.scale = self.scale.max(f32::MIN_POSITIVE as f64);
            self.good_steps = 0;
            self.skipped += 1;
        } else {
            self.good_steps += 1;
            if self.good_steps >= self.growth_interval {
                let grown = self.scale * self.growth_factor;
                if grown < f32::MAX as f64 {
                    self.scale = grown;
                }
                self.good_steps = 0;
            }
        }
    }

    /// Unscale, check, step the optimizer when the gradients are finite, update the scale.
    /// Returns whether the optimizer stepped. (Clipping, if any, goes between `unscale_and_check`
    /// and `optimizer.step()`: call those two yourself.)
    pub fn step(&mut self, optimizer: &mut dyn Optimizer) -> Result<bool> {
        let ok = self.unscale_and_check(optimizer.params())?;
        if ok {
            optimizer.step()?;
        }
        self.update(!ok);
        Ok(ok)
    }

    /// Good steps since the scale last changed.
    pub fn good_steps(&self) -> u64 {
        self.good_steps
    }
    /// Steps skipped for inf/NaN gradients since this scaler was made (not checkpointed).
    pub fn skipped_steps(&self) -> u64 {
        self.skipped
    }
    pub fn state(&self) -> LossScalerState {
        LossScalerState {
            scale: self.scale,
            good_steps: self.good_steps,
        }
    }
    pub fn load_state(&mut self, s: LossScalerState) -> Result<()> {
        if !(s.scale.is_finite() && s.scale > 0.0) {
            bail!(
                "loss scaler state: the scale must be positive and finite, got {}",
                s.scale
            );
        }
        self.scale = s.scale;
        self.good_steps = s.good_steps;
        Ok(())
    }
}

/// What the host reads back from a [`StepControl`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepControlState {
    /// The loss scale (1 without dynamic scaling).
    pub loss_scale: f64,
    /// Good steps since the scale last changed.
    pub good_steps: u64,
    /// Optimizer updates taken (skipped steps excluded).
    pub optimizer_steps: u64,
    /// Steps skipped for inf/NaN gradients since this block was made.
    pub skipped_steps: u64,
    /// Steps of the schedule done (the next step's index).
    pub iter: u64,
    /// The learning rate the next step will use.
    pub lr: f64,
    /// Global gradient norm of the last step (unscaled, before clipping).
    pub grad_norm: f64,
}

/// The training step's decisions on the device: gradient clipping, fp16 dynamic loss scaling
/// and the learning-rate schedule, kept in a small control block beside the parameters (see
/// `sinter_core::step_ctl`). Per step:
///
/// ```text
/// control.scale_loss(&loss)?.backward()?;   // loss · scale, the scale read on the device
/// control.prepare(params)?;                 // found_inf, grad norm, clip factor / scale
/// optimizer.step_ctl(control.tensor())?;    // skipped on the device when found_inf is set
/// control.finish()?;                        // scale backoff / growth, step counts, next lr
/// ```
///
/// Semantics match [`LossScaler`] (backoff on an inf/NaN step, which the optimizer skips
/// without advancing its step count; growth after `growth_interval` good steps) and
/// `clip_grad_norm` (scale by max / (norm + 1e-6) when the norm is above max); the counters are
/// f32 on the device, exact up to 2^24 steps.
#[derive(Clone, Debug)]
pub struct StepControl {
    ctl: Tensor,
    lr_table: Tensor,
    max_norm: f32,
    scaler: Option<ScalerCfg>,
}

impl StepControl {
    /// A block on `device`. `lrs[i]` is the learning rate of step i of the run (the schedule);
    /// the run continues at step `start` with `optimizer_steps` updates taken so far; `max_norm`
    /// clips the global gradient norm; `scaler` (fp16) gives the initial scale, growth tracker
    /// and settings of dynamic loss scaling.
    pub fn new(
        device: Device,
        lrs: &[f64],
        start: u64,
        optimizer_steps: u64,
        max_norm: Option<f64>,
        scaler: Option<&LossScaler>,
    ) -> Result<StepControl> {
        if lrs.is_empty() {
            bail!("step control: the learning-rate schedule has no steps");
        }
        if let Some(m) = max_norm {
            if !(m > 0.0 && m.is_finite()) {
                bail!("step control: the gradient clip norm must be positive and finite, got {m}");
            }
        }
        if let Some(s) = scaler {
            s.validate()?;
        }
        let mut c = vec![0f32; ctl::LEN];
        c[ctl::LR] = lrs[(start as usize).min(lrs.len() - 1)] as f32;
        c[ctl::STEPS] = optimizer_steps as f32;
        c[ctl::GRAD_FACTOR] = 1.0;
        c[ctl::SCALE] = scaler.map_or(1.0, |s| s.scale as f32);
        c[ctl::GOOD_STEPS] = scaler.map_or(0.0, |s| s.good_steps() as f32);
        c[ctl::ITER] = start as f32;
        let table: Vec<f32> = lrs.iter().map(|&l| l as f32).collect();
        let n = table.len();
        Ok(StepControl {
            ctl: Tensor::from_vec(c, &[ctl::LEN], Device::Cpu)?.to_device(device)?,
            lr_table: Tensor::from_vec(table, &[n], Device::Cpu)?.to_device(device)?,
            max_norm: max_norm.unwrap_or(0.0) as f32,
            scaler: scaler.map(|s| ScalerCfg {
                growth: s.growth_factor as f32,
                backoff: s.backoff_factor as f32,
                interval: s.growth_interval,
            }),
        })
    }

    /// Continues the schedule with the learning rates `lrs` of the next steps: the next step
    /// uses `lrs[0]` (the table's index restarts at 0). With it a trainer keeps a window of
    /// the schedule on the device instead of every step of the run, refilling it before the
    /// window runs out; `lrs` may be as long as the table `new` was given, at most.
    pub fn restart_schedule(&self, lrs: &[f64]) -> Result<()> {
        let n = self.lr_table.numel();
        let (Some(&first), Some(&last)) = (lrs.first(), lrs.last()) else {
            bail!("step control: the learning-rate window is empty");
        };
        if lrs.len() > n {
            bail!(
                "step control: a window of {} learning rates does not fit the table of {n}",
                lrs.len()
            );
        }
        let _g = no_grad();
        let mut table: Vec<f32> = lrs.iter().map(|&l| l as f32).collect();
        table.resize(n, last as f32);
        let device = self.ctl.device();
        self.lr_table
            .assign(&Tensor::from_vec(table, &[n], Device::Cpu)?.to_device(device)?)?;
        let set = |at: usize, v: f32| -> Result<()> {
            let x = Tensor::from_vec(vec![v], &[1], Device::Cpu)?.to_device(device)?;
            self.ctl.narrow(0, at, 1)?.assign(&x)
        };
        set(ctl::ITER, 0.0)?;
        set(ctl::LR, first as f32)
    }

    /// The control block (for `Optimizer::step_ctl`).
    pub fn tensor(&self) -> &Tensor {
        &self.ctl
    }

    /// Whether dynamic loss scaling is on.
    pub fn scaling(&self) -> bool {
        self.scaler.is_some()
    }

    /// The loss to call `backward` on: `loss · scale` in f32 with dynamic scaling (the scale is
    /// read on the device when the product runs), else `loss` as is.
    pub fn scale_loss(&self, loss: &Tensor) -> Result<Tensor> {
        if self.scaler.is_none() {
            return Ok(loss.clone());
        }
        let loss = if loss.dtype() != DType::F32 {
            loss.to_dtype(DType::F32)?
        } else {
            loss.clone()
        };
        let scale = self.ctl.narrow(0, ctl::SCALE, 1)?.reshape(loss.shape())?;
        loss.mul(&scale)
    }

    /// After backward (and any all-reduce of the gradients): one pass over all gradients for
    /// their squared norm, then found_inf, the norm and the gradient factor on the device.
    pub fn prepare(&self, params: &[(String, Tensor)]) -> Result<()> {
        let _g = no_grad();
        let grads: Vec<Tensor> = params.iter().filter_map(|(_, p)| p.grad()).collect();
        let sumsq = if grads.is_empty() {
            Tensor::zeros(&[1], DType::F32, self.ctl.device())?
        } else {
            grad_sum_squares(&grads, self.ctl.device())?
        };
        self.ctl
            .step_prepare(&sumsq, self.max_norm, self.scaler.is_some())
    }

    /// After the optimizer: loss-scale update, step counters, the next learning rate.
    pub fn finish(&self) -> Result<()> {
        let _g = no_grad();
        self.ctl.step_finish(&self.lr_table, self.scaler)
    }

    /// Reads the block back to the host (waits for the device: call it at log intervals and
    /// checkpoints, not every step).
    pub fn read(&self) -> Result<StepControlState> {
        let c = self.ctl.to_vec_f32()?;
        Ok(StepControlState {
            loss_scale: c[ctl::SCALE] as f64,
            good_steps: c[ctl::GOOD_STEPS] as u64,
            optimizer_steps: c[ctl::STEPS] as u64,
            skipped_steps: c[ctl::SKIPPED] as u64,
            iter: c[ctl::ITER] as u64,
            lr: c[ctl::LR] as f64,
            grad_norm: c[ctl::GRAD_NORM] as f64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_dtypes() {
        for m in PrecisionMode::ALL {
            assert_eq!(PrecisionMode::parse(m.as_str()), Some(m));
        }
        assert_eq!(PrecisionMode::parse("BF16"), Some(PrecisionMode::Bf16));
        assert_eq!(PrecisionMode::parse("int8"), None);
        assert_eq!(PrecisionMode::Fp16.autocast_dtype(), Some(DType::F16));
        assert_eq!(PrecisionMode::Tf32.autocast_dtype(), None);
        assert!(
            PrecisionMode::Fp16.needs_loss_scaling() && !PrecisionMode::Bf16.needs_loss_scaling()
        );
    }

    #[test]
    fn a_restarted_schedule_continues_from_its_window() {
        let c = StepControl::new(Device::Cpu, &[1.0, 2.0, 3.0], 1, 0, None, None).unwrap();
        assert_eq!(c.read().unwrap().lr, 2.0);
        c.restart_schedule(&[5.0, 6.0]).unwrap();
        assert_eq!((c.read().unwrap().lr, c.read().unwrap().iter), (5.0, 0));
        c.finish().unwrap();
        assert_eq!(c.read().unwrap().lr, 6.0);
        // Past the window's end the last rate holds until the next restart.
        c.finish().unwrap();
        assert_eq!(c.read().unwrap().lr, 6.0);
        assert!(c.restart_schedule(&[]).is_err());
        assert!(c.restart_schedule(&[1.0; 4]).is_err());
    }

    #[test]
    fn update_backs_off_and_grows() {
        let mut s = LossScaler::new(1024.0);
        s.growth_interval = 3;
        s.validate().unwrap();
        s.update(true);
        assert_eq!(s.scale, 512.0);
        s.update(false);
        s.update(false);
        assert_eq!(s.scale, 512.0);
        s.update(true); // the run of good steps restarts
        assert_eq!((s.scale, s.good_steps()), (256.0, 0));
        for _ in 0..3 {
            s.update(false);
        }
        assert_eq!((s.scale, s.good_steps()), (512.0, 0));
        assert_eq!(s.skipped_steps(), 2);
        let st = s.state();
        let mut t = LossScaler::default();
        t.load_state(st).unwrap();
        assert_eq!(t.state(), st);
        assert!(t
            .load_state(LossScalerState {
                scale: f64::NAN,
                good_steps: 0
            })
            .is_err());
    }
}
