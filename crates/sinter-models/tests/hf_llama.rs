//! Llama-family models from Hugging Face directories against transformers' own logits.
//!
//! The fixtures (tests/fixtures/tiny, written by bench/llm/make_tiny.py with transformers'
//! classes) are small random models of each family — Llama with grouped-query attention,
//! tied head and llama3 rope scaling; Qwen2 with qkv bias, untied and sharded; Qwen3 with
//! QK-norm and one kv head; Mistral stored in bf16 — with transformers' fp32 logits at every
//! prompt position and its greedy continuation.

mod llm_reference;
use llm_reference::{greedy, ids_tensor, read_references, worst_relative_error};

use std::path::{Path, PathBuf};

use serde_json::Value;
use sinter_models::hf_llama::{llama_config_from_hf_json, load_hf_llama, save_hf_llama};
use sinter_models::Decoder;
use sinter_nn::Module;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny")
        .join(name)
}

fn check_against_transformers(model: &Decoder, dir: &Path, tol: f32) {
    for (i, r) in read_references(&dir.join("ref")).iter().enumerate() {
        assert_eq!(r.vocab, model.config.vocab_size);
        let ours = model
            .forward(&ids_tensor(&r.ids))
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let err = worst_relative_error(&ours, &r.logits, r.vocab);
        assert!(
            err <= tol,
            "{}: prompt {i}: logits differ from transformers' by {err:.3e} (relative)",
            dir.display()
        );
        let g = greedy(model, &r.ids, r.greedy.len());
        assert_eq!(
            g,
            r.greedy,
            "{}: prompt {i}: greedy continuation",
            dir.display()
        );
    }
}

