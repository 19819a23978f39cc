//! int8_gemm.cu run through the CPU emulator against the CPU int8 GEMM (`sinter_cpu::int8`, its
//! scalar path): the channel sums and the raw i32 accumulators bit for bit, and the f32
//! epilogue (per-row and per-tensor activation mappings, with and without bias, each
//! activation) to f32 rounding — on odd shapes (k not a multiple of 4 or of the 32-byte stage,
//! m and n not multiples of the 64 tile, one row) and the extreme values that would saturate a
//! naive product. Every launch also runs in reverse thread order with identical results.

#[path = "emu/harness.rs"]
mod harness;

use harness::*;
use sinter_cpu::int8::{
    gemm, gemm_i32, ActQuant, Activation, Activations, Epilogue, Int8Path, Output, PackedWeights,
    QParams,
};
use sinter_cuda::launch::{Launch, Step};
use sinter_cuda::ops::int8::{self, Int8Activation, Int8Epilogue, Int8Operands, Int8Shape};
use sinter_cuda::DType;

fn k(l: Option<Launch>) -> Vec<Step> {
    l.into_iter().map(Step::Kernel).collect()
}

/// A buffer of `d` holding these bytes.
fn raw_buf(d: DType, bytes: &[u8]) -> Buf {
    let mut b = Buf::zeros(d, bytes.len() / d.size(), 0);
    b.bytes_mut().copy_from_slice(bytes);
    b
}

fn bytes_buf(v: &[u8]) -> Buf {
    raw_buf(DType::U8, v)
}

fn i32_buf(v: &[i32]) -> Buf {
    raw_buf(
        DType::I32,
        &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
    )
}

fn f32_buf(v: &[f32]) -> Buf {
    raw_buf(
        DType::F32,
        &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
    )
}

