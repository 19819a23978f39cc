//! Elementwise ops: binary with broadcasting, comparisons, integer arithmetic, unary maps,
//! where and masked_fill — contiguous, broadcast and strided operands, forward and backward.

use crate::harness::*;
use crate::reference::{self as r, Arr};
use sinter_core::op::{floor_div_f32, floor_div_i64};
use sinter_core::{DType, Result, Rng, Tensor};

pub fn cases() -> Vec<Case> {
    vec![
        case("binary", FLOATS, binary),
        case("binary_random_broadcast", FLOATS, binary_random_broadcast),
        case("binary_strided", FLOATS, binary_strided),
        case("binary_large", FLOATS, binary_large),
        case("comparisons", FLOATS, comparisons),
        case("integer_binary", I64, integer_binary),
        case("floor_divide", FLOATS, floor_divide),
        case("unary", FLOATS, unary),
        case("unary_strided", FLOATS, unary_strided),
        case("unary_large", FLOATS, unary_large),
        case("where_cond", FLOATS, where_cond),
        case("where_integer", I64, where_integer),
        case("masked_fill", FLOATS, masked_fill),
    ]
}

type BinFn = fn(&Tensor, &Tensor) -> Result<Tensor>;

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

/// Values 0.5·k + offset + U(0, 0.1), k in -4..4: operands drawn with offsets 0 and 0.25
/// differ by at least 0.15 everywhere, so maximum/minimum never see near-ties.
fn offset_grid(rng: &mut Rng, shape: &[usize], offset: f64) -> Arr {
    Arr::from_fn(shape, |_| {
        0.5 * (rng.below(9) as f64 - 4.0) + offset + rng.uniform(0.0, 0.1)
    })
}

fn operands(rng: &mut Rng, name: &str, sa: &[usize], sb: &[usize]) -> [Arr; 2] {
    match name {
        "div" => [
            uniform(rng, sa, -2.0, 2.0),
            away_from_zero(rng, sb, 0.5, 2.0),
        ],
        "maximum" | "minimum" => [offset_grid(rng, sa, 0.0), offset_grid(rng, sb, 0.25)],
        _ => [uniform(rng, sa, -2.0, 2.0), uniform(rng, sb, -2.0, 2.0)],
    }
}

const SHAPES: &[(&[usize], &[usize])] = &[
    (&[4, 1, 3], &[5, 1]),
    (&[2, 3], &[2, 3]),
    (&[3], &[2, 3]),
    (&[2, 1, 4], &[1, 3, 1]),
    (&[], &[2, 3]),
    (&[6, 1], &[1, 7]),
    (&[2, 3, 1, 2], &[3, 4, 1]),
];

fn check_binary(t: &Target, what: &str, f: BinFn, rf: fn(f64, f64) -> f64, [a, b]: [Arr; 2]) {
    t.check(
        what,
        &[In::Var(a), In::Var(b)],
        |x| f(&x[0], &x[1]),
        |x, _| x[0].zip(&x[1], rf),
    );
}

fn binary(t: &Target) {
    let mut rng = t.rng(1);
    for &(sa, sb) in SHAPES {
        for (name, f, rf) in arith() {
            // Both orders: the broadcast operand on either side (gradients summed back).
            for (s1, s2) in [(sa, sb), (sb, sa)] {
                let ab = operands(&mut rng, name, s1, s2);
                check_binary(t, &format!("{name} {s1:?} {s2:?}"), f, rf, ab);
            }
        }
    }
}

/// A random shape (rank 1..=4, sizes 1..=5) and one that broadcasts against it.
fn broadcast_pair(rng: &mut Rng) -> (Vec<usize>, Vec<usize>) {
    let rank = 1 + rng.below(4) as usize;
    let a = rand_shape(rng, rank, 1, 5);
    let drop = rng.below(rank as u64) as usize;
    let b: Vec<usize> = a[drop..]
        .iter()
        .map(|&d| if rng.below(2) == 0 { 1 } else { d })
        .collect();
    let a: Vec<usize> = a
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            if i >= drop && b[i - drop] == d && rng.below(3) == 0 {
                1
            } else {
                d
            }
        })
        .collect();
    (a, b)
}

