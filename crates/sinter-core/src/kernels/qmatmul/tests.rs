//! qmatmul against its exact [`reference`] on the CPU and the CUDA device (the real GPU when
//! present, else the emulated one: the kernel emulator runs `qmatmul.cu`), and the CUDA kernels'
//! integers against the CPU int8 GEMM's bit for bit: the quantized activation bytes and their
//! mappings, the channel sums and the raw accumulators — on odd shapes (k not a multiple of 4,
//! 8 or the 32-byte stage; m and n not multiples of the 64 tile; one row), extreme values that
//! would saturate a naive product, all-zero and constant rows, one and two activation terms,
//! one and two weight planes, each activation, with and without bias.

use super::*;
use crate::kernels::test_support::{devices, values};
use sinter_cpu::int8::{gemm_i32, quantize_rows_terms, Int8Path};

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
                let scale = want.iter().fold(1e-3f64, |a, w| a.max(w.abs()));
                for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        (g as f64 - w).abs() <= 2e-6 * w.abs() + 2e-6 * scale,
                        "{what}[{i}]: got {g}, want {w}"
                    );
                }
                outs.push((dev, y));
            }
            // Outside GELU (each device's tanh/erf) the devices compute the same f32 operations.
            if matches!(act, Activation::None | Activation::Relu) {
                for (dev, y) in &outs[1..] {
                    let same = y
                        .iter()
                        .zip(&outs[0].1)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{dev} [{m}×{n}×{k}] {act:?}: not the CPU's bits");
                }
            }
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
