//! Wrappers for `kernels/reduce.cu`: sum (mean via `scale`) and max/min with arg-index, over the
//! last dim of `[rows, n]` or the middle dim of `[outer, n, inner]`.

use super::table::{no_ops, Call, Cost, Grid, Kernel, Slot, Slot::*, Source};
use super::{need, need_float, opt_need, ptr_of, rows_times_n};
use crate::alloc::{DevSlice, Pool};
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{CudaError, Result};
use crate::launch::{Arg, Launch, LaunchTarget, Step};
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

/// out[r] = scale * Σ_j x[r, j] over rows of `n`.
pub static SUM_LAST: Kernel = Kernel {
    source: Source::File(KernelFile::Reduce),
    name: "sum_last_{d}",
    ops: no_ops,
    dtypes: &DType::FLOATS,
    dtypes2: &[],
    args: &[In("x"), Out("out"), Items, I64("n"), F32("scale")],
    grid: Grid::Rows,
    traffic: Cost::Reduce,
};

/// out[r] = max_j (min_j) x[r, j], idx[r] its first index.
pub static ARG_LAST: Kernel = Kernel {
    source: Source::File(KernelFile::Reduce),
    name: "{op}_last_{d}",
    ops: arg_ops,
    dtypes: &DType::FLOATS,
    dtypes2: &[],
    args: &[In("x"), Out("out"), Ptr("idx"), Items, I64("n")],
    grid: Grid::Rows,
    traffic: Cost::Estimated,
};

/// The parameters of the middle-dim sums: `(x, out, outer, n, inner, chunk, scale)`.
const SUM_MID_ARGS: &[Slot] = &[
    In("x"),
    Out("out"),
    I64("outer"),
    I64("n"),
    I64("inner"),
    I64("chunk"),
    F32("scale"),
];

/// A middle-dim sum row: 32 x 8 tiles over (inner, outer, chunks).
const fn sum_mid_row(name: &'static str) -> Kernel {
    Kernel {
        source: Source::File(KernelFile::Reduce),
        name,
        ops: no_ops,
        dtypes: &DType::FLOATS,
        dtypes2: &[],
        args: SUM_MID_ARGS,
        grid: Grid::Tiled(MID_TILE),
        traffic: Cost::Reduce,
    }
}

const MID_TILE: (u32, u32, u32) = (32, 8, 1);

/// out[o, i] = scale * Σ_j x[o, j, i] in one pass.
pub static SUM_MID: Kernel = sum_mid_row("sum_mid_{d}");
/// f32 partial sums over chunks of the middle dim.
pub static SUM_MID_PARTIAL: Kernel = sum_mid_row("sum_mid_partial_{d}");
/// out = scale * the sum of the partials.
pub static SUM_MID_FINISH: Kernel = sum_mid_row("sum_mid_finish_{d}");

/// out[o, i] = max_j (min_j) x[o, j, i], idx its first index.
pub static ARG_MID: Kernel = Kernel {
    source: Source::File(KernelFile::Reduce),
    name: "{op}_mid_{d}",
    ops: arg_ops,
    dtypes: &DType::FLOATS,
    dtypes2: &[],
    args: &[
        In("x"),
        Out("out"),
        Ptr("idx"),
        I64("outer"),
        I64("n"),
        I64("inner"),
    ],
    grid: Grid::PerItem,
    traffic: Cost::Estimated,
};

/// The rows of `kernels/reduce.cu`.
pub static KERNELS: [&Kernel; 6] = [
    &SUM_LAST,
    &ARG_LAST,
    &SUM_MID,
    &SUM_MID_PARTIAL,
    &SUM_MID_FINISH,
    &ARG_MID,
];

fn arg_ops() -> Vec<&'static str> {
    [ArgReduce::Max, ArgReduce::Min]
        .iter()
        .map(|w| w.base())
        .collect()
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
    let (operands, scalars) = ([x, out], [Arg::I64(n as i64), Arg::F32(scale)]);
    let call = Call::new(d, rows, &operands).row(n).scalars(&scalars);
    SUM_LAST.plan(t, &call)
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
    let (operands, scalars) = ([x, out], [Arg::Ptr(ptr_of(&idx)), Arg::I64(n as i64)]);
    let call = Call::new(d, rows, &operands).op(which.base()).row(n);
    ARG_LAST.plan(t, &call.scalars(&scalars))
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
    let tiles = |chunks: usize| {
        (
            inner.div_ceil(32) as u32,
            outer.min(65535) as u32,
            chunks as u32,
        )
    };
    // One launch of `row` over `x` into `out`: (outer, n, inner, chunk, scale) as the kernel's.
    let launch = |row: &Kernel,
                  x: DevSlice<'_>,
                  out: DevSlice<'_>,
                  dims: [usize; 4],
                  scale: f32,
                  tiles: (u32, u32, u32)|
     -> Result<Vec<Step>> {
        let operands = [x, out];
        let mut scalars = dims.map(|v| Arg::I64(v as i64)).to_vec();
        scalars.push(Arg::F32(scale));
        let call = Call::new(d, oi, &operands).scalars(&scalars).tiles(tiles);
        Ok(super::steps(row.plan(t, &call)?))
    };
    if chunks == 1 {
        return launch(&SUM_MID, x, out, [outer, n, inner, n], scale, tiles(1));
    }
    let part = part.ok_or_else(|| CudaError::invalid("sum_mid", "scratch required"))?;
    need("sum_mid", "scratch", &part, DType::F32, chunks * oi)?;
    let dims = [outer, n, inner, len];
    let finish = (oi.div_ceil(32) as u32, 1, 1);
    Ok([
        launch(&SUM_MID_PARTIAL, x, part, dims, 1.0, tiles(chunks))?,
        launch(
            &SUM_MID_FINISH,
            part,
            out,
            [1, chunks, oi, chunks],
            scale,
            finish,
        )?,
    ]
    .concat())
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
    let operands = [x, out];
    let scalars = [
        Arg::Ptr(ptr_of(&idx)),
        Arg::I64(outer as i64),
        Arg::I64(n as i64),
        Arg::I64(inner as i64),
    ];
    let call = Call::new(d, oi, &operands).op(which.base());
    ARG_MID.plan(t, &call.scalars(&scalars))
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

#[cfg(test)]
mod tests {
    use super::super::fake_slice;
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
