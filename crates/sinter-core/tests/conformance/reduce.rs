//! Reductions (sum, mean, max, min, argmax; integer ones) and softmax / log-softmax.

use crate::harness::*;
use crate::reference::{self as r, Arr};
use sinter_core::{DType, Tensor};

pub fn cases() -> Vec<Case> {
    vec![
        case("sum_mean", FLOATS, sum_mean),
        case("sum_all_mean_all", FLOATS, sum_all_mean_all),
        case("var_std", FLOATS, var_std),
        case("sum_long", FLOATS, sum_long),
        case("max_min_argmax", FLOATS, max_min_argmax),
        case("max_splits_ties", FLOATS, max_splits_ties),
        case("nan_propagates", FLOATS, nan_propagates),
        case("integer", I64, integer),
        case("integer_beyond_f32", I64, integer_beyond_f32),
        case("empty", FLOATS, empty),
        case("repeated_dims", ALL, repeated_dims),
        case("softmax", FLOATS, softmax),
        case("softmax_wide", FLOATS, softmax_wide),
    ]
}

const DIM_SETS: &[&[isize]] = &[
    &[0],
    &[1],
    &[-1],
    &[0, 2],
    &[2, 0],
    &[1, 2],
    &[0, 1, 2],
    &[-2],
];

/// [3,4,5] contiguous, a random shape, a permuted and a narrowed view (taken inside the op,
/// so gradients flow back through the view).
fn views() -> Vec<(
    &'static str,
    Vec<usize>,
    fn(&Tensor) -> sinter_core::Result<Tensor>,
    fn(&Arr) -> Arr,
)> {
    vec![
        ("[3,4,5]", vec![3, 4, 5], |x| Ok(x.clone()), |x| x.clone()),
        ("[2,1,6]", vec![2, 1, 6], |x| Ok(x.clone()), |x| x.clone()),
        (
            "permuted",
            vec![5, 4, 3],
            |x| x.permute(&[2, 1, 0]),
            |x| x.permute(&[2, 1, 0]),
        ),
        (
            "narrowed",
            vec![3, 9, 5],
            |x| x.narrow(1, 3, 4),
            |x| x.narrow(1, 3, 4),
        ),
    ]
}

fn sum_mean(t: &Target) {
    let mut rng = t.rng(20);
    for (what, shape, view, rview) in views() {
        let x = uniform(&mut rng, &shape, -2.0, 2.0);
        for &dims in DIM_SETS {
            for keepdim in [false, true] {
                let tag = format!("{what} dims {dims:?} keepdim {keepdim}");
                t.check(
                    &format!("sum {tag}"),
                    &[In::Var(x.clone())],
                    |v| view(&v[0])?.sum(dims, keepdim),
                    |v, _| r::reduce(&rview(&v[0]), dims, keepdim, r::sum),
                );
                t.check(
                    &format!("mean {tag}"),
                    &[In::Var(x.clone())],
                    |v| view(&v[0])?.mean(dims, keepdim),
                    |v, _| r::reduce(&rview(&v[0]), dims, keepdim, r::mean),
                );
            }
        }
    }
    // An empty dimension sums to zero.
    t.check(
        "sum over an empty dim",
        &[In::Fixed(Arr::new(&[2, 0, 3], vec![]))],
        |v| v[0].sum(&[1], false),
        |v, _| r::reduce(&v[0], &[1], false, r::sum),
    );
}

