//! Winograd F(2×2, 3×3) convolution against a direct f64 convolution written here: forward
//! (with bias and ReLU), input gradient and weight gradient, for odd and even sizes, every
//! padding 0..=2 and every ISA path this CPU has; determinism across thread counts; bad
//! shapes give errors.
//!
//! **Tolerance.** Winograd computes each output as a signed sum (coefficients of magnitude
//! ≤ 1 after G's halves, applied in f64 to the weight) of the products of its tile's whole
//! input window with the 3×3 weight — 16 × 9 products per channel rather than the 9 of the
//! direct sum — accumulated over `depth` terms by the GEMM (channels, or tiles for the weight
//! gradient) and a few transform additions. So the error is bounded by
//! (depth + 16)·ε·S, where S is the sum over channels of |window| · |weight| (Σ of the
//! magnitudes of all those products). A wrong result misses by the size of the values
//! themselves, orders of magnitude above this.

use sinter_cpu::winograd::{backward_data, backward_filter, forward, Conv3x3};
use sinter_cpu::Isa;

/// (n, c, o, h, w, ph, pw).
const SHAPES: [(usize, usize, usize, usize, usize, usize, usize); 10] = [
    (1, 1, 1, 1, 1, 1, 1),
    (2, 3, 5, 2, 3, 1, 1),
    (1, 3, 5, 5, 7, 0, 0),
    (3, 17, 16, 5, 7, 2, 2),
    (1, 17, 1, 2, 3, 2, 2),
    (2, 17, 5, 16, 16, 1, 1),
    (1, 3, 16, 16, 16, 0, 2),
    (3, 1, 1, 5, 7, 2, 0),
    (3, 17, 16, 16, 16, 1, 1),
    (2, 5, 3, 1, 1, 2, 1),
];

fn geom(s: (usize, usize, usize, usize, usize, usize, usize)) -> Conv3x3 {
    let (n, c, o, h, w, ph, pw) = s;
    Conv3x3 {
        n,
        c,
        o,
        h,
        w,
        padding: (ph, pw),
    }
}

/// Values in [−1, 1) from a fixed LCG.
fn data(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// plane[y][x] (h × w) as f64, 0 outside.
fn at(plane: &[f32], h: usize, w: usize, y: isize, x: isize) -> f64 {
    if y < 0 || x < 0 || y >= h as isize || x >= w as isize {
        0.0
    } else {
        plane[y as usize * w + x as usize] as f64
    }
}

/// Σ |plane| over the size × size window at (y0, x0), 0 outside.
fn window_abs(plane: &[f32], h: usize, w: usize, y0: isize, x0: isize, size: isize) -> f64 {
    let mut s = 0.0;
    for y in y0..y0 + size {
        for x in x0..x0 + size {
            s += at(plane, h, w, y, x).abs();
        }
    }
    s
}

/// A forward-type convolution in f64: `cin` planes of h×w padded by (ph, pw) with the 3×3
/// filter `filt(out, in)` give `cout` planes. Returns (values, tolerance per value).
#[allow(clippy::too_many_arguments)]
fn direct(
    x: &[f32],
    (n, cin, cout): (usize, usize, usize),
    (h, w): (usize, usize),
    (ph, pw): (usize, usize),
    filt: &dyn Fn(usize, usize) -> [f64; 9],
) -> (Vec<f64>, Vec<f64>) {
    let (oh, ow) = (h + 2 * ph - 2, w + 2 * pw - 2);
    let mut out = vec![0.0; n * cout * oh * ow];
    let mut tol = vec![0.0; out.len()];
    for img in 0..n {
        for oc in 0..cout {
            for y in 0..oh {
                for xo in 0..ow {
                    let (mut sum, mut mag) = (0.0, 0.0);
                    for ic in 0..cin {
                        let plane = &x[(img * cin + ic) * h * w..][..h * w];
                        let f = filt(oc, ic);
                        for ky in 0..3 {
                            for kx in 0..3 {
                                let (iy, ix) = (
                                    (y + ky) as isize - ph as isize,
                                    (xo + kx) as isize - pw as isize,
                                );
                                sum += at(plane, h, w, iy, ix) * f[ky * 3 + kx];
                            }
                        }
                        let (ty, tx) = (
                            (y / 2 * 2) as isize - ph as isize,
                            (xo / 2 * 2) as isize - pw as isize,
                        );
                        mag += window_abs(plane, h, w, ty, tx, 4)
                            * f.iter().map(|v| v.abs()).sum::<f64>();
                    }
                    let i = ((img * cout + oc) * oh + y) * ow + xo;
                    out[i] = sum;
                    tol[i] = (cin + 16) as f64 * f32::EPSILON as f64 * mag;
                }
            }
        }
    }
    (out, tol)
}

fn filter_of(w: &[f32], c: usize) -> impl Fn(usize, usize) -> [f64; 9] + '_ {
    move |o, ic| std::array::from_fn(|k| w[(o * c + ic) * 9 + k] as f64)
}

