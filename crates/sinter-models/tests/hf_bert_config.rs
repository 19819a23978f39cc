//! BERT's Hugging Face `config.json` (issue 14): read as `transformers.BertConfig` reads it
//! (its defaults for missing keys), refused clearly where sinter cannot honour it, and applied
//! when loading weights with `from_hf_pretrained` (activation, dropout, padding token).

use sinter_core::{DType, Device, Rng, Tensor};
use sinter_models::bert::HiddenAct;
use sinter_models::{
    bert_config_from_hf_json, from_hf_pretrained, hf_bert_config_json, save_hf_bert, Bert,
    BertConfig,
};
use sinter_nn::module::shared_rng;
use sinter_nn::Module;
#[path = "../../../tests/support/real_weights.rs"]
mod real_weights;

/// The `config.json` published with `google-bert/bert-base-uncased`.
const BERT_BASE_UNCASED: &str = r#"{
  "architectures": ["BertForMaskedLM"],
  "attention_probs_dropout_prob": 0.1,
  "gradient_checkpointing": false,
  "hidden_act": "gelu",
  "hidden_dropout_prob": 0.1,
  "hidden_size": 768,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "layer_norm_eps": 1e-12,
  "max_position_embeddings": 512,
  "model_type": "bert",
  "num_attention_heads": 12,
  "num_hidden_layers": 12,
  "pad_token_id": 0,
  "position_embedding_type": "absolute",
  "transformers_version": "4.6.0.dev0",
  "type_vocab_size": 2,
  "use_cache": true,
  "vocab_size": 30522
}"#;

fn parse(json: &str) -> sinter_core::Result<BertConfig> {
    bert_config_from_hf_json(json, "config.json")
}

#[test]
fn bert_base_uncased_reads_as_the_bert_base_preset_with_its_padding_token() {
    let c = parse(BERT_BASE_UNCASED).unwrap();
    let want = BertConfig {
        pad_token_id: Some(0),
        ..BertConfig::preset("bert-base").unwrap()
    };
    assert_eq!(c, want);
    assert_eq!(c.hidden_act, HiddenAct::Gelu);
    // Missing keys take transformers.BertConfig's defaults (which are bert-base's).
    assert_eq!(parse("{}").unwrap(), want);
}