#[test]
fn tiny_models_equal_transformers() {
    for name in [
        "llama-gqa-tied",
        "qwen2-bias-sharded",
        "qwen3-qknorm",
        "mistral-bf16",
        "mistral-window",
        "qwen2-window",
        "llama-geglu",
    ] {
        let dir = fixture(name);
        let model = load_hf_llama(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        check_against_transformers(&model, &dir, 1e-4);
    }
}

#[test]
fn the_families_configure_the_block() {
    let cfg = |name: &str| {
        let dir = fixture(name);
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        llama_config_from_hf_json(&v, name).unwrap()
    };
    let llama = cfg("llama-gqa-tied");
    assert_eq!(
        (llama.n_head, llama.n_kv_head(), llama.head_dim()),
        (4, 2, 8)
    );
    assert!(llama.arch.tie_head && !llama.arch.qkv_bias && !llama.arch.qk_norm);
    assert!(matches!(
        llama.arch.rope.as_ref().unwrap().scaling,
        sinter_nn::RopeScaling::Llama3 { .. }
    ));
    let qwen2 = cfg("qwen2-bias-sharded");
    assert!(qwen2.arch.qkv_bias && !qwen2.arch.out_bias && !qwen2.arch.tie_head);
    let qwen3 = cfg("qwen3-qknorm");
    assert!(qwen3.arch.qk_norm && qwen3.n_kv_head() == 1 && qwen3.head_dim() == 16);
    assert_eq!(qwen3.arch.norm_eps, 1e-6);
    // Mistral's window is attention's, not the context's (which stays the config's 128).
    let mistral = cfg("mistral-window");
    assert_eq!(
        (mistral.arch.sliding_window, mistral.block_size),
        (Some(5), 128)
    );
    assert_eq!(cfg("mistral-bf16").arch.sliding_window, None);
    // Qwen's window from max_window_layers on: layer 0 attends fully, layer 1 to 5 positions.
    let qwen = cfg("qwen2-window");
    assert_eq!(
        (
            qwen.arch.sliding_window,
            qwen.arch.full_attention_layers,
            qwen.block_size
        ),
        (Some(5), 1, 128)
    );
    assert_eq!(qwen.layer_config(0).sliding_window, None);
    assert_eq!(qwen.layer_config(1).sliding_window, Some(5));
    assert_eq!(cfg("llama-geglu").arch.mlp, sinter_nn::MlpKind::GeGlu);
}

#[test]
fn save_pretrained_round_trips() {
    // The windows (Mistral's, and Qwen's per layer) and the GeGLU activation are written
    // back too.
    for name in ["mistral-window", "qwen2-window", "llama-geglu"] {
        let model = load_hf_llama(fixture(name)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        save_hf_llama(&model, dir.path()).unwrap();
        assert_eq!(
            load_hf_llama(dir.path()).unwrap().config,
            model.config,
            "{name}"
        );
    }
    let model = load_hf_llama(fixture("qwen2-bias-sharded")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    save_hf_llama(&model, dir.path()).unwrap();
    let again = load_hf_llama(dir.path()).unwrap();
    assert_eq!(again.config, model.config);
    let ids = ids_tensor(&[3, 1, 4, 1, 5, 9, 2, 6]);
    assert_eq!(
        again.forward(&ids).unwrap().to_vec_f32().unwrap(),
        model.forward(&ids).unwrap().to_vec_f32().unwrap()
    );
    // Transformers' names, with q/k/v and gate/up split again.
    let st = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&st).unwrap();
    let names: Vec<String> = st.names().into_iter().cloned().collect();
    for n in [
        "model.layers.1.self_attn.k_proj.bias",
        "model.layers.0.mlp.up_proj.weight",
        "lm_head.weight",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
    }
}

/// An edit of a config.json.
type ConfigEdit = Box<dyn Fn(&mut Value)>;

/// A copy of a fixture directory with its config.json edited.
fn with_config(name: &str, edit: impl Fn(&mut Value)) -> tempfile::TempDir {
    let src = fixture(name);
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        if e.path().is_file() {
            std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
        }
    }
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(dir.path().join("config.json"), v.to_string()).unwrap();
    dir
}

fn load_err(dir: &Path) -> String {
    match load_hf_llama(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_configs_and_weights_are_refused_by_name() {
    let cases: Vec<(ConfigEdit, &str)> = vec![
        (
            Box::new(|v| v["quantization_config"] = serde_json::json!({"bits": 4})),
            "quantization_config",
        ),
        (
            Box::new(|v| v["hidden_act"] = "gelu".into()),
            "hidden_act gelu",
        ),
        (
            Box::new(|v| v["architectures"] = serde_json::json!(["FalconForCausalLM"])),
            "FalconForCausalLM",
        ),
        (
            Box::new(|v| v["num_key_value_heads"] = 3.into()),
            "key/value heads",
        ),
        (
            Box::new(|v| v["rope_parameters"]["rope_type"] = "yarn".into()),
            "yarn",
        ),
        (
            Box::new(|v| v["num_hidden_layers"] = 3.into()),
            "model.layers.2",
        ),
        (
            Box::new(|v| v["intermediate_size"] = 48.into()),
            "mlp.gate_proj.weight",
        ),
        (
            Box::new(|v| v["tie_word_embeddings"] = false.into()),
            "lm_head.weight is missing",
        ),
    ];
    for (edit, want) in cases {
        let dir = with_config("llama-gqa-tied", edit);
        let e = load_err(dir.path());
        assert!(e.contains(want), "expected {want:?} in: {e}");
    }
    // Windowed layers before full ones, and a list of the wrong length.
    let dir = with_config("qwen2-window", |v| {
        v["layer_types"] = serde_json::json!(["sliding_attention", "full_attention"])
    });
    let e = load_err(dir.path());
    assert!(
        e.contains("layer_types[1]") && e.contains("full_attention"),
        "{e}"
    );
    let dir = with_config("qwen2-window", |v| {
        v["layer_types"] = serde_json::json!(["full_attention"])
    });
    assert!(load_err(dir.path()).contains("each of the 2 layers"));
    let missing = tempfile::tempdir().unwrap();
    assert!(load_err(missing.path()).contains("config.json"));
    // A truncated weights file names the file.
    let dir = with_config("llama-gqa-tied", |_| {});
    let st = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
    assert!(load_err(dir.path()).contains("model.safetensors"));
}
