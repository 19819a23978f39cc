//! The Llama-family shapes of the one Transformer block: RMSNorm, rotary positions, SwiGLU,
//! grouped-query attention, qkv bias, QK-norm. Each is checked against an independent
//! definition: f64 references written here, the composite (unfused) path, and the
//! equivalence of grouped-query attention with multi-head attention whose key/value heads
//! are repeated.

use sinter_core::{Device, Rng, Tensor};
use sinter_nn::module::shared_rng;
use sinter_nn::{
    BlockConfig, LayerKvCache, MlpKind, Module, NormKind, RmsNorm, Rope, RopeConfig, RopeScaling,
    TransformerBlock,
};

fn randn(shape: &[usize], rng: &mut Rng) -> Tensor {
    Tensor::randn(shape, 0.0, 1.0, rng, sinter_core::DType::F32, Device::Cpu).unwrap()
}

fn vals(t: &Tensor) -> Vec<f32> {
    t.to_vec_f32().unwrap()
}

fn assert_close(what: &str, a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = b.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    let err = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        err <= tol * scale,
        "{what}: max error {err} (scale {scale})"
    );
}

fn llama(n_kv_head: usize, qkv_bias: bool, qk_norm: bool) -> BlockConfig {
    BlockConfig {
        n_kv_head,
        head_dim: 8,
        mlp_hidden: 40,
        mlp: MlpKind::SwiGlu,
        norm: NormKind::RmsNorm,
        norm_eps: 1e-6,
        qkv_bias,
        out_bias: false,
        mlp_bias: false,
        qk_norm,
        rope: Some(RopeConfig {
            theta: 500.0,
            scaling: RopeScaling::None,
        }),
        ..BlockConfig::gpt2(24, 4, 2, 0.0)
    }
}

/// A block with every parameter drawn at a scale that makes each part matter.
fn block(cfg: &BlockConfig, seed: u64) -> TransformerBlock {
    let b = TransformerBlock::new(cfg, &mut Rng::new(seed), &shared_rng(seed)).unwrap();
    let mut rng = Rng::new(seed + 7);
    for (_, p) in b.parameters() {
        let r = randn(p.shape(), &mut rng).mul_scalar(0.3).unwrap();
        let r = if p.rank() == 1 {
            r.add_scalar(1.0).unwrap()
        } else {
            r
        };
        p.assign(&r).unwrap();
    }
    b
}

#[test]
fn rms_norm_equals_its_definition() {
    let mut rng = Rng::new(1);
    let x = randn(&[3, 5], &mut rng);
    let n = RmsNorm {
        weight: randn(&[5], &mut rng),
        eps: 1e-3,
    };
    let y = vals(&n.forward(&x).unwrap());
    let (xs, w) = (vals(&x), vals(&n.weight));
    for r in 0..3 {
        let row = &xs[r * 5..r * 5 + 5];
        let ms = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / 5.0;
        for j in 0..5 {
            let want = row[j] as f64 / (ms + 1e-3).sqrt() * w[j] as f64;
            assert!((y[r * 5 + j] as f64 - want).abs() < 1e-5, "row {r} col {j}");
        }
    }
}

#[test]
fn rope_rotates_pairs_by_position_times_frequency() {
    let mut rng = Rng::new(2);
    let (h, t, d) = (2, 5, 8);
    let x = randn(&[1, h, t, d], &mut rng);
    let cfg = RopeConfig {
        theta: 100.0,
        scaling: RopeScaling::None,
    };
    let rope = Rope::new(cfg, d).unwrap();
    let start = 3;
    let y = vals(&rope.apply(&x, start).unwrap());
    let xs = vals(&x);
    for hh in 0..h {
        for p in 0..t {
            let base = (hh * t + p) * d;
            for i in 0..d / 2 {
                let f = 100f64.powf(-(2.0 * i as f64) / d as f64);
                let a = (start + p) as f64 * f;
                let (x1, x2) = (xs[base + i] as f64, xs[base + i + d / 2] as f64);
                let want = (x1 * a.cos() - x2 * a.sin(), x2 * a.cos() + x1 * a.sin());
                assert!((y[base + i] as f64 - want.0).abs() < 1e-5);
                assert!((y[base + i + d / 2] as f64 - want.1).abs() < 1e-5);
            }
        }
    }
}

#[test]
fn rope_scaling_follows_llama3_and_linear_rules() {
    let base = RopeConfig {
        theta: 10_000.0,
        scaling: RopeScaling::None,
    };
    let linear = RopeConfig {
        scaling: RopeScaling::Linear { factor: 4.0 },
        ..base.clone()
    };
    let l3 = RopeConfig {
        scaling: RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position: 64.0,
        },
        ..base.clone()
    };
    let (f, fl, f3) = (base.inv_freq(16), linear.inv_freq(16), l3.inv_freq(16));
    for i in 0..8 {
        assert!((fl[i] - f[i] / 4.0).abs() < 1e-15);
        let wavelen = 2.0 * std::f64::consts::PI / f[i];
        if wavelen < 64.0 / 4.0 {
            assert_eq!(f3[i], f[i], "high frequency {i} kept");
        } else if wavelen > 64.0 {
            assert!(
                (f3[i] - f[i] / 8.0).abs() < 1e-15,
                "low frequency {i} divided"
            );
        } else {
            assert!(f3[i] < f[i] && f3[i] > f[i] / 8.0, "frequency {i} blended");
        }
    }
    assert!(Rope::new(base, 7).is_err(), "odd head dimension refused");
}

/// (output, input gradient, parameter gradients by name).
type Outcome = (Vec<f32>, Vec<f32>, Vec<(String, Vec<f32>)>);

