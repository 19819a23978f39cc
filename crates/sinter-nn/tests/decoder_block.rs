//! The shapes of the one Transformer block: RMSNorm, rotary positions, SwiGLU and GeGLU,
//! grouped-query attention, qkv bias, QK-norm, sliding windows, and BERT's encoder
//! configuration (post-norm, bidirectional, padding mask). Each is checked against an independent
//! definition: f64 references written here, the composite (unfused) path, and the
//! equivalence of grouped-query attention with multi-head attention whose key/value heads
//! are repeated.

use sinter_core::kernels::attention::reference as attn_ref;
use sinter_core::{Device, Rng, Tensor};
use sinter_nn::module::shared_rng;
use sinter_nn::{
    BlockConfig, LayerKvCache, MlpKind, Module, NormKind, Recompute, RmsNorm, Rope, RopeConfig,
    RopeScaling, TransformerBlock,
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

/// A Mistral-style block whose window holds `w` positions.
fn windowed(w: usize) -> BlockConfig {
    BlockConfig {
        sliding_window: Some(w),
        ..llama(2, false, false)
    }
}

#[test]
fn a_sliding_window_sees_only_the_last_positions() {
    let (w, t) = (3, 8);
    let b = block(&windowed(w), 13);
    let x = randn(&[1, t, 24], &mut Rng::new(14));
    let full = vals(&b.forward(&x).unwrap());
    // Rotary scores depend only on relative positions, so position p of the windowed block
    // equals the last position of the block run on the window's positions alone.
    for p in 0..t {
        let from = (p + 1).saturating_sub(w);
        let alone = vals(
            &b.forward(&x.narrow(1, from, p + 1 - from).unwrap())
                .unwrap(),
        );
        assert_close(
            &format!("position {p}"),
            &full[p * 24..(p + 1) * 24],
            &alone[alone.len() - 24..],
            1e-5,
        );
    }
    // And the window matters: without it the later positions differ.
    let unwindowed = block(&llama(2, false, false), 13);
    let all = vals(&unwindowed.forward(&x).unwrap());
    let late = |v: &[f32]| v[w * 24..].to_vec();
    let diff = late(&all)
        .iter()
        .zip(late(&full))
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff > 1e-2, "the window changed nothing ({diff})");
    // KV-cache steps past the window equal the full forward.
    let mut cache = LayerKvCache::new(1, 2, t, 8, sinter_core::DType::F32, Device::Cpu).unwrap();
    let mut steps = vals(
        &b.forward_step(&x.narrow(1, 0, 2).unwrap(), &mut cache)
            .unwrap(),
    );
    for p in 2..t {
        steps.extend(vals(
            &b.forward_step(&x.narrow(1, p, 1).unwrap(), &mut cache)
                .unwrap(),
        ));
    }
    assert_close("windowed steps vs full", &steps, &full, 1e-5);
}

/// y = W x + b for row-major W [out, inp], in f64.
fn affine(w: &[f32], b: Option<&[f32]>, x: &[f64], out: usize) -> Vec<f64> {
    let inp = x.len();
    (0..out)
        .map(|o| {
            let dot: f64 = (0..inp).map(|i| w[o * inp + i] as f64 * x[i]).sum();
            dot + b.map_or(0.0, |b| b[o] as f64)
        })
        .collect()
}

use sinter_core::kernels::bias_gelu::reference::gelu_tanh;

fn gelu_erf_f64(v: f64) -> f64 {
    // erf(z) = 2/√π · e^(−z²) · Σ (2z²)ⁿ z / (2n+1)!!: every term positive, so no
    // cancellation at any |z|; terms peak near n = z² and fall fast after it.
    let z = (v / std::f64::consts::SQRT_2).abs();
    let (mut term, mut sum) = (z, z);
    for n in 1..400 {
        term *= 2.0 * z * z / (2 * n + 1) as f64;
        sum += term;
    }
    let erf = (2.0 / std::f64::consts::PI.sqrt() * (-z * z).exp() * sum).copysign(v);
    0.5 * v * (1.0 + erf)
}

