//! embedding.cu, conv.cu and dropout.cu run through the CPU emulator from their launch plans,
//! against f64 references, for f32/f16/bf16 (the optimizer's kernels are sinter-core's
//! kernels/optimizer/ tests).
// References index several arrays with the same loop counter; ranges read better there.
#![allow(clippy::needless_range_loop)]

#[path = "emu/harness.rs"]
mod harness;

use harness::*;
use sinter_cuda::launch::Step;
use sinter_cuda::ops::conv::{self, BnShape, Window2d};
use sinter_cuda::ops::dropout;
use sinter_cuda::ops::embedding;
use sinter_cuda::DType;

fn k(l: Option<sinter_cuda::launch::Launch>) -> Vec<Step> {
    l.into_iter().map(Step::Kernel).collect()
}

fn inputs(rng: &mut Rng, d: DType, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    rng.vec(n, lo, hi).into_iter().map(|v| q(d, v)).collect()
}

#[test]
fn embedding_forward_and_deterministic_backward() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(20);
    for d in FLOATS {
        // dim 37: an odd row length (scalar path); dim 64: aligned rows (vector path). 2600
        // indices with one token in 2100 of them: a bucket above the sort capacity (2048).
        for (vocab, dim, num_idx) in [(50usize, 37usize, 300usize), (20, 64, 4000), (3000, 8, 500)]
        {
            let wv = inputs(&mut rng, d, vocab * dim, -1.0, 1.0);
            let iv: Vec<i64> = (0..num_idx)
                .map(|i| match i % 13 {
                    0 => -1,           // out of range: zero row / ignored
                    1 => vocab as i64, // out of range
                    _ if num_idx > 2000 && i % 5 != 0 => 3,
                    _ => rng.below(vocab as u64 - 5) as i64, // the last 5 rows never occur
                })
                .collect();
            let w = Buf::from_f64(d, &wv, 0);
            let idx = Buf::from_i64(&iv);
            let out = Buf::zeros(d, num_idx * dim, 0);
            let l = embedding::plan_embedding_forward(
                &T1,
                w.slice(),
                idx.slice(),
                out.slice(),
                vocab,
                dim,
            )
            .unwrap()
            .unwrap();
            exec1(e, l, &[&w, &idx, &out]);
            let mut want = vec![0.0; num_idx * dim];
            for (i, &v) in iv.iter().enumerate() {
                if v >= 0 && (v as usize) < vocab {
                    want[i * dim..(i + 1) * dim]
                        .copy_from_slice(&wv[v as usize * dim..(v as usize + 1) * dim]);
                }
            }
            assert_close(
                &format!("embedding fwd {d} {vocab}x{dim}"),
                &out.get(),
                &want,
                (0.0, 0.0),
            );

            for accumulate in [false, true] {
                let gv = inputs(&mut rng, d, num_idx * dim, -1.0, 1.0);
                let g0 = inputs(&mut rng, d, vocab * dim, -1.0, 1.0);
                let mut gy = Buf::from_f64(d, &gv, 0);
                let mut idx = Buf::from_i64(&iv);
                let mut gw = Buf::from_f64(d, &g0, 0);
                let scratch = Buf::zeros(
                    DType::I32,
                    embedding::backward_scratch_len(vocab, num_idx),
                    0,
                );
                let steps = embedding::plan_embedding_backward(
                    &T1,
                    gy.slice(),
                    idx.slice(),
                    gw.slice(),
                    scratch.slice(),
                    vocab,
                    dim,
                    accumulate,
                )
                .unwrap();
                // The scratch (CSR positions) is filled in a timing-dependent order on purpose;
                // only the gradient must not depend on the thread order.
                exec_both(e, &steps, &mut [&mut gy, &mut idx, &mut gw]);
                scratch.check_guards("embedding backward scratch");
                // Reference: f32 sums in increasing index order, as the kernel promises.
                let mut want = vec![0.0; vocab * dim];
                for v in 0..vocab {
                    for j in 0..dim {
                        let mut acc = if accumulate {
                            g0[v * dim + j] as f32
                        } else {
                            0.0f32
                        };
                        for (i, &t) in iv.iter().enumerate() {
                            if t == v as i64 {
                                acc += gv[i * dim + j] as f32;
                            }
                        }
                        want[v * dim + j] = q(d, acc as f64);
                    }
                }
                let what = format!("embedding bwd {d} {vocab}x{dim} (accumulate {accumulate})");
                assert_close(&what, &gw.get(), &want, (0.0, 0.0));
            }
        }
    }
}