fn grads(b: &TransformerBlock) -> Vec<(String, Vec<f32>)> {
    b.parameters()
        .into_iter()
        .map(|(n, p)| (n, p.grad().map(|g| vals(&g)).unwrap_or_default()))
        .collect()
}

fn outcome(
    b: &TransformerBlock,
    x0: &Tensor,
    f: impl Fn(&TransformerBlock, &Tensor) -> Tensor,
) -> Outcome {
    b.zero_grad();
    let x = x0.to_var().unwrap();
    let y = f(b, &x);
    let w = Tensor::arange(
        0.0,
        y.numel() as f64,
        1.0,
        sinter_core::DType::F32,
        Device::Cpu,
    )
    .unwrap()
    .mul_scalar(0.01)
    .unwrap()
    .reshape(y.shape())
    .unwrap();
    y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
    (vals(&y), vals(&x.grad().unwrap()), grads(b))
}

#[test]
fn fused_llama_blocks_equal_the_composite_forward_and_backward() {
    for (kv, bias, qk) in [(4, false, false), (2, true, false), (1, false, true)] {
        let cfg = llama(kv, bias, qk);
        let b = block(&cfg, 3);
        let x = randn(&[2, 6, 24], &mut Rng::new(4));
        let fast = outcome(&b, &x, |b, x| b.forward(x).unwrap());
        let slow = outcome(&b, &x, |b, x| b.forward_composite(x).unwrap());
        let what = format!("kv {kv} bias {bias} qk-norm {qk}");
        assert_close(&format!("{what}: output"), &fast.0, &slow.0, 1e-5);
        assert_close(&format!("{what}: input grad"), &fast.1, &slow.1, 1e-4);
        for ((n, g), (_, h)) in fast.2.iter().zip(&slow.2) {
            assert!(!g.is_empty(), "{what}: {n} got no gradient");
            assert_close(&format!("{what}: grad {n}"), g, h, 1e-4);
        }
    }
}

#[test]
fn grouped_query_attention_equals_repeated_key_value_heads() {
    // 4 query heads sharing 2 kv heads: query heads 0, 1 read kv head 0; 2, 3 read kv head 1.
    let gqa = block(&llama(2, true, false), 5);
    let mha = block(&llama(4, true, false), 6);
    let (d, c) = (8, 24);
    let copy = |from: &Tensor, to: &Tensor| to.assign(from).unwrap();
    for (n, p) in gqa.parameters() {
        if !n.contains("qkv") {
            let q = mha
                .parameters()
                .into_iter()
                .find(|(m, _)| *m == n)
                .unwrap()
                .1;
            copy(&p, &q);
        }
    }
    let repeat = |t: &Tensor| -> Tensor {
        // rows [q (4·d) | k (2·d) | v (2·d)] → [q | k0 k0 k1 k1 | v0 v0 v1 v1]
        let part = |from: usize, n: usize| t.narrow(0, from * d, n * d).unwrap();
        let mut rows = vec![part(0, 4)];
        for kv in [4, 6] {
            for head in 0..2 {
                let h = part(kv + head, 1);
                rows.push(h.clone());
                rows.push(h);
            }
        }
        Tensor::cat(&rows, 0).unwrap()
    };
    mha.attn
        .qkv
        .weight
        .assign(&repeat(&gqa.attn.qkv.weight))
        .unwrap();
    mha.attn
        .qkv
        .bias
        .as_ref()
        .unwrap()
        .assign(&repeat(gqa.attn.qkv.bias.as_ref().unwrap()))
        .unwrap();
    let x = randn(&[1, 5, c], &mut Rng::new(8));
    assert_close(
        "gqa vs repeated mha",
        &vals(&gqa.forward(&x).unwrap()),
        &vals(&mha.forward(&x).unwrap()),
        1e-5,
    );
}

#[test]
fn kv_cache_steps_equal_the_full_forward_with_rotation() {
    let cfg = llama(2, false, true);
    let b = block(&cfg, 9);
    let x = randn(&[1, 7, 24], &mut Rng::new(10));
    let full = vals(&b.forward(&x).unwrap());
    let mut cache = LayerKvCache::new(1, 2, 16, 8, sinter_core::DType::F32, Device::Cpu).unwrap();
    let mut steps = vals(
        &b.forward_step(&x.narrow(1, 0, 3).unwrap(), &mut cache)
            .unwrap(),
    );
    for p in 3..7 {
        steps.extend(vals(
            &b.forward_step(&x.narrow(1, p, 1).unwrap(), &mut cache)
                .unwrap(),
        ));
    }
    assert_eq!(cache.len, 7);
    assert_close("steps vs full", &steps, &full, 1e-5);
}

#[test]
fn named_weights_rebuild_the_same_block() {
    let cfg = llama(2, true, true);
    let b = block(&cfg, 11);
    let named: std::collections::HashMap<String, Tensor> = b
        .parameters()
        .into_iter()
        .map(|(n, t)| (format!("blocks.3.{n}"), t))
        .collect();
    let again = TransformerBlock::from_named(
        &cfg,
        "blocks.3",
        &mut |n| {
            named
                .get(n)
                .cloned()
                .ok_or_else(|| sinter_core::Error::Msg(format!("{n} missing")))
        },
        &shared_rng(0),
    )
    .unwrap();
    let x = randn(&[2, 4, 24], &mut Rng::new(12));
    assert_eq!(
        vals(&again.forward(&x).unwrap()),
        vals(&b.forward(&x).unwrap())
    );
    let mut missing = |n: &str| -> sinter_core::Result<Tensor> {
        Err(sinter_core::Error::Msg(format!("{n} missing")))
    };
    let e = TransformerBlock::from_named(&cfg, "blocks.3", &mut missing, &shared_rng(0));
    assert!(e.err().unwrap().to_string().contains("blocks.3.ln1.weight"));
}
