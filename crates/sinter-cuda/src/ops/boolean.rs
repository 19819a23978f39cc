//! Wrappers for `kernels/bool.cu`: `torch.bool` on the device. Comparisons of f32, f16, bf16,
//! i64 or bool operands write bools; two bools combine with or / and; `where` takes a bool
//! condition and moves elements of any tensor dtype; a bool fill. A bool buffer
//! (`DType::Bool`) holds one byte per element, 0 or 1.

use super::binary::{BinaryOp, StridedIn};
use super::{fake_slice, need_dtype, plan_strided};
use crate::alloc::DevSlice;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{CudaError, Result};
use crate::launch::{Arg, Launch, LaunchTarget, ELEMWISE_BLOCK};
use crate::nvrtc::KernelFile;

/// The tensor dtypes the comparison and where kernels are instantiated for.
pub const DTYPES: [DType; 5] = [DType::F32, DType::F16, DType::BF16, DType::I64, DType::Bool];

/// The kernel of `op` on two bools: `or` for `+` and maximum, `and` for `*` and minimum, the
/// comparison kernel for comparisons; None where PyTorch refuses two bools or computes in
/// another dtype (`-`, `/`, `floor_divide`).
fn kernel_name(op: BinaryOp, d: DType) -> Option<String> {
    match op {
        BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge => {
            Some(format!("cmp_{}_{}", op.kernel_base(), d.suffix()))
        }
        _ if d != DType::Bool => None,
        BinaryOp::Add | BinaryOp::Maximum => Some("bool_or".into()),
        BinaryOp::Mul | BinaryOp::Minimum => Some("bool_and".into()),
        BinaryOp::Sub | BinaryOp::Div | BinaryOp::FloorDiv => None,
    }
}

/// Plan out (bool, contiguous, `shape`) = a op b, for a comparison of two operands of one dtype
/// in [`DTYPES`], or or / and of two bools (see [`kernel_name`]); strided/broadcast operands.
pub fn plan_bool_binary(
    t: &LaunchTarget,
    op: BinaryOp,
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
    let name = kernel_name(op, d).ok_or_else(|| {
        CudaError::invalid(
            OP,
            format!(
                "{} of two {d} operands has no bool kernel",
                op.kernel_base()
            ),
        )
    })?;
    need_dtype(OP, "b", &b.data, d)?;
    need_dtype(OP, "out", &out, DType::Bool)?;
    plan_strided(t, OP, (KernelFile::Bool, name), &[&a, &b], out, shape)
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
    let kernel = (KernelFile::Bool, format!("where_cond_{}", d.suffix()));
    plan_strided(t, OP, kernel, &[&cond, &a, &b], out, shape)
}

/// Plan out[:] = value (a bool buffer).
pub fn plan_fill_bool(t: &LaunchTarget, out: DevSlice<'_>, value: bool) -> Result<Option<Launch>> {
    need_dtype("fill_bool", "out", &out, DType::Bool)?;
    if out.is_empty() {
        return Ok(None);
    }
    Ok(Some(Launch::new(
        KernelFile::Bool,
        "fill_bool",
        t.grid_for(out.len(), ELEMWISE_BLOCK),
        ELEMWISE_BLOCK,
        vec![
            Arg::Ptr(out.ptr()),
            Arg::I64(out.len() as i64),
            Arg::I32(value as i32),
        ],
    )))
}

/// out (bool) = a op b through strides (see [`plan_bool_binary`]).
pub fn bool_binary(
    dev: &CudaDevice,
    op: BinaryOp,
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

/// out[:] = value.
pub fn fill_bool(dev: &CudaDevice, out: DevSlice<'_>, value: bool) -> Result<()> {
    dev.run_opt(plan_fill_bool(&dev.target(), out, value)?)
}

pub(crate) fn samples(t: &LaunchTarget) -> Vec<Launch> {
    let mut v = Vec::new();
    let shape = [4usize, 8];
    let (full, row): (&[i64], &[i64]) = (&[8, 1], &[0, 1]);
    for d in DTYPES {
        let (a, b) = (fake_slice(d, 32), fake_slice(d, 8));
        let (sa, sb) = (
            StridedIn {
                data: a,
                strides: full,
            },
            StridedIn {
                data: b,
                strides: row,
            },
        );
        let out = fake_slice(DType::Bool, 32);
        for op in BinaryOp::ALL {
            if kernel_name(op, d).is_some() {
                v.extend(plan_bool_binary(t, op, sa, sb, out, &shape).unwrap());
            }
        }
        let c = StridedIn {
            data: fake_slice(DType::Bool, 8),
            strides: row,
        };
        v.extend(plan_where_bool(t, c, sa, sb, fake_slice(d, 32), &shape).unwrap());
    }
    v.extend(plan_fill_bool(t, fake_slice(DType::Bool, 5), true).unwrap());
    // Two bools: or and and are planned above under add/maximum and mul/minimum; the names
    // appear once each in the compiled module.
    v.sort_by(|x, y| x.name.cmp(&y.name));
    v.dedup_by(|x, y| x.name == y.name);
    v
}

#[cfg(test)]
mod tests {
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
        let l = plan_bool_binary(&t, BinaryOp::Ne, sa, sa, out, &[4, 8])
            .unwrap()
            .unwrap();
        assert_eq!(l.name, "cmp_ne_f16");
        // A comparison writes bools: an f16 output is refused.
        assert!(plan_bool_binary(
            &t,
            BinaryOp::Ne,
            sa,
            sa,
            fake_slice(DType::F16, 32),
            &[4, 8]
        )
        .is_err());
        // or / and only for two bools; `-` of two bools has no kernel (PyTorch refuses it).
        let b = StridedIn {
            data: fake_slice(DType::Bool, 32),
            strides: &[8, 1],
        };
        let name = |op| plan_bool_binary(&t, op, b, b, out, &[4, 8]).map(|l| l.unwrap().name);
        assert_eq!(name(BinaryOp::Add).unwrap(), "bool_or");
        assert_eq!(name(BinaryOp::Minimum).unwrap(), "bool_and");
        assert!(name(BinaryOp::Sub).is_err());
        assert!(plan_bool_binary(&t, BinaryOp::Add, sa, sa, out, &[4, 8]).is_err());
        // where needs a bool condition.
        let l = plan_where_bool(&t, b, sa, sa, fake_slice(DType::F16, 32), &[4, 8])
            .unwrap()
            .unwrap();
        assert_eq!(l.name, "where_cond_f16");
        assert!(plan_where_bool(&t, sa, sa, sa, fake_slice(DType::F16, 32), &[4, 8]).is_err());
    }
}
