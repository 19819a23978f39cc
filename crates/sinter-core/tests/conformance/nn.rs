//! Forward of the fused NN ops (layer norm, losses), gather/scatter, concatenation and
//! splitting, selection, dropout, dtype casts, and the view ops.

use super::common::*;
use sinter_core::{bf16, f16, DType, Rng, Tensor};

pub fn layer_norm_ref(x: &Arr, g: &[f64], b: &[f64], eps: f64) -> Arr {
    let n = *x.shape.last().unwrap();
    let mut y = Vec::with_capacity(x.data.len());
    for row in x.data.chunks(n) {
        let mean = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
        for (j, v) in row.iter().enumerate() {
            y.push((v - mean) / (var + eps).sqrt() * g[j] + b[j]);
        }
    }
    Arr::new(&x.shape, y)
}

#[test]
fn layer_norm_matches_f64() {
    let mut rng = Rng::new(800);
    let shapes: [&[usize]; 4] = [&[4, 7], &[2, 3, 8], &[1, 1], &[100, 400]];
    for shape in shapes {
        let n = *shape.last().unwrap();
        let x = uniform(&mut rng, shape, -2.0, 3.0);
        let (g, b) = (
            uniform(&mut rng, &[n], 0.5, 1.5),
            uniform(&mut rng, &[n], -0.5, 0.5),
        );
        for eps in [1e-5, 0.1] {
            let want = layer_norm_ref(&Arr::of(&x), &vals(&g), &vals(&b), eps);
            check_f32(
                &x.layer_norm(&g, &b, eps as f32).unwrap(),
                &want,
                &format!("layer_norm {shape:?} eps {eps}"),
            );
        }
    }
    // Non-contiguous input.
    let x = uniform(&mut rng, &[6, 5], -2.0, 2.0).t().unwrap();
    let (g, b) = (
        uniform(&mut rng, &[6], 0.5, 1.5),
        uniform(&mut rng, &[6], -0.5, 0.5),
    );
    let want = layer_norm_ref(&Arr::of(&x), &vals(&g), &vals(&b), 1e-5);
    check_f32(
        &x.layer_norm(&g, &b, 1e-5).unwrap(),
        &want,
        "layer_norm transposed",
    );
}

pub fn cross_entropy_ref(logits: &Arr, targets: &[i64], ignore: i64) -> f64 {
    let c = *logits.shape.last().unwrap();
    let (mut total, mut count) = (0.0, 0);
    for (row, &t) in logits.data.chunks(c).zip(targets) {
        if t == ignore {
            continue;
        }
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        total += lse - row[t as usize];
        count += 1;
    }
    total / count as f64
}

#[test]
fn cross_entropy_with_ignore_index() {
    let mut rng = Rng::new(810);
    for seed in 0..4 {
        let shape = [vec![6, 5], vec![2, 3, 4], vec![9, 3], vec![1, 7]][seed].clone();
        let c = *shape.last().unwrap();
        let rows: usize = shape[..shape.len() - 1].iter().product();
        for (ignore, shift) in [(-100i64, 0.0), (0, 0.0), (-100, 60.0)] {
            let x = uniform(&mut rng, &shape, -3.0, 3.0)
                .add_scalar(shift)
                .unwrap();
            let mut t: Vec<i64> = (0..rows).map(|_| rng.below(c as u64) as i64).collect();
            if rows > 1 {
                t[rows / 2] = ignore;
            }
            if t.iter().all(|&v| v == ignore) {
                t[0] = c as i64 - 1;
            }
            let targets = ids(&t, &shape[..shape.len() - 1]);
            let got = x.cross_entropy(&targets, ignore).unwrap();
            assert_eq!(got.shape(), &[] as &[usize]);
            let want = cross_entropy_ref(&Arr::of(&x), &t, ignore);
            assert_close_vec(
                &vals(&got),
                &[want],
                1e-5,
                1e-6,
                &format!("cross_entropy {shape:?} ignore {ignore} shift {shift}"),
            );
        }
    }
    // Non-contiguous logits.
    let x = uniform(&mut rng, &[5, 6], -3.0, 3.0).t().unwrap();
    let t = vec![0, 4, 2, -100, 1, 3];
    let got = x.cross_entropy(&ids(&t, &[6]), -100).unwrap();
    assert_close_vec(
        &vals(&got),
        &[cross_entropy_ref(&Arr::of(&x), &t, -100)],
        1e-5,
        1e-6,
        "cross_entropy transposed",
    );
}

