//! Backward of every differentiable op against central finite differences, including
//! broadcast operands (gradients summed back to the small shape) and non-contiguous inputs
//! (views taken inside the function, so gradients also flow back through the view).

use super::common::*;
use super::elementwise::{unary_cases, unary_input};
use super::linalg::{conv_params, random_conv_case, CONV_CASES, POOL_CASES};
use sinter_core::{Conv2dParams, Pool2dParams, Result, Rng, Tensor};

type BinFn = fn(&Tensor, &Tensor) -> Result<Tensor>;

fn binaries() -> Vec<(&'static str, BinFn)> {
    vec![
        ("add", Tensor::add),
        ("sub", Tensor::sub),
        ("mul", Tensor::mul),
        ("div", Tensor::div),
        ("maximum", Tensor::maximum),
        ("minimum", Tensor::minimum),
    ]
}

fn bin_inputs(rng: &mut Rng, name: &str, sa: &[usize], sb: &[usize]) -> [Tensor; 2] {
    match name {
        "div" => [
            uniform(rng, sa, -2.0, 2.0),
            away_from_zero(rng, sb, 0.5, 2.0),
        ],
        "maximum" | "minimum" => loop {
            // Redraw until each side wins somewhere, so that both get some gradient.
            let (a, b) = (offset_grid(rng, sa, 0.0), offset_grid(rng, sb, 0.25));
            let d = Arr::of(&a).zip(&Arr::of(&b), |x, y| x - y).data;
            if d.iter().any(|&v| v > 0.0) && d.iter().any(|&v| v < 0.0) {
                break [a, b];
            }
        },
        _ => [uniform(rng, sa, -2.0, 2.0), uniform(rng, sb, -2.0, 2.0)],
    }
}

#[test]
fn finite_difference_checker_is_discriminating() {
    // The tolerance must catch a wrong sign or a missing factor of two.
    let mut rng = Rng::new(1);
    let inputs = [
        uniform(&mut rng, &[3, 4], -2.0, 2.0),
        uniform(&mut rng, &[4], -2.0, 2.0),
    ];
    let c = Check::default();
    let f = |v: &[Tensor]| v[0].mul(&v[1])?.tanh();
    for (an, fd) in grads("checker", &inputs, &c, &f) {
        assert!(compare_grads(&an, &fd, &c).is_ok());
        let scaled: Vec<(usize, f64)> = an.iter().map(|&(j, a)| (j, 2.0 * a)).collect();
        assert!(
            compare_grads(&scaled, &fd, &c).is_err(),
            "a factor of 2 must be caught"
        );
        let flipped: Vec<(usize, f64)> = an.iter().map(|&(j, a)| (j, -a)).collect();
        assert!(
            compare_grads(&flipped, &fd, &c).is_err(),
            "a sign flip must be caught"
        );
        let tenth: Vec<(usize, f64)> = an.iter().map(|&(j, a)| (j, 1.1 * a)).collect();
        assert!(
            compare_grads(&tenth, &fd, &c).is_err(),
            "a 10% error must be caught"
        );
    }
}

#[test]
fn binary_ops_with_broadcasting() {
    let shapes: &[(&[usize], &[usize])] = &[
        (&[4, 1, 3], &[5, 1]),
        (&[2, 3], &[2, 3]),
        (&[2, 3], &[3]),
        (&[2, 1, 4], &[1, 3, 1]),
        (&[], &[2, 3]),
    ];
    for seed in 0..2 {
        let mut rng = Rng::new(1000 + seed);
        for &(sa, sb) in shapes {
            for (name, f) in binaries() {
                for (s1, s2) in [(sa, sb), (sb, sa)] {
                    let inputs = bin_inputs(&mut rng, name, s1, s2);
                    grad_check(&format!("{name} {s1:?} {s2:?}"), &inputs, |v| {
                        f(&v[0], &v[1])
                    });
                }
            }
        }
    }
}

