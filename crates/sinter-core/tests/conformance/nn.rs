//! The NN ops: layer norm, cross-entropy, MSE, gathers and scatters (index_select, embedding,
//! index_add), concatenation and splitting, dropout statistics, and dtype casts.

use crate::harness::*;
use crate::reference::{self as r, round_to, Arr};
use sinter_core::{CrossEntropyOptions, DType, Reduction, Rng, Tensor};

pub fn cases() -> Vec<Case> {
    vec![
        case("layer_norm", FLOATS, layer_norm),
        case("cross_entropy", FLOATS, cross_entropy),
        case("cross_entropy_options", FLOATS, cross_entropy_options),
        case("mse_loss", FLOATS, mse_loss),
        case("index_select", ALL, index_select),
        case("embedding", ALL, embedding),
        case("index_add", FLOATS, index_add),
        case("cat_stack", ALL, cat_stack),
        case("split_chunk", FLOATS, split_chunk),
        case("dropout", FLOATS, dropout),
        case("casts", ALL, casts),
        case("assign", FLOATS, assign),
    ]
}

fn layer_norm(t: &Target) {
    let mut rng = t.rng(40);
    for shape in [
        &[4, 7][..],
        &[2, 3, 8],
        &[1, 1],
        &[70, 5],
        &[4, 6, 32],
        &[3, 1000],
    ] {
        let n = *shape.last().unwrap();
        let x = uniform(&mut rng, shape, -2.0, 3.0);
        let (g, b) = (
            uniform(&mut rng, &[n], 0.5, 1.5),
            uniform(&mut rng, &[n], -0.5, 0.5),
        );
        for eps in [1e-5, 0.1] {
            t.check(
                &format!("{shape:?} eps {eps}"),
                &[In::Var(x.clone()), In::Var(g.clone()), In::Var(b.clone())],
                |v| v[0].layer_norm(&v[1], &v[2], eps as f32),
                |v, _| r::layer_norm(&v[0], &v[1], &v[2], eps as f32 as f64),
            );
        }
    }
    // A transposed input with frozen affine parameters.
    let x = uniform(&mut rng, &[6, 5], -2.0, 2.0);
    let (g, b) = (
        uniform(&mut rng, &[6], 0.5, 1.5),
        uniform(&mut rng, &[6], -0.5, 0.5),
    );
    t.check(
        "transposed, fixed affine",
        &[In::Var(x), In::Fixed(g), In::Fixed(b)],
        |v| v[0].t()?.layer_norm(&v[1], &v[2], 1e-5),
        |v, _| r::layer_norm(&v[0].t(), &v[1], &v[2], 1e-5f32 as f64),
    );
}

fn targets(rng: &mut Rng, rows: usize, c: usize, ignore: i64) -> Vec<i64> {
    let mut t: Vec<i64> = (0..rows).map(|_| rng.below(c as u64) as i64).collect();
    if rows > 1 {
        t[rows / 2] = ignore;
    }
    if t.iter().all(|&v| v == ignore) {
        t[0] = c as i64 - 1;
    }
    t
}

