//! The launch plans of `optimizer.cu`'s updates: fused AdamW and SGD over flat f32 buffers,
//! and the step control block's two kernels that keep a training step's decisions (skip on
//! inf/NaN, loss scale, clip factor, learning rate, step count) on the device. Each `plan_*`
//! checks its operands and builds the launch (with its declared traffic for the GPU cost
//! model); the device functions below queue it. The kernel source is compiled by NVRTC at the
//! first launch on a device (the emulated device runs it through the kernel emulator).

use std::sync::OnceLock;

use sinter_cuda::check::{need, need_dtype, opt_need};
use sinter_cuda::emulated::cost::OpClass;
use sinter_cuda::launch::{Arg, KernelStruct, LaunchTarget, Traffic, ELEMWISE_BLOCK};
use sinter_cuda::user_kernel::{KernelSource, UserLaunch};
use sinter_cuda::{CudaDevice, CudaError, DType, DevSlice, Result};

use super::control::{ctl, ScalerCfg};

/// The CUDA C++ of the folder's kernels (compiled by NVRTC at the first launch on a device).
pub(super) const OPTIMIZER_CU: &str = include_str!("optimizer.cu");

/// `optimizer.cu` as a kernel source, made once per process.
pub(super) fn source() -> Result<&'static KernelSource> {
    static SOURCE: OnceLock<KernelSource> = OnceLock::new();
    if let Some(s) = SOURCE.get() {
        return Ok(s);
    }
    let s = KernelSource::new("optimizer.cu", OPTIMIZER_CU)?;
    Ok(SOURCE.get_or_init(|| s))
}

/// A 1-D launch of kernel `name`; with `traffic`, declared to the cost model as elementwise work
/// (without, the cost model estimates it as an elementwise kernel).
fn launch(
    name: impl Into<String>,
    grid: u32,
    block: u32,
    args: Vec<Arg>,
    traffic: Option<Traffic>,
) -> UserLaunch {
    UserLaunch {
        kernel: name.into(),
        grid: (grid, 1, 1),
        block: (block, 1, 1),
        shared_mem: 0,
        args,
        declared: traffic.map(|t| (OpClass::Elementwise, t)),
    }
}

/// Queues a launch (of `optimizer.cu`) on the device.
fn run(dev: &CudaDevice, l: &UserLaunch) -> Result<()> {
    dev.launch_user(source()?, l)
}

/// Matches `struct AdamArgs` in optimizer.cu (72 bytes). The hyper-parameters travel as f64: the
/// kernel computes its scalar factors in f64 and rounds each to f32 once, as PyTorch does.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AdamArgs {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// 1-based step number (the step control block's count replaces it).
    pub step: f64,
    pub grad_scale: f32,
    pub pad: i32,
    pub found_inf: u64,
    /// Step control block (0: none).
    pub ctl: u64,
}
// SAFETY: repr(C), six f64, f32 + i32, two u64: no padding.
unsafe impl KernelStruct for AdamArgs {}

/// Matches `struct SgdArgs` in optimizer.cu (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SgdArgs {
    pub lr: f32,
    pub momentum: f32,
    pub dampening: f32,
    pub weight_decay: f32,
    pub grad_scale: f32,
    pub nesterov: i32,
    pub first_step: i32,
    pub pad: i32,
    pub found_inf: u64,
    /// Step control block (0: none).
    pub ctl: u64,
}
// SAFETY: repr(C), eight 4-byte fields, two u64: no padding.
unsafe impl KernelStruct for SgdArgs {}

/// One AdamW step as the kernel takes it: the shared hyper-parameters (`sinter_types::AdamW`,
/// f64 like PyTorch's Python floats) and the factor the gradient is multiplied by first.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    pub hyper: sinter_types::AdamW,
    /// Multiplies the gradient first: 1/loss_scale, times a clip coefficient.
    pub grad_scale: f32,
}

impl AdamW {
    /// Kernel arguments.
    pub fn args(&self, found_inf: u64) -> Result<AdamArgs> {
        let h = &self.hyper;
        if h.step == 0 {
            return Err(CudaError::invalid("adamw", "step is 1-based"));
        }
        Ok(AdamArgs {
            lr: h.lr,
            beta1: h.beta1,
            beta2: h.beta2,
            eps: h.eps,
            weight_decay: h.weight_decay,
            step: h.step as f64,
            grad_scale: self.grad_scale,
            pad: 0,
            found_inf,
            ctl: 0,
        })
    }

