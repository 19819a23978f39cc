//! The elementwise operations as data: one definition of each function and its derivative,
//! used by the CPU kernels, the f64 reference tests, and (by name) the CUDA kernels.
//!
//! `apply_f64` / `derivative_f64` are the references every kernel is tested against; `apply` /
//! `derivative` are the f32 arithmetic of the CPU kernels (changing them changes results bit
//! for bit, which resumed checkpoints compare).
//!
//! The semantics are PyTorch's, edges included:
//! - NaN propagates: `relu(NaN)`, `maximum(NaN, x)`, `maximum(x, NaN)` and the max / min /
//!   argmax reductions over a NaN are NaN (the reductions' index is the first NaN's; see
//!   [`ReduceOp::replaces`]); Rust's `f32::max` would drop it.
//! - Division: `/` ([`BinaryOp::Div`]) of floats is IEEE division (x / 0 = ±inf, 0 / 0 = NaN).
//!   Integer tensors divide as floats (true division, `torch.div`: `Tensor::div` casts them to
//!   f32 first, so the integer kernels' truncating `Div` is a storage-level operation no tensor
//!   op exposes). [`BinaryOp::FloorDiv`] ([`floor_div_f64`] / [`floor_div_f32`] /
//!   [`floor_div_i64`]) is `torch.floor_divide` (Python's `//`: rounds toward −∞), where an
//!   integer division by zero is an error (PyTorch raises `ZeroDivisionError`; the tensor op
//!   checks the divisor before it runs).
//! - Type promotion: [`DType::promote`](crate::DType::promote) (an integer meets a float as that
//!   float, as in PyTorch; bool meets anything as that other dtype).
//! - Comparisons give `torch.bool` ([`BinaryOp::compare`]: NaN != NaN, every other comparison
//!   with NaN false); two bools combine as PyTorch combines them ([`BinaryOp::apply_bool`]).

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    Neg,
    Exp,
    Log,
    Sqrt,
    Sqr,
    Recip,
    Abs,
    Tanh,
    Sigmoid,
    Relu,
    /// GELU, tanh approximation (GPT-2's form).
    GeluTanh,
    /// GELU, exact form with erf.
    GeluErf,
    Silu,
    Powf(f32),
    /// x * mul + add.
    Affine(f32, f32),
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const INV_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;
const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// erf(x) to 1.2e-7 absolute: Numerical Recipes' Chebyshev fit of erfc, whose fractional error
/// is below 1.2e-7 (Abramowitz–Stegun 7.1.26 is too coarse). GELU's exact form uses it on the
/// CPU and in the kernel references; its accuracy is checked against the Maclaurin series in
/// the tests below.
pub fn erf(x: f64) -> f64 {
    // Numerical Recipes' erfc Chebyshev fit: fractional error below 1.2e-7 everywhere.
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        1.0 - r
    } else {
        r - 1.0
    }
}

/// The float types the references and the CPU arithmetic share (f32 and f64).
trait Real:
    Copy
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Rem<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const HALF: Self;
    fn nan(self) -> bool;
    fn floor(self) -> Self;
    fn copysign(self, sign: Self) -> Self;
}
macro_rules! impl_real {
    ($t:ty) => {
        impl Real for $t {
            const ZERO: $t = 0.0;
            const ONE: $t = 1.0;
            const HALF: $t = 0.5;
            fn nan(self) -> bool {
                self.is_nan()
            }
            fn floor(self) -> $t {
                <$t>::floor(self)
            }
            fn copysign(self, sign: $t) -> $t {
                <$t>::copysign(self, sign)
            }
        }
    };
}
impl_real!(f32);
impl_real!(f64);

