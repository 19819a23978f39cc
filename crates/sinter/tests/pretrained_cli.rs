//! `train --model PATH`, `eval --model PATH` and `export` on a tiny random Llama written in
//! Hugging Face layout (config.json, model.safetensors, and a character-level tokenizer.json).

mod common;

use std::path::{Path, PathBuf};

use common::*;
use sinter_core::{Device, Rng, Tensor};
use sinter_models::{load_pretrained, load_pretrained_with_tokenizer, DecoderArch, Gpt, GptConfig};

const CHARS: &str = "\n ,.abcdefghijklmnopqrstuvwxyz";
const EOS: &str = "</s>";

/// A tiny Llama (GQA, SwiGLU, RMSNorm, rotary) with random weights and a character-level
/// tokenizer, in `dir`.
fn write_tiny_llama(dir: &Path) {
    let vocab: serde_json::Map<String, serde_json::Value> = CHARS
        .chars()
        .enumerate()
        .map(|(i, c)| (c.to_string(), i.into()))
        .collect();
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": CHARS.len(), "content": EOS, "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
            "byte_fallback": false, "vocab": vocab, "merges": []}
    });
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::json!({ "eos_token": EOS }).to_string(),
    )
    .unwrap();
    let config = GptConfig {
        n_layer: 2,
        n_head: 4,
        n_embd: 64,
        block_size: 64,
        vocab_size: CHARS.len() + 1,
        dropout: 0.0,
        arch: DecoderArch {
            n_kv_head: Some(2),
            mlp_hidden: Some(128),
            ..DecoderArch::llama(10_000.0)
        },
    };
    let model = Gpt::new(config, &mut Rng::new(7), &sinter_nn::module::shared_rng(0)).unwrap();
    sinter_models::save_hf_llama(&model, dir).unwrap();
}

/// Sentences of a few words in a fixed pseudo-random order: easy to learn, not memorised at
/// once.
fn write_text(path: &Path) {
    let words = [
        "the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far",
    ];
    let mut rng = Rng::new(3);
    let mut s = String::new();
    while s.len() < 8000 {
        let n = 3 + rng.next_u64() as usize % 5;
        let w: Vec<&str> = (0..n)
            .map(|_| words[rng.next_u64() as usize % words.len()])
            .collect();
        s.push_str(&w.join(" "));
        s.push_str(".\n");
    }
    std::fs::write(path, s).unwrap();
}

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    model: String,
    data: String,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    write_tiny_llama(&root.join("tiny"));
    write_text(&root.join("text.txt"));
    Fixture {
        model: root.join("tiny").to_str().unwrap().into(),
        data: format!("text:{}", root.join("text.txt").display()),
        root,
        _dir: dir,
    }
}

impl Fixture {
    fn path(&self, name: &str) -> String {
        self.root.join(name).to_str().unwrap().into()
    }

    /// `train --model` on the text with the settings every run here shares.
    fn train(&self, out: &str, steps: &str, extra: &[&str]) -> String {
        let mut args = vec![
            "train",
            "--quiet",
            "--model",
            &self.model,
            "--data",
            &self.data,
            "--context",
            "32",
            "--batch-size",
            "8",
            "--lr",
            "3e-3",
            "--steps",
            steps,
            "--eval-interval",
            "20",
            "--eval-batches",
            "0",
            "--checkpoint-interval",
            "10",
            "--device",
            "cpu",
            "--out",
            out,
        ];
        args.extend_from_slice(extra);
        run_ok(&args)
    }
}

/// The loss in `eval`'s "validation loss X" line.
fn eval_loss(stdout: &str) -> f64 {
    let rest = stdout
        .split("validation loss ")
        .nth(1)
        .unwrap_or_else(|| panic!("no validation loss in: {stdout}"));
    rest.split([',', ' ']).next().unwrap().parse().unwrap()
}

#[test]
fn fine_tuning_a_pretrained_model_lowers_its_loss_and_eval_agrees() {
    let f = fixture();
    let before = run_ok(&[
        "eval",
        "--model",
        &f.model,
        "--data",
        &f.data,
        "--context",
        "32",
        "--batch-size",
        "8",
    ]);
    assert!(before.contains("perplexity"), "{before}");
    let loss0 = eval_loss(&before);
    let run = f.path("run");
    f.train(&run, "40", &[]);
    let s = summary(Path::new(&run));
    let loss = s["val_loss"].as_f64().unwrap();
    // Random weights over 31 tokens start near ln 31 ≈ 3.4; the sentences' letters are far
    // more predictable than that.
    assert!(loss0 > 3.0, "step-0 validation loss {loss0}");
    assert!(loss < loss0 - 1.0, "validation loss {loss0} → {loss}");
    // The checkpoint records the model's path and evaluates to the run's last validation loss.
    assert_eq!(s["model"].as_str().unwrap(), f.model);
    let after = run_ok(&["eval", "--checkpoint", &run]);
    assert_eq!(
        format!("{:.4}", eval_loss(&after)),
        format!("{loss:.4}"),
        "{after}"
    );
}