/// The largest |got − want| / tol (≤ 1 passes), asserting it.
fn check(what: &str, got: &[f32], want: &[f64], tol: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst: f64 = 0.0;
    for (i, ((&g, &r), &t)) in got.iter().zip(want).zip(tol).enumerate() {
        let err = (g as f64 - r).abs();
        assert!(
            err <= t.max(f64::MIN_POSITIVE),
            "{what}: value {i}: got {g}, want {r}, error {err:e} > tolerance {t:e}"
        );
        worst = worst.max(err / t.max(f64::MIN_POSITIVE));
    }
    eprintln!("{what}: worst error / tolerance {worst:.4}");
}

#[test]
fn forward_with_bias_and_relu_matches_direct_f64() {
    for (si, &s) in SHAPES.iter().enumerate() {
        let g = geom(s);
        let x = data(g.input_len(), 3 * si as u64);
        let w = data(g.weight_len(), 3 * si as u64 + 1);
        let bias = data(g.o, 3 * si as u64 + 2);
        let (want, tol) = direct(
            &x,
            (g.n, g.c, g.o),
            (g.h, g.w),
            g.padding,
            &filter_of(&w, g.c),
        );
        let l = g.oh() * g.ow();
        for isa in Isa::available() {
            let mut y = vec![f32::NAN; g.output_len()];
            forward(isa, &g, &x, &w, None, false, &mut y).unwrap();
            check(&format!("forward {s:?} {isa:?}"), &y, &want, &tol);
            // bias + ReLU: 1-Lipschitz, plus one rounding of the bias add.
            forward(isa, &g, &x, &w, Some(&bias), true, &mut y).unwrap();
            let fused: Vec<f64> = want
                .iter()
                .enumerate()
                .map(|(i, &v)| (v + bias[i / l % g.o] as f64).max(0.0))
                .collect();
            let tol2: Vec<f64> = tol
                .iter()
                .zip(&fused)
                .map(|(&t, &v)| t + 2.0 * f32::EPSILON as f64 * (v.abs() + 1.0))
                .collect();
            check(
                &format!("forward+bias+relu {s:?} {isa:?}"),
                &y,
                &fused,
                &tol2,
            );
            assert!(y.iter().all(|&v| v >= 0.0), "ReLU output is non-negative");
        }
    }
}

#[test]
fn input_gradient_matches_direct_f64() {
    for (si, &s) in SHAPES.iter().enumerate() {
        let g = geom(s);
        let (ph, pw) = g.padding;
        let w = data(g.weight_len(), 7 * si as u64);
        let dy = data(g.output_len(), 7 * si as u64 + 1);
        // dx = the convolution of dy with the rotated, transposed weight, padded by 2 − p
        // (a textbook identity; the reference sums dy·w directly for the values below and
        // uses this form only for the tolerance's magnitudes).
        let rotated = |ic: usize, oc: usize| -> [f64; 9] {
            std::array::from_fn(|k| w[(oc * g.c + ic) * 9 + 8 - k] as f64)
        };
        let (_, tol) = direct(
            &dy,
            (g.n, g.o, g.c),
            (g.oh(), g.ow()),
            (2 - ph, 2 - pw),
            &rotated,
        );
        let (oh, ow) = (g.oh(), g.ow());
        let mut want = vec![0.0; g.input_len()];
        for img in 0..g.n {
            for oc in 0..g.o {
                let plane = &dy[(img * g.o + oc) * oh * ow..][..oh * ow];
                for ic in 0..g.c {
                    for iy in 0..g.h {
                        for ix in 0..g.w {
                            let mut s = 0.0;
                            for ky in 0..3 {
                                for kx in 0..3 {
                                    let (y, x) = (
                                        (iy + ph) as isize - ky as isize,
                                        (ix + pw) as isize - kx as isize,
                                    );
                                    s += at(plane, oh, ow, y, x)
                                        * w[(oc * g.c + ic) * 9 + ky * 3 + kx] as f64;
                                }
                            }
                            want[((img * g.c + ic) * g.h + iy) * g.w + ix] += s;
                        }
                    }
                }
            }
        }
        for isa in Isa::available() {
            let mut dx = vec![f32::NAN; g.input_len()];
            backward_data(isa, &g, &w, &dy, &mut dx).unwrap();
            check(&format!("dx {s:?} {isa:?}"), &dx, &want, &tol);
        }
    }
}

