//! Wrappers for `kernels/layernorm.cu`: LayerNorm forward (saving mean and rstd) and backward
//! (dx, and dgamma/dbeta reduced deterministically in two passes).

use super::{fake_slice, kname, need, need_float, opt_need, ptr_of, rows_times_n};
use crate::alloc::{DevSlice, Pool};
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{CudaError, Result};
use crate::launch::{
    row_block, rows_grid, Arg, Launch, LaunchTarget, Step, Traffic, ELEMWISE_BLOCK,
};
use crate::nvrtc::KernelFile;

/// Plan y = layernorm(x) * gamma + beta over rows of length n; writes mean/rstd (f32, [rows]) if
/// given.
#[allow(clippy::too_many_arguments)]
pub fn plan_layernorm_forward(
    t: &LaunchTarget,
    x: DevSlice<'_>,
    gamma: Option<DevSlice<'_>>,
    beta: Option<DevSlice<'_>>,
    y: DevSlice<'_>,
    mean: Option<DevSlice<'_>>,
    rstd: Option<DevSlice<'_>>,
    rows: usize,
    n: usize,
    eps: f32,
) -> Result<Option<Launch>> {
    let op = "layernorm_forward";
    let d = x.dtype();
    need_float(op, d)?;
    let total = rows_times_n(op, rows, n)?;
    need(op, "x", &x, d, total)?;
    need(op, "y", &y, d, total)?;
    opt_need(op, "gamma", &gamma, d, n)?;
    opt_need(op, "beta", &beta, d, n)?;
    opt_need(op, "mean", &mean, DType::F32, rows)?;
    opt_need(op, "rstd", &rstd, DType::F32, rows)?;
    if total == 0 {
        return Ok(None);
    }
    let (bx, by) = row_block(n);
    let params = opt_bytes(&gamma) + opt_bytes(&beta);
    Ok(Some(Launch {
        file: KernelFile::LayerNorm,
        name: kname("layernorm_fwd", d),
        grid: (rows_grid(t, rows, by, bx * by), 1, 1),
        block: (bx, by, 1),
        shared_mem: 0,
        traffic: Some(
            Traffic::bytes(
                x.num_bytes() + params,
                y.num_bytes() + opt_bytes(&mean) + opt_bytes(&rstd),
            )
            .with_flops(8 * total),
        ),
        args: vec![
            Arg::Ptr(x.ptr()),
            Arg::Ptr(ptr_of(&gamma)),
            Arg::Ptr(ptr_of(&beta)),
            Arg::Ptr(y.ptr()),
            Arg::Ptr(ptr_of(&mean)),
            Arg::Ptr(ptr_of(&rstd)),
            Arg::I64(rows as i64),
            Arg::I64(n as i64),
            Arg::F32(eps),
        ],
    }))
}

/// Bytes of an optional operand.
fn opt_bytes(s: &Option<DevSlice<'_>>) -> usize {
    s.as_ref().map_or(0, |s| s.num_bytes())
}

/// Row chunks for the dgamma/dbeta partial sums: (chunks, rows per chunk); enough column-block x
/// chunk blocks to fill the GPU, at least 32 rows per chunk, at most 1024 chunks.
pub fn param_chunks(t: &LaunchTarget, rows: usize, n: usize) -> (usize, usize) {
    let col_blocks = n.div_ceil(32).max(1);
    let target = t.sm_count as usize * 8;
    let want = target
        .div_ceil(col_blocks)
        .min(rows.div_ceil(32))
        .clamp(1, 1024);
    let len = rows.div_ceil(want).max(1);
    (rows.div_ceil(len).max(1), len)
}

/// Elements of f32 scratch the backward needs for dgamma and dbeta together.
pub fn backward_scratch_len(t: &LaunchTarget, rows: usize, n: usize) -> usize {
    2 * param_chunks(t, rows, n).0 * n
}

