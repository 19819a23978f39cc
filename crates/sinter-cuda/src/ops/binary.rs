//! Wrappers for `kernels/binary.cu`: elementwise float arithmetic, contiguous or
//! strided/broadcast. Comparisons (bool outputs), the two-bool ops and where are
//! `ops::boolean`'s; i64 arithmetic is `ops::int`'s (both take [`StridedIn`] operands).

pub use super::common::StridedIn;
use super::{all_contiguous, fake_slice, kname, need, need_dtype, need_float, numel, plan_strided};
use crate::alloc::DevSlice;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::Result;
use crate::launch::{Arg, Launch, LaunchTarget, Traffic, ELEMWISE_BLOCK};
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
    if a.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        Launch::new(
            KernelFile::Binary,
            kname(op.kernel_base(), d),
            t.elementwise_grid(a.len(), d.size()),
            ELEMWISE_BLOCK,
            vec![
                Arg::Ptr(a.ptr()),
                Arg::Ptr(b.ptr()),
                Arg::Ptr(out.ptr()),
                Arg::I64(a.len() as i64),
            ],
        )
        .with_traffic(
            Traffic::bytes(a.num_bytes() + b.num_bytes(), out.num_bytes()).with_flops(a.len()),
        ),
    ))
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
    let kernel = format!("{}_strided_{}", op.kernel_base(), d.suffix());
    plan_strided(t, OP, (KernelFile::Binary, kernel), &[&a, &b], out, shape)
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

pub(crate) fn samples(t: &LaunchTarget) -> Vec<Launch> {
    let mut v = Vec::new();
    for d in DType::FLOATS {
        let (a, b, o) = (fake_slice(d, 32), fake_slice(d, 8), fake_slice(d, 32));
        for op in BinaryOp::ALL {
            v.extend(plan_binary(t, op, a, a, o).unwrap());
            let sa = StridedIn {
                data: a,
                strides: &[8, 1],
            };
            let sb = StridedIn {
                data: b,
                strides: &[0, 1],
            };
            v.extend(plan_binary_strided(t, op, sa, sb, o, &[4, 8]).unwrap());
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

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
