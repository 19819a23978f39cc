//! Every int8 path against a plain reference: the i32 accumulators bit for bit (odd shapes,
//! the extreme values that saturate a naive `vpmaddubsw`, threaded sizes), the fused epilogue
//! (every path's f32 and u8 output identical to the scalar path's and to an f64 reference), and
//! the whole quantized product within the error bound its scales imply.

use sinter_cpu::int8::{
    gemm, gemm_i32, quantize_rows_dynamic, quantize_weights, ActQuant, Activation, Activations,
    Epilogue, Int8Path, Output, PackedWeights, QParams,
};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// u8 activations with the extremes (0, 255, 128) often, padded rows of `lda` bytes whose
/// padding holds garbage (it must not matter).
fn activations(rng: &mut Rng, m: usize, k: usize, lda: usize) -> Vec<u8> {
    (0..m * lda)
        .map(|i| {
            if i % lda >= k {
                rng.below(256) as u8
            } else {
                match rng.below(6) {
                    0 => 255,
                    1 => 0,
                    2 => 128,
                    _ => rng.below(256) as u8,
                }
            }
        })
        .collect()
}

fn weights(rng: &mut Rng, n: usize, k: usize) -> Vec<i8> {
    (0..n * k)
        .map(|_| match rng.below(6) {
            0 => 127,
            1 => -127,
            _ => (rng.below(255) as i32 - 127) as i8,
        })
        .collect()
}

fn reference(a: &[u8], m: usize, lda: usize, w: &[i8], n: usize, k: usize) -> Vec<i32> {
    let mut c = vec![0i32; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k)
                .map(|t| a[i * lda + t] as i32 * w[j * k + t] as i32)
                .sum();
        }
    }
    c
}

const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (1, 17, 3),
    (1, 64, 64),
    (1, 130, 67),
    (2, 15, 5),
    (3, 16, 4),
    (5, 63, 129),
    (6, 65, 300),
    (7, 33, 1),
    (13, 100, 63),
    (19, 48, 257),
];

#[test]
fn every_path_gives_the_reference_accumulators_bit_for_bit() {
    let mut rng = Rng(0x5eed_1234_5678_9abc);
    let paths = Int8Path::available();
    eprintln!("int8 paths on this CPU: {paths:?}");
    for &(m, n, k) in SHAPES {
        let lda = k.div_ceil(4) * 4 + 4 * (m % 2); // sometimes wider than k_padded
        let a = activations(&mut rng, m, k, lda);
        let w = weights(&mut rng, n, k);
        let packed = PackedWeights::pack(&w, n, k).unwrap();
        let want = reference(&a, m, lda, &w, n, k);
        for &p in &paths {
            let ldo = n + 3;
            let mut got = vec![i32::MIN; m * ldo];
            gemm_i32(p, &a, m, lda, &packed, &mut got, ldo);
            for i in 0..m {
                assert_eq!(
                    &got[i * ldo..i * ldo + n],
                    &want[i * n..(i + 1) * n],
                    "{p} [{m}×{n}×{k}] row {i}"
                );
                assert!(
                    got[i * ldo + n..(i + 1) * ldo]
                        .iter()
                        .all(|&v| v == i32::MIN),
                    "{p}: wrote past n"
                );
            }
        }
    }
}

#[test]
fn extremes_that_saturate_a_plain_maddubs_are_exact() {
    // a = 255 against w = ±127 makes pairs of 64,770 in vpmaddubsw; a = 0 against -127, and
    // alternating signs, stress the sign trick's zero and negation.
    let (m, n, k) = (4, 32, 256);
    let cases: [(u8, i8); 4] = [(255, 127), (255, -127), (0, -127), (128, 127)];
    for (av, wv) in cases {
        let a = vec![av; m * k];
        let w: Vec<i8> = (0..n * k)
            .map(|i| if i % 3 == 2 { -wv } else { wv })
            .collect();
        let packed = PackedWeights::pack(&w, n, k).unwrap();
        let want = reference(&a, m, k, &w, n, k);
        for p in Int8Path::available() {
            let mut got = vec![0; m * n];
            gemm_i32(p, &a, m, k, &packed, &mut got, n);
            assert_eq!(got, want, "{p}: a = {av}, w = {wv}");
        }
    }
}

