//! Forward of elementwise ops (binary with broadcasting, comparisons, unary maps) against
//! f64 references, on contiguous, broadcast and non-contiguous inputs.

use super::common::*;
use sinter_core::{DType, Result, Rng, Tensor};

type BinFn = fn(&Tensor, &Tensor) -> Result<Tensor>;

const SHAPES: &[(&[usize], &[usize])] = &[
    (&[4, 1, 3], &[5, 1]),
    (&[2, 3], &[2, 3]),
    (&[3], &[2, 3]),
    (&[2, 1, 4], &[1, 3, 1]),
    (&[], &[2, 3]),
    (&[6, 1], &[1, 7]),
    (&[2, 3, 1, 2], &[3, 4, 1]),
];

fn arith() -> Vec<(&'static str, BinFn, fn(f64, f64) -> f64)> {
    vec![
        ("add", Tensor::add, |a, b| a + b),
        ("sub", Tensor::sub, |a, b| a - b),
        ("mul", Tensor::mul, |a, b| a * b),
        ("div", Tensor::div, |a, b| a / b),
        ("maximum", Tensor::maximum, f64::max),
        ("minimum", Tensor::minimum, f64::min),
    ]
}

fn operand(rng: &mut Rng, name: &str, shape: &[usize], rhs: bool) -> Tensor {
    if name == "div" && rhs {
        away_from_zero(rng, shape, 0.3, 2.0)
    } else {
        uniform(rng, shape, -2.0, 2.0)
    }
}

#[test]
fn binary_arithmetic_broadcasts_like_f64() {
    for seed in 0..3 {
        let mut rng = Rng::new(seed);
        for &(sa, sb) in SHAPES {
            for (name, f, r) in arith() {
                // Both orders: the broadcast operand on either side.
                for (s1, s2) in [(sa, sb), (sb, sa)] {
                    let a = operand(&mut rng, name, s1, false);
                    let b = operand(&mut rng, name, s2, true);
                    let want = Arr::of(&a).zip(&Arr::of(&b), r);
                    check_f32(&f(&a, &b).unwrap(), &want, &format!("{name} {s1:?} {s2:?}"));
                }
            }
        }
    }
}

#[test]
fn binary_arithmetic_on_random_broadcast_shapes() {
    let mut rng = Rng::new(31);
    for _ in 0..30 {
        let (sa, sb) = broadcast_pair(&mut rng);
        for (name, f, r) in arith() {
            let a = operand(&mut rng, name, &sa, false);
            let b = operand(&mut rng, name, &sb, true);
            let want = Arr::of(&a).zip(&Arr::of(&b), r);
            check_f32(&f(&a, &b).unwrap(), &want, &format!("{name} {sa:?} {sb:?}"));
            let b2 = operand(&mut rng, name, &sa, true);
            let a2 = operand(&mut rng, name, &sb, false);
            check_f32(
                &f(&a2, &b2).unwrap(),
                &Arr::of(&a2).zip(&Arr::of(&b2), r),
                &format!("{name} {sb:?} {sa:?}"),
            );
        }
    }
}

#[test]
fn binary_arithmetic_on_non_contiguous_operands() {
    let mut rng = Rng::new(11);
    for (name, f, r) in arith() {
        // [4,5] as a transpose, a narrow window, and a broadcast row.
        let a = uniform(&mut rng, &[5, 4], -2.0, 2.0).t().unwrap();
        let b = operand(&mut rng, name, &[4, 8], true)
            .narrow(1, 2, 5)
            .unwrap();
        let c = operand(&mut rng, name, &[5], true);
        let d = uniform(&mut rng, &[5, 3, 4], -2.0, 2.0)
            .permute(&[2, 1, 0])
            .unwrap(); // [4,3,5]
        assert!(!a.is_contiguous() && !b.is_contiguous() && !d.is_contiguous());
        for (x, y, what) in [
            (&a, &b, "t·narrow"),
            (&a, &c, "t·row"),
            (&d, &b.unsqueeze(1).unwrap(), "permute·narrow"),
        ] {
            let want = Arr::of(x).zip(&Arr::of(y), r);
            check_f32(&f(x, y).unwrap(), &want, &format!("{name} {what}"));
        }
        // Large enough for the parallel strided path.
        let big = uniform(&mut rng, &[600, 64], -2.0, 2.0).t().unwrap();
        let row = operand(&mut rng, name, &[600], true);
        let want = Arr::of(&big).zip(&Arr::of(&row), r);
        check_f32(
            &f(&big, &row).unwrap(),
            &want,
            &format!("{name} large strided"),
        );
        let big2 = operand(&mut rng, name, &[64, 600], true);
        let want = Arr::of(&big).zip(&Arr::of(&big2), r);
        check_f32(
            &f(&big, &big2).unwrap(),
            &want,
            &format!("{name} large mixed"),
        );
        let big3 = uniform(&mut rng, &[64, 600], -2.0, 2.0);
        let want = Arr::of(&big3).zip(&Arr::of(&big2), r);
        check_f32(
            &f(&big3, &big2).unwrap(),
            &want,
            &format!("{name} large contiguous"),
        );
    }
}

