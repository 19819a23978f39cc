//! `train --model PATH`, `eval --model PATH` and `export` on a tiny random Llama written in
//! Hugging Face layout (config.json, model.safetensors, and a character-level tokenizer.json).

mod common;

use std::path::{Path, PathBuf};

use common::*;
use sinter_core::{Device, Rng, Tensor};
use sinter_models::{
    load_pretrained, load_pretrained_with_tokenizer, Decoder, DecoderArch, DecoderConfig,
};

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
    let config = DecoderConfig {
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
    let model = Decoder::new(config, &mut Rng::new(7), &sinter_nn::module::shared_rng(0)).unwrap();
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
fn logits(model: &Decoder) -> Vec<f32> {
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

/// Every projection of the Llama block, as `--lora-targets`.
const ALL_PROJ: &str = "q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj";

/// (name, f32 values, shape) of a safetensors file.
fn read_st(path: &Path) -> Vec<(String, Vec<f32>, Vec<usize>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| {
            let vals = t
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            (n, vals, t.shape().to_vec())
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn write_st(path: &Path, tensors: &[(String, Vec<f32>, Vec<usize>)]) {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, v, _)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, _, s), b)| {
            let v = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b);
            (n.clone(), v.unwrap())
        })
        .collect();
    std::fs::write(path, safetensors::serialize(views, &None).unwrap()).unwrap();
}

/// The base model with the PEFT adapter in `dir` installed by hand through sinter-nn (not
/// through the CLI's loader): an independent reading of PEFT's names.
fn base_with_adapter(base: &str, dir: &Path) -> Decoder {
    let model = load_pretrained(base).unwrap();
    let tensors = read_st(&dir.join("adapter_model.safetensors"));
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("adapter_config.json")).unwrap())
            .unwrap();
    let (r, alpha) = (
        cfg["r"].as_u64().unwrap() as usize,
        cfg["lora_alpha"].as_f64().unwrap(),
    );
    let get = |n: &str| {
        let (_, v, s) = tensors.iter().find(|(m, _, _)| m == n)?;
        Some(Tensor::from_vec(v.clone(), s, Device::Cpu).unwrap())
    };
    let mut used = 0;
    for (i, b) in model.blocks.iter().enumerate() {
        let mut on: Vec<(*const sinter_nn::Linear, Vec<sinter_nn::lora::Segment>)> = Vec::new();
        for p in sinter_nn::lora::projections(b) {
            let n = format!("base_model.model.model.layers.{i}.{}", p.name);
            let Some(a) = get(&format!("{n}.lora_A.weight")) else {
                continue;
            };
            let bt = get(&format!("{n}.lora_B.weight")).unwrap();
            used += 2;
            let seg = sinter_nn::lora::Segment::new(p.short(), p.rows.clone(), a, bt).unwrap();
            match on.iter_mut().find(|(l, _)| std::ptr::eq(*l, p.layer)) {
                Some((_, s)) => s.push(seg),
                None => on.push((p.layer, vec![seg])),
            }
        }
        let lora_cfg = sinter_nn::lora::LoraConfig {
            rank: r,
            alpha,
            dropout: 0.0,
        };
        for (l, segs) in on {
            let layer = [&b.attn.qkv, &b.attn.proj, &b.mlp.fc, &b.mlp.proj]
                .into_iter()
                .find(|x| std::ptr::eq(*x, l))
                .unwrap();
            sinter_nn::lora::targets::attach(
                layer,
                segs,
                &lora_cfg,
                &sinter_nn::module::shared_rng(0),
            )
            .unwrap();
        }
    }
    assert_eq!(used, tensors.len(), "tensors the hand loader did not place");
    model
}

