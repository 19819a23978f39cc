//! End-to-end tests of the `sinter` binary: learning, exact resume, outputs, and bad input.

mod common;

use common::*;
use std::path::Path;

#[test]
fn default_train_learns_digits_to_97_percent() {
    let dir = tempfile::tempdir().unwrap();
    let o = sinter(&["train", "--quiet", "--out", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = summary(dir.path());
    assert_eq!(s["model"], "cnn");
    assert_eq!(s["data"], "digits");
    let acc = s["val_accuracy"].as_f64().unwrap();
    assert!(acc >= 0.97, "validation accuracy {acc}");
    for f in [
        "metrics.jsonl",
        "summary.json",
        "loss.svg",
        "checkpoint.safetensors",
    ] {
        assert!(dir.path().join(f).exists(), "{f} missing");
    }
    let svg = std::fs::read_to_string(dir.path().join("loss.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("validation loss"));
    let lines = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    assert!(lines.lines().filter(|l| l.contains("val_accuracy")).count() >= 30);
    // eval reads the checkpoint back and agrees with the run's own final evaluation.
    let o = sinter(&["eval", "--checkpoint", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains(&format!("{:.2}%", acc * 100.0)), "{text}");
}

#[test]
fn a_resumed_run_equals_an_uninterrupted_one() {
    for (model, extra) in [
        ("cnn", vec!["--optimizer", "sgd", "--momentum", "0.9"]),
        (
            "gpt-tiny",
            vec![
                "--batch-size",
                "4",
                "--context",
                "16",
                "--eval-batches",
                "2",
                "--eval-interval",
                "5",
            ],
        ),
        (
            // Masked LM: the per-step masks must be reproduced after the resume, and
            // BERT's dropout (0.1) draws from the checkpointed RNG.
            "bert-tiny",
            vec![
                "--batch-size",
                "4",
                "--context",
                "16",
                "--eval-batches",
                "2",
                "--eval-interval",
                "5",
            ],
        ),
    ] {
        let whole = tempfile::tempdir().unwrap();
        let parts = tempfile::tempdir().unwrap();
        let base = [
            "train",
            "--quiet",
            "--model",
            model,
            "--steps",
            "12",
            "--checkpoint-interval",
            "4",
            "--seed",
            "5",
        ];
        let run = |dir: &Path, more: &[&str]| {
            let mut a: Vec<&str> = base.to_vec();
            a.extend_from_slice(&extra);
            a.extend_from_slice(&["--out", dir.to_str().unwrap()]);
            a.extend_from_slice(more);
            let o = sinter(&a);
            assert!(o.status.success(), "{model}: {}", stderr(&o));
        };
        run(whole.path(), &[]);
        run(parts.path(), &["--stop-at-step", "5"]);
        assert_eq!(summary(parts.path())["steps"], 5);
        let o = sinter(&[
            "train",
            "--quiet",
            "--resume",
            parts.path().to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{model}: {}", stderr(&o));
        let (a, b) = (summary(whole.path()), summary(parts.path()));
        assert_eq!(b["resumed_from_step"], 5);
        assert_eq!(a["train_loss"], b["train_loss"], "{model}");
        assert_eq!(a["val_loss"], b["val_loss"], "{model}");
        // Weights, optimizer state, step, RNG and data position: byte for byte.
        let (ta, ma) = checkpoint_content(whole.path());
        let (tb, mb) = checkpoint_content(parts.path());
        assert_eq!(ma, mb, "{model}: metadata differs");
        assert!(
            ta.len() > 4 && ta.iter().any(|(n, _)| n.starts_with("optim.")),
            "{model}: {:?}",
            ta.iter().map(|t| &t.0).collect::<Vec<_>>()
        );
        for ((na, a), (nb, b)) in ta.iter().zip(&tb) {
            assert_eq!(na, nb);
            assert!(a == b, "{model}: tensor {na} differs after resume");
        }
        no_temporaries(parts.path());
    }
}

#[test]
fn bert_tiny_learns_masked_tokens_from_the_bundled_text() {
    let dir = tempfile::tempdir().unwrap();
    let o = sinter(&[
        "train",
        "--quiet",
        "--model",
        "bert-tiny",
        "--steps",
        "200",
        "--eval-interval",
        "200",
        "--eval-batches",
        "10",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = summary(dir.path());
    assert_eq!(s["model"], "bert-tiny");
    // 66 outputs (65 characters + the mask token): ln 66 = 4.19 nats untrained; the
    // characters' unigram entropy is 3.31 nats.
    let val = s["val_loss"].as_f64().unwrap();
    assert!(val < 3.3, "masked-LM validation loss {val} after 200 steps");
    // A masked LM cannot sample text.
    fails_with(
        &sinter(&["generate", "--checkpoint", dir.path().to_str().unwrap()]),
        &["bert-tiny"],
    );
}

#[test]
fn unknown_names_list_the_valid_ones() {
    fails_with(
        &sinter(&["train", "--model", "vgg16"]),
        &["vgg16", "cnn", "gpt-tiny", "resnet18"],
    );
    fails_with(
        &sinter(&["train", "--data", "imagenet"]),
        &["imagenet", "digits", "mnist:"],
    );
    fails_with(
        &sinter(&["train", "--optimizer", "lion"]),
        &["lion", "adamw", "sgd"],
    );
    fails_with(&sinter(&["train", "--device", "tpu"]), &["tpu", "cpu"]);
    fails_with(
        &sinter(&["train", "--model", "gpt-tiny", "--data", "digits"]),
        &["gpt-tiny", "digits"],
    );
}

#[test]
fn missing_and_corrupt_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    fails_with(
        &sinter(&["train", "--data", &format!("mnist:{}", missing.display())]),
        &["nope"],
    );
    fails_with(
        &sinter(&["eval", "--checkpoint", missing.to_str().unwrap()]),
        &["nope"],
    );
    // Garbage where a checkpoint should be.
    let bad = dir.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    std::fs::write(
        bad.join("checkpoint.safetensors"),
        b"this is not a checkpoint",
    )
    .unwrap();
    fails_with(
        &sinter(&["eval", "--checkpoint", bad.to_str().unwrap()]),
        &["corrupt"],
    );
    // A real checkpoint cut in half.
    let good = dir.path().join("good");
    let o = sinter(&[
        "train",
        "--quiet",
        "--model",
        "mlp",
        "--steps",
        "3",
        "--out",
        good.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(good.join("checkpoint.safetensors")).unwrap();
    std::fs::write(
        bad.join("checkpoint.safetensors"),
        &bytes[..bytes.len() / 2],
    )
    .unwrap();
    fails_with(
        &sinter(&["eval", "--checkpoint", bad.to_str().unwrap()]),
        &["truncated"],
    );
    fails_with(
        &sinter(&["train", "--resume", bad.to_str().unwrap()]),
        &["checkpoint"],
    );
    // A config file with an unknown key.
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "lr = 0.1\nlearning_rate = 2\n").unwrap();
    fails_with(
        &sinter(&["train", "--config", cfg.to_str().unwrap()]),
        &["c.toml"],
    );
}

#[test]
fn a_diverging_loss_stops_and_keeps_the_last_good_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let o = sinter(&[
        "train",
        "--quiet",
        "--model",
        "mlp",
        "--optimizer",
        "sgd",
        "--momentum",
        "0",
        "--lr",
        "1e30",
        "--lr-schedule",
        "constant",
        "--steps",
        "50",
        "--checkpoint-interval",
        "1",
        "--out",
        d,
    ]);
    fails_with(&o, &["loss became", "last good checkpoint"]);
    no_temporaries(dir.path());
    // The checkpoint left behind is whole and loadable.
    let o = sinter(&["eval", "--checkpoint", d]);
    assert!(
        !stderr(&o).contains("corrupt") && !stderr(&o).contains("panicked"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn config_file_sets_keys_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.toml");
    std::fs::write(
        &cfg,
        "model = \"mlp\"\nsteps = 4\nbatch_size = 16\nlr = 0.01\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = sinter(&[
        "train",
        "--quiet",
        "--config",
        cfg.to_str().unwrap(),
        "--batch-size",
        "8",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = summary(&out);
    assert_eq!(
        (
            s["model"].as_str(),
            s["steps"].as_u64(),
            s["batch_size"].as_u64()
        ),
        (Some("mlp"), Some(4), Some(8))
    );
}

#[test]
fn generate_continues_a_prompt_from_a_gpt_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let o = sinter(&[
        "train",
        "--quiet",
        "--model",
        "gpt-tiny",
        "--steps",
        "3",
        "--batch-size",
        "2",
        "--eval-batches",
        "1",
        "--out",
        d,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = sinter(&[
        "generate",
        "--checkpoint",
        d,
        "--prompt",
        "ROMEO:",
        "--max-new-tokens",
        "20",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.starts_with("ROMEO:"), "{text}");
    // The KV-cache path and the full recompute sample the same tokens from the same seed,
    // including past the 64-token context where the window slides.
    let sample = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--checkpoint",
            d,
            "--prompt",
            "ROMEO:",
            "--max-new-tokens",
            "80",
            "--seed",
            "7",
        ];
        args.extend_from_slice(extra);
        let o = sinter(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let cached = sample(&[]);
    assert!(cached.len() > "ROMEO:".len() + 40, "{cached}");
    assert_eq!(cached, sample(&["--no-kv-cache"]));
    fails_with(
        &sinter(&["generate", "--checkpoint", d, "--prompt", ""]),
        &["prompt"],
    );
}

#[test]
fn schedule_names_the_pipeline_schedule_and_points_lr_schedules_elsewhere() {
    fails_with(
        &sinter(&["train", "--schedule", "cosine", "--steps", "1"]),
        &["--lr-schedule cosine"],
    );
    fails_with(
        &sinter(&["train", "--schedule", "zigzag", "--steps", "1"]),
        &["gpipe", "1f1b"],
    );
    fails_with(
        &sinter(&["train", "--lr-schedule", "zigzag", "--steps", "1"]),
        &["lr-schedule", "cosine"],
    );
}

/// The main thread is one of rayon's workers (so a step's parallel ops run "in worker"
/// instead of being injected into the pool op by op), and the pool still has the size
/// RAYON_NUM_THREADS asks for.
#[test]
fn the_main_thread_is_one_of_the_rayon_threads_asked_for() {
    let o = sinter_cmd()
        .arg("info")
        .env("RAYON_NUM_THREADS", "3")
        .output()
        .expect("the binary runs");
    assert!(o.status.success());
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(
        t.contains("cpu: 3 threads (rayon, the main thread one of them;"),
        "{t}"
    );
}

#[test]
fn info_names_the_devices_and_dtypes() {
    let o = sinter(&["info"]);
    assert!(o.status.success());
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(
        t.contains("cpu:") && t.contains("bf16") && t.contains("cuda"),
        "{t}"
    );
}

#[test]
fn block_recompute_trains_the_same_run() {
    let mut losses = Vec::new();
    for mode in ["none", "block", "attn"] {
        let dir = tempfile::tempdir().unwrap();
        let o = sinter(&[
            "train",
            "--quiet",
            "--model",
            "gpt-tiny",
            "--steps",
            "3",
            "--batch-size",
            "2",
            "--eval-batches",
            "1",
            "--recompute",
            mode,
            "--out",
            dir.path().to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        losses.push(summary(dir.path())["val_loss"].as_f64().unwrap());
    }
    for l in &losses[1..] {
        assert!((l - losses[0]).abs() < 1e-5 * losses[0], "{losses:?}");
    }
    fails_with(
        &sinter(&["train", "--model", "gpt-tiny", "--recompute", "all"]),
        &["none", "attn", "block"],
    );
}

#[test]
fn fp16_with_zero_trains_and_unknown_precision_is_refused() {
    // ZeRO agrees on the fp16 overflow verdict across ranks (see sinter-dist's zero tests).
    let o = sinter(&[
        "train",
        "--quiet",
        "--model",
        "mlp",
        "--steps",
        "2",
        "--zero",
        "1",
        "--precision",
        "fp16",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    fails_with(&sinter(&["train", "--precision", "fp8"]), &["fp8", "bf16"]);
}
