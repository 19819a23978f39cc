//! Stopping a run from outside: SIGTERM/SIGINT checkpoint and exit (a second signal exits at
//! once), a closed output pipe stops the run quietly, and the ranks of a launcher killed
//! with SIGKILL die with it.

mod common;

use common::*;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn signal(pid: u32, sig: &str) {
    assert!(Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success());
}

/// Waits up to `secs` for `path` to exist.
fn wait_for(path: &Path, child: &mut Child, secs: u64) {
    let t = Instant::now();
    while !path.exists() {
        if t.elapsed() > Duration::from_secs(secs) || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!("{} did not appear", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits up to `secs` for the child to exit; its exit code (or the signal as 128 + n).
fn wait_exit(child: &mut Child, secs: u64) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    let s = wait_child(child, Duration::from_secs(secs), "the run");
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
}

fn long_run(out: &Path, model: &str, extra: &[&str]) -> Command {
    let mut c = sinter_cmd();
    c.args([
        "train",
        "--model",
        model,
        "--steps",
        "1000000",
        "--checkpoint-interval",
        "1000000",
        "--log-interval",
        "1000000",
        "--out",
        out.to_str().unwrap(),
    ])
    .args(extra)
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    c
}

#[test]
fn sigterm_writes_a_checkpoint_and_summary_and_the_run_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let mut child = long_run(
        &out,
        "mlp",
        &["--eval-batches", "1", "--eval-interval", "1000000"],
    )
    .spawn()
    .unwrap();
    wait_for(&out.join("metrics.jsonl"), &mut child, 60);
    std::thread::sleep(Duration::from_millis(500));
    signal(child.id(), "-TERM");
    assert_eq!(wait_exit(&mut child, 60), 128 + 15);
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let step = s["steps"].as_u64().unwrap();
    assert!(step > 0 && step < 1_000_000, "{s}");
    assert!(out.join("loss.svg").exists());
    // The checkpoint is at that step: the run continues from it.
    let o = sinter_cmd()
        .args([
            "train",
            "--quiet",
            "--resume",
            out.to_str().unwrap(),
            "--steps",
            &(step + 2).to_string(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["resumed_from_step"], step);
}

#[test]
fn a_second_signal_exits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // A large batch: the step in flight when the first signal comes takes seconds to finish
    // (a stop skips the evaluation), and the second signal cuts it short.
    let mut child = long_run(
        &out,
        "gpt-tiny",
        &[
            "--batch-size",
            "64",
            "--eval-batches",
            "0",
            "--eval-interval",
            "1000000",
        ],
    )
    .spawn()
    .unwrap();
    wait_for(&out.join("metrics.jsonl"), &mut child, 120);
    std::thread::sleep(Duration::from_millis(300));
    signal(child.id(), "-INT");
    std::thread::sleep(Duration::from_millis(100));
    signal(child.id(), "-INT");
    let t = Instant::now();
    assert_eq!(wait_exit(&mut child, 10), 128 + 2);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(!out.join("summary.json").exists());
}

#[test]
fn a_stop_skips_the_evaluation_and_checkpoints_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // Every validation batch after every step: the signal lands in (or just before) a pass
    // over the whole validation data, which the stop cuts short instead of finishing.
    let mut child = long_run(
        &out,
        "gpt-tiny",
        &["--eval-batches", "0", "--eval-interval", "1"],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    wait_for(&out.join("metrics.jsonl"), &mut child, 120);
    std::thread::sleep(Duration::from_millis(500));
    signal(child.id(), "-TERM");
    let mut pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut err = String::new();
        let _ = pipe.read_to_string(&mut err);
        err
    });
    let code = wait_exit(&mut child, 60);
    let err = reader.join().unwrap();
    assert_eq!(code, 128 + 15, "{err}");
    assert!(
        err.contains("evaluation skipped: SIGTERM received"),
        "{err}"
    );
    assert!(out.join("checkpoint.safetensors").exists(), "{err}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let step = s["steps"].as_u64().unwrap();
    assert!(step < 1_000_000, "{s}");
}

#[test]
fn a_closed_output_pipe_stops_the_run_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // An evaluation line every 5 steps: output after the pipe closes.
    let mut child = long_run(
        &out,
        "mlp",
        &["--eval-batches", "1", "--eval-interval", "5"],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut err = child.stderr.take().unwrap();
    let mut first = [0u8; 1];
    err.read_exact(&mut first).unwrap();
    drop(err);
    let code = wait_exit(&mut child, 60);
    assert_eq!(code, 128 + 13, "exit code {code}");
    // It stopped as if asked: checkpoint and summary written.
    assert!(out.join("summary.json").exists() && out.join("checkpoint.safetensors").exists());
}

#[test]
fn ranks_die_with_a_launcher_killed_by_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let tag = format!("SINTER_SIGNALS_TEST_TAG={}", std::process::id());
    let (k, v) = tag.split_once('=').unwrap();
    let mut launcher = sinter_cmd()
        .args([
            "launch",
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "--",
            "train",
            "--quiet",
            "--model",
            "mlp",
            "--steps",
            "1000000",
            "--batch-size",
            "8",
            "--checkpoint-interval",
            "1000000",
            "--out",
            out.to_str().unwrap(),
        ])
        .env(k, v)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&out.join("metrics.jsonl"), &mut launcher, 60);
    assert!(find_rank(&tag, 0).is_some() && find_rank(&tag, 1).is_some());
    signal(launcher.id(), "-KILL");
    let _ = launcher.wait();
    let t = Instant::now();
    while find_rank(&tag, 0).is_some() || find_rank(&tag, 1).is_some() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "a rank outlived its launcher"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
