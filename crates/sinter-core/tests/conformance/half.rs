//! f16 and bf16: a subset of ops computed on half inputs agrees with the f32 computation on
//! the same (rounded) values to within 1e-2 relative, forward and backward.

use super::common::*;
use sinter_core::{DType, Result, Rng, Tensor};

const HALVES: [DType; 2] = [DType::F16, DType::BF16];

type Op = Box<dyn Fn(&[Tensor]) -> Result<Tensor>>;

/// (name, input shapes, op). Each op only sees tensors of one dtype.
fn cases() -> Vec<(&'static str, Vec<Vec<usize>>, Op)> {
    vec![
        (
            "add",
            vec![vec![4, 1, 3], vec![5, 1]],
            Box::new(|v| v[0].add(&v[1])),
        ),
        (
            "mul",
            vec![vec![3, 4], vec![4]],
            Box::new(|v| v[0].mul(&v[1])),
        ),
        (
            "mul strided",
            vec![vec![4, 3], vec![3, 4]],
            Box::new(|v| v[0].t()?.mul(&v[1])),
        ),
        (
            "matmul",
            vec![vec![2, 5, 16], vec![16, 6]],
            Box::new(|v| v[0].matmul(&v[1])),
        ),
        (
            "matmul bᵀ",
            vec![vec![3, 16], vec![2, 7, 16]],
            Box::new(|v| v[0].matmul(&v[1].transpose(1, 2)?)),
        ),
        (
            "softmax",
            vec![vec![3, 4, 9]],
            Box::new(|v| v[0].mul_scalar(2.0)?.softmax(-1)),
        ),
        (
            "softmax dim 1",
            vec![vec![3, 4, 9]],
            Box::new(|v| v[0].softmax(1)),
        ),
        (
            "layer_norm",
            vec![vec![5, 12], vec![12], vec![12]],
            Box::new(|v| v[0].layer_norm(&v[1], &v[2], 1e-5)),
        ),
        (
            "gelu",
            vec![vec![6, 7]],
            Box::new(|v| v[0].mul_scalar(2.0)?.gelu()),
        ),
    ]
}

fn rounded_inputs(rng: &mut Rng, shapes: &[Vec<usize>], dt: DType) -> (Vec<Tensor>, Vec<Tensor>) {
    let half: Vec<Tensor> = shapes
        .iter()
        .map(|s| uniform(rng, s, -2.0, 2.0).to_dtype(dt).unwrap())
        .collect();
    let full: Vec<Tensor> = half
        .iter()
        .map(|t| t.to_dtype(DType::F32).unwrap())
        .collect();
    (half, full)
}

#[test]
fn half_forward_agrees_with_f32() {
    for dt in HALVES {
        let mut rng = Rng::new(1200);
        for (name, shapes, f) in cases() {
            let (half, full) = rounded_inputs(&mut rng, &shapes, dt);
            let got = f(&half).unwrap();
            assert_eq!(got.dtype(), dt, "{name} {dt}: output dtype");
            let want = f(&full).unwrap();
            assert_close(&got, &Arr::of(&want), 1e-2, 1e-6, &format!("{name} {dt}"));
            // Stricter: one round-to-nearest of the f32 result (half an ulp: 2^-11 or 2^-8
            // relative), so truncation or double rounding would show.
            let half_ulp = if dt == DType::F16 {
                2f64.powi(-11)
            } else {
                2f64.powi(-8)
            };
            assert_close(
                &got,
                &Arr::of(&want),
                half_ulp + 1e-6,
                1e-6,
                &format!("{name} {dt} rounding"),
            );
        }
    }
}

#[test]
fn half_backward_agrees_with_f32() {
    for dt in HALVES {
        let mut rng = Rng::new(1210);
        for (name, shapes, f) in cases() {
            let (half, full) = rounded_inputs(&mut rng, &shapes, dt);
            let probe = f(&full).unwrap();
            let w32 = normal(&mut rng, probe.shape())
                .to_dtype(dt)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap();
            let w16 = w32.to_dtype(dt).unwrap();
            let run = |inputs: &[Tensor], w: &Tensor| -> Vec<Tensor> {
                let vars: Vec<Tensor> = inputs.iter().map(|t| t.to_var().unwrap()).collect();
                f(&vars)
                    .unwrap()
                    .mul(w)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                vars.iter().map(|v| v.grad().unwrap()).collect()
            };
            let (gh, gf) = (run(&half, &w16), run(&full, &w32));
            for (i, (a, b)) in gh.iter().zip(&gf).enumerate() {
                assert_eq!(a.dtype(), dt, "{name} {dt}: gradient dtype");
                let bv = vals(b);
                let scale = bv.iter().fold(0f64, |m, v| m.max(v.abs()));
                assert_close(
                    a,
                    &Arr::of(b),
                    3e-2,
                    1e-2 * scale,
                    &format!("{name} {dt} grad {i}"),
                );
            }
        }
    }
}

#[test]
fn half_losses_and_casts() {
    let mut rng = Rng::new(1220);
    for dt in HALVES {
        let x = uniform(&mut rng, &[4, 5], -2.0, 2.0).to_dtype(dt).unwrap();
        let t = ids(&[1, 4, -100, 0], &[4]);
        let l16 = x.cross_entropy(&t, -100).unwrap();
        let l32 = x
            .to_dtype(DType::F32)
            .unwrap()
            .cross_entropy(&t, -100)
            .unwrap();
        assert_close(
            &l16,
            &Arr::of(&l32),
            1e-3,
            1e-6,
            &format!("cross_entropy {dt}"),
        );
        // Gradient through a cast goes back to the source dtype.
        let v = uniform(&mut rng, &[3, 4], -2.0, 2.0).to_var().unwrap();
        let w = uniform(&mut rng, &[3, 4], -2.0, 2.0).to_dtype(dt).unwrap();
        v.to_dtype(dt)
            .unwrap()
            .mul(&w)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let g = v.grad().unwrap();
        assert_eq!(g.dtype(), DType::F32);
        assert_eq!(vals(&g), vals(&w));
        // Mixed float dtypes promote to the wider in elementwise ops (PyTorch's rule, see
        // `sinter_core::amp`), with the exact f32 result of the half values; matmul does not
        // mix dtypes outside an autocast region.
        let wide = x.to_dtype(DType::F32).unwrap();
        let sum = x.add(&wide).unwrap();
        assert_eq!(sum.dtype(), DType::F32);
        assert_eq!(vals(&sum), vals(&wide.add(&wide).unwrap()));
        expect_err(
            x.matmul(&x.to_dtype(DType::F32).unwrap().t().unwrap()),
            "matmul",
        );
    }
}
