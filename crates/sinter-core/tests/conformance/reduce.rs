//! Forward of reductions (sum, mean, max, min, argmax) and softmax / log-softmax.

use super::common::*;
use sinter_core::{DType, Rng, Tensor};

/// Reduces `a` over `dims` (resolved, any order) with `f` over the reduced values.
fn reduce_ref(a: &Arr, dims: &[isize], keepdim: bool, f: impl Fn(&[f64]) -> f64) -> Arr {
    let r = a.shape.len() as isize;
    let ds: Vec<usize> = dims
        .iter()
        .map(|&d| if d < 0 { (d + r) as usize } else { d as usize })
        .collect();
    let kept: Vec<usize> = a
        .shape
        .iter()
        .enumerate()
        .map(|(i, &s)| if ds.contains(&i) { 1 } else { s })
        .collect();
    let red: Vec<usize> = a
        .shape
        .iter()
        .enumerate()
        .map(|(i, &s)| if ds.contains(&i) { s } else { 1 })
        .collect();
    let out = Arr::from_fn(&kept, |o| {
        let mut v = Vec::new();
        for_each_index(&red, |k| {
            let idx: Vec<usize> = o.iter().zip(k).map(|(a, b)| a + b).collect();
            v.push(a.get(&idx));
        });
        f(&v)
    });
    if keepdim {
        out
    } else {
        let shape: Vec<usize> = a
            .shape
            .iter()
            .enumerate()
            .filter(|(i, _)| !ds.contains(i))
            .map(|(_, &s)| s)
            .collect();
        Arr::new(&shape, out.data)
    }
}

fn sum(v: &[f64]) -> f64 {
    v.iter().sum()
}
fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}
fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}
fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}
fn argmax(v: &[f64]) -> f64 {
    // First maximum on ties.
    let m = max(v);
    v.iter().position(|&x| x == m).unwrap() as f64
}

const DIM_SETS: &[&[isize]] = &[
    &[0],
    &[1],
    &[-1],
    &[0, 2],
    &[2, 0],
    &[1, 2],
    &[0, 1, 2],
    &[-1, 0],
    &[-2],
];

fn inputs(rng: &mut Rng) -> Vec<(String, Tensor)> {
    let s = rand_shape(rng, 3, 1, 5);
    vec![
        ("[3,4,5]".into(), uniform(rng, &[3, 4, 5], -2.0, 2.0)),
        (format!("{s:?}"), uniform(rng, &s, -2.0, 2.0)),
        (
            "permuted".into(),
            uniform(rng, &[5, 4, 3], -2.0, 2.0)
                .permute(&[2, 1, 0])
                .unwrap(),
        ),
        (
            "narrowed".into(),
            uniform(rng, &[3, 9, 5], -2.0, 2.0).narrow(1, 3, 4).unwrap(),
        ),
    ]
}

#[test]
fn sum_and_mean_over_dims() {
    for seed in 0..3 {
        let mut rng = Rng::new(200 + seed);
        for (what, x) in inputs(&mut rng) {
            let a = Arr::of(&x);
            for &dims in DIM_SETS {
                for keepdim in [false, true] {
                    let tag = format!("{what} dims {dims:?} keepdim {keepdim}");
                    check_f32(
                        &x.sum(dims, keepdim).unwrap(),
                        &reduce_ref(&a, dims, keepdim, sum),
                        &format!("sum {tag}"),
                    );
                    check_f32(
                        &x.mean(dims, keepdim).unwrap(),
                        &reduce_ref(&a, dims, keepdim, mean),
                        &format!("mean {tag}"),
                    );
                }
            }
            let all = x.sum_all().unwrap();
            assert_eq!(all.shape(), &[] as &[usize]);
            assert_close_vec(
                &vals(&all),
                &[sum(&a.data)],
                1e-5,
                1e-5,
                &format!("sum_all {what}"),
            );
            assert_close_vec(
                &vals(&x.mean_all().unwrap()),
                &[mean(&a.data)],
                1e-5,
                1e-5,
                &format!("mean_all {what}"),
            );
        }
    }
}

#[test]
fn sum_over_large_tensors() {
    // Big enough for the parallel reduction path; sums accumulate in f64.
    let mut rng = Rng::new(9);
    let x = uniform(&mut rng, &[40, 30, 40], -1.0, 1.0);
    let a = Arr::of(&x);
    for &dims in &[&[0isize][..], &[1], &[2], &[0, 2]] {
        check_f32(
            &x.sum(dims, false).unwrap(),
            &reduce_ref(&a, dims, false, sum),
            &format!("large sum {dims:?}"),
        );
    }
    let ones = Tensor::ones(&[1 << 20], DType::F32, CPU).unwrap();
    assert_eq!(
        ones.sum_all().unwrap().to_scalar_f32().unwrap(),
        (1 << 20) as f32
    );
}