fn windows() -> Vec<Window2d> {
    vec![
        Window2d {
            n: 2,
            c: 3,
            h: 9,
            w: 11,
            kernel: (3, 3),
            stride: (1, 1),
            padding: (1, 1),
            dilation: (1, 1),
            ceil_mode: false,
        },
        Window2d {
            n: 1,
            c: 4,
            h: 13,
            w: 10,
            kernel: (3, 2),
            stride: (2, 3),
            padding: (1, 0),
            dilation: (2, 1),
            ceil_mode: false,
        },
        Window2d {
            n: 3,
            c: 2,
            h: 8,
            w: 8,
            kernel: (2, 2),
            stride: (2, 2),
            padding: (0, 0),
            dilation: (1, 1),
            ceil_mode: false,
        },
    ]
}

#[test]
fn im2col_and_col2im() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(21);
    for d in FLOATS {
        for g in windows() {
            let (oh, ow) = g.out_hw().unwrap();
            // Images one channel apart in a wider tensor (a channel group): img_stride > c*h*w.
            let img_stride = (g.c + 1) * g.h * g.w;
            let xlen = (g.n - 1) * img_stride + g.c * g.h * g.w;
            let xv = inputs(&mut rng, d, xlen, -1.0, 1.0);
            let x = Buf::from_f64(d, &xv, 0);
            let col = Buf::zeros(d, g.col_len().unwrap(), 0);
            let l = conv::plan_im2col(&T1, x.slice(), col.slice(), &g, img_stride)
                .unwrap()
                .unwrap();
            exec1(e, l, &[&x, &col]);
            let (kh, kw) = g.kernel;
            let at =
                |n: usize, c: usize, ki: usize, kj: usize, oy: usize, ox: usize| -> Option<usize> {
                    let iy = (oy * g.stride.0 + ki * g.dilation.0) as i64 - g.padding.0 as i64;
                    let ix = (ox * g.stride.1 + kj * g.dilation.1) as i64 - g.padding.1 as i64;
                    (iy >= 0 && ix >= 0 && (iy as usize) < g.h && (ix as usize) < g.w)
                        .then(|| n * img_stride + (c * g.h + iy as usize) * g.w + ix as usize)
                };
            let mut want = Vec::new();
            for n in 0..g.n {
                for c in 0..g.c {
                    for ki in 0..kh {
                        for kj in 0..kw {
                            for oy in 0..oh {
                                for ox in 0..ow {
                                    want.push(at(n, c, ki, kj, oy, ox).map_or(0.0, |p| xv[p]));
                                }
                            }
                        }
                    }
                }
            }
            assert_close(&format!("im2col {d} {g:?}"), &col.get(), &want, (0.0, 0.0));

            for accumulate in [false, true] {
                let cv = inputs(&mut rng, d, g.col_len().unwrap(), -1.0, 1.0);
                let col = Buf::from_f64(d, &cv, 0);
                let x0 = inputs(&mut rng, d, xlen, -1.0, 1.0);
                let dx = Buf::from_f64(d, &x0, 0);
                let l = conv::plan_col2im(&T1, col.slice(), dx.slice(), &g, img_stride, accumulate)
                    .unwrap()
                    .unwrap();
                exec1(e, l, &[&col, &dx]);
                let mut want = x0.clone();
                let mut touched = vec![false; xlen];
                for n in 0..g.n {
                    for c in 0..g.c {
                        for y in 0..g.h {
                            for xx in 0..g.w {
                                let p = n * img_stride + (c * g.h + y) * g.w + xx;
                                touched[p] = true;
                                if !accumulate {
                                    want[p] = 0.0;
                                }
                            }
                        }
                    }
                }
                let mut i = 0;
                for n in 0..g.n {
                    for c in 0..g.c {
                        for ki in 0..kh {
                            for kj in 0..kw {
                                for oy in 0..oh {
                                    for ox in 0..ow {
                                        if let Some(p) = at(n, c, ki, kj, oy, ox) {
                                            want[p] += cv[i];
                                        }
                                        i += 1;
                                    }
                                }
                            }
                        }
                    }
                }
                assert!(touched.iter().filter(|t| !**t).count() == (g.n - 1) * g.h * g.w);
                let (rt, a) = tol(d);
                assert_close(
                    &format!("col2im {d} {g:?} acc {accumulate}"),
                    &dx.get(),
                    &want,
                    (rt, a * 4.0),
                );
            }
        }
    }
}