#[test]
fn threaded_sizes_match_too() {
    // Large enough (≥ 2²⁰ multiply-adds) to be split into blocks across the thread pool.
    let mut rng = Rng(77);
    for (m, n, k) in [(200, 150, 70), (1, 3000, 768), (97, 64, 288)] {
        let a = activations(&mut rng, m, k, k.div_ceil(4) * 4);
        let w = weights(&mut rng, n, k);
        let packed = PackedWeights::pack(&w, n, k).unwrap();
        let want = reference(&a, m, k.div_ceil(4) * 4, &w, n, k);
        for p in Int8Path::available() {
            let mut got = vec![0; m * n];
            gemm_i32(p, &a, m, k.div_ceil(4) * 4, &packed, &mut got, n);
            assert!(got == want, "{p} [{m}×{n}×{k}]");
        }
    }
}

/// f64 reference of the epilogue from exact accumulators.
fn epilogue_ref(acc: i32, zp: i32, sum: i32, sa: f32, sw: f32, bias: f32, act: Activation) -> f64 {
    let y = (acc - zp * sum) as f64 * sa as f64 * sw as f64 + bias as f64;
    match act {
        Activation::None => y,
        Activation::Relu => y.max(0.0),
        Activation::GeluTanh => {
            0.5 * y
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (y + 0.044715 * y * y * y)).tanh())
        }
        Activation::GeluErf => 0.5 * y * (1.0 + erf(y / std::f64::consts::SQRT_2)),
    }
}