fn binary_random_broadcast(t: &Target) {
    let mut rng = t.rng(2);
    for _ in 0..8 {
        let (sa, sb) = broadcast_pair(&mut rng);
        for (name, f, rf) in arith() {
            let ab = operands(&mut rng, name, &sa, &sb);
            check_binary(t, &format!("{name} {sa:?} {sb:?}"), f, rf, ab);
            let ab = operands(&mut rng, name, &sb, &sa);
            check_binary(t, &format!("{name} {sb:?} {sa:?}"), f, rf, ab);
        }
    }
}

fn binary_strided(t: &Target) {
    let mut rng = t.rng(3);
    for (name, f, rf) in arith() {
        // a [3,4] used as its transpose; b [3,5] narrowed, transposed and narrowed to a row.
        let [a, _] = operands(&mut rng, name, &[3, 4], &[1]);
        let [_, b] = operands(&mut rng, name, &[1], &[3, 5]);
        t.check(
            &format!("{name} transpose · narrowed row"),
            &[In::Var(a), In::Var(b)],
            |x| f(&x[0].t()?, &x[1].narrow(1, 1, 3)?.t()?.narrow(0, 0, 1)?),
            |x, _| x[0].t().zip(&x[1].narrow(1, 1, 3).t().narrow(0, 0, 1), rf),
        );
        // Permuted against a narrowed operand.
        let [a, _] = operands(&mut rng, name, &[5, 3, 4], &[1]);
        let [_, b] = operands(&mut rng, name, &[1], &[4, 8]);
        t.check(
            &format!("{name} permute · narrow"),
            &[In::Var(a), In::Var(b)],
            |x| {
                f(
                    &x[0].permute(&[2, 1, 0])?,
                    &x[1].narrow(1, 2, 5)?.unsqueeze(1)?,
                )
            },
            |x, _| {
                x[0].permute(&[2, 1, 0])
                    .zip(&x[1].narrow(1, 2, 5).unsqueeze(1), rf)
            },
        );
        // One operand through two views of itself.
        if matches!(name, "add" | "sub" | "mul") {
            t.check(
                &format!("{name} of self-views"),
                &[In::Var(uniform(&mut rng, &[3, 3], -1.0, 1.0))],
                |x| f(&x[0], &x[0].t()?),
                |x, _| x[0].zip(&x[0].t(), rf),
            );
        }
    }
}

/// Large enough for the CPU's parallel strided path and several CUDA grid sweeps.
fn binary_large(t: &Target) {
    let mut rng = t.rng(4);
    for (name, f, rf) in arith() {
        let [a, _] = operands(&mut rng, name, &[600, 64], &[1]);
        let [_, row] = operands(&mut rng, name, &[1], &[600]);
        let [_, full] = operands(&mut rng, name, &[1], &[64, 600]);
        t.check(
            &format!("{name} large transpose · row"),
            &[In::Fixed(a.clone()), In::Fixed(row)],
            |x| f(&x[0].t()?, &x[1]),
            |x, _| x[0].t().zip(&x[1], rf),
        );
        t.check(
            &format!("{name} large transpose · contiguous"),
            &[In::Fixed(a), In::Fixed(full)],
            |x| f(&x[0].t()?, &x[1]),
            |x, _| x[0].t().zip(&x[1], rf),
        );
    }
}