#[test]
fn binary_ops_on_random_broadcast_shapes() {
    let mut rng = Rng::new(1005);
    for _ in 0..8 {
        let (sa, sb) = broadcast_pair(&mut rng);
        for (name, f) in binaries() {
            let inputs = bin_inputs(&mut rng, name, &sa, &sb);
            grad_check(&format!("{name} {sa:?} {sb:?}"), &inputs, |v| {
                f(&v[0], &v[1])
            });
            let inputs = bin_inputs(&mut rng, name, &sb, &sa);
            grad_check(&format!("{name} {sb:?} {sa:?}"), &inputs, |v| {
                f(&v[0], &v[1])
            });
        }
    }
}

#[test]
fn binary_ops_on_non_contiguous_inputs() {
    let mut rng = Rng::new(1010);
    for (name, f) in binaries() {
        // a: [3,4] used as its transpose [4,3]; b: [3,5] narrowed to [3,3] then transposed.
        let [a, _] = bin_inputs(&mut rng, name, &[3, 4], &[1]);
        let [_, b] = bin_inputs(&mut rng, name, &[1], &[3, 5]);
        grad_check(&format!("{name} strided"), &[a.clone(), b.clone()], |v| {
            let x = v[0].t()?; // [4,3]
            let y = v[1].narrow(1, 1, 3)?.t()?.narrow(0, 0, 1)?; // [1,3] strided, broadcast over rows
            f(&x, &y)
        });
        // Same operand used on both sides through different views.
        if name != "div" && name != "maximum" && name != "minimum" {
            grad_check(
                &format!("{name} self-views"),
                &[uniform(&mut rng, &[3, 3], -1.0, 1.0)],
                |v| f(&v[0], &v[0].t()?),
            );
        }
    }
}

#[test]
fn unary_ops() {
    for seed in 0..2 {
        let mut rng = Rng::new(1020 + seed);
        for (name, f, _, (lo, hi, sym)) in unary_cases() {
            // Keep away from singularities and kinks by more than the step.
            let dom = if sym {
                (lo.max(0.1), hi.min(3.0), true)
            } else {
                (lo.max(0.3), hi.min(3.0), false)
            };
            let x = unary_input(&mut rng, &[3, 4], dom);
            grad_check(&format!("{name} contiguous"), &[x], |v| f(&v[0]));
            let x = unary_input(&mut rng, &[4, 3], dom);
            grad_check(&format!("{name} transposed"), &[x], |v| f(&v[0].t()?));
            let x = unary_input(&mut rng, &[2, 3, 4], dom);
            grad_check(&format!("{name} permuted"), &[x], |v| {
                f(&v[0].permute(&[2, 0, 1])?)
            });
        }
    }
}

#[test]
fn reductions() {
    let mut rng = Rng::new(1030);
    let dim_sets: &[&[isize]] = &[&[0], &[1], &[-1], &[0, 2], &[0, 1, 2]];
    for &dims in dim_sets {
        for keepdim in [false, true] {
            let x = uniform(&mut rng, &[3, 4, 5], -1.0, 1.0);
            grad_check(&format!("sum {dims:?} {keepdim}"), [x.clone()], |v| {
                v[0].sum(dims, keepdim)
            });
            grad_check(&format!("mean {dims:?} {keepdim}"), &[x], |v| {
                v[0].mean(dims, keepdim)
            });
            // Non-contiguous input: a permuted [5,3,4] tensor.
            let x = uniform(&mut rng, &[5, 3, 4], -1.0, 1.0);
            grad_check(
                &format!("sum permuted {dims:?} {keepdim}"),
                [x.clone()],
                |v| v[0].permute(&[1, 2, 0])?.sum(dims, keepdim),
            );
            grad_check(&format!("mean permuted {dims:?} {keepdim}"), &[x], |v| {
                v[0].permute(&[1, 2, 0])?.mean(dims, keepdim)
            });
        }
    }
    let x = uniform(&mut rng, &[3, 4], -1.0, 1.0);
    grad_check("sum_all", [x.clone()], |v| v[0].t()?.sum_all());
    grad_check("mean_all", &[x], |v| v[0].mean_all());
    for d in [0isize, 1, 2, -1] {
        for keepdim in [false, true] {
            let x = distinct(&mut rng, &[3, 4, 5], 0.1);
            grad_check(&format!("max {d} {keepdim}"), [x.clone()], |v| {
                v[0].max(d, keepdim)
            });
            grad_check(&format!("min {d} {keepdim}"), [x.clone()], |v| {
                v[0].min(d, keepdim)
            });
            grad_check(&format!("max transposed {d} {keepdim}"), &[x], |v| {
                v[0].transpose(0, 2)?.max(d, keepdim)
            });
        }
    }
}