#[test]
fn a_geglu_mlp_is_gelu_of_the_gate_times_the_up_projection() {
    let cfg = BlockConfig {
        mlp: MlpKind::GeGlu,
        ..llama(4, false, false)
    };
    let b = block(&cfg, 15);
    let x = randn(&[1, 2, 24], &mut Rng::new(16));
    let y = vals(&b.mlp.forward(&x).unwrap());
    let (fc, proj) = (vals(&b.mlp.fc.weight), vals(&b.mlp.proj.weight));
    let n = cfg.mlp_hidden;
    for (r, row) in vals(&x).chunks(24).enumerate() {
        let row: Vec<f64> = row.iter().map(|&v| v as f64).collect();
        let h = affine(&fc, None, &row, 2 * n);
        let g: Vec<f64> = (0..n).map(|j| gelu_tanh(h[j]) * h[n + j]).collect();
        let want: Vec<f32> = affine(&proj, None, &g, 24)
            .iter()
            .map(|&v| v as f32)
            .collect();
        assert_close(&format!("row {r}"), &y[r * 24..(r + 1) * 24], &want, 1e-5);
    }
}

/// One row's LayerNorm in f64 (the op's one reference).
fn layer_norm_f64(x: &[f64], w: &[f32], b: &[f32], eps: f64) -> Vec<f64> {
    let wide = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<_>>();
    let (w, b) = (wide(w), wide(b));
    sinter_core::kernels::layer_norm::reference::forward(x, &w, &b, x.len(), eps).0
}

/// BERT's encoder layer in f64: LN(x + attn(x)) with bidirectional attention over the keys
/// `visible` marks, then LN(x1 + W2·GELU_erf(W1·x1)).
fn encoder_reference(b: &TransformerBlock, x: &[f32], t: usize, visible: &[bool]) -> Vec<f32> {
    let (c, h) = (24, 4);
    let d = c / h;
    let p = |t: &Tensor| vals(t);
    let (qkv_w, qkv_b) = (p(&b.attn.qkv.weight), p(b.attn.qkv.bias.as_ref().unwrap()));
    let rows: Vec<Vec<f64>> = (0..t)
        .map(|i| {
            let row: Vec<f64> = x[i * c..(i + 1) * c].iter().map(|&v| v as f64).collect();
            affine(&qkv_w, Some(&qkv_b), &row, 3 * c)
        })
        .collect();
    let ln = |n: &sinter_nn::Norm, v: &[f64]| {
        let l = n.as_layer_norm().unwrap();
        layer_norm_f64(v, &p(&l.weight), &p(&l.bias), l.eps as f64)
    };
    // Attention over the visible keys only (a masked key is one no query sees), in the
    // op's one f64 reference: [1, h, t, d] heads of the packed rows.
    let keys: Vec<usize> = (0..t).filter(|&j| visible[j]).collect();
    let heads = |which: usize, at: &[usize]| -> Vec<f64> {
        let mut v = Vec::with_capacity(h * at.len() * d);
        for head in 0..h {
            for &j in at {
                let col = which * c + head * d;
                v.extend_from_slice(&rows[j][col..col + d]);
            }
        }
        v
    };
    let all: Vec<usize> = (0..t).collect();
    let dims = attn_ref::Dims {
        bh: h,
        tq: t,
        tk: keys.len(),
        d,
    };
    let scale = 1.0 / (d as f64).sqrt();
    let (o, _) = attn_ref::forward(
        &heads(0, &all),
        &heads(1, &keys),
        &heads(2, &keys),
        dims,
        false,
        scale,
    );
    let mut out = Vec::new();
    for i in 0..t {
        let y: Vec<f64> = (0..c).map(|k| o[((k / d) * t + i) * d + k % d]).collect();
        let a = affine(
            &p(&b.attn.proj.weight),
            b.attn.proj.bias.as_ref().map(p).as_deref(),
            &y,
            c,
        );
        let sum: Vec<f64> = (0..c).map(|k| x[i * c + k] as f64 + a[k]).collect();
        let x1 = ln(&b.ln1, &sum);
        let hidden = b.mlp.fc.weight.shape()[0];
        let f = affine(
            &p(&b.mlp.fc.weight),
            b.mlp.fc.bias.as_ref().map(p).as_deref(),
            &x1,
            hidden,
        );
        let g: Vec<f64> = f.iter().map(|&v| gelu_erf_f64(v)).collect();
        let m = affine(
            &p(&b.mlp.proj.weight),
            b.mlp.proj.bias.as_ref().map(p).as_deref(),
            &g,
            c,
        );
        let sum2: Vec<f64> = (0..c).map(|k| x1[k] + m[k]).collect();
        out.extend(ln(&b.ln2, &sum2).iter().map(|&v| v as f32));
    }
    out
}