fn i32s(b: &Buf) -> Vec<i32> {
    b.bytes()
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn f32s(b: &Buf) -> Vec<f32> {
    b.bytes()
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// A problem: u8 activations rows of `lda` bytes (padding bytes arbitrary), i8 weights rows of
/// `ldw` bytes (padding zero), with the extremes 0/255 and ±127 frequent.
struct Case {
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    ldw: usize,
    a: Vec<u8>,
    w: Vec<i8>,
}

fn case(m: usize, n: usize, k: usize, extra: usize, rng: &mut Rng) -> Case {
    let kp = k.div_ceil(4) * 4;
    let (lda, ldw) = (kp + extra, kp);
    let a = (0..m * lda)
        .map(|_| match rng.below(5) {
            0 => 255,
            1 => 0,
            _ => rng.below(256) as u8,
        })
        .collect();
    let mut w = vec![0i8; n * ldw];
    for j in 0..n {
        for t in 0..k {
            w[j * ldw + t] = match rng.below(5) {
                0 => 127,
                1 => -127,
                _ => (rng.below(255) as i32 - 127) as i8,
            };
        }
    }
    Case {
        m,
        n,
        k,
        lda,
        ldw,
        a,
        w,
    }
}

impl Case {
    fn shape(&self) -> Int8Shape {
        Int8Shape {
            m: self.m,
            n: self.n,
            k: self.k,
            lda: self.lda,
            ldw: self.ldw,
        }
    }
    fn packed(&self) -> PackedWeights {
        let dense: Vec<i8> = (0..self.n)
            .flat_map(|j| self.w[j * self.ldw..j * self.ldw + self.k].to_vec())
            .collect();
        PackedWeights::pack(&dense, self.n, self.k).unwrap()
    }
    fn w_bytes(&self) -> Vec<u8> {
        self.w.iter().map(|&v| v as u8).collect()
    }
}

const SHAPES: &[(usize, usize, usize, usize)] = &[
    (1, 1, 1, 0),
    (3, 17, 5, 4),
    (70, 33, 45, 0),
    (65, 130, 67, 8),
];

#[test]
fn sums_and_accumulators_equal_the_cpu_bit_for_bit() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(8);
    for &(m, n, kk, extra) in SHAPES {
        let c = case(m, n, kk, extra, &mut rng);
        let packed = c.packed();
        let (mut a, mut w) = (bytes_buf(&c.a), bytes_buf(&c.w_bytes()));
        let mut sums = Buf::zeros(DType::I32, n, 0);
        let steps =
            k(int8::plan_int8_weight_sums(&T2, w.slice(), sums.slice(), n, kk, c.ldw).unwrap());
        exec_both(e, &steps, &mut [&mut w, &mut sums]);
        assert_eq!(i32s(&sums), &packed.sums()[..n], "sums [{m}×{n}×{kk}]");

        let ldo = n + 1;
        let mut out = Buf::zeros(DType::I32, (m - 1) * ldo + n, 0);
        let steps = k(int8::plan_int8_gemm_i32(
            &c.shape(),
            &Int8Operands {
                a: a.slice(),
                w: w.slice(),
                sums: sums.slice(),
            },
            out.slice(),
            ldo,
        )
        .unwrap());
        exec_both(e, &steps, &mut [&mut a, &mut w, &mut sums, &mut out]);
        let mut want = vec![0i32; (m - 1) * ldo + n];
        gemm_i32(Int8Path::Scalar, &c.a, m, c.lda, &packed, &mut want, ldo);
        let got = i32s(&out);
        for i in 0..m {
            assert_eq!(
                &got[i * ldo..i * ldo + n],
                &want[i * ldo..i * ldo + n],
                "accumulators [{m}×{n}×{kk}] row {i}"
            );
        }
    }
}

#[test]
fn the_epilogue_matches_the_cpu() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(9);
    let acts = [
        (Int8Activation::None, Activation::None),
        (Int8Activation::Relu, Activation::Relu),
        (Int8Activation::GeluTanh, Activation::GeluTanh),
        (Int8Activation::GeluErf, Activation::GeluErf),
    ];
    for (idx, &(m, n, kk, extra)) in SHAPES.iter().enumerate() {
        let c = case(m, n, kk, extra, &mut rng);
        let packed = c.packed();
        let per_row = idx % 2 == 0;
        let rows = if per_row { m } else { 1 };
        let qp: Vec<QParams> = (0..rows)
            .map(|_| QParams {
                scale: rng.uniform(0.001, 0.05) as f32,
                zero_point: rng.below(256) as i32,
            })
            .collect();
        let ws: Vec<f32> = (0..n).map(|_| rng.uniform(0.0005, 0.01) as f32).collect();
        let bias: Vec<f32> = (0..n).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
        let (mut a, mut w) = (bytes_buf(&c.a), bytes_buf(&c.w_bytes()));
        let mut sums = i32_buf(&packed.sums()[..n]);
        let mut rs = f32_buf(&qp.iter().map(|q| q.scale).collect::<Vec<_>>());
        let mut rz = i32_buf(&qp.iter().map(|q| q.zero_point).collect::<Vec<_>>());
        let mut wsb = f32_buf(&ws);
        let mut bb = f32_buf(&bias);
        for (k_idx, &(gact, cact)) in acts.iter().enumerate() {
            let with_bias = k_idx % 2 == 1;
            let mut out = Buf::zeros(DType::F32, m * n, 0);
            let ep = Int8Epilogue {
                row_scale: rs.slice(),
                row_zero: rz.slice(),
                per_row,
                w_scale: wsb.slice(),
                bias: with_bias.then(|| bb.slice()),
                act: gact,
            };
            let steps = k(int8::plan_int8_gemm_f32(
                &c.shape(),
                &Int8Operands {
                    a: a.slice(),
                    w: w.slice(),
                    sums: sums.slice(),
                },
                &ep,
                out.slice(),
                n,
            )
            .unwrap());
            exec_both(
                e,
                &steps,
                &mut [
                    &mut a, &mut w, &mut sums, &mut rs, &mut rz, &mut wsb, &mut bb, &mut out,
                ],
            );
            let mut want = vec![0f32; m * n];
            let quant = if per_row {
                ActQuant::PerRow(&qp)
            } else {
                ActQuant::PerTensor(qp[0])
            };
            gemm(
                Int8Path::Scalar,
                &Activations {
                    data: &c.a,
                    rows: m,
                    stride: c.lda,
                    quant,
                },
                &packed,
                &Epilogue {
                    weight_scales: &ws,
                    bias: with_bias.then_some(&bias[..]),
                    activation: cact,
                },
                Output::F32 {
                    data: &mut want,
                    stride: n,
                },
            );
            let got: Vec<f64> = f32s(&out).iter().map(|&v| v as f64).collect();
            let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
            assert_close(
                &format!(
                    "int8_gemm_f32 {gact:?} [{m}×{n}×{kk}] per_row {per_row} bias {with_bias}"
                ),
                &got,
                &want,
                (2e-6, 2e-6),
            );
        }
    }
}