#[test]
fn softmax_and_log_softmax() {
    let mut rng = Rng::new(1040);
    for d in [-1isize, 0, 1] {
        let x = uniform(&mut rng, &[3, 4, 5], -2.0, 2.0);
        grad_check(&format!("softmax {d}"), [x.clone()], |v| v[0].softmax(d));
        grad_check(&format!("log_softmax {d}"), [x.clone()], |v| {
            v[0].log_softmax(d)
        });
        grad_check(&format!("softmax transposed {d}"), [x.clone()], |v| {
            v[0].transpose(0, 2)?.softmax(d)
        });
        grad_check(&format!("log_softmax transposed {d}"), &[x], |v| {
            v[0].transpose(1, 2)?.log_softmax(d)
        });
    }
}

#[test]
fn matmul() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[3, 4], &[4, 5]),
        (&[2, 3, 4], &[2, 4, 5]),
        (&[2, 1, 3, 4], &[5, 4, 2]),
        (&[3, 4], &[2, 4, 5]),
        (&[1, 3, 4], &[2, 4, 2]),
    ];
    let mut rng = Rng::new(1050);
    for &(sa, sb) in cases {
        let inputs = [
            uniform(&mut rng, sa, -1.0, 1.0),
            uniform(&mut rng, sb, -1.0, 1.0),
        ];
        grad_check(&format!("matmul {sa:?} {sb:?}"), &inputs, |v| {
            v[0].matmul(&v[1])
        });
    }
    // Transposed and narrowed operands.
    let inputs = [
        uniform(&mut rng, &[4, 3], -1.0, 1.0),
        uniform(&mut rng, &[5, 4], -1.0, 1.0),
    ];
    grad_check("matmul aᵀ bᵀ", &inputs, |v| {
        v[0].t()?.matmul(&v[1].t()?)
    });
    let inputs = [
        uniform(&mut rng, &[3, 8], -1.0, 1.0),
        uniform(&mut rng, &[2, 5, 4], -1.0, 1.0),
    ];
    grad_check("matmul narrow · batched bᵀ", &inputs, |v| {
        v[0].narrow(1, 3, 4)?.matmul(&v[1].transpose(1, 2)?)
    });
    let inputs = [
        uniform(&mut rng, &[4, 2, 3], -1.0, 1.0),
        uniform(&mut rng, &[4, 5], -1.0, 1.0),
    ];
    grad_check("matmul permuted", &inputs, |v| {
        v[0].permute(&[1, 2, 0])?.matmul(&v[1])
    });
}