#[test]
fn the_encoder_configuration_is_bert_s_post_norm_bidirectional_layer() {
    let cfg = BlockConfig {
        mlp: MlpKind::GeluErf,
        norm_eps: 1e-12,
        causal: false,
        post_norm: true,
        ..BlockConfig::gpt2(24, 4, 2, 0.0)
    };
    let b = block(&cfg, 17);
    let t = 5;
    let x = randn(&[1, t, 24], &mut Rng::new(18));
    let want = encoder_reference(&b, &vals(&x), t, &[true; 5]);
    // The fast path (flash attention, not causal; fused residual + LayerNorm) and the
    // composite both.
    assert_close("fast", &vals(&b.forward(&x).unwrap()), &want, 1e-5);
    assert_close(
        "composite",
        &vals(&b.forward_composite(&x).unwrap()),
        &want,
        1e-5,
    );
    // Keys 3 and 4 are padding: no position sees them.
    let pad = Tensor::from_vec(vec![1i64, 1, 1, 0, 0], &[1, 1, 1, t], Device::Cpu)
        .unwrap()
        .logical_not()
        .unwrap();
    let masked = vals(&b.forward_masked(&x, Some(&pad)).unwrap());
    let want = encoder_reference(&b, &vals(&x), t, &[true, true, true, false, false]);
    assert_close("padded", &masked, &want, 1e-5);
    // Backward: the fast path's gradients equal the composite's, for every parameter.
    let fast = outcome(&b, &x, |b, x| b.forward(x).unwrap());
    let slow = outcome(&b, &x, |b, x| b.forward_composite(x).unwrap());
    assert_close("input grad", &fast.1, &slow.1, 1e-4);
    for ((n, g), (_, h)) in fast.2.iter().zip(&slow.2) {
        assert!(!g.is_empty(), "{n} got no gradient");
        assert_close(&format!("grad {n}"), g, h, 1e-4);
    }
    // An encoder has no KV-cache step.
    let mut cache = LayerKvCache::new(1, 4, 8, 6, sinter_core::DType::F32, Device::Cpu).unwrap();
    assert!(b.forward_step(&x, &mut cache).is_err());
}

/// y and the gradients of x and of the extra leaves, with a weighted-sum loss.
fn op_outcome(x0: &Tensor, leaves: &[&Tensor], f: impl Fn(&Tensor) -> Tensor) -> Outcome {
    for l in leaves {
        l.zero_grad();
    }
    let x = x0.to_var().unwrap();
    let y = f(&x);
    let w = randn(y.shape(), &mut Rng::new(99));
    y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
    let lg = leaves
        .iter()
        .map(|l| (String::new(), vals(&l.grad().unwrap())))
        .collect();
    (vals(&y), vals(&x.grad().unwrap()), lg)
}

fn assert_same_outcome(what: &str, fused: &Outcome, composite: &Outcome) {
    assert_close(&format!("{what}: output"), &fused.0, &composite.0, 2e-6);
    assert_close(&format!("{what}: input grad"), &fused.1, &composite.1, 1e-5);
    for ((_, g), (_, h)) in fused.2.iter().zip(&composite.2) {
        assert_close(&format!("{what}: weight grad"), g, h, 1e-5);
    }
}

