//! Wrappers for `kernels/bool.cu`: `torch.bool` on the device. Comparisons of f32, f16, bf16,
//! i64 or bool operands write bools; two bools combine with or / and; `where` takes a bool
//! condition and moves elements of any tensor dtype; a bool fill; reductions of bools (count,
//! any, all, first true). A bool buffer (`DType::Bool`) holds one byte per element, 0 or 1.

use super::binary::StridedIn;
use super::int::{plan_mid_reduce, IntReduce, MID_REDUCE_ARGS};
use super::need_dtype;
use super::table::{no_ops, Call, Cost, Grid, Kernel, Slot::*, Source};
use crate::alloc::DevSlice;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{CudaError, Result};
use crate::launch::{Arg, Launch, LaunchTarget};
use crate::nvrtc::KernelFile;

/// The tensor dtypes the comparison and where kernels are instantiated for.
pub const DTYPES: [DType; 5] = [DType::F32, DType::F16, DType::BF16, DType::I64, DType::Bool];

/// What a bool-writing kernel computes: a comparison (operands of any dtype in [`DTYPES`]) or
/// or / and of two bools (PyTorch's `+` / `maximum` and `*` / `minimum` on bools).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BoolOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Or,
    And,
}

impl BoolOp {
    pub const ALL: [BoolOp; 8] = [
        BoolOp::Eq,
        BoolOp::Ne,
        BoolOp::Lt,
        BoolOp::Le,
        BoolOp::Gt,
        BoolOp::Ge,
        BoolOp::Or,
        BoolOp::And,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BoolOp::Eq => "eq",
            BoolOp::Ne => "ne",
            BoolOp::Lt => "lt",
            BoolOp::Le => "le",
            BoolOp::Gt => "gt",
            BoolOp::Ge => "ge",
            BoolOp::Or => "or",
            BoolOp::And => "and",
        }
    }

    /// The row of this op's kernels.
    fn kernel(self) -> &'static Kernel {
        match self {
            BoolOp::Or | BoolOp::And => &BOOL_LOGIC,
            _ => &CMP,
        }
    }
}

/// The ops whose kernels `row` holds.
fn ops_of(row: &Kernel) -> Vec<&'static str> {
    BoolOp::ALL
        .iter()
        .filter(|op| std::ptr::eq(op.kernel(), row))
        .map(|op| op.name())
        .collect()
}

/// out = a cmp b (bools) through strides.
pub static CMP: Kernel = Kernel {
    source: Source::File(KernelFile::Bool),
    name: "cmp_{op}_{d}",
    ops: || ops_of(&CMP),
    dtypes: &DTYPES,
    dtypes2: &[],
    args: &[In("a"), In("b"), Out("out"), Items, Strided],
    grid: Grid::PerItem,
    traffic: Cost::Partial { flops: 1 },
};

/// out = a or / and b of two bools through strides.
pub static BOOL_LOGIC: Kernel = Kernel {
    source: Source::File(KernelFile::Bool),
    name: "bool_{op}",
    ops: || ops_of(&BOOL_LOGIC),
    dtypes: &[DType::Bool],
    dtypes2: &[],
    args: &[In("a"), In("b"), Out("out"), Items, Strided],
    grid: Grid::PerItem,
    traffic: Cost::Partial { flops: 1 },
};

/// out = cond ? a : b through strides.
pub static WHERE: Kernel = Kernel {
    source: Source::File(KernelFile::Bool),
    name: "where_cond_{d}",
    ops: no_ops,
    dtypes: &DTYPES,
    dtypes2: &[],
    args: &[In("cond"), In("a"), In("b"), Out("out"), Items, Strided],
    grid: Grid::PerItem,
    traffic: Cost::Partial { flops: 1 },
};

/// out[:] = value.
pub static FILL_BOOL: Kernel = Kernel {
    source: Source::File(KernelFile::Bool),
    name: "fill_bool",
    ops: no_ops,
    dtypes: &[DType::Bool],
    dtypes2: &[],
    args: &[Out("out"), Items, I32("value")],
    grid: Grid::PerItem,
    traffic: Cost::Estimated,
};