/// PEFT's meaning of an adapter, computed on the Hugging Face files alone (what numpy would
/// do, without sinter's model or layer layout): every `<module>.weight` of the merged model
/// equals the base's plus lora_alpha / r · B·A of the factors named after that module, and
/// every other tensor is the base's.
fn assert_peft_merge(base: &Path, adapter: &Path, merged: &Path) {
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    let scale = (cfg["lora_alpha"].as_f64().unwrap() / cfg["r"].as_f64().unwrap()) as f32;
    let factors = read_st(&adapter.join("adapter_model.safetensors"));
    let merged = read_st(merged);
    let base = read_st(base);
    assert_eq!(
        base.iter().map(|t| &t.0).collect::<Vec<_>>(),
        merged.iter().map(|t| &t.0).collect::<Vec<_>>()
    );
    let mut adapted = 0;
    for ((name, w, shape), (_, m, _)) in base.iter().zip(&merged) {
        let module = name.strip_suffix(".weight").unwrap_or(name);
        let get = |f: &str| {
            let n = format!("base_model.model.{module}.lora_{f}.weight");
            factors.iter().find(|t| t.0 == n)
        };
        let mut want = w.clone();
        if let (Some((_, a, sa)), Some((_, b, sb))) = (get("A"), get("B")) {
            let (out, r, inp) = (sb[0], sa[0], sa[1]);
            assert_eq!((shape.as_slice(), sb[1]), (&[out, inp][..], r), "{name}");
            for i in 0..out {
                for j in 0..inp {
                    let d: f32 = (0..r).map(|k| b[i * r + k] * a[k * inp + j]).sum();
                    want[i * inp + j] += scale * d;
                }
            }
            adapted += 1;
        }
        let d = max_diff(&want, m);
        assert!(d < 1e-6, "{name}: merged differs from W + α/r·B·A by {d}");
    }
    assert_eq!(2 * adapted, factors.len(), "factors naming no base module");
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

#[test]
fn a_lora_fine_tune_learns_exports_peft_merges_and_generates() {
    let f = fixture();
    let loss0 = eval_loss(&run_ok(&[
        "eval",
        "--model",
        &f.model,
        "--data",
        &f.data,
        "--context",
        "32",
        "--batch-size",
        "8",
    ]));
    let base_bytes = std::fs::read(f.root.join("tiny/model.safetensors")).unwrap();
    let run = f.path("lora");
    let extra = f.path("extra-adapter");
    f.train(
        &run,
        "40",
        &[
            "--lora-rank",
            "4",
            "--lora-alpha",
            "8",
            "--lora-targets",
            ALL_PROJ,
            "--export-adapter",
            &extra,
        ],
    );
    let loss = summary(Path::new(&run))["val_loss"].as_f64().unwrap();
    assert!(loss < loss0 - 0.5, "LoRA validation loss {loss0} → {loss}");
    // The checkpoint holds only adapters (and their optimizer state); the base is unchanged.
    let (tensors, _) = checkpoint_content(Path::new(&run));
    let model_tensors: Vec<&String> = tensors
        .iter()
        .map(|(n, _)| n)
        .filter(|n| n.starts_with("model."))
        .collect();
    assert_eq!(model_tensors.len(), 2 * 2 * 7, "{model_tensors:?}");
    assert!(
        model_tensors.iter().all(|n| n.contains(".lora.")),
        "{model_tensors:?}"
    );
    assert_eq!(
        std::fs::read(f.root.join("tiny/model.safetensors")).unwrap(),
        base_bytes
    );

    // PEFT's files: names, config, and the checkpoint's adapter values exactly.
    let adapter = Path::new(&run).join("adapter");
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cfg["peft_type"], "LORA");
    assert_eq!(cfg["r"], 4);
    assert_eq!(cfg["lora_alpha"], 8.0);
    assert_eq!(cfg["task_type"], "CAUSAL_LM");
    assert_eq!(cfg["target_modules"].as_array().unwrap().len(), 7);
    let peft = read_st(&adapter.join("adapter_model.safetensors"));
    assert_eq!(peft.len(), 28);
    let (_, q_a, shape) = peft
        .iter()
        .find(|(n, _, _)| n == "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight")
        .expect("PEFT's name for layer 1's q_proj A");
    assert_eq!(shape, &[4, 64]);
    let (_, ck) = tensors
        .iter()
        .find(|(n, _)| n == "model.blocks.1.attn.qkv.lora.q_proj.A")
        .unwrap();
    let ck: Vec<f32> = ck
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(&ck, q_a);
    assert_eq!(
        read_st(&Path::new(&extra).join("adapter_model.safetensors")),
        peft
    );

    // Adapter on (loaded by hand) vs merged by `sinter merge`, vs the base.
    let on = base_with_adapter(&f.model, &adapter);
    let merged_dir = f.path("merged");
    run_ok(&[
        "merge",
        "--model",
        &f.model,
        "--adapter",
        &adapter.to_string_lossy(),
        "--out",
        &merged_dir,
    ]);
    let merged = load_pretrained_with_tokenizer(&merged_dir).unwrap();
    let (l_on, l_merged) = (logits(&on), logits(&merged.model));
    let d = max_diff(&l_on, &l_merged);
    assert!(
        d < 1e-5,
        "merged logits differ from adapter-on logits by {d}"
    );
    assert!(max_diff(&l_on, &logits(&load_pretrained(&f.model).unwrap())) > 1e-2);
    assert_peft_merge(
        &f.root.join("tiny/model.safetensors"),
        &adapter,
        &Path::new(&merged_dir).join("model.safetensors"),
    );

    // `export` of the run's checkpoint writes the merged model, as `merge` does.
    let exported = f.path("exported");
    run_ok(&["export", &run, "--out", &exported]);
    let exported = load_pretrained_with_tokenizer(&exported).unwrap();
    let d = max_diff(&logits(&exported.model), &l_merged);
    assert!(d < 1e-6, "exported LoRA run differs from its merge by {d}");

    // generate --adapter equals generating with the merged model (greedy).
    let gen = |model: &str, adapter: Option<&Path>| {
        let mut a = vec![
            "generate",
            "--model",
            model,
            "--prompt",
            "the cat",
            "--temperature",
            "0",
            "--max-new-tokens",
            "12",
            "--device",
            "cpu",
        ];
        let s;
        if let Some(d) = adapter {
            s = d.to_string_lossy().into_owned();
            a.extend(["--adapter", s.as_str()]);
        }
        run_ok(&a)
    };
    let with_adapter = gen(&f.model, Some(&adapter));
    assert_eq!(with_adapter, gen(&merged_dir, None));
    assert_ne!(
        with_adapter,
        gen(&f.model, None),
        "the adapter changed nothing"
    );
}