#[test]
fn mse_loss_matches_f64() {
    let mut rng = Rng::new(820);
    for shape in [vec![3, 4], vec![2, 3, 5], vec![1]] {
        let (a, b) = (
            uniform(&mut rng, &shape, -2.0, 2.0),
            uniform(&mut rng, &shape, -2.0, 2.0),
        );
        let (av, bv) = (vals(&a), vals(&b));
        let want = av
            .iter()
            .zip(&bv)
            .map(|(x, y)| (x - y) * (x - y))
            .sum::<f64>()
            / av.len() as f64;
        assert_close_vec(
            &vals(&a.mse_loss(&b).unwrap()),
            &[want],
            1e-5,
            1e-6,
            "mse_loss",
        );
    }
    let a = uniform(&mut rng, &[4, 3], -2.0, 2.0).t().unwrap();
    let b = uniform(&mut rng, &[3, 4], -2.0, 2.0);
    let (av, bv) = (vals(&a), vals(&b));
    let want = av
        .iter()
        .zip(&bv)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f64>()
        / 12.0;
    assert_close_vec(
        &vals(&a.mse_loss(&b).unwrap()),
        &[want],
        1e-5,
        1e-6,
        "mse_loss transposed",
    );
}

// ---- gather / scatter -------------------------------------------------------------------------

fn index_select_ref(x: &Arr, dim: usize, idx: &[i64]) -> Arr {
    let mut shape = x.shape.clone();
    shape[dim] = idx.len();
    Arr::from_fn(&shape, |i| {
        let mut j = i.to_vec();
        j[dim] = idx[i[dim]] as usize;
        x.get(&j)
    })
}

#[test]
fn index_select_and_embedding() {
    let mut rng = Rng::new(830);
    let x = uniform(&mut rng, &[5, 4, 3], -2.0, 2.0);
    let xp = uniform(&mut rng, &[3, 5, 4], -2.0, 2.0)
        .permute(&[1, 2, 0])
        .unwrap();
    for (what, x) in [("contiguous", &x), ("permuted", &xp)] {
        for (dim, idx) in [
            (0isize, vec![4i64, 0, 4, 2]),
            (1, vec![3, 3, 0]),
            (-1, vec![2, 0]),
            (1, vec![]),
        ] {
            let d = if dim < 0 { 2 } else { dim as usize };
            let got = x.index_select(dim, &ids(&idx, &[idx.len()])).unwrap();
            check_f32(
                &got,
                &index_select_ref(&Arr::of(x), d, &idx),
                &format!("index_select {what} dim {dim} {idx:?}"),
            );
        }
    }
    // Integer tables work too.
    let xi = ids(&[10, 11, 12, 20, 21, 22], &[2, 3]);
    let got = xi.index_select(1, &ids(&[2, 0], &[2])).unwrap();
    assert_eq!(got.to_vec_i64().unwrap(), vec![12, 10, 22, 20]);

    let table = uniform(&mut rng, &[7, 4], -1.0, 1.0);
    let tok = [1i64, 6, 1, 0, 3, 5];
    let got = table.embedding(&ids(&tok, &[2, 3])).unwrap();
    let t = Arr::of(&table);
    let want = Arr::from_fn(&[2, 3, 4], |i| {
        t.get(&[tok[i[0] * 3 + i[1]] as usize, i[2]])
    });
    check_f32(&got, &want, "embedding");
}