/// PyTorch's options: every reduction, with and without class weights (which get gradients
/// too), label smoothing 0 / 0.2 / 1, an ignore index outside and inside the classes.
fn cross_entropy_options(t: &Target) {
    let mut rng = t.rng(42);
    let f32_out = Opts {
        out: Some(DType::F32),
        roundings: 2.0,
        ..Opts::default()
    };
    for shape in [vec![6, 5], vec![2, 3, 4]] {
        let c = *shape.last().unwrap();
        let lead = &shape[..shape.len() - 1];
        let rows: usize = lead.iter().product();
        let w = uniform(&mut rng, &[c], 0.2, 2.0);
        for (ignore, eps) in [(-100i64, 0.0), (1, 0.2), (-100, 1.0)] {
            let x = uniform(&mut rng, &shape, -3.0, 3.0);
            let tg = Arr::ints(lead, &targets(&mut rng, rows, c, ignore));
            for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
                let name = format!("{reduction:?}").to_lowercase();
                let tag = format!("{shape:?} ignore {ignore} ε {eps} {name}");
                let opts = move |weight: Option<Tensor>| CrossEntropyOptions {
                    reduction,
                    weight,
                    label_smoothing: eps,
                    ignore_index: ignore,
                };
                t.check_with(
                    &tag,
                    f32_out,
                    &[In::Var(x.clone()), In::Ids(tg.clone())],
                    |v| v[0].cross_entropy_with(&v[1], &opts(None)),
                    |v, _| r::cross_entropy_with(&v[0], &v[1], None, eps, ignore, &name),
                );
                t.check_with(
                    &format!("{tag} weighted"),
                    f32_out,
                    &[In::Var(x.clone()), In::Ids(tg.clone()), In::Var(w.clone())],
                    |v| v[0].cross_entropy_with(&v[1], &opts(Some(v[2].clone()))),
                    |v, _| r::cross_entropy_with(&v[0], &v[1], Some(&v[2]), eps, ignore, &name),
                );
            }
        }
    }
    let x = t.tensor(&uniform(&mut rng, &[3, 4], -1.0, 1.0));
    let tg = t.ids(&[0, 1, 2], &[3]);
    for (bad, what) in [
        (
            CrossEntropyOptions {
                label_smoothing: 1.5,
                ..Default::default()
            },
            "label_smoothing",
        ),
        (
            CrossEntropyOptions {
                weight: Some(t.zeros(&[3], DType::F32)),
                ..Default::default()
            },
            "weight",
        ),
    ] {
        let e = err_msg(x.cross_entropy_with(&tg, &bad));
        assert!(e.contains("cross_entropy") && e.contains(what), "{e}");
    }
}

fn cross_entropy(t: &Target) {
    let mut rng = t.rng(41);
    let f32_out = Opts {
        out: Some(DType::F32),
        ..Opts::default()
    };
    for shape in [
        vec![6, 5],
        vec![2, 3, 4],
        vec![9, 3],
        vec![1, 7],
        vec![2, 3, 50],
    ] {
        let c = *shape.last().unwrap();
        let lead = &shape[..shape.len() - 1];
        let rows: usize = lead.iter().product();
        for (ignore, shift) in [(-100i64, 0.0), (0, 0.0), (-100, 60.0)] {
            let x = uniform(&mut rng, &shape, -3.0, 3.0).map(|v| v + shift);
            let tg = Arr::ints(lead, &targets(&mut rng, rows, c, ignore));
            let logits = if shift == 0.0 {
                In::Var(x)
            } else {
                In::Fixed(x)
            };
            t.check_with(
                &format!("{shape:?} ignore {ignore} shift {shift}"),
                f32_out,
                &[logits, In::Ids(tg)],
                |v| v[0].cross_entropy(&v[1], ignore),
                |v, _| r::cross_entropy(&v[0], &v[1], ignore),
            );
        }
    }
    let x = uniform(&mut rng, &[5, 6], -3.0, 3.0);
    let tg = Arr::ints(&[6], &[0, 4, 2, -100, 1, 3]);
    t.check_with(
        "transposed logits",
        f32_out,
        &[In::Var(x.clone()), In::Ids(tg.clone())],
        |v| v[0].t()?.cross_entropy(&v[1], -100),
        |v, _| r::cross_entropy(&v[0].t(), &v[1], -100),
    );
    t.check_with(
        "targets on the host",
        f32_out,
        &[In::Var(x.clone()), In::HostIds(tg.clone())],
        |v| v[0].t()?.cross_entropy(&v[1], -100),
        |v, _| r::cross_entropy(&v[0].t(), &v[1], -100),
    );
    // Scaled afterwards: the incoming gradient must be honoured.
    t.check_with(
        "scaled loss",
        f32_out,
        &[In::Var(x), In::Ids(tg)],
        |v| v[0].t()?.cross_entropy(&v[1], -100)?.mul_scalar(-2.5),
        |v, _| r::cross_entropy(&v[0].t(), &v[1], -100).map(|l| -2.5 * l),
    );
}

