//! The training step end to end: `--cuda-graph` on the CPU, and fp16 dynamic loss scaling on the
//! device (its state read back at log intervals and saved in checkpoints for an exact resume).

mod common;

use common::*;
use std::path::Path;

#[test]
fn cuda_graph_on_the_cpu_is_ignored_with_a_note() {
    let o = sinter(&[
        "train",
        "--device",
        "cpu",
        "--cuda-graph",
        "--model",
        "mlp",
        "--steps",
        "3",
        "--eval-batches",
        "1",
    ]);
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(e.contains("--cuda-graph ignored on the CPU"), "{e}");
}

#[test]
fn fp16_runs_log_the_device_loss_scale_and_resume_exactly() {
    let whole = tempfile::tempdir().unwrap();
    let parts = tempfile::tempdir().unwrap();
    let base = [
        "train",
        "--quiet",
        "--device",
        "cpu",
        "--model",
        "mlp",
        "--precision",
        "fp16",
        "--steps",
        "8",
        "--checkpoint-interval",
        "4",
        "--log-interval",
        "2",
        "--grad-clip",
        "1.0",
        "--eval-batches",
        "1",
        "--seed",
        "3",
    ];
    let run = |dir: &Path, more: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(&["--out", dir.to_str().unwrap()]);
        a.extend_from_slice(more);
        let o = sinter(&a);
        assert!(o.status.success(), "{}", stderr(&o));
    };
    run(whole.path(), &[]);
    run(parts.path(), &["--stop-at-step", "5"]);
    let o = sinter(&[
        "train",
        "--quiet",
        "--resume",
        parts.path().to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let metrics = std::fs::read_to_string(whole.path().join("metrics.jsonl")).unwrap();
    let logged: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v.get("train_loss").is_some())
        .collect();
    assert_eq!(logged.len(), 4, "{metrics}");
    for v in &logged {
        // Read back from the device at the log interval: the initial scale (no overflow in a
        // few steps of a small MLP) and a finite gradient norm.
        assert_eq!(v["loss_scale"], 65536.0, "{v}");
        assert_eq!(v["skipped_steps"], 0, "{v}");
        assert!(v["grad_norm"].as_f64().unwrap().is_finite(), "{v}");
    }
    let (ta, ma) = checkpoint_content(whole.path());
    let (tb, mb) = checkpoint_content(parts.path());
    assert_eq!(ma, mb, "metadata differs");
    let p = ma
        .iter()
        .find(|(k, _)| k == "precision")
        .expect("precision state saved");
    assert!(p.1.contains("loss_scale") && p.1.contains("fp16"), "{p:?}");
    assert_eq!(ta.len(), tb.len());
    for ((na, a), (nb, b)) in ta.iter().zip(&tb) {
        assert_eq!(na, nb);
        assert!(a == b, "tensor {na} differs after resume");
    }
}

/// `--device cuda-emu`: the whole trainer on the emulated CUDA device (sinter's CUDA kernels
/// run by the kernel emulator) follows the CPU run. Needs the emulator's C++ compiler: a
/// machine without one says so and skips, unless SINTER_REQUIRE_EMU=1 (as in CI).
#[test]
fn the_trainer_runs_on_the_emulated_cuda_device_like_on_the_cpu() {
    let run = |device: &str, dir: &Path| {
        sinter(&[
            "train",
            "--quiet",
            "--device",
            device,
            "--model",
            "mlp",
            "--steps",
            "3",
            "--batch-size",
            "8",
            "--eval-batches",
            "1",
            "--out",
            dir.to_str().unwrap(),
        ])
    };
    let (emu, cpu) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let o = run("cuda-emu", emu.path());
    if !o.status.success() && std::env::var("SINTER_REQUIRE_EMU").as_deref() != Ok("1") {
        eprintln!(
            "skipped: the emulated CUDA device is not available: {}",
            stderr(&o)
        );
        return;
    }
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run("cpu", cpu.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let summary = |d: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(d.join("summary.json")).unwrap()).unwrap()
    };
    let (a, b) = (summary(emu.path()), summary(cpu.path()));
    assert_eq!(a["device"], "cuda:0");
    for k in ["train_loss", "val_loss"] {
        let (x, y) = (a[k].as_f64().unwrap(), b[k].as_f64().unwrap());
        assert!(
            (x - y).abs() <= 1e-5 * y.abs(),
            "{k}: emulated {x} vs cpu {y}"
        );
    }
}