#[test]
fn each_setting_is_read() {
    let c = parse(
        r#"{"hidden_act": "gelu_new", "hidden_size": 64, "num_attention_heads": 4,
            "num_hidden_layers": 3, "intermediate_size": 100, "vocab_size": 99,
            "max_position_embeddings": 40, "type_vocab_size": 3, "hidden_dropout_prob": 0.25,
            "attention_probs_dropout_prob": 0.0, "layer_norm_eps": 1e-5, "pad_token_id": null}"#,
    )
    .unwrap();
    let want = BertConfig {
        vocab_size: 99,
        hidden: 64,
        n_layer: 3,
        n_head: 4,
        intermediate: 100,
        max_position: 40,
        type_vocab_size: 3,
        dropout: 0.25,
        attention_dropout: 0.0,
        layer_norm_eps: 1e-5,
        hidden_act: HiddenAct::GeluTanh,
        pad_token_id: None,
    };
    assert_eq!(c, want);
    for (name, act) in [
        ("gelu", HiddenAct::Gelu),
        ("gelu_pytorch_tanh", HiddenAct::GeluTanh),
        ("gelu_fast", HiddenAct::GeluTanh),
        ("relu", HiddenAct::Relu),
        ("swish", HiddenAct::Silu),
    ] {
        let c = parse(&format!(r#"{{"hidden_act": "{name}"}}"#)).unwrap();
        assert_eq!(c.hidden_act, act, "{name}");
    }
    // What sinter writes reads back the same.
    assert_eq!(parse(&hf_bert_config_json(&want)).unwrap(), want);
    let base = BertConfig::preset("bert-base").unwrap();
    assert_eq!(parse(&hf_bert_config_json(&base)).unwrap(), base);
}

#[test]
fn what_sinter_cannot_honour_is_refused_with_the_key() {
    for (json, words) in [
        (
            r#"{"hidden_act": "quick_gelu"}"#,
            "hidden_act \"quick_gelu\"",
        ),
        (r#"{"model_type": "roberta"}"#, "model_type is \"roberta\""),
        (
            r#"{"position_embedding_type": "relative_key"}"#,
            "position_embedding_type \"relative_key\"",
        ),
        (r#"{"is_decoder": true}"#, "is_decoder"),
        (
            r#"{"hidden_size": "768"}"#,
            "hidden_size must be a whole number",
        ),
        (
            r#"{"num_hidden_layers": -1}"#,
            "num_hidden_layers must be a whole number",
        ),
        (
            r#"{"hidden_dropout_prob": 1.5}"#,
            "hidden_dropout_prob must be in [0, 1)",
        ),
        (
            r#"{"layer_norm_eps": 0}"#,
            "layer_norm_eps must be a positive number",
        ),
        ("[1, 2]", "expected a JSON object"),
        ("{\"vocab_size\": 3", "not valid JSON"),
    ] {
        let err = parse(json).expect_err("an error").to_string();
        assert!(err.starts_with("config.json"), "{json}: {err}");
        assert!(err.contains(words), "{json}: {err}");
    }
}

fn tiny(act: HiddenAct, pad: Option<usize>) -> BertConfig {
    BertConfig {
        vocab_size: 20,
        hidden: 16,
        n_layer: 1,
        n_head: 2,
        intermediate: 32,
        max_position: 8,
        type_vocab_size: 2,
        dropout: 0.0,
        attention_dropout: 0.0,
        layer_norm_eps: 1e-12,
        hidden_act: act,
        pad_token_id: pad,
    }
}

/// A directory written like `save_pretrained` loads back with its config: the tanh GELU and
/// the padding token of the config are used (the logits equal the source model's and differ
/// from an exact-GELU model's with the same weights), and the [PAD] row gets no gradient from
/// the embedding lookup (as `nn.Embedding(padding_idx=...)`; the tied MLM decoder still trains
/// it, in PyTorch too).
#[test]
fn from_hf_pretrained_applies_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny(HiddenAct::GeluTanh, Some(1));
    let src = Bert::new(cfg.clone(), &mut Rng::new(7), &shared_rng(0)).unwrap();
    save_hf_bert(&src, dir.path().join("model.safetensors")).unwrap();
    std::fs::write(dir.path().join("config.json"), hf_bert_config_json(&cfg)).unwrap();

    let loaded = from_hf_pretrained(dir.path(), &shared_rng(0)).unwrap();
    assert_eq!(loaded.config, cfg);
    // The weights file alone finds its config.json beside it.
    let by_file = from_hf_pretrained(dir.path().join("model.safetensors"), &shared_rng(0)).unwrap();
    assert_eq!(by_file.config, cfg);
    let ids = Tensor::from_slice(&[3i64, 1, 5, 1, 9, 2], &[1, 6], Device::Cpu).unwrap();
    let logits = |m: &Bert| m.forward(&ids).unwrap().to_vec_f32().unwrap();
    assert_eq!(logits(&loaded), logits(&src));
    // The same weights under the exact GELU give other logits: the activation matters.
    let erf = Bert::new(
        tiny(HiddenAct::Gelu, Some(1)),
        &mut Rng::new(8),
        &shared_rng(0),
    )
    .unwrap();
    for (a, b) in erf.named_tensors().iter().zip(src.named_tensors()) {
        a.tensor.assign(&b.tensor).unwrap();
    }
    assert_ne!(logits(&erf), logits(&loaded));

    // Weighted: the sum of a layer norm's outputs would not depend on its input.
    let w = Tensor::arange(0.0, 96.0, 1.0, DType::F32, Device::Cpu)
        .unwrap()
        .reshape(&[1, 6, 16])
        .unwrap();
    loaded
        .embeddings
        .forward(&ids, None)
        .unwrap()
        .mul(&w)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let g = loaded.embeddings.word_embeddings.weight.grad().unwrap();
    let rows = g.to_vec_f32().unwrap();
    assert!(
        rows[16..32].iter().all(|&v| v == 0.0),
        "the [PAD] row has a gradient"
    );
    assert!(
        rows[3 * 16..4 * 16].iter().any(|&v| v != 0.0),
        "token 3 has none"
    );
}

#[test]
fn from_hf_pretrained_needs_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let src = Bert::new(
        tiny(HiddenAct::Gelu, None),
        &mut Rng::new(1),
        &shared_rng(0),
    )
    .unwrap();
    save_hf_bert(&src, dir.path().join("model.safetensors")).unwrap();
    let err = from_hf_pretrained(dir.path(), &shared_rng(0))
        .err()
        .expect("an error")
        .to_string();
    assert!(err.contains("no config.json"), "{err}");
}

/// An encoder-only BERT (`BertModel`, no MLM head) round-trips through save_hf_bert (its names
/// without the `bert.` prefix) and from_hf_pretrained, which builds it without a head; asking
/// it for MLM logits is an error that says why.
#[test]
fn an_encoder_only_bert_saves_loads_and_refuses_mlm() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny(HiddenAct::Gelu, Some(0));
    let src = Bert::encoder_only(cfg.clone(), &mut Rng::new(5), &shared_rng(0)).unwrap();
    src.set_training(false);
    save_hf_bert(&src, dir.path().join("model.safetensors")).unwrap();
    let json = hf_bert_config_json(&cfg).replace("BertForMaskedLM", "BertModel");
    std::fs::write(dir.path().join("config.json"), &json).unwrap();
    let loaded = from_hf_pretrained(dir.path(), &shared_rng(0)).unwrap();
    loaded.set_training(false);
    assert!(loaded.head.is_none());
    let ids = Tensor::from_vec(vec![3i64, 7, 1, 9, 2, 4], &[1, 6], Device::Cpu).unwrap();
    let (a, b) = (
        src.embed(&ids, None, true).unwrap().to_vec_f32().unwrap(),
        loaded
            .embed(&ids, None, true)
            .unwrap()
            .to_vec_f32()
            .unwrap(),
    );
    assert_eq!(a, b);
    let e = loaded.forward(&ids).expect_err("no MLM head").to_string();
    assert!(e.contains("masked-LM head"), "{e}");
    // The same file under a config that declares the MLM model: the head is missing.
    std::fs::write(dir.path().join("config.json"), hf_bert_config_json(&cfg)).unwrap();
    let e = from_hf_pretrained(dir.path(), &shared_rng(0))
        .err()
        .expect("the head is missing")
        .to_string();
    assert!(
        e.contains("cls.predictions") && e.contains("missing"),
        "{e}"
    );
    // Another BERT head is refused by name.
    std::fs::write(
        dir.path().join("config.json"),
        json.replace("BertModel", "BertForSequenceClassification"),
    )
    .unwrap();
    let e = from_hf_pretrained(dir.path(), &shared_rng(0))
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("BertForSequenceClassification"), "{e}");
}

