//! Wrappers for `kernels/unary.cu`: elementwise maps, their backward, and fill.

use super::table::{no_ops, Call, Cost, Grid, Kernel, Slot::*, Source};
use super::{need, need_float};
use crate::alloc::DevSlice;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::Result;
use crate::launch::{Arg, Launch, LaunchTarget};
use crate::nvrtc::KernelFile;

/// An elementwise map y = f(x).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    Neg,
    Exp,
    Log,
    Sqrt,
    /// x^p.
    Powf(f32),
    Tanh,
    Sigmoid,
    Relu,
    /// GELU, tanh approximation.
    GeluTanh,
    /// GELU, exact (erf).
    GeluErf,
    Silu,
    Abs,
    Recip,
    /// x * mul + add.
    Affine {
        mul: f32,
        add: f32,
    },
}

/// Which tensor an op's backward reads besides the upstream gradient.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Saved {
    /// The forward input x.
    Input,
    /// The forward output y.
    Output,
    /// Neither (the gradient does not depend on the value).
    Nothing,
}

impl UnaryOp {
    /// One of each op (with sample parameters), for tests.
    pub fn all() -> Vec<UnaryOp> {
        use UnaryOp::*;
        vec![
            Neg,
            Exp,
            Log,
            Sqrt,
            Powf(2.5),
            Tanh,
            Sigmoid,
            Relu,
            GeluTanh,
            GeluErf,
            Silu,
            Abs,
            Recip,
            Affine {
                mul: 2.0,
                add: -1.0,
            },
        ]
    }

    /// Kernel base name.
    pub fn kernel_base(&self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Powf(_) => "powf",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::GeluErf => "gelu_erf",
            UnaryOp::Silu => "silu",
            UnaryOp::Abs => "abs",
            UnaryOp::Recip => "recip",
            UnaryOp::Affine { .. } => "affine",
        }
    }

    /// (p0, p1) kernel parameters.
    pub fn params(&self) -> (f32, f32) {
        match *self {
            UnaryOp::Powf(p) => (p, 0.0),
            UnaryOp::Affine { mul, add } => (mul, add),
            _ => (0.0, 0.0),
        }
    }

    /// What the backward kernel reads (must agree with the `b(...)` of the op in unary.cu).
    pub fn saves(&self) -> Saved {
        match self {
            UnaryOp::Neg | UnaryOp::Affine { .. } => Saved::Nothing,
            UnaryOp::Exp | UnaryOp::Sqrt | UnaryOp::Tanh | UnaryOp::Sigmoid | UnaryOp::Recip => {
                Saved::Output
            }
            UnaryOp::Log
            | UnaryOp::Powf(_)
            | UnaryOp::Relu
            | UnaryOp::GeluTanh
            | UnaryOp::GeluErf
            | UnaryOp::Silu
            | UnaryOp::Abs => Saved::Input,
        }
    }

    /// f32 reference of the forward (the CPU backend and tests use the same formulas).
    pub fn reference(&self, x: f32) -> f32 {
        let sig = |x: f32| {
            if x >= 0.0 {
                1.0 / (1.0 + (-x).exp())
            } else {
                x.exp() / (1.0 + x.exp())
            }
        };
        match *self {
            UnaryOp::Neg => -x,
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Powf(p) => x.powf(p),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Sigmoid => sig(x),
            UnaryOp::Relu => x.max(0.0),
            UnaryOp::GeluTanh => {
                0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044715 * x * x * x)).tanh())
            }
            UnaryOp::GeluErf => 0.5 * x * (1.0 + erf(x as f64 / std::f64::consts::SQRT_2) as f32),
            UnaryOp::Silu => x * sig(x),
            UnaryOp::Abs => x.abs(),
            UnaryOp::Recip => 1.0 / x,
            UnaryOp::Affine { mul, add } => x * mul + add,
        }
    }
}

/// erf for references (defined once in sinter-types).
pub use sinter_types::erf;

fn unary_ops() -> Vec<&'static str> {
    UnaryOp::all().iter().map(|op| op.kernel_base()).collect()
}

/// y = op(x).
pub static UNARY: Kernel = Kernel {
    source: Source::File(KernelFile::Unary),
    name: "{op}_{d}",
    ops: unary_ops,
    dtypes: &DType::FLOATS,
    dtypes2: &[],
    args: &[In("x"), Out("y"), Items, F32("p0"), F32("p1")],
    grid: Grid::Packed,
    traffic: Cost::Moves { flops: 1 },
};

/// gx = op'(saved) * gy.
pub static UNARY_BACKWARD: Kernel = Kernel {
    source: Source::File(KernelFile::Unary),
    name: "{op}_bwd_{d}",
    ops: unary_ops,
    dtypes: &DType::FLOATS,
    dtypes2: &[],
    args: &[
        In("saved"),
        In("gy"),
        Out("gx"),
        Items,
        F32("p0"),
        F32("p1"),
    ],
    grid: Grid::Packed,
    traffic: Cost::Moves { flops: 1 },
};

/// y[..] = value.
pub static FILL: Kernel = Kernel {
    source: Source::File(KernelFile::Unary),
    name: "fill_{d}",
    ops: no_ops,
    dtypes: &DType::FLOATS,
    dtypes2: &[],
    args: &[Out("y"), Items, F32("value")],
    grid: Grid::Packed,
    traffic: Cost::Moves { flops: 0 },
};