#[test]
fn weight_gradient_matches_direct_f64() {
    for (si, &s) in SHAPES.iter().enumerate() {
        let g = geom(s);
        let (ph, pw) = g.padding;
        let (oh, ow) = (g.oh(), g.ow());
        let x = data(g.input_len(), 11 * si as u64);
        let dy = data(g.output_len(), 11 * si as u64 + 1);
        let tiles = g.n * oh.div_ceil(2) * ow.div_ceil(2);
        let mut want = vec![0.0; g.weight_len()];
        let mut tol = vec![0.0; g.weight_len()];
        for oc in 0..g.o {
            for ic in 0..g.c {
                let mut mag = 0.0;
                for img in 0..g.n {
                    let xp = &x[(img * g.c + ic) * g.h * g.w..][..g.h * g.w];
                    let dp = &dy[(img * g.o + oc) * oh * ow..][..oh * ow];
                    for k in 0..9 {
                        let (ky, kx) = (k / 3, k % 3);
                        let mut s = 0.0;
                        for y in 0..oh {
                            for xo in 0..ow {
                                let (iy, ix) = (
                                    (y + ky) as isize - ph as isize,
                                    (xo + kx) as isize - pw as isize,
                                );
                                s += dp[y * ow + xo] as f64 * at(xp, g.h, g.w, iy, ix);
                            }
                        }
                        want[(oc * g.c + ic) * 9 + k] += s;
                    }
                    for ty in (0..oh).step_by(2) {
                        for tx in (0..ow).step_by(2) {
                            let d = window_abs(dp, oh, ow, ty as isize, tx as isize, 2);
                            mag += d * window_abs(
                                xp,
                                g.h,
                                g.w,
                                ty as isize - ph as isize,
                                tx as isize - pw as isize,
                                4,
                            );
                        }
                    }
                }
                for k in 0..9 {
                    tol[(oc * g.c + ic) * 9 + k] = (tiles + 16) as f64 * f32::EPSILON as f64 * mag;
                }
            }
        }
        for isa in Isa::available() {
            let mut dw = vec![f32::NAN; g.weight_len()];
            backward_filter(isa, &g, &x, &dy, &mut dw).unwrap();
            check(&format!("dw {s:?} {isa:?}"), &dw, &want, &tol);
        }
    }
}

/// One and two rayon threads give the same bits for all three passes (the blocks and the
/// weight-gradient summation order depend on the shape only).
#[test]
fn results_do_not_depend_on_the_thread_count() {
    let g = geom((5, 9, 7, 15, 13, 1, 1));
    let x = data(g.input_len(), 1);
    let w = data(g.weight_len(), 2);
    let dy = data(g.output_len(), 3);
    let run = |threads: usize, isa: Isa| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut y = vec![0f32; g.output_len()];
            let mut dx = vec![0f32; g.input_len()];
            let mut dw = vec![0f32; g.weight_len()];
            forward(isa, &g, &x, &w, None, false, &mut y).unwrap();
            backward_data(isa, &g, &w, &dy, &mut dx).unwrap();
            backward_filter(isa, &g, &x, &dy, &mut dw).unwrap();
            [y, dx, dw].map(|v| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>())
        })
    };
    for isa in Isa::available() {
        assert_eq!(run(1, isa), run(2, isa), "{isa:?}");
        assert_eq!(run(1, isa), run(3, isa), "{isa:?}");
    }
}

#[test]
fn bad_shapes_are_errors() {
    let isa = Isa::get();
    let g = geom((1, 2, 3, 4, 4, 1, 1));
    let (x, w, mut y) = (
        vec![0f32; g.input_len()],
        vec![0f32; g.weight_len()],
        vec![0f32; g.output_len()],
    );
    assert!(forward(isa, &g, &x, &w, None, false, &mut y).is_ok());
    let wide = Conv3x3 {
        padding: (3, 1),
        ..g
    };
    assert!(forward(isa, &wide, &x, &w, None, false, &mut y).is_err());
    let tiny = Conv3x3 {
        h: 2,
        padding: (0, 1),
        ..g
    };
    assert!(forward(isa, &tiny, &x[..16], &w, None, false, &mut []).is_err());
    assert!(forward(isa, &g, &x[1..], &w, None, false, &mut y).is_err());
    assert!(forward(isa, &g, &x, &w, Some(&[0.0; 2]), false, &mut y).is_err());
    let mut dx = vec![0f32; g.input_len()];
    let mut dw = vec![0f32; g.weight_len()];
    assert!(backward_data(isa, &g, &w, &y[1..], &mut dx).is_err());
    assert!(backward_filter(isa, &g, &x, &y, &mut dw[1..]).is_err());
    // Empty batch: the weight gradient is zero.
    let empty = Conv3x3 { n: 0, ..g };
    dw.fill(1.0);
    backward_filter(isa, &empty, &[], &[], &mut dw).unwrap();
    assert!(dw.iter().all(|&v| v == 0.0));
}
