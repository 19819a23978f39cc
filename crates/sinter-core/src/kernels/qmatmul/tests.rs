//! qmatmul against its exact [`reference`] on the CPU and the CUDA device (the real GPU when
//! present, else the emulated one: the kernel emulator runs `qmatmul.cu`), and the CUDA kernels'
//! integers against the CPU int8 GEMM's bit for bit: the quantized activation bytes and their
//! mappings, the channel sums and the raw accumulators — on odd shapes (k not a multiple of 4,
//! 8 or the 32-byte stage; m and n not multiples of the 64 tile; one row), extreme values that
//! would saturate a naive product, all-zero and constant rows, one and two activation terms,
//! one and two weight planes, each activation, with and without bias.

use super::*;
use crate::kernels::test_support::{assert_close, devices, magnitude, values};
use crate::Conv2dParams;
use sinter_cpu::ggml_quant::GgmlType;
use sinter_cpu::int8::{gemm_i32, quantize_rows_terms, Int8Path, QParams};

/// (m, n, k).
const SHAPES: [(usize, usize, usize); 5] = [
    (1, 1, 1),
    (3, 17, 5),
    (2, 9, 13),
    (70, 33, 45),
    (65, 130, 67),
];

const ACTS: [Activation; 4] = [
    Activation::None,
    Activation::Relu,
    Activation::GeluTanh,
    Activation::GeluErf,
];

/// Deterministic int8 values in [-127, 127], the extremes frequent.
fn int8s(seed: u64, len: usize) -> Vec<i8> {
    values(seed, len, 0.0, 1.0)
        .iter()
        .enumerate()
        .map(|(i, &u)| match i % 5 {
            0 => 127,
            1 => -127,
            _ => (u * 254.0 - 127.0).round() as i8,
        })
        .collect()
}

/// Activations: shifted rows (a non-zero mean), an all-zero row and a constant row.
fn inputs(seed: u64, m: usize, k: usize) -> Vec<f32> {
    let mut x = values(seed, m * k, -3.0, 3.0);
    for (i, row) in x.chunks_exact_mut(k).enumerate() {
        match i % 7 {
            3 => row.fill(0.0),
            5 => row.fill(1.25),
            1 => row.iter_mut().for_each(|v| *v += 2.0),
            _ => {}
        }
    }
    x
}

/// A plane's values [n, k] and scales on the host.
type HostPlane = (Vec<i8>, Vec<f32>);

fn weight(seed: u64, n: usize, k: usize, planes: usize, dev: Device) -> (QWeight, Vec<HostPlane>) {
    let host: Vec<_> = (0..planes as u64)
        .map(|p| {
            let s = values(seed + 50 + p, n, 0.001, 0.02);
            let s: Vec<f32> = s
                .iter()
                .map(|v| v / (1 + 100 * p as usize) as f32)
                .collect();
            (int8s(seed + p, n * k), s)
        })
        .collect();
    let mut w = QWeight::int8(&host[0].0, n, k, &host[0].1, dev).unwrap();
    if let Some((q, s)) = host.get(1) {
        w = w
            .with_second_plane(QWeight::int8(q, n, k, s, dev).unwrap())
            .unwrap();
    }
    (w, host)
}

/// A kernel's f32 output within f32 rounding of the f64 reference.
fn assert_near_reference(what: &str, y: &[f32], want: &[f64]) {
    assert_close(what, y, want, (2e-6, 2e-6 * magnitude(want)));
}

/// Outside GELU (each device's tanh/erf) the devices compute the same f32 operations: every
/// device's output has the first's (the CPU's) bits.
fn assert_devices_agree(what: &str, outs: &[(Device, Vec<f32>)], act: Activation) {
    if !matches!(act, Activation::None | Activation::Relu) {
        return;
    }
    for (dev, y) in &outs[1..] {
        let same = y
            .iter()
            .zip(&outs[0].1)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{dev} {what} {act:?}: not the CPU's bits");
    }
}