fn index_add_ref(base: &Arr, dim: usize, idx: &[i64], src: &Arr) -> Arr {
    let mut out = base.clone();
    let st = strides(&base.shape);
    for_each_index(&src.shape, |i| {
        let mut j = i.to_vec();
        j[dim] = idx[i[dim]] as usize;
        let off: usize = j.iter().zip(&st).map(|(a, b)| a * b).sum();
        out.data[off] += src.get(i);
    });
    out
}

#[test]
fn index_add_accumulates_repeated_indices() {
    let mut rng = Rng::new(840);
    let cases: Vec<(Vec<usize>, usize, Vec<i64>)> = vec![
        (vec![5, 3], 0, vec![1, 4, 1]),
        (vec![3, 5], 1, vec![0, 0, 4, 2]),
        (vec![2, 4, 3], 1, vec![3, 1, 3, 3, 0]),
        (
            vec![50, 512],
            0,
            (0..80).map(|i| (i * 7 % 50) as i64).collect(),
        ),
        (
            vec![3, 40, 300],
            1,
            (0..120).map(|i| (i * 13 % 40) as i64).collect(),
        ),
    ];
    for (shape, dim, idx) in cases {
        let base = uniform(&mut rng, &shape, -1.0, 1.0);
        let mut ss = shape.clone();
        ss[dim] = idx.len();
        let src = uniform(&mut rng, &ss, -1.0, 1.0);
        let got = base
            .index_add(dim as isize, &ids(&idx, &[idx.len()]), &src)
            .unwrap();
        check_f32(
            &got,
            &index_add_ref(&Arr::of(&base), dim, &idx, &Arr::of(&src)),
            &format!("index_add {shape:?} dim {dim}"),
        );
        // The input is left untouched (index_add returns a new tensor).
        assert_eq!(vals(&base), vals(&base.contiguous().unwrap()));
    }
}

// ---- cat / stack / split ----------------------------------------------------------------------

fn cat_ref(parts: &[Arr], dim: usize) -> Arr {
    let mut shape = parts[0].shape.clone();
    shape[dim] = parts.iter().map(|p| p.shape[dim]).sum();
    Arr::from_fn(&shape, |i| {
        let mut k = i[dim];
        for p in parts {
            if k < p.shape[dim] {
                let mut j = i.to_vec();
                j[dim] = k;
                return p.get(&j);
            }
            k -= p.shape[dim];
        }
        unreachable!()
    })
}

