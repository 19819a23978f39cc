//! Wrappers for `kernels/binary.cu`: elementwise float arithmetic, contiguous or
//! strided/broadcast. Comparisons (bool outputs), the two-bool ops and where are
//! `ops::boolean`'s; i64 arithmetic is `ops::int`'s (both take [`StridedIn`] operands).

pub use super::common::StridedIn;
use super::table::{Call, Cost, Grid, Kernel, Slot::*, Source};
use super::{all_contiguous, need, need_dtype, need_float, numel};
use crate::alloc::DevSlice;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::Result;
use crate::launch::{Launch, LaunchTarget};
use crate::nvrtc::KernelFile;

/// out = a (op) b: the arithmetic ops (comparisons are [`super::boolean::BoolOp`]s).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    /// `torch.floor_divide` (sinter_types::floor_div_f32 / floor_div_i64).
    FloorDiv,
    Maximum,
    Minimum,
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 7] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::FloorDiv,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
    ];

    pub fn kernel_base(&self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::FloorDiv => "floor_div",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
        }
    }

    /// f32 reference (same NaN rules as the kernel).
    pub fn reference(&self, a: f32, b: f32) -> f32 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::FloorDiv => sinter_types::floor_div_f32(a, b),
            BinaryOp::Maximum => {
                if a > b || a.is_nan() {
                    a
                } else {
                    b
                }
            }
            BinaryOp::Minimum => {
                if a < b || a.is_nan() {
                    a
                } else {
                    b
                }
            }
        }
    }
}

pub(crate) fn binary_ops() -> Vec<&'static str> {
    BinaryOp::ALL.iter().map(|op| op.kernel_base()).collect()
}

/// out = a op b, contiguous.
pub static BINARY: Kernel = Kernel {
    source: Source::File(KernelFile::Binary),
    name: "{op}_{d}",
    ops: binary_ops,
    dtypes: &DType::FLOATS,
    dtypes2: &[],
    args: &[In("a"), In("b"), Out("out"), Items],
    grid: Grid::Packed,
    traffic: Cost::Moves { flops: 1 },
};

/// out = a op b through strides (0 = broadcast).
pub static BINARY_STRIDED: Kernel = Kernel {
    source: Source::File(KernelFile::Binary),
    name: "{op}_strided_{d}",
    ops: binary_ops,
    dtypes: &DType::FLOATS,
    dtypes2: &[],
    args: &[In("a"), In("b"), Out("out"), Items, Strided],
    grid: Grid::PerItem,
    traffic: Cost::Partial { flops: 1 },
};

/// The rows of `kernels/binary.cu`.
pub static KERNELS: [&Kernel; 2] = [&BINARY, &BINARY_STRIDED];

/// Plan out = a op b on contiguous operands of equal length.
pub fn plan_binary(
    t: &LaunchTarget,
    op: BinaryOp,
    a: DevSlice<'_>,
    b: DevSlice<'_>,
    out: DevSlice<'_>,
) -> Result<Option<Launch>> {
    let d = a.dtype();
    need_float("binary", d)?;
    need("binary", "b", &b, d, a.len())?;
    need("binary", "out", &out, d, a.len())?;
    let operands = [a, b, out];
    BINARY.plan(t, &Call::new(d, a.len(), &operands).op(op.kernel_base()))
}

/// Plan out (contiguous, `shape`) = a op b with strided/broadcast operands. Falls back to the
/// contiguous kernel when both operands turn out contiguous after merging dims.
pub fn plan_binary_strided(
    t: &LaunchTarget,
    op: BinaryOp,
    a: StridedIn<'_>,
    b: StridedIn<'_>,
    out: DevSlice<'_>,
    shape: &[usize],
) -> Result<Option<Launch>> {
    const OP: &str = "binary_strided";
    let d = a.data.dtype();
    need_float(OP, d)?;
    need_dtype(OP, "b", &b.data, d)?;
    need_dtype(OP, "out", &out, d)?;
    let n = numel(OP, shape)?;
    if n > 0 && all_contiguous(OP, &[&a, &b], shape)? {
        return plan_binary(t, op, a.data.slice(0, n)?, b.data.slice(0, n)?, out);
    }
    let call = Call::new(d, n, &[]).op(op.kernel_base());
    BINARY_STRIDED.plan_strided(t, OP, call, &[&a, &b], out, shape)
}

/// out = a op b (contiguous; out may alias a or b).
pub fn binary(
    dev: &CudaDevice,
    op: BinaryOp,
    a: DevSlice<'_>,
    b: DevSlice<'_>,
    out: DevSlice<'_>,
) -> Result<()> {
    dev.run_opt(plan_binary(&dev.target(), op, a, b, out)?)
}

/// out[shape] = a op b through strides (broadcast = stride 0).
pub fn binary_strided(
    dev: &CudaDevice,
    op: BinaryOp,
    a: StridedIn<'_>,
    b: StridedIn<'_>,
    out: DevSlice<'_>,
    shape: &[usize],
) -> Result<()> {
    dev.run_opt(plan_binary_strided(&dev.target(), op, a, b, out, shape)?)
}

#[cfg(test)]
mod tests {
    use super::super::fake_slice;
    use super::*;
    use crate::launch::Arg;

    #[test]
    fn strided_plans() {
        let t = LaunchTarget { sm_count: 8 };
        let a = fake_slice(DType::F32, 32);
        let bias = fake_slice(DType::F32, 8);
        let out = fake_slice(DType::F32, 32);
        // Broadcast bias over rows -> strided kernel with 2 dims.
        let l = plan_binary_strided(
            &t,
            BinaryOp::Add,
            StridedIn {
                data: a,
                strides: &[8, 1],
            },
            StridedIn {
                data: bias,
                strides: &[0, 1],
            },
            out,
            &[4, 8],
        )
        .unwrap()
        .unwrap();
        assert_eq!(l.name, "add_strided_f32");
        match l.args[4] {
            Arg::Strided(m) => {
                assert_eq!(m.ndim, 2);
                assert_eq!(&m.strides[1][..2], &[0, 1]);
            }
            _ => panic!(),
        }
        // Both contiguous through a 3-D view -> the contiguous kernel.
        let l = plan_binary_strided(
            &t,
            BinaryOp::Mul,
            StridedIn {
                data: a,
                strides: &[16, 8, 1],
            },
            StridedIn {
                data: out,
                strides: &[16, 8, 1],
            },
            fake_slice(DType::F32, 32),
            &[2, 2, 8],
        )
        .unwrap()
        .unwrap();
        assert_eq!(l.name, "mul_f32");
        // Out of bounds operand.
        assert!(plan_binary_strided(
            &t,
            BinaryOp::Add,
            StridedIn {
                data: a,
                strides: &[8, 1]
            },
            StridedIn {
                data: bias,
                strides: &[1, 1]
            },
            out,
            &[4, 8]
        )
        .is_err());
    }

    #[test]
    fn reference_nan_rules() {
        assert!(BinaryOp::Maximum.reference(f32::NAN, 1.0).is_nan());
        assert!(BinaryOp::Maximum.reference(1.0, f32::NAN).is_nan());
        assert_eq!(BinaryOp::Minimum.reference(1.0, 2.0), 1.0);
    }
}