/// Plan the backward. `dx` and (`dgamma`, `dbeta`) are each optional; `scratch` (f32,
/// [`backward_scratch_len`]) is needed when either parameter gradient is requested. With
/// `accumulate` the results are added to the existing contents.
#[allow(clippy::too_many_arguments)]
pub fn plan_layernorm_backward(
    t: &LaunchTarget,
    x: DevSlice<'_>,
    gamma: Option<DevSlice<'_>>,
    gy: DevSlice<'_>,
    mean: DevSlice<'_>,
    rstd: DevSlice<'_>,
    dx: Option<DevSlice<'_>>,
    dgamma: Option<DevSlice<'_>>,
    dbeta: Option<DevSlice<'_>>,
    scratch: Option<DevSlice<'_>>,
    rows: usize,
    n: usize,
    accumulate: bool,
) -> Result<Vec<Step>> {
    let op = "layernorm_backward";
    let d = x.dtype();
    need_float(op, d)?;
    let total = rows_times_n(op, rows, n)?;
    need(op, "x", &x, d, total)?;
    need(op, "gy", &gy, d, total)?;
    opt_need(op, "gamma", &gamma, d, n)?;
    need(op, "mean", &mean, DType::F32, rows)?;
    need(op, "rstd", &rstd, DType::F32, rows)?;
    opt_need(op, "dx", &dx, d, total)?;
    opt_need(op, "dgamma", &dgamma, d, n)?;
    opt_need(op, "dbeta", &dbeta, d, n)?;
    let mut steps = Vec::new();
    if total == 0 {
        return Ok(steps);
    }
    let acc = Arg::I32(accumulate as i32);
    // Accumulating reads each output before adding to it.
    let reread = |b: usize| if accumulate { b } else { 0 };
    let stats = mean.num_bytes() + rstd.num_bytes();
    if let Some(dx) = dx {
        let (bx, by) = row_block(n);
        let read = x.num_bytes() + gy.num_bytes() + stats + opt_bytes(&gamma);
        steps.push(Step::Kernel(Launch {
            file: KernelFile::LayerNorm,
            name: kname("layernorm_bwd_dx", d),
            grid: (rows_grid(t, rows, by, bx * by), 1, 1),
            block: (bx, by, 1),
            shared_mem: 0,
            traffic: Some(
                Traffic::bytes(read + reread(dx.num_bytes()), dx.num_bytes())
                    .with_flops(10 * total),
            ),
            args: vec![
                Arg::Ptr(x.ptr()),
                Arg::Ptr(ptr_of(&gamma)),
                Arg::Ptr(gy.ptr()),
                Arg::Ptr(mean.ptr()),
                Arg::Ptr(rstd.ptr()),
                Arg::Ptr(dx.ptr()),
                Arg::I64(rows as i64),
                Arg::I64(n as i64),
                acc,
            ],
        }));
    }
    if dgamma.is_some() || dbeta.is_some() {
        let (chunks, len) = param_chunks(t, rows, n);
        let scratch =
            scratch.ok_or_else(|| CudaError::invalid(op, "scratch required for dgamma/dbeta"))?;
        need(op, "scratch", &scratch, DType::F32, 2 * chunks * n)?;
        let part_g = scratch.slice(0, chunks * n)?;
        let part_b = scratch.slice(chunks * n, chunks * n)?;
        if chunks > 65535 {
            return Err(CudaError::invalid(op, "too many row chunks"));
        }
        steps.push(Step::Kernel(Launch {
            file: KernelFile::LayerNorm,
            name: kname("layernorm_bwd_params", d),
            grid: (n.div_ceil(32) as u32, chunks as u32, 1),
            block: (32, 8, 1),
            shared_mem: 0,
            traffic: Some(
                Traffic::bytes(x.num_bytes() + gy.num_bytes() + stats, 2 * chunks * n * 4)
                    .with_flops(5 * total),
            ),
            args: vec![
                Arg::Ptr(x.ptr()),
                Arg::Ptr(gy.ptr()),
                Arg::Ptr(mean.ptr()),
                Arg::Ptr(rstd.ptr()),
                Arg::Ptr(part_g.ptr()),
                Arg::Ptr(part_b.ptr()),
                Arg::I64(rows as i64),
                Arg::I64(n as i64),
                Arg::I64(len as i64),
            ],
        }));
        let outs = opt_bytes(&dgamma) + opt_bytes(&dbeta);
        steps.push(Step::Kernel(
            Launch::new(
                KernelFile::LayerNorm,
                kname("layernorm_bwd_finish", d),
                t.grid_for(n, ELEMWISE_BLOCK),
                ELEMWISE_BLOCK,
                vec![
                    Arg::Ptr(part_g.ptr()),
                    Arg::Ptr(part_b.ptr()),
                    Arg::Ptr(ptr_of(&dgamma)),
                    Arg::Ptr(ptr_of(&dbeta)),
                    Arg::I64(chunks as i64),
                    Arg::I64(n as i64),
                    acc,
                ],
            )
            .with_traffic(Traffic::bytes(2 * chunks * n * 4 + reread(outs), outs)),
        ));
    }
    Ok(steps)
}

