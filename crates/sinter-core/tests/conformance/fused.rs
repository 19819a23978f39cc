//! The fused ops: flash attention (causal or not, KV-cache shapes, tile edges, strided q/k/v
//! views), residual + LayerNorm, bias + GELU, linear + bias + GELU, and the global gradient
//! norm. On CUDA the half-precision attention runs the tensor-core flash kernels (head dims 64
//! and 128) and linear + bias + GELU one cuBLASLt epilogue GEMM (width a multiple of 8).

use crate::harness::*;
use crate::reference::{self as r, Arr, Conv};
use sinter_core::fused;
use sinter_core::{Conv2dParams, DType, Tensor};

pub fn cases() -> Vec<Case> {
    vec![
        case("attention_vjp_reference", F32, attention_vjp_reference).cpu_only(),
        case("attention_small", FLOATS, attention_small),
        case("attention_kv_cache", FLOATS, attention_kv_cache),
        case(
            "attention_rows_without_keys",
            FLOATS,
            attention_rows_without_keys,
        ),
        case("attention_flash", FLOATS, attention_flash),
        case(
            "attention_causal_ignores_future",
            FLOATS,
            attention_causal_ignores_future,
        ),
        case("attention_errors", F32, attention_errors),
        case("attention_packed", FLOATS, attention_packed),
        case("residual_layer_norm", FLOATS, residual_layer_norm),
        case("bias_gelu", FLOATS, bias_gelu),
        case("linear", FLOATS, linear),
        case("linear_bias_gelu", FLOATS, linear_bias_gelu),
        case("conv2d_bias_relu", FLOATS, conv2d_bias_relu),
        case("global_grad_norm", FLOATS, global_grad_norm),
    ]
}

/// Half-precision attention rounds P and dS to the input dtype before their products (as
/// FlashAttention-2 does on tensor cores), and the device composite rounds the scores, the
/// probabilities and the output: four roundings in sequence.
const ATTENTION: Opts = Opts {
    exact: false,
    roundings: 4.0,
    out: None,
    f32_tol: None,
};

/// The analytic attention gradient of the reference module agrees with central differences.
fn attention_vjp_reference(t: &Target) {
    let mut rng = t.rng(70);
    for (tq, tk, causal) in [(5, 5, true), (3, 7, true), (6, 4, true), (4, 6, false)] {
        let q = uniform(&mut rng, &[1, 2, tq, 3], -1.0, 1.0);
        let k = uniform(&mut rng, &[1, 2, tk, 3], -1.0, 1.0);
        let v = uniform(&mut rng, &[1, 2, tk, 3], -1.0, 1.0);
        let w = uniform(&mut rng, &[1, 2, tq, 3], -1.0, 1.0);
        let g = r::attention_vjp(&q, &k, &v, causal, 0.7, &w);
        let x = [q, k, v];
        for (i, gi) in g.iter().enumerate() {
            for j in 0..gi.numel() {
                let h = 1e-6;
                let f = |d: f64| {
                    let mut y = x.clone();
                    y[i].data[j] += d;
                    let o = r::attention(&y[0], &y[1], &y[2], causal, 0.7);
                    o.data.iter().zip(&w.data).map(|(a, b)| a * b).sum::<f64>()
                };
                let fd = (f(h) - f(-h)) / (2.0 * h);
                assert!(
                    (fd - gi.data[j]).abs() < 1e-7,
                    "input {i} element {j}: {fd} vs {}",
                    gi.data[j]
                );
            }
        }
    }
}

/// How q, k and v come from the leaves: each way gives [b, h, t, d] views.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Contiguous [b, h, t, d] leaves.
    Contiguous,
    /// [b, t, h, d] leaves viewed through transpose(1, 2).
    Transposed,
    /// One packed [b, t, 3·h·d] leaf split like a qkv projection (narrow, reshape, transpose).
    Packed,
}