/// The real all-MiniLM-L6-v2 (a BertModel in safetensors) embeds four sentences, padded to
/// one batch, as sentence-transformers does (mean over real tokens, unit length): equal to
/// transformers' fp32 embeddings (tests/fixtures/minilm_ref.json, from
/// bench/llm/minilm_ref.py) within 1e-5 per element, with the token ids of its tokenizer.json
/// equal to the tokenizers library's.
#[test]
fn minilm_sentence_embeddings_equal_transformers() {
    let Some(dir) = real_weights::weights_dir("minilm") else {
        return;
    };
    let fixture: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/minilm_ref.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let rows = |key: &str| -> Vec<Vec<f64>> {
        fixture[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap())
                    .collect()
            })
            .collect()
    };
    let tok = sinter_data::TextTokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let sentences = fixture["sentences"].as_array().unwrap();
    let unpadded = rows("unpadded_ids");
    for (s, want) in sentences.iter().zip(&unpadded) {
        let got: Vec<f64> = tok
            .encode(s.as_str().unwrap(), true)
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect();
        assert_eq!(&got, want, "token ids of {s}");
    }
    let model = from_hf_pretrained(&dir, &shared_rng(0)).unwrap();
    model.set_training(false);
    assert!(model.head.is_none(), "MiniLM ships the encoder alone");
    let (ids, mask) = (rows("ids"), rows("attention_mask"));
    let (b, t) = (ids.len(), ids[0].len());
    let flat = |v: &[Vec<f64>]| v.iter().flatten().map(|&x| x as i64).collect::<Vec<_>>();
    let ids = Tensor::from_vec(flat(&ids), &[b, t], Device::Cpu).unwrap();
    let mask = Tensor::from_vec(flat(&mask), &[b, t], Device::Cpu).unwrap();
    let emb = model.embed(&ids, Some(&mask), true).unwrap();
    assert_eq!(emb.shape(), &[b, 384]);
    let got = emb.to_vec_f32().unwrap();
    let want = rows("embeddings");
    let worst = want
        .iter()
        .flatten()
        .zip(&got)
        .map(|(w, g)| (w - f64::from(*g)).abs())
        .fold(0.0, f64::max);
    eprintln!("MiniLM embeddings: worst difference from transformers {worst:.2e}");
    assert!(worst <= 1e-5, "worst difference {worst:.2e}");
    // The padded row equals the sentence embedded alone (the mask hides the padding).
    let first = &unpadded[0];
    let alone = Tensor::from_vec(
        first.iter().map(|&x| x as i64).collect(),
        &[1, first.len()],
        Device::Cpu,
    )
    .unwrap();
    let alone = model
        .embed(&alone, None, true)
        .unwrap()
        .to_vec_f32()
        .unwrap();
    let padded_worst = alone
        .iter()
        .zip(&got[..384])
        .map(|(a, p)| (a - p).abs())
        .fold(0.0f32, f32::max);
    assert!(
        padded_worst <= 1e-6,
        "padding changed the embedding by {padded_worst:.2e}"
    );
}