fn mse_loss(t: &Target) {
    let mut rng = t.rng(42);
    for shape in [vec![3, 4], vec![2, 3, 5], vec![1]] {
        // sub, sqr, the sum and its scaling each round in half precision.
        t.check_with(
            &format!("{shape:?}"),
            rounds(3.0),
            &[
                In::Var(uniform(&mut rng, &shape, -2.0, 2.0)),
                In::Var(uniform(&mut rng, &shape, -2.0, 2.0)),
            ],
            |v| v[0].mse_loss(&v[1]),
            |v, rd| r::mse(&rd.r(v[0].zip(&v[1], |a, b| a - b)), &Arr::scalar(0.0)),
        );
    }
    t.check_with(
        "transposed",
        rounds(3.0),
        &[
            In::Var(uniform(&mut rng, &[3, 4], -2.0, 2.0)),
            In::Var(uniform(&mut rng, &[4, 3], -2.0, 2.0)),
        ],
        |v| v[0].mse_loss(&v[1].t()?),
        |v, rd| r::mse(&rd.r(v[0].zip(&v[1].t(), |a, b| a - b)), &Arr::scalar(0.0)),
    );
}

/// A float input that is a variable when the dtype allows it.
fn var_or_fixed(t: &Target, a: Arr) -> In {
    if t.dtype.is_float() {
        In::Var(a)
    } else {
        In::Fixed(a)
    }
}

fn values(t: &Target, rng: &mut Rng, shape: &[usize]) -> Arr {
    if t.dtype.is_float() {
        uniform(rng, shape, -2.0, 2.0)
    } else {
        Arr::from_fn(shape, |_| rng.below(1 << 20) as f64 * 4096.0 - 1e9)
    }
}

fn index_select(t: &Target) {
    let mut rng = t.rng(43);
    for (what, shape, permuted) in [
        ("contiguous", [5, 4, 3], false),
        ("permuted", [3, 5, 4], true),
    ] {
        let x = values(t, &mut rng, &shape);
        for (dim, idx) in [
            (0isize, vec![4i64, 0, 4, 2]),
            (1, vec![3, 3, 0]),
            (-1, vec![2, 0]),
            (1, vec![]),
        ] {
            let view = move |v: &Tensor| {
                if permuted {
                    v.permute(&[1, 2, 0])
                } else {
                    Ok(v.clone())
                }
            };
            let rview = move |v: &Arr| {
                if permuted {
                    v.permute(&[1, 2, 0])
                } else {
                    v.clone()
                }
            };
            for host in [false, true] {
                let ids = Arr::ints(&[idx.len()], &idx);
                let ids = if host { In::HostIds(ids) } else { In::Ids(ids) };
                // (The backward of an empty selection: `reduce::empty`.)
                let x = if idx.is_empty() {
                    In::Fixed(x.clone())
                } else {
                    var_or_fixed(t, x.clone())
                };
                t.check_with(
                    &format!("{what} dim {dim} {idx:?} host ids {host}"),
                    EXACT,
                    &[x, ids],
                    |v| view(&v[0])?.index_select(dim, &v[1]),
                    |v, _| r::index_select(&rview(&v[0]), dim, &v[1]),
                );
            }
        }
    }
}

fn embedding(t: &Target) {
    let mut rng = t.rng(44);
    let table = values(t, &mut rng, &[20, 8]);
    let tok = Arr::ints(&[3, 4], &[3, 19, 0, 3, 3, 7, 12, 0, 5, 5, 5, 1]);
    t.check_with(
        "device ids",
        EXACT,
        &[var_or_fixed(t, table.clone()), In::Ids(tok.clone())],
        |v| v[0].embedding(&v[1]),
        |v, _| r::embedding(&v[0], &v[1]),
    );
    t.check_with(
        "host ids",
        EXACT,
        &[var_or_fixed(t, table), In::HostIds(tok)],
        |v| v[0].embedding(&v[1]),
        |v, _| r::embedding(&v[0], &v[1]),
    );
}