#[allow(clippy::too_many_arguments)]
fn check_attention(
    t: &Target,
    layout: Layout,
    b: usize,
    h: usize,
    tq: usize,
    tk: usize,
    d: usize,
    causal: bool,
) {
    let what = format!("{layout:?} b{b} h{h} tq{tq} tk{tk} d{d} causal {causal}");
    let mut rng = t.rng(seed_of(&what));
    let scale = 1.0 / (d as f32).sqrt();
    let s64 = scale as f64;
    let c = h * d;
    let (inputs, view, rview, back): (
        Vec<In>,
        Box<dyn Fn(&[Tensor]) -> sinter_core::Result<[Tensor; 3]>>,
        Box<dyn Fn(&[Arr]) -> [Arr; 3]>,
        Box<dyn Fn([Arr; 3]) -> Vec<Arr>>,
    ) = match layout {
        Layout::Contiguous => (
            vec![
                In::Var(uniform(&mut rng, &[b, h, tq, d], -1.0, 1.0)),
                In::Var(uniform(&mut rng, &[b, h, tk, d], -1.0, 1.0)),
                In::Var(uniform(&mut rng, &[b, h, tk, d], -1.0, 1.0)),
            ],
            Box::new(|x| Ok([x[0].clone(), x[1].clone(), x[2].clone()])),
            Box::new(|x| [x[0].clone(), x[1].clone(), x[2].clone()]),
            Box::new(|g| g.to_vec()),
        ),
        Layout::Transposed => (
            vec![
                In::Var(uniform(&mut rng, &[b, tq, h, d], -1.0, 1.0)),
                In::Var(uniform(&mut rng, &[b, tk, h, d], -1.0, 1.0)),
                In::Var(uniform(&mut rng, &[b, tk, h, d], -1.0, 1.0)),
            ],
            Box::new(|x| {
                Ok([
                    x[0].transpose(1, 2)?,
                    x[1].transpose(1, 2)?,
                    x[2].transpose(1, 2)?,
                ])
            }),
            Box::new(|x| {
                [
                    x[0].transpose(1, 2),
                    x[1].transpose(1, 2),
                    x[2].transpose(1, 2),
                ]
            }),
            Box::new(|g| g.iter().map(|a| a.transpose(1, 2)).collect()),
        ),
        Layout::Packed => {
            assert_eq!(tq, tk);
            let (rview, back) = packed_reference(b, tq, h, d);
            (
                vec![In::Var(uniform(&mut rng, &[b, tq, 3 * c], -1.0, 1.0))],
                Box::new(move |x| {
                    let part = |i: usize| {
                        x[0].narrow(2, i * c, c)?
                            .reshape(&[b, tq, h, d])?
                            .transpose(1, 2)
                    };
                    Ok([part(0)?, part(1)?, part(2)?])
                }),
                Box::new(rview),
                Box::new(back),
            )
        }
    };
    t.check_vjp(
        &what,
        ATTENTION,
        &inputs,
        |x| {
            let [q, k, v] = view(x)?;
            fused::attention(&q, &k, &v, causal, scale)
        },
        |x, _| {
            let [q, k, v] = rview(x);
            r::attention(&q, &k, &v, causal, s64)
        },
        |x, w| {
            let [q, k, v] = rview(x);
            back(r::attention_vjp(&q, &k, &v, causal, s64, w))
        },
    );
}

/// The reference's view of a packed qkv [b, t, 3·h·d] as [b, h, t, d] q, k and v, and the
/// map from their gradients back to the packed gradient.
fn packed_reference(
    b: usize,
    t: usize,
    h: usize,
    d: usize,
) -> (impl Fn(&[Arr]) -> [Arr; 3], impl Fn([Arr; 3]) -> Vec<Arr>) {
    let c = h * d;
    let rview = move |x: &[Arr]| {
        let part = |i: usize| {
            x[0].narrow(2, i * c, c)
                .reshape(&[b, t, h, d])
                .transpose(1, 2)
        };
        [part(0), part(1), part(2)]
    };
    let back = move |g: [Arr; 3]| {
        let parts: Vec<Arr> = g
            .iter()
            .map(|a| a.transpose(1, 2).reshape(&[b, t, c]))
            .collect();
        vec![r::cat(&parts, 2)]
    };
    (rview, back)
}