fn comparisons(t: &Target) {
    let cmps: Vec<(&str, BinFn, fn(f64, f64) -> bool)> = vec![
        ("eq", Tensor::eq, |a, b| a == b),
        ("ne", Tensor::ne, |a, b| a != b),
        ("lt", Tensor::lt, |a, b| a < b),
        ("le", Tensor::le, |a, b| a <= b),
        ("gt", Tensor::gt, |a, b| a > b),
        ("ge", Tensor::ge, |a, b| a >= b),
    ];
    let mut rng = t.rng(5);
    for &(sa, sb) in SHAPES {
        let (a, b) = (grid(&mut rng, sa), grid(&mut rng, sb));
        for (name, f, rf) in &cmps {
            t.check_with(
                &format!("{name} {sa:?} {sb:?}"),
                BOOL_OUT,
                &[In::Fixed(a.clone()), In::Fixed(b.clone())],
                |x| f(&x[0], &x[1]),
                |x, _| x[0].zip(&x[1], |p, q| rf(p, q) as u8 as f64),
            );
        }
    }
    // Strided operands; and comparisons are not differentiable.
    let (a, b) = (grid(&mut rng, &[4, 3]), grid(&mut rng, &[3, 4]));
    for (name, f, rf) in &cmps {
        t.check_with(
            &format!("{name} transposed"),
            BOOL_OUT,
            &[In::Fixed(a.clone()), In::Fixed(b.clone())],
            |x| f(&x[0].t()?, &x[1]),
            |x, _| x[0].t().zip(&x[1], |p, q| rf(p, q) as u8 as f64),
        );
        let v = t.tensor(&a).to_var().unwrap();
        assert!(
            !f(&v, &v).unwrap().tracks_grad(),
            "{name}: comparisons are not differentiable"
        );
    }
}

/// `floor_divide` of floats: PyTorch's rule in f32 (`sinter_types::floor_div_f32`; half dtypes
/// compute in f32 and round once), negative operands, fractional divisors, a zero divisor
/// (±inf, NaN), a broadcast divisor; no gradient.
fn floor_divide(t: &Target) {
    #[rustfmt::skip]
    let a = Arr::new(&[3, 4], vec![
        -7.5, 7.0, 5.0, -0.0,
        0.3, -0.3, 1.0, 0.0,
        -1.0, 9.25, -9.25, 100.0,
    ]);
    #[rustfmt::skip]
    let b = Arr::new(&[3, 4], vec![
        2.0, -2.0, 0.1, 3.0,
        0.1, 0.1, 0.0, 0.0,
        0.0, 0.5, 0.75, -7.0,
    ]);
    let rf = |p: f64, q: f64| floor_div_f32(p as f32, q as f32) as f64;
    t.check_with(
        "floor_divide",
        EXACT,
        &[In::Fixed(a.clone()), In::Fixed(b.clone())],
        |x| x[0].floor_divide(&x[1]),
        |x, _| x[0].zip(&x[1], rf),
    );
    t.check_with(
        "floor_divide by a broadcast row",
        EXACT,
        &[In::Fixed(a.clone()), In::Fixed(b.narrow(0, 2, 1))],
        |x| x[0].floor_divide(&x[1]),
        |x, _| x[0].zip(&x[1], rf),
    );
    let v = t.tensor(&a).to_var().unwrap();
    let y = v.floor_divide(&t.tensor(&b)).unwrap();
    assert!(!y.tracks_grad(), "floor_divide has no gradient");
}

