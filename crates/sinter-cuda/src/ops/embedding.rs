//! Wrappers for `kernels/embedding.cu`: row gather and the deterministic scatter-add backward.

use super::table::{no_ops, Call, Cost, Grid, Kernel, Slot, Slot::*, Source};
use super::{need, need_float, rows_times_n};
use crate::alloc::{DevSlice, Pool};
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{CudaError, Result};
use crate::launch::{Arg, Launch, LaunchTarget, Step};
use crate::nvrtc::KernelFile;

/// out[i, :] = weight[idx[i], :], one block per index.
pub static FORWARD: Kernel = Kernel {
    source: Source::File(KernelFile::Embedding),
    name: "embedding_fwd_{d}",
    ops: no_ops,
    dtypes: &DType::FLOATS,
    dtypes2: &[],
    args: &[
        In("weight"),
        In("idx"),
        Out("out"),
        Items,
        I64("vocab"),
        I64("dim"),
    ],
    grid: Grid::BlockPerRow {
        per_thread: None,
        max_threads: 256,
    },
    traffic: Cost::Partial { flops: 0 },
};

/// An index helper of the backward (`{d}` is the index dtype), one thread per index, its
/// traffic estimated.
const fn helper(name: &'static str, args: &'static [Slot], grid: Grid) -> Kernel {
    Kernel {
        source: Source::File(KernelFile::Embedding),
        name,
        ops: no_ops,
        dtypes: &[DType::I64],
        dtypes2: &[],
        args,
        grid,
        traffic: Cost::Estimated,
    }
}

/// counts[v] = how many indices are v.
pub static BWD_COUNT: Kernel = helper(
    "emb_bwd_count",
    &[In("idx"), Out("counts"), I64("num_idx"), I64("vocab")],
    Grid::PerItem,
);
/// offsets = exclusive scan of counts, in one block.
pub static BWD_SCAN: Kernel = helper(
    "emb_bwd_scan",
    &[In("counts"), Out("offsets"), I64("vocab")],
    Grid::OneBlock(1024),
);
/// pos = the indices' positions grouped by row.
pub static BWD_FILL: Kernel = helper(
    "emb_bwd_fill",
    &[
        In("idx"),
        In("offsets"),
        Out("cursor"),
        Out("pos"),
        I64("num_idx"),
        I64("vocab"),
    ],
    Grid::PerItem,
);
/// gw (+)= the sum of gy's rows of each weight row, one block per weight row.
pub static BACKWARD: Kernel = Kernel {
    source: Source::File(KernelFile::Embedding),
    name: "embedding_bwd_{d}",
    ops: no_ops,
    dtypes: &DType::FLOATS,
    dtypes2: &[],
    args: &[
        In("gy"),
        In("idx"),
        In("offsets"),
        In("pos"),
        Out("gw"),
        I64("num_idx"),
        Items,
        I64("dim"),
        I32("accumulate"),
    ],
    grid: Grid::BlockPerItem(256),
    traffic: Cost::Partial { flops: 0 },
};

/// The rows of `kernels/embedding.cu`.
pub static KERNELS: [&Kernel; 5] = [&FORWARD, &BWD_COUNT, &BWD_SCAN, &BWD_FILL, &BACKWARD];

/// Plan out[i, :] = weight[idx[i], :] (zero row for an out-of-range index).
pub fn plan_embedding_forward(
    t: &LaunchTarget,
    weight: DevSlice<'_>,
    idx: DevSlice<'_>,
    out: DevSlice<'_>,
    vocab: usize,
    dim: usize,
) -> Result<Option<Launch>> {
    let op = "embedding_forward";
    let d = weight.dtype();
    need_float(op, d)?;
    need(op, "weight", &weight, d, rows_times_n(op, vocab, dim)?)?;
    need(op, "idx", &idx, DType::I64, idx.len())?;
    need(op, "out", &out, d, rows_times_n(op, idx.len(), dim)?)?;
    if dim == 0 {
        return Ok(None);
    }
    let (operands, scalars) = ([weight, idx, out], [vocab, dim].map(|v| Arg::I64(v as i64)));
    let call = Call {
        // The indices, and one weight row per index, gathered.
        read: Some(idx.num_bytes() + out.num_bytes()),
        ..Call::new(d, idx.len(), &operands)
            .row(dim)
            .scalars(&scalars)
    };
    FORWARD.plan(t, &call)
}