/// `fused::attention_packed`: qkv [b, t, 3·h·d] in, the heads merged [b, t, h·d] out (the
/// packed kernel on the CPU, the composite over `attention` elsewhere), against the reference
/// on the split views; `transposed` feeds qkv as a non-contiguous view.
fn check_attention_packed(t: &Target, b: usize, h: usize, n: usize, d: usize, causal: bool) {
    for transposed in [false, true] {
        let what = format!("packed op b{b} h{h} t{n} d{d} causal {causal} transposed {transposed}");
        let mut rng = t.rng(seed_of(&what));
        let (scale, c) = (1.0 / (d as f32).sqrt(), h * d);
        let (rview, back) = packed_reference(b, n, h, d);
        let shape = if transposed {
            [b, 3 * c, n]
        } else {
            [b, n, 3 * c]
        };
        let view = move |x: &Tensor| {
            if transposed {
                x.transpose(1, 2)
            } else {
                Ok(x.clone())
            }
        };
        let rv = move |x: &Arr| {
            if transposed {
                x.transpose(1, 2)
            } else {
                x.clone()
            }
        };
        let merge = |y: Arr| y.transpose(1, 2).reshape(&[b, n, c]);
        t.check_vjp(
            &what,
            ATTENTION,
            &[In::Var(uniform(&mut rng, &shape, -1.0, 1.0))],
            |x| fused::attention_packed(&view(&x[0])?, h, causal, scale),
            |x, _| {
                let [q, k, v] = rview(&[rv(&x[0])]);
                merge(r::attention(&q, &k, &v, causal, scale as f64))
            },
            |x, w| {
                let [q, k, v] = rview(&[rv(&x[0])]);
                let w = w.reshape(&[b, n, h, d]).transpose(1, 2);
                let g = back(r::attention_vjp(&q, &k, &v, causal, scale as f64, &w));
                vec![rv(&g[0])]
            },
        );
    }
}

/// The packed op over lengths below, at and across the 64-row tiles, the flash kernels' head
/// dims, and its shape errors.
fn attention_packed(t: &Target) {
    let shapes: &[(usize, usize, usize, usize)] = if t.emulated {
        &[(2, 3, 5, 4), (1, 2, 24, 64), (2, 1, 33, 128)]
    } else {
        &[
            (1, 1, 1, 1),
            (2, 3, 5, 4),
            (2, 2, 64, 8),
            (1, 2, 77, 16),
            (1, 2, 24, 64),
            (2, 3, 130, 64),
            (2, 2, 70, 128),
        ]
    };
    for &(b, h, n, d) in shapes {
        for causal in [true, false] {
            check_attention_packed(t, b, h, n, d, causal);
        }
    }
    let z = |s: &[usize]| t.zeros(s, DType::F32);
    expect_err(
        fused::attention_packed(&z(&[2, 5, 12]), 0, true, 1.0),
        "attention",
    );
    expect_err(
        fused::attention_packed(&z(&[2, 5, 12]), 3, true, 1.0),
        "attention",
    );
    expect_err(
        fused::attention_packed(&z(&[5, 12]), 2, true, 1.0),
        "attention",
    );
}

fn attention_small(t: &Target) {
    for &(b, h, n, d) in &[(1, 1, 1, 1), (2, 3, 5, 4), (1, 2, 17, 8), (2, 1, 33, 3)] {
        for causal in [true, false] {
            for layout in [Layout::Contiguous, Layout::Transposed, Layout::Packed] {
                check_attention(t, layout, b, h, n, n, d, causal);
            }
        }
    }
}

/// Fewer queries than keys (decoding against a KV cache: query i is position tk − tq + i), and
/// more queries than keys (causal rows that see no key give 0).
fn attention_kv_cache(t: &Target) {
    for &(tq, tk) in &[(1, 1), (1, 9), (3, 70), (5, 129), (20, 100)] {
        for causal in [true, false] {
            let layout = if tq % 2 == 0 {
                Layout::Transposed
            } else {
                Layout::Contiguous
            };
            check_attention(t, layout, 2, 2, tq, tk, 16, causal);
        }
    }
}