/// LayerNorm forward on the device.
#[allow(clippy::too_many_arguments)]
pub fn layernorm_forward(
    dev: &CudaDevice,
    x: DevSlice<'_>,
    gamma: Option<DevSlice<'_>>,
    beta: Option<DevSlice<'_>>,
    y: DevSlice<'_>,
    mean: Option<DevSlice<'_>>,
    rstd: Option<DevSlice<'_>>,
    rows: usize,
    n: usize,
    eps: f32,
) -> Result<()> {
    dev.run_opt(plan_layernorm_forward(
        &dev.target(),
        x,
        gamma,
        beta,
        y,
        mean,
        rstd,
        rows,
        n,
        eps,
    )?)
}

/// LayerNorm backward on the device; allocates its scratch from the temporary pool.
#[allow(clippy::too_many_arguments)]
pub fn layernorm_backward(
    dev: &CudaDevice,
    x: DevSlice<'_>,
    gamma: Option<DevSlice<'_>>,
    gy: DevSlice<'_>,
    mean: DevSlice<'_>,
    rstd: DevSlice<'_>,
    dx: Option<DevSlice<'_>>,
    dgamma: Option<DevSlice<'_>>,
    dbeta: Option<DevSlice<'_>>,
    rows: usize,
    n: usize,
    accumulate: bool,
) -> Result<()> {
    let t = dev.target();
    let scratch = if dgamma.is_some() || dbeta.is_some() {
        Some(dev.alloc(
            backward_scratch_len(&t, rows, n),
            DType::F32,
            Pool::Temporary,
        )?)
    } else {
        None
    };
    let steps = plan_layernorm_backward(
        &t,
        x,
        gamma,
        gy,
        mean,
        rstd,
        dx,
        dgamma,
        dbeta,
        scratch.as_ref().map(|s| s.as_slice()),
        rows,
        n,
        accumulate,
    )?;
    dev.run_steps(steps.into_iter())
}

pub(crate) fn samples(t: &LaunchTarget) -> Vec<Launch> {
    let mut v = Vec::new();
    let (rows, n) = (64, 768);
    for d in DType::FLOATS {
        let (x, y) = (fake_slice(d, rows * n), fake_slice(d, rows * n));
        let (g, b) = (fake_slice(d, n), fake_slice(d, n));
        let (m, r) = (fake_slice(DType::F32, rows), fake_slice(DType::F32, rows));
        v.extend(
            plan_layernorm_forward(t, x, Some(g), Some(b), y, Some(m), Some(r), rows, n, 1e-5)
                .unwrap(),
        );
        let s = fake_slice(DType::F32, backward_scratch_len(t, rows, n));
        let steps = plan_layernorm_backward(
            t,
            x,
            Some(g),
            y,
            m,
            r,
            Some(x),
            Some(g),
            Some(b),
            Some(s),
            rows,
            n,
            false,
        )
        .unwrap();
        v.extend(super::kernels_of(steps));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks() {
        let t = LaunchTarget { sm_count: 132 };
        let (c, len) = param_chunks(&t, 16384, 768);
        assert!(c * len >= 16384 && (c - 1) * len < 16384);
        assert!(c * 24 >= 132 * 8 || len == 32, "{c} {len}");
        assert_eq!(param_chunks(&t, 1, 768), (1, 1));
        assert_eq!(param_chunks(&t, 0, 768).0, 1);
    }

    #[test]
    fn backward_needs_scratch_only_for_params() {
        let t = LaunchTarget { sm_count: 8 };
        let d = DType::F32;
        let (x, gy, dx) = (fake_slice(d, 40), fake_slice(d, 40), fake_slice(d, 40));
        let (m, r) = (fake_slice(DType::F32, 4), fake_slice(DType::F32, 4));
        let s = plan_layernorm_backward(
            &t,
            x,
            None,
            gy,
            m,
            r,
            Some(dx),
            None,
            None,
            None,
            4,
            10,
            false,
        )
        .unwrap();
        assert_eq!(s.len(), 1);
        let g = fake_slice(d, 10);
        assert!(plan_layernorm_backward(
            &t,
            x,
            None,
            gy,
            m,
            r,
            Some(dx),
            Some(g),
            None,
            None,
            4,
            10,
            false
        )
        .is_err());
    }
}
