//! Forward of matmul (plain, batched, batch-broadcast, transposed operands), conv2d (direct
//! 7-loop reference) and 2-D pooling.

use super::common::*;
use sinter_core::{Conv2dParams, Pool2dParams, Rng};

/// [..., m, k] @ [..., k, n] with broadcast batch dimensions, in f64.
pub fn matmul_ref(a: &Arr, b: &Arr) -> Arr {
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let (m, k, n) = (a.shape[ra - 2], a.shape[ra - 1], b.shape[rb - 1]);
    assert_eq!(k, b.shape[rb - 2]);
    let batch = broadcast_shape(&a.shape[..ra - 2], &b.shape[..rb - 2]);
    let mut shape = batch.clone();
    shape.extend([m, n]);
    let nb = batch.len();
    Arr::from_fn(&shape, |i| {
        let (bi, (r, c)) = (&i[..nb], (i[nb], i[nb + 1]));
        (0..k)
            .map(|kk| {
                let mut ia = bi.to_vec();
                ia.extend([r, kk]);
                let mut ib = bi.to_vec();
                ib.extend([kk, c]);
                a.get_bcast(&ia) * b.get_bcast(&ib)
            })
            .sum()
    })
}

#[test]
fn matmul_plain_batched_and_broadcast() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[3, 4], &[4, 5]),
        (&[1, 1], &[1, 1]),
        (&[2, 3, 4], &[2, 4, 5]),
        (&[2, 1, 3, 4], &[5, 4, 2]),
        (&[3, 4], &[2, 4, 5]),
        (&[1, 3, 4], &[2, 4, 5]),
        (&[2, 3, 7], &[7, 1]),
    ];
    for seed in 0..3 {
        let mut rng = Rng::new(500 + seed);
        for &(sa, sb) in cases {
            let (a, b) = (
                uniform(&mut rng, sa, -1.0, 1.0),
                uniform(&mut rng, sb, -1.0, 1.0),
            );
            check_f32(
                &a.matmul(&b).unwrap(),
                &matmul_ref(&Arr::of(&a), &Arr::of(&b)),
                &format!("matmul {sa:?} @ {sb:?}"),
            );
        }
        // Random sizes.
        let (m, k, n) = (
            1 + rng.below(9) as usize,
            1 + rng.below(9) as usize,
            1 + rng.below(9) as usize,
        );
        let (a, b) = (
            uniform(&mut rng, &[2, m, k], -1.0, 1.0),
            uniform(&mut rng, &[k, n], -1.0, 1.0),
        );
        check_f32(
            &a.matmul(&b).unwrap(),
            &matmul_ref(&Arr::of(&a), &Arr::of(&b)),
            &format!("matmul m{m} k{k} n{n}"),
        );
    }
}

#[test]
fn matmul_with_transposed_and_strided_operands() {
    let mut rng = Rng::new(17);
    let a_t = uniform(&mut rng, &[4, 3], -1.0, 1.0).t().unwrap(); // [3,4]
    let b_t = uniform(&mut rng, &[5, 4], -1.0, 1.0).t().unwrap(); // [4,5]
    let a = uniform(&mut rng, &[3, 4], -1.0, 1.0);
    let b = uniform(&mut rng, &[4, 5], -1.0, 1.0);
    let a_n = uniform(&mut rng, &[3, 9], -1.0, 1.0)
        .narrow(1, 2, 4)
        .unwrap();
    let bb_t = uniform(&mut rng, &[2, 5, 4], -1.0, 1.0)
        .transpose(1, 2)
        .unwrap(); // [2,4,5]
    let ab_p = uniform(&mut rng, &[4, 2, 3], -1.0, 1.0)
        .permute(&[1, 2, 0])
        .unwrap(); // [2,3,4]
    for (x, y, what) in [
        (&a_t, &b, "aᵀ·b"),
        (&a, &b_t, "a·bᵀ"),
        (&a_t, &b_t, "aᵀ·bᵀ"),
        (&a_n, &b_t, "narrow·bᵀ"),
        (&a, &bb_t, "a·batched bᵀ"),
        (&ab_p, &bb_t, "permuted·batched bᵀ"),
        (&ab_p, &b, "permuted·b"),
    ] {
        check_f32(
            &x.matmul(y).unwrap(),
            &matmul_ref(&Arr::of(x), &Arr::of(y)),
            what,
        );
    }
}