/// More queries than keys, causal: the first tq − tk rows see no key and give 0 (the
/// composite path and the flash kernels' head dims).
fn attention_rows_without_keys(t: &Target) {
    for d in [16usize, 64] {
        for causal in [true, false] {
            check_attention(t, Layout::Contiguous, 1, 2, 70, 40, d, causal);
        }
    }
}

/// The flash kernels' head dims (64, 128): lengths below, at and across the 64-row/64-key
/// tiles, KV-cache shapes, and q/k/v read in place from one packed projection. The emulated
/// device runs every thread of these kernels as a fiber: there, one shape per concern.
fn attention_flash(t: &Target) {
    let shapes: &[(usize, usize, usize)] = if t.emulated {
        &[(64, 65, 65), (64, 20, 70), (64, 1, 45), (128, 33, 33)]
    } else {
        &[
            (64, 77, 77),
            (64, 20, 100),
            (64, 1, 45),
            (64, 64, 64),
            (64, 130, 130),
            (128, 77, 77),
            (128, 20, 100),
            (128, 1, 45),
            (128, 130, 130),
        ]
    };
    for &(d, tq, tk) in shapes {
        for causal in [false, true] {
            check_attention(t, Layout::Contiguous, 1, 2, tq, tk, d, causal);
        }
    }
    for d in [64usize, 128] {
        check_attention(t, Layout::Packed, 1, 2, 24, 24, d, true);
    }
}

fn attention_causal_ignores_future(t: &Target) {
    let mut rng = t.rng(71);
    let (q, k, v) = (
        uniform(&mut rng, &[1, 1, 10, 4], -1.0, 1.0),
        uniform(&mut rng, &[1, 1, 10, 4], -1.0, 1.0),
        uniform(&mut rng, &[1, 1, 10, 4], -1.0, 1.0),
    );
    let (tq, tk, tv) = (t.tensor(&q), t.tensor(&k), t.tensor(&v));
    let a = arr(&fused::attention(&tq, &tk, &tv, true, 0.5).unwrap()).data;
    // Changing the last key and value changes only the last row.
    let mut last = |x: &Tensor| {
        Tensor::cat(
            &[
                x.narrow(2, 0, 9).unwrap(),
                t.tensor(&uniform(&mut rng, &[1, 1, 1, 4], -1.0, 1.0)),
            ],
            2,
        )
        .unwrap()
    };
    let (k2, v2) = (last(&tk), last(&tv));
    let b = arr(&fused::attention(&tq, &k2, &v2, true, 0.5).unwrap()).data;
    assert_eq!(a[..36], b[..36]);
    assert_ne!(a[36..], b[36..]);
}

fn attention_errors(t: &Target) {
    let z = |s: &[usize]| t.zeros(s, DType::F32);
    let (q, k, v) = (z(&[1, 2, 9, 8]), z(&[1, 2, 9, 8]), z(&[1, 2, 9, 8]));
    expect_err(
        fused::attention(&q, &k.narrow(3, 0, 4).unwrap(), &v, true, 1.0),
        "attention",
    );
    expect_err(
        fused::attention(&q.reshape(&[2, 9, 8]).unwrap(), &k, &v, true, 1.0),
        "attention",
    );
    expect_err(
        fused::attention(&q, &k, &v.narrow(2, 0, 5).unwrap(), true, 1.0),
        "attention",
    );
    expect_err(
        fused::attention(&q, &k, &v.to_dtype(DType::BF16).unwrap(), true, 1.0),
        "attention",
    );
}