#[test]
fn max_and_avg_pooling() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(22);
    for d in FLOATS {
        for g in windows() {
            let (oh, ow) = g.out_hw().unwrap();
            let planes = g.n * g.c;
            let (nin, nout) = (planes * g.h * g.w, planes * oh * ow);
            let xv = inputs(&mut rng, d, nin, -1.0, 1.0);
            let x = Buf::from_f64(d, &xv, 0);
            let taps = |oy: usize, ox: usize, dil: (usize, usize)| -> Vec<usize> {
                let mut v = Vec::new();
                for ki in 0..g.kernel.0 {
                    for kj in 0..g.kernel.1 {
                        let iy = (oy * g.stride.0 + ki * dil.0) as i64 - g.padding.0 as i64;
                        let ix = (ox * g.stride.1 + kj * dil.1) as i64 - g.padding.1 as i64;
                        if iy >= 0 && ix >= 0 && (iy as usize) < g.h && (ix as usize) < g.w {
                            v.push(iy as usize * g.w + ix as usize);
                        }
                    }
                }
                v
            };
            // Max pool forward + backward.
            let y = Buf::zeros(d, nout, 0);
            let am = Buf::zeros(DType::I64, nout, 0);
            let l = conv::plan_maxpool2d_forward(&T1, x.slice(), y.slice(), Some(am.slice()), &g)
                .unwrap()
                .unwrap();
            exec1(e, l, &[&x, &y, &am]);
            let (mut wy, mut wa) = (vec![0.0; nout], vec![0i64; nout]);
            for p in 0..planes {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let o = (p * oh + oy) * ow + ox;
                        let t = taps(oy, ox, g.dilation);
                        let mut best = t[0];
                        for &a in &t {
                            if xv[p * g.h * g.w + a] > xv[p * g.h * g.w + best] {
                                best = a;
                            }
                        }
                        wy[o] = xv[p * g.h * g.w + best];
                        wa[o] = best as i64;
                    }
                }
            }
            assert_close(&format!("maxpool {d} {g:?}"), &y.get(), &wy, (0.0, 0.0));
            assert_eq!(am.get_i64(), wa, "maxpool argmax {d} {g:?}");
            let gv = inputs(&mut rng, d, nout, -1.0, 1.0);
            let gy = Buf::from_f64(d, &gv, 0);
            let gx = Buf::zeros(d, nin, 0);
            let l = conv::plan_maxpool2d_backward(&T1, gy.slice(), am.slice(), gx.slice(), &g)
                .unwrap()
                .unwrap();
            exec1(e, l, &[&gy, &am, &gx]);
            let mut want = vec![0.0; nin];
            for o in 0..nout {
                want[o / (oh * ow) * g.h * g.w + wa[o] as usize] += gv[o];
            }
            let (rt, a) = tol(d);
            assert_close(&format!("maxpool bwd {d} {g:?}"), &gx.get(), &want, (rt, a));

            if g.dilation != (1, 1) {
                continue;
            }
            for include_pad in [false, true] {
                let y = Buf::zeros(d, nout, 0);
                let l = conv::plan_avgpool2d_forward(&T1, x.slice(), y.slice(), &g, include_pad)
                    .unwrap()
                    .unwrap();
                exec1(e, l, &[&x, &y]);
                let div = |oy: usize, ox: usize| {
                    if include_pad {
                        (g.kernel.0 * g.kernel.1) as f64
                    } else {
                        taps(oy, ox, (1, 1)).len() as f64
                    }
                };
                let mut want = vec![0.0; nout];
                let mut gwant = vec![0.0; nin];
                for p in 0..planes {
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let o = (p * oh + oy) * ow + ox;
                            let t = taps(oy, ox, (1, 1));
                            want[o] =
                                t.iter().map(|&a| xv[p * g.h * g.w + a]).sum::<f64>() / div(oy, ox);
                            for &a in &t {
                                gwant[p * g.h * g.w + a] += gv[o] / div(oy, ox);
                            }
                        }
                    }
                }
                assert_close(
                    &format!("avgpool {d} pad {include_pad}"),
                    &y.get(),
                    &want,
                    (rt, a),
                );
                let gx = Buf::zeros(d, nin, 0);
                let l = conv::plan_avgpool2d_backward(&T1, gy.slice(), gx.slice(), &g, include_pad)
                    .unwrap()
                    .unwrap();
                exec1(e, l, &[&gy, &gx]);
                assert_close(
                    &format!("avgpool bwd {d} pad {include_pad}"),
                    &gx.get(),
                    &gwant,
                    (rt, a),
                );
            }
        }
    }
}

