//! Wrappers for `kernels/int.cu`: i64 arithmetic over strided operands,
//! fill, arange (every dtype), i64 reductions, row gathers through device ids, and the
//! device-side index check that records the first bad index in a small slot buffer.

use super::binary::{binary_ops, BinaryOp, StridedIn};
use super::table::{no_ops, Call, Cost, Grid, Kernel, Slot, Slot::*, Source};
use super::{need, need_dtype, need_len, numel};
use crate::alloc::DevSlice;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{CudaError, Result};
use crate::launch::{Arg, Launch, LaunchTarget};
use crate::nvrtc::KernelFile;

/// Elements of the error slot [`plan_index_check`] writes: {position + 1, value, bound, tag},
/// all zero while no error was recorded.
pub const SLOT_LEN: usize = 4;

/// Threads of the one-block index check (a power of two: the block reduction halves it).
pub const CHECK_BLOCK: u32 = 1024;

/// An i64 row of int.cu with `args`, one thread per item, its traffic estimated.
const fn int_row(name: &'static str, args: &'static [Slot]) -> Kernel {
    Kernel {
        source: Source::File(KernelFile::Int),
        name,
        ops: no_ops,
        dtypes: &[DType::I64],
        dtypes2: &[],
        args,
        grid: Grid::PerItem,
        traffic: Cost::Estimated,
    }
}

/// out = a op b for i64 operands through strides.
pub static INT_BINARY: Kernel = Kernel {
    ops: binary_ops,
    traffic: Cost::Partial { flops: 1 },
    ..int_row(
        "int_{op}_i64",
        &[In("a"), In("b"), Out("out"), Items, Strided],
    )
};
pub static INT_FILL: Kernel = int_row("int_fill_i64", &[Out("y"), Items, I64("value")]);
/// y[i] = start + i * step, the f64 operands as bits.
pub static ARANGE: Kernel = Kernel {
    dtypes: &[DType::F32, DType::F16, DType::BF16, DType::I64],
    ..int_row("arange_{d}", &[Out("y"), Items, U64("start"), U64("step")])
};
pub static INT_REDUCE: Kernel = Kernel {
    dtypes2: &[DType::I64],
    ..int_row("int_reduce_i64", MID_REDUCE_ARGS)
};
pub static INT_MATMUL: Kernel = int_row(
    "int_matmul_i64",
    &[
        In("a"),
        In("b"),
        Out("out"),
        I64("batch"),
        I64("m"),
        I64("n"),
        I64("k"),
    ],
);
pub static INDEX_FLAT: Kernel = int_row(
    "index_flat",
    &[In("idx"), Out("flat"), I64("k"), I64("outer"), I64("n")],
);
pub static GATHER_ROWS: Kernel = int_row(
    "int_gather_rows_i64",
    &[In("x"), In("rows"), Out("out"), I64("count"), I64("inner")],
);
pub static INDEX_CHECK: Kernel = Kernel {
    grid: Grid::OneBlock(CHECK_BLOCK),
    ..int_row(
        "index_check",
        &[
            In("idx"),
            Items,
            I64("bound"),
            I64("ignore"),
            I32("has_ignore"),
            I64("tag"),
            Out("slot"),
        ],
    )
};

/// The rows of `kernels/int.cu`.
pub static KERNELS: [&Kernel; 8] = [
    &INT_BINARY,
    &INT_FILL,
    &ARANGE,
    &INT_REDUCE,
    &INT_MATMUL,
    &INDEX_FLAT,
    &GATHER_ROWS,
    &INDEX_CHECK,
];

/// Plan out (contiguous i64, `shape`) = a op b for i64 operands through strides.
pub fn plan_int_binary(
    t: &LaunchTarget,
    op: BinaryOp,
    a: StridedIn<'_>,
    b: StridedIn<'_>,
    out: DevSlice<'_>,
    shape: &[usize],
) -> Result<Option<Launch>> {
    const OP: &str = "int_binary";
    need_dtype(OP, "a", &a.data, DType::I64)?;
    need_dtype(OP, "b", &b.data, DType::I64)?;
    need_dtype(OP, "out", &out, DType::I64)?;
    let call = Call::new(DType::I64, 0, &[]).op(op.kernel_base());
    INT_BINARY.plan_strided(t, OP, call, &[&a, &b], out, shape)
}

