//! GPT-2 weights in Hugging Face's safetensors layout: round trip, names and layouts, and the
//! errors for a wrong shape, a missing tensor, an untied head and unexpected tensors.

use std::collections::HashMap;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use sinter_core::{Device, Rng, Tensor};
use sinter_models::hf_gpt2::{
    hf_gpt2_bytes, hf_gpt2_config_json, hf_gpt2_name, load_hf_gpt2_bytes,
};
use sinter_models::{hf_gpt2_config, load_hf_gpt2, save_hf_gpt2, Decoder, DecoderConfig};
use sinter_nn::module::shared_rng;
use sinter_nn::Module;

fn config() -> DecoderConfig {
    DecoderConfig {
        n_layer: 2,
        n_head: 2,
        n_embd: 32,
        block_size: 16,
        vocab_size: 50,
        ..DecoderConfig::preset("gpt-tiny").unwrap()
    }
}

fn model(seed: u64) -> Decoder {
    let m = Decoder::new(config(), &mut Rng::new(seed), &shared_rng(seed)).unwrap();
    m.set_training(false);
    m
}

fn logits(m: &Decoder) -> Vec<f32> {
    let ids: Vec<i64> = (0..24).map(|i| (i * 7 % 50) as i64).collect();
    m.forward(&Tensor::from_slice(&ids, &[2, 12], Device::Cpu).unwrap())
        .unwrap()
        .to_vec_f32()
        .unwrap()
}

fn weights(m: &Decoder) -> Vec<Vec<f32>> {
    m.parameters()
        .iter()
        .map(|(_, t)| t.to_vec_f32().unwrap())
        .collect()
}

/// A safetensors file with `edit` applied to the HF tensors of `m` (name → Some(tensor) to
/// replace or add, None to remove), keys without the `transformer.` prefix.
fn edited(m: &Decoder, edit: &[(&str, Option<Tensor>)]) -> Vec<u8> {
    let bytes = hf_gpt2_bytes(m).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            (
                n.trim_start_matches("transformer.").to_string(),
                v.shape().to_vec(),
                v.data().to_vec(),
            )
        })
        .collect();
    for (name, t) in edit {
        tensors.retain(|(n, _, _)| n != name);
        if let Some(t) = t {
            tensors.push((
                name.to_string(),
                t.shape().to_vec(),
                t.to_le_bytes().unwrap(),
            ));
        }
    }
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize(views, &None).unwrap()
}

#[test]
fn names_map_to_hugging_face() {
    assert_eq!(
        hf_gpt2_name("wte.weight"),
        Some(("wte.weight".into(), false))
    );
    assert_eq!(
        hf_gpt2_name("blocks.3.ln1.bias"),
        Some(("h.3.ln_1.bias".into(), false))
    );
    assert_eq!(
        hf_gpt2_name("blocks.0.attn.qkv.weight"),
        Some(("h.0.attn.c_attn.weight".into(), true))
    );
    assert_eq!(
        hf_gpt2_name("blocks.0.attn.qkv.bias"),
        Some(("h.0.attn.c_attn.bias".into(), false))
    );
    assert_eq!(
        hf_gpt2_name("blocks.11.mlp.proj.weight"),
        Some(("h.11.mlp.c_proj.weight".into(), true))
    );
    assert_eq!(hf_gpt2_name("blocks.x.ln1.bias"), None);
    assert_eq!(hf_gpt2_name("head.weight"), None);
    // Every tensor of GPT-2 small maps, to 12·12 + 4 distinct names.
    let g = Decoder::new(
        DecoderConfig::preset("gpt2").unwrap(),
        &mut Rng::new(0),
        &shared_rng(0),
    )
    .unwrap();
    let names: std::collections::HashSet<String> = g
        .named_tensors()
        .iter()
        .map(|t| hf_gpt2_name(&t.name).unwrap().0)
        .collect();
    assert_eq!(names.len(), 12 * 12 + 4);
}

