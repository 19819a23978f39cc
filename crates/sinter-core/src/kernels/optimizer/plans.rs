//! The launches of `optimizer.cu`'s kernels as rows of sinter-cuda's kernel table: fused AdamW
//! and SGD over flat f32 buffers, the step control block's two kernels that keep a training
//! step's decisions (skip on inf/NaN, loss scale, clip factor, learning rate, step count) on
//! the device, and the global gradient norm's two. Each `plan_*` checks its operands and makes
//! one call of its row (which declares the traffic for the GPU cost model); the device
//! functions below queue it. The kernel source is compiled by NVRTC at the first launch on a
//! device (the emulated device runs it through the kernel emulator).

use sinter_cuda::check::{need, need_dtype, opt_need};
use sinter_cuda::emulated::cost::OpClass;
use sinter_cuda::launch::{Arg, KernelStruct, LaunchTarget, ELEMWISE_BLOCK};
use sinter_cuda::ops::table::{no_ops, Call, Cost, Grid, Kernel, Slot, Slot::*, Source};
use sinter_cuda::user_kernel::{UserFile, UserLaunch};
use sinter_cuda::{CudaDevice, CudaError, DType, DevSlice, Result};

use super::control::{ctl, ScalerCfg};

/// The CUDA C++ of the folder's kernels (compiled by NVRTC at the first launch on a device).
pub(super) const OPTIMIZER_CU: &str = include_str!("optimizer.cu");

/// `optimizer.cu`, the source of every row below.
pub(super) static OPTIMIZER: UserFile = UserFile::new("optimizer.cu", OPTIMIZER_CU);

/// A row of `optimizer.cu`: every kernel of the file is declared as elementwise work, has no
/// `{op}`, and (unless the row says otherwise) is built for f32 alone; the row gives the rest.
const fn row(name: &'static str, args: &'static [Slot], grid: Grid, traffic: Cost) -> Kernel {
    Kernel {
        source: Source::User(&OPTIMIZER, OpClass::Elementwise),
        name,
        ops: no_ops,
        dtypes: &[DType::F32],
        dtypes2: &[],
        args,
        grid,
        traffic,
    }
}