#[test]
fn a_resumed_lora_fine_tune_equals_an_uninterrupted_one() {
    let f = fixture();
    let (whole, parts) = (f.path("whole"), f.path("parts"));
    let lora = ["--lora-rank", "2", "--lora-dropout", "0.1"];
    f.train(&whole, "20", &lora);
    f.train(
        &parts,
        "20",
        &[&lora[..], &["--stop-at-step", "10"]].concat(),
    );
    run_ok(&["train", "--quiet", "--resume", &parts]);
    let (a, b) = (
        checkpoint_content(Path::new(&whole)).0,
        checkpoint_content(Path::new(&parts)).0,
    );
    assert!(a
        .iter()
        .any(|(n, _)| n == "model.blocks.0.attn.qkv.lora.v_proj.B"));
    assert_eq!(
        a, b,
        "a resumed LoRA fine-tune differs from an uninterrupted one"
    );
    fails_with(
        &sinter(&["train", "--quiet", "--resume", &parts, "--lora-rank", "3"]),
        &["--lora-", "checkpoint's LoRA settings"],
    );
}

#[test]
fn malformed_adapters_get_clear_errors() {
    let f = fixture();
    let run = f.path("lora");
    f.train(&run, "2", &["--lora-rank", "2"]);
    let good = Path::new(&run).join("adapter");
    let merge = |dir: &Path| {
        sinter(&[
            "merge",
            "--model",
            &f.model,
            "--adapter",
            &dir.to_string_lossy(),
            "--out",
            &f.path("m"),
        ])
    };
    let copy = |name: &str| {
        let d = f.root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for file in ["adapter_config.json", "adapter_model.safetensors"] {
            std::fs::copy(good.join(file), d.join(file)).unwrap();
        }
        d
    };
    let set_config = |d: &Path, key: &str, v: serde_json::Value| {
        let p = d.join("adapter_config.json");
        let mut c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        c[key] = v;
        std::fs::write(&p, c.to_string()).unwrap();
    };
    fails_with(
        &merge(&f.root.join("nowhere")),
        &["adapter_config.json", "cannot read"],
    );
    let d = copy("ia3");
    set_config(&d, "peft_type", "IA3".into());
    fails_with(&merge(&d), &["peft_type", "IA3", "not LORA"]);
    let d = copy("rank");
    set_config(&d, "r", 8.into());
    fails_with(
        &merge(&d),
        &[
            "q_proj.lora_A.weight",
            "r = 8",
            "another base model or rank",
        ],
    );
    let d = copy("targets");
    set_config(&d, "target_modules", serde_json::json!(["q_proj"]));
    fails_with(&merge(&d), &["v_proj", "target_modules"]);
    let d = copy("unknown");
    let mut t = read_st(&d.join("adapter_model.safetensors"));
    t.push((
        "base_model.model.model.layers.0.self_attn.rotary.lora_A.weight".into(),
        vec![0.0; 4],
        vec![2, 2],
    ));
    write_st(&d.join("adapter_model.safetensors"), &t);
    fails_with(&merge(&d), &["self_attn.rotary", "not a LoRA factor"]);
    let d = copy("half");
    let t: Vec<_> = read_st(&d.join("adapter_model.safetensors"))
        .into_iter()
        .filter(|(n, _, _)| !n.ends_with("layers.1.self_attn.v_proj.lora_B.weight"))
        .collect();
    write_st(&d.join("adapter_model.safetensors"), &t);
    fails_with(
        &merge(&d),
        &["layers.1.self_attn.v_proj.lora_A.weight", "incomplete"],
    );
    fails_with(
        &sinter(&["train", "--model", "llama-tiny", "--lora-rank", "4"]),
        &["--lora-rank", "pretrained model"],
    );
    fails_with(
        &sinter(&[
            "train",
            "--model",
            &f.model,
            "--data",
            &f.data,
            "--context",
            "32",
            "--lora-rank",
            "4",
            "--lora-targets",
            "nothing_here",
        ]),
        &["no projection matches", "nothing_here"],
    );
}