/// `var` / `std` with corrections 0, 1 (Bessel's) and 2 over the views and dimension sets of
/// `sum_mean`, forward and gradient; a dimension of N ≤ correction gives NaN.
fn var_std(t: &Target) {
    let mut rng = t.rng(26);
    for (what, shape, view, rview) in views() {
        let x = uniform(&mut rng, &shape, -2.0, 2.0);
        for &dims in &[&[0isize][..], &[-1], &[0, 2], &[0, 1, 2]] {
            for (correction, keepdim) in [(1.0, false), (0.0, true), (2.0, false)] {
                let tag = format!("{what} dims {dims:?} correction {correction} keepdim {keepdim}");
                t.check_with(
                    &format!("var {tag}"),
                    rounds(2.0),
                    &[In::Var(x.clone())],
                    |v| view(&v[0])?.var(dims, correction, keepdim),
                    |v, _| r::reduce(&rview(&v[0]), dims, keepdim, |s| r::var(s, correction)),
                );
                t.check_with(
                    &format!("std {tag}"),
                    rounds(2.0),
                    &[In::Var(x.clone())],
                    |v| view(&v[0])?.std(dims, correction, keepdim),
                    |v, _| {
                        r::reduce(&rview(&v[0]), dims, keepdim, |s| {
                            r::var(s, correction).sqrt()
                        })
                    },
                );
            }
        }
    }
    // [2, 1]: one element per row; correction 1 leaves no degree of freedom (NaN), 0 gives 0.
    let x = Arr::new(&[2, 1], vec![3.0, -1.0]);
    for (correction, want) in [(1.0, f64::NAN), (0.0, 0.0)] {
        t.check_with(
            &format!("var of one element, correction {correction}"),
            EXACT,
            &[In::Fixed(x.clone())],
            |v| v[0].var(&[1], correction, false),
            |_, _| Arr::new(&[2], vec![want; 2]),
        );
    }
    let ints = t.ids(&[1, 2], &[2]);
    let e = err_msg(ints.var(&[0], 1.0, false));
    assert!(e.contains("var") && e.contains("i64"), "{e}");
    let e = err_msg(ints.std(&[0], 1.0, false));
    assert!(e.contains("std") && e.contains("i64"), "{e}");
}

fn sum_all_mean_all(t: &Target) {
    let mut rng = t.rng(21);
    let x = uniform(&mut rng, &[3, 4, 5], -2.0, 2.0);
    let all = |a: &Arr, f: fn(&[f64]) -> f64| Arr::scalar(f(&a.data));
    t.check(
        "sum_all of a transpose",
        &[In::Var(x.clone())],
        |v| v[0].t()?.sum_all(),
        |v, _| all(&v[0], r::sum),
    );
    t.check(
        "mean_all",
        &[In::Var(x)],
        |v| v[0].mean_all(),
        |v, _| all(&v[0], r::mean),
    );
}

/// Rows longer than a warp and a block, a long middle dimension, and 2^16 ones (exact only
/// when the accumulator is wider than the half dtypes).
fn sum_long(t: &Target) {
    let mut rng = t.rng(22);
    let long = uniform(&mut rng, &[3, 3000], -1.0, 1.0);
    t.check(
        "sum of long rows",
        &[In::Fixed(long.clone())],
        |v| v[0].sum(&[1], false),
        |v, _| r::reduce(&v[0], &[1], false, r::sum),
    );
    t.check(
        "sum over a long middle dim",
        &[In::Fixed(long.clone())],
        |v| v[0].t()?.contiguous()?.unsqueeze(0)?.sum(&[1], false),
        |v, _| r::reduce(&v[0].t().unsqueeze(0), &[1], false, r::sum),
    );
    t.check(
        "max of long rows",
        &[In::Fixed(long)],
        |v| v[0].max(-1, false),
        |v, _| r::reduce(&v[0], &[-1], false, r::max),
    );
    let n = 1 << 16;
    t.check_with(
        "sum of 2^16 ones",
        EXACT,
        &[In::Fixed(Arr::new(&[n], vec![1.0; n]))],
        |v| v[0].sum_all(),
        |v, _| Arr::scalar(r::sum(&v[0].data)),
    );
    let cube = uniform(&mut rng, &[40, 30, 40], -1.0, 1.0);
    for dims in [&[0isize][..], &[1], &[2], &[0, 2]] {
        t.check(
            &format!("[40,30,40] sum {dims:?}"),
            &[In::Fixed(cube.clone())],
            |v| v[0].sum(dims, false),
            |v, _| r::reduce(&v[0], dims, false, r::sum),
        );
    }
}