#[test]
fn cat_stack_split_chunk() {
    let mut rng = Rng::new(850);
    for (dim, d) in [(0isize, 0usize), (1, 1), (2, 2), (-1, 2), (-3, 0)] {
        let sizes = [2, 1, 3];
        let parts: Vec<Tensor> = sizes
            .iter()
            .enumerate()
            .map(|(k, &s)| {
                let mut shape = vec![2, 3, 4];
                shape[d] = s;
                if k == 1 {
                    // One non-contiguous part.
                    let mut rev = shape.clone();
                    rev.reverse();
                    uniform(&mut rng, &rev, -1.0, 1.0)
                        .permute(&[2, 1, 0])
                        .unwrap()
                } else {
                    uniform(&mut rng, &shape, -1.0, 1.0)
                }
            })
            .collect();
        let arrs: Vec<Arr> = parts.iter().map(Arr::of).collect();
        let got = Tensor::cat(&parts, dim).unwrap();
        check_f32(&got, &cat_ref(&arrs, d), &format!("cat dim {dim}"));
        // split undoes cat, with views.
        let pieces = got.split(&sizes, dim).unwrap();
        for (p, a) in pieces.iter().zip(&arrs) {
            assert!(p.shares_storage_with(&got), "split returns views");
            check_f32(p, a, &format!("split dim {dim}"));
        }
    }
    // stack = cat of unsqueezed.
    let xs: Vec<Tensor> = (0..3)
        .map(|_| uniform(&mut rng, &[2, 4], -1.0, 1.0))
        .collect();
    let arrs: Vec<Arr> = xs.iter().map(Arr::of).collect();
    for (dim, d) in [(0isize, 0usize), (1, 1), (2, 2), (-1, 2)] {
        let got = Tensor::stack(&xs, dim).unwrap();
        let mut shape = vec![2, 4];
        shape.insert(d, 3);
        let want = Arr::from_fn(&shape, |i| {
            let mut j = i.to_vec();
            let k = j.remove(d);
            arrs[k].get(&j)
        });
        check_f32(&got, &want, &format!("stack dim {dim}"));
    }
    // chunk into equal views.
    let x = uniform(&mut rng, &[2, 6, 3], -1.0, 1.0);
    let a = Arr::of(&x);
    for (n, dim, d) in [(3usize, 1isize, 1usize), (2, 0, 0), (3, -1, 2), (1, 1, 1)] {
        let pieces = x.chunk(n, dim).unwrap();
        assert_eq!(pieces.len(), n);
        let len = x.shape()[d] / n;
        for (k, p) in pieces.iter().enumerate() {
            assert!(p.shares_storage_with(&x));
            let mut shape = x.shape().to_vec();
            shape[d] = len;
            let want = Arr::from_fn(&shape, |i| {
                let mut j = i.to_vec();
                j[d] += k * len;
                a.get(&j)
            });
            check_f32(p, &want, &format!("chunk {n} dim {dim} piece {k}"));
        }
    }
}

// ---- where / masked_fill ----------------------------------------------------------------------

#[test]
fn where_and_masked_fill_broadcast() {
    let mut rng = Rng::new(860);
    let cv: Vec<f64> = (0..12).map(|_| rng.below(2) as f64).collect();
    for cond in [
        tensor(&cv, &[4, 1, 3]),
        ids(
            &cv.iter().map(|&v| v as i64).collect::<Vec<_>>(),
            &[4, 1, 3],
        ),
    ] {
        let a = uniform(&mut rng, &[5, 1], -1.0, 1.0);
        let b = uniform(&mut rng, &[3], -1.0, 1.0).add_scalar(5.0).unwrap();
        let got = Tensor::where_cond(&cond, &a, &b).unwrap();
        let (c, aa, ba) = (Arr::of(&cond), Arr::of(&a), Arr::of(&b));
        let want = Arr::from_fn(&[4, 5, 3], |i| {
            if c.get_bcast(i) != 0.0 {
                aa.get_bcast(i)
            } else {
                ba.get_bcast(i)
            }
        });
        check_f32(&got, &want, &format!("where cond {}", cond.dtype()));
    }
    // Any non-zero condition selects `a` (negative and fractional ones too).
    let cond = tensor(&[-1.0, 0.0, 0.5, 2.0, -0.25, 0.0], &[6]);
    let got =
        Tensor::where_cond(&cond, &tensor(&[1.0; 6], &[6]), &tensor(&[0.0; 6], &[6])).unwrap();
    assert_eq!(vals(&got), vec![1.0, 0.0, 1.0, 1.0, 1.0, 0.0]);
    let got = Tensor::where_cond(
        &ids(&[-3, 0, 7], &[3]),
        &ids(&[1, 1, 1], &[3]),
        &ids(&[0, 0, 0], &[3]),
    )
    .unwrap();
    assert_eq!(got.to_vec_i64().unwrap(), vec![1, 0, 1]);
    // Causal mask [T, T] over attention scores [B, H, T, T].
    let t = 5;
    let mask = Arr::from_fn(&[t, t], |i| (i[1] > i[0]) as u8 as f64);
    let mask_t = tensor(&mask.data, &[t, t]);
    let scores = uniform(&mut rng, &[2, 3, t, t], -2.0, 2.0);
    let s = Arr::of(&scores);
    let got = scores.masked_fill(&mask_t, -1e9).unwrap();
    let want = Arr::from_fn(&[2, 3, t, t], |i| if i[3] > i[2] { -1e9 } else { s.get(i) });
    check_f32(&got, &want, "masked_fill causal");
    // With -inf, softmax puts exactly zero weight above the diagonal.
    let p = scores
        .masked_fill(&mask_t, f32::NEG_INFINITY)
        .unwrap()
        .softmax(-1)
        .unwrap();
    let pa = Arr::of(&p);
    for_each_index(&[2, 3, t, t], |i| {
        if i[3] > i[2] {
            assert_eq!(pa.get(i), 0.0);
        }
    });
    let row_sums = p.sum(&[-1], false).unwrap();
    assert_close(
        &row_sums,
        &Arr::new(&[2, 3, t], vec![1.0; 6 * t]),
        1e-6,
        1e-6,
        "masked softmax rows",
    );
    // A non-contiguous input.
    let x = uniform(&mut rng, &[t, t], -1.0, 1.0).t().unwrap();
    let xa = Arr::of(&x);
    let got = x.masked_fill(&mask_t, 7.0).unwrap();
    check_f32(
        &got,
        &Arr::from_fn(&[t, t], |i| if i[1] > i[0] { 7.0 } else { xa.get(i) }),
        "masked_fill transposed",
    );
}