/// A reduction of bools over the middle dim, into `{d2}` (see [`plan_bool_reduce`]).
pub static BOOL_REDUCE: Kernel = Kernel {
    source: Source::File(KernelFile::Bool),
    name: "bool_reduce_{d2}",
    ops: no_ops,
    dtypes: &[DType::Bool],
    dtypes2: &[DType::I64, DType::Bool],
    args: MID_REDUCE_ARGS,
    grid: Grid::PerItem,
    traffic: Cost::Estimated,
};

/// The rows of `kernels/bool.cu`.
pub static KERNELS: [&Kernel; 5] = [&CMP, &BOOL_LOGIC, &WHERE, &FILL_BOOL, &BOOL_REDUCE];

/// Plan out (bool, contiguous, `shape`) = a op b, for a comparison of two operands of one dtype
/// in [`DTYPES`], or or / and of two bools; strided/broadcast operands.
pub fn plan_bool_binary(
    t: &LaunchTarget,
    op: BoolOp,
    a: StridedIn<'_>,
    b: StridedIn<'_>,
    out: DevSlice<'_>,
    shape: &[usize],
) -> Result<Option<Launch>> {
    const OP: &str = "bool_binary";
    let d = a.data.dtype();
    if !DTYPES.contains(&d) {
        return Err(CudaError::invalid(
            OP,
            format!("no kernel for {d} operands"),
        ));
    }
    let row = op.kernel();
    if !row.dtypes.contains(&d) {
        return Err(CudaError::invalid(
            OP,
            format!("{} needs bool operands, got {d}", op.name()),
        ));
    }
    need_dtype(OP, "b", &b.data, d)?;
    need_dtype(OP, "out", &out, DType::Bool)?;
    let call = Call::new(d, 0, &[]).op(op.name());
    row.plan_strided(t, OP, call, &[&a, &b], out, shape)
}

/// Plan out (contiguous, `shape`) = cond ? a : b with a bool condition; a, b and out of one
/// dtype in [`DTYPES`]; strided/broadcast operands.
pub fn plan_where_bool(
    t: &LaunchTarget,
    cond: StridedIn<'_>,
    a: StridedIn<'_>,
    b: StridedIn<'_>,
    out: DevSlice<'_>,
    shape: &[usize],
) -> Result<Option<Launch>> {
    const OP: &str = "where";
    let d = a.data.dtype();
    if !DTYPES.contains(&d) {
        return Err(CudaError::invalid(
            OP,
            format!("no kernel for {d} operands"),
        ));
    }
    need_dtype(OP, "cond", &cond.data, DType::Bool)?;
    need_dtype(OP, "b", &b.data, d)?;
    need_dtype(OP, "out", &out, d)?;
    WHERE.plan_strided(t, OP, Call::new(d, 0, &[]), &[&cond, &a, &b], out, shape)
}

/// Plan out[:] = value (a bool buffer).
pub fn plan_fill_bool(t: &LaunchTarget, out: DevSlice<'_>, value: bool) -> Result<Option<Launch>> {
    need_dtype("fill_bool", "out", &out, DType::Bool)?;
    let (operands, scalars) = ([out], [Arg::I32(value as i32)]);
    FILL_BOOL.plan(
        t,
        &Call::new(DType::Bool, out.len(), &operands).scalars(&scalars),
    )
}

/// Plan out[o, i] = reduce_k x[o, k, i] of a contiguous bool [outer, n, inner] (n >= 1), read
/// as bytes: `Sum` counts the true values and `ArgMax` finds the first (0 when none is), both
/// into i64; `Max` (any) and `Min` (all) into bools.
pub fn plan_bool_reduce(
    t: &LaunchTarget,
    op: IntReduce,
    x: DevSlice<'_>,
    out: DevSlice<'_>,
    outer: usize,
    n: usize,
    inner: usize,
) -> Result<Option<Launch>> {
    need_dtype("bool_reduce", "x", &x, DType::Bool)?;
    plan_mid_reduce(
        t,
        "bool_reduce",
        &BOOL_REDUCE,
        op,
        x,
        (out, bool_reduce_dtype(op)),
        [outer, n, inner],
    )
}

/// The dtype a reduction of bools gives (PyTorch's): i64 for the count and the index, bool for
/// any / all.
pub fn bool_reduce_dtype(op: IntReduce) -> DType {
    match op {
        IntReduce::Sum | IntReduce::ArgMax => DType::I64,
        IntReduce::Max | IntReduce::Min => DType::Bool,
    }
}