fn max_min_argmax(t: &Target) {
    let mut rng = t.rng(23);
    for (what, shape, view, rview) in views() {
        // Distinct values; all negative too (a maximum that starts from 0 would show).
        for shift in [0.0, -20.0] {
            let x = distinct(&mut rng, &shape).map(|v| v + shift);
            for d in [0isize, 1, 2, -1] {
                for keepdim in [false, true] {
                    let tag = format!("{what} shift {shift} dim {d} keepdim {keepdim}");
                    t.check_with(
                        &format!("max {tag}"),
                        EXACT,
                        &[In::Var(x.clone())],
                        |v| view(&v[0])?.max(d, keepdim),
                        |v, _| r::reduce(&rview(&v[0]), &[d], keepdim, r::max),
                    );
                    t.check_with(
                        &format!("min {tag}"),
                        EXACT,
                        &[In::Var(x.clone())],
                        |v| view(&v[0])?.min(d, keepdim),
                        |v, _| r::reduce(&rview(&v[0]), &[d], keepdim, r::min),
                    );
                    t.check_with(
                        &format!("argmax {tag}"),
                        Opts {
                            out: Some(DType::I64),
                            ..EXACT
                        },
                        &[In::Fixed(x.clone())],
                        |v| view(&v[0])?.argmax(d, keepdim),
                        |v, _| r::reduce(&rview(&v[0]), &[d], keepdim, r::argmax),
                    );
                }
            }
        }
    }
    // Ties: argmax takes the first maximum.
    let x = Arr::new(&[2, 4], vec![1.0, 3.0, 3.0, 0.0, -2.0, -1.0, -1.0, -5.0]);
    for d in [0isize, 1] {
        t.check_with(
            &format!("argmax ties dim {d}"),
            Opts {
                out: Some(DType::I64),
                ..EXACT
            },
            &[In::Fixed(x.clone())],
            |v| v[0].argmax(d, false),
            |v, _| r::reduce(&v[0], &[d], false, r::argmax),
        );
    }
}

/// A NaN anywhere in a reduced row makes max and min NaN and argmax its first position
/// (PyTorch's rule), over the last and a middle dimension, whether the NaN comes first or not.
fn nan_propagates(t: &Target) {
    let nan = f64::NAN;
    #[rustfmt::skip]
    let x = Arr::new(&[3, 4], vec![
        1.0, nan, 3.0, nan,
        nan, 2.0, -1.0, 0.5,
        4.0, -2.0, 7.0, nan,
    ]);
    for d in [0isize, 1] {
        extrema(t, &x, d, false);
    }
    // Over a middle dimension of [2, 3, 2] (inner 2).
    let y = Arr::from_fn(
        &[2, 3, 2],
        |i| if i == [1, 2, 0] { nan } else { i[1] as f64 },
    );
    t.check_with(
        "max over a middle dim",
        EXACT,
        &[In::Fixed(y)],
        |v| v[0].max(1, false),
        |v, _| r::reduce(&v[0], &[1], false, r::max),
    );
}

/// A dimension named twice (also as its negative alias) is an error, as in PyTorch.
fn repeated_dims(t: &Target) {
    let x = t.zeros(&[2, 3], t.dtype);
    for dims in [[1isize, 1], [1, -1]] {
        let e = err_msg(x.sum(&dims, false));
        assert!(
            e.contains("dim 1 appears multiple times"),
            "sum {dims:?}: {e}"
        );
        if t.dtype.is_float() {
            let e = err_msg(x.mean(&dims, true));
            assert!(
                e.contains("dim 1 appears multiple times"),
                "mean {dims:?}: {e}"
            );
        }
    }
}