// ---- dropout ----------------------------------------------------------------------------------

#[test]
fn dropout_statistics_scaling_and_determinism() {
    let mut rng = Rng::new(870);
    let x = uniform(&mut rng, &[200, 100], 1.0, 2.0);
    let xv = vals(&x);
    for p in [0.1f32, 0.3, 0.5, 0.9] {
        let y = x.dropout(p, &mut Rng::new(42)).unwrap();
        let yv = vals(&y);
        let zeros = yv.iter().filter(|&&v| v == 0.0).count() as f64 / yv.len() as f64;
        assert!(
            (zeros - p as f64).abs() < 0.02,
            "dropout p={p}: zeroed fraction {zeros}"
        );
        let scale = 1.0 / (1.0 - p as f64);
        for (a, b) in xv.iter().zip(&yv) {
            assert!(
                *b == 0.0 || (b - a * scale).abs() <= 1e-5 * b.abs(),
                "dropout p={p}: kept {b}, input {a}"
            );
        }
        let again = x.dropout(p, &mut Rng::new(42)).unwrap();
        assert_eq!(vals(&again), yv, "same seed, same mask");
        let other = x.dropout(p, &mut Rng::new(43)).unwrap();
        assert_ne!(vals(&other), yv, "another seed, another mask");
    }
    // Successive calls on one generator draw fresh masks.
    let mut r = Rng::new(1);
    assert_ne!(
        vals(&x.dropout(0.5, &mut r).unwrap()),
        vals(&x.dropout(0.5, &mut r).unwrap())
    );
    assert_eq!(vals(&x.dropout(0.0, &mut r).unwrap()), xv);
    expect_err(x.dropout(1.0, &mut r), "dropout");
    expect_err(x.dropout(-0.1, &mut r), "dropout");
}

// ---- dtype casts ------------------------------------------------------------------------------