/// Plan y[:] = value (i64).
pub fn plan_fill_i64(t: &LaunchTarget, y: DevSlice<'_>, value: i64) -> Result<Option<Launch>> {
    need_dtype("fill_i64", "y", &y, DType::I64)?;
    let (operands, scalars) = ([y], [Arg::I64(value)]);
    INT_FILL.plan(
        t,
        &Call::new(DType::I64, y.len(), &operands).scalars(&scalars),
    )
}

/// Plan y[i] = start + i * step in f64, then cast to y's dtype like the CPU backend (floats
/// through f32, i64 by truncation). The f64 values travel as their bit patterns.
pub fn plan_arange(
    t: &LaunchTarget,
    y: DevSlice<'_>,
    start: f64,
    step: f64,
) -> Result<Option<Launch>> {
    let d = y.dtype();
    if !ARANGE.dtypes.contains(&d) {
        return Err(CudaError::invalid("arange", format!("no kernel for {d}")));
    }
    if !start.is_finite() || !step.is_finite() {
        return Err(CudaError::invalid(
            "arange",
            format!("start {start} and step {step} must be finite"),
        ));
    }
    let (operands, scalars) = ([y], [Arg::U64(start.to_bits()), Arg::U64(step.to_bits())]);
    ARANGE.plan(t, &Call::new(d, y.len(), &operands).scalars(&scalars))
}

/// Which reduction of int.cu's `int_reduce_i64` and bool.cu's `bool_reduce_*` (the kernels'
/// `op` code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntReduce {
    Sum = 0,
    Max = 1,
    Min = 2,
    /// Index of the first maximum.
    ArgMax = 3,
}

/// Plan out[o, i] = reduce_k x[o, k, i] of a contiguous i64 [outer, n, inner] (n >= 1).
pub fn plan_int_reduce(
    t: &LaunchTarget,
    op: IntReduce,
    x: DevSlice<'_>,
    out: DevSlice<'_>,
    outer: usize,
    n: usize,
    inner: usize,
) -> Result<Option<Launch>> {
    need_dtype("int_reduce", "x", &x, DType::I64)?;
    plan_mid_reduce(
        t,
        "int_reduce",
        &INT_REDUCE,
        op,
        x,
        (out, DType::I64),
        [outer, n, inner],
    )
}

/// The parameters of a middle-dim reduction kernel: `kernel(x, out, outer, n, inner, op)`.
pub(crate) const MID_REDUCE_ARGS: &[Slot] = &[
    In("x"),
    Out("out"),
    I64("outer"),
    I64("n"),
    I64("inner"),
    I32("op"),
];

