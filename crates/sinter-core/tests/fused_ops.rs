//! Each fused op against its composite reference: forward values and every input's gradient,
//! on random shapes, with contiguous and non-contiguous (strided view) inputs.

use sinter_core::fused;
use sinter_core::{DType, Device, Rng, Tensor};

fn randn(shape: &[usize], rng: &mut Rng) -> Tensor {
    Tensor::randn(shape, 0.0, 1.0, rng, DType::F32, Device::Cpu).unwrap()
}

fn vals(t: &Tensor) -> Vec<f32> {
    t.to_vec_f32().unwrap()
}

/// max |a − b| ≤ tol · max(1, max |b|).
fn assert_close(what: &str, a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = b.iter().fold(1f32, |m, x| m.max(x.abs()));
    let (i, err) = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .enumerate()
        .fold(
            (0, 0f32),
            |m, (i, e)| if e > m.1 || e.is_nan() { (i, e) } else { m },
        );
    assert!(
        err <= tol * scale,
        "{what}: max error {err} at {i} ({} vs {}), scale {scale}",
        a[i],
        b[i]
    );
}

/// Σ out ∘ w, so every output element gets a distinct gradient.
fn weighted_sum(out: &Tensor, w: &Tensor) -> Tensor {
    out.mul(w).unwrap().sum_all().unwrap()
}

/// How q, k and v are produced from leaves: each way yields [b, h, t, d] views.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Contiguous [b, h, t, d] leaves.
    Contiguous,
    /// [b, t, h, d] leaves viewed through transpose(1, 2).
    Transposed,
    /// One packed [b, t, 3·h·d] leaf split like a qkv projection (narrow, reshape, transpose).
    Packed,
}

struct Qkv {
    leaves: Vec<Tensor>,
    q: Tensor,
    k: Tensor,
    v: Tensor,
}

