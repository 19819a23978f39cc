//! Wrappers for `kernels/reduce.cu`: sum (mean via `scale`) and max/min with arg-index, over the
//! last dim of `[rows, n]` or the middle dim of `[outer, n, inner]`.

use super::{fake_slice, kname, need, need_float, opt_need, ptr_of, rows_times_n};
use crate::alloc::{DevSlice, Pool};
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{CudaError, Result};
use crate::launch::{
    row_block, rows_grid, Arg, Launch, LaunchTarget, Step, Traffic, ELEMWISE_BLOCK,
};
use crate::nvrtc::KernelFile;

/// Max or min.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgReduce {
    Max,
    Min,
}

impl ArgReduce {
    fn base(self) -> &'static str {
        match self {
            ArgReduce::Max => "max",
            ArgReduce::Min => "min",
        }
    }
}

fn row_launch(
    t: &LaunchTarget,
    file: KernelFile,
    name: String,
    rows: usize,
    n: usize,
    args: Vec<Arg>,
) -> Launch {
    let (bx, by) = row_block(n);
    Launch {
        file,
        name,
        grid: (rows_grid(t, rows, by, bx * by), 1, 1),
        block: (bx, by, 1),
        shared_mem: 0,
        traffic: None,
        args,
    }
}

/// Plan out[r] = scale * Σ_j x[r, j].
pub fn plan_sum_last(
    t: &LaunchTarget,
    x: DevSlice<'_>,
    out: DevSlice<'_>,
    rows: usize,
    n: usize,
    scale: f32,
) -> Result<Option<Launch>> {
    let d = x.dtype();
    need_float("sum_last", d)?;
    need("sum_last", "x", &x, d, rows_times_n("sum_last", rows, n)?)?;
    need("sum_last", "out", &out, d, rows)?;
    if rows == 0 {
        return Ok(None);
    }
    Ok(Some(
        row_launch(
            t,
            KernelFile::Reduce,
            kname("sum_last", d),
            rows,
            n,
            vec![
                Arg::Ptr(x.ptr()),
                Arg::Ptr(out.ptr()),
                Arg::I64(rows as i64),
                Arg::I64(n as i64),
                Arg::F32(scale),
            ],
        )
        .with_traffic(Traffic::bytes(x.num_bytes(), out.num_bytes()).with_flops(rows * n)),
    ))
}

/// Plan out[r] = max_j (or min_j) x[r, j], idx[r] = its first index (idx optional, i64).
pub fn plan_arg_last(
    t: &LaunchTarget,
    which: ArgReduce,
    x: DevSlice<'_>,
    out: DevSlice<'_>,
    idx: Option<DevSlice<'_>>,
    rows: usize,
    n: usize,
) -> Result<Option<Launch>> {
    let d = x.dtype();
    need_float("max_last", d)?;
    need("max_last", "x", &x, d, rows_times_n("max_last", rows, n)?)?;
    need("max_last", "out", &out, d, rows)?;
    opt_need("max_last", "idx", &idx, DType::I64, rows)?;
    if n == 0 && rows > 0 {
        return Err(CudaError::invalid("max_last", "max over an empty dim"));
    }
    if rows == 0 {
        return Ok(None);
    }
    Ok(Some(row_launch(
        t,
        KernelFile::Reduce,
        format!("{}_last_{}", which.base(), d.suffix()),
        rows,
        n,
        vec![
            Arg::Ptr(x.ptr()),
            Arg::Ptr(out.ptr()),
            Arg::Ptr(ptr_of(&idx)),
            Arg::I64(rows as i64),
            Arg::I64(n as i64),
        ],
    )))
}

/// How to split the middle dim: (chunks, rows per chunk). One chunk when the (outer, inner)
/// blocks alone fill the GPU; otherwise up to 64 chunks, at least 32 rows each.
pub fn mid_chunks(t: &LaunchTarget, outer: usize, n: usize, inner: usize) -> (usize, usize) {
    let blocks = inner.div_ceil(32) * outer.min(65535);
    let target = t.sm_count as usize * 8;
    if blocks >= target || n < 64 {
        return (1, n.max(1));
    }
    let want = target
        .div_ceil(blocks.max(1))
        .min(n.div_ceil(32))
        .clamp(1, 64);
    let len = n.div_ceil(want);
    (n.div_ceil(len), len)
}

/// Elements of the f32 scratch [`plan_sum_mid`] needs (0 = none).
pub fn sum_mid_scratch_len(t: &LaunchTarget, outer: usize, n: usize, inner: usize) -> usize {
    let (chunks, _) = mid_chunks(t, outer, n, inner);
    if inner == 1 || chunks == 1 {
        0
    } else {
        chunks * outer * inner
    }
}