#[test]
fn max_min_argmax_over_a_dim() {
    for seed in 0..3 {
        let mut rng = Rng::new(300 + seed);
        let shapes = [vec![3, 4, 5], rand_shape(&mut rng, 3, 1, 5)];
        for shape in shapes {
            // All negative: catches a maximum that starts from 0.
            for (what, x) in [
                ("mixed", distinct(&mut rng, &shape, 0.1)),
                (
                    "negative",
                    distinct(&mut rng, &shape, 0.1).add_scalar(-100.0).unwrap(),
                ),
                (
                    "permuted",
                    distinct(&mut rng, &[shape[2], shape[0], shape[1]], 0.1)
                        .permute(&[1, 2, 0])
                        .unwrap(),
                ),
            ] {
                let a = Arr::of(&x);
                for d in [0isize, 1, 2, -1] {
                    for keepdim in [false, true] {
                        let tag = format!("{what} {shape:?} dim {d} keepdim {keepdim}");
                        check_f32(
                            &x.max(d, keepdim).unwrap(),
                            &reduce_ref(&a, &[d], keepdim, max),
                            &format!("max {tag}"),
                        );
                        check_f32(
                            &x.min(d, keepdim).unwrap(),
                            &reduce_ref(&a, &[d], keepdim, min),
                            &format!("min {tag}"),
                        );
                        let am = x.argmax(d, keepdim).unwrap();
                        assert_eq!(am.dtype(), DType::I64);
                        assert_close(
                            &am,
                            &reduce_ref(&a, &[d], keepdim, argmax),
                            0.0,
                            0.0,
                            &format!("argmax {tag}"),
                        );
                    }
                }
            }
        }
    }
    // Ties: argmax takes the first maximum.
    let x = tensor(&[1.0, 3.0, 3.0, 0.0, -2.0, -1.0, -1.0, -5.0], &[2, 4]);
    assert_eq!(
        x.argmax(1, false).unwrap().to_vec_i64().unwrap(),
        vec![1, 1]
    );
    assert_eq!(
        x.argmax(0, false).unwrap().to_vec_i64().unwrap(),
        vec![0, 0, 0, 0]
    );
}

fn softmax_ref(a: &Arr, dim: isize, log: bool) -> Arr {
    let r = a.shape.len() as isize;
    let d = if dim < 0 {
        (dim + r) as usize
    } else {
        dim as usize
    };
    Arr::from_fn(&a.shape, |i| {
        let mut j = i.to_vec();
        let row: Vec<f64> = (0..a.shape[d])
            .map(|k| {
                j[d] = k;
                a.get(&j)
            })
            .collect();
        let m = max(&row);
        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        let x = a.get(i);
        if log {
            x - lse
        } else {
            (x - lse).exp()
        }
    })
}

#[test]
fn softmax_and_log_softmax_over_any_dim() {
    for seed in 0..3 {
        let mut rng = Rng::new(400 + seed);
        for (what, x) in inputs(&mut rng) {
            // Scaled so that rows are far from uniform, and shifted to test stability.
            for (tag, x) in [
                ("", x.mul_scalar(3.0).unwrap()),
                (" shifted", x.add_scalar(120.0).unwrap()),
            ] {
                let a = Arr::of(&x);
                for d in [-1isize, 0, 1, 2] {
                    let sm = x.softmax(d).unwrap();
                    assert_close(
                        &sm,
                        &softmax_ref(&a, d, false),
                        1e-5,
                        1e-7,
                        &format!("softmax {what}{tag} dim {d}"),
                    );
                    let ls = x.log_softmax(d).unwrap();
                    assert_close(
                        &ls,
                        &softmax_ref(&a, d, true),
                        1e-5,
                        1e-5,
                        &format!("log_softmax {what}{tag} dim {d}"),
                    );
                }
            }
        }
    }
    // Large (parallel rows), and rows with -inf entries (masked attention).
    let mut rng = Rng::new(3);
    let x = uniform(&mut rng, &[300, 130], -4.0, 4.0);
    check_f32(
        &x.softmax(-1).unwrap(),
        &softmax_ref(&Arr::of(&x), -1, false),
        "softmax large",
    );
    let x = tensor(
        &[
            1.0,
            f64::NEG_INFINITY,
            2.0,
            f64::NEG_INFINITY,
            0.5,
            f64::NEG_INFINITY,
        ],
        &[2, 3],
    );
    let want = softmax_ref(&Arr::of(&x), -1, false);
    assert_close(
        &x.softmax(-1).unwrap(),
        &want,
        1e-6,
        1e-7,
        "softmax with -inf",
    );
}