fn index_add(t: &Target) {
    let mut rng = t.rng(45);
    let cases: Vec<(Vec<usize>, isize, Vec<i64>)> = vec![
        (vec![5, 3], 0, vec![1, 4, 1]),
        (vec![3, 5], 1, vec![0, 0, 4, 2]),
        (vec![2, 4, 3], 1, vec![3, 1, 3, 3, 0]),
        (vec![3, 5, 4], 2, vec![3, 3, 1]),
    ];
    for (shape, dim, idx) in cases {
        let mut ss = shape.clone();
        ss[dim as usize] = idx.len();
        for host in [false, true] {
            let ids = Arr::ints(&[idx.len()], &idx);
            let ids = if host { In::HostIds(ids) } else { In::Ids(ids) };
            t.check(
                &format!("{shape:?} dim {dim} host ids {host}"),
                &[
                    In::Var(uniform(&mut rng, &shape, -1.0, 1.0)),
                    ids,
                    In::Var(uniform(&mut rng, &ss, -1.0, 1.0)),
                ],
                |v| v[0].index_add(dim, &v[1], &v[2]),
                |v, _| r::index_add(&v[0], dim, &v[1], &v[2]),
            );
        }
    }
    // Many repeated indices, and the input left untouched.
    for (shape, dim, n, k) in [
        (vec![50, 64], 0isize, 80usize, 7usize),
        (vec![3, 40, 30], 1, 120, 13),
    ] {
        let m = shape[dim as usize];
        let idx: Vec<i64> = (0..n).map(|i| (i * k % m) as i64).collect();
        let mut ss = shape.clone();
        ss[dim as usize] = n;
        let base = uniform(&mut rng, &shape, -1.0, 1.0);
        let bt = t.tensor(&base);
        t.check(
            &format!("{shape:?} dim {dim} {n} repeated indices"),
            &[
                In::Fixed(base),
                In::Ids(Arr::ints(&[n], &idx)),
                In::Fixed(uniform(&mut rng, &ss, -1.0, 1.0)),
            ],
            |v| v[0].index_add(dim, &v[1], &v[2]),
            |v, _| r::index_add(&v[0], dim, &v[1], &v[2]),
        );
        let before = arr(&bt);
        let _ = bt
            .index_add(
                dim,
                &t.ids(&idx, &[n]),
                &t.tensor(&uniform(&mut rng, &ss, -1.0, 1.0)),
            )
            .unwrap();
        assert_eq!(arr(&bt), before, "index_add returns a new tensor");
    }
}

fn cat_stack(t: &Target) {
    let mut rng = t.rng(46);
    for (dim, d) in [(0isize, 0usize), (1, 1), (2, 2), (-1, 2), (-3, 0)] {
        let sizes = [2, 1, 3];
        let shapes: Vec<Vec<usize>> = sizes
            .iter()
            .map(|&s| {
                let mut shape = vec![2, 3, 4];
                shape[d] = s;
                shape
            })
            .collect();
        // The middle part is a permuted (non-contiguous) view.
        let rev = |s: &[usize]| s.iter().rev().copied().collect::<Vec<_>>();
        let inputs = [
            var_or_fixed(t, values(t, &mut rng, &shapes[0])),
            var_or_fixed(t, values(t, &mut rng, &rev(&shapes[1]))),
            var_or_fixed(t, values(t, &mut rng, &shapes[2])),
        ];
        t.check_with(
            &format!("cat dim {dim}"),
            EXACT,
            &inputs,
            |v| {
                Tensor::cat(
                    &[v[0].clone(), v[1].permute(&[2, 1, 0])?, v[2].clone()],
                    dim,
                )
            },
            |v, _| r::cat(&[v[0].clone(), v[1].permute(&[2, 1, 0]), v[2].clone()], dim),
        );
    }
    let xs: Vec<Arr> = (0..3).map(|_| values(t, &mut rng, &[2, 4])).collect();
    for dim in [0isize, 1, 2, -1] {
        t.check_with(
            &format!("stack dim {dim}"),
            EXACT,
            &[
                var_or_fixed(t, xs[0].clone()),
                var_or_fixed(t, xs[1].clone()),
                var_or_fixed(t, xs[2].clone()),
            ],
            |v| Tensor::stack(&[v[0].clone(), v[1].t()?.t()?, v[2].clone()], dim),
            |v, _| r::stack(v, dim),
        );
    }
}