#[test]
fn comparisons_give_zero_one_with_ties() {
    let cmps: Vec<(&str, BinFn, fn(f64, f64) -> bool)> = vec![
        ("eq", Tensor::eq, |a, b| a == b),
        ("ne", Tensor::ne, |a, b| a != b),
        ("lt", Tensor::lt, |a, b| a < b),
        ("le", Tensor::le, |a, b| a <= b),
        ("gt", Tensor::gt, |a, b| a > b),
        ("ge", Tensor::ge, |a, b| a >= b),
    ];
    let mut rng = Rng::new(5);
    // Values from {-1, 0, 1} so that ties are common.
    let mut small = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|_| rng.below(3) as f64 - 1.0).collect();
        tensor(&v, shape)
    };
    for &(sa, sb) in SHAPES {
        let (a, b) = (small(sa).to_var().unwrap(), small(sb));
        for (name, f, r) in &cmps {
            let got = f(&a, &b).unwrap();
            assert!(
                !got.tracks_grad(),
                "{name}: comparisons are not differentiable"
            );
            let want = Arr::of(&a).zip(&Arr::of(&b), |x, y| r(x, y) as u8 as f64);
            assert_close(&got, &want, 0.0, 0.0, name);
        }
    }
    let a = small(&[4, 3]).t().unwrap();
    let b = small(&[3, 4]);
    for (name, f, r) in &cmps {
        let want = Arr::of(&a).zip(&Arr::of(&b), |x, y| r(x, y) as u8 as f64);
        assert_close(
            &f(&a, &b).unwrap(),
            &want,
            0.0,
            0.0,
            &format!("{name} non-contiguous"),
        );
    }
}

#[test]
fn integer_binary_ops_are_exact() {
    let a = ids(&[3, -7, 12, 0, 5, -1], &[2, 3]);
    let b = ids(&[2, -4, 5], &[3]);
    let cases: Vec<(BinFn, fn(i64, i64) -> i64)> = vec![
        (Tensor::add, |x, y| x + y),
        (Tensor::sub, |x, y| x - y),
        (Tensor::mul, |x, y| x * y),
        (Tensor::maximum, |x, y| x.max(y)),
        (Tensor::minimum, |x, y| x.min(y)),
        (Tensor::lt, |x, y| (x < y) as i64),
        (Tensor::eq, |x, y| (x == y) as i64),
    ];
    let (av, bv) = (a.to_vec_i64().unwrap(), b.to_vec_i64().unwrap());
    for (f, r) in cases {
        let got = f(&a, &b).unwrap();
        assert_eq!(got.dtype(), DType::I64);
        let want: Vec<i64> = (0..6).map(|i| r(av[i], bv[i % 3])).collect();
        assert_eq!(got.to_vec_i64().unwrap(), want);
    }
}

// ---- unary --------------------------------------------------------------------------------

/// erf (one definition, in sinter-types; its accuracy is tested there against a series).
pub use sinter_core::op::erf;

