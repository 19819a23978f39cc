//! What a new user reads: `train --help` (every flag with its default, grouped), `bench
//! --help`, epochs numbered alike on the terminal and in metrics.jsonl, and `eval` agreeing
//! with the run's last validation loss or saying why not.

use std::process::{Command, Output};

fn sinter(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sinter"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// (flag, its help text) of every option in a `--help` page.
fn options(help: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in help.lines() {
        let t = line.trim_start();
        if t.starts_with("-") && line.starts_with("  ") {
            let flag = t
                .split(|c: char| c == ' ' || c == ',')
                .find(|w| w.starts_with("--"))
                .unwrap_or(t)
                .to_string();
            out.push((flag, t.to_string()));
        } else if let Some(last) = out.last_mut() {
            if line.starts_with("  ") {
                last.1.push(' ');
                last.1.push_str(t);
            } else {
                out.push((String::new(), String::new()));
            }
        }
    }
    out.into_iter().filter(|(f, _)| !f.is_empty()).collect()
}

#[test]
fn every_train_flag_says_what_it_does_and_its_default() {
    let o = sinter(&["train", "--help"]);
    assert!(o.status.success());
    let help = stdout(&o);
    let opts = options(&help);
    assert!(opts.len() > 30, "{help}");
    for (flag, text) in &opts {
        if flag == "--help" {
            continue;
        }
        assert!(
            text.contains("[default:"),
            "{flag} does not state its default: {text}"
        );
    }
    let model = &opts.iter().find(|(f, _)| f == "--model").unwrap().1;
    assert!(model.contains("bert-tiny") && model.contains("bert-base"), "{model}");
    // Common flags first, the parallel ones grouped after.
    let at = |s: &str| help.find(s).unwrap_or_else(|| panic!("{s} missing: {help}"));
    assert!(at("Run:") < at("Optimization:"));
    assert!(at("Optimization:") < at("Parallel training"));
    assert!(at("--model") < at("--tp"));
    assert!(at("Parallel training") < at("--zero"));
}

#[test]
fn bench_help_lists_every_benchmark() {
    let top = stdout(&sinter(&["--help"]));
    let bench = stdout(&sinter(&["bench", "--help"]));
    let gpu = stdout(&sinter(&["bench", "gpu", "--help"]));
    for name in ["scaling", "allreduce", "gpu"] {
        assert!(bench.contains(name), "{name}: {bench}");
        assert!(top.contains(name), "{name}: {top}");
    }
    for name in ["gemm", "tc", "linear", "bandwidth", "attention"] {
        assert!(bench.contains(name) && gpu.contains(name), "{name}: {bench}");
    }
}

#[test]
fn epochs_match_and_eval_agrees_with_the_runs_last_validation_loss() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let o = sinter(&[
        "train",
        "--model",
        "mlp",
        "--epochs",
        "2",
        "--eval-batches",
        "2",
        "--out",
        d,
    ]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let metrics = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    let val_epochs: Vec<u64> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("val_loss").is_some())
        .map(|v| v["epoch"].as_u64().unwrap())
        .collect();
    assert_eq!(val_epochs, [1, 2], "{metrics}");
    assert!(err.contains("epoch 1: ") && err.contains("epoch 2: "), "{err}");
    assert!(!err.contains("epoch 0"), "{err}");
    // The run evaluated 2 batches and says so; eval over all batches says so too, and over
    // the same 2 batches it gives the run's number.
    assert!(err.contains("over 2 of 6 validation batches"), "{err}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("summary.json")).unwrap())
            .unwrap();
    let all = stdout(&sinter(&["eval", "--checkpoint", d]));
    assert!(all.contains("all 6 validation batches"), "{all}");
    let same = stdout(&sinter(&["eval", "--checkpoint", d, "--eval-batches", "2"]));
    let want = format!("validation loss {:.4}", s["val_loss"].as_f64().unwrap());
    assert!(same.contains(&want) && same.contains("2 of 6"), "{same} vs {want}");
}