/// i32 scratch elements the backward needs: counts and cursor ([vocab] each), offsets
/// ([vocab + 1]) and positions ([num_idx]).
pub fn backward_scratch_len(vocab: usize, num_idx: usize) -> usize {
    3 * vocab + 1 + num_idx
}

/// Plan gw (+)= scatter-add of gy rows by idx, deterministic (see embedding.cu). `scratch` is i32
/// of [`backward_scratch_len`] elements.
#[allow(clippy::too_many_arguments)]
pub fn plan_embedding_backward(
    t: &LaunchTarget,
    gy: DevSlice<'_>,
    idx: DevSlice<'_>,
    gw: DevSlice<'_>,
    scratch: DevSlice<'_>,
    vocab: usize,
    dim: usize,
    accumulate: bool,
) -> Result<Vec<Step>> {
    let op = "embedding_backward";
    let d = gw.dtype();
    need_float(op, d)?;
    let num_idx = idx.len();
    need(op, "idx", &idx, DType::I64, num_idx)?;
    need(op, "gy", &gy, d, rows_times_n(op, num_idx, dim)?)?;
    need(op, "gw", &gw, d, rows_times_n(op, vocab, dim)?)?;
    need(
        op,
        "scratch",
        &scratch,
        DType::I32,
        backward_scratch_len(vocab, num_idx),
    )?;
    if num_idx >= i32::MAX as usize || vocab >= i32::MAX as usize {
        return Err(CudaError::invalid(op, "more than 2^31 indices or rows"));
    }
    if vocab == 0 || dim == 0 {
        return Ok(vec![]);
    }
    let counts = scratch.slice(0, vocab)?;
    let cursor = scratch.slice(vocab, vocab)?;
    let offsets = scratch.slice(2 * vocab, vocab + 1)?;
    let pos = scratch.slice(3 * vocab + 1, num_idx)?;
    let (ni, v) = (Arg::I64(num_idx as i64), Arg::I64(vocab as i64));
    // The helpers run even without indices: the scan still writes the offsets.
    let helper = |row: &Kernel, operands: &[DevSlice<'_>], scalars: &[Arg]| {
        let call = Call::new(DType::I64, num_idx.max(1), operands).scalars(scalars);
        row.plan(t, &call)
    };
    let mut steps = vec![Step::Zero {
        ptr: counts.ptr(),
        bytes: 2 * vocab * 4,
    }];
    steps.extend(super::steps(helper(&BWD_COUNT, &[idx, counts], &[ni, v])?));
    steps.extend(super::steps(helper(&BWD_SCAN, &[counts, offsets], &[v])?));
    let fill_operands = [idx, offsets, cursor, pos];
    steps.extend(super::steps(helper(&BWD_FILL, &fill_operands, &[ni, v])?));
    let operands = [gy, idx, offsets, pos, gw];
    let scalars = [ni, Arg::I64(dim as i64), Arg::I32(accumulate as i32)];
    let call = Call {
        // Every gradient row is written (zero where no index points); gy, idx and the
        // position lists are read once.
        read: Some(
            gy.num_bytes()
                + idx.num_bytes()
                + (vocab + 1 + num_idx) * 4
                + if accumulate { gw.num_bytes() } else { 0 },
        ),
        ..Call::new(d, vocab, &operands).scalars(&scalars)
    };
    steps.extend(super::steps(BACKWARD.plan(t, &call)?));
    Ok(steps)
}

/// out[i, :] = weight[idx[i], :].
pub fn embedding_forward(
    dev: &CudaDevice,
    weight: DevSlice<'_>,
    idx: DevSlice<'_>,
    out: DevSlice<'_>,
    vocab: usize,
    dim: usize,
) -> Result<()> {
    dev.run_opt(plan_embedding_forward(
        &dev.target(),
        weight,
        idx,
        out,
        vocab,
        dim,
    )?)
}

/// gw (+)= scatter-add of gy by idx; deterministic; allocates scratch from the temporary pool.
#[allow(clippy::too_many_arguments)]
pub fn embedding_backward(
    dev: &CudaDevice,
    gy: DevSlice<'_>,
    idx: DevSlice<'_>,
    gw: DevSlice<'_>,
    vocab: usize,
    dim: usize,
    accumulate: bool,
) -> Result<()> {
    let scratch = dev.alloc(
        backward_scratch_len(vocab, idx.len()),
        DType::I32,
        Pool::Temporary,
    )?;
    let steps = plan_embedding_backward(
        &dev.target(),
        gy,
        idx,
        gw,
        scratch.as_slice(),
        vocab,
        dim,
        accumulate,
    )?;
    dev.run_steps(steps.into_iter())
}