/// The gradient of max goes to the maximal elements, split evenly among ties.
fn max_splits_ties(t: &Target) {
    let x = t
        .tensor(&Arr::new(&[2, 3], vec![1.0, 3.0, 3.0, 0.0, 2.0, -1.0]))
        .to_var()
        .unwrap();
    x.max(1, false)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(
        arr(&x.grad().unwrap()).data,
        vec![0.0, 0.5, 0.5, 0.0, 1.0, 0.0]
    );
}

fn integer(t: &Target) {
    let a = Arr::ints(&[3, 4], &[7, -7, 0, 5, 1000, -3, 12, 1, -9, 4, 4, 6]);
    integer_reductions(t, &a);
    // Ties: the first maximum.
    let tied = Arr::ints(&[2, 4], &[3, 9, 9, 1, 4, 4, 2, 4]);
    t.check_with(
        "argmax ties",
        EXACT,
        &[In::Fixed(tied)],
        |v| v[0].argmax(1, false),
        |v, _| r::reduce(&v[0], &[1], false, r::argmax),
    );
}

/// Values beyond f32's exact integers (2^24): the reductions must stay in integers; sums wrap.
fn integer_beyond_f32(t: &Target) {
    let big = (1i64 << 40) + 1;
    let a = Arr::ints(
        &[3, 4],
        &[7, -7, 0, 5, big, -3, 12, 1, -9, 4, 4, (1 << 24) + 1],
    );
    integer_reductions(t, &a);
    t.check_with(
        "sum wraps",
        EXACT,
        &[In::Fixed(Arr::ints(&[3], &[i64::MAX, 3, 1]))],
        |v| v[0].sum_all(),
        |v, _| Arr::scalar(r::sum_i64(&v[0].data)),
    );
}

/// Reductions over empty dimensions (sums are 0) and the backward of an empty selection.
fn empty(t: &Target) {
    for (shape, d) in [([2usize, 0], 0isize), ([2, 0], 1), ([0, 2], 0), ([0, 2], 1)] {
        t.check(
            &format!("sum {shape:?} dim {d}"),
            &[In::Var(Arr::new(&shape, vec![]))],
            |v| v[0].sum(&[d], false),
            |v, _| r::reduce(&v[0], &[d], false, r::sum),
        );
    }
    // The mean over an empty dimension is 0 / 0 = NaN (PyTorch); so is the mean of nothing.
    for (shape, d) in [([0usize, 3], 0isize), ([3, 0], 1)] {
        t.check_with(
            &format!("mean {shape:?} dim {d}"),
            EXACT,
            &[In::Fixed(Arr::new(&shape, vec![]))],
            |v| v[0].mean(&[d], false),
            |_, _| Arr::new(&[3], vec![f64::NAN; 3]),
        );
    }
    t.check_with(
        "mean_all of nothing",
        EXACT,
        &[In::Fixed(Arr::new(&[0, 2], vec![]))],
        |v| v[0].mean_all(),
        |_, _| Arr::scalar(f64::NAN),
    );
    // Softmax of an empty tensor is an empty tensor of its shape.
    for shape in [[0usize, 3], [3, 0]] {
        let x = t.zeros(&shape, t.dtype);
        for d in [0isize, 1] {
            assert_eq!(
                x.softmax(d).unwrap().shape(),
                shape,
                "softmax {shape:?} dim {d}"
            );
            assert_eq!(
                x.log_softmax(d).unwrap().shape(),
                shape,
                "log_softmax {shape:?}"
            );
        }
    }
    let x = Arr::from_fn(&[2, 3], |i| i[1] as f64);
    t.check(
        "index_select of nothing",
        &[In::Var(x), In::Ids(Arr::new(&[0], vec![]))],
        |v| v[0].index_select(1, &v[1]),
        |v, _| r::index_select(&v[0], 1, &v[1]),
    );
}

