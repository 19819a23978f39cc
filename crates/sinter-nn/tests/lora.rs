//! LoRA adapters on the decoder block: a packed layer's segment adapters equal adapters on
//! separate projections built by hand, merging folds the adapter in (same outputs), freezing
//! keeps the base out of the optimizer and bit-identical while the adapters learn.

use sinter_core::{DType, Device, Rng, Tensor};
use sinter_nn::lora::{self, LoraConfig, Segment};
use sinter_nn::module::shared_rng;
use sinter_nn::{
    AdamW, BlockConfig, Linear, MlpKind, Module, NormKind, Optimizer, RopeConfig, RopeScaling,
    TensorKind, TransformerBlock,
};

fn randn(shape: &[usize], rng: &mut Rng) -> Tensor {
    Tensor::randn(shape, 0.0, 1.0, rng, DType::F32, Device::Cpu).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (a.to_vec_f32().unwrap(), b.to_vec_f32().unwrap());
    a.iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// A small Llama block: grouped-query attention (q 32 rows, k and v 16 each), SwiGLU.
fn llama() -> BlockConfig {
    BlockConfig {
        n_kv_head: 2,
        head_dim: 8,
        mlp_hidden: 40,
        mlp: MlpKind::SwiGlu,
        norm: NormKind::RmsNorm,
        norm_eps: 1e-6,
        qkv_bias: false,
        out_bias: false,
        mlp_bias: false,
        qk_norm: false,
        rope: Some(RopeConfig {
            theta: 500.0,
            scaling: RopeScaling::None,
        }),
        ..BlockConfig::gpt2(32, 4, 2, 0.0)
    }
}

const CFG: LoraConfig = LoraConfig {
    rank: 4,
    alpha: 8.0,
    dropout: 0.0,
};

fn block_with(targets: &str, seed: u64) -> TransformerBlock {
    let b = TransformerBlock::new(&llama(), &mut Rng::new(seed), &shared_rng(seed)).unwrap();
    let re: Vec<String> = targets.split('|').map(|s| format!(".{s}")).collect();
    let wanted = |n: &str| re.iter().any(|s| n.ends_with(s.as_str()));
    lora::install(
        &[&b],
        &wanted,
        &CFG,
        &mut Rng::new(seed + 1),
        &shared_rng(0),
    )
    .unwrap();
    b
}

/// Gives every B random values (a fresh B is zero, which would hide a wrong layout).
fn randomize_b(m: &dyn Module, seed: u64) {
    let mut rng = Rng::new(seed);
    for (n, t) in m.parameters() {
        if n.ends_with(".B") {
            t.assign(&randn(t.shape(), &mut rng).mul_scalar(0.5).unwrap())
                .unwrap();
        }
    }
}

#[test]
fn packed_segments_equal_separate_projections() {
    let b = block_with("q_proj|v_proj|up_proj", 3);
    randomize_b(&b, 4);
    let x = randn(&[2, 5, 32], &mut Rng::new(5));
    let scale = CFG.scale();
    // Each projection by hand: its own rows of W, plus its own adapter when it has one.
    let by_hand = |layer: &Linear, rows: std::ops::Range<usize>, seg: Option<&Segment>| {
        let w = layer.weight.narrow(0, rows.start, rows.len()).unwrap();
        let y = x.matmul(&w.t().unwrap()).unwrap();
        match seg {
            Some(s) => {
                let d = x.matmul(&s.a.t().unwrap()).unwrap();
                let d = d.matmul(&s.b.t().unwrap()).unwrap();
                y.add(&d.mul_scalar(scale).unwrap()).unwrap()
            }
            None => y,
        }
    };
    for (layer, names) in [
        (&b.attn.qkv, &["q_proj", "k_proj", "v_proj"][..]),
        (&b.mlp.fc, &["gate_proj", "up_proj"][..]),
    ] {
        let adapter = layer.lora.get().expect("an adapter on the packed layer");
        let projs = lora::projections(&b);
        let parts: Vec<Tensor> = names
            .iter()
            .map(|n| {
                let p = projs.iter().find(|p| p.short() == *n).unwrap();
                let seg = adapter.segments.iter().find(|s| s.name == *n);
                by_hand(layer, p.rows.clone(), seg)
            })
            .collect();
        let want = Tensor::cat(&parts, 2).unwrap();
        let got = layer.forward(&x).unwrap();
        let d = max_diff(&got, &want);
        assert!(d < 1e-4, "{names:?}: packed adapter differs by {d}");
        // The adapter really changes the covered rows (not a vacuous comparison).
        assert!(max_diff(&got, &layer.forward_base(&x).unwrap()) > 1e-2);
    }
    assert!(b.attn.proj.lora.get().is_none() && b.mlp.proj.lora.get().is_none());
}

fn layers(t: &TransformerBlock) -> [&Linear; 4] {
    [&t.attn.qkv, &t.attn.proj, &t.mlp.fc, &t.mlp.proj]
}

#[test]
fn merged_weights_equal_the_adapter() {
    let b = block_with("q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj", 7);
    randomize_b(&b, 8);
    let x = randn(&[2, 6, 32], &mut Rng::new(9));
    let with_adapter = b.forward(&x).unwrap();
    let plain = TransformerBlock::new(&llama(), &mut Rng::new(7), &shared_rng(7)).unwrap();
    for (mine, theirs) in layers(&b).into_iter().zip(layers(&plain)) {
        let merged = mine.lora.get().unwrap().merged(&mine.weight).unwrap();
        theirs.weight.assign(&merged).unwrap();
    }
    let merged_out = plain.forward(&x).unwrap();
    let d = max_diff(&merged_out, &with_adapter);
    assert!(d < 1e-5, "merged block differs from the adapter by {d}");
    assert!(max_diff(&with_adapter, &b.forward(&x).unwrap()) == 0.0);
}

#[test]
fn frozen_base_stays_bit_identical_while_the_loss_falls() {
    let b = block_with("q_proj|v_proj", 11);
    let frozen = lora::freeze_base(&b);
    let named = b.named_tensors();
    let base: Vec<(String, Vec<f32>)> = named
        .iter()
        .filter(|t| t.kind == TensorKind::Frozen)
        .map(|t| (t.name.clone(), t.tensor.to_vec_f32().unwrap()))
        .collect();
    assert_eq!(base.len(), frozen);
    assert!(frozen >= 5, "norms and every projection are frozen");
    let params = b.parameters();
    assert!(!params.is_empty() && params.iter().all(|(n, _)| lora::is_adapter_name(n)));
    assert_eq!(params.len(), 4, "A and B of q_proj and v_proj: {params:?}");

    let mut rng = Rng::new(12);
    let x = randn(&[2, 6, 32], &mut rng);
    let target = randn(&[2, 6, 32], &mut rng);
    let mut opt = AdamW::new(params, 5e-2, 0.0).unwrap();
    let mut losses = Vec::new();
    for _ in 0..20 {
        let loss = b.forward(&x).unwrap().mse_loss(&target).unwrap();
        losses.push(loss.to_scalar_f32().unwrap());
        b.zero_grad();
        loss.backward().unwrap();
        opt.step().unwrap();
    }
    assert!(
        losses[19] < 0.9 * losses[0],
        "loss did not fall: {losses:?}"
    );
    for t in b.named_tensors() {
        if t.kind == TensorKind::Frozen {
            assert!(t.tensor.grad().is_none(), "{} kept a gradient", t.name);
            let before = &base.iter().find(|(n, _)| *n == t.name).unwrap().1;
            let now = t.tensor.to_vec_f32().unwrap();
            assert!(
                before
                    .iter()
                    .zip(&now)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{} changed",
                t.name
            );
        }
    }
}

#[test]
fn bad_adapters_are_refused() {
    let a = Tensor::zeros(&[4, 32], DType::F32, Device::Cpu).unwrap();
    let b = Tensor::zeros(&[16, 3], DType::F32, Device::Cpu).unwrap();
    let e = Segment::new("v_proj", 0..16, a, b).unwrap_err().to_string();
    assert!(e.contains("v_proj") && e.contains("lora_B"), "{e}");
    let bad = LoraConfig { rank: 0, ..CFG };
    assert!(bad.check().is_err());
    let blk = TransformerBlock::new(&llama(), &mut Rng::new(1), &shared_rng(1)).unwrap();
    let none = |_: &str| false;
    let e = lora::install(&[&blk], &none, &CFG, &mut Rng::new(1), &shared_rng(1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no projection matches"), "{e}");
}

#[test]
fn qlora_base_input_gradient_equals_the_dequantized_f32_path() {
    use sinter_nn::lora::FrozenInt8;
    use sinter_nn::quant::{Activation, QuantState};
    let mut rng = Rng::new(21);
    // 300 outputs: more than one backward tile, the last one partial.
    let w = randn(&[300, 48], &mut rng).mul_scalar(0.1).unwrap();
    let form = FrozenInt8::from_f32(&w, None).unwrap();
    let deq = form.weight().dequantized().unwrap();
    let x = randn(&[2, 3, 48], &mut rng).to_var().unwrap();
    let g = randn(&[2, 3, 300], &mut rng);
    let y = sinter_nn::quant::slot::Int8Layer::forward(&form, &x, Activation::None).unwrap();
    y.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
    let dx = x.grad().unwrap();
    let x2 = x.detach().to_var().unwrap();
    let y2 = x2.matmul(&deq.t().unwrap()).unwrap();
    y2.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
    let want = x2.grad().unwrap();
    let d = max_diff(&dx, &want);
    assert!(
        d < 1e-4,
        "QLoRA dX differs from the dequantized path by {d}"
    );
    // The int8 forward is close to the f32 one (activations are quantized too).
    let peak = y2
        .to_vec_f32()
        .unwrap()
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()));
    let rel = max_diff(&y, &y2) / peak;
    assert!(rel < 0.05, "int8 forward off by {rel}");

    // On a block: the base int8 and frozen, adapters on top still learn.
    let b = block_with("q_proj|v_proj|down_proj", 23);
    for l in layers(&b) {
        let f = FrozenInt8::from_f32(&l.weight, l.bias.as_ref()).unwrap();
        l.quant.set(QuantState::Int8(std::sync::Arc::new(f)));
    }
    lora::freeze_base(&b);
    let x = randn(&[2, 6, 32], &mut rng).to_var().unwrap();
    let target = randn(&[2, 6, 32], &mut rng);
    let mut opt = AdamW::new(b.parameters(), 5e-2, 0.0).unwrap();
    let mut losses = Vec::new();
    for _ in 0..20 {
        let loss = b.forward(&x).unwrap().mse_loss(&target).unwrap();
        losses.push(loss.to_scalar_f32().unwrap());
        b.zero_grad();
        x.zero_grad();
        loss.backward().unwrap();
        opt.step().unwrap();
    }
    assert!(
        losses[19] < 0.9 * losses[0],
        "QLoRA loss did not fall: {losses:?}"
    );
    assert!(
        x.grad().is_some(),
        "no gradient reached the block's input through the int8 base"
    );
}

/// The GGML-block base (4-bit QLoRA): for each format, dX equals dY · W of the dequantized
/// weight, the forward is close to the f32 product, a slot holding an inference-only
/// `GgmlLinear` (as a GGUF file loads) becomes one that passes gradients, and a width that
/// is not whole blocks is refused by name.
#[test]
fn qlora_ggml_base_input_gradient_equals_the_dequantized_f32_path() {
    use sinter_cpu::ggml_quant::GgmlType;
    use sinter_nn::lora::FrozenGgml;
    use sinter_nn::quant::slot::Int8Layer;
    use sinter_nn::quant::{Activation, GgmlLinear, QuantSlot, QuantState};
    let mut rng = Rng::new(31);
    let w = randn(&[300, 256], &mut rng).mul_scalar(0.1).unwrap();
    let x0 = randn(&[2, 3, 256], &mut rng);
    let g = randn(&[2, 3, 300], &mut rng);
    for (ty, bound) in [
        (GgmlType::Q8_0, 0.02),
        (GgmlType::Q4_0, 0.1),
        (GgmlType::Q4_1, 0.1),
        (GgmlType::Q4_K, 0.1),
    ] {
        let form = FrozenGgml::from_f32(&w, None, ty).unwrap();
        assert!(form.frozen_base());
        let mut deq = vec![0f32; 300 * 256];
        for (r, row) in deq.chunks_exact_mut(256).enumerate() {
            form.weight().dequantize_row(r, row).unwrap();
        }
        let deq = Tensor::from_vec(deq, &[300, 256], Device::Cpu).unwrap();
        let x = x0.to_var().unwrap();
        let y = form.forward(&x, Activation::None).unwrap();
        y.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
        let x2 = x0.to_var().unwrap();
        let y2 = x2.matmul(&deq.t().unwrap()).unwrap();
        y2.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
        let d = max_diff(&x.grad().unwrap(), &x2.grad().unwrap());
        assert!(
            d < 1e-4,
            "{ty}: dX differs from the dequantized path by {d}"
        );
        let peak = y2
            .to_vec_f32()
            .unwrap()
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()));
        let rel = max_diff(&y, &y2) / peak;
        assert!(rel < bound, "{ty}: forward off by {rel}");
    }
    // A GGUF-loaded slot (inference form) turned into the trainable base.
    let slot = QuantSlot::default();
    let m = FrozenGgml::from_f32(&w, None, GgmlType::Q4_0)
        .unwrap()
        .weight()
        .clone();
    slot.set(QuantState::Int8(std::sync::Arc::new(
        GgmlLinear::new(m, None).unwrap(),
    )));
    assert!(!slot.int8().unwrap().frozen_base());
    assert!(lora::freeze_ggml_slot(&slot));
    let layer = slot.int8().unwrap();
    assert!(layer.frozen_base());
    let x = x0.to_var().unwrap();
    let y = layer.forward(&x, Activation::None).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    assert!(
        x.grad().is_some(),
        "no gradient through the frozen GGML base"
    );
    assert!(!lora::freeze_ggml_slot(&QuantSlot::default()));
    // 48 columns are not whole Q4_K blocks of 256.
    let narrow = randn(&[8, 48], &mut rng);
    let e = FrozenGgml::from_f32(&narrow, None, GgmlType::Q4_K)
        .err()
        .expect("48 columns as Q4_K")
        .to_string();
    assert!(e.contains("Q4_K") && e.contains("[8, 48]"), "{e}");
}