fn integer_binary(t: &Target) {
    // Negative values, values beyond f32's exact integers (2^24) and equal pairs; b broadcasts
    // over a's rows. The sums wrap like two's complement; `/` is true division (in f32) and
    // `floor_divide` rounds toward −∞ (PyTorch's rules, `sinter_types::floor_div_i64`).
    let big = (1i64 << 40) + 3;
    let a = Arr::ints(&[3, 4], &[7, -7, 0, 5, big, -3, 12, 1, -9, 4, 4, 6]);
    let b = Arr::ints(&[4], &[2, -2, 3, 4]);
    let ops: Vec<(&str, BinFn, fn(f64, f64) -> f64)> = vec![
        ("add", Tensor::add, |x, y| {
            r::wrap_i64(x as i128 + y as i128)
        }),
        ("sub", Tensor::sub, |x, y| {
            r::wrap_i64(x as i128 - y as i128)
        }),
        ("mul", Tensor::mul, |x, y| {
            r::wrap_i64(x as i128 * y as i128)
        }),
        ("floor_divide", Tensor::floor_divide, |x, y| {
            floor_div_i64(x as i64, y as i64).expect("non-zero divisors") as f64
        }),
        ("maximum", Tensor::maximum, f64::max),
        ("minimum", Tensor::minimum, f64::min),
        ("eq", Tensor::eq, |x, y| (x == y) as u8 as f64),
        ("ne", Tensor::ne, |x, y| (x != y) as u8 as f64),
        ("lt", Tensor::lt, |x, y| (x < y) as u8 as f64),
        ("le", Tensor::le, |x, y| (x <= y) as u8 as f64),
        ("gt", Tensor::gt, |x, y| (x > y) as u8 as f64),
        ("ge", Tensor::ge, |x, y| (x >= y) as u8 as f64),
    ];
    for (name, f, rf) in ops {
        // Comparisons of i64 are exact (beyond 2^24 too) and give bools.
        let o = if name.len() == 2 { BOOL_OUT } else { EXACT };
        t.check_with(
            name,
            o,
            &[In::Fixed(a.clone()), In::Fixed(b.clone())],
            |x| f(&x[0], &x[1]),
            |x, _| x[0].zip(&x[1], rf),
        );
        t.check_with(
            &format!("{name} of a transpose"),
            o,
            &[
                In::Fixed(a.clone()),
                In::Fixed(Arr::ints(&[3, 1], &[1, -5, 2])),
            ],
            |x| f(&x[0].t()?, &x[1].t()?),
            |x, _| x[0].t().zip(&x[1].t(), rf),
        );
    }
    t.check_with(
        "true division",
        Opts {
            out: Some(DType::F32),
            ..EXACT
        },
        &[In::Fixed(a.clone()), In::Fixed(b.clone())],
        |x| x[0].div(&x[1]),
        |x, _| x[0].zip(&x[1], |p, q| (p as f32 / q as f32) as f64),
    );
    let e = err_msg(t.ids(&[1, 2], &[2]).floor_divide(&t.ids(&[3, 0], &[2])));
    assert!(
        e.contains("floor_divide") && e.contains("division by zero") && e.contains("element 1"),
        "{e}"
    );
    // Overflow wraps (i64::MAX + 1 = i64::MIN), as in PyTorch.
    t.check_with(
        "add wraps",
        EXACT,
        &[
            In::Fixed(Arr::ints(&[2], &[i64::MAX, -5])),
            In::Fixed(Arr::ints(&[1], &[1])),
        ],
        |x| x[0].add(&x[1]),
        |x, _| x[0].zip(&x[1], |p, q| r::wrap_i64(p as i128 + q as i128)),
    );
}

// ---- unary ----------------------------------------------------------------------------------------

pub type UnaryCase = (
    &'static str,
    fn(&Tensor) -> Result<Tensor>,
    fn(f64) -> f64,
    (f64, f64, bool),
);

/// (name, op, reference, input domain (lo, hi, symmetric away from zero)), domains clear of
/// poles and kinks by more than any rounding of the inputs.
pub fn unary_ops() -> Vec<UnaryCase> {
    let sym = (0.1, 3.0, true);
    vec![
        ("neg", |t| t.neg(), |x| -x, sym),
        ("exp", |t| t.exp(), f64::exp, (-3.0, 3.0, false)),
        ("log", |t| t.log(), f64::ln, (0.3, 5.0, false)),
        ("sqrt", |t| t.sqrt(), f64::sqrt, (0.3, 5.0, false)),
        ("sqr", |t| t.sqr(), |x| x * x, sym),
        ("recip", |t| t.recip(), |x| 1.0 / x, (0.3, 3.0, true)),
        ("abs", |t| t.abs(), f64::abs, sym),
        (
            "powf 2.5",
            |t| t.powf(2.5),
            |x| x.powf(2.5),
            (0.3, 3.0, false),
        ),
        (
            "powf -1.5",
            |t| t.powf(-1.5),
            |x| x.powf(-1.5),
            (0.3, 3.0, false),
        ),
        ("powf 3", |t| t.powf(3.0), |x| x * x * x, (0.1, 2.0, true)),
        ("tanh", |t| t.tanh(), f64::tanh, sym),
        ("sigmoid", |t| t.sigmoid(), r::sigmoid, (0.1, 4.0, true)),
        ("relu", |t| t.relu(), r::relu, sym),
        ("gelu", |t| t.gelu(), r::gelu_tanh, sym),
        ("gelu_erf", |t| t.gelu_erf(), r::gelu_erf, sym),
        ("silu", |t| t.silu(), r::silu, sym),
        ("affine", |t| t.affine(1.5, -0.25), |x| 1.5 * x - 0.25, sym),
        ("mul_scalar", |t| t.mul_scalar(-3.0), |x| -3.0 * x, sym),
        ("add_scalar", |t| t.add_scalar(0.75), |x| x + 0.75, sym),
    ]
}

