//! Wrappers for `kernels/softmax.cu`: softmax / log-softmax over the last dim, forward and backward.

use super::{fake_slice, need, need_float, rows_times_n};
use crate::alloc::DevSlice;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::Result;
use crate::launch::{row_block, rows_grid, Arg, Launch, LaunchTarget, Traffic};
use crate::nvrtc::KernelFile;

fn plan(
    t: &LaunchTarget,
    name: String,
    ins: &[DevSlice<'_>],
    out: DevSlice<'_>,
    rows: usize,
    n: usize,
    scale: f32,
) -> Result<Option<Launch>> {
    let d = out.dtype();
    need_float("softmax", d)?;
    let total = rows_times_n("softmax", rows, n)?;
    for s in ins {
        need("softmax", "input", s, d, total)?;
    }
    need("softmax", "output", &out, d, total)?;
    if total == 0 {
        return Ok(None);
    }
    let (bx, by) = row_block(n);
    let mut args: Vec<Arg> = ins.iter().map(|s| Arg::Ptr(s.ptr())).collect();
    args.extend([
        Arg::Ptr(out.ptr()),
        Arg::I64(rows as i64),
        Arg::I64(n as i64),
        Arg::F32(scale),
    ]);
    Ok(Some(Launch {
        file: KernelFile::Softmax,
        name,
        grid: (rows_grid(t, rows, by, bx * by), 1, 1),
        block: (bx, by, 1),
        shared_mem: 0,
        traffic: Some(
            Traffic::bytes(ins.iter().map(|s| s.num_bytes()).sum(), out.num_bytes())
                .with_flops(5 * total),
        ),
        args,
    }))
}

/// Plan y = softmax(scale * x) (or log_softmax) over rows of length n.
pub fn plan_softmax(
    t: &LaunchTarget,
    log: bool,
    x: DevSlice<'_>,
    y: DevSlice<'_>,
    rows: usize,
    n: usize,
    scale: f32,
) -> Result<Option<Launch>> {
    let base = if log { "log_softmax" } else { "softmax" };
    plan(
        t,
        format!("{base}_{}", x.dtype().suffix()),
        &[x],
        y,
        rows,
        n,
        scale,
    )
}

/// Plan the backward from the forward output y and upstream gy.
#[allow(clippy::too_many_arguments)]
pub fn plan_softmax_backward(
    t: &LaunchTarget,
    log: bool,
    y: DevSlice<'_>,
    gy: DevSlice<'_>,
    gx: DevSlice<'_>,
    rows: usize,
    n: usize,
    scale: f32,
) -> Result<Option<Launch>> {
    let base = if log {
        "log_softmax_bwd"
    } else {
        "softmax_bwd"
    };
    plan(
        t,
        format!("{base}_{}", y.dtype().suffix()),
        &[y, gy],
        gx,
        rows,
        n,
        scale,
    )
}

/// y = softmax(scale * x) over the last dim (`log` for log-softmax). y may alias x.
pub fn softmax(
    dev: &CudaDevice,
    log: bool,
    x: DevSlice<'_>,
    y: DevSlice<'_>,
    rows: usize,
    n: usize,
    scale: f32,
) -> Result<()> {
    dev.run_opt(plan_softmax(&dev.target(), log, x, y, rows, n, scale)?)
}

/// gx from y = softmax(scale * x) (or log-softmax) and gy.
#[allow(clippy::too_many_arguments)]
pub fn softmax_backward(
    dev: &CudaDevice,
    log: bool,
    y: DevSlice<'_>,
    gy: DevSlice<'_>,
    gx: DevSlice<'_>,
    rows: usize,
    n: usize,
    scale: f32,
) -> Result<()> {
    dev.run_opt(plan_softmax_backward(
        &dev.target(),
        log,
        y,
        gy,
        gx,
        rows,
        n,
        scale,
    )?)
}

pub(crate) fn samples(t: &LaunchTarget) -> Vec<Launch> {
    let mut v = Vec::new();
    for d in DType::FLOATS {
        let (a, b, c) = (
            fake_slice(d, 3 * 77),
            fake_slice(d, 3 * 77),
            fake_slice(d, 3 * 77),
        );
        for log in [false, true] {
            v.extend(plan_softmax(t, log, a, b, 3, 77, 1.0).unwrap());
            v.extend(plan_softmax_backward(t, log, a, b, c, 3, 77, 1.0).unwrap());
        }
    }
    v
}