#[test]
fn round_trip_gives_identical_logits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let a = model(1);
    save_hf_gpt2(&a, &path).unwrap();
    // The file is in HF's layout: prefixed names, Conv1D weights [in, out], format = pt.
    let bytes = std::fs::read(&path).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(
        meta.metadata()
            .as_ref()
            .unwrap()
            .get("format")
            .map(String::as_str),
        Some("pt")
    );
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.len(), 2 * 12 + 4);
    let c_attn = st.tensor("transformer.h.1.attn.c_attn.weight").unwrap();
    assert_eq!(c_attn.shape(), &[32, 96]);
    let qkv = a
        .named_tensors()
        .into_iter()
        .find(|t| t.name == "blocks.1.attn.qkv.weight")
        .unwrap()
        .tensor;
    let qkv_t = qkv
        .t()
        .unwrap()
        .contiguous()
        .unwrap()
        .to_le_bytes()
        .unwrap();
    assert_eq!(c_attn.data(), qkv_t.as_slice());
    assert_eq!(
        st.tensor("transformer.h.0.mlp.c_fc.weight")
            .unwrap()
            .shape(),
        &[32, 128]
    );
    assert_eq!(
        st.tensor("transformer.h.0.mlp.c_proj.weight")
            .unwrap()
            .shape(),
        &[128, 32]
    );
    assert_eq!(
        st.tensor("transformer.wte.weight").unwrap().shape(),
        &[50, 32]
    );
    assert!(st.tensor("lm_head.weight").is_err());

    let b = model(2);
    assert_ne!(logits(&a), logits(&b));
    load_hf_gpt2(&path, &b).unwrap();
    assert_eq!(logits(&a), logits(&b));
    assert_eq!(weights(&a), weights(&b));

    // The config comes back from the file.
    let c = hf_gpt2_config(&path, None).unwrap();
    assert_eq!(
        (c.n_layer, c.n_head, c.n_embd, c.block_size, c.vocab_size),
        (2, 2, 32, 16, 50)
    );
    let json = hf_gpt2_config_json(&c);
    assert!(
        json.contains("\"n_head\": 2")
            && json.contains("\"vocab_size\": 50")
            && json.contains("gelu_new")
    );
    // Without n_head metadata (as save_pretrained writes), the head count comes from a
    // config.json beside the file, else from width / 64.
    let bare = dir.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    std::fs::write(bare.join("model.safetensors"), edited(&a, &[])).unwrap();
    assert_eq!(
        hf_gpt2_config(bare.join("model.safetensors"), None)
            .unwrap()
            .n_head,
        1
    );
    assert_eq!(
        hf_gpt2_config(bare.join("model.safetensors"), Some(4))
            .unwrap()
            .n_head,
        4
    );
    std::fs::write(bare.join("config.json"), &json).unwrap();
    assert_eq!(
        hf_gpt2_config(bare.join("model.safetensors"), None)
            .unwrap()
            .n_head,
        2
    );
}

#[test]
fn unprefixed_files_with_buffers_and_a_tied_head_load() {
    let a = model(3);
    let wte = a.wte.weight.clone();
    let mask = Tensor::ones(&[1, 1, 16, 16], sinter_core::DType::F32, Device::Cpu).unwrap();
    let bytes = edited(
        &a,
        &[
            ("h.0.attn.bias", Some(mask.clone())),
            ("h.1.attn.masked_bias", Some(Tensor::scalar(-1e4))),
            ("lm_head.weight", Some(wte)),
        ],
    );
    let b = model(4);
    load_hf_gpt2_bytes(&bytes, &b).unwrap();
    assert_eq!(logits(&a), logits(&b));
}