    /// The same step with another step number (the control block's plans ignore it, but it
    /// must still be 1-based).
    pub fn at_step(&self, step: u64) -> AdamW {
        AdamW {
            hyper: sinter_types::AdamW { step, ..self.hyper },
            ..*self
        }
    }

    /// The kernel's arithmetic for one element: (p, g, m, v) -> (p, m, v). The kernel's
    /// `adam_factors` and `adam_one` are `sinter_types::AdamW::factors` and
    /// `AdamWFactors::update` in CUDA.
    #[cfg(test)]
    pub fn reference(&self, p: f32, g: f32, m: f32, v: f32) -> (f32, f32, f32) {
        self.hyper.factors().update(p, g * self.grad_scale, m, v)
    }
}

/// SGD hyper-parameters for one step (PyTorch semantics).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sgd {
    pub lr: f32,
    pub momentum: f32,
    pub dampening: f32,
    pub weight_decay: f32,
    pub nesterov: bool,
    /// True on the first step (initialises the momentum buffer with the gradient).
    pub first_step: bool,
    pub grad_scale: f32,
}

impl Sgd {
    pub fn args(&self, found_inf: u64) -> SgdArgs {
        SgdArgs {
            lr: self.lr,
            momentum: self.momentum,
            dampening: self.dampening,
            weight_decay: self.weight_decay,
            grad_scale: self.grad_scale,
            nesterov: self.nesterov as i32,
            first_step: self.first_step as i32,
            pad: 0,
            found_inf,
            ctl: 0,
        }
    }
}

/// Plan one fused AdamW step on flat f32 (param, grad, m, v), optionally writing a bf16/f16 copy
/// of the new parameters; skipped on the device when `*found_inf != 0`.
#[allow(clippy::too_many_arguments)]
pub fn plan_adamw(
    t: &LaunchTarget,
    param: DevSlice<'_>,
    grad: DevSlice<'_>,
    m: DevSlice<'_>,
    v: DevSlice<'_>,
    copy: Option<DevSlice<'_>>,
    cfg: &AdamW,
    found_inf: Option<DevSlice<'_>>,
) -> Result<Option<UserLaunch>> {
    plan_adamw_impl(t, param, grad, m, v, copy, cfg, found_inf, None)
}

/// [`plan_adamw`] driven by the step control block `ctl` ([`ctl::LEN`] f32): skipped when
/// `ctl[FOUND_INF] != 0`; lr, step number and a gradient factor come from the block
/// (`cfg.lr` and `cfg.step` are ignored, `cfg.step` must still be ≥ 1).
#[allow(clippy::too_many_arguments)]
pub fn plan_adamw_ctl(
    t: &LaunchTarget,
    param: DevSlice<'_>,
    grad: DevSlice<'_>,
    m: DevSlice<'_>,
    v: DevSlice<'_>,
    copy: Option<DevSlice<'_>>,
    cfg: &AdamW,
    ctl: DevSlice<'_>,
) -> Result<Option<UserLaunch>> {
    need("adamw", "step control", &ctl, DType::F32, ctl::LEN)?;
    let flag = ctl.slice(ctl::FOUND_INF, 1)?;
    plan_adamw_impl(t, param, grad, m, v, copy, cfg, Some(flag), Some(ctl))
}