#[test]
fn matmul_large_paths() {
    let mut rng = Rng::new(23);
    // One large product (gemm splits it across threads), and many medium ones (one per thread).
    let a = uniform(&mut rng, &[96, 128], -1.0, 1.0).t().unwrap();
    let b = uniform(&mut rng, &[96, 112], -1.0, 1.0);
    assert_close(
        &a.matmul(&b).unwrap(),
        &matmul_ref(&Arr::of(&a), &Arr::of(&b)),
        1e-5,
        3e-5,
        "large matmul",
    );
    let a = uniform(&mut rng, &[4, 48, 64], -1.0, 1.0);
    let b = uniform(&mut rng, &[4, 64, 40], -1.0, 1.0);
    assert_close(
        &a.matmul(&b).unwrap(),
        &matmul_ref(&Arr::of(&a), &Arr::of(&b)),
        1e-5,
        3e-5,
        "batched matmul",
    );
}

// ---- conv2d -------------------------------------------------------------------------------

/// Direct convolution: out[n,o,y,x] = Σ_c Σ_ky Σ_kx in[n, g·cg + c, y·s − p + ky·d, x·s − p + kx·d] · w[o,c,ky,kx].
pub fn conv2d_ref(x: &Arr, w: &Arr, p: Conv2dParams) -> Arr {
    let (n, c, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (o, cg, kh, kw) = (w.shape[0], w.shape[1], w.shape[2], w.shape[3]);
    assert_eq!(cg * p.groups, c);
    let og = o / p.groups;
    let out =
        |len: usize, k: usize| (len + 2 * p.padding - p.dilation * (k - 1) - 1) / p.stride + 1;
    let (oh, ow) = (out(h, kh), out(wd, kw));
    let mut y = vec![0f64; n * o * oh * ow];
    for ni in 0..n {
        for oi in 0..o {
            let g = oi / og;
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut s = 0.0;
                    for ci in 0..cg {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy =
                                    (oy * p.stride + ky * p.dilation) as isize - p.padding as isize;
                                let ix =
                                    (ox * p.stride + kx * p.dilation) as isize - p.padding as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                s += x.get(&[ni, g * cg + ci, iy as usize, ix as usize])
                                    * w.get(&[oi, ci, ky, kx]);
                            }
                        }
                    }
                    y[((ni * o + oi) * oh + oy) * ow + ox] = s;
                }
            }
        }
    }
    Arr::new(&[n, o, oh, ow], y)
}

/// (n, c, h, w, o, kh, kw, stride, padding, dilation, groups)
pub const CONV_CASES: &[[usize; 11]] = &[
    [2, 3, 7, 6, 4, 3, 3, 1, 0, 1, 1],
    [2, 3, 8, 8, 5, 3, 3, 2, 1, 1, 1],
    [1, 2, 9, 7, 3, 3, 2, 1, 2, 2, 1],
    [2, 4, 7, 7, 6, 3, 3, 2, 1, 1, 2],
    [3, 4, 6, 5, 8, 3, 3, 1, 1, 1, 4],
    [2, 6, 10, 9, 4, 2, 3, 3, 0, 2, 2],
    [1, 2, 5, 5, 3, 1, 1, 1, 0, 1, 1],
    [1, 2, 4, 4, 2, 4, 4, 1, 0, 1, 1],
];

/// A random configuration in the CONV_CASES format; the input is always large enough.
pub fn random_conv_case(rng: &mut Rng) -> [usize; 11] {
    let r = |rng: &mut Rng, lo: usize, hi: usize| lo + rng.below((hi - lo + 1) as u64) as usize;
    let (groups, cg, og) = (r(rng, 1, 3), r(rng, 1, 3), r(rng, 1, 3));
    let (kh, kw, stride, padding, dilation) = (
        r(rng, 1, 3),
        r(rng, 1, 3),
        r(rng, 1, 3),
        r(rng, 0, 2),
        r(rng, 1, 2),
    );
    let size = |rng: &mut Rng, k: usize| {
        (dilation * (k - 1) + 1).saturating_sub(2 * padding).max(1) + r(rng, 0, 4)
    };
    let (h, w) = (size(rng, kh), size(rng, kw));
    [
        r(rng, 1, 3),
        groups * cg,
        h,
        w,
        groups * og,
        kh,
        kw,
        stride,
        padding,
        dilation,
        groups,
    ]
}

pub fn conv_params(c: &[usize; 11]) -> Conv2dParams {
    Conv2dParams {
        stride: c[7],
        padding: c[8],
        dilation: c[9],
        groups: c[10],
    }
}