#[test]
fn conv2d() {
    let mut rng = Rng::new(1060);
    let c = Check {
        max_elems: 32,
        ..Check::default()
    };
    for case in CONV_CASES {
        let &[n, ch, h, w, o, kh, kw, ..] = case;
        let p = conv_params(case);
        let inputs = [
            uniform(&mut rng, &[n, ch, h, w], -1.0, 1.0),
            uniform(&mut rng, &[o, ch / p.groups, kh, kw], -1.0, 1.0),
        ];
        grad_check_with(&format!("conv2d {case:?}"), &inputs, c, |v| {
            v[0].conv2d(&v[1], p)
        });
        // Channels-last input and a permuted weight.
        let inputs = [
            uniform(&mut rng, &[n, h, w, ch], -1.0, 1.0),
            uniform(&mut rng, &[kh, kw, o, ch / p.groups], -1.0, 1.0),
        ];
        grad_check_with(&format!("conv2d strided {case:?}"), &inputs, c, |v| {
            v[0].permute(&[0, 3, 1, 2])?
                .conv2d(&v[1].permute(&[2, 3, 0, 1])?, p)
        });
    }
    for _ in 0..6 {
        let case = random_conv_case(&mut rng);
        let &[n, ch, h, w, o, kh, kw, ..] = &case;
        let p = conv_params(&case);
        let inputs = [
            uniform(&mut rng, &[n, ch, h, w], -1.0, 1.0),
            uniform(&mut rng, &[o, ch / p.groups, kh, kw], -1.0, 1.0),
        ];
        grad_check_with(&format!("conv2d random {case:?}"), &inputs, c, |v| {
            v[0].conv2d(&v[1], p)
        });
    }
    // A batch larger than the backward's sample chunk (8): the weight gradient sums chunks.
    let p = Conv2dParams {
        stride: 2,
        padding: 1,
        dilation: 1,
        groups: 1,
    };
    let inputs = [
        uniform(&mut rng, &[19, 2, 5, 5], -1.0, 1.0),
        uniform(&mut rng, &[3, 2, 3, 3], -1.0, 1.0),
    ];
    grad_check_with("conv2d batch 19", &inputs, c, |v| v[0].conv2d(&v[1], p));
    // Only the weight tracks gradients (a frozen input), and only the input.
    let x = uniform(&mut rng, &[2, 2, 5, 5], -1.0, 1.0);
    grad_check_with(
        "conv2d weight only",
        &[uniform(&mut rng, &[3, 2, 3, 3], -1.0, 1.0)],
        c,
        |v| x.conv2d(&v[0], p),
    );
    let w = uniform(&mut rng, &[3, 2, 3, 3], -1.0, 1.0);
    grad_check_with("conv2d input only", [x.clone()], c, |v| v[0].conv2d(&w, p));
}

#[test]
fn pooling() {
    let mut rng = Rng::new(1070);
    for &(kernel, stride, padding) in POOL_CASES {
        let p = Pool2dParams {
            kernel,
            stride,
            padding,
        };
        // Distinct values 0.05 apart: the step (0.01) never changes which element wins.
        let x = distinct(&mut rng, &[2, 2, 7, 6], 0.05);
        grad_check(&format!("max_pool2d {p:?}"), [x.clone()], |v| {
            v[0].max_pool2d(p)
        });
        grad_check(&format!("avg_pool2d {p:?}"), &[x], |v| v[0].avg_pool2d(p));
        let x = distinct(&mut rng, &[2, 7, 6, 2], 0.05);
        grad_check(&format!("max_pool2d permuted {p:?}"), [x.clone()], |v| {
            v[0].permute(&[0, 3, 1, 2])?.max_pool2d(p)
        });
        grad_check(&format!("avg_pool2d permuted {p:?}"), &[x], |v| {
            v[0].permute(&[0, 3, 1, 2])?.avg_pool2d(p)
        });
    }
}

#[test]
fn layer_norm() {
    let mut rng = Rng::new(1080);
    for shape in [vec![4, 7], vec![2, 3, 8], vec![70, 5]] {
        let n = *shape.last().unwrap();
        let inputs = [
            uniform(&mut rng, &shape, -2.0, 2.0),
            uniform(&mut rng, &[n], 0.5, 1.5),
            uniform(&mut rng, &[n], -0.5, 0.5),
        ];
        grad_check(&format!("layer_norm {shape:?}"), &inputs, |v| {
            v[0].layer_norm(&v[1], &v[2], 1e-5)
        });
    }
    let inputs = [
        uniform(&mut rng, &[6, 4], -2.0, 2.0),
        uniform(&mut rng, &[6], 0.5, 1.5),
        uniform(&mut rng, &[6], -0.5, 0.5),
    ];
    grad_check("layer_norm transposed", &inputs, |v| {
        v[0].t()?.layer_norm(&v[1], &v[2], 1e-5)
    });
    // Input only (frozen affine parameters).
    let (g, b) = (
        uniform(&mut rng, &[5], 0.5, 1.5),
        uniform(&mut rng, &[5], -0.5, 0.5),
    );
    grad_check(
        "layer_norm input only",
        &[uniform(&mut rng, &[3, 5], -2.0, 2.0)],
        |v| v[0].layer_norm(&g, &b, 1e-5),
    );
}