#[test]
fn dtype_round_trips_stay_within_epsilon() {
    let mut rng = Rng::new(880);
    let x = away_from_zero(&mut rng, &[1000], 1e-3, 1e3);
    let xv = vals(&x);
    // Round-to-nearest: relative error at most half an ulp (2^-11 for f16, 2^-8 for bf16).
    for (dt, eps) in [(DType::F16, 2f64.powi(-11)), (DType::BF16, 2f64.powi(-8))] {
        let h = x.to_dtype(dt).unwrap();
        assert_eq!(h.dtype(), dt);
        assert_eq!(h.shape(), x.shape());
        let back = h.to_dtype(DType::F32).unwrap();
        assert_eq!(back.dtype(), DType::F32);
        let bv = vals(&back);
        let mut exact = 0;
        for (a, b) in xv.iter().zip(&bv) {
            assert!((a - b).abs() <= eps * a.abs(), "{dt}: {a} came back as {b}");
            exact += (a == b) as usize;
        }
        assert!(exact < 100, "{dt}: values did not get rounded at all");
        assert_eq!(vals(&h), bv, "{dt}: reading values widens exactly");
    }
    // Exact agreement with the half crate's rounding, including via a strided view.
    let xt = uniform(&mut rng, &[8, 6], -5.0, 5.0).t().unwrap();
    let h = xt.to_dtype(DType::F16).unwrap();
    let want: Vec<f64> = vals(&xt)
        .iter()
        .map(|&v| f16::from_f64(v).to_f64())
        .collect();
    assert_eq!(vals(&h), want);
    let b = xt.to_dtype(DType::BF16).unwrap();
    let want: Vec<f64> = vals(&xt)
        .iter()
        .map(|&v| bf16::from_f64(v).to_f64())
        .collect();
    assert_eq!(vals(&b), want);
    // f16 -> bf16 -> f32 and integer casts.
    let hb = h
        .to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    for (a, c) in vals(&h).iter().zip(vals(&hb)) {
        assert!((a - c).abs() <= 2f64.powi(-8) * a.abs());
    }
    let i = tensor(&[1.7, -2.3, 0.0, 41.0], &[4])
        .to_dtype(DType::I64)
        .unwrap();
    assert_eq!(i.to_vec_i64().unwrap(), vec![1, -2, 0, 41]);
    assert_eq!(
        vals(&i.to_dtype(DType::F32).unwrap()),
        vec![1.0, -2.0, 0.0, 41.0]
    );
}

// ---- views ------------------------------------------------------------------------------------