#[test]
fn two_launched_lora_ranks_equal_one_process_with_the_doubled_batch() {
    let f = fixture();
    let (one, two) = (f.path("one"), f.path("two"));
    let lora = ["--lora-rank", "8", "--lora-targets", ALL_PROJ];
    f.train(&one, "6", &lora);
    let mut a = vec![
        "launch",
        "--nproc-per-node",
        "2",
        "--master-port",
        "0",
        "--",
        "train",
        "--quiet",
        "--model",
        &f.model,
        "--data",
        &f.data,
        "--context",
        "32",
        "--batch-size",
        "4",
        "--lr",
        "3e-3",
        "--steps",
        "6",
        "--eval-batches",
        "0",
        "--checkpoint-interval",
        "10",
        "--device",
        "cpu",
        "--out",
        &two,
    ];
    a.extend_from_slice(&lora);
    ok(&sinter(&a));
    assert_eq!(summary(Path::new(&two))["world_size"], 2);
    let floats = |b: &[u8]| -> Vec<f64> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect()
    };
    let (ta, tb) = (
        checkpoint_content(Path::new(&one)).0,
        checkpoint_content(Path::new(&two)).0,
    );
    assert_eq!(
        ta.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        tb.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    let mut n_model = 0;
    for ((n, x), (_, y)) in ta.iter().zip(&tb) {
        if !n.starts_with("model.") {
            continue;
        }
        n_model += 1;
        let (x, y) = (floats(x), floats(y));
        let diff = x
            .iter()
            .zip(&y)
            .map(|(p, q)| (p - q).powi(2))
            .sum::<f64>()
            .sqrt();
        let norm = y.iter().map(|q| q * q).sum::<f64>().sqrt().max(1e-12);
        assert!(
            diff / norm <= 1e-5,
            "{n}: 2 ranks differ from 1 by {:e}",
            diff / norm
        );
    }
    assert_eq!(
        n_model,
        2 * 2 * 7,
        "only the adapters are trained and saved"
    );
}