#[test]
fn batchnorm_stats_apply_backward() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(23);
    for d in FLOATS {
        // Small planes (one warp), and N*H*W beyond a 1024-thread block.
        for s in [
            BnShape { n: 3, c: 5, hw: 7 },
            // 1024-thread blocks: more channels than the 1-SM grid, so blocks loop over channels.
            BnShape {
                n: 2,
                c: 10,
                hw: 2100,
            },
            BnShape {
                n: 4,
                c: 3,
                hw: 700,
            },
        ] {
            let total = s.n * s.c * s.hw;
            let xv = inputs(&mut rng, d, total, -1.0, 3.0);
            let gv = inputs(&mut rng, d, total, -1.0, 1.0);
            let gam = inputs(&mut rng, d, s.c, 0.5, 1.5);
            let bet = inputs(&mut rng, d, s.c, -0.5, 0.5);
            let ch = |i: usize| (i / s.hw) % s.c;
            let m = (s.n * s.hw) as f64;
            let mut mu = vec![0.0; s.c];
            let mut var = vec![0.0; s.c];
            for i in 0..total {
                mu[ch(i)] += xv[i] / m;
            }
            for i in 0..total {
                var[ch(i)] += (xv[i] - mu[ch(i)]).powi(2) / m;
            }
            let mut x = Buf::from_f64(d, &xv, 0);
            let mut mean = Buf::zeros(DType::F32, s.c, 0);
            let mut varb = Buf::zeros(DType::F32, s.c, 0);
            let steps =
                k(
                    conv::plan_batchnorm_stats(&T1, x.slice(), mean.slice(), varb.slice(), &s)
                        .unwrap(),
                );
            exec_both(e, &steps, &mut [&mut x, &mut mean, &mut varb]);
            assert_close(
                &format!("bn mean {d} {s:?}"),
                &mean.get(),
                &mu,
                (1e-5, 1e-6),
            );
            assert_close(
                &format!("bn var {d} {s:?}"),
                &varb.get(),
                &var,
                (1e-4, 1e-6),
            );

            let inv: Vec<f64> = var.iter().map(|v| 1.0 / (v + 1e-5).sqrt()).collect();
            let invb = Buf::from_f64(DType::F32, &inv, 0);
            let meanb = Buf::from_f64(DType::F32, &mu, 0);
            let gamma = Buf::from_f64(d, &gam, 0);
            let beta = Buf::from_f64(d, &bet, 0);
            let y = Buf::zeros(d, total, 0);
            let l = conv::plan_batchnorm_apply(
                &T1,
                x.slice(),
                meanb.slice(),
                invb.slice(),
                Some(gamma.slice()),
                Some(beta.slice()),
                y.slice(),
                &s,
            )
            .unwrap()
            .unwrap();
            exec1(e, l, &[&x, &meanb, &invb, &gamma, &beta, &y]);
            let mu32: Vec<f64> = meanb.get();
            let inv32: Vec<f64> = invb.get();
            let want: Vec<f64> = (0..total)
                .map(|i| (xv[i] - mu32[ch(i)]) * inv32[ch(i)] * gam[ch(i)] + bet[ch(i)])
                .collect();
            let (rt, a) = tol(d);
            assert_close(
                &format!("bn apply {d} {s:?}"),
                &y.get(),
                &want,
                (rt * 2.0, a * 4.0),
            );

            let mut gy = Buf::from_f64(d, &gv, 0);
            let mut meanb = meanb;
            let mut invb = invb;
            let mut sg = Buf::zeros(DType::F32, s.c, 0);
            let mut sgx = Buf::zeros(DType::F32, s.c, 0);
            let steps = k(conv::plan_batchnorm_backward_reduce(
                &T1,
                x.slice(),
                gy.slice(),
                meanb.slice(),
                invb.slice(),
                sg.slice(),
                sgx.slice(),
                &s,
            )
            .unwrap());
            exec_both(
                e,
                &steps,
                &mut [&mut x, &mut gy, &mut meanb, &mut invb, &mut sg, &mut sgx],
            );
            let mut wsg = vec![0.0; s.c];
            let mut wsgx = vec![0.0; s.c];
            for i in 0..total {
                wsg[ch(i)] += gv[i];
                wsgx[ch(i)] += gv[i] * (xv[i] - mu32[ch(i)]) * inv32[ch(i)];
            }
            let ra = 1e-5 * m.sqrt() * 10.0;
            assert_close(&format!("bn sum_gy {d} {s:?}"), &sg.get(), &wsg, (1e-5, ra));
            assert_close(
                &format!("bn sum_gy_xhat {d} {s:?}"),
                &sgx.get(),
                &wsgx,
                (1e-5, ra),
            );

            let dx = Buf::zeros(d, total, 0);
            let l = conv::plan_batchnorm_backward_dx(
                &T1,
                x.slice(),
                gy.slice(),
                meanb.slice(),
                invb.slice(),
                Some(gamma.slice()),
                sg.slice(),
                sgx.slice(),
                dx.slice(),
                &s,
            )
            .unwrap()
            .unwrap();
            exec1(e, l, &[&x, &gy, &meanb, &invb, &gamma, &sg, &sgx, &dx]);
            let (sgv, sgxv) = (sg.get(), sgx.get());
            let want: Vec<f64> = (0..total)
                .map(|i| {
                    let c = ch(i);
                    let xh = (xv[i] - mu32[c]) * inv32[c];
                    gam[c] * inv32[c] * (gv[i] - sgv[c] / m - xh * sgxv[c] / m)
                })
                .collect();
            assert_close(
                &format!("bn dx {d} {s:?}"),
                &dx.get(),
                &want,
                (rt * 4.0, a * 8.0),
            );
        }
    }
}