#[test]
fn qmatmul_matches_the_exact_reference_and_the_devices_agree() {
    for (c, &(m, n, k)) in SHAPES.iter().enumerate() {
        let seed = 10 * c as u64;
        let x = inputs(seed, m, k);
        let bias = values(seed + 7, n, -1.0, 1.0);
        for (v, act) in ACTS.into_iter().enumerate() {
            let with_bias = v % 2 == 1;
            let (terms, planes) = [
                (ActTerms::One, 1),
                (ActTerms::Two, 1),
                (ActTerms::One, 2),
                (ActTerms::Two, 2),
            ][(c + v) % 4];
            let mut outs: Vec<(Device, Vec<f32>)> = Vec::new();
            for dev in devices() {
                let (w, host) = weight(seed, n, k, planes, dev);
                let xt = Tensor::from_vec(x.clone(), &[m, k], Device::Cpu)
                    .unwrap()
                    .to_device(dev)
                    .unwrap();
                let bt = with_bias.then(|| Tensor::from_vec(bias.clone(), &[n], dev).unwrap());
                let out = qmatmul(&xt, &w, bt.as_ref(), act, terms).unwrap();
                let what = format!(
                    "{dev} [{m}×{n}×{k}] {act:?} bias {with_bias} {terms:?} planes {planes}"
                );
                assert_eq!(out.y.shape(), [m, n], "{what}");
                assert_eq!(out.terms, terms, "{what}");
                let y = out.y.to_vec_f32().unwrap();
                let hp: Vec<_> = host.iter().map(|(q, s)| (&q[..], &s[..])).collect();
                let want =
                    reference(&x, k, &hp, with_bias.then_some(&bias[..]), act, terms).unwrap();
                assert_near_reference(&what, &y, &want);
                outs.push((dev, y));
            }
            assert_devices_agree(&format!("[{m}×{n}×{k}]"), &outs, act);
        }
    }
}

/// The CUDA quantizer's bytes and mappings, the channel sums and the raw accumulators are the
/// CPU int8 GEMM's (its scalar path), bit for bit.
#[test]
fn the_cuda_integers_equal_the_cpu_int8_gemms() {
    let Some(dev) = devices().into_iter().find(|d| *d != Device::Cpu) else {
        return;
    };
    for (c, &(m, n, k)) in SHAPES.iter().enumerate() {
        let seed = 100 + c as u64;
        let (w, host) = weight(seed, n, k, 1, dev);
        let packed = PackedWeights::pack(&host[0].0, n, k).unwrap();
        let Plane::Device { values, sums, .. } = &w.planes[0] else {
            panic!("a CPU plane on {dev}");
        };
        let got_sums = sums.to_vec_i64().unwrap();
        let want_sums: Vec<i64> = packed.sums()[..n].iter().map(|&s| s as i64).collect();
        assert_eq!(got_sums, want_sums, "sums [{n}×{k}]");
        let x = inputs(seed, m, k);
        for terms in [1, 2] {
            let xt = Tensor::from_vec(x.clone(), &[m, k], dev).unwrap();
            let q = cuda::quantize_rows(&xt, terms).unwrap();
            let ld = row_bytes(k);
            let bytes: Vec<u8> = q[0]
                .to_vec_i64()
                .unwrap()
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect();
            let mut want = vec![0u8; terms * m * ld];
            let t = if terms == 1 {
                ActTerms::One
            } else {
                ActTerms::Two
            };
            let params = quantize_rows_terms(&x, m, k, k, t, &mut want, ld).unwrap();
            assert_eq!(bytes, want, "u8 rows [{m}×{k}] terms {terms}");
            let scales = q[1].to_vec_f32().unwrap();
            let zeros = q[2].to_vec_i64().unwrap();
            for (r, p) in params.iter().enumerate() {
                assert_eq!(scales[r].to_bits(), p.scale.to_bits(), "scale of row {r}");
                assert_eq!(zeros[r], p.zero_point as i64, "zero point of row {r}");
            }
            if terms == 2 {
                continue;
            }
            let acc = cuda::accumulators(&q[0], values, sums)
                .unwrap()
                .to_vec_i64()
                .unwrap();
            let mut want_acc = vec![0i32; m * n];
            gemm_i32(Int8Path::Scalar, &want, m, ld, &packed, &mut want_acc, n);
            let want_acc: Vec<i64> = want_acc.iter().map(|&v| v as i64).collect();
            assert_eq!(acc, want_acc, "accumulators [{m}×{n}×{k}]");
        }
    }
}