/// out (bool) = a op b through strides (see [`plan_bool_binary`]).
pub fn bool_binary(
    dev: &CudaDevice,
    op: BoolOp,
    a: StridedIn<'_>,
    b: StridedIn<'_>,
    out: DevSlice<'_>,
    shape: &[usize],
) -> Result<()> {
    dev.run_opt(plan_bool_binary(&dev.target(), op, a, b, out, shape)?)
}

/// out = cond ? a : b with a bool condition (see [`plan_where_bool`]).
pub fn where_bool(
    dev: &CudaDevice,
    cond: StridedIn<'_>,
    a: StridedIn<'_>,
    b: StridedIn<'_>,
    out: DevSlice<'_>,
    shape: &[usize],
) -> Result<()> {
    dev.run_opt(plan_where_bool(&dev.target(), cond, a, b, out, shape)?)
}

/// Reduce a contiguous bool [outer, n, inner] over n (see [`plan_bool_reduce`]).
pub fn bool_reduce(
    dev: &CudaDevice,
    op: IntReduce,
    x: DevSlice<'_>,
    out: DevSlice<'_>,
    outer: usize,
    n: usize,
    inner: usize,
) -> Result<()> {
    dev.run_opt(plan_bool_reduce(
        &dev.target(),
        op,
        x,
        out,
        outer,
        n,
        inner,
    )?)
}

/// out[:] = value.
pub fn fill_bool(dev: &CudaDevice, out: DevSlice<'_>, value: bool) -> Result<()> {
    dev.run_opt(plan_fill_bool(&dev.target(), out, value)?)
}

#[cfg(test)]
mod tests {
    use super::super::fake_slice;
    use super::*;

    #[test]
    fn plans_pick_the_bool_kernels() {
        let t = LaunchTarget { sm_count: 8 };
        let a = fake_slice(DType::F16, 32);
        let sa = StridedIn {
            data: a,
            strides: &[8, 1],
        };
        let out = fake_slice(DType::Bool, 32);
        let l = plan_bool_binary(&t, BoolOp::Ne, sa, sa, out, &[4, 8])
            .unwrap()
            .unwrap();
        assert_eq!(l.name, "cmp_ne_f16");
        // A comparison writes bools: an f16 output is refused.
        assert!(
            plan_bool_binary(&t, BoolOp::Ne, sa, sa, fake_slice(DType::F16, 32), &[4, 8]).is_err()
        );
        // or / and only for two bools.
        let b = StridedIn {
            data: fake_slice(DType::Bool, 32),
            strides: &[8, 1],
        };
        let name = |op| plan_bool_binary(&t, op, b, b, out, &[4, 8]).map(|l| l.unwrap().name);
        assert_eq!(name(BoolOp::Or).unwrap(), "bool_or");
        assert_eq!(name(BoolOp::And).unwrap(), "bool_and");
        assert_eq!(name(BoolOp::Ge).unwrap(), "cmp_ge_bool");
        assert!(plan_bool_binary(&t, BoolOp::Or, sa, sa, out, &[4, 8]).is_err());
        // where needs a bool condition.
        let l = plan_where_bool(&t, b, sa, sa, fake_slice(DType::F16, 32), &[4, 8])
            .unwrap()
            .unwrap();
        assert_eq!(l.name, "where_cond_f16");
        assert!(plan_where_bool(&t, sa, sa, sa, fake_slice(DType::F16, 32), &[4, 8]).is_err());
        // Reductions: a count into i64, any into bools; the other pairings are refused.
        let x = fake_slice(DType::Bool, 32);
        let (i64_out, bool_out) = (fake_slice(DType::I64, 8), fake_slice(DType::Bool, 8));
        let r = |op, out| plan_bool_reduce(&t, op, x, out, 2, 4, 4).map(|l| l.unwrap().name);
        assert_eq!(r(IntReduce::Sum, i64_out).unwrap(), "bool_reduce_i64");
        assert_eq!(r(IntReduce::Max, bool_out).unwrap(), "bool_reduce_bool");
        assert!(r(IntReduce::Sum, bool_out).is_err());
        assert!(r(IntReduce::Min, i64_out).is_err());
        let empty = fake_slice(DType::Bool, 0);
        assert!(plan_bool_reduce(&t, IntReduce::Sum, empty, i64_out, 2, 0, 4).is_err());
    }
}