/// Plan a `row` of [`MID_REDUCE_ARGS`]: a reduction of a contiguous [outer, n, inner] over
/// its middle dim (n >= 1), one thread per output, into `out` (`outer * inner` elements of
/// the given dtype, the row's `{d2}`). x's dtype is the caller's to check.
pub(crate) fn plan_mid_reduce(
    t: &LaunchTarget,
    name: &'static str,
    row: &Kernel,
    op: IntReduce,
    x: DevSlice<'_>,
    (out, out_dtype): (DevSlice<'_>, DType),
    [outer, n, inner]: [usize; 3],
) -> Result<Option<Launch>> {
    let m = outer
        .checked_mul(inner)
        .ok_or_else(|| CudaError::invalid(name, "outer * inner overflows"))?;
    let total = m
        .checked_mul(n)
        .ok_or_else(|| CudaError::invalid(name, "shape overflows"))?;
    need_len(name, "x", &x, total)?;
    need(name, "out", &out, out_dtype, m)?;
    if n == 0 {
        return Err(CudaError::invalid(name, "cannot reduce an empty dimension"));
    }
    let operands = [x, out];
    let scalars = [outer, n, inner].map(|v| Arg::I64(v as i64));
    let scalars = [&scalars[..], &[Arg::I32(op as i32)]].concat();
    let call = Call::new(x.dtype(), m, &operands).dtype2(out_dtype);
    row.plan(t, &call.scalars(&scalars))
}

/// Plan out[b] = a[b] @ b[b] for contiguous i64 a [batch, m, k] and b [batch, k, n] into
/// out [batch, m, n]: exact, wrapping on overflow (PyTorch's CPU integer matmul).
pub fn plan_int_matmul(
    t: &LaunchTarget,
    a: DevSlice<'_>,
    b: DevSlice<'_>,
    out: DevSlice<'_>,
    [batch, m, n, k]: [usize; 4],
) -> Result<Option<Launch>> {
    let name = "int_matmul";
    let size = |dims: &[usize]| numel(name, dims);
    need(name, "a", &a, DType::I64, size(&[batch, m, k])?)?;
    need(name, "b", &b, DType::I64, size(&[batch, k, n])?)?;
    let total = size(&[batch, m, n])?;
    need(name, "out", &out, DType::I64, total)?;
    let operands = [a, b, out];
    let scalars = [batch, m, n, k].map(|v| Arg::I64(v as i64));
    INT_MATMUL.plan(
        t,
        &Call::new(DType::I64, total, &operands).scalars(&scalars),
    )
}

/// Plan flat[o * k + j] = o * n + idx[j] (row ids into x viewed as [outer * n, inner]); an id
/// outside [0, n) is replaced by row 0 of its block so later gathers stay in bounds (the index
/// check reports it).
pub fn plan_index_flat(
    t: &LaunchTarget,
    idx: DevSlice<'_>,
    flat: DevSlice<'_>,
    outer: usize,
    n: usize,
) -> Result<Option<Launch>> {
    let name = "index_flat";
    need_dtype(name, "idx", &idx, DType::I64)?;
    let k = idx.len();
    let total = k
        .checked_mul(outer)
        .ok_or_else(|| CudaError::invalid(name, "k * outer overflows"))?;
    need(name, "flat", &flat, DType::I64, total)?;
    let operands = [idx, flat];
    let scalars = [k, outer, n].map(|v| Arg::I64(v as i64));
    INDEX_FLAT.plan(
        t,
        &Call::new(DType::I64, total, &operands).scalars(&scalars),
    )
}

/// Plan out[r, :] = x[rows[r], :] for i64 x of `x_rows` rows of `inner` (ids already in range).
pub fn plan_gather_rows_i64(
    t: &LaunchTarget,
    x: DevSlice<'_>,
    rows: DevSlice<'_>,
    out: DevSlice<'_>,
    x_rows: usize,
    inner: usize,
) -> Result<Option<Launch>> {
    let name = "gather_rows_i64";
    need(
        name,
        "x",
        &x,
        DType::I64,
        x_rows
            .checked_mul(inner)
            .ok_or_else(|| CudaError::invalid(name, "shape overflows"))?,
    )?;
    need_dtype(name, "rows", &rows, DType::I64)?;
    let count = rows.len();
    need(
        name,
        "out",
        &out,
        DType::I64,
        count
            .checked_mul(inner)
            .ok_or_else(|| CudaError::invalid(name, "shape overflows"))?,
    )?;
    let (operands, scalars) = ([x, rows, out], [count, inner].map(|v| Arg::I64(v as i64)));
    let call = Call::new(DType::I64, count * inner, &operands).scalars(&scalars);
    GATHER_ROWS.plan(t, &call)
}

/// Plan the check of `idx` against [0, bound) (values equal to `ignore` pass when given): the
/// first bad position is written to `slot` ({pos + 1, value, bound, tag}) unless an earlier
/// error is already there. One block, no host synchronisation.
pub fn plan_index_check(
    idx: DevSlice<'_>,
    bound: usize,
    ignore: Option<i64>,
    tag: i64,
    slot: DevSlice<'_>,
) -> Result<Option<Launch>> {
    need_dtype("index_check", "idx", &idx, DType::I64)?;
    need("index_check", "slot", &slot, DType::I64, SLOT_LEN)?;
    let operands = [idx, slot];
    let scalars = [
        Arg::I64(bound as i64),
        Arg::I64(ignore.unwrap_or(0)),
        Arg::I32(ignore.is_some() as i32),
        Arg::I64(tag),
    ];
    let call = Call::new(DType::I64, idx.len(), &operands).scalars(&scalars);
    // One block whatever the device: the target does not enter the plan.
    INDEX_CHECK.plan(&LaunchTarget { sm_count: 1 }, &call)
}

/// The error an index-check slot holds, if any: (position, value, bound, tag).
pub fn decode_slot(slot: &[i64]) -> Option<(usize, i64, usize, i64)> {
    match slot {
        [p, v, b, tag] if *p > 0 => Some(((*p - 1) as usize, *v, (*b).max(0) as usize, *tag)),
        _ => None,
    }
}

pub fn int_binary(
    dev: &CudaDevice,
    op: BinaryOp,
    a: StridedIn<'_>,
    b: StridedIn<'_>,
    out: DevSlice<'_>,
    shape: &[usize],
) -> Result<()> {
    dev.run_opt(plan_int_binary(&dev.target(), op, a, b, out, shape)?)
}
pub fn fill_i64(dev: &CudaDevice, y: DevSlice<'_>, value: i64) -> Result<()> {
    dev.run_opt(plan_fill_i64(&dev.target(), y, value)?)
}
pub fn arange(dev: &CudaDevice, y: DevSlice<'_>, start: f64, step: f64) -> Result<()> {
    dev.run_opt(plan_arange(&dev.target(), y, start, step)?)
}
pub fn int_reduce(
    dev: &CudaDevice,
    op: IntReduce,
    x: DevSlice<'_>,
    out: DevSlice<'_>,
    outer: usize,
    n: usize,
    inner: usize,
) -> Result<()> {
    dev.run_opt(plan_int_reduce(&dev.target(), op, x, out, outer, n, inner)?)
}
pub fn int_matmul(
    dev: &CudaDevice,
    a: DevSlice<'_>,
    b: DevSlice<'_>,
    out: DevSlice<'_>,
    dims: [usize; 4],
) -> Result<()> {
    dev.run_opt(plan_int_matmul(&dev.target(), a, b, out, dims)?)
}
pub fn index_flat(
    dev: &CudaDevice,
    idx: DevSlice<'_>,
    flat: DevSlice<'_>,
    outer: usize,
    n: usize,
) -> Result<()> {
    dev.run_opt(plan_index_flat(&dev.target(), idx, flat, outer, n)?)
}
pub fn gather_rows_i64(
    dev: &CudaDevice,
    x: DevSlice<'_>,
    rows: DevSlice<'_>,
    out: DevSlice<'_>,
    x_rows: usize,
    inner: usize,
) -> Result<()> {
    dev.run_opt(plan_gather_rows_i64(
        &dev.target(),
        x,
        rows,
        out,
        x_rows,
        inner,
    )?)
}
pub fn index_check(
    dev: &CudaDevice,
    idx: DevSlice<'_>,
    bound: usize,
    ignore: Option<i64>,
    tag: i64,
    slot: DevSlice<'_>,
) -> Result<()> {
    dev.run_opt(plan_index_check(idx, bound, ignore, tag, slot)?)
}

#[cfg(test)]
mod tests {
    use super::super::fake_slice;
    use super::*;

    fn t() -> LaunchTarget {
        LaunchTarget { sm_count: 132 }
    }

    #[test]
    fn binary_plan_names_the_op_and_merges_dims() {
        let (a, b, o) = (
            fake_slice(DType::I64, 24),
            fake_slice(DType::I64, 4),
            fake_slice(DType::I64, 24),
        );
        let l = plan_int_binary(
            &t(),
            BinaryOp::Div,
            StridedIn {
                data: a,
                strides: &[12, 4, 1],
            },
            StridedIn {
                data: b,
                strides: &[0, 0, 1],
            },
            o,
            &[2, 3, 4],
        )
        .unwrap()
        .unwrap();
        assert_eq!(l.name, "int_div_i64");
        assert_eq!(l.args[3], Arg::I64(24));
        let Arg::Strided(m) = l.args[4] else {
            panic!("strided meta expected")
        };
        // a is contiguous over [6, 4], b broadcasts over the merged outer dims.
        assert_eq!(m.ndim, 2);
        assert_eq!(&m.shape[..2], &[6, 4]);
        assert_eq!(&m.strides[0][..2], &[4, 1]);
        assert_eq!(&m.strides[1][..2], &[0, 1]);
        // Wrong dtypes and out-of-range views are errors, not launches.
        let f = fake_slice(DType::F32, 24);
        assert!(plan_int_binary(
            &t(),
            BinaryOp::Add,
            StridedIn {
                data: f,
                strides: &[1]
            },
            StridedIn {
                data: a,
                strides: &[1]
            },
            o,
            &[24]
        )
        .is_err());
        assert!(plan_int_binary(
            &t(),
            BinaryOp::Add,
            StridedIn {
                data: b,
                strides: &[1]
            },
            StridedIn {
                data: a,
                strides: &[1]
            },
            o,
            &[24]
        )
        .is_err());
        assert!(plan_int_binary(
            &t(),
            BinaryOp::Add,
            StridedIn {
                data: a,
                strides: &[1]
            },
            StridedIn {
                data: a,
                strides: &[1]
            },
            fake_slice(DType::I64, 0),
            &[0]
        )
        .unwrap()
        .is_none());
    }

    #[test]
    fn arange_passes_f64_bits() {
        let y = fake_slice(DType::I64, 5);
        let l = plan_arange(&t(), y, -2.5, 0.25).unwrap().unwrap();
        assert_eq!(l.name, "arange_i64");
        assert_eq!(l.args[2], Arg::U64((-2.5f64).to_bits()));
        assert_eq!(l.args[3], Arg::U64(0.25f64.to_bits()));
        assert!(plan_arange(&t(), y, f64::NAN, 1.0).is_err());
        assert!(plan_arange(&t(), fake_slice(DType::U8, 5), 0.0, 1.0).is_err());
    }

    #[test]
    fn reduce_and_gather_plans_check_sizes() {
        let (x, out) = (fake_slice(DType::I64, 2 * 5 * 3), fake_slice(DType::I64, 6));
        let l = plan_int_reduce(&t(), IntReduce::ArgMax, x, out, 2, 5, 3)
            .unwrap()
            .unwrap();
        assert_eq!(l.args[5], Arg::I32(3));
        assert!(
            plan_int_reduce(&t(), IntReduce::Sum, x, fake_slice(DType::I64, 5), 2, 5, 3).is_err()
        );
        assert!(plan_int_reduce(
            &t(),
            IntReduce::Max,
            fake_slice(DType::I64, 0),
            fake_slice(DType::I64, 6),
            2,
            0,
            3
        )
        .is_err());
        let (ids, flat) = (fake_slice(DType::I64, 4), fake_slice(DType::I64, 12));
        let l = plan_index_flat(&t(), ids, flat, 3, 7).unwrap().unwrap();
        assert_eq!(&l.args[2..], &[Arg::I64(4), Arg::I64(3), Arg::I64(7)]);
        assert!(plan_index_flat(&t(), ids, fake_slice(DType::I64, 4), 3, 7).is_err());
        assert!(plan_gather_rows_i64(
            &t(),
            fake_slice(DType::I64, 21),
            ids,
            fake_slice(DType::I64, 12),
            7,
            3
        )
        .unwrap()
        .is_some());
        assert!(plan_gather_rows_i64(
            &t(),
            fake_slice(DType::I64, 20),
            ids,
            fake_slice(DType::I64, 12),
            7,
            3
        )
        .is_err());
    }

    #[test]
    fn index_check_is_one_power_of_two_block_and_slots_decode() {
        let (ids, slot) = (
            fake_slice(DType::I64, 5000),
            fake_slice(DType::I64, SLOT_LEN),
        );
        let l = plan_index_check(ids, 10, Some(-100), 2, slot)
            .unwrap()
            .unwrap();
        assert_eq!((l.grid, l.block), ((1, 1, 1), (CHECK_BLOCK, 1, 1)));
        assert!(CHECK_BLOCK.is_power_of_two());
        assert_eq!(
            &l.args[1..6],
            &[
                Arg::I64(5000),
                Arg::I64(10),
                Arg::I64(-100),
                Arg::I32(1),
                Arg::I64(2)
            ]
        );
        let l = plan_index_check(ids, 10, None, 2, slot).unwrap().unwrap();
        assert_eq!(l.args[4], Arg::I32(0));
        assert!(plan_index_check(ids, 10, None, 2, fake_slice(DType::I64, 3)).is_err());
        assert_eq!(decode_slot(&[0, 0, 0, 0]), None);
        assert_eq!(decode_slot(&[4, 17, 10, 1]), Some((3, 17, 10, 1)));
    }
}