#[test]
fn a_qlora_fine_tune_learns_on_an_int8_base() {
    let f = fixture();
    let loss0 = eval_loss(&run_ok(&[
        "eval",
        "--model",
        &f.model,
        "--data",
        &f.data,
        "--context",
        "32",
        "--batch-size",
        "8",
    ]));
    let run = f.path("qlora");
    f.train(
        &run,
        "40",
        &[
            "--lora-rank",
            "4",
            "--lora-targets",
            ALL_PROJ,
            "--lora-base",
            "int8",
        ],
    );
    let loss = summary(Path::new(&run))["val_loss"].as_f64().unwrap();
    // An adapter that does not learn leaves the loss near loss0 (40 steps took 3.44 to 3.00).
    assert!(
        loss < loss0 - 0.25,
        "QLoRA validation loss {loss0} → {loss}"
    );
    let (tensors, _) = checkpoint_content(Path::new(&run));
    let model: Vec<&String> = tensors
        .iter()
        .map(|(n, _)| n)
        .filter(|n| n.starts_with("model."))
        .collect();
    assert!(
        model.iter().all(|n| n.contains(".lora.")) && model.len() == 28,
        "{model:?}"
    );
    assert!(Path::new(&run)
        .join("adapter/adapter_model.safetensors")
        .exists());
}