#[test]
fn dropout_and_random_fills_match_the_cpu_philox() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(24);
    for d in FLOATS {
        // Aligned (vector quads) and shifted (scalar) views; n not a multiple of 4.
        for (n, shift) in [(32 * 256 * 4 + 4 * 37 + 3, 0usize), (1001, 1)] {
            let (seed, offset, p) = (0x1234_5678_9abc_def0u64, 77u64, 0.3f32);
            let xv = inputs(&mut rng, d, n, -1.0, 1.0);
            let x = Buf::from_f64(d, &xv, shift);
            let y = Buf::zeros(d, n, shift);
            let l = dropout::plan_dropout(&T1, x.slice(), y.slice(), p, seed, offset)
                .unwrap()
                .unwrap();
            exec1(e, l, &[&x, &y]);
            let scale = 1.0 / (1.0 - p);
            let want: Vec<f64> = (0..n)
                .map(|i| {
                    if dropout::dropout_keep(seed, offset, i as u64, p) {
                        q(d, (xv[i] as f32 * scale) as f64)
                    } else {
                        0.0
                    }
                })
                .collect();
            assert_close(&format!("dropout {d} n {n}"), &y.get(), &want, (0.0, 0.0));

            let y = Buf::zeros(d, n, shift);
            let l = dropout::plan_random(&T1, false, y.slice(), -2.0, 3.0, seed, offset)
                .unwrap()
                .unwrap();
            exec1(e, l, &[&y]);
            let want: Vec<f64> = (0..n)
                .map(|i| {
                    q(
                        d,
                        (-2.0 + 5.0 * dropout::u01(dropout::philox_word(seed, offset, i as u64)))
                            as f64,
                    )
                })
                .collect();
            let (rt, a) = tol(d);
            assert_close(&format!("rand_uniform {d}"), &y.get(), &want, (rt, a));

            let y = Buf::zeros(d, n, shift);
            let l = dropout::plan_random(&T1, true, y.slice(), 1.0, 2.0, seed, offset)
                .unwrap()
                .unwrap();
            exec1(e, l, &[&y]);
            // Box-Muller on word pairs (0,1) and (2,3) of each Philox block.
            let want: Vec<f64> = (0..n)
                .map(|i| {
                    let base = (i / 4 * 4) as u64;
                    let pair = if i % 4 < 2 { 0 } else { 2 };
                    let w0 = dropout::philox_word(seed, offset, base + pair);
                    let w1 = dropout::philox_word(seed, offset, base + pair + 1);
                    let u = ((w0 >> 8) as f64 + 1.0) / 16_777_216.0;
                    let v = (w1 >> 8) as f64 / 16_777_216.0;
                    let rad = (-2.0 * u.ln()).sqrt();
                    let ang = 2.0 * std::f64::consts::PI * v;
                    1.0 + 2.0
                        * if i % 2 == 0 {
                            rad * ang.cos()
                        } else {
                            rad * ang.sin()
                        }
                })
                .collect();
            assert_close(
                &format!("rand_normal {d}"),
                &y.get(),
                &want,
                (rt * 2.0, a.max(1e-5) * 8.0),
            );
        }
    }
}