fn split_chunk(t: &Target) {
    let mut rng = t.rng(47);
    let x = uniform(&mut rng, &[2, 6, 3], -1.0, 1.0);
    // split and chunk are views; recombined through ops so both gradient paths count.
    t.check_with(
        "split",
        rounds(2.0),
        &[In::Var(x.clone())],
        |v| {
            let p = v[0].split(&[1, 3, 2], 1)?;
            assert!(
                p.iter().all(|q| q.shares_storage_with(&v[0])),
                "split returns views"
            );
            Tensor::cat(&[p[2].sqr()?, p[0].clone(), p[1].mul_scalar(3.0)?], 1)
        },
        |v, _| {
            let (a, b, c) = (
                v[0].narrow(1, 0, 1),
                v[0].narrow(1, 1, 3),
                v[0].narrow(1, 4, 2),
            );
            r::cat(&[c.map(|x| x * x), a, b.map(|x| 3.0 * x)], 1)
        },
    );
    t.check_with(
        "chunk",
        rounds(3.0),
        &[In::Var(x)],
        |v| {
            let p = v[0].chunk(3, -1)?;
            assert!(
                p.iter().all(|q| q.shares_storage_with(&v[0])),
                "chunk returns views"
            );
            p[0].mul(&p[2])?.add(&p[1].tanh()?)
        },
        |v, rd| {
            let p: Vec<Arr> = (0..3).map(|k| v[0].narrow(-1, k, 1)).collect();
            rd.r(p[0].mul(&p[2])).add(&rd.r(p[1].map(f64::tanh)))
        },
    );
    // Errors name the op.
    let x = t.tensor(&uniform(&mut rng, &[2, 3], -1.0, 1.0));
    expect_err(x.split(&[1, 1], 1), "split");
    expect_err(x.chunk(2, 1), "chunk");
}

/// Statistics (zeroed fraction, scaling of the kept values), determinism by seed, and a backward
/// that applies the forward's mask.
fn dropout(t: &Target) {
    let mut rng = t.rng(48);
    let xa = uniform(&mut rng, &[200, 100], 1.0, 2.0);
    let x = t.tensor(&xa);
    let xv = t.round(&xa).data;
    for p in [0.1f32, 0.3, 0.5, 0.9] {
        let y = arr(&x.dropout(p, &mut Rng::new(42)).unwrap()).data;
        let zeros = y.iter().filter(|&&v| v == 0.0).count() as f64 / y.len() as f64;
        assert!(
            (zeros - p as f64).abs() < 0.02,
            "p={p}: zeroed fraction {zeros}"
        );
        let scale = 1.0 / (1.0 - p as f64);
        let tl = t.tol();
        for (a, b) in xv.iter().zip(&y) {
            let want = a * scale;
            assert!(
                *b == 0.0 || (b - want).abs() <= tl.rel * want + 1e-6 * want,
                "p={p}: kept {b}, input {a}, want {want}"
            );
        }
        assert_eq!(
            arr(&x.dropout(p, &mut Rng::new(42)).unwrap()).data,
            y,
            "same seed, same mask"
        );
        assert_ne!(
            arr(&x.dropout(p, &mut Rng::new(43)).unwrap()).data,
            y,
            "another seed, another mask"
        );
    }
    // Successive draws from one generator differ; p = 0 is the identity; bad p is an error.
    let mut g = Rng::new(1);
    assert_ne!(
        arr(&x.dropout(0.5, &mut g).unwrap()),
        arr(&x.dropout(0.5, &mut g).unwrap())
    );
    assert_eq!(arr(&x.dropout(0.0, &mut g).unwrap()).data, xv);
    expect_err(x.dropout(1.0, &mut g), "dropout");
    expect_err(x.dropout(-0.1, &mut g), "dropout");
    // The backward applies the same mask and scale: d Σ w∘dropout(x) / dx = w ∘ (y / x).
    let v = t
        .tensor(&Arr::new(&[4000], vec![1.0; 4000]))
        .to_var()
        .unwrap();
    let y = v.dropout(0.3, &mut Rng::new(7)).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(
        arr(&v.grad().unwrap()),
        arr(&y),
        "the gradient of Σ dropout(1) is the scaled mask"
    );
}