/// Queues a launch (of `optimizer.cu`) on the device.
fn run(dev: &CudaDevice, l: &UserLaunch) -> Result<()> {
    dev.launch_user(OPTIMIZER.source()?, l)
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

/// `adamw_f32(p, g, m, v, n, AdamArgs)`: one fused AdamW step in place.
pub static ADAMW: Kernel = row(
    "adamw_{d}",
    &[
        InOut("param"),
        In("grad"),
        InOut("m"),
        InOut("v"),
        Items,
        Struct("args", 72),
    ],
    Grid::Packed,
    Cost::Moves { flops: 12 },
);

/// `adamw_copy_{bf16,f16}`: [`ADAMW`] that also writes a half copy of the new parameters. No
/// step uses the copy yet; the tests plan the kernel from this row.
#[cfg(test)]
pub static ADAMW_COPY: Kernel = Kernel {
    dtypes2: &[DType::BF16, DType::F16],
    ..row(
        "adamw_copy_{d2}",
        &[
            InOut("param"),
            In("grad"),
            InOut("m"),
            InOut("v"),
            Out("copy"),
            Items,
            Struct("args", 72),
        ],
        Grid::Packed,
        Cost::Moves { flops: 12 },
    )
};

/// The parameters of `adamw_multi_f32`: the step's `AdamArgs`, the slots in use, then
/// [`ADAMW_SLOTS`] × (param, grad, m, v, n, weight decay bits, lr bits, lr scale).
const fn multi_slots() -> [Slot; 2 + 8 * ADAMW_SLOTS] {
    let mut s = [Items; 2 + 8 * ADAMW_SLOTS];
    s[0] = Struct("args", 72);
    s[1] = I64("count");
    let mut k = 0;
    while k < ADAMW_SLOTS {
        let at = 2 + 8 * k;
        s[at] = InOut("param");
        s[at + 1] = In("grad");
        s[at + 2] = InOut("m");
        s[at + 3] = InOut("v");
        s[at + 4] = I64("n");
        s[at + 5] = U64("weight decay");
        s[at + 6] = U64("lr");
        s[at + 7] = F32("lr scale");
        k += 1;
    }
    s
}
static MULTI_SLOTS: [Slot; 2 + 8 * ADAMW_SLOTS] = multi_slots();

/// `adamw_multi_f32`: AdamW over up to [`ADAMW_SLOTS`] parameters, one block per
/// [`ADAMW_CHUNK`] of each (the call gives the grid); work items are elements.
pub static ADAMW_MULTI: Kernel = row(
    "adamw_multi_{d}",
    &MULTI_SLOTS,
    Grid::Tiled((ELEMWISE_BLOCK, 1, 1)),
    Cost::Moves { flops: 12 },
);

/// `sgd_f32(p, g, buf, n, SgdArgs)`: one SGD step in place (buf 0: no momentum).
pub static SGD: Kernel = row(
    "sgd_{d}",
    &[
        InOut("param"),
        In("grad"),
        Ptr("momentum buffer"),
        Items,
        Struct("args", 48),
    ],
    Grid::PerItem,
    Cost::Estimated,
);

/// `step_prepare(ctl, sumsq, max_norm, dynamic)`: one thread.
pub static STEP_PREPARE: Kernel = row(
    "step_prepare",
    &[InOut("ctl"), In("sumsq"), F32("max_norm"), I32("dynamic")],
    Grid::OneBlock(32),
    Cost::Estimated,
);

/// `step_finish(ctl, lr_table, n_lr, growth, backoff, interval, dynamic)`: one thread.
pub static STEP_FINISH: Kernel = row(
    "step_finish",
    &[
        InOut("ctl"),
        In("lr table"),
        I64("lr table entries"),
        F32("growth"),
        F32("backoff"),
        F32("interval"),
        I32("dynamic"),
    ],
    Grid::OneBlock(32),
    Cost::Estimated,
);

/// The parameters of `sumsq_multi_*`: the partial sums, the slots in use, then
/// [`SUMSQ_SLOTS`] × (x, n).
const fn sumsq_slots() -> [Slot; 2 + 2 * SUMSQ_SLOTS] {
    let mut s = [Items; 2 + 2 * SUMSQ_SLOTS];
    s[0] = Out("partial");
    s[1] = I64("count");
    let mut k = 0;
    while k < SUMSQ_SLOTS {
        s[2 + 2 * k] = In("x");
        s[3 + 2 * k] = I64("n");
        k += 1;
    }
    s
}
static SUMSQ_SLOT_LIST: [Slot; 2 + 2 * SUMSQ_SLOTS] = sumsq_slots();

/// `sumsq_multi_{d}`: the partial sums of x² of up to [`SUMSQ_SLOTS`] tensors, [`sumsq_blocks`]
/// blocks each (the call gives the grid; work items are the blocks).
pub static SUMSQ_MULTI: Kernel = Kernel {
    dtypes: &[DType::F32, DType::F16, DType::BF16],
    ..row(
        "sumsq_multi_{d}",
        &SUMSQ_SLOT_LIST,
        Grid::Tiled((SUMSQ_BLOCK, 1, 1)),
        Cost::Scan { flops: 2 },
    )
};

/// `sumsq_finish(partial, count, out, accumulate)`: the partial sums added in a fixed order by
/// one block.
pub static SUMSQ_FINISH: Kernel = row(
    "sumsq_finish",
    &[In("partial"), Items, Out("out"), I32("accumulate")],
    Grid::OneBlock(1024),
    Cost::Reduce,
);

/// Every row of `optimizer.cu` (the NVRTC test checks one sample of each kernel against the PTX).
#[cfg(test)]
pub(super) static KERNELS: [&Kernel; 8] = [
    &ADAMW,
    &ADAMW_COPY,
    &ADAMW_MULTI,
    &SGD,
    &STEP_PREPARE,
    &STEP_FINISH,
    &SUMSQ_MULTI,
    &SUMSQ_FINISH,
];

/// A slot of a multi-tensor launch left empty (the kernel reads nothing through it).
fn absent() -> DevSlice<'static> {
    // SAFETY: zero elements at address 0: never dereferenced (the kernel skips the slot).
    unsafe { DevSlice::from_raw(0, 0, DType::F32) }
}

/// Plan one fused AdamW step on flat f32 (param, grad, m, v).
pub fn plan_adamw(
    t: &LaunchTarget,
    param: DevSlice<'_>,
    grad: DevSlice<'_>,
    m: DevSlice<'_>,
    v: DevSlice<'_>,
    cfg: &AdamW,
) -> Result<Option<UserLaunch>> {
    plan_adamw_impl(t, [param, grad, m, v], cfg.args(0)?)
}