/// erf by its Taylor series (converges fast for the |x| < 4 these tests reach; 1 beyond).
fn erf(x: f64) -> f64 {
    if x.abs() > 5.0 {
        return x.signum();
    }
    let (mut term, mut sum) = (x, 0.0);
    for n in 0..400 {
        sum += term / (2 * n + 1) as f64;
        term *= -x * x / (n + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn fused_epilogue_is_the_same_on_every_path_and_matches_f64() {
    let mut rng = Rng(99);
    let (m, n, k) = (9usize, 70usize, 45usize);
    let kp = k.div_ceil(4) * 4;
    let a = activations(&mut rng, m, k, kp);
    let w = weights(&mut rng, n, k);
    let packed = PackedWeights::pack(&w, n, k).unwrap();
    let acc = reference(&a, m, kp, &w, n, k);
    let rows: Vec<QParams> = (0..m)
        .map(|i| QParams {
            scale: 0.01 + 0.001 * i as f32,
            zero_point: (i * 29 % 256) as i32,
        })
        .collect();
    let scales: Vec<f32> = (0..n).map(|j| 0.002 + 0.0001 * j as f32).collect();
    let bias: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
    let sums: Vec<i32> = (0..n)
        .map(|j| w[j * k..(j + 1) * k].iter().map(|&v| v as i32).sum())
        .collect();
    let out_q = QParams {
        scale: 0.05,
        zero_point: 100,
    };
    for act in [
        Activation::None,
        Activation::Relu,
        Activation::GeluTanh,
        Activation::GeluErf,
    ] {
        let epi = Epilogue {
            weight_scales: &scales,
            bias: Some(&bias),
            activation: act,
        };
        let acts = Activations {
            data: &a,
            rows: m,
            stride: kp,
            quant: ActQuant::PerRow(&rows),
        };
        let mut first: Option<(Vec<f32>, Vec<u8>)> = None;
        for p in Int8Path::available() {
            let mut y = vec![f32::NAN; m * n];
            gemm(
                p,
                &acts,
                &packed,
                &epi,
                Output::F32 {
                    data: &mut y,
                    stride: n,
                },
            );
            let mut yt = vec![f32::NAN; n * (m + 2)];
            gemm(
                p,
                &acts,
                &packed,
                &epi,
                Output::F32ChannelMajor {
                    data: &mut yt,
                    stride: m + 2,
                },
            );
            for i in 0..m {
                for j in 0..n {
                    assert_eq!(
                        yt[j * (m + 2) + i].to_bits(),
                        y[i * n + j].to_bits(),
                        "{p}: channel-major ({i}, {j})"
                    );
                }
            }
            // NCHW planes of 3 images of 3 positions each (m = 9).
            let mut yp = vec![f32::NAN; m * n];
            gemm(
                p,
                &acts,
                &packed,
                &epi,
                Output::F32Planes {
                    data: &mut yp,
                    plane: 3,
                },
            );
            for i in 0..m {
                for j in 0..n {
                    assert_eq!(
                        yp[((i / 3) * n + j) * 3 + i % 3].to_bits(),
                        y[i * n + j].to_bits(),
                        "{p}: planes ({i}, {j})"
                    );
                }
            }
            let mut q = vec![0u8; m * n];
            gemm(
                p,
                &acts,
                &packed,
                &epi,
                Output::U8 {
                    data: &mut q,
                    stride: n,
                    quant: out_q,
                },
            );
            for i in 0..m {
                for j in 0..n {
                    let want = epilogue_ref(
                        acc[i * n + j],
                        rows[i].zero_point,
                        sums[j],
                        rows[i].scale,
                        scales[j],
                        bias[j],
                        act,
                    );
                    let got = y[i * n + j] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "{p} {act:?} ({i}, {j}): {got} vs {want}"
                    );
                    let qw = (got / out_q.scale as f64 + out_q.zero_point as f64)
                        .round()
                        .clamp(0.0, 255.0);
                    assert!(
                        (q[i * n + j] as f64 - qw).abs() <= 1.0,
                        "{p} {act:?} requantized ({i}, {j})"
                    );
                }
            }
            match &first {
                None => first = Some((y, q)),
                Some((y0, q0)) => {
                    assert!(
                        y.iter().zip(y0).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{p} {act:?}: f32 output differs from the scalar path's"
                    );
                    assert_eq!(
                        &q, q0,
                        "{p} {act:?}: u8 output differs from the scalar path's"
                    );
                }
            }
        }
    }
}

#[test]
fn quantized_product_is_within_the_bound_its_scales_imply() {
    // |x·w − x̂·ŵ| ≤ Σ_k (|x_k|·δw + |w_k|·δx + δx·δw) with δ = half a quantization step.
    let mut rng = Rng(4242);
    let (m, n, k) = (5, 40, 96);
    let x: Vec<f32> = (0..m * k).map(|_| rng.f32() * 3.0).collect();
    let wf: Vec<f32> = (0..n * k).map(|_| rng.f32() * 0.2).collect();
    let (wq, ws) = quantize_weights(&wf, n, k).unwrap();
    let packed = PackedWeights::pack(&wq, n, k).unwrap();
    let kp = packed.k_padded();
    let mut xq = vec![0u8; m * kp];
    let rows = quantize_rows_dynamic(&x, m, k, k, &mut xq, kp).unwrap();
    let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.01).collect();
    for p in Int8Path::available() {
        let mut y = vec![0f32; m * n];
        gemm(
            p,
            &Activations {
                data: &xq,
                rows: m,
                stride: kp,
                quant: ActQuant::PerRow(&rows),
            },
            &packed,
            &Epilogue {
                weight_scales: &ws,
                bias: Some(&bias),
                activation: Activation::None,
            },
            Output::F32 {
                data: &mut y,
                stride: n,
            },
        );
        for i in 0..m {
            for j in 0..n {
                let (xr, wr) = (&x[i * k..(i + 1) * k], &wf[j * k..(j + 1) * k]);
                let exact: f64 = xr
                    .iter()
                    .zip(wr)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
                    + bias[j] as f64;
                let (dx, dw) = (rows[i].scale as f64 / 2.0, ws[j] as f64 / 2.0);
                let bound: f64 = xr
                    .iter()
                    .zip(wr)
                    .map(|(&a, &b)| a.abs() as f64 * dw + b.abs() as f64 * dx + dx * dw)
                    .sum::<f64>()
                    + 1e-5;
                let err = (y[i * n + j] as f64 - exact).abs();
                assert!(
                    err <= bound,
                    "{p} ({i}, {j}): error {err} above bound {bound}"
                );
            }
        }
    }
}