/// (s, y) = (x + r, LayerNorm(x + r)): both outputs checked and both gradient paths used
/// (concatenated, which is exact).
fn residual_layer_norm(t: &Target) {
    let mut rng = t.rng(72);
    for (rows, n, transposed) in [
        (1, 1, false),
        (3, 5, false),
        (7, 33, true),
        (130, 64, false),
        (8, 768, false),
        (33, 100, true),
    ] {
        let shape = if transposed { [n, rows] } else { [rows, n] };
        let view = move |a: &Tensor| if transposed { a.t() } else { Ok(a.clone()) };
        let rview = move |a: &Arr| if transposed { a.t() } else { a.clone() };
        t.check_with(
            &format!("{rows}x{n} transposed {transposed}"),
            rounds(2.0),
            &[
                In::Var(uniform(&mut rng, &shape, -2.0, 2.0)),
                In::Var(uniform(&mut rng, &shape, -2.0, 2.0)),
                In::Var(uniform(&mut rng, &[n], 0.5, 1.5)),
                In::Var(uniform(&mut rng, &[n], -1.0, 1.0)),
            ],
            |x| {
                let (s, y) =
                    fused::residual_layer_norm(&view(&x[0])?, &view(&x[1])?, &x[2], &x[3], 1e-5)?;
                Tensor::cat(&[s.reshape(&[rows * n])?, y.reshape(&[rows * n])?], 0)
            },
            |x, rd| {
                let s = rd.r(rview(&x[0]).add(&rview(&x[1])));
                let y = r::layer_norm(&s, &x[2], &x[3], 1e-5f32 as f64);
                r::cat(&[s.reshape(&[rows * n]), y.reshape(&[rows * n])], 0)
            },
        );
    }
    let z = |s: &[usize]| t.zeros(s, t.dtype);
    expect_err(
        fused::residual_layer_norm(
            &z(&[4, 6]),
            &z(&[4, 6]).t().unwrap(),
            &z(&[6]),
            &z(&[6]),
            1e-5,
        ),
        "residual_layer_norm",
    );
    expect_err(
        fused::residual_layer_norm(&z(&[4, 6]), &z(&[4, 6]), &z(&[5]), &z(&[6]), 1e-5),
        "residual_layer_norm",
    );
}

fn bias_gelu(t: &Target) {
    let mut rng = t.rng(73);
    for (rows, n, transposed) in [
        (1, 1, false),
        (5, 3, true),
        (64, 65, false),
        (40, 256, true),
    ] {
        let shape = if transposed { [n, rows] } else { [rows, n] };
        let view = move |a: &Tensor| if transposed { a.t() } else { Ok(a.clone()) };
        let rview = move |a: &Arr| if transposed { a.t() } else { a.clone() };
        t.check(
            &format!("{rows}x{n} transposed {transposed}"),
            &[
                In::Var(uniform(&mut rng, &shape, -4.0, 4.0)),
                In::Var(uniform(&mut rng, &[n], -1.0, 1.0)),
            ],
            |x| fused::bias_gelu(&view(&x[0])?, &x[1]),
            |x, _| rview(&x[0]).add(&x[1]).map(r::gelu_tanh),
        );
    }
    t.check(
        "3-D input",
        &[
            In::Var(uniform(&mut rng, &[2, 3, 4], -3.0, 3.0)),
            In::Var(uniform(&mut rng, &[4], -1.0, 1.0)),
        ],
        |x| fused::bias_gelu(&x[0], &x[1]),
        |x, _| x[0].add(&x[1]).map(r::gelu_tanh),
    );
    expect_err(
        fused::bias_gelu(&t.zeros(&[2, 4], t.dtype), &t.zeros(&[3], t.dtype)),
        "bias_gelu",
    );
}