/// The fused RMSNorm, rotation and SwiGLU kernels (f32 on the CPU) against their composites:
/// values and gradients, on one thread's worth of rows and on enough rows for the parallel
/// path (and several dw partial sums).
#[test]
fn fused_rms_norm_rope_and_swiglu_equal_their_composites() {
    let mut rng = Rng::new(11);
    for rows in [3usize, 130] {
        let x = randn(&[rows, 128], &mut rng);
        let n = RmsNorm {
            weight: randn(&[128], &mut rng).to_var().unwrap(),
            eps: 1e-5,
        };
        let w = [&n.weight];
        let fused = op_outcome(&x, &w, |x| n.forward(x).unwrap());
        let composite = op_outcome(&x, &w, |x| n.forward_composite(x).unwrap());
        assert_same_outcome(&format!("rms_norm, {rows} rows"), &fused, &composite);

        let h = randn(&[rows, 2, 96], &mut rng).mul_scalar(3.0).unwrap();
        let fused = op_outcome(&h, &[], |h| MlpKind::SwiGlu.activate(h).unwrap());
        let composite = op_outcome(&h, &[], |h| MlpKind::SwiGlu.activate_composite(h).unwrap());
        assert_same_outcome(&format!("swiglu, {rows} rows"), &fused, &composite);
        assert_eq!(fused.0.len(), rows * 96);
    }
    let rope = Rope::new(
        RopeConfig {
            theta: 10_000.0,
            scaling: RopeScaling::None,
        },
        32,
    )
    .unwrap();
    for (b, t, start) in [(1, 5, 0), (3, 64, 7)] {
        let q = randn(&[b, 4, t, 32], &mut rng);
        let fused = op_outcome(&q, &[], |q| rope.apply(q, start).unwrap());
        let composite = op_outcome(&q, &[], |q| rope.apply_with(q, start, true).unwrap());
        assert_same_outcome(&format!("rope, {b}×{t} from {start}"), &fused, &composite);
        // A packed projection [b, t, (4 + 2·2)·32]: q's 4 and k's 2 heads rotated, v's 2
        // passed through.
        let qkv = randn(&[b, t, 8 * 32], &mut rng);
        let fused = op_outcome(&qkv, &[], |x| rope.apply_packed(x, start, 6).unwrap());
        let composite = op_outcome(&qkv, &[], |x| {
            rope.apply_packed_with(x, start, 6, true).unwrap()
        });
        assert_same_outcome(
            &format!("packed rope, {b}×{t} from {start}"),
            &fused,
            &composite,
        );
        assert_eq!(
            &fused.0[6 * 32..8 * 32],
            &vals(&qkv)[6 * 32..8 * 32],
            "v untouched"
        );
    }
}

/// The fused residual + RMSNorm (one op: x + a and its norm) against the sum followed by the
/// composite norm: both outputs, and the gradients of x, a and the weight with a loss that
/// reads both outputs (so the sum's own gradient and the norm's meet in x and a). Widths with
/// a vector tail; 3 rows (one thread) and 130 (the parallel path, three dw partial sums).
#[test]
fn fused_residual_rms_norm_equals_the_sum_then_the_composite_norm() {
    use sinter_nn::Norm;
    let mut rng = Rng::new(13);
    for (rows, n) in [(3usize, 20usize), (130, 128)] {
        let x0 = randn(&[rows, n], &mut rng);
        let a0 = randn(&[rows, n], &mut rng).mul_scalar(0.5).unwrap();
        let weight = randn(&[n], &mut rng).to_var().unwrap();
        let norm = Norm::from_weights(NormKind::RmsNorm, weight.clone(), None, 1e-6).unwrap();
        let (ws, wy) = (randn(&[rows, n], &mut rng), randn(&[rows, n], &mut rng));
        let run = |fused: bool| -> [Vec<f32>; 5] {
            weight.zero_grad();
            let (x, a) = (x0.to_var().unwrap(), a0.to_var().unwrap());
            let (s, y) = if fused {
                norm.residual(&x, &a).unwrap()
            } else {
                let s = x.add(&a).unwrap();
                let y = norm.forward_composite(&s).unwrap();
                (s, y)
            };
            let loss = s.mul(&ws).unwrap().add(&y.mul(&wy).unwrap()).unwrap();
            loss.sum_all().unwrap().backward().unwrap();
            [
                &s,
                &y,
                &x.grad().unwrap(),
                &a.grad().unwrap(),
                &weight.grad().unwrap(),
            ]
            .map(vals)
        };
        let (fused, composite) = (run(true), run(false));
        let what = format!("residual rms_norm, {rows}×{n}");
        assert_eq!(fused[0], composite[0], "{what}: the sum");
        assert_close(&format!("{what}: output"), &fused[1], &composite[1], 2e-6);
        for (k, name) in [(2, "x"), (3, "a"), (4, "weight")] {
            assert_close(
                &format!("{what}: grad {name}"),
                &fused[k],
                &composite[k],
                1e-5,
            );
        }
        // The two gradient paths both arrive: x's gradient is not the sum's alone.
        assert!(fused[2]
            .iter()
            .zip(vals(&ws))
            .any(|(g, w)| (g - w).abs() > 1e-3));
    }
    // Mismatched x and a are an error naming the op, not a panic.
    let n = Norm::from_weights(NormKind::RmsNorm, randn(&[4], &mut rng), None, 1e-6).unwrap();
    let e = n
        .residual(&randn(&[2, 4], &mut rng), &randn(&[3, 4], &mut rng))
        .expect_err("shapes")
        .to_string();
    assert!(
        e.contains("residual_rms_norm") && e.contains("[3, 4]"),
        "{e}"
    );
}