fn integer_reductions(t: &Target, a: &Arr) {
    for d in [0isize, 1, -1] {
        for keepdim in [false, true] {
            let tag = format!("dim {d} keepdim {keepdim}");
            let rd =
                |f: fn(&[f64]) -> f64| move |v: &[Arr], _: &Rd| r::reduce(&v[0], &[d], keepdim, f);
            t.check_with(
                &format!("sum {tag}"),
                EXACT,
                &[In::Fixed(a.clone())],
                |v| v[0].sum(&[d], keepdim),
                rd(r::sum_i64),
            );
            extrema(t, a, d, keepdim);
        }
    }
}

/// max, min and argmax of `a` over `d`, exactly (argmax as i64 in every target dtype).
fn extrema(t: &Target, a: &Arr, d: isize, keepdim: bool) {
    let tag = format!("dim {d} keepdim {keepdim}");
    let ops: [(
        &str,
        fn(&Tensor, isize, bool) -> sinter_core::Result<Tensor>,
        fn(&[f64]) -> f64,
    ); 3] = [
        ("max", Tensor::max, r::max),
        ("min", Tensor::min, r::min),
        ("argmax", Tensor::argmax, r::argmax),
    ];
    for (name, f, rf) in ops {
        let out = (name == "argmax").then_some(DType::I64);
        t.check_with(
            &format!("{name} {tag}"),
            Opts { out, ..EXACT },
            &[In::Fixed(a.clone())],
            |v| f(&v[0], d, keepdim),
            |v, _| r::reduce(&v[0], &[d], keepdim, rf),
        );
    }
}

fn softmax(t: &Target) {
    let mut rng = t.rng(24);
    for (what, shape, view, rview) in views() {
        // Far from uniform rows; and shifted by 120 (stability; the inputs themselves large).
        for shift in [0.0, 120.0] {
            let x = uniform(&mut rng, &shape, -6.0, 6.0).map(|v| v + shift);
            for d in [-1isize, 0, 1, 2] {
                let tag = format!("{what} shift {shift} dim {d}");
                // Shifted inputs are only checked forward in half: their rounding at 120 is
                // what the op sees, not a perturbation it must be smooth in.
                let input = if shift == 0.0 || t.dtype == DType::F32 {
                    In::Var(x.clone())
                } else {
                    In::Fixed(x.clone())
                };
                t.check(
                    &format!("softmax {tag}"),
                    std::slice::from_ref(&input),
                    |v| view(&v[0])?.softmax(d),
                    |v, _| r::softmax(&rview(&v[0]), d),
                );
                t.check(
                    &format!("log_softmax {tag}"),
                    &[input],
                    |v| view(&v[0])?.log_softmax(d),
                    |v, _| r::log_softmax(&rview(&v[0]), d),
                );
            }
        }
    }
    // Rows with -inf entries (masked attention): exactly zero weight there.
    let inf = f64::NEG_INFINITY;
    let x = Arr::new(&[2, 3], vec![1.0, inf, 2.0, inf, 0.5, inf]);
    t.check(
        "softmax with -inf",
        &[In::Fixed(x)],
        |v| v[0].softmax(-1),
        |v, _| r::softmax(&v[0], -1),
    );
}

fn softmax_wide(t: &Target) {
    let mut rng = t.rng(25);
    let wide = uniform(&mut rng, &[2, 5000], -5.0, 5.0);
    t.check(
        "softmax of wide rows",
        &[In::Fixed(wide.clone())],
        |v| v[0].softmax(-1),
        |v, _| r::softmax(&v[0], -1),
    );
    t.check(
        "log_softmax of wide rows",
        &[In::Fixed(wide)],
        |v| v[0].log_softmax(-1),
        |v, _| r::log_softmax(&v[0], -1),
    );
    let many = uniform(&mut rng, &[300, 130], -4.0, 4.0);
    t.check(
        "softmax of many rows",
        &[In::Fixed(many)],
        |v| v[0].softmax(-1),
        |v, _| r::softmax(&v[0], -1),
    );
}