#[test]
fn losses() {
    let mut rng = Rng::new(1090);
    let t = ids(&[0, 4, -100, 2, 1, 3], &[6]);
    grad_check(
        "cross_entropy",
        &[uniform(&mut rng, &[6, 5], -2.0, 2.0)],
        |v| v[0].cross_entropy(&t, -100),
    );
    let t3 = ids(&[0, 3, 1, 3, 3, 2], &[2, 3]);
    grad_check(
        "cross_entropy 3-d ignore 3",
        &[uniform(&mut rng, &[2, 3, 4], -2.0, 2.0)],
        |v| v[0].cross_entropy(&t3, 3),
    );
    grad_check(
        "cross_entropy transposed",
        &[uniform(&mut rng, &[5, 6], -2.0, 2.0)],
        |v| v[0].t()?.cross_entropy(&t, -100),
    );
    // Scaled afterwards: the incoming gradient must be honoured.
    grad_check(
        "cross_entropy scaled",
        &[uniform(&mut rng, &[6, 5], -2.0, 2.0)],
        |v| v[0].cross_entropy(&t, -100)?.mul_scalar(-2.5),
    );
    let inputs = [
        uniform(&mut rng, &[3, 4], -2.0, 2.0),
        uniform(&mut rng, &[4, 3], -2.0, 2.0),
    ];
    grad_check("mse_loss", &inputs, |v| v[0].mse_loss(&v[1].t()?));
}

#[test]
fn gather_and_scatter() {
    let mut rng = Rng::new(1100);
    let i0 = ids(&[4, 0, 4, 2, 4], &[5]);
    let i1 = ids(&[3, 3, 0], &[3]);
    let x = uniform(&mut rng, &[5, 4, 3], -1.0, 1.0);
    grad_check("index_select dim 0", [x.clone()], |v| {
        v[0].index_select(0, &i0)
    });
    grad_check("index_select dim 1", [x.clone()], |v| {
        v[0].index_select(1, &i1)
    });
    grad_check("index_select permuted", &[x], |v| {
        v[0].permute(&[1, 0, 2])?.index_select(1, &i0)
    });
    let tok = ids(&[1, 6, 1, 0, 3, 1], &[2, 3]);
    grad_check("embedding", &[uniform(&mut rng, &[7, 4], -1.0, 1.0)], |v| {
        v[0].embedding(&tok)
    });
    let inputs = [
        uniform(&mut rng, &[5, 3], -1.0, 1.0),
        uniform(&mut rng, &[5, 3], -1.0, 1.0),
    ];
    grad_check("index_add dim 0", &inputs, |v| {
        v[0].index_add(0, &i0, &v[1])
    });
    let inputs = [
        uniform(&mut rng, &[2, 4, 3], -1.0, 1.0),
        uniform(&mut rng, &[2, 3, 3], -1.0, 1.0),
    ];
    grad_check("index_add dim 1", &inputs, |v| {
        v[0].index_add(1, &i1, &v[1])?.sqr()
    });
}

#[test]
fn cat_stack_split_chunk() {
    let mut rng = Rng::new(1110);
    let inputs = [
        uniform(&mut rng, &[2, 2, 4], -1.0, 1.0),
        uniform(&mut rng, &[4, 1, 2], -1.0, 1.0),
        uniform(&mut rng, &[2, 3, 4], -1.0, 1.0),
    ];
    grad_check("cat dim 1", &inputs, |v| {
        Tensor::cat(&[v[0].clone(), v[1].permute(&[2, 1, 0])?, v[2].clone()], 1)
    });
    let inputs = [
        uniform(&mut rng, &[2, 3], -1.0, 1.0),
        uniform(&mut rng, &[2, 3], -1.0, 1.0),
    ];
    grad_check("cat dim -1", &inputs, |v| {
        Tensor::cat(&[v[0].clone(), v[1].sqr()?], -1)
    });
    grad_check("stack dim 1", &inputs, |v| {
        Tensor::stack(&[v[0].clone(), v[1].t()?.t()?, v[0].clone()], 1)
    });
    let x = uniform(&mut rng, &[2, 6, 3], -1.0, 1.0);
    grad_check("split", [x.clone()], |v| {
        let p = v[0].split(&[1, 3, 2], 1)?;
        Tensor::cat(&[p[2].sqr()?, p[0].clone(), p[1].mul_scalar(3.0)?], 1)
    });
    grad_check("chunk", &[x], |v| {
        let p = v[0].chunk(3, -1)?;
        p[0].mul(&p[2])?.add(&p[1].tanh()?)
    });
}