pub fn gelu_tanh_ref(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}
pub fn gelu_erf_ref(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / 2f64.sqrt()))
}
pub fn sigmoid_ref(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

pub type UnaryCase = (
    &'static str,
    Box<dyn Fn(&Tensor) -> Result<Tensor>>,
    fn(f64) -> f64,
    (f64, f64, bool),
);

/// (name, op, f64 reference, input domain (lo, hi, symmetric away from zero)).
pub fn unary_cases() -> Vec<UnaryCase> {
    let sym = (0.05, 4.0, true);
    vec![
        ("neg", Box::new(|t: &Tensor| t.neg()), |x| -x, sym),
        (
            "exp",
            Box::new(|t: &Tensor| t.exp()),
            f64::exp,
            (-3.0, 3.0, false),
        ),
        (
            "log",
            Box::new(|t: &Tensor| t.log()),
            f64::ln,
            (0.05, 5.0, false),
        ),
        (
            "sqrt",
            Box::new(|t: &Tensor| t.sqrt()),
            f64::sqrt,
            (0.05, 5.0, false),
        ),
        ("sqr", Box::new(|t: &Tensor| t.sqr()), |x| x * x, sym),
        (
            "recip",
            Box::new(|t: &Tensor| t.recip()),
            |x| 1.0 / x,
            (0.2, 3.0, true),
        ),
        ("abs", Box::new(|t: &Tensor| t.abs()), f64::abs, sym),
        (
            "powf 2.5",
            Box::new(|t: &Tensor| t.powf(2.5)),
            |x| x.powf(2.5),
            (0.05, 3.0, false),
        ),
        (
            "powf -1.5",
            Box::new(|t: &Tensor| t.powf(-1.5)),
            |x| x.powf(-1.5),
            (0.3, 3.0, false),
        ),
        (
            "powf 3",
            Box::new(|t: &Tensor| t.powf(3.0)),
            |x| x * x * x,
            (0.05, 2.0, true),
        ),
        ("tanh", Box::new(|t: &Tensor| t.tanh()), f64::tanh, sym),
        (
            "sigmoid",
            Box::new(|t: &Tensor| t.sigmoid()),
            sigmoid_ref,
            (0.05, 8.0, true),
        ),
        ("relu", Box::new(|t: &Tensor| t.relu()), |x| x.max(0.0), sym),
        ("gelu", Box::new(|t: &Tensor| t.gelu()), gelu_tanh_ref, sym),
        (
            "gelu_erf",
            Box::new(|t: &Tensor| t.gelu_erf()),
            gelu_erf_ref,
            sym,
        ),
        (
            "silu",
            Box::new(|t: &Tensor| t.silu()),
            |x| x * sigmoid_ref(x),
            sym,
        ),
        (
            "affine",
            Box::new(|t: &Tensor| t.affine(1.5, -0.25)),
            |x| 1.5 * x - 0.25,
            sym,
        ),
        (
            "mul_scalar",
            Box::new(|t: &Tensor| t.mul_scalar(-3.0)),
            |x| -3.0 * x,
            sym,
        ),
        (
            "add_scalar",
            Box::new(|t: &Tensor| t.add_scalar(0.75)),
            |x| x + 0.75,
            sym,
        ),
    ]
}

pub fn unary_input(rng: &mut Rng, shape: &[usize], dom: (f64, f64, bool)) -> Tensor {
    let (lo, hi, symmetric) = dom;
    if symmetric {
        away_from_zero(rng, shape, lo, hi)
    } else {
        uniform(rng, shape, lo, hi)
    }
}

#[test]
fn unary_ops_match_f64() {
    for seed in 0..3 {
        let mut rng = Rng::new(100 + seed);
        for (name, f, r, dom) in unary_cases() {
            let rank = 1 + rng.below(4) as usize;
            let shape = rand_shape(&mut rng, rank, 1, 5);
            let x = unary_input(&mut rng, &shape, dom);
            check_f32(
                &f(&x).unwrap(),
                &Arr::of(&x).map(r),
                &format!("{name} {shape:?}"),
            );
            // A permuted (non-contiguous) view of a rank-3 tensor.
            let x = unary_input(&mut rng, &[3, 4, 5], dom)
                .permute(&[2, 0, 1])
                .unwrap();
            check_f32(
                &f(&x).unwrap(),
                &Arr::of(&x).map(r),
                &format!("{name} permuted"),
            );
        }
    }
    // Large: the parallel path.
    let mut rng = Rng::new(7);
    for (name, f, r, dom) in unary_cases() {
        let x = unary_input(&mut rng, &[200, 201], dom);
        check_f32(
            &f(&x).unwrap(),
            &Arr::of(&x).map(r),
            &format!("{name} large"),
        );
    }
}
