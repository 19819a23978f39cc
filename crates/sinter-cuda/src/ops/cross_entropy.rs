//! Wrappers for `kernels/cross_entropy.cu`: fused log-softmax + NLL with ignore_index.

use super::{fake_slice, kname, need, need_float, opt_need, ptr_of, rows_times_n};
use crate::alloc::DevSlice;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::Result;
use crate::launch::{row_block, rows_grid, Arg, Launch, LaunchTarget, Traffic};
use crate::nvrtc::KernelFile;

/// How the upstream gradient of the per-row losses is given to the backward.
#[derive(Clone, Copy, Debug)]
pub enum LossGrad<'a> {
    /// Every row's loss gets gradient 1 (times `scale`).
    One,
    /// One device scalar (f32) for all rows: reductions "mean" / "sum".
    Scalar(DevSlice<'a>),
    /// One f32 per row: reduction "none".
    PerRow(DevSlice<'a>),
}

/// How many f32 statistics the forward saves per row for the backward: the row's max, then
/// ln Σ exp(x - max) (kept apart: their f32 sum rounds at the max's scale).
pub const STATS_PER_ROW: usize = 2;

/// Plan loss[r] = logsumexp(logits[r]) - logits[r, target[r]] (0 if ignored), saving the
/// row's statistics in stats[2r..2r + 2] = (max, ln Σ exp(x - max)).
#[allow(clippy::too_many_arguments)]
pub fn plan_cross_entropy_forward(
    t: &LaunchTarget,
    logits: DevSlice<'_>,
    target: DevSlice<'_>,
    loss: DevSlice<'_>,
    stats: Option<DevSlice<'_>>,
    rows: usize,
    n: usize,
    ignore_index: i64,
) -> Result<Option<Launch>> {
    let op = "cross_entropy_forward";
    let d = logits.dtype();
    need_float(op, d)?;
    need(op, "logits", &logits, d, rows_times_n(op, rows, n)?)?;
    need(op, "target", &target, DType::I64, rows)?;
    need(op, "loss", &loss, DType::F32, rows)?;
    opt_need(op, "stats", &stats, DType::F32, rows * STATS_PER_ROW)?;
    if rows == 0 {
        return Ok(None);
    }
    let (bx, by) = row_block(n);
    Ok(Some(Launch {
        file: KernelFile::CrossEntropy,
        name: kname("cross_entropy_fwd", d),
        grid: (rows_grid(t, rows, by, bx * by), 1, 1),
        block: (bx, by, 1),
        shared_mem: 0,
        traffic: Some(
            Traffic::bytes(
                logits.num_bytes() + target.num_bytes(),
                loss.num_bytes() + stats.as_ref().map_or(0, |s| s.num_bytes()),
            )
            .with_flops(4 * rows * n),
        ),
        args: vec![
            Arg::Ptr(logits.ptr()),
            Arg::Ptr(target.ptr()),
            Arg::Ptr(loss.ptr()),
            Arg::Ptr(ptr_of(&stats)),
            Arg::I64(rows as i64),
            Arg::I64(n as i64),
            Arg::I64(ignore_index),
        ],
    }))
}

/// Plan dlogits = (softmax(logits) - onehot(target)) * dloss * scale (0 for ignored rows).
#[allow(clippy::too_many_arguments)]
pub fn plan_cross_entropy_backward(
    t: &LaunchTarget,
    logits: DevSlice<'_>,
    target: DevSlice<'_>,
    stats: DevSlice<'_>,
    dloss: LossGrad<'_>,
    dlogits: DevSlice<'_>,
    rows: usize,
    n: usize,
    ignore_index: i64,
    scale: f32,
) -> Result<Option<Launch>> {
    let op = "cross_entropy_backward";
    let d = logits.dtype();
    need_float(op, d)?;
    let total = rows_times_n(op, rows, n)?;
    need(op, "logits", &logits, d, total)?;
    need(op, "dlogits", &dlogits, d, total)?;
    need(op, "target", &target, DType::I64, rows)?;
    need(op, "stats", &stats, DType::F32, rows * STATS_PER_ROW)?;
    let (dptr, dstride) = match dloss {
        LossGrad::One => (0, 0),
        LossGrad::Scalar(s) => {
            need(op, "dloss", &s, DType::F32, 1)?;
            (s.ptr(), 0)
        }
        LossGrad::PerRow(s) => {
            need(op, "dloss", &s, DType::F32, rows)?;
            (s.ptr(), 1)
        }
    };
    if total == 0 {
        return Ok(None);
    }
    let (bx, by) = row_block(n);
    Ok(Some(Launch {
        file: KernelFile::CrossEntropy,
        name: kname("cross_entropy_bwd", d),
        grid: (rows_grid(t, rows, by, bx * by), 1, 1),
        block: (bx, by, 1),
        shared_mem: 0,
        traffic: Some(
            Traffic::bytes(
                logits.num_bytes() + target.num_bytes() + stats.num_bytes(),
                dlogits.num_bytes(),
            )
            .with_flops(4 * total),
        ),
        args: vec![
            Arg::Ptr(logits.ptr()),
            Arg::Ptr(target.ptr()),
            Arg::Ptr(stats.ptr()),
            Arg::Ptr(dptr),
            Arg::Ptr(dlogits.ptr()),
            Arg::I64(rows as i64),
            Arg::I64(n as i64),
            Arg::I64(ignore_index),
            Arg::I64(dstride),
            Arg::F32(scale),
        ],
    }))
}

/// Plan count[0] = number of targets != ignore_index (f32, exact below 2^24).
pub fn plan_count_valid(
    target: DevSlice<'_>,
    count: DevSlice<'_>,
    ignore_index: i64,
) -> Result<Launch> {
    need("count_valid", "target", &target, DType::I64, target.len())?;
    need("count_valid", "count", &count, DType::F32, 1)?;
    Ok(Launch::new(
        KernelFile::CrossEntropy,
        "ce_count_valid",
        1,
        1024,
        vec![
            Arg::Ptr(target.ptr()),
            Arg::Ptr(count.ptr()),
            Arg::I64(target.len() as i64),
            Arg::I64(ignore_index),
        ],
    ))
}

/// Forward on the device.
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_forward(
    dev: &CudaDevice,
    logits: DevSlice<'_>,
    target: DevSlice<'_>,
    loss: DevSlice<'_>,
    stats: Option<DevSlice<'_>>,
    rows: usize,
    n: usize,
    ignore_index: i64,
) -> Result<()> {
    dev.run_opt(plan_cross_entropy_forward(
        &dev.target(),
        logits,
        target,
        loss,
        stats,
        rows,
        n,
        ignore_index,
    )?)
}

/// Backward on the device.
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_backward(
    dev: &CudaDevice,
    logits: DevSlice<'_>,
    target: DevSlice<'_>,
    stats: DevSlice<'_>,
    dloss: LossGrad<'_>,
    dlogits: DevSlice<'_>,
    rows: usize,
    n: usize,
    ignore_index: i64,
    scale: f32,
) -> Result<()> {
    dev.run_opt(plan_cross_entropy_backward(
        &dev.target(),
        logits,
        target,
        stats,
        dloss,
        dlogits,
        rows,
        n,
        ignore_index,
        scale,
    )?)
}

/// count[0] = number of non-ignored targets (for a mean over valid rows).
pub fn count_valid(
    dev: &CudaDevice,
    target: DevSlice<'_>,
    count: DevSlice<'_>,
    ignore_index: i64,
) -> Result<()> {
    if target.is_empty() {
        return super::unary::fill(dev, count, 0.0);
    }
    dev.launch(&plan_count_valid(target, count, ignore_index)?)
}

pub(crate) fn samples(t: &LaunchTarget) -> Vec<Launch> {
    let mut v = Vec::new();
    let (rows, n) = (8, 50257);
    let tg = fake_slice(DType::I64, rows);
    let loss = fake_slice(DType::F32, rows);
    let stats = fake_slice(DType::F32, rows * STATS_PER_ROW);
    for d in DType::FLOATS {
        let (x, g) = (fake_slice(d, rows * n), fake_slice(d, rows * n));
        v.extend(plan_cross_entropy_forward(t, x, tg, loss, Some(stats), rows, n, -100).unwrap());
        v.extend(
            plan_cross_entropy_backward(
                t,
                x,
                tg,
                stats,
                LossGrad::PerRow(loss),
                g,
                rows,
                n,
                -100,
                1.0,
            )
            .unwrap(),
        );
    }
    v.push(plan_count_valid(tg, fake_slice(DType::F32, 1), -100).unwrap());
    v
}
