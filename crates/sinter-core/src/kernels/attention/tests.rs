//! The folder's kernels on the CPU against the f64 [`reference`] and the composites (the
//! conformance suite runs them on the emulated CUDA device too).

use super::*;

#[test]
fn causal_mask_from_aranges_matches_the_bottom_right_rule() {
    for (tq, tk) in [(1, 1), (4, 4), (3, 7), (7, 3), (1, 9), (5, 0)] {
        let g = AttnGeom {
            b: 1,
            h: 1,
            tq,
            tk,
            d: 1,
            causal: true,
            scale: 1.0,
        };
        let want: Vec<bool> = (0..tq * tk).map(|x| (x % tk) >= g.limit(x / tk)).collect();
        let got = causal_mask(tq, tk, Device::Cpu).unwrap();
        assert_eq!(got.shape(), &[tq, tk]);
        assert_eq!(got.dtype(), DType::Bool);
        assert_eq!(got.to_vec_bool().unwrap(), want, "tq {tq}, tk {tk}");
    }
}

/// Causal with more queries than keys: the first tq − tk rows see no key. The composite
/// (what CUDA runs for f32) must give them 0 like the kernel, with finite gradients, and
/// match the kernel everywhere else; with no keys at all everything is 0.
#[test]
fn composite_rows_without_keys_are_zero_like_the_kernel() {
    let mut rng = crate::Rng::new(7);
    for (tq, tk) in [(5usize, 3usize), (4, 0)] {
        let mut mk = |t: usize| {
            Tensor::randn(&[1, 2, t, 4], 0.0, 1.0, &mut rng, DType::F32, Device::Cpu)
                .unwrap()
                .to_var()
                .unwrap()
        };
        let (q, k, v) = (mk(tq), mk(tk), mk(tk));
        let run = |f: fn(&Tensor, &Tensor, &Tensor, bool, f32) -> Result<Tensor>| {
            let o = f(&q, &k, &v, true, 0.5).unwrap();
            o.sum_all().unwrap().backward().unwrap();
            let grads: Vec<Vec<f32>> = [&q, &k, &v]
                .iter()
                .map(|t| t.grad().unwrap().to_vec_f32().unwrap())
                .collect();
            for t in [&q, &k, &v] {
                t.zero_grad();
            }
            (o.to_vec_f32().unwrap(), grads)
        };
        let (o_ref, g_ref) = run(attention_reference);
        let (o_ker, g_ker) = run(attention);
        for head in o_ref.chunks(tq * 4) {
            // Each head's first tq − tk rows (of head dim 4).
            assert!(head[..(tq - tk) * 4].iter().all(|&x| x == 0.0), "{head:?}");
        }
        for (a, b) in o_ref
            .iter()
            .zip(&o_ker)
            .chain(g_ref.iter().flatten().zip(g_ker.iter().flatten()))
        {
            assert!(
                a.is_finite() && (a - b).abs() < 1e-5,
                "tq {tq} tk {tk}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn kernel_or_composite() {
    assert!(cuda::flash_applies(DType::BF16, 64));
    assert!(cuda::flash_applies(DType::F16, 128));
    assert!(!cuda::flash_applies(DType::F32, 64), "f32: composite");
    assert!(
        !cuda::flash_applies(DType::BF16, 80),
        "head dim 80: composite"
    );
}

/// The CPU flash kernels (values, log-sum-exp and the three gradients) against the f64
/// reference, causal with a KV cache (tq < tk) across a tile edge, and not causal.
#[test]
fn cpu_kernels_match_the_f64_reference() {
    let mut rng = crate::Rng::new(11);
    for (tq, tk, causal) in [(3usize, 70usize, true), (5, 5, false)] {
        let (b, h, d) = (1, 2, 8);
        let mut mk = |t: usize| {
            Tensor::randn(&[b, h, t, d], 0.0, 1.0, &mut rng, DType::F32, Device::Cpu).unwrap()
        };
        let (q, k, v, w) = (
            mk(tq).to_var().unwrap(),
            mk(tk).to_var().unwrap(),
            mk(tk).to_var().unwrap(),
            mk(tq),
        );
        let g = geom::of_qkv(&q, &k, &v, causal, 0.4).unwrap();
        let (_, lse) = flash(&q, &k, &v, &g)
            .unwrap()
            .expect("the CPU has a kernel");
        let o = attention(&q, &k, &v, causal, 0.4).unwrap();
        o.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
        let f64s = |t: &Tensor| -> Vec<f64> {
            t.to_vec_f32().unwrap().into_iter().map(f64::from).collect()
        };
        let z = reference::Dims {
            bh: b * h,
            tq,
            tk,
            d,
        };
        let (qv, kv, vv) = (f64s(&q), f64s(&k), f64s(&v));
        let (o_ref, lse_ref) = reference::forward(&qv, &kv, &vv, z, causal, 0.4);
        let (dq, dk, dv) = reference::backward(&qv, &kv, &vv, &f64s(&w), z, causal, 0.4);
        let lse_got: Vec<f64> = Tensor::from_storage(lse, &[b * h * tq])
            .to_vec_f32()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect();
        let pairs = [
            ("o", f64s(&o), o_ref),
            ("lse", lse_got, lse_ref),
            ("dq", f64s(&q.grad().unwrap()), dq),
            ("dk", f64s(&k.grad().unwrap()), dk),
            ("dv", f64s(&v.grad().unwrap()), dv),
        ];
        for (what, got, want) in pairs {
            assert_eq!(got.len(), want.len(), "{what}");
            for (a, b) in got.iter().zip(&want) {
                assert!(
                    (a - b).abs() < 1e-4 * (1.0 + b.abs()),
                    "{what} (tq {tq}, tk {tk}): {a} vs {b}"
                );
            }
        }
    }
}