#[test]
fn where_and_masked_fill() {
    let mut rng = Rng::new(1120);
    let cond = tensor(
        &[1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0],
        &[4, 1, 3],
    );
    let inputs = [
        uniform(&mut rng, &[5, 1], -1.0, 1.0),
        uniform(&mut rng, &[3], -1.0, 1.0),
    ];
    grad_check("where broadcast", &inputs, |v| {
        Tensor::where_cond(&cond, &v[0], &v[1])
    });
    let t = 4;
    let mask = tensor(
        &Arr::from_fn(&[t, t], |i| (i[1] > i[0]) as u8 as f64).data,
        &[t, t],
    );
    grad_check(
        "masked_fill + softmax",
        &[uniform(&mut rng, &[2, t, t], -2.0, 2.0)],
        |v| v[0].masked_fill(&mask, -1e9)?.softmax(-1),
    );
    grad_check(
        "masked_fill transposed",
        &[uniform(&mut rng, &[t, t], -2.0, 2.0)],
        |v| v[0].t()?.masked_fill(&mask, 0.5),
    );
}

#[test]
fn views() {
    let mut rng = Rng::new(1130);
    let x = uniform(&mut rng, &[2, 3, 4], -1.0, 1.0);
    let one = [x.clone()];
    grad_check("reshape", &one, |v| v[0].reshape(&[4, 6])?.sqr());
    grad_check("reshape of transpose", &one, |v| {
        v[0].transpose(0, 2)?.reshape(&[8, 3])?.sqr()
    });
    grad_check("permute", &one, |v| v[0].permute(&[2, 0, 1])?.sqr());
    grad_check("narrow", &one, |v| v[0].narrow(2, 1, 2)?.sqr());
    grad_check("narrow of narrow", &one, |v| {
        v[0].narrow(1, 1, 2)?.narrow(0, 1, 1)?.sqr()
    });
    grad_check("flatten_from", &one, |v| v[0].t()?.flatten_from(1)?.sqr());
    grad_check("contiguous", &one, |v| {
        v[0].transpose(0, 1)?.contiguous()?.sqr()
    });
    grad_check("unsqueeze/squeeze", &one, |v| {
        v[0].unsqueeze(1)?.sqr()?.squeeze(1)
    });
    let col = uniform(&mut rng, &[3, 1], -1.0, 1.0);
    grad_check("broadcast_as", [col.clone()], |v| {
        v[0].broadcast_as(&[2, 3, 4])?.mul(&x)
    });
    grad_check("broadcast_as of unsqueeze", &[col], |v| {
        v[0].squeeze(1)?.unsqueeze(0)?.broadcast_as(&[5, 3])?.sqr()
    });
}

#[test]
fn dropout() {
    let mut rng = Rng::new(1140);
    let x = uniform(&mut rng, &[6, 8], -1.0, 1.0);
    // The same seed each evaluation: a fixed mask.
    grad_check("dropout", &[x], |v| v[0].dropout(0.4, &mut Rng::new(9)));
}

#[test]
fn small_network_end_to_end() {
    let mut rng = Rng::new(1150);
    let x = uniform(&mut rng, &[5, 4], -1.0, 1.0);
    let t = ids(&[0, 2, 1, 2, 0], &[5]);
    let inputs = [
        uniform(&mut rng, &[4, 6], -1.0, 1.0),
        uniform(&mut rng, &[6], -0.5, 0.5),
        uniform(&mut rng, &[3, 6], -1.0, 1.0),
    ];
    grad_check("mlp", &inputs, |v| {
        let h = x.matmul(&v[0])?.add(&v[1])?.gelu()?;
        h.matmul(&v[2].t()?)?.cross_entropy(&t, -100)
    });
}