#[allow(clippy::too_many_arguments)]
fn plan_adamw_impl(
    t: &LaunchTarget,
    param: DevSlice<'_>,
    grad: DevSlice<'_>,
    m: DevSlice<'_>,
    v: DevSlice<'_>,
    copy: Option<DevSlice<'_>>,
    cfg: &AdamW,
    found_inf: Option<DevSlice<'_>>,
    ctl: Option<DevSlice<'_>>,
) -> Result<Option<UserLaunch>> {
    let op = "adamw";
    let n = param.len();
    for (w, s) in [("param", &param), ("grad", &grad), ("m", &m), ("v", &v)] {
        need(op, w, s, DType::F32, n)?;
    }
    opt_need(op, "found_inf", &found_inf, DType::F32, 1)?;
    let mut a = cfg.args(found_inf.map_or(0, |s| s.ptr()))?;
    a.ctl = ctl.map_or(0, |s| s.ptr());
    if n == 0 {
        return Ok(None);
    }
    let mut args = vec![
        Arg::Ptr(param.ptr()),
        Arg::Ptr(grad.ptr()),
        Arg::Ptr(m.ptr()),
        Arg::Ptr(v.ptr()),
    ];
    let name = match copy {
        None => "adamw_f32".to_string(),
        Some(c) => {
            if !matches!(c.dtype(), DType::BF16 | DType::F16) {
                return Err(CudaError::invalid(
                    op,
                    "the parameter copy must be bf16 or f16",
                ));
            }
            need(op, "copy", &c, c.dtype(), n)?;
            args.push(Arg::Ptr(c.ptr()));
            format!("adamw_copy_{}", c.dtype().suffix())
        }
    };
    args.extend([Arg::I64(n as i64), Arg::bytes(&a)]);
    // param, grad, m, v read; param, m, v (and the half copy) written.
    let copy_bytes = copy.map_or(0, |c| c.num_bytes());
    let traffic = Traffic::bytes(4 * n * 4, 3 * n * 4 + copy_bytes).with_flops(12 * n);
    let grid = t.elementwise_grid(n, 4);
    Ok(Some(launch(
        name,
        grid,
        ELEMWISE_BLOCK,
        args,
        Some(traffic),
    )))
}

/// Parameters one multi-tensor AdamW launch steps (`ADAMW_SLOTS` in optimizer.cu).
pub const ADAMW_SLOTS: usize = 32;
/// Elements of one block task of the multi-tensor kernel (`ADAMW_CHUNK` in optimizer.cu).
pub const ADAMW_CHUNK: usize = 4096;

/// One parameter of a multi-tensor AdamW step: flat f32 (param, grad, m, v) and its group's
/// settings.
#[derive(Clone, Copy, Debug)]
pub struct AdamSlot<'a> {
    pub param: DevSlice<'a>,
    pub grad: DevSlice<'a>,
    pub m: DevSlice<'a>,
    pub v: DevSlice<'a>,
    /// Replaces `cfg.hyper.weight_decay` for this parameter.
    pub weight_decay: f64,
    /// Replaces `cfg.hyper.lr` for this parameter (without a control block).
    pub lr: f64,
    /// With a control block: this parameter's rate is `ctl[LR] * lr_scale` (in f32).
    pub lr_scale: f32,
}