fn make_qkv(layout: Layout, b: usize, h: usize, tq: usize, tk: usize, d: usize, seed: u64) -> Qkv {
    let mut rng = Rng::new(seed);
    match layout {
        Layout::Contiguous => {
            let q = randn(&[b, h, tq, d], &mut rng).to_var().unwrap();
            let k = randn(&[b, h, tk, d], &mut rng).to_var().unwrap();
            let v = randn(&[b, h, tk, d], &mut rng).to_var().unwrap();
            Qkv {
                leaves: vec![q.clone(), k.clone(), v.clone()],
                q,
                k,
                v,
            }
        }
        Layout::Transposed => {
            let q = randn(&[b, tq, h, d], &mut rng).to_var().unwrap();
            let k = randn(&[b, tk, h, d], &mut rng).to_var().unwrap();
            let v = randn(&[b, tk, h, d], &mut rng).to_var().unwrap();
            let tr = |t: &Tensor| t.transpose(1, 2).unwrap();
            Qkv {
                q: tr(&q),
                k: tr(&k),
                v: tr(&v),
                leaves: vec![q, k, v],
            }
        }
        Layout::Packed => {
            assert_eq!(tq, tk);
            let c = h * d;
            let qkv = randn(&[b, tq, 3 * c], &mut rng).to_var().unwrap();
            let head = |i: usize| {
                qkv.narrow(2, i * c, c)
                    .unwrap()
                    .reshape(&[b, tq, h, d])
                    .unwrap()
                    .transpose(1, 2)
                    .unwrap()
            };
            Qkv {
                q: head(0),
                k: head(1),
                v: head(2),
                leaves: vec![qkv.clone()],
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn check_attention(
    layout: Layout,
    b: usize,
    h: usize,
    tq: usize,
    tk: usize,
    d: usize,
    causal: bool,
    seed: u64,
) {
    let what = format!("{layout:?} b{b} h{h} tq{tq} tk{tk} d{d} causal={causal}");
    let scale = 1.0 / (d as f32).sqrt();
    let w = randn(&[b, h, tq, d], &mut Rng::new(seed + 1000));
    let run = |fused_path: bool| {
        let t = make_qkv(layout, b, h, tq, tk, d, seed);
        let out = if fused_path {
            fused::attention(&t.q, &t.k, &t.v, causal, scale)
        } else {
            fused::attention_reference(&t.q, &t.k, &t.v, causal, scale)
        }
        .unwrap();
        weighted_sum(&out, &w).backward().unwrap();
        (
            vals(&out),
            t.leaves
                .iter()
                .map(|l| vals(&l.grad().unwrap()))
                .collect::<Vec<_>>(),
        )
    };
    let (fo, fg) = run(true);
    let (ro, rg) = run(false);
    assert_close(&format!("{what}: output"), &fo, &ro, 2e-5);
    for (i, (f, r)) in fg.iter().zip(&rg).enumerate() {
        assert_close(&format!("{what}: gradient of input {i}"), f, r, 1e-4);
    }
}

#[test]
fn flash_attention_matches_composite_on_small_and_odd_shapes() {
    let mut seed = 0;
    for &(b, h, t, d) in &[(1, 1, 1, 1), (2, 3, 5, 4), (1, 2, 17, 8), (2, 1, 33, 3)] {
        for causal in [true, false] {
            for layout in [Layout::Contiguous, Layout::Transposed, Layout::Packed] {
                seed += 1;
                check_attention(layout, b, h, t, t, d, causal, seed);
            }
        }
    }
}

#[test]
fn flash_attention_matches_composite_across_tile_boundaries() {
    // 64-row/64-key tiles: lengths below, at and across tile edges, head dims 64 and 128.
    let mut seed = 100;
    for &(b, h, t, d) in &[
        (1, 2, 64, 64),
        (2, 2, 65, 64),
        (1, 1, 150, 64),
        (1, 2, 130, 128),
        (2, 1, 97, 128),
    ] {
        for causal in [true, false] {
            seed += 1;
            let layout = if seed % 2 == 0 {
                Layout::Packed
            } else {
                Layout::Transposed
            };
            check_attention(layout, b, h, t, t, d, causal, seed);
        }
    }
}

#[test]
fn flash_attention_with_fewer_queries_than_keys() {
    // Decoding against a KV cache: query i is position tk − tq + i (causal, bottom-right).
    let mut seed = 200;
    for &(tq, tk) in &[(1, 1), (1, 9), (3, 70), (5, 129), (64, 200)] {
        for causal in [true, false] {
            for layout in [Layout::Contiguous, Layout::Transposed] {
                seed += 1;
                check_attention(layout, 2, 2, tq, tk, 16, causal, seed);
            }
        }
    }
}

#[test]
fn flash_attention_random_shapes() {
    let mut rng = Rng::new(7);
    for i in 0..12 {
        let (b, h) = (1 + rng.below(3) as usize, 1 + rng.below(3) as usize);
        let t = 1 + rng.below(140) as usize;
        let d = [1, 2, 7, 16, 32, 64][rng.below(6) as usize];
        let causal = rng.below(2) == 0;
        let layout =
            [Layout::Contiguous, Layout::Transposed, Layout::Packed][rng.below(3) as usize];
        check_attention(layout, b, h, t, t, d, causal, 300 + i);
    }
}

#[test]
fn flash_attention_causal_rows_ignore_the_future() {
    let mut rng = Rng::new(3);
    let (q, k, v) = (
        randn(&[1, 1, 10, 4], &mut rng),
        randn(&[1, 1, 10, 4], &mut rng),
        randn(&[1, 1, 10, 4], &mut rng),
    );
    let a = vals(&fused::attention(&q, &k, &v, true, 0.5).unwrap());
    // Changing the last key and value only changes the last row.
    let k2 = Tensor::cat(
        &[k.narrow(2, 0, 9).unwrap(), randn(&[1, 1, 1, 4], &mut rng)],
        2,
    )
    .unwrap();
    let v2 = Tensor::cat(
        &[v.narrow(2, 0, 9).unwrap(), randn(&[1, 1, 1, 4], &mut rng)],
        2,
    )
    .unwrap();
    let b = vals(&fused::attention(&q, &k2, &v2, true, 0.5).unwrap());
    assert_eq!(a[..36], b[..36]);
    assert_ne!(a[36..], b[36..]);
}

#[test]
fn flash_attention_half_precision_and_errors() {
    let mut rng = Rng::new(5);
    let q = randn(&[1, 2, 9, 8], &mut rng);
    let k = randn(&[1, 2, 9, 8], &mut rng);
    let v = randn(&[1, 2, 9, 8], &mut rng);
    let want = vals(&fused::attention(&q, &k, &v, true, 0.3).unwrap());
    for dt in [DType::BF16, DType::F16] {
        let c = |t: &Tensor| t.to_dtype(dt).unwrap();
        let got = fused::attention(&c(&q), &c(&k), &c(&v), true, 0.3).unwrap();
        assert_eq!(got.dtype(), dt);
        assert_close(&format!("{dt}"), &vals(&got), &want, 3e-2);
    }
    assert!(fused::attention(&q, &k.narrow(3, 0, 4).unwrap(), &v, true, 1.0).is_err());
    assert!(fused::attention(&q.reshape(&[2, 9, 8]).unwrap(), &k, &v, true, 1.0).is_err());
    assert!(fused::attention(&q, &k, &v.narrow(2, 0, 5).unwrap(), true, 1.0).is_err());
}

#[test]
fn residual_layer_norm_matches_composite() {
    let mut rng = Rng::new(11);
    for (i, &(rows, n, transposed)) in [
        (1, 1, false),
        (3, 5, false),
        (7, 33, true),
        (130, 64, false),
        (600, 128, true),
    ]
    .iter()
    .enumerate()
    {
        let mk = |rng: &mut Rng| {
            if transposed {
                let leaf = randn(&[n, rows], rng).to_var().unwrap();
                (leaf.clone(), leaf.t().unwrap())
            } else {
                let leaf = randn(&[rows, n], rng).to_var().unwrap();
                (leaf.clone(), leaf)
            }
        };
        let seed = rng.next_u64();
        let (w1, w2) = (randn(&[rows, n], &mut rng), randn(&[rows, n], &mut rng));
        let run = |fused_path: bool| {
            let mut r = Rng::new(seed);
            let (xl, x) = mk(&mut r);
            let (rl, res) = mk(&mut r);
            let gamma = randn(&[n], &mut r).to_var().unwrap();
            let beta = randn(&[n], &mut r).to_var().unwrap();
            let (s, y) = if fused_path {
                fused::residual_layer_norm(&x, &res, &gamma, &beta, 1e-5)
            } else {
                fused::residual_layer_norm_reference(&x, &res, &gamma, &beta, 1e-5)
            }
            .unwrap();
            weighted_sum(&s, &w1)
                .add(&weighted_sum(&y, &w2))
                .unwrap()
                .backward()
                .unwrap();
            let grads: Vec<Vec<f32>> = [&xl, &rl, &gamma, &beta]
                .iter()
                .map(|t| vals(&t.grad().unwrap()))
                .collect();
            (vals(&s), vals(&y), grads)
        };
        let (fs, fy, fg) = run(true);
        let (rs, ry, rg) = run(false);
        assert_eq!(fs, rs, "case {i}: sum");
        assert_eq!(fy, ry, "case {i}: normed (same arithmetic, bit-identical)");
        for (j, (f, r)) in fg.iter().zip(&rg).enumerate() {
            assert_close(&format!("case {i}: gradient {j}"), f, r, 1e-4);
        }
    }
    // Only the normed output used: gradients still reach everything through the sum.
    let x = randn(&[4, 6], &mut rng).to_var().unwrap();
    let r = randn(&[4, 6], &mut rng).to_var().unwrap();
    let (g, b) = (
        randn(&[6], &mut rng).to_var().unwrap(),
        randn(&[6], &mut rng).to_var().unwrap(),
    );
    let (_, y) = fused::residual_layer_norm(&x, &r, &g, &b, 1e-5).unwrap();
    y.sqr().unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vals(&r.grad().unwrap()));
    assert!(fused::residual_layer_norm(&x, &r.t().unwrap(), &g, &b, 1e-5).is_err());
    assert!(fused::residual_layer_norm(&x, &r, &g.narrow(0, 0, 5).unwrap(), &b, 1e-5).is_err());
}

#[test]
fn bias_gelu_matches_composite() {
    let mut rng = Rng::new(21);
    for (i, &(rows, n, transposed)) in [
        (1, 1, false),
        (5, 3, true),
        (64, 65, false),
        (300, 256, true),
        (1000, 512, false),
    ]
    .iter()
    .enumerate()
    {
        let seed = rng.next_u64();
        let w = randn(&[rows, n], &mut rng);
        let run = |fused_path: bool| {
            let mut r = Rng::new(seed);
            let (xl, x) = if transposed {
                let l = randn(&[n, rows], &mut r)
                    .mul_scalar(2.0)
                    .unwrap()
                    .to_var()
                    .unwrap();
                (l.clone(), l.t().unwrap())
            } else {
                let l = randn(&[rows, n], &mut r)
                    .mul_scalar(2.0)
                    .unwrap()
                    .to_var()
                    .unwrap();
                (l.clone(), l)
            };
            let b = randn(&[n], &mut r).to_var().unwrap();
            let y = if fused_path {
                fused::bias_gelu(&x, &b)
            } else {
                fused::bias_gelu_reference(&x, &b)
            }
            .unwrap();
            weighted_sum(&y, &w).backward().unwrap();
            (
                vals(&y),
                vals(&xl.grad().unwrap()),
                vals(&b.grad().unwrap()),
            )
        };
        let (fy, fx, fb) = run(true);
        let (ry, rx, rb) = run(false);
        assert_eq!(fy, ry, "case {i}: forward (bit-identical)");
        assert_close(&format!("case {i}: dx"), &fx, &rx, 1e-6);
        assert_close(&format!("case {i}: dbias"), &fb, &rb, 1e-5);
    }
    // 3-D input, bias broadcast over the last dimension.
    let x = randn(&[2, 3, 4], &mut rng);
    let b = randn(&[4], &mut rng);
    assert_eq!(
        vals(&fused::bias_gelu(&x, &b).unwrap()),
        vals(&fused::bias_gelu_reference(&x, &b).unwrap())
    );
    assert!(fused::bias_gelu(&x, &randn(&[3], &mut rng)).is_err());
}

#[test]
fn linear_bias_gelu_matches_composite() {
    let mut rng = Rng::new(23);
    for (i, &(lead, inp, out)) in [
        (&[1usize][..], 1usize, 1usize),
        (&[2, 5][..], 7, 16),
        (&[3, 4, 2][..], 32, 24),
        (&[64][..], 48, 96),
    ]
    .iter()
    .enumerate()
    {
        let seed = rng.next_u64();
        let mut oshape = lead.to_vec();
        oshape.push(out);
        let lw = randn(&oshape, &mut rng);
        let run = |fused_path: bool| {
            let mut r = Rng::new(seed);
            let mut xshape = lead.to_vec();
            xshape.push(inp);
            let x = randn(&xshape, &mut r).to_var().unwrap();
            let w = randn(&[out, inp], &mut r)
                .mul_scalar(0.5)
                .unwrap()
                .to_var()
                .unwrap();
            let b = randn(&[out], &mut r).to_var().unwrap();
            let y = if fused_path {
                fused::linear_bias_gelu(&x, &w, &b)
            } else {
                fused::linear_bias_gelu_reference(&x, &w, &b)
            }
            .unwrap();
            assert_eq!(y.shape(), oshape.as_slice(), "case {i}: output shape");
            weighted_sum(&y, &lw).backward().unwrap();
            (
                vals(&y),
                vals(&x.grad().unwrap()),
                vals(&w.grad().unwrap()),
                vals(&b.grad().unwrap()),
            )
        };
        let (fy, fx, fw, fb) = run(true);
        let (ry, rx, rw, rb) = run(false);
        assert_close(&format!("case {i}: forward"), &fy, &ry, 1e-6);
        assert_close(&format!("case {i}: dx"), &fx, &rx, 1e-5);
        assert_close(&format!("case {i}: dw"), &fw, &rw, 1e-5);
        assert_close(&format!("case {i}: db"), &fb, &rb, 1e-5);
    }
    let x = randn(&[4, 6], &mut rng);
    let w = randn(&[8, 6], &mut rng);
    let b = randn(&[8], &mut rng);
    let e = fused::linear_bias_gelu(&x, &w.t().unwrap(), &b).unwrap_err();
    assert!(e.to_string().contains("last dimension"), "{e}");
    assert!(fused::linear_bias_gelu(&x, &w, &randn(&[6], &mut rng)).is_err());
    assert!(fused::linear_bias_gelu(&x, &b, &b).is_err(), "a 1-D weight");
}

#[test]
fn global_grad_norm_is_exact_and_deterministic() {
    let mut rng = Rng::new(31);
    let grads = vec![
        randn(&[3, 5], &mut rng),
        randn(&[100_000], &mut rng),
        randn(&[40, 70], &mut rng).t().unwrap(), // non-contiguous
        randn(&[7], &mut rng).to_dtype(DType::BF16).unwrap(),
        Tensor::zeros(&[0], DType::F32, Device::Cpu).unwrap(),
    ];
    let want: f64 = grads
        .iter()
        .flat_map(|g| g.to_vec_f64().unwrap())
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt();
    let got = fused::global_grad_norm(&grads);
    assert!((got - want).abs() <= 1e-12 * want, "{got} vs {want}");
    // The composite: per-tensor squares and sums in f32, then added up.
    let composite: f32 = grads
        .iter()
        .map(|g| {
            g.to_dtype(DType::F32)
                .unwrap()
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar_f32()
                .unwrap()
        })
        .sum::<f32>()
        .sqrt();
    assert!((got as f32 - composite).abs() <= 1e-4 * composite);
    for _ in 0..3 {
        assert_eq!(fused::global_grad_norm(&grads).to_bits(), got.to_bits());
    }
    assert_eq!(fused::global_grad_norm(&[]), 0.0);
}

/// Forward + backward time of each fused op against its composite. Run with
/// `cargo test -p sinter-core --test fused_ops -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_fused_against_composite() {
    use std::time::Instant;
    let time = |f: &dyn Fn()| {
        f();
        let reps = 5;
        let t0 = Instant::now();
        for _ in 0..reps {
            f();
        }
        t0.elapsed().as_secs_f64() * 1e3 / reps as f64
    };
    for &(b, h, t, d) in &[(12, 4, 64, 32), (2, 12, 256, 64), (1, 12, 1024, 64)] {
        let mut rng = Rng::new(0);
        let q = randn(&[b, h, t, d], &mut rng).to_var().unwrap();
        let k = randn(&[b, h, t, d], &mut rng).to_var().unwrap();
        let v = randn(&[b, h, t, d], &mut rng).to_var().unwrap();
        let run = |fused_path: bool| {
            let out = if fused_path {
                fused::attention(&q, &k, &v, true, 0.125)
            } else {
                fused::attention_reference(&q, &k, &v, true, 0.125)
            }
            .unwrap();
            out.sum_all().unwrap().backward().unwrap();
        };
        let (f, c) = (time(&|| run(true)), time(&|| run(false)));
        eprintln!("attention causal [b {b}, h {h}, t {t}, d {d}] fwd+bwd: fused {f:.2} ms, composite {c:.2} ms ({:.1}x)", c / f);
    }
    let mut rng = Rng::new(1);
    let (rows, n) = (768, 512);
    let x = randn(&[rows, n], &mut rng).to_var().unwrap();
    let bias = randn(&[n], &mut rng).to_var().unwrap();
    let f = time(&|| {
        fused::bias_gelu(&x, &bias)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap()
    });
    let c = time(&|| {
        fused::bias_gelu_reference(&x, &bias)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap()
    });
    eprintln!(
        "bias_gelu [{rows}, {n}] fwd+bwd: fused {f:.2} ms, composite {c:.2} ms ({:.1}x)",
        c / f
    );
    let n = 128;
    let (x, r) = (
        randn(&[rows, n], &mut rng).to_var().unwrap(),
        randn(&[rows, n], &mut rng).to_var().unwrap(),
    );
    let (g, bb) = (
        randn(&[n], &mut rng).to_var().unwrap(),
        randn(&[n], &mut rng).to_var().unwrap(),
    );
    let body = |fp: bool| {
        let (s, y) = if fp {
            fused::residual_layer_norm(&x, &r, &g, &bb, 1e-5)
        } else {
            fused::residual_layer_norm_reference(&x, &r, &g, &bb, 1e-5)
        }
        .unwrap();
        s.add(&y).unwrap().sum_all().unwrap().backward().unwrap();
    };
    let (f, c) = (time(&|| body(true)), time(&|| body(false)));
    eprintln!(
        "residual_layer_norm [{rows}, {n}] fwd+bwd: fused {f:.2} ms, composite {c:.2} ms ({:.1}x)",
        c / f
    );
    let grads: Vec<Tensor> = (0..40).map(|_| randn(&[128, 512], &mut rng)).collect();
    let f = time(&|| {
        fused::global_grad_norm(&grads);
    });
    let c = time(&|| {
        let _: f64 = grads
            .iter()
            .map(|g| g.to_vec_f64().unwrap().iter().map(|x| x * x).sum::<f64>())
            .sum::<f64>()
            .sqrt();
    });
    eprintln!("global_grad_norm 40 x [128, 512]: fused {f:.2} ms, per-tensor f64 copies (clip_grad_norm's way) {c:.2} ms ({:.1}x)", c / f);
}