#[test]
fn weights_move_between_devices_unchanged() {
    let (n, k) = (19, 29);
    let q = int8s(3, n * k);
    let s = values(4, n, 0.01, 0.02);
    for dev in devices() {
        let w = QWeight::int8(&q, n, k, &s, dev).unwrap();
        assert_eq!(w.device(), dev);
        let back = w.to_device(Device::Cpu).unwrap();
        assert_eq!(
            back.plane_values(0).unwrap(),
            (q.clone(), s.clone()),
            "{dev}"
        );
        assert_eq!(w.plane_values(0).unwrap(), (q.clone(), s.clone()), "{dev}");
    }
}

#[test]
fn bad_calls_are_errors_that_say_what_to_do() {
    let (n, k) = (4, 6);
    let w = QWeight::int8(&int8s(1, n * k), n, k, &[0.01; 4], Device::Cpu).unwrap();
    let x = Tensor::from_vec(values(2, 2 * k, -1.0, 1.0), &[2, k], Device::Cpu).unwrap();
    let msg = |r: Result<QOutput>| r.unwrap_err().to_string();
    let e = msg(qmatmul(
        &x.reshape(&[3, 4]).unwrap(),
        &w,
        None,
        Activation::None,
        ActTerms::Auto,
    ));
    assert!(e.contains("last dimension 6"), "{e}");
    let e = msg(qmatmul(
        &x.to_var().unwrap(),
        &w,
        None,
        Activation::None,
        ActTerms::Auto,
    ));
    assert!(e.contains("no_grad"), "{e}");
    let b = Tensor::from_vec(vec![0f32; 3], &[3], Device::Cpu).unwrap();
    let e = msg(qmatmul(&x, &w, Some(&b), Activation::None, ActTerms::Auto));
    assert!(e.contains("f32 [4]"), "{e}");
    let e = QWeight::int8(&[-128i8; 4], 2, 2, &[1.0, 1.0], Device::Cpu).unwrap_err();
    assert!(e.to_string().contains("-128"), "{e}");
    for dev in devices().into_iter().filter(|d| *d != Device::Cpu) {
        let e = msg(qmatmul(
            &x.to_device(dev).unwrap(),
            &w,
            None,
            Activation::None,
            ActTerms::Auto,
        ));
        assert!(e.contains("QWeight::to_device"), "{e}");
    }
}

/// One int8 convolution case: (n, c, h, w, out, kh, kw, stride, padding, dilation).
type ConvCase = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
);

/// Odd sizes: k = c·kh·kw not a multiple of 8, a 1×1 kernel, stride, dilation, padding wider
/// than one tap, one image, more output channels than the GEMM's 64 tile.
const CONV_CASES: [ConvCase; 5] = [
    (2, 3, 7, 6, 5, 3, 3, 1, 1, 1),
    (1, 4, 9, 9, 3, 1, 1, 2, 0, 1),
    (3, 2, 8, 7, 4, 3, 2, 2, 2, 1),
    (2, 5, 10, 9, 6, 3, 3, 1, 2, 2),
    (1, 3, 5, 5, 70, 2, 2, 1, 1, 1),
];

fn conv_of(case: ConvCase, seed: u64, with_bias: bool) -> QConv2d {
    let (_, c, _, _, o, kh, kw, stride, padding, dilation) = case;
    let params = Conv2dParams {
        stride: stride.into(),
        padding: padding.into(),
        dilation: dilation.into(),
        ..Default::default()
    };
    let bias = values(seed + 3, o, -1.0, 1.0);
    QConv2d::new(
        &int8s(seed, o * c * kh * kw),
        [o, c, kh, kw],
        &values(seed + 1, o, 0.001, 0.02),
        with_bias.then_some(&bias[..]),
        params,
        QParams::from_range(-2.5, 3.0).unwrap(),
    )
    .unwrap()
}