#[test]
fn views_have_the_right_values_and_share_storage() {
    let base = Tensor::arange(0.0, 24.0, 1.0, DType::F32, CPU)
        .unwrap()
        .reshape(&[2, 3, 4])
        .unwrap();
    let at = |i: usize, j: usize, k: usize| (i * 12 + j * 4 + k) as f64;
    let check = |v: &Tensor, want: Arr, what: &str, shares: bool| {
        assert_close(v, &want, 0.0, 0.0, what);
        assert_eq!(
            v.shares_storage_with(&base),
            shares,
            "{what}: shares storage"
        );
    };

    check(
        &base,
        Arr::from_fn(&[2, 3, 4], |i| at(i[0], i[1], i[2])),
        "arange+reshape",
        true,
    );
    check(
        &base.reshape(&[4, 6]).unwrap(),
        Arr::new(&[4, 6], (0..24).map(|v| v as f64).collect()),
        "reshape",
        true,
    );
    check(
        &base.reshape(&[6, usize::MAX]).unwrap(),
        Arr::new(&[6, 4], (0..24).map(|v| v as f64).collect()),
        "reshape infer",
        true,
    );
    check(
        &base.flatten_from(1).unwrap(),
        Arr::new(&[2, 12], (0..24).map(|v| v as f64).collect()),
        "flatten_from",
        true,
    );

    let tr = base.transpose(0, 2).unwrap();
    assert!(!tr.is_contiguous());
    check(
        &tr,
        Arr::from_fn(&[4, 3, 2], |i| at(i[2], i[1], i[0])),
        "transpose(0,2)",
        true,
    );
    check(
        &base.t().unwrap(),
        Arr::from_fn(&[2, 4, 3], |i| at(i[0], i[2], i[1])),
        "t()",
        true,
    );
    check(
        &base.transpose(-1, 0).unwrap(),
        Arr::from_fn(&[4, 3, 2], |i| at(i[2], i[1], i[0])),
        "transpose(-1,0)",
        true,
    );

    let pm = base.permute(&[1, 2, 0]).unwrap();
    check(
        &pm,
        Arr::from_fn(&[3, 4, 2], |i| at(i[2], i[0], i[1])),
        "permute",
        true,
    );

    let nr = base.narrow(2, 1, 2).unwrap();
    check(
        &nr,
        Arr::from_fn(&[2, 3, 2], |i| at(i[0], i[1], i[2] + 1)),
        "narrow",
        true,
    );
    check(
        &base.narrow(-2, 1, 2).unwrap(),
        Arr::from_fn(&[2, 2, 4], |i| at(i[0], i[1] + 1, i[2])),
        "narrow(-2)",
        true,
    );
    // Views of views.
    let nt = tr.narrow(0, 1, 2).unwrap().narrow(1, 2, 1).unwrap();
    check(
        &nt,
        Arr::from_fn(&[2, 1, 2], |i| at(i[2], i[1] + 2, i[0] + 1)),
        "narrow of transpose",
        true,
    );
    let pn = nr.permute(&[2, 0, 1]).unwrap();
    check(
        &pn,
        Arr::from_fn(&[2, 2, 3], |i| at(i[1], i[2], i[0] + 1)),
        "permute of narrow",
        true,
    );

    let col = base
        .narrow(2, 3, 1)
        .unwrap()
        .narrow(0, 0, 1)
        .unwrap()
        .squeeze(0)
        .unwrap(); // [3,1]: 3, 7, 11
    check(
        &col,
        Arr::from_fn(&[3, 1], |i| at(0, i[0], 3)),
        "squeeze",
        true,
    );
    let bc = col.broadcast_as(&[2, 3, 4]).unwrap();
    check(
        &bc,
        Arr::from_fn(&[2, 3, 4], |i| at(0, i[1], 3)),
        "broadcast_as",
        true,
    );
    check(
        &col.unsqueeze(0).unwrap(),
        Arr::from_fn(&[1, 3, 1], |i| at(0, i[1], 3)),
        "unsqueeze(0)",
        true,
    );
    check(
        &col.squeeze(-1).unwrap().unsqueeze(-1).unwrap(),
        Arr::from_fn(&[3, 1], |i| at(0, i[0], 3)),
        "unsqueeze(-1)",
        true,
    );
    check(
        &base.unsqueeze(3).unwrap(),
        Arr::from_fn(&[2, 3, 4, 1], |i| at(i[0], i[1], i[2])),
        "unsqueeze(3)",
        true,
    );

    // contiguous(): a no-op when already contiguous, a fresh copy otherwise.
    assert!(base.contiguous().unwrap().shares_storage_with(&base));
    for (v, what) in [
        (&tr, "transpose"),
        (&pm, "permute"),
        (&nr, "narrow"),
        (&bc, "broadcast"),
    ] {
        let c = v.contiguous().unwrap();
        assert!(c.is_contiguous(), "{what}: contiguous() is contiguous");
        assert!(!c.shares_storage_with(&base), "{what}: contiguous() copies");
        assert_eq!(vals(&c), vals(v), "{what}: contiguous() keeps values");
        assert_eq!(c.shape(), v.shape());
        // Reshaping a non-contiguous view must copy, in row-major order of the view.
        let r = v.reshape(&[v.numel()]).unwrap();
        assert!(
            !r.shares_storage_with(&base),
            "{what}: reshape of a strided view copies"
        );
        assert_eq!(vals(&r), vals(v));
    }
    // A contiguous narrow (leading dim) is still a view, and reshapes without copying.
    let lead = base.narrow(0, 1, 1).unwrap();
    assert!(lead.is_contiguous());
    check(
        &lead.reshape(&[12]).unwrap(),
        Arr::new(&[12], (12..24).map(|v| v as f64).collect()),
        "reshape of narrow",
        true,
    );
}