/// Conv2d + bias (+ ReLU) as one op: small and batch-blocked geometries (the CPU kernel cuts
/// the batch into blocks of about 256 output pixels), strides, dilation, groups, and the
/// CPU's three im2col paths (planes of at most 64 pixels, "same" stride-1 convolutions of
/// larger planes, the rest).
fn conv2d_bias_relu(t: &Target) {
    let mut rng = t.rng(75);
    // (n, c, h, w, o, k, stride, padding, dilation, groups, relu)
    for &(n, c, h, wd, o, k, stride, padding, dilation, groups, relu) in &[
        (2, 3, 5, 5, 4, 3, 1, 1, 1, 1, true),
        (3, 4, 7, 6, 6, 3, 2, 1, 1, 2, true),
        (1, 2, 9, 9, 3, 3, 1, 2, 2, 1, false),
        (40, 1, 8, 8, 8, 3, 1, 1, 1, 1, true),
        (70, 4, 4, 4, 8, 3, 1, 1, 1, 1, true),
        (18, 2, 9, 8, 4, 2, 1, 0, 1, 1, true),
        (3, 2, 10, 10, 4, 3, 1, 1, 1, 1, true),
        (12, 2, 12, 11, 5, 3, 1, 1, 1, 1, true),
    ] {
        let p = Conv2dParams::square(stride, padding, dilation, groups);
        let rp = Conv::square(stride, padding, dilation, groups);
        t.check(
            &format!("n {n} c {c} {h}x{wd} o {o} k {k} {p:?} relu {relu}"),
            &[
                In::Var(uniform(&mut rng, &[n, c, h, wd], -1.0, 1.0)),
                In::Var(uniform(&mut rng, &[o, c / groups, k, k], -0.5, 0.5)),
                In::Var(uniform(&mut rng, &[o], -0.5, 0.5)),
            ],
            move |x| fused::conv2d_bias_relu(&x[0], &x[1], &x[2], p, relu),
            move |x, _| {
                let y = r::conv2d(&x[0], &x[1], rp);
                let b = x[2].reshape(&[1, o, 1, 1]);
                let y = y.add(&b);
                if relu {
                    y.map(r::relu)
                } else {
                    y
                }
            },
        );
    }
    expect_err(
        fused::conv2d_bias_relu(
            &t.zeros(&[1, 2, 4, 4], t.dtype),
            &t.zeros(&[3, 2, 3, 3], t.dtype),
            &t.zeros(&[2], t.dtype),
            Conv2dParams::default(),
            true,
        ),
        "conv2d_bias_relu",
    );
}

/// The epilogue GEMM's widths (multiples of 8) and the composite's (12, 1), several leading
/// shapes.
fn linear_bias_gelu(t: &Target) {
    let mut rng = t.rng(74);
    for (lead, inp, out) in [
        (&[1usize][..], 1usize, 1usize),
        (&[2, 5], 7, 16),
        (&[3, 4, 2], 32, 24),
        (&[64], 48, 96),
        (&[3, 10], 40, 64),
        (&[3, 10], 40, 12),
    ] {
        let mut xs = lead.to_vec();
        xs.push(inp);
        t.check_with(
            &format!("{lead:?} in {inp} out {out}"),
            rounds(2.0),
            &[
                In::Var(uniform(&mut rng, &xs, -1.0, 1.0)),
                In::Var(uniform(&mut rng, &[out, inp], -0.5, 0.5)),
                In::Var(uniform(&mut rng, &[out], -0.5, 0.5)),
            ],
            |x| fused::linear_bias_gelu(&x[0], &x[1], &x[2]),
            |x, _| r::linear_bias_gelu(&x[0], &x[1], &x[2]),
        );
    }
    let z = |s: &[usize]| t.zeros(s, t.dtype);
    let e = fused::linear_bias_gelu(&z(&[4, 6]), &z(&[6, 8]), &z(&[8])).unwrap_err();
    assert!(e.to_string().contains("last dimension"), "{e}");
    expect_err(
        fused::linear_bias_gelu(&z(&[4, 6]), &z(&[8, 6]), &z(&[6])),
        "linear_bias_gelu",
    );
    expect_err(
        fused::linear_bias_gelu(&z(&[4, 6]), &z(&[8]), &z(&[8])),
        "linear_bias_gelu",
    );
}