#[test]
fn a_wrong_shape_is_named_with_both_shapes_and_changes_nothing() {
    let a = model(5);
    let wrong = Tensor::zeros(&[32, 95], sinter_core::DType::F32, Device::Cpu).unwrap();
    let bytes = edited(&a, &[("h.1.attn.c_attn.weight", Some(wrong))]);
    let b = model(6);
    let before = weights(&b);
    let err = load_hf_gpt2_bytes(&bytes, &b).unwrap_err().to_string();
    assert!(
        err.contains("h.1.attn.c_attn.weight")
            && err.contains("[32, 95]")
            && err.contains("[32, 96]"),
        "{err}"
    );
    assert!(
        err.contains("blocks.1.attn.qkv.weight") && err.contains("[96, 32]"),
        "{err}"
    );
    assert_eq!(
        weights(&b),
        before,
        "a failed load must leave the model as it was"
    );
}

#[test]
fn a_missing_tensor_is_named() {
    let a = model(7);
    let bytes = edited(&a, &[("h.0.ln_2.bias", None)]);
    let err = load_hf_gpt2_bytes(&bytes, &model(8))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("h.0.ln_2.bias")
            && err.contains("blocks.0.ln2.bias")
            && err.contains("missing"),
        "{err}"
    );
    // Through the file path, the error also names the file.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("broken.safetensors");
    std::fs::write(&p, &bytes).unwrap();
    let err = load_hf_gpt2(&p, &model(8)).unwrap_err().to_string();
    assert!(
        err.contains("broken.safetensors") && err.contains("h.0.ln_2.bias"),
        "{err}"
    );
    let err = load_hf_gpt2(dir.path().join("nope.safetensors"), &model(8))
        .unwrap_err()
        .to_string();
    assert!(err.contains("nope.safetensors"), "{err}");
}

#[test]
fn untied_heads_and_extra_layers_are_refused() {
    let a = model(9);
    let other = Tensor::ones(&[50, 32], sinter_core::DType::F32, Device::Cpu).unwrap();
    let err = load_hf_gpt2_bytes(&edited(&a, &[("lm_head.weight", Some(other))]), &model(10))
        .unwrap_err()
        .to_string();
    assert!(err.contains("lm_head.weight"), "{err}");
    // A file with three layers for a two-layer model.
    let big = Decoder::new(
        DecoderConfig {
            n_layer: 3,
            ..config()
        },
        &mut Rng::new(0),
        &shared_rng(0),
    )
    .unwrap();
    let err = load_hf_gpt2_bytes(&hf_gpt2_bytes(&big).unwrap(), &model(10))
        .unwrap_err()
        .to_string();
    assert!(err.contains("unexpected") && err.contains("h.2."), "{err}");
    // Half-precision files load (cast to the model's f32).
    let mut half: HashMap<String, (Vec<usize>, Vec<u8>)> = HashMap::new();
    let st_bytes = hf_gpt2_bytes(&a).unwrap();
    let st = SafeTensors::deserialize(&st_bytes).unwrap();
    for (n, v) in st.tensors() {
        let t = Tensor::from_le_bytes(v.data(), sinter_core::DType::F32, v.shape(), Device::Cpu)
            .unwrap()
            .to_dtype(sinter_core::DType::BF16)
            .unwrap();
        half.insert(n, (v.shape().to_vec(), t.to_le_bytes().unwrap()));
    }
    let views: Vec<(String, TensorView)> = half
        .iter()
        .map(|(n, (s, b))| {
            (
                n.clone(),
                TensorView::new(Dtype::BF16, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let b = model(11);
    load_hf_gpt2_bytes(&safetensors::serialize(views, &None).unwrap(), &b).unwrap();
    let (la, lb) = (logits(&a), logits(&b));
    let max_ref = la.iter().fold(0f32, |m, x| m.max(x.abs()));
    let err = la
        .iter()
        .zip(&lb)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(
        err > 0.0 && err < 0.05 * max_ref.max(1.0),
        "bf16 weights: max difference {err}"
    );
}