#[test]
fn qconv_matches_the_exact_reference_and_the_devices_agree() {
    for (i, &case) in CONV_CASES.iter().enumerate() {
        let (n, c, h, w, o, ..) = case;
        let seed = 200 + 10 * i as u64;
        // Values beyond the calibrated range saturate, as on the CPU.
        let x = values(seed + 5, n * c * h * w, -3.5, 4.0);
        for (v, act) in ACTS.into_iter().enumerate() {
            let conv = conv_of(case, seed, (i + v) % 2 == 0);
            let want = conv_reference(&conv, &x, [n, h, w], act).unwrap();
            let mut outs: Vec<(Device, Vec<f32>)> = Vec::new();
            for dev in devices() {
                let xt = Tensor::from_vec(x.clone(), &[n, c, h, w], dev).unwrap();
                let y = conv.forward(&xt, act).unwrap();
                let what = format!("{dev} case {i} {act:?}");
                let g = conv.geometry_of(h, w).unwrap().win;
                assert_eq!(y.shape(), [n, o, g.oh, g.ow], "{what}");
                assert_eq!(y.device(), dev, "{what}");
                let y = y.to_vec_f32().unwrap();
                assert_near_reference(&what, &y, &want);
                outs.push((dev, y));
            }
            assert_devices_agree(&format!("conv case {i}"), &outs, act);
        }
    }
}

#[test]
fn qconv_refuses_nan_gradients_and_wrong_shapes_on_every_device() {
    let case = CONV_CASES[0];
    let (n, c, h, w, ..) = case;
    let conv = conv_of(case, 1, true);
    for dev in devices() {
        let mut x = values(9, n * c * h * w, -1.0, 1.0);
        let msg = |x: &Tensor| conv.forward(x, Activation::None).unwrap_err().to_string();
        let ok = Tensor::from_vec(x.clone(), &[n, c, h, w], dev).unwrap();
        assert!(msg(&ok.to_var().unwrap()).contains("no_grad"), "{dev}");
        let e = msg(&ok.reshape(&[n, c, h * w]).unwrap());
        assert!(e.contains("expected input [n, 3, h, w]"), "{dev}: {e}");
        x[17] = f32::NAN;
        let e = msg(&Tensor::from_vec(x, &[n, c, h, w], dev).unwrap());
        assert!(e.contains("NaN (first at flat index 17)"), "{dev}: {e}");
    }
    let p = Conv2dParams {
        groups: 2,
        ..Default::default()
    };
    let e = QConv2d::new(
        &[1; 4],
        [2, 2, 1, 1],
        &[0.1; 2],
        None,
        p,
        QParams::from_range(0.0, 1.0).unwrap(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("grouped"), "{e}");
}

/// A GGML weight [n, k] of type `ty` quantized from deterministic values.
fn ggml_matrix(ty: GgmlType, n: usize, k: usize, seed: u64) -> QuantMatrix {
    let w = values(seed, n * k, -1.0, 1.0);
    let bytes = sinter_cpu::ggml_quant::quantize::quantize(ty, &w, k).unwrap();
    QuantMatrix::new(ty, n, k, bytes).unwrap()
}

/// Every kind sinter-cpu has dot kernels for (`DOT_TYPES`), and a matrix stacked from two kinds (a fused
/// projection whose parts a GGUF file stores in different types): (matrix, k).
fn ggml_cases() -> Vec<(QuantMatrix, usize)> {
    let mut v: Vec<_> = [
        (GgmlType::Q8_0, 64),
        (GgmlType::Q4_0, 96),
        (GgmlType::Q4_1, 64),
        (GgmlType::Q4_K, 256),
        (GgmlType::Q6_K, 256),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (ty, k))| (ggml_matrix(ty, 37 + 8 * i, k, 300 + i as u64), k))
    .collect();
    let stacked = QuantMatrix::stack(vec![
        ggml_matrix(GgmlType::Q4_K, 24, 256, 400),
        ggml_matrix(GgmlType::Q6_K, 9, 256, 401),
    ])
    .unwrap();
    v.push((stacked, 256));
    v
}