/// Every dtype to every dtype, exactly as the reference rounds (nearest-even for floats,
/// truncation toward zero into i64), including through a strided view.
fn casts(t: &Target) {
    let mut rng = t.rng(49);
    let x = if t.dtype.is_float() {
        away_from_zero(&mut rng, &[20, 50], 1e-3, 1e3)
    } else {
        Arr::from_fn(&[20, 50], |_| rng.below(1 << 20) as f64 - (1 << 19) as f64)
    };
    for to in [DType::F32, DType::BF16, DType::F16, DType::I64] {
        let o = Opts {
            out: Some(to),
            ..EXACT
        };
        t.check_with(
            &format!("to {to}"),
            o,
            &[In::Fixed(x.clone())],
            |v| v[0].to_dtype(to),
            move |v, _| v[0].map(|a| round_to(to, a)),
        );
        t.check_with(
            &format!("to {to} of a transpose"),
            o,
            &[In::Fixed(x.clone())],
            |v| v[0].t()?.to_dtype(to),
            move |v, _| v[0].t().map(|a| round_to(to, a)),
        );
    }
    if t.dtype.is_float() {
        // Floats with fractions truncate toward zero into i64.
        let f = Arr::new(&[4], vec![1.9, -1.9, 0.4, 7.0]);
        let o = Opts {
            out: Some(DType::I64),
            ..EXACT
        };
        t.check_with(
            "to i64 truncates",
            o,
            &[In::Fixed(f)],
            |v| v[0].to_dtype(DType::I64),
            |v, _| v[0].map(f64::trunc),
        );
        // The gradient through a cast comes back in the source dtype.
        let to = if t.dtype == DType::F32 {
            DType::BF16
        } else {
            DType::F32
        };
        t.check_with(
            &format!("gradient through a cast to {to}"),
            Opts {
                out: Some(to),
                ..Opts::default()
            },
            &[In::Var(uniform(&mut rng, &[3, 4], -2.0, 2.0))],
            |v| v[0].to_dtype(to),
            |v, rd| rd.r(v[0].clone()),
        );
    }
}

/// assign writes through a strided view of the destination, casting from f32.
fn assign(t: &Target) {
    let mut rng = t.rng(50);
    let src = uniform(&mut rng, &[3, 5], -4.0, 4.0);
    let dst = t.zeros(&[4, 6], t.dtype);
    let s = make(&src, DType::F32, t.dev);
    dst.narrow(1, 2, 3)
        .unwrap()
        .t()
        .unwrap()
        .narrow(1, 0, 4)
        .unwrap()
        .assign(&s.narrow(1, 0, 4).unwrap())
        .unwrap();
    // dst[i, 2 + j] = src[j, i] for i < 4, j < 3.
    let want = Arr::from_fn(&[4, 6], |i| {
        if (2..5).contains(&i[1]) {
            round_to(t.dtype, round_to(DType::F32, src.get(&[i[1] - 2, i[0]])))
        } else {
            0.0
        }
    });
    assert_eq!(arr(&dst), want);
}