#[test]
fn conv2d_matches_direct_convolution() {
    for seed in 0..2 {
        let mut rng = Rng::new(600 + seed);
        for case in CONV_CASES {
            let &[n, c, h, w, o, kh, kw, ..] = case;
            let p = conv_params(case);
            let x = uniform(&mut rng, &[n, c, h, w], -1.0, 1.0);
            let wt = uniform(&mut rng, &[o, c / p.groups, kh, kw], -1.0, 1.0);
            check_f32(
                &x.conv2d(&wt, p).unwrap(),
                &conv2d_ref(&Arr::of(&x), &Arr::of(&wt), p),
                &format!("conv2d {case:?}"),
            );
            // Channels-last data viewed as NCHW, and a permuted weight: non-contiguous operands.
            let xp = uniform(&mut rng, &[n, h, w, c], -1.0, 1.0)
                .permute(&[0, 3, 1, 2])
                .unwrap();
            let wp = uniform(&mut rng, &[kh, kw, o, c / p.groups], -1.0, 1.0)
                .permute(&[2, 3, 0, 1])
                .unwrap();
            check_f32(
                &xp.conv2d(&wp, p).unwrap(),
                &conv2d_ref(&Arr::of(&xp), &Arr::of(&wp), p),
                &format!("conv2d strided {case:?}"),
            );
        }
    }
    let mut rng = Rng::new(62);
    for _ in 0..20 {
        let case = random_conv_case(&mut rng);
        let &[n, c, h, w, o, kh, kw, ..] = &case;
        let p = conv_params(&case);
        let x = uniform(&mut rng, &[n, c, h, w], -1.0, 1.0);
        let wt = uniform(&mut rng, &[o, c / p.groups, kh, kw], -1.0, 1.0);
        check_f32(
            &x.conv2d(&wt, p).unwrap(),
            &conv2d_ref(&Arr::of(&x), &Arr::of(&wt), p),
            &format!("conv2d random {case:?}"),
        );
    }
    // A batch spread over several cores.
    let mut rng = Rng::new(61);
    let p = Conv2dParams {
        stride: 1,
        padding: 1,
        dilation: 1,
        groups: 1,
    };
    let x = uniform(&mut rng, &[11, 3, 6, 6], -1.0, 1.0);
    let w = uniform(&mut rng, &[4, 3, 3, 3], -1.0, 1.0);
    check_f32(
        &x.conv2d(&w, p).unwrap(),
        &conv2d_ref(&Arr::of(&x), &Arr::of(&w), p),
        "conv2d batch 11",
    );
}

// ---- pooling -----------------------------------------------------------------------------

/// Max (padding never wins) or average (padding counts as zeros) pooling.
pub fn pool_ref(x: &Arr, p: Pool2dParams, is_max: bool) -> Arr {
    let (n, c, h, w) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let oh = (h + 2 * p.padding - p.kernel) / p.stride + 1;
    let ow = (w + 2 * p.padding - p.kernel) / p.stride + 1;
    Arr::from_fn(&[n, c, oh, ow], |i| {
        let mut best = f64::NEG_INFINITY;
        let mut sum = 0.0;
        for ky in 0..p.kernel {
            for kx in 0..p.kernel {
                let iy = (i[2] * p.stride + ky) as isize - p.padding as isize;
                let ix = (i[3] * p.stride + kx) as isize - p.padding as isize;
                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                    continue;
                }
                let v = x.get(&[i[0], i[1], iy as usize, ix as usize]);
                best = best.max(v);
                sum += v;
            }
        }
        if is_max {
            best
        } else {
            sum / (p.kernel * p.kernel) as f64
        }
    })
}

pub const POOL_CASES: &[(usize, usize, usize)] = &[
    (2, 2, 0),
    (3, 2, 1),
    (3, 1, 1),
    (2, 1, 1),
    (4, 3, 2),
    (3, 3, 0),
];

#[test]
fn max_and_avg_pool_with_padding() {
    let mut rng = Rng::new(700);
    for &(kernel, stride, padding) in POOL_CASES {
        let p = Pool2dParams {
            kernel,
            stride,
            padding,
        };
        for shape in [[2, 3, 7, 6], [1, 2, 8, 8]] {
            let inputs = [
                ("mixed", uniform(&mut rng, &shape, -2.0, 2.0)),
                // All negative: padding must not act as a zero in max pooling.
                ("negative", uniform(&mut rng, &shape, -3.0, -1.0)),
                (
                    "permuted",
                    uniform(
                        &mut rng,
                        &[shape[0], shape[2], shape[3], shape[1]],
                        -2.0,
                        2.0,
                    )
                    .permute(&[0, 3, 1, 2])
                    .unwrap(),
                ),
            ];
            for (what, x) in inputs {
                let a = Arr::of(&x);
                let tag = format!("{what} {shape:?} {p:?}");
                check_f32(
                    &x.max_pool2d(p).unwrap(),
                    &pool_ref(&a, p, true),
                    &format!("max_pool2d {tag}"),
                );
                check_f32(
                    &x.avg_pool2d(p).unwrap(),
                    &pool_ref(&a, p, false),
                    &format!("avg_pool2d {tag}"),
                );
            }
        }
    }
}