/// 4-bit QLoRA: the base quantized at load to Q4_0 learns as the int8 base does; Q4_K on
/// widths that are not whole 256-blocks, and `gguf` on a directory, are refused by name; and
/// `--lora-base gguf` fine-tunes on a GGUF file's own Q4_0 blocks (written by `sinter
/// quantize`, never dequantized) with only the adapters saved.
#[test]
fn a_4bit_qlora_learns_on_blocks_quantized_at_load_and_on_a_ggufs_own() {
    let f = fixture();
    let loss0 = eval_loss(&run_ok(&[
        "eval",
        "--model",
        &f.model,
        "--data",
        &f.data,
        "--context",
        "32",
        "--batch-size",
        "8",
    ]));
    let run = f.path("q4");
    let extra = [
        "--lora-rank",
        "4",
        "--lora-targets",
        ALL_PROJ,
        "--lora-base",
    ];
    f.train(&run, "40", &[&extra[..], &["q4_0"]].concat());
    let loss = summary(Path::new(&run))["val_loss"].as_f64().unwrap();
    assert!(
        loss < loss0 - 0.25,
        "Q4_0 QLoRA validation loss {loss0} → {loss}"
    );
    let (tensors, _) = checkpoint_content(Path::new(&run));
    assert!(tensors
        .iter()
        .filter(|(n, _)| n.starts_with("model."))
        .all(|(n, _)| n.contains(".lora.")));
    let train = |model: &str, data: &str, base: &str, out: &str| {
        sinter(&[
            "train",
            "--quiet",
            "--model",
            model,
            "--data",
            data,
            "--context",
            "16",
            "--batch-size",
            "8",
            "--lr",
            "1e-2",
            "--steps",
            "60",
            "--eval-interval",
            "60",
            "--eval-batches",
            "2",
            "--device",
            "cpu",
            "--out",
            out,
            "--lora-rank",
            "4",
            "--lora-targets",
            ALL_PROJ,
            "--lora-base",
            base,
        ])
    };
    // Q4_K needs rows of whole 256-value blocks; the tiny model's are 64 wide.
    fails_with(
        &train(&f.model, &f.data, "q4_k", &f.path("q4k")),
        &["--lora-base q4_k", "block 0 attn.qkv", "Q4_K"],
    );
    fails_with(
        &train(&f.model, &f.data, "gguf", &f.path("gg-dir")),
        &["--lora-base gguf", "not a .gguf file", "--lora-base q4_0"],
    );
    fails_with(
        &train(&f.model, &f.data, "q3", &f.path("q3")),
        &["--lora-base must be one of", "q4_k", "gguf", "'q3'"],
    );
    // A GGUF file whose matrices are Q4_0 blocks (the 48-wide down projections stay F16).
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sinter-models/tests/fixtures/gguf/llama-tiny.gguf");
    let q4 = f.path("llama-tiny-q4_0.gguf");
    run_ok(&[
        "quantize",
        "--model",
        src.to_str().unwrap(),
        "--format",
        "q4_0",
        "--out",
        &q4,
    ]);
    let tokens = f.root.join("ids.bin");
    let ids: Vec<u16> = (0..4000).map(|i| ((i * 7) % 40) as u16).collect();
    sinter_data::write_tokens(&tokens, &ids).unwrap();
    let data = format!("tokens:{}", tokens.display());
    let before = eval_loss(&run_ok(&[
        "eval",
        "--model",
        &q4,
        "--data",
        &data,
        "--context",
        "16",
        "--batch-size",
        "8",
    ]));
    let run = f.path("gguf-base");
    let out = train(&q4, &data, "gguf", &run);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = summary(Path::new(&run))["val_loss"].as_f64().unwrap();
    assert!(
        after < before - 0.2,
        "QLoRA on the GGUF's Q4_0 blocks: validation loss {before} → {after}"
    );
    let (tensors, _) = checkpoint_content(Path::new(&run));
    let model: Vec<&String> = tensors
        .iter()
        .map(|(n, _)| n)
        .filter(|n| n.starts_with("model."))
        .collect();
    assert!(
        !model.is_empty() && model.iter().all(|n| n.contains(".lora.")),
        "{model:?}"
    );
}

/// LoRA dropout draws its masks on the host at each forward pass: by default the CUDA graph
/// steps aside (a note, eager steps, the run trains), while `--cuda-graph` refuses the run.
#[test]
fn dropout_keeps_the_default_cuda_graph_off_and_refuses_an_asked_one() {
    let f = fixture();
    let train = |out: &str, extra: &[&str]| {
        let mut a = vec![
            "train",
            "--model",
            &f.model,
            "--data",
            &f.data,
            "--context",
            "16",
            "--batch-size",
            "2",
            "--steps",
            "5",
            "--eval-batches",
            "1",
            "--device",
            "cuda-emu",
            "--lora-rank",
            "2",
            "--lora-dropout",
            "0.1",
            "--out",
            out,
        ];
        a.extend_from_slice(extra);
        sinter(&a)
    };
    let o = train(&f.path("auto"), &[]);
    let err = stderr(&o);
    if !o.status.success()
        && std::env::var("SINTER_REQUIRE_EMU").as_deref() != Ok("1")
        && err.contains("cuda-emu")
        && err.contains("compiler")
    {
        eprintln!("skipped: the emulated CUDA device is not available: {err}");
        return;
    }
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("CUDA graph off: this model applies dropout") && !err.contains("captured"),
        "{err}"
    );
    assert_eq!(summary(Path::new(&f.path("auto")))["steps"], 5);
    fails_with(
        &train(&f.path("asked"), &["--cuda-graph"]),
        &["--cuda-graph cannot be used", "dropout"],
    );
}