/// Plan out[o, i] = scale * Σ_j x[o, j, i]. `part` must be an f32 scratch of
/// [`sum_mid_scratch_len`] elements when that is non-zero.
#[allow(clippy::too_many_arguments)]
pub fn plan_sum_mid(
    t: &LaunchTarget,
    x: DevSlice<'_>,
    out: DevSlice<'_>,
    part: Option<DevSlice<'_>>,
    outer: usize,
    n: usize,
    inner: usize,
    scale: f32,
) -> Result<Vec<Step>> {
    let d = x.dtype();
    need_float("sum_mid", d)?;
    let oi = rows_times_n("sum_mid", outer, inner)?;
    need("sum_mid", "x", &x, d, rows_times_n("sum_mid", oi, n)?)?;
    need("sum_mid", "out", &out, d, oi)?;
    if oi == 0 {
        return Ok(vec![]);
    }
    if inner == 1 {
        return Ok(super::steps(plan_sum_last(t, x, out, outer, n, scale)?));
    }
    let (chunks, len) = mid_chunks(t, outer, n, inner);
    let block = (32, 8, 1);
    let gx = inner.div_ceil(32) as u32;
    let gy = outer.min(65535) as u32;
    let common = |xp: u64, op: u64, o: usize, nn: usize, i: usize, c: usize, s: f32| {
        vec![
            Arg::Ptr(xp),
            Arg::Ptr(op),
            Arg::I64(o as i64),
            Arg::I64(nn as i64),
            Arg::I64(i as i64),
            Arg::I64(c as i64),
            Arg::F32(s),
        ]
    };
    if chunks == 1 {
        return Ok(vec![Step::Kernel(Launch {
            file: KernelFile::Reduce,
            name: kname("sum_mid", d),
            grid: (gx, gy, 1),
            block,
            shared_mem: 0,
            traffic: Some(Traffic::bytes(x.num_bytes(), out.num_bytes()).with_flops(oi * n)),
            args: common(x.ptr(), out.ptr(), outer, n, inner, n, scale),
        })]);
    }
    let part = part.ok_or_else(|| CudaError::invalid("sum_mid", "scratch required"))?;
    need("sum_mid", "scratch", &part, DType::F32, chunks * oi)?;
    Ok(vec![
        Step::Kernel(Launch {
            file: KernelFile::Reduce,
            name: kname("sum_mid_partial", d),
            grid: (gx, gy, chunks as u32),
            block,
            shared_mem: 0,
            traffic: Some(Traffic::bytes(x.num_bytes(), chunks * oi * 4).with_flops(oi * n)),
            args: common(x.ptr(), part.ptr(), outer, n, inner, len, 1.0),
        }),
        Step::Kernel(Launch {
            file: KernelFile::Reduce,
            name: kname("sum_mid_finish", d),
            grid: (oi.div_ceil(32) as u32, 1, 1),
            block,
            shared_mem: 0,
            traffic: Some(Traffic::bytes(chunks * oi * 4, out.num_bytes()).with_flops(oi * chunks)),
            args: common(part.ptr(), out.ptr(), 1, chunks, oi, chunks, scale),
        }),
    ])
}

/// Plan out[o, i] = max_j x[o, j, i] (or min), idx = first arg index (optional).
#[allow(clippy::too_many_arguments)]
pub fn plan_arg_mid(
    t: &LaunchTarget,
    which: ArgReduce,
    x: DevSlice<'_>,
    out: DevSlice<'_>,
    idx: Option<DevSlice<'_>>,
    outer: usize,
    n: usize,
    inner: usize,
) -> Result<Option<Launch>> {
    let d = x.dtype();
    need_float("max_mid", d)?;
    let oi = rows_times_n("max_mid", outer, inner)?;
    need("max_mid", "x", &x, d, rows_times_n("max_mid", oi, n)?)?;
    need("max_mid", "out", &out, d, oi)?;
    opt_need("max_mid", "idx", &idx, DType::I64, oi)?;
    if n == 0 && oi > 0 {
        return Err(CudaError::invalid("max_mid", "max over an empty dim"));
    }
    if oi == 0 {
        return Ok(None);
    }
    Ok(Some(Launch::new(
        KernelFile::Reduce,
        format!("{}_mid_{}", which.base(), d.suffix()),
        t.grid_for(oi, ELEMWISE_BLOCK),
        ELEMWISE_BLOCK,
        vec![
            Arg::Ptr(x.ptr()),
            Arg::Ptr(out.ptr()),
            Arg::Ptr(ptr_of(&idx)),
            Arg::I64(outer as i64),
            Arg::I64(n as i64),
            Arg::I64(inner as i64),
        ],
    )))
}

/// out[r] = scale * Σ_j x[r, j] (scale = 1/n for a mean).
pub fn sum_last(
    dev: &CudaDevice,
    x: DevSlice<'_>,
    out: DevSlice<'_>,
    rows: usize,
    n: usize,
    scale: f32,
) -> Result<()> {
    dev.run_opt(plan_sum_last(&dev.target(), x, out, rows, n, scale)?)
}