#[test]
fn a_resumed_fine_tune_equals_an_uninterrupted_one() {
    let f = fixture();
    let (whole, parts) = (f.path("whole"), f.path("parts"));
    f.train(&whole, "40", &[]);
    f.train(&parts, "40", &["--stop-at-step", "10"]);
    // Resumed from another directory: the checkpoint's model path is absolute.
    let o = sinter_cmd()
        .current_dir(std::env::temp_dir())
        .args(["train", "--quiet", "--resume", &parts])
        .output()
        .unwrap();
    ok(&o);
    let (a, b) = (
        checkpoint_content(Path::new(&whole)).0,
        checkpoint_content(Path::new(&parts)).0,
    );
    assert!(a.iter().any(|(n, _)| n.starts_with("model.blocks.1.")));
    assert_eq!(
        a, b,
        "a resumed fine-tune differs from an uninterrupted one"
    );
}

/// The logits of `model` for a fixed window of ids.
fn logits(model: &Gpt) -> Vec<f32> {
    let ids: Vec<i64> = (0..24).map(|i| (i * 7 % 30) as i64).collect();
    let x = Tensor::from_vec(ids, &[1, 24], Device::Cpu).unwrap();
    sinter_nn::Module::forward(model, &x)
        .unwrap()
        .to_vec_f32()
        .unwrap()
}

#[test]
fn an_exported_fine_tune_loads_with_the_checkpoints_logits_and_tokenizer() {
    let f = fixture();
    let run = f.path("run");
    f.train(&run, "10", &[]);
    // The checkpoint has no tokenizer to generate with: the refusal points at export.
    fails_with(
        &sinter(&["generate", "--checkpoint", &run, "--prompt", "the"]),
        &["fine-tuned from", "sinter export"],
    );
    let out = f.path("exported");
    let said = run_ok(&["export", &run, "--out", &out]);
    assert!(said.contains("step 10"), "{said}");
    // The checkpoint's weights, put into the original model by name, against the export.
    let tuned = load_pretrained(&f.model).unwrap();
    let original = logits(&tuned);
    let (tensors, _) = checkpoint_content(Path::new(&run));
    for (name, p) in sinter_nn::Module::parameters(&tuned) {
        let (_, bytes) = tensors
            .iter()
            .find(|(n, _)| *n == format!("model.{name}"))
            .unwrap_or_else(|| panic!("checkpoint has no model.{name}"));
        let v: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        p.assign(&Tensor::from_vec(v, p.shape(), Device::Cpu).unwrap())
            .unwrap();
    }
    sinter_nn::Module::set_training(&tuned, false);
    let exported = load_pretrained_with_tokenizer(&out).unwrap();
    assert_eq!(logits(&exported.model), logits(&tuned));
    assert_ne!(logits(&tuned), original, "training changed nothing");
    let before = load_pretrained_with_tokenizer(&f.model).unwrap();
    let text = "the cat ran far.\n";
    assert_eq!(
        exported.tokenizer.encode(text, true).unwrap(),
        before.tokenizer.encode(text, true).unwrap()
    );
    assert_eq!(exported.tokenizer.eos_id(), before.tokenizer.eos_id());
}

#[test]
fn bad_pretrained_models_and_data_get_clear_errors() {
    let f = fixture();
    let missing = f.path("no-such-model");
    fails_with(
        &sinter(&["train", "--model", &missing, "--data", &f.data]),
        &["unknown model", "no-such-model", "llama-tiny", ".gguf"],
    );
    fails_with(
        &sinter(&[
            "train",
            "--model",
            &f.model,
            "--data",
            &f.data,
            "--context",
            "65",
        ]),
        &["--context 65", "64 tokens", "--context 64 or less"],
    );
    // Token ids the model has no embedding for.
    let tokens = f.root.join("ids.bin");
    let ids: Vec<u16> = (0..400).map(|i| (i % 40) as u16).collect();
    sinter_data::write_tokens(&tokens, &ids).unwrap();
    fails_with(
        &sinter(&[
            "train",
            "--model",
            &f.model,
            "--data",
            &format!("tokens:{}", tokens.display()),
            "--context",
            "16",
        ]),
        &["token 31", "out of range", "must be below 31"],
    );
    // A directory without a model.
    fails_with(
        &sinter(&[
            "eval",
            "--model",
            &f.root.to_string_lossy(),
            "--data",
            &f.data,
        ]),
        &["config.json"],
    );
}