/// The rows of `kernels/unary.cu`.
pub static KERNELS: [&Kernel; 3] = [&UNARY, &UNARY_BACKWARD, &FILL];

fn params(op: UnaryOp) -> [Arg; 2] {
    let (p0, p1) = op.params();
    [Arg::F32(p0), Arg::F32(p1)]
}

/// Plan y = op(x). None when empty.
pub fn plan_unary(
    t: &LaunchTarget,
    op: UnaryOp,
    x: DevSlice<'_>,
    y: DevSlice<'_>,
) -> Result<Option<Launch>> {
    let d = x.dtype();
    need_float("unary", d)?;
    need("unary", "y", &y, d, x.len())?;
    let (operands, scalars) = ([x, y], params(op));
    let call = Call::new(d, x.len(), &operands).op(op.kernel_base());
    UNARY.plan(t, &call.scalars(&scalars))
}

/// Plan gx = op'(saved) * gy, where `saved` is x or y per [`UnaryOp::saves`] (ignored — may be
/// `gy` — when it is [`Saved::Nothing`]).
pub fn plan_unary_backward(
    t: &LaunchTarget,
    op: UnaryOp,
    saved: DevSlice<'_>,
    gy: DevSlice<'_>,
    gx: DevSlice<'_>,
) -> Result<Option<Launch>> {
    let d = gy.dtype();
    need_float("unary_backward", d)?;
    need("unary_backward", "saved", &saved, d, gy.len())?;
    need("unary_backward", "gx", &gx, d, gy.len())?;
    let (operands, scalars) = ([saved, gy, gx], params(op));
    let call = Call::new(d, gy.len(), &operands).op(op.kernel_base());
    UNARY_BACKWARD.plan(t, &call.scalars(&scalars))
}

/// Plan y[..] = value.
pub fn plan_fill(t: &LaunchTarget, y: DevSlice<'_>, value: f32) -> Result<Option<Launch>> {
    let d = y.dtype();
    need_float("fill", d)?;
    FILL.plan(t, &Call::new(d, y.len(), &[y]).scalars(&[Arg::F32(value)]))
}

/// y = op(x) on the device (y may be x: in place).
pub fn unary(dev: &CudaDevice, op: UnaryOp, x: DevSlice<'_>, y: DevSlice<'_>) -> Result<()> {
    dev.run_opt(plan_unary(&dev.target(), op, x, y)?)
}

/// gx = d op / dx * gy.
pub fn unary_backward(
    dev: &CudaDevice,
    op: UnaryOp,
    saved: DevSlice<'_>,
    gy: DevSlice<'_>,
    gx: DevSlice<'_>,
) -> Result<()> {
    dev.run_opt(plan_unary_backward(&dev.target(), op, saved, gy, gx)?)
}

/// y[..] = value.
pub fn fill(dev: &CudaDevice, y: DevSlice<'_>, value: f32) -> Result<()> {
    dev.run_opt(plan_fill(&dev.target(), y, value)?)
}

#[cfg(test)]
mod tests {
    use super::super::fake_slice;
    use super::*;

    #[test]
    fn plans() {
        let t = LaunchTarget { sm_count: 10 };
        let x = fake_slice(DType::BF16, 4096);
        let y = fake_slice(DType::BF16, 4096);
        let l = plan_unary(&t, UnaryOp::Powf(3.0), x, y).unwrap().unwrap();
        assert_eq!(l.name, "powf_bf16");
        assert_eq!(l.grid.0, 2); // 4096 / 8 per thread / 256
        assert_eq!(l.args[3], Arg::F32(3.0));
        assert!(plan_unary(&t, UnaryOp::Exp, x, fake_slice(DType::F32, 4096)).is_err());
        assert!(plan_unary(&t, UnaryOp::Exp, x, fake_slice(DType::BF16, 4095)).is_err());
        assert!(plan_unary(
            &t,
            UnaryOp::Exp,
            fake_slice(DType::I64, 4),
            fake_slice(DType::I64, 4)
        )
        .is_err());
        assert!(plan_unary(
            &t,
            UnaryOp::Exp,
            fake_slice(DType::F32, 0),
            fake_slice(DType::F32, 0)
        )
        .unwrap()
        .is_none());
        let b = plan_unary_backward(&t, UnaryOp::GeluErf, x, y, x)
            .unwrap()
            .unwrap();
        assert_eq!(b.name, "gelu_erf_bwd_bf16");
    }

    #[test]
    fn references() {
        assert!((erf(0.5) - 0.520_499_877_813_046_5).abs() < 1e-6);
        assert!((erf(-1.5) + 0.966_105_146_475_310_7).abs() < 1e-6);
        assert!((UnaryOp::GeluErf.reference(1.0) - 0.841_344_7).abs() < 1e-5);
        assert!((UnaryOp::GeluTanh.reference(1.0) - 0.841_192).abs() < 1e-5);
        assert_eq!(UnaryOp::Sigmoid.reference(0.0), 0.5);
        assert!(UnaryOp::Sigmoid.reference(-100.0).is_finite());
    }
}