/// The CUDA kernel's dequantized rows are the CPU's bit for bit (every kind, partial groups
/// of rows, ids in any order and repeated), and a weight survives the round trip.
#[test]
fn ggml_rows_dequantize_to_the_cpus_bits_on_every_device() {
    for (m, k) in ggml_cases() {
        let n = m.n();
        let want = m.dequantize();
        let ids: Vec<i64> = (0..n as i64).rev().chain([0, 3, 3]).collect();
        let single = m.types().len() == 1;
        let cpu = QWeight::ggml(Arc::new(m));
        for dev in devices() {
            let what = format!(
                "{:?} [{n}×{k}] on {dev}",
                cpu.ggml_matrix().unwrap().types()
            );
            let w = cpu.to_device(dev).unwrap();
            assert_eq!((w.format(), w.n(), w.k()), (QFormat::Ggml, n, k), "{what}");
            let back = w.to_device(Device::Cpu).unwrap();
            let back = back.ggml_matrix().unwrap().dequantize();
            assert!(
                back.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: round trip"
            );
            if !single && dev != Device::Cpu {
                let ids = Tensor::from_vec(vec![0i64], &[1], dev).unwrap();
                assert!(
                    w.lookup(&ids).unwrap_err().to_string().contains("stacked"),
                    "{what}"
                );
                continue;
            }
            let it = Tensor::from_vec(ids.clone(), &[ids.len()], dev).unwrap();
            let rows = w.lookup(&it).unwrap();
            assert_eq!(rows.shape(), [ids.len(), k], "{what}");
            let rows = rows.to_vec_f32().unwrap();
            for (r, &id) in ids.iter().enumerate() {
                let (got, exp) = (&rows[r * k..(r + 1) * k], &want[id as usize * k..][..k]);
                let same = got.iter().zip(exp).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{what}: row {id}");
            }
            let bad = Tensor::from_vec(vec![n as i64], &[1], dev).unwrap();
            let e = w.lookup(&bad).unwrap_err().to_string();
            assert!(
                e.contains(&format!("token id {n} is outside the table's {n} rows")),
                "{e}"
            );
        }
    }
}

/// qmatmul with a GGML weight against x · dequantized(W)ᵀ + b in f64: on CUDA (exact
/// dequantization, an f32 GEMM) to f32 rounding; on the CPU within the error of its 8-bit
/// per-block activations (and to f32 rounding from 32 rows, where it dequantizes too).
#[test]
fn qmatmul_of_ggml_weights_matches_the_dequantized_product() {
    for (c, (m, k)) in ggml_cases().into_iter().enumerate() {
        let n = m.n();
        let wd = m.dequantize();
        let cpu = QWeight::ggml(Arc::new(m));
        let bias = values(500 + c as u64, n, -0.5, 0.5);
        for rows in [3, 40] {
            let x = values(600 + c as u64, rows * k, -1.0, 1.0);
            let act = ACTS[(c + rows) % 4];
            let want: Vec<f64> = (0..rows * n)
                .map(|t| {
                    let (i, j) = (t / n, t % n);
                    let dot: f64 = (0..k)
                        .map(|p| x[i * k + p] as f64 * wd[j * k + p] as f64)
                        .sum();
                    activate_f64(dot + bias[j] as f64, act)
                })
                .collect();
            let scale = magnitude(&want);
            for dev in devices() {
                let w = cpu.to_device(dev).unwrap();
                let xt = Tensor::from_vec(x.clone(), &[rows, k], dev).unwrap();
                let bt = Tensor::from_vec(bias.clone(), &[n], dev).unwrap();
                let y = qmatmul(&xt, &w, Some(&bt), act, ActTerms::Auto).unwrap().y;
                assert_eq!((y.shape(), y.device()), (&[rows, n][..], dev));
                let exact = dev != Device::Cpu || rows >= 32;
                let tol = if exact { 1e-5 } else { 2e-2 };
                let what = format!("case {c} {dev} {rows} rows {act:?}");
                assert_close(&what, &y.to_vec_f32().unwrap(), &want, (0.0, tol * scale));
            }
        }
    }
}