/// max(x, 0) that keeps NaN (and -0), as PyTorch's relu.
#[inline]
fn relu<T: Real>(x: T) -> T {
    if x < T::ZERO {
        T::ZERO
    } else {
        x
    }
}
/// `torch.maximum`: NaN if either is NaN.
#[inline]
fn maximum<T: Real>(a: T, b: T) -> T {
    if a > b || a.nan() {
        a
    } else {
        b
    }
}
/// `torch.minimum`: NaN if either is NaN.
#[inline]
fn minimum<T: Real>(a: T, b: T) -> T {
    if a < b || a.nan() {
        a
    } else {
        b
    }
}

/// `torch.floor_divide` of floats (Python's `//`): the quotient rounded toward −∞, computed
/// from the exact remainder as PyTorch does (so 5 // 0.1 = 49, not 50). Division by zero is
/// IEEE division: ±inf, or NaN for 0 // 0.
pub fn floor_div_f64(a: f64, b: f64) -> f64 {
    floor_div(a, b)
}

/// [`floor_div_f64`] in f32 arithmetic (the CPU kernels' and the CUDA kernels' form).
pub fn floor_div_f32(a: f32, b: f32) -> f32 {
    floor_div(a, b)
}

fn floor_div<T: Real>(a: T, b: T) -> T {
    if b == T::ZERO {
        return a / b;
    }
    let rem = a % b;
    let mut div = (a - rem) / b;
    if rem != T::ZERO && (b < T::ZERO) != (rem < T::ZERO) {
        div = div - T::ONE;
    }
    if div == T::ZERO {
        // A zero quotient takes the sign of the true quotient, as in PyTorch.
        return T::ZERO.copysign(a / b);
    }
    let floor = div.floor();
    if div - floor > T::HALF {
        floor + T::ONE
    } else {
        floor
    }
}

/// `torch.floor_divide` of integers: the quotient rounded toward −∞ (−7 // 2 = −4), wrapping
/// for i64::MIN // −1 as PyTorch does; `None` for a division by zero (PyTorch raises
/// `ZeroDivisionError`; sinter's ops report an error naming the position).
pub fn floor_div_i64(a: i64, b: i64) -> Option<i64> {
    if b == 0 {
        return None;
    }
    let q = a.wrapping_div(b);
    // Truncation rounds toward zero: step down when the signs differ and it was inexact.
    Some(if (a < 0) != (b < 0) && a.wrapping_rem(b) != 0 {
        q - 1
    } else {
        q
    })
}