/// x Wᵀ (+ b): leading dims folded into rows, with and without a bias, x and W as strided
/// views (a transposed x, a transposed weight), widths across the GEMM tiles; shape errors.
fn linear(t: &Target) {
    let mut rng = t.rng(76);
    for (lead, inp, out, bias, strided) in [
        (&[1usize][..], 1usize, 1usize, true, false),
        (&[2, 5], 7, 16, true, true),
        (&[3, 4, 2], 32, 24, false, false),
        (&[64], 48, 96, true, false),
        (&[70], 40, 33, false, true),
        (&[3, 10], 130, 12, true, false),
    ] {
        let mut xs = lead.to_vec();
        xs.push(inp);
        // Strided: x stored [inp, rows] and W stored [inp, out], each used transposed.
        let rows: usize = lead.iter().product();
        let (x_shape, w_shape) = if strided {
            (vec![inp, rows], vec![inp, out])
        } else {
            (xs.clone(), vec![out, inp])
        };
        let mut inputs = vec![
            In::Var(uniform(&mut rng, &x_shape, -1.0, 1.0)),
            In::Var(uniform(&mut rng, &w_shape, -0.5, 0.5)),
        ];
        if bias {
            inputs.push(In::Var(uniform(&mut rng, &[out], -0.5, 0.5)));
        }
        let xs2 = xs.clone();
        t.check_with(
            &format!("{lead:?} in {inp} out {out} bias {bias} strided {strided}"),
            rounds(2.0),
            &inputs,
            |x| {
                let (xv, wv) = if strided {
                    (x[0].t()?.reshape(&xs2)?, x[1].t()?)
                } else {
                    (x[0].clone(), x[1].clone())
                };
                fused::linear(&xv, &wv, x.get(2))
            },
            |x, _| {
                let (xv, wv) = if strided {
                    (x[0].t().reshape(&xs), x[1].t())
                } else {
                    (x[0].clone(), x[1].clone())
                };
                let y = r::matmul(&xv, &wv.t());
                match x.get(2) {
                    Some(b) => y.add(b),
                    None => y,
                }
            },
        );
    }
    let z = |s: &[usize]| t.zeros(s, t.dtype);
    let e = fused::linear(&z(&[4, 6]), &z(&[6, 8]), None).unwrap_err();
    assert!(e.to_string().contains("last dimension"), "{e}");
    expect_err(
        fused::linear(&z(&[4, 6]), &z(&[8, 6]), Some(&z(&[6]))),
        "linear",
    );
    expect_err(fused::linear(&z(&[4, 6]), &z(&[8]), None), "linear");
}

/// One pass over many tensors (non-contiguous, mixed dtypes, empty, and more than one CUDA
/// launch takes: 192): the f64 norm, and the same bits every time.
fn global_grad_norm(t: &Target) {
    let mut rng = t.rng(75);
    let mut parts = vec![
        (uniform(&mut rng, &[3, 5], -1.0, 1.0), false),
        (uniform(&mut rng, &[10_000], -1.0, 1.0), false),
        (uniform(&mut rng, &[40, 70], -1.0, 1.0), true),
        (uniform(&mut rng, &[7], -1.0, 1.0), false),
        (Arr::new(&[0], vec![]), false),
    ];
    for i in 0..200 {
        parts.push((uniform(&mut rng, &[1 + i % 9], -1.0, 1.0), false));
    }
    let grads: Vec<Tensor> = parts
        .iter()
        .enumerate()
        .map(|(i, (a, tr))| {
            let dt = if i == 3 { DType::BF16 } else { t.dtype };
            let x = make(&r::rounded(a, dt), dt, t.dev);
            if *tr {
                x.t().unwrap()
            } else {
                x
            }
        })
        .collect();
    let want: f64 = grads
        .iter()
        .flat_map(|g| arr(g).data)
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt();
    let got = fused::global_grad_norm(&grads);
    assert_close("global_grad_norm", &[got], &[want], tol(DType::F32, 1.0));
    for _ in 0..3 {
        assert_eq!(
            fused::global_grad_norm(&grads).to_bits(),
            got.to_bits(),
            "deterministic"
        );
    }
    assert_eq!(fused::global_grad_norm(&[]), 0.0);
}
