//! The elementwise operations as data: one definition of each function and its derivative,
//! used by the CPU kernels, the f64 reference tests, and (by name) the CUDA kernels.
//!
//! `apply_f64` / `derivative_f64` are the references every kernel is tested against; `apply` /
//! `derivative` are the f32 arithmetic of the CPU kernels (changing them changes results bit
//! for bit, which resumed checkpoints compare).

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
            UnaryOp::Relu => x.max(0.0),
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
            UnaryOp::Relu => {
                if x > 0.0 {
                    1.0
                } else {
                    0.0
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
            UnaryOp::Relu => x.max(0.0),
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
            UnaryOp::Relu => (x > 0.0) as u8 as f32,
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
    Div,
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
    #[inline]
    pub fn apply(self, a: f32, b: f32) -> f32 {
        let t = |c: bool| c as u8 as f32;
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
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
    #[inline]
    pub fn apply_i64(self, a: i64, b: i64) -> i64 {
        let t = |c: bool| c as i64;
        match self {
            BinaryOp::Add => a.wrapping_add(b),
            BinaryOp::Sub => a.wrapping_sub(b),
            BinaryOp::Mul => a.wrapping_mul(b),
            BinaryOp::Div => {
                if b == 0 {
                    0
                } else {
                    a.wrapping_div(b)
                }
            }
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    /// Index of the maximum (first one on ties), as i64.
    ArgMax,
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
}