/// Wrong shapes reach the fused kernels' checks as errors, not panics.
#[test]
fn fused_kernels_refuse_wrong_shapes() {
    let mut rng = Rng::new(12);
    let odd = randn(&[2, 7], &mut rng);
    let e = MlpKind::SwiGlu
        .activate(&odd)
        .expect_err("odd width")
        .to_string();
    assert!(e.contains("swiglu"), "{e}");
    let n = RmsNorm {
        weight: randn(&[5], &mut rng),
        eps: 1e-5,
    };
    let e = n
        .forward(&randn(&[2, 6], &mut rng))
        .expect_err("width")
        .to_string();
    assert!(e.contains("rms_norm"), "{e}");
    let rope = Rope::new(
        RopeConfig {
            theta: 10_000.0,
            scaling: RopeScaling::None,
        },
        32,
    )
    .unwrap();
    // 4 heads of 32 do not fit in 100 columns.
    let e = rope
        .apply_packed(&randn(&[2, 5, 100], &mut rng), 0, 4)
        .expect_err("too narrow")
        .to_string();
    assert!(e.contains("rope") && e.contains("100"), "{e}");
}

/// Under bf16 autocast a GPT-2 block carries its residual stream in bf16 (llm.c's activations:
/// sums and LayerNorms in bf16 with f32 statistics, f32 master parameters), tracks the f32
/// block within bf16's rounding, gives f32 parameter gradients, and recomputes (a checkpointed
/// block, whose backward runs outside the autocast region) exactly what it computed.
#[test]
fn a_bf16_autocast_block_keeps_a_bf16_residual_stream_and_tracks_f32() {
    use sinter_core::{amp, DType};
    use sinter_nn::recompute::block_forward;
    use std::sync::Arc;
    let b = Arc::new(block(&BlockConfig::gpt2(32, 4, 2, 0.0), 11));
    let x = randn(&[2, 8, 32], &mut Rng::new(12));
    let run = |mode: Recompute, autocast: bool| {
        outcome(&b, &x, |_, x| {
            let _ac = autocast.then(|| amp::autocast(DType::BF16));
            let y = block_forward(&b, x, mode, None).unwrap();
            assert_eq!(
                y.dtype(),
                if autocast { DType::BF16 } else { DType::F32 },
                "{mode:?}: the block's output (the residual stream)"
            );
            y
        })
    };
    let f32_run = run(Recompute::None, false);
    let bf16 = run(Recompute::None, true);
    assert_close("output", &bf16.0, &f32_run.0, 2e-2);
    assert_close("input grad", &bf16.1, &f32_run.1, 5e-2);
    for ((n, g), (_, h)) in bf16.2.iter().zip(&f32_run.2) {
        assert_close(&format!("grad {n}"), g, h, 5e-2);
    }
    for (n, p) in b.parameters() {
        assert_eq!(p.grad().unwrap().dtype(), DType::F32, "{n}'s gradient");
    }
    assert_eq!(
        run(Recompute::Block, true),
        bf16,
        "a recomputed block: the same values, under the forward's autocast"
    );
    // Recomputing the attention half casts the (f32) input twice, once per half, so its
    // gradient sums two bf16 gradients in f32 instead of in bf16: equal to bf16's rounding.
    let attn = run(Recompute::Attn, true);
    assert_eq!(attn.0, bf16.0, "recomputed attention: the output");
    assert_close("recomputed attention: input grad", &attn.1, &bf16.1, 1e-2);
    for ((n, g), (_, h)) in attn.2.iter().zip(&bf16.2) {
        assert_close(&format!("recomputed attention: grad {n}"), g, h, 1e-2);
    }
}