impl UnaryOp {
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Sqr => "sqr",
            UnaryOp::Recip => "recip",
            UnaryOp::Abs => "abs",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::GeluErf => "gelu_erf",
            UnaryOp::Silu => "silu",
            UnaryOp::Powf(_) => "powf",
            UnaryOp::Affine(..) => "affine",
        }
    }
    /// f(x) in f64: the reference every kernel is tested against.
    pub fn apply_f64(self, x: f64) -> f64 {
        match self {
            UnaryOp::Neg => -x,
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Sqr => x * x,
            UnaryOp::Recip => 1.0 / x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            // Not `x.max(0.0)`, which drops NaN; keeps -0 as PyTorch does.
            UnaryOp::Relu => relu(x),
            UnaryOp::GeluTanh => {
                0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
            }
            UnaryOp::GeluErf => 0.5 * x * (1.0 + erf(x * INV_SQRT_2)),
            UnaryOp::Silu => x / (1.0 + (-x).exp()),
            UnaryOp::Powf(e) => x.powf(e as f64),
            UnaryOp::Affine(m, a) => x * m as f64 + a as f64,
        }
    }
    /// df/dx at x, given y = f(x) (cheaper for exp, tanh, sigmoid).
    pub fn derivative_f64(self, x: f64, y: f64) -> f64 {
        match self {
            UnaryOp::Neg => -1.0,
            UnaryOp::Exp => y,
            UnaryOp::Log => 1.0 / x,
            UnaryOp::Sqrt => 0.5 / y,
            UnaryOp::Sqr => 2.0 * x,
            UnaryOp::Recip => -y * y,
            UnaryOp::Abs => {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            }
            UnaryOp::Tanh => 1.0 - y * y,
            UnaryOp::Sigmoid => y * (1.0 - y),
            // PyTorch's threshold_backward: 0 where the output is <= 0, else 1 (also at NaN).
            UnaryOp::Relu => {
                if x <= 0.0 {
                    0.0
                } else {
                    1.0
                }
            }
            UnaryOp::GeluTanh => {
                let inner = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
                let t = inner.tanh();
                let dinner = SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x);
                0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner
            }
            UnaryOp::GeluErf => {
                0.5 * (1.0 + erf(x * INV_SQRT_2)) + x * INV_SQRT_2PI * (-0.5 * x * x).exp()
            }
            UnaryOp::Silu => {
                let s = 1.0 / (1.0 + (-x).exp());
                s * (1.0 + x * (1.0 - s))
            }
            UnaryOp::Powf(e) => e as f64 * x.powf(e as f64 - 1.0),
            UnaryOp::Affine(m, _) => m as f64,
        }
    }
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            UnaryOp::Neg => -x,
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Sqr => x * x,
            UnaryOp::Recip => 1.0 / x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Relu => relu(x),
            UnaryOp::Powf(e) => x.powf(e),
            UnaryOp::Affine(m, a) => x * m + a,
            UnaryOp::GeluTanh => {
                let x3 = x * x * x;
                0.5 * x * (1.0 + ((SQRT_2_OVER_PI as f32) * (x + 0.044715 * x3)).tanh())
            }
            UnaryOp::Silu => x / (1.0 + (-x).exp()),
            UnaryOp::GeluErf => self.apply_f64(x as f64) as f32,
        }
    }
    #[inline]
    pub fn derivative(self, x: f32, y: f32) -> f32 {
        match self {
            UnaryOp::Neg => -1.0,
            UnaryOp::Exp => y,
            UnaryOp::Tanh => 1.0 - y * y,
            UnaryOp::Sigmoid => y * (1.0 - y),
            UnaryOp::Relu => {
                if x <= 0.0 {
                    0.0
                } else {
                    1.0
                }
            }
            UnaryOp::Sqr => 2.0 * x,
            UnaryOp::Affine(m, _) => m,
            _ => self.derivative_f64(x as f64, y as f64) as f32,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// True division for floats; truncating for i64 at the storage level (see the module docs).
    Div,
    /// `torch.floor_divide`: the quotient rounded toward −∞.
    FloorDiv,
    Maximum,
    Minimum,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl BinaryOp {
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::FloorDiv => "floor_divide",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::Eq => "eq",
            BinaryOp::Ne => "ne",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Gt => "gt",
            BinaryOp::Ge => "ge",
        }
    }
    pub fn apply_f64(self, a: f64, b: f64) -> f64 {
        let t = |c: bool| c as u8 as f64;
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::FloorDiv => floor_div(a, b),
            BinaryOp::Maximum => maximum(a, b),
            BinaryOp::Minimum => minimum(a, b),
            BinaryOp::Eq => t(a == b),
            BinaryOp::Ne => t(a != b),
            BinaryOp::Lt => t(a < b),
            BinaryOp::Le => t(a <= b),
            BinaryOp::Gt => t(a > b),
            BinaryOp::Ge => t(a >= b),
        }
    }
    #[inline]
    pub fn apply(self, a: f32, b: f32) -> f32 {
        let t = |c: bool| c as u8 as f32;
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::FloorDiv => floor_div(a, b),
            BinaryOp::Maximum => maximum(a, b),
            BinaryOp::Minimum => minimum(a, b),
            BinaryOp::Eq => t(a == b),
            BinaryOp::Ne => t(a != b),
            BinaryOp::Lt => t(a < b),
            BinaryOp::Le => t(a <= b),
            BinaryOp::Gt => t(a > b),
            BinaryOp::Ge => t(a >= b),
        }
    }
    #[inline]
    pub fn apply_i64(self, a: i64, b: i64) -> i64 {
        let t = |c: bool| c as i64;
        match self {
            BinaryOp::Add => a.wrapping_add(b),
            BinaryOp::Sub => a.wrapping_sub(b),
            BinaryOp::Mul => a.wrapping_mul(b),
            // Truncating, x / 0 = 0: the storage-level integer division (module docs).
            BinaryOp::Div => {
                if b == 0 {
                    0
                } else {
                    a.wrapping_div(b)
                }
            }
            // `floor_divide` refuses a zero divisor before any kernel runs; 0 keeps this total.
            BinaryOp::FloorDiv => floor_div_i64(a, b).unwrap_or(0),
            BinaryOp::Maximum => a.max(b),
            BinaryOp::Minimum => a.min(b),
            BinaryOp::Eq => t(a == b),
            BinaryOp::Ne => t(a != b),
            BinaryOp::Lt => t(a < b),
            BinaryOp::Le => t(a <= b),
            BinaryOp::Gt => t(a > b),
            BinaryOp::Ge => t(a >= b),
        }
    }
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge
        )
    }
    /// A comparison's result (what `torch.eq` … `torch.ge` give as `torch.bool`): IEEE rules,
    /// so NaN is unequal to everything (itself included) and every ordering with NaN is false.
    /// False for an op that is not a comparison ([`BinaryOp::is_comparison`]).
    #[inline]
    pub fn compare<T: PartialOrd>(self, a: T, b: T) -> bool {
        match self {
            BinaryOp::Eq => a == b,
            BinaryOp::Ne => a != b,
            BinaryOp::Lt => a < b,
            BinaryOp::Le => a <= b,
            BinaryOp::Gt => a > b,
            BinaryOp::Ge => a >= b,
            _ => false,
        }
    }
    /// The op on two `torch.bool` operands, as PyTorch computes it: `+` and `maximum` are
    /// logical or, `*` and `minimum` logical and, comparisons order false < true. None where
    /// PyTorch refuses two bools (`-`, `floor_divide`) or computes in another dtype (`/` is
    /// true division in f32).
    #[inline]
    pub fn apply_bool(self, a: bool, b: bool) -> Option<bool> {
        match self {
            BinaryOp::Add | BinaryOp::Maximum => Some(a | b),
            BinaryOp::Mul | BinaryOp::Minimum => Some(a & b),
            BinaryOp::Sub | BinaryOp::Div | BinaryOp::FloorDiv => None,
            cmp => Some(cmp.compare(a, b)),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// The maximum; NaN if any element is NaN.
    Max,
    /// The minimum; NaN if any element is NaN.
    Min,
    /// Index of the maximum as i64: the first NaN if there is one, else the first of equal
    /// maxima (PyTorch's `argmax`, and the index `max(dim)` returns).
    ArgMax,
}

impl ReduceOp {
    /// For the max / min / argmax scans: does `v`, met after `best`, take its place? A NaN
    /// wins over any number and the first NaN stays; ties keep the earlier element.
    #[inline]
    pub fn replaces(self, best: f32, v: f32) -> bool {
        self.replaces_f64(best as f64, v as f64)
    }
    /// [`ReduceOp::replaces`] on f64 values (the references).
    #[inline]
    pub fn replaces_f64(self, best: f64, v: f64) -> bool {
        if best.is_nan() {
            return false;
        }
        match self {
            ReduceOp::Min => v < best || v.is_nan(),
            ReduceOp::Max | ReduceOp::ArgMax => v > best || v.is_nan(),
            ReduceOp::Sum => false,
        }
    }
    /// The reference of one reduction over `xs`: the value (the index, as f64, for
    /// `ArgMax`); `None` for max / min / argmax of nothing (PyTorch: an error). The sum of
    /// nothing is 0.
    pub fn reduce_f64(self, xs: &[f64]) -> Option<f64> {
        if self == ReduceOp::Sum {
            return Some(xs.iter().sum());
        }
        let (first, rest) = xs.split_first()?;
        let (mut best, mut at) = (*first, 0);
        for (i, &v) in rest.iter().enumerate() {
            if self.replaces_f64(best, v) {
                (best, at) = (v, i + 1);
            }
        }
        Some(if self == ReduceOp::ArgMax {
            at as f64
        } else {
            best
        })
    }
    /// The exact i64 reduction (sum wraps, as PyTorch's); `None` for max / min / argmax of
    /// nothing.
    pub fn reduce_i64(self, xs: &[i64]) -> Option<i64> {
        if self == ReduceOp::Sum {
            return Some(xs.iter().fold(0i64, |a, &b| a.wrapping_add(b)));
        }
        let (first, rest) = xs.split_first()?;
        let (mut best, mut at) = (*first, 0);
        for (i, &v) in rest.iter().enumerate() {
            let better = if self == ReduceOp::Min {
                v < best
            } else {
                v > best
            };
            if better {
                (best, at) = (v, i + 1);
            }
        }
        Some(if self == ReduceOp::ArgMax {
            at as i64
        } else {
            best
        })
    }
}

/// Max pooling's scan rule (PyTorch's `val > max || isnan(val)`): a NaN in the window makes
/// the output NaN, and the gradient goes to the window's last NaN.
#[inline]
pub fn pool_max_replaces(best: f32, v: f32) -> bool {
    v > best || v.is_nan()
}

#[cfg(test)]
mod tests {
    use super::*;
    /// erf by its Maclaurin series: independent of the fit, about 1e-13 for |x| < 3.
    fn erf_series(x: f64) -> f64 {
        let mut sum = 0.0;
        let mut term = x; // (-1)^n x^(2n+1) / n!
        for n in 0..300 {
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-18 {
                break;
            }
            term *= -x * x / (n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }

    #[test]
    fn erf_fit_is_within_its_stated_error_of_the_series() {
        for i in -300..=300 {
            let x = i as f64 / 100.0;
            let (fit, exact) = (erf(x), erf_series(x));
            // The fit's error is fractional in erfc(|x|) = 1 - |erf(x)|.
            assert!(
                (fit - exact).abs() <= 1.2e-7 * (1.0 - exact.abs()) + 1e-12,
                "erf({x}): fit {fit}, series {exact}"
            );
        }
        for (x, e) in [
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
        ] {
            assert!((erf_series(x) - e).abs() < 1e-13, "series at {x}");
        }
    }

    #[test]
    fn erf_matches_known_values() {
        for (x, e) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_8),
            (1.0, 0.842_700_792_9),
            (2.0, 0.995_322_265),
            (-1.5, -0.966_105_146_5),
        ] {
            assert!((erf(x) - e).abs() < 2e-7, "erf({x}) = {} not {e}", erf(x));
        }
    }
    #[test]
    fn analytic_derivatives_match_finite_differences() {
        let ops = [
            UnaryOp::Tanh,
            UnaryOp::Sigmoid,
            UnaryOp::GeluTanh,
            UnaryOp::GeluErf,
            UnaryOp::Silu,
            UnaryOp::Exp,
            UnaryOp::Log,
            UnaryOp::Sqrt,
            UnaryOp::Powf(2.5),
            UnaryOp::Recip,
        ];
        for op in ops {
            for &x in &[0.3, 1.7, 2.9] {
                let h = 1e-6;
                let fd = (op.apply_f64(x + h) - op.apply_f64(x - h)) / (2.0 * h);
                let an = op.derivative_f64(x, op.apply_f64(x));
                assert!(
                    (fd - an).abs() < 1e-5 * (1.0 + an.abs()),
                    "{op:?} at {x}: fd {fd} analytic {an}"
                );
            }
        }
    }

    // The expected values below are PyTorch 2.15's (CPU), as printed by
    // crates/sinter-core/tests/semantics_torch.py.

    #[test]
    fn relu_maximum_and_minimum_propagate_nan_like_pytorch() {
        let nan = f64::NAN;
        // torch.relu([nan, -1, 2, -0.0]) = [nan, 0, 2, -0.0]
        for (x, want) in [(nan, nan), (-1.0, 0.0), (2.0, 2.0), (-0.0, -0.0)] {
            for got in [
                UnaryOp::Relu.apply_f64(x),
                UnaryOp::Relu.apply(x as f32) as f64,
            ] {
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "relu({x}) = {got}, PyTorch {want}"
                );
            }
        }
        // torch.relu's gradient is 1 at NaN (threshold_backward: 0 only where y <= 0).
        assert_eq!(UnaryOp::Relu.derivative(f32::NAN, f32::NAN), 1.0);
        assert_eq!(UnaryOp::Relu.derivative_f64(-0.0, -0.0), 0.0);
        // torch.maximum / minimum([nan, 1, 2], [1, nan, 1]) = [nan, nan, 2] / [nan, nan, 1]
        let (a, b) = ([nan, 1.0, 2.0], [1.0, nan, 1.0]);
        for (op, want) in [
            (BinaryOp::Maximum, [nan, nan, 2.0]),
            (BinaryOp::Minimum, [nan, nan, 1.0]),
        ] {
            for i in 0..3 {
                let got64 = op.apply_f64(a[i], b[i]);
                let got32 = op.apply(a[i] as f32, b[i] as f32) as f64;
                for got in [got64, got32] {
                    assert!(
                        got == want[i] || (got.is_nan() && want[i].is_nan()),
                        "{op:?}({}, {}) = {got}, PyTorch {}",
                        a[i],
                        b[i],
                        want[i]
                    );
                }
            }
        }
    }

    #[test]
    fn reductions_take_the_first_nan_and_the_first_of_ties() {
        let nan = f64::NAN;
        // torch.tensor([1, nan, 3]).max(0) = (nan, 1); [nan, 1, 0.5].min(0) = (nan, 0);
        // argmax([1, nan, 3, nan]) = 1; argmax([1, 3, 3]) = 1.
        assert!(ReduceOp::Max.reduce_f64(&[1.0, nan, 3.0]).unwrap().is_nan());
        assert!(ReduceOp::Min.reduce_f64(&[nan, 1.0, 0.5]).unwrap().is_nan());
        assert!(ReduceOp::Min.reduce_f64(&[1.0, 0.5, nan]).unwrap().is_nan());
        assert_eq!(ReduceOp::ArgMax.reduce_f64(&[1.0, nan, 3.0]), Some(1.0));
        assert_eq!(
            ReduceOp::ArgMax.reduce_f64(&[1.0, nan, 3.0, nan]),
            Some(1.0)
        );
        assert_eq!(ReduceOp::ArgMax.reduce_f64(&[1.0, 3.0, 3.0]), Some(1.0));
        assert_eq!(ReduceOp::Max.reduce_f64(&[]), None);
        assert_eq!(ReduceOp::Sum.reduce_f64(&[]), Some(0.0));
        // Exact i64: [16777217, 0, 1].sum() = 16777218; max([2^53 + 1, 2^53]) = 2^53 + 1;
        // argmax([100000001, 100000002, 100000003]) = 2.
        assert_eq!(
            ReduceOp::Sum.reduce_i64(&[16_777_217, 0, 1]),
            Some(16_777_218)
        );
        let big = (1i64 << 53) + 1;
        assert_eq!(ReduceOp::Max.reduce_i64(&[big, 1 << 53]), Some(big));
        let ids = [100_000_001, 100_000_002, 100_000_003];
        assert_eq!(ReduceOp::ArgMax.reduce_i64(&ids), Some(2));
        assert_eq!(ReduceOp::Min.reduce_i64(&[]), None);
        // max_pool2d over a window [1, nan, nan, 0]: index 2 (the last NaN).
        let window = [1.0f32, f32::NAN, f32::NAN, 0.0];
        let mut at = 0;
        for (i, &v) in window.iter().enumerate().skip(1) {
            if pool_max_replaces(window[at], v) {
                at = i;
            }
        }
        assert_eq!(at, 2);
    }

    #[test]
    fn floor_division_follows_pytorch() {
        let (inf, nan) = (f64::INFINITY, f64::NAN);
        let a = [
            -7.5, 7.0, 5.0, -0.0, 1e-30, 0.3, -0.3, 1.0, 0.0, -1.0, 1.0, -1.0,
        ];
        let b = [
            2.0, -2.0, 0.1, 3.0, -1.0, 0.1, 0.1, 0.0, 0.0, 0.0, -0.0, -0.0,
        ];
        // torch.floor_divide in float32 and float64 (0.3 // 0.1 differs between them).
        let want32 = [
            -4.0, -4.0, 49.0, -0.0, -1.0, 3.0, -4.0, inf, nan, -inf, -inf, inf,
        ];
        let want64 = [
            -4.0, -4.0, 49.0, -0.0, -1.0, 2.0, -3.0, inf, nan, -inf, -inf, inf,
        ];
        let same = |g: f64, w: f64| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
        for i in 0..a.len() {
            let g32 = floor_div_f32(a[i] as f32, b[i] as f32) as f64;
            let g64 = floor_div_f64(a[i], b[i]);
            assert!(
                same(g32, want32[i]),
                "f32 {} // {} = {g32}, PyTorch {}",
                a[i],
                b[i],
                want32[i]
            );
            assert!(
                same(g64, want64[i]),
                "f64 {} // {} = {g64}, PyTorch {}",
                a[i],
                b[i],
                want64[i]
            );
        }
        // Integers: [-7, 7] // [2, -2] = [-4, -4]; [6, -6, 5, -5, 0] // [-3, -3, 3, 3, -3] =
        // [-2, 2, 1, -2, 0]; i64::MIN // -1 = i64::MIN; x // 0 raises ZeroDivisionError.
        let cases = [
            (-7, 2, -4),
            (7, -2, -4),
            (6, -3, -2),
            (-6, -3, 2),
            (5, 3, 1),
            (-5, 3, -2),
            (0, -3, 0),
            (i64::MIN, -1, i64::MIN),
        ];
        for (a, b, q) in cases {
            assert_eq!(floor_div_i64(a, b), Some(q), "{a} // {b}");
        }
        assert_eq!(floor_div_i64(1, 0), None);
        assert_eq!(floor_div_i64(0, 0), None);
    }

    #[test]
    fn comparisons_and_bool_ops_follow_pytorch() {
        use BinaryOp::*;
        let nan = f32::NAN;
        // torch: nan == nan False, nan != nan True, every ordering with nan False.
        assert!(!Eq.compare(nan, nan));
        assert!(Ne.compare(nan, nan));
        assert!(Ne.compare(nan, 1.0));
        for op in [Lt, Le, Gt, Ge] {
            assert!(!op.compare(nan, 1.0) && !op.compare(1.0, nan), "{op:?}");
        }
        assert!(Le.compare(2i64, 2) && !Lt.compare(2i64, 2) && Gt.compare(3i64, 2));
        assert!(!Add.compare(1, 1), "not a comparison");
        // torch: True + True = True, True * False = False, False < True, bool - bool refused.
        assert_eq!(Add.apply_bool(true, true), Some(true));
        assert_eq!(Maximum.apply_bool(false, true), Some(true));
        assert_eq!(Mul.apply_bool(true, false), Some(false));
        assert_eq!(Minimum.apply_bool(true, true), Some(true));
        assert_eq!(Lt.apply_bool(false, true), Some(true));
        assert_eq!(Ge.apply_bool(false, true), Some(false));
        assert_eq!(Sub.apply_bool(true, false), None);
        assert_eq!(FloorDiv.apply_bool(true, true), None);
    }
}