/// Plan AdamW over many parameters: one launch per [`ADAMW_SLOTS`] of them (PyTorch's
/// multi_tensor_apply: the tensors travel in the kernel's parameters, nothing is uploaded, so
/// a captured CUDA graph replays the launches as they are). Each element gets exactly
/// [`plan_adamw`]'s arithmetic with its slot's weight decay and learning rate; with the step
/// control block `ctl`, as [`plan_adamw_ctl`] (skipped on found_inf).
pub fn plan_adamw_multi(
    t: &LaunchTarget,
    slots: &[AdamSlot<'_>],
    cfg: &AdamW,
    ctl: Option<DevSlice<'_>>,
) -> Result<Vec<UserLaunch>> {
    let op = "adamw_multi";
    opt_need(op, "step control", &ctl, DType::F32, ctl::LEN)?;
    let flag = ctl.map(|c| c.slice(ctl::FOUND_INF, 1)).transpose()?;
    let mut a = cfg.args(flag.map_or(0, |s| s.ptr()))?;
    a.ctl = ctl.map_or(0, |s| s.ptr());
    let mut out = Vec::new();
    for group in slots.chunks(ADAMW_SLOTS) {
        let mut args = vec![Arg::bytes(&a), Arg::I64(group.len() as i64)];
        let (mut chunks, mut elems) = (0, 0);
        for k in 0..ADAMW_SLOTS {
            let Some(s) = group.get(k) else {
                args.extend([Arg::Ptr(0); 4]);
                args.extend([Arg::I64(0), Arg::U64(0), Arg::U64(0), Arg::F32(0.0)]);
                continue;
            };
            let n = s.param.len();
            for (w, x) in [
                ("param", &s.param),
                ("grad", &s.grad),
                ("m", &s.m),
                ("v", &s.v),
            ] {
                need(op, w, x, DType::F32, n)?;
            }
            chunks += n.div_ceil(ADAMW_CHUNK);
            elems += n;
            args.extend([s.param, s.grad, s.m, s.v].map(|x| Arg::Ptr(x.ptr())));
            args.extend([
                Arg::I64(n as i64),
                Arg::U64(s.weight_decay.to_bits()),
                Arg::U64(s.lr.to_bits()),
                Arg::F32(s.lr_scale),
            ]);
        }
        if elems == 0 {
            continue;
        }
        let grid = chunks.min(t.max_blocks(ELEMWISE_BLOCK) as usize) as u32;
        // As plan_adamw per element: param, grad, m, v read; param, m, v written.
        let traffic = Traffic::bytes(4 * elems * 4, 3 * elems * 4).with_flops(12 * elems);
        out.push(launch(
            "adamw_multi_f32",
            grid,
            ELEMWISE_BLOCK,
            args,
            Some(traffic),
        ));
    }
    Ok(out)
}

/// Plan one SGD step; `buf` (momentum buffer, f32) is required when momentum != 0.
pub fn plan_sgd(
    t: &LaunchTarget,
    param: DevSlice<'_>,
    grad: DevSlice<'_>,
    buf: Option<DevSlice<'_>>,
    cfg: &Sgd,
    found_inf: Option<DevSlice<'_>>,
) -> Result<Option<UserLaunch>> {
    plan_sgd_impl(t, param, grad, buf, cfg, found_inf, None)
}

/// [`plan_sgd`] driven by the step control block (see [`plan_adamw_ctl`]; `cfg.lr` is ignored).
pub fn plan_sgd_ctl(
    t: &LaunchTarget,
    param: DevSlice<'_>,
    grad: DevSlice<'_>,
    buf: Option<DevSlice<'_>>,
    cfg: &Sgd,
    ctl: DevSlice<'_>,
) -> Result<Option<UserLaunch>> {
    need("sgd", "step control", &ctl, DType::F32, ctl::LEN)?;
    let flag = ctl.slice(ctl::FOUND_INF, 1)?;
    plan_sgd_impl(t, param, grad, buf, cfg, Some(flag), Some(ctl))
}

fn plan_sgd_impl(
    t: &LaunchTarget,
    param: DevSlice<'_>,
    grad: DevSlice<'_>,
    buf: Option<DevSlice<'_>>,
    cfg: &Sgd,
    found_inf: Option<DevSlice<'_>>,
    ctl: Option<DevSlice<'_>>,
) -> Result<Option<UserLaunch>> {
    let n = param.len();
    need("sgd", "param", &param, DType::F32, n)?;
    need("sgd", "grad", &grad, DType::F32, n)?;
    opt_need("sgd", "momentum buffer", &buf, DType::F32, n)?;
    opt_need("sgd", "found_inf", &found_inf, DType::F32, 1)?;
    if cfg.momentum != 0.0 && buf.is_none() {
        return Err(CudaError::invalid("sgd", "momentum needs a buffer"));
    }
    if n == 0 {
        return Ok(None);
    }
    Ok(Some(launch(
        "sgd_f32",
        t.grid_for(n, ELEMWISE_BLOCK),
        ELEMWISE_BLOCK,
        vec![
            Arg::Ptr(param.ptr()),
            Arg::Ptr(grad.ptr()),
            Arg::Ptr(buf.map_or(0, |b| b.ptr())),
            Arg::I64(n as i64),
            Arg::bytes(&SgdArgs {
                ctl: ctl.map_or(0, |s| s.ptr()),
                ..cfg.args(found_inf.map_or(0, |s| s.ptr()))
            }),
        ],
        None,
    )))
}

/// Plan `step_prepare`: from `sumsq` (1 f32, the squared global norm of the loss-scaled
/// gradients) set found_inf (when `dynamic`), the norm and the gradient factor in `ctl`.
/// `max_norm` ≤ 0 means no clipping.
pub fn plan_step_prepare(
    ctl: DevSlice<'_>,
    sumsq: DevSlice<'_>,
    max_norm: f32,
    dynamic: bool,
) -> Result<UserLaunch> {
    need("step_prepare", "step control", &ctl, DType::F32, ctl::LEN)?;
    need("step_prepare", "sumsq", &sumsq, DType::F32, 1)?;
    if max_norm.is_nan() {
        return Err(CudaError::invalid("step_prepare", "max_norm is NaN"));
    }
    Ok(launch(
        "step_prepare",
        1,
        32,
        vec![
            Arg::Ptr(ctl.ptr()),
            Arg::Ptr(sumsq.ptr()),
            Arg::F32(max_norm),
            Arg::I32(dynamic as i32),
        ],
        None,
    ))
}

/// Plan `step_finish`: update the loss scale (when `scaler` is given), the step and schedule
/// counters, and load the next learning rate from `lr_table` (f32, at least one entry).
pub fn plan_step_finish(
    ctl: DevSlice<'_>,
    lr_table: DevSlice<'_>,
    scaler: Option<ScalerCfg>,
) -> Result<UserLaunch> {
    need("step_finish", "step control", &ctl, DType::F32, ctl::LEN)?;
    need_dtype("step_finish", "lr table", &lr_table, DType::F32)?;
    if lr_table.is_empty() {
        return Err(CudaError::invalid("step_finish", "the lr table is empty"));
    }
    let s = scaler.unwrap_or(ScalerCfg {
        growth: 1.0,
        backoff: 1.0,
        interval: 1,
    });
    if scaler.is_some()
        && !(s.growth > 1.0 && s.backoff > 0.0 && s.backoff < 1.0 && s.interval >= 1)
    {
        return Err(CudaError::invalid(
            "step_finish",
            format!(
                "bad loss scaler settings {s:?} (need growth > 1, 0 < backoff < 1, interval ≥ 1)"
            ),
        ));
    }
    Ok(launch(
        "step_finish",
        1,
        32,
        vec![
            Arg::Ptr(ctl.ptr()),
            Arg::Ptr(lr_table.ptr()),
            Arg::I64(lr_table.len() as i64),
            Arg::F32(s.growth),
            Arg::F32(s.backoff),
            Arg::F32(s.interval as f32),
            Arg::I32(scaler.is_some() as i32),
        ],
        None,
    ))
}

/// One fused AdamW step on the device.
#[allow(clippy::too_many_arguments)]
pub fn adamw(
    dev: &CudaDevice,
    param: DevSlice<'_>,
    grad: DevSlice<'_>,
    m: DevSlice<'_>,
    v: DevSlice<'_>,
    copy: Option<DevSlice<'_>>,
    cfg: &AdamW,
    found_inf: Option<DevSlice<'_>>,
) -> Result<()> {
    let l = plan_adamw(&dev.target(), param, grad, m, v, copy, cfg, found_inf)?;
    l.map_or(Ok(()), |l| run(dev, &l))
}

/// AdamW over many parameters on the device (see [`plan_adamw_multi`]).
pub fn adamw_multi(
    dev: &CudaDevice,
    slots: &[AdamSlot<'_>],
    cfg: &AdamW,
    ctl: Option<DevSlice<'_>>,
) -> Result<()> {
    for l in plan_adamw_multi(&dev.target(), slots, cfg, ctl)? {
        run(dev, &l)?;
    }
    Ok(())
}

/// One fused AdamW step driven by the step control block (see [`plan_adamw_ctl`]).
#[allow(clippy::too_many_arguments)]
pub fn adamw_ctl(
    dev: &CudaDevice,
    param: DevSlice<'_>,
    grad: DevSlice<'_>,
    m: DevSlice<'_>,
    v: DevSlice<'_>,
    copy: Option<DevSlice<'_>>,
    cfg: &AdamW,
    ctl: DevSlice<'_>,
) -> Result<()> {
    let l = plan_adamw_ctl(&dev.target(), param, grad, m, v, copy, cfg, ctl)?;
    l.map_or(Ok(()), |l| run(dev, &l))
}

/// One SGD step driven by the step control block.
pub fn sgd_ctl(
    dev: &CudaDevice,
    param: DevSlice<'_>,
    grad: DevSlice<'_>,
    buf: Option<DevSlice<'_>>,
    cfg: &Sgd,
    ctl: DevSlice<'_>,
) -> Result<()> {
    let l = plan_sgd_ctl(&dev.target(), param, grad, buf, cfg, ctl)?;
    l.map_or(Ok(()), |l| run(dev, &l))
}

/// `step_prepare` on the device (see [`plan_step_prepare`]).
pub fn step_prepare(
    dev: &CudaDevice,
    ctl: DevSlice<'_>,
    sumsq: DevSlice<'_>,
    max_norm: f32,
    dynamic: bool,
) -> Result<()> {
    run(dev, &plan_step_prepare(ctl, sumsq, max_norm, dynamic)?)
}

/// `step_finish` on the device (see [`plan_step_finish`]).
pub fn step_finish(
    dev: &CudaDevice,
    ctl: DevSlice<'_>,
    lr_table: DevSlice<'_>,
    scaler: Option<ScalerCfg>,
) -> Result<()> {
    run(dev, &plan_step_finish(ctl, lr_table, scaler)?)
}

/// One SGD step on the device.
pub fn sgd(
    dev: &CudaDevice,
    param: DevSlice<'_>,
    grad: DevSlice<'_>,
    buf: Option<DevSlice<'_>>,
    cfg: &Sgd,
    found_inf: Option<DevSlice<'_>>,
) -> Result<()> {
    let l = plan_sgd(&dev.target(), param, grad, buf, cfg, found_inf)?;
    l.map_or(Ok(()), |l| run(dev, &l))
}

/// One sample plan per kernel of the source, built with fake pointers (for the NVRTC check).
#[cfg(test)]
pub(super) fn samples(t: &LaunchTarget) -> Vec<UserLaunch> {
    use sinter_cuda::ops::fake_slice;
    let mut v = Vec::new();
    let n = 1000;
    let f = || fake_slice(DType::F32, n);
    let cfg = AdamW {
        hyper: sinter_types::AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
            step: 1,
        },
        grad_scale: 1.0,
    };
    v.extend(plan_adamw(t, f(), f(), f(), f(), None, &cfg, None).unwrap());
    v.extend(
        plan_adamw(
            t,
            f(),
            f(),
            f(),
            f(),
            Some(fake_slice(DType::BF16, n)),
            &cfg,
            None,
        )
        .unwrap(),
    );
    v.extend(
        plan_adamw(
            t,
            f(),
            f(),
            f(),
            f(),
            Some(fake_slice(DType::F16, n)),
            &cfg,
            Some(fake_slice(DType::F32, 1)),
        )
        .unwrap(),
    );
    let slot = |k: usize| AdamSlot {
        param: f(),
        grad: f(),
        m: f(),
        v: f(),
        weight_decay: 0.01 * k as f64,
        lr: 1e-3,
        lr_scale: 1.0,
    };
    let slots: Vec<AdamSlot> = (0..3).map(slot).collect();
    v.extend(plan_adamw_multi(t, &slots, &cfg, None).unwrap());
    let sgd = Sgd {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.0,
        weight_decay: 0.0,
        nesterov: true,
        first_step: false,
        grad_scale: 1.0,
    };
    v.extend(plan_sgd(t, f(), f(), Some(f()), &sgd, None).unwrap());
    let c = || fake_slice(DType::F32, ctl::LEN);
    v.extend(plan_adamw_ctl(t, f(), f(), f(), f(), None, &cfg, c()).unwrap());
    v.extend(plan_sgd_ctl(t, f(), f(), Some(f()), &sgd, c()).unwrap());
    v.push(plan_step_prepare(c(), fake_slice(DType::F32, 1), 1.0, true).unwrap());
    v.push(
        plan_step_finish(
            c(),
            fake_slice(DType::F32, 100),
            Some(ScalerCfg {
                growth: 2.0,
                backoff: 0.5,
                interval: 2000,
            }),
        )
        .unwrap(),
    );
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use sinter_cuda::ops::fake_slice;

    #[test]
    fn struct_layouts() {
        assert_eq!(std::mem::size_of::<AdamArgs>(), 72);
        assert_eq!(std::mem::size_of::<SgdArgs>(), 48);
    }

    #[test]
    fn ctl_plans_point_at_the_control_block() {
        let t = LaunchTarget { sm_count: 4 };
        let f = || fake_slice(DType::F32, 64);
        let c = fake_slice(DType::F32, ctl::LEN);
        let cfg = AdamW {
            hyper: sinter_types::AdamW {
                lr: 1e-3,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.0,
                step: 1,
            },
            grad_scale: 1.0,
        };
        let l = plan_adamw_ctl(&t, f(), f(), f(), f(), None, &cfg, c)
            .unwrap()
            .unwrap();
        let want = AdamArgs {
            found_inf: c.ptr() + 4 * ctl::FOUND_INF as u64,
            ctl: c.ptr(),
            ..cfg.args(0).unwrap()
        };
        assert_eq!(l.args.last(), Some(&Arg::bytes(&want)));
        // A block of the wrong size is refused.
        let short = fake_slice(DType::F32, ctl::LEN - 1);
        assert!(plan_adamw_ctl(&t, f(), f(), f(), f(), None, &cfg, short).is_err());
        assert!(plan_step_prepare(short, fake_slice(DType::F32, 1), 1.0, true).is_err());
        let p = plan_step_prepare(c, fake_slice(DType::F32, 1), 0.0, false).unwrap();
        assert_eq!(p.args[3], Arg::I32(0));
        let bad = ScalerCfg {
            growth: 0.5,
            backoff: 0.5,
            interval: 10,
        };
        assert!(plan_step_finish(c, fake_slice(DType::F32, 3), Some(bad)).is_err());
        assert!(plan_step_finish(c, fake_slice(DType::F32, 0), None).is_err());
        let fin = plan_step_finish(c, fake_slice(DType::F32, 3), None).unwrap();
        assert_eq!(fin.args[2], Arg::I64(3));
        assert_eq!(fin.args[6], Arg::I32(0));
    }

    #[test]
    fn adam_reference_first_step_moves_by_lr() {
        let cfg = AdamW {
            hyper: sinter_types::AdamW {
                lr: 0.01,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.0,
                step: 1,
            },
            grad_scale: 1.0,
        };
        // Step 1: m/bc1 = g, v/bc2 = g^2, so the step is lr * sign(g).
        let (p, _, _) = cfg.reference(1.0, 0.5, 0.0, 0.0);
        assert!((p - 0.99).abs() < 1e-6, "{p}");
        assert!(cfg.at_step(0).args(0).is_err());
    }

    #[test]
    fn multi_plans_take_32_slots_a_launch_within_the_parameter_limit() {
        use sinter_cuda::launch::ParamKind;
        let t = LaunchTarget { sm_count: 4 };
        let cfg = AdamW {
            hyper: sinter_types::AdamW {
                lr: 1e-3,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.0,
                step: 1,
            },
            grad_scale: 1.0,
        };
        let slot = |n: usize| AdamSlot {
            param: fake_slice(DType::F32, n),
            grad: fake_slice(DType::F32, n),
            m: fake_slice(DType::F32, n),
            v: fake_slice(DType::F32, n),
            weight_decay: 0.1,
            lr: 1e-3,
            lr_scale: 1.0,
        };
        let mut slots: Vec<AdamSlot> = (0..33).map(|k| slot(10 + k)).collect();
        slots[32] = slot(3 * ADAMW_CHUNK + 1);
        let ls = plan_adamw_multi(&t, &slots, &cfg, None).unwrap();
        assert_eq!(ls.len(), 2);
        assert_eq!((ls[0].args[1], ls[1].args[1]), (Arg::I64(32), Arg::I64(1)));
        assert_eq!(ls[1].grid.0, 4, "one block per chunk of the last slot");
        // CUDA takes at most 4 KiB of kernel parameters (each 8-byte one 8-aligned).
        let bytes = ls[0].args.iter().fold(0usize, |at, a| match a.kind() {
            ParamKind::B64 => at.next_multiple_of(8) + 8,
            ParamKind::B32 | ParamKind::F32 => at + 4,
            ParamKind::Bytes(n) => at.next_multiple_of(8) + n,
        });
        assert!(bytes <= 4096, "{bytes} bytes of parameters");
        assert_eq!(ls[0].args.len(), 2 + 8 * ADAMW_SLOTS);
        // A gradient of another length is refused.
        slots[1].grad = fake_slice(DType::F32, 5);
        assert!(plan_adamw_multi(&t, &slots, &cfg, None).is_err());
    }
}