pub fn unary_input(rng: &mut Rng, shape: &[usize], (lo, hi, symmetric): (f64, f64, bool)) -> Arr {
    if symmetric {
        away_from_zero(rng, shape, lo, hi)
    } else {
        uniform(rng, shape, lo, hi)
    }
}

fn unary(t: &Target) {
    let mut rng = t.rng(6);
    for (name, f, rf, dom) in unary_ops() {
        for _ in 0..2 {
            let rank = 1 + rng.below(4) as usize;
            let shape = rand_shape(&mut rng, rank, 1, 5);
            let x = unary_input(&mut rng, &shape, dom);
            t.check(
                &format!("{name} {shape:?}"),
                &[In::Var(x)],
                |x| f(&x[0]),
                |x, _| x[0].map(rf),
            );
        }
    }
}

fn unary_strided(t: &Target) {
    let mut rng = t.rng(7);
    for (name, f, rf, dom) in unary_ops() {
        t.check(
            &format!("{name} transposed"),
            &[In::Var(unary_input(&mut rng, &[4, 3], dom))],
            |x| f(&x[0].t()?),
            |x, _| x[0].t().map(rf),
        );
        t.check(
            &format!("{name} permuted"),
            &[In::Var(unary_input(&mut rng, &[3, 4, 5], dom))],
            |x| f(&x[0].permute(&[2, 0, 1])?),
            |x, _| x[0].permute(&[2, 0, 1]).map(rf),
        );
    }
}

fn unary_large(t: &Target) {
    let mut rng = t.rng(8);
    for (name, f, rf, dom) in unary_ops() {
        t.check(
            &format!("{name} large"),
            &[In::Fixed(unary_input(&mut rng, &[200, 201], dom))],
            |x| f(&x[0]),
            |x, _| x[0].map(rf),
        );
    }
}

// ---- where / masked_fill --------------------------------------------------------------------------

fn where_cond(t: &Target) {
    let mut rng = t.rng(9);
    let cond = Arr::from_fn(&[4, 1, 3], |_| rng.below(2) as f64);
    let (a, b) = (
        uniform(&mut rng, &[5, 1], -1.0, 1.0),
        uniform(&mut rng, &[3], 4.0, 6.0),
    );
    let rf = |x: &[Arr], _: &Rd| r::where_cond(&x[0], &x[1], &x[2]);
    let f = |x: &[Tensor]| Tensor::where_cond(&x[0], &x[1], &x[2]);
    t.check(
        "bool condition, all three broadcast",
        &[
            In::Bool(cond.clone()),
            In::Var(a.clone()),
            In::Var(b.clone()),
        ],
        f,
        rf,
    );
    // Strided operands and a strided condition.
    t.check(
        "transposed operands",
        &[
            In::Bool(cond.reshape(&[4, 3])),
            In::Var(uniform(&mut rng, &[3, 4], -1.0, 1.0)),
            In::Var(b.clone()),
        ],
        |x| Tensor::where_cond(&x[0], &x[1].t()?, &x[2]),
        |x, _| r::where_cond(&x[0], &x[1].t(), &x[2]),
    );
    t.check(
        "transposed condition",
        &[
            In::Bool(cond.reshape(&[3, 4])),
            In::Var(uniform(&mut rng, &[4, 3], -1.0, 1.0)),
            In::Var(b),
        ],
        |x| Tensor::where_cond(&x[0].t()?, &x[1], &x[2]),
        |x, _| r::where_cond(&x[0].t(), &x[1], &x[2]),
    );
    // As in PyTorch, the condition must be bool: a float or i64 one is refused, saying how.
    for c in [t.tensor(&cond), t.tensor_as(&cond, DType::I64)] {
        let e = err_msg(Tensor::where_cond(&c, &t.tensor(&a), &t.tensor(&a)));
        assert!(
            e.contains("where") && e.contains("must be a bool") && e.contains("to_dtype"),
            "{e}"
        );
    }
}

