//! The fault test: a run killed with SIGKILL at random moments (checkpointing every step) and
//! resumed each time ends with the same checkpoint file, byte for byte, as a run that was
//! never interrupted, and with every logged step in metrics.jsonl exactly once.

mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const STEPS: u64 = 40;

fn args(out: &Path) -> Vec<String> {
    [
        "train",
        "--quiet",
        "--model",
        "mlp",
        "--steps",
        &STEPS.to_string(),
        "--batch-size",
        "32",
        "--checkpoint-interval",
        "1",
        "--log-interval",
        "1",
        "--eval-interval",
        "10",
        "--eval-batches",
        "1",
        "--seed",
        "11",
        "--out",
        out.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The step a run directory's checkpoint holds (None: no checkpoint yet).
fn checkpoint_step(dir: &Path) -> Option<u64> {
    let bytes = std::fs::read(dir.join("checkpoint.safetensors")).ok()?;
    let (_, h) = safetensors::SafeTensors::read_metadata(&bytes).ok()?;
    h.metadata().as_ref()?.get("step")?.parse().ok()
}

/// The command that continues the run in `out`: resume if it has a checkpoint, else start
/// it anew over whatever a killed first attempt left.
fn next_attempt(out: &Path) -> Command {
    let mut c = sinter_cmd();
    c.args(args(out))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    match checkpoint_step(out) {
        Some(_) => c.args(["--resume", out.to_str().unwrap()]),
        None => c.arg("--overwrite"),
    };
    c
}

/// (step, is a validation row) of every metrics.jsonl line.
fn history(dir: &Path) -> Vec<(u64, bool)> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("whole JSON lines only");
            (v["step"].as_u64().unwrap(), v.get("val_loss").is_some())
        })
        .collect()
}

#[test]
fn sigkill_at_random_moments_then_resume_equals_an_uninterrupted_run() {
    let root = tempfile::tempdir().unwrap();
    let (whole, killed) = (root.path().join("whole"), root.path().join("killed"));
    let started = Instant::now();
    let o = sinter_cmd().args(args(&whole)).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Kill moments are drawn inside the uninterrupted run's own duration, so a fast machine
    // (the whole run in a few hundred milliseconds) is interrupted as surely as a slow one.
    let whole_ms = (started.elapsed().as_millis() as u64).max(20);
    // Random kill moments, reproducible from the printed seed.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("kill schedule seed {seed}");
    let mut rng = seed | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let t = Instant::now();
    let mut kills = 0;
    while checkpoint_step(&killed) != Some(STEPS) || kills == 0 {
        assert!(t.elapsed() < Duration::from_secs(120), "no progress");
        if kills == 0 && checkpoint_step(&killed) == Some(STEPS) {
            // Every kill came too late (the run had already finished): start over.
            std::fs::remove_dir_all(&killed).unwrap();
        }
        let mut child = next_attempt(&killed).spawn().unwrap();
        if kills < 8 {
            // Between 5 % and 90 % of an uninterrupted run (a resumed attempt is shorter, so
            // late draws may miss it; the loop only needs one kill to land).
            let ms = whole_ms / 20 + next() % (whole_ms * 17 / 20);
            std::thread::sleep(Duration::from_millis(ms));
            if child.try_wait().unwrap().is_none() {
                child.kill().unwrap();
                kills += 1;
            }
        }
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked") && !err.contains("error"), "{err}");
    }
    // The loop above ends only after at least one kill landed.
    eprintln!("{kills} kills in an uninterrupted run of {whole_ms} ms");
    assert!(
        std::fs::read(whole.join("checkpoint.safetensors")).unwrap()
            == std::fs::read(killed.join("checkpoint.safetensors")).unwrap(),
        "the resumed checkpoint differs (seed {seed})"
    );
    let (a, b) = (history(&whole), history(&killed));
    assert_eq!(a, b, "seed {seed}");
    let train: Vec<u64> = b.iter().filter(|(_, v)| !v).map(|(s, _)| *s).collect();
    assert_eq!(train, (1..=STEPS).collect::<Vec<_>>());
    for e in std::fs::read_dir(&killed).unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!n.contains(".tmp-"), "left {n}");
    }
}