/// [`plan_adamw`] driven by the step control block `ctl` ([`ctl::LEN`] f32): skipped when
/// `ctl[FOUND_INF] != 0`; lr, step number and a gradient factor come from the block
/// (`cfg.lr` and `cfg.step` are ignored, `cfg.step` must still be ≥ 1).
pub fn plan_adamw_ctl(
    t: &LaunchTarget,
    param: DevSlice<'_>,
    grad: DevSlice<'_>,
    m: DevSlice<'_>,
    v: DevSlice<'_>,
    cfg: &AdamW,
    ctl: DevSlice<'_>,
) -> Result<Option<UserLaunch>> {
    need("adamw", "step control", &ctl, DType::F32, ctl::LEN)?;
    let a = ctl_args(cfg, ctl)?;
    plan_adamw_impl(t, [param, grad, m, v], a)
}

/// The kernel arguments of a step driven by the control block `ctl`.
pub(super) fn ctl_args(cfg: &AdamW, ctl: DevSlice<'_>) -> Result<AdamArgs> {
    let flag = ctl.slice(ctl::FOUND_INF, 1)?;
    Ok(AdamArgs {
        ctl: ctl.ptr(),
        ..cfg.args(flag.ptr())?
    })
}

fn plan_adamw_impl(
    t: &LaunchTarget,
    operands: [DevSlice<'_>; 4],
    a: AdamArgs,
) -> Result<Option<UserLaunch>> {
    let n = operands[0].len();
    for (w, s) in ["param", "grad", "m", "v"].iter().zip(&operands) {
        need("adamw", w, s, DType::F32, n)?;
    }
    let scalars = [Arg::bytes(&a)];
    let call = Call::new(DType::F32, n, &operands).scalars(&scalars);
    ADAMW.plan_user(t, &call)
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
    let a = match ctl {
        Some(c) => ctl_args(cfg, c)?,
        None => cfg.args(0)?,
    };
    let mut out = Vec::new();
    for group in slots.chunks(ADAMW_SLOTS) {
        let mut operands = Vec::with_capacity(4 * ADAMW_SLOTS);
        let mut scalars = vec![Arg::bytes(&a), Arg::I64(group.len() as i64)];
        let (mut chunks, mut elems) = (0, 0);
        for k in 0..ADAMW_SLOTS {
            let Some(s) = group.get(k) else {
                operands.extend([absent(); 4]);
                scalars.extend([Arg::I64(0), Arg::U64(0), Arg::U64(0), Arg::F32(0.0)]);
                continue;
            };
            let n = s.param.len();
            let xs = [s.param, s.grad, s.m, s.v];
            for (w, x) in ["param", "grad", "m", "v"].iter().zip(&xs) {
                need(op, w, x, DType::F32, n)?;
            }
            chunks += n.div_ceil(ADAMW_CHUNK);
            elems += n;
            operands.extend(xs);
            scalars.extend([
                Arg::I64(n as i64),
                Arg::U64(s.weight_decay.to_bits()),
                Arg::U64(s.lr.to_bits()),
                Arg::F32(s.lr_scale),
            ]);
        }
        let grid = chunks.min(t.max_blocks(ELEMWISE_BLOCK) as usize) as u32;
        let call = Call::new(DType::F32, elems, &operands)
            .scalars(&scalars)
            .tiles((grid, 1, 1));
        out.extend(ADAMW_MULTI.plan_user(t, &call)?);
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
) -> Result<Option<UserLaunch>> {
    plan_sgd_impl(t, param, grad, buf, cfg.args(0))
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
    let a = SgdArgs {
        ctl: ctl.ptr(),
        ..cfg.args(flag.ptr())
    };
    plan_sgd_impl(t, param, grad, buf, a)
}

fn plan_sgd_impl(
    t: &LaunchTarget,
    param: DevSlice<'_>,
    grad: DevSlice<'_>,
    buf: Option<DevSlice<'_>>,
    a: SgdArgs,
) -> Result<Option<UserLaunch>> {
    let n = param.len();
    need("sgd", "param", &param, DType::F32, n)?;
    need("sgd", "grad", &grad, DType::F32, n)?;
    opt_need("sgd", "momentum buffer", &buf, DType::F32, n)?;
    if a.momentum != 0.0 && buf.is_none() {
        return Err(CudaError::invalid("sgd", "momentum needs a buffer"));
    }
    let scalars = [Arg::Ptr(buf.map_or(0, |b| b.ptr())), Arg::bytes(&a)];
    let operands = [param, grad];
    let call = Call::new(DType::F32, n, &operands).scalars(&scalars);
    SGD.plan_user(t, &call)
}

/// The launch of a one-thread row's call (of one work item: never none).
fn one(row: &Kernel, t: &LaunchTarget, call: Call<'_>) -> Result<UserLaunch> {
    let l = row.plan_user(t, &call)?;
    l.ok_or_else(|| CudaError::invalid(row.name, "a one-thread call without its work item"))
}

/// Plan `step_prepare`: from `sumsq` (1 f32, the squared global norm of the loss-scaled
/// gradients) set found_inf (when `dynamic`), the norm and the gradient factor in `ctl`.
/// `max_norm` ≤ 0 means no clipping.
pub fn plan_step_prepare(
    t: &LaunchTarget,
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
    let scalars = [Arg::F32(max_norm), Arg::I32(dynamic as i32)];
    let operands = [ctl, sumsq];
    one(
        &STEP_PREPARE,
        t,
        Call::new(DType::F32, 1, &operands).scalars(&scalars),
    )
}

/// Plan `step_finish`: update the loss scale (when `scaler` is given), the step and schedule
/// counters, and load the next learning rate from `lr_table` (f32, at least one entry).
pub fn plan_step_finish(
    t: &LaunchTarget,
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
    let scalars = [
        Arg::I64(lr_table.len() as i64),
        Arg::F32(s.growth),
        Arg::F32(s.backoff),
        Arg::F32(s.interval as f32),
        Arg::I32(scaler.is_some() as i32),
    ];
    let operands = [ctl, lr_table];
    one(
        &STEP_FINISH,
        t,
        Call::new(DType::F32, 1, &operands).scalars(&scalars),
    )
}

/// Tensors one `sumsq_multi` launch reads (`SUMSQ_SLOTS` in optimizer.cu: 192 (pointer, length)
/// pairs are 3 KiB of the 4 KiB of kernel parameters).
pub const SUMSQ_SLOTS: usize = 192;
// A full launch's parameters fit CUDA's 4 KiB: (partial, count) and 8-byte (x, n) pairs.
const _: () = assert!((2 + 2 * SUMSQ_SLOTS) * 8 <= 4096);

/// Threads per block of the grad-norm kernels.
const SUMSQ_BLOCK: u32 = ELEMWISE_BLOCK;

/// Blocks (= partial sums) a tensor of `n` elements gets; from n only, so the result is the same
/// on every GPU (`sumsq_blocks` in optimizer.cu).
pub fn sumsq_blocks(n: usize) -> usize {
    n.div_ceil(SUMSQ_BLOCK as usize * 16).clamp(1, 1024)
}

/// Plan Σ x² over `xs` (float, one device) into `out` (1 f32): one `sumsq_multi` launch per run
/// of up to [`SUMSQ_SLOTS`] tensors of one dtype writing its partial sums into `partial` (f32,
/// [`sumsq_blocks`] per tensor, in tensor order), then one fixed-order finish.
pub fn plan_sum_squares(
    t: &LaunchTarget,
    xs: &[DevSlice<'_>],
    partial: DevSlice<'_>,
    out: DevSlice<'_>,
) -> Result<Vec<UserLaunch>> {
    let op = "grad_sum_squares";
    let total: usize = xs.iter().map(|x| sumsq_blocks(x.len())).sum();
    need(op, "partial sums", &partial, DType::F32, total)?;
    need(op, "out", &out, DType::F32, 1)?;
    let mut launches = Vec::new();
    let mut at = 0;
    let mut rest = xs;
    while let Some(x0) = rest.first() {
        let dtype = x0.dtype();
        let run = rest
            .iter()
            .take(SUMSQ_SLOTS)
            .take_while(|x| x.dtype() == dtype)
            .count();
        let (group, next) = rest.split_at(run);
        rest = next;
        let blocks: usize = group.iter().map(|x| sumsq_blocks(x.len())).sum();
        let mut operands = vec![partial.slice(at, blocks)?];
        let mut scalars = vec![Arg::I64(run as i64)];
        for k in 0..SUMSQ_SLOTS {
            let (x, n) = match group.get(k) {
                Some(&x) => (x, x.len() as i64),
                None => (absent(), 0),
            };
            operands.push(x);
            scalars.push(Arg::I64(n));
        }
        // The partial sums are always written (an empty tensor's is 0): one work item a block.
        let call = Call::new(dtype, blocks, &operands)
            .scalars(&scalars)
            .tiles((blocks as u32, 1, 1));
        launches.extend(SUMSQ_MULTI.plan_user(t, &call)?);
        at += blocks;
    }
    let operands = [partial, out];
    let scalars = [Arg::I32(0)];
    let call = Call::new(DType::F32, total, &operands).scalars(&scalars);
    launches.extend(SUMSQ_FINISH.plan_user(t, &call)?);
    Ok(launches)
}

/// One fused AdamW step on the device.
pub fn adamw(
    dev: &CudaDevice,
    param: DevSlice<'_>,
    grad: DevSlice<'_>,
    m: DevSlice<'_>,
    v: DevSlice<'_>,
    cfg: &AdamW,
) -> Result<()> {
    let l = plan_adamw(&dev.target(), param, grad, m, v, cfg)?;
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
    cfg: &AdamW,
    ctl: DevSlice<'_>,
) -> Result<()> {
    let l = plan_adamw_ctl(&dev.target(), param, grad, m, v, cfg, ctl)?;
    l.map_or(Ok(()), |l| run(dev, &l))
}

/// One SGD step on the device.
pub fn sgd(
    dev: &CudaDevice,
    param: DevSlice<'_>,
    grad: DevSlice<'_>,
    buf: Option<DevSlice<'_>>,
    cfg: &Sgd,
) -> Result<()> {
    let l = plan_sgd(&dev.target(), param, grad, buf, cfg)?;
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
    run(
        dev,
        &plan_step_prepare(&dev.target(), ctl, sumsq, max_norm, dynamic)?,
    )
}

/// `step_finish` on the device (see [`plan_step_finish`]).
pub fn step_finish(
    dev: &CudaDevice,
    ctl: DevSlice<'_>,
    lr_table: DevSlice<'_>,
    scaler: Option<ScalerCfg>,
) -> Result<()> {
    run(
        dev,
        &plan_step_finish(&dev.target(), ctl, lr_table, scaler)?,
    )
}

/// Σ x² on the device (see [`plan_sum_squares`]).
pub fn sum_squares(
    dev: &CudaDevice,
    xs: &[DevSlice<'_>],
    partial: DevSlice<'_>,
    out: DevSlice<'_>,
) -> Result<()> {
    for l in plan_sum_squares(&dev.target(), xs, partial, out)? {
        run(dev, &l)?;
    }
    Ok(())
}

/// One sample launch of every kernel of the source, with fake pointers (for the NVRTC check).
#[cfg(test)]
pub(super) fn samples(t: &LaunchTarget) -> Vec<UserLaunch> {
    KERNELS.iter().flat_map(|k| k.user_samples(t)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sinter_cuda::ops::fake_slice;

    #[test]
    fn sumsq_partition_and_slots_match_the_kernel() {
        assert_eq!(sumsq_blocks(0), 1);
        assert_eq!(sumsq_blocks(4096), 1);
        assert_eq!(sumsq_blocks(4097), 2);
        assert_eq!(sumsq_blocks(1 << 30), 1024);
        // The host's slot count and block span are the kernel's.
        assert!(OPTIMIZER_CU.contains(&format!("#define SUMSQ_SLOTS {SUMSQ_SLOTS}\n")));
        assert_eq!(SUMSQ_BLOCK, 256);
        assert!(OPTIMIZER_CU.contains("#define SUMSQ_PER_THREAD 16\n"));
    }

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
        let l = plan_adamw_ctl(&t, f(), f(), f(), f(), &cfg, c)
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
        assert!(plan_adamw_ctl(&t, f(), f(), f(), f(), &cfg, short).is_err());
        assert!(plan_step_prepare(&t, short, fake_slice(DType::F32, 1), 1.0, true).is_err());
        let p = plan_step_prepare(&t, c, fake_slice(DType::F32, 1), 0.0, false).unwrap();
        assert_eq!(p.args[3], Arg::I32(0));
        let bad = ScalerCfg {
            growth: 0.5,
            backoff: 0.5,
            interval: 10,
        };
        assert!(plan_step_finish(&t, c, fake_slice(DType::F32, 3), Some(bad)).is_err());
        assert!(plan_step_finish(&t, c, fake_slice(DType::F32, 0), None).is_err());
        let fin = plan_step_finish(&t, c, fake_slice(DType::F32, 3), None).unwrap();
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