fn where_integer(t: &Target) {
    let cond = Arr::new(&[4], vec![1.0, 0.0, 1.0, 0.0]);
    let a = Arr::ints(&[3, 4], &[7, -7, 0, 5, 1 << 40, -3, 12, 1, -9, 4, 4, 6]);
    let b = Arr::ints(&[4], &[2, -2, 0, 4]);
    t.check_with(
        "bool condition",
        EXACT,
        &[In::Bool(cond), In::Fixed(a.clone()), In::Fixed(b.clone())],
        |x| Tensor::where_cond(&x[0], &x[1], &x[2]),
        |x, _| r::where_cond(&x[0], &x[1], &x[2]),
    );
    t.check_with(
        "transposed bool condition",
        EXACT,
        &[
            In::Bool(Arr::ints(&[4, 3], &[1, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0])),
            In::Fixed(a),
            In::Fixed(b),
        ],
        |x| Tensor::where_cond(&x[0].t()?, &x[1], &x[2]),
        |x, _| r::where_cond(&x[0].t(), &x[1], &x[2]),
    );
}

fn causal_mask(t: usize) -> Arr {
    Arr::from_fn(&[t, t], |i| (i[1] > i[0]) as u8 as f64)
}

fn masked_fill(t: &Target) {
    let mut rng = t.rng(10);
    let n = 5;
    let mask = causal_mask(n);
    let fill = |x: &Arr, m: &Arr, v: f64| x.zip(m, |a, b| if b != 0.0 { v } else { a });
    let scores = uniform(&mut rng, &[2, 3, n, n], -2.0, 2.0);
    t.check(
        "causal mask",
        &[In::Var(scores.clone()), In::Bool(mask.clone())],
        |x| x[0].masked_fill(&x[1], -1e4),
        |x, rd| rd.r(fill(&x[0], &x[1], -1e4)),
    );
    // -inf above the diagonal: softmax gives exactly zero weight there.
    t.check(
        "causal -inf + softmax",
        &[In::Var(scores), In::Bool(mask.clone())],
        |x| x[0].masked_fill(&x[1], f32::NEG_INFINITY)?.softmax(-1),
        |x, _| r::softmax(&fill(&x[0], &x[1], f64::NEG_INFINITY), -1),
    );
    t.check(
        "transposed input",
        &[
            In::Var(uniform(&mut rng, &[n, n], -1.0, 1.0)),
            In::Bool(mask.clone()),
        ],
        |x| x[0].t()?.masked_fill(&x[1], 7.0),
        |x, _| fill(&x[0].t(), &x[1], 7.0),
    );
    // A mask broadcast over the leading dimension, and one made by a comparison on the device.
    let m = Arr::from_fn(&[3, 5], |i| ((i[0] * 5 + i[1]) % 4 == 0) as u8 as f64);
    t.check(
        "broadcast mask",
        &[
            In::Var(uniform(&mut rng, &[4, 3, 5], -1.0, 1.0)),
            In::Bool(m.clone()),
        ],
        |x| x[0].masked_fill(&x[1], -2.0),
        |x, _| fill(&x[0], &x[1], -2.0),
    );
    t.check(
        "mask from a comparison",
        &[
            In::Var(uniform(&mut rng, &[4, 3, 5], -1.0, 1.0)),
            In::Fixed(m.clone()),
        ],
        |x| x[0].masked_fill(&x[1].gt(&x[1].zeros_like()?)?, -2.0),
        |x, _| fill(&x[0], &x[1], -2.0),
    );
    // A mask in another dtype is refused (PyTorch: "expected a mask of dtype bool").
    let e = err_msg(t.tensor(&m).masked_fill(&t.tensor(&m), 1.0));
    assert!(
        e.contains("masked_fill") && e.contains("must be a bool"),
        "{e}"
    );
}