/// Max/min over the last dim with optional arg-index.
pub fn arg_last(
    dev: &CudaDevice,
    which: ArgReduce,
    x: DevSlice<'_>,
    out: DevSlice<'_>,
    idx: Option<DevSlice<'_>>,
    rows: usize,
    n: usize,
) -> Result<()> {
    dev.run_opt(plan_arg_last(&dev.target(), which, x, out, idx, rows, n)?)
}

/// out[o, i] = scale * Σ_j x[o, j, i]; allocates its f32 scratch from the temporary pool.
#[allow(clippy::too_many_arguments)]
pub fn sum_mid(
    dev: &CudaDevice,
    x: DevSlice<'_>,
    out: DevSlice<'_>,
    outer: usize,
    n: usize,
    inner: usize,
    scale: f32,
) -> Result<()> {
    let t = dev.target();
    let len = sum_mid_scratch_len(&t, outer, n, inner);
    let scratch = if len > 0 {
        Some(dev.alloc(len, DType::F32, Pool::Temporary)?)
    } else {
        None
    };
    let steps = plan_sum_mid(
        &t,
        x,
        out,
        scratch.as_ref().map(|b| b.as_slice()),
        outer,
        n,
        inner,
        scale,
    )?;
    dev.run_steps(steps.into_iter())
}

/// Max/min over the middle dim with optional arg-index.
#[allow(clippy::too_many_arguments)]
pub fn arg_mid(
    dev: &CudaDevice,
    which: ArgReduce,
    x: DevSlice<'_>,
    out: DevSlice<'_>,
    idx: Option<DevSlice<'_>>,
    outer: usize,
    n: usize,
    inner: usize,
) -> Result<()> {
    dev.run_opt(plan_arg_mid(
        &dev.target(),
        which,
        x,
        out,
        idx,
        outer,
        n,
        inner,
    )?)
}

pub(crate) fn samples(t: &LaunchTarget) -> Vec<Launch> {
    let mut v = Vec::new();
    for d in DType::FLOATS {
        let x = fake_slice(d, 4 * 1000 * 3);
        let o = fake_slice(d, 4);
        let i = fake_slice(DType::I64, 4);
        v.extend(plan_sum_last(t, x.slice(0, 4000).unwrap(), o, 4, 1000, 1.0).unwrap());
        for w in [ArgReduce::Max, ArgReduce::Min] {
            v.extend(plan_arg_last(t, w, x.slice(0, 4000).unwrap(), o, Some(i), 4, 1000).unwrap());
            v.extend(plan_arg_mid(t, w, x, fake_slice(d, 12), None, 4, 1000, 3).unwrap());
        }
        let o12 = fake_slice(d, 12);
        v.extend(super::kernels_of(
            plan_sum_mid(t, x.slice(0, 12 * 10).unwrap(), o12, None, 4, 10, 3, 1.0).unwrap(),
        ));
        let part = fake_slice(DType::F32, sum_mid_scratch_len(t, 4, 1000, 3));
        v.extend(super::kernels_of(
            plan_sum_mid(t, x, o12, Some(part), 4, 1000, 3, 0.5).unwrap(),
        ));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunking() {
        let t = LaunchTarget { sm_count: 132 };
        // Bias gradient of a [16384, 768] activation: 24 column blocks -> split rows.
        let (c, len) = mid_chunks(&t, 1, 16384, 768);
        assert!(
            c > 1 && c <= 64 && c * len >= 16384 && (c - 1) * len < 16384,
            "{c} {len}"
        );
        // Plenty of (outer, inner) blocks -> one pass.
        assert_eq!(mid_chunks(&t, 4096, 100, 64), (1, 100));
        // Tiny n -> one pass.
        assert_eq!(mid_chunks(&t, 1, 10, 3), (1, 10));
        assert_eq!(sum_mid_scratch_len(&t, 1, 10, 3), 0);
    }

    #[test]
    fn mid_plans() {
        let t = LaunchTarget { sm_count: 132 };
        let x = fake_slice(DType::F16, 16384 * 768);
        let out = fake_slice(DType::F16, 768);
        assert!(
            plan_sum_mid(&t, x, out, None, 1, 16384, 768, 1.0).is_err(),
            "scratch required"
        );
        let part = fake_slice(DType::F32, sum_mid_scratch_len(&t, 1, 16384, 768));
        let steps = plan_sum_mid(&t, x, out, Some(part), 1, 16384, 768, 1.0).unwrap();
        let ks = crate::ops::kernels_of(steps);
        assert_eq!(ks.len(), 2);
        assert_eq!(ks[0].name, "sum_mid_partial_f16");
        assert_eq!(ks[0].grid.0, 24);
        assert_eq!(ks[1].name, "sum_mid_finish_f16");
        // inner == 1 routes to the last-dim kernel.
        let ks = crate::ops::kernels_of(
            plan_sum_mid(
                &t,
                fake_slice(DType::F32, 50),
                fake_slice(DType::F32, 5),
                None,
                5,
                10,
                1,
                1.0,
            )
            .unwrap(),
        );
        assert_eq!(ks[0].name, "sum_last_f32");
        assert_eq!(ks[0].block, (32, 8, 1));
    }
}
