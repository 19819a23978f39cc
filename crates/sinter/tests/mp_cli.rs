//! Tensor and pipeline parallel GPT through the real binary: two launched processes split
//! the model (by heads and vocabulary, or by layers) and follow the serial run's losses.

mod common;

use common::*;
use std::path::Path;

/// The run every strategy must follow, with parameter groups (each pipeline stage holds only
/// some of the parameters the rules name: the first has no ln_f).
const RUN: [&str; 18] = [
    "--param-group",
    "^w[tp]e:lr=0.0005",
    "--param-group",
    "ln_f:weight_decay=0.5",
    "--model",
    "gpt-tiny",
    "--steps",
    "4",
    "--batch-size",
    "4",
    "--eval-batches",
    "2",
    "--seed",
    "3",
    "--grad-clip",
    "1e9",
    "--log-interval",
    "1",
];

/// The two-rank run in `dir` reached the serial run's loss `want` on two ranks.
fn follows_serial(dir: &Path, want: f64, extra: &[&str]) {
    let s = summary(dir);
    let got = s["train_loss"].as_f64().unwrap();
    assert!(
        (got - want).abs() <= 1e-4 * want.abs(),
        "{extra:?}: loss {got} vs serial {want}"
    );
    assert_eq!(s["world_size"], 2);
}

/// The same splits with `mpirun -n 2 … --dist-backend mpi`: point-to-point for the pipeline,
/// sub-communicators and collectives over MPI.
#[test]
fn tensor_and_pipeline_parallel_over_mpi_follow_the_serial_run() {
    let mut runs = Vec::new();
    for extra in [
        vec!["--tp", "2"],
        vec!["--pp", "2", "--micro-batches", "2", "--schedule", "1f1b"],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut a = vec!["train", "--quiet", "--dist-backend", "mpi"];
        a.extend(RUN);
        a.extend(extra.iter().copied());
        a.extend(["--out", dir.path().to_str().unwrap()]);
        let Some(o) = mpirun(2, &a) else { return };
        ok(&o);
        runs.push((dir, extra));
    }
    let serial = tempfile::tempdir().unwrap();
    let mut a = vec!["train", "--quiet"];
    a.extend(RUN);
    a.extend(["--out", serial.path().to_str().unwrap()]);
    ok(&sinter(&a));
    let want = summary(serial.path())["train_loss"].as_f64().unwrap();
    for (dir, extra) in &runs {
        follows_serial(dir.path(), want, extra);
    }
}

#[test]
fn tensor_and_pipeline_parallel_follow_the_serial_run() {
    let serial = tempfile::tempdir().unwrap();
    let mut a = vec!["train", "--quiet"];
    a.extend(RUN);
    a.extend(["--out", serial.path().to_str().unwrap()]);
    ok(&sinter(&a));
    let want = summary(serial.path())["train_loss"].as_f64().unwrap();
    for extra in [
        vec!["--tp", "2"],
        vec!["--pp", "2", "--micro-batches", "2", "--schedule", "gpipe"],
        vec!["--pp", "2", "--micro-batches", "2", "--schedule", "1f1b"],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut a = vec![
            "launch",
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "--",
            "train",
            "--quiet",
        ];
        a.extend(RUN);
        a.extend(extra.iter().copied());
        a.extend(["--out", dir.path().to_str().unwrap()]);
        ok(&sinter(&a));
        follows_serial(dir.path(), want, &extra);
        // The gathered checkpoint is an ordinary one.
        ok(&sinter(&[
            "eval",
            "--checkpoint",
            dir.path().to_str().unwrap(),
        ]));
    }
    // A split that does not fit the ranks is a clear error, not a hang.
    let o = sinter(&[
        "launch",
        "--nproc-per-node",
        "2",
        "--master-port",
        "0",
        "--",
        "train",
        "--quiet",
        "--model",
        "gpt-tiny",
        "--tp",
        "4",
        "--steps",
        "1",
    ]);
    assert!(!o.status.success());
    assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
}

/// A TP = 2 run stopped at step 2 (its checkpoint holds the gathered weights and optimizer
/// state in the canonical layout) resumes on one process and on PP = 2, and both reach the
/// uninterrupted TP = 2 run's loss at step 4 (with gradient clipping active throughout).
#[test]
fn tp_checkpoint_resumes_on_one_rank_and_on_pipeline_parallel() {
    let base = [
        "--model",
        "gpt-tiny",
        "--steps",
        "4",
        "--batch-size",
        "4",
        "--eval-batches",
        "2",
        "--seed",
        "5",
        "--grad-clip",
        "0.5",
        "--log-interval",
        "1",
    ];
    let launch = |extra: &[&str], dir: &Path| {
        let mut a = vec![
            "launch",
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "--",
            "train",
            "--quiet",
        ];
        a.extend(extra.iter().copied());
        a.extend(["--out", dir.to_str().unwrap()]);
        ok(&sinter(&a));
    };
    let whole = tempfile::tempdir().unwrap();
    let mut a: Vec<&str> = base.to_vec();
    a.extend(["--tp", "2"]);
    launch(&a, whole.path());
    let want = summary(whole.path())["train_loss"].as_f64().unwrap();

    let half = tempfile::tempdir().unwrap();
    a.extend(["--stop-at-step", "2"]);
    launch(&a, half.path());
    let copy = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(half.path()).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), copy.path().join(f.file_name())).unwrap();
    }
    // One process (the ordinary training path) reads the TP checkpoint.
    let h = half.path().to_str().unwrap();
    ok(&sinter(&["train", "--quiet", "--resume", h]));
    let s = summary(half.path());
    assert_eq!(s["resumed_from_step"], 2);
    let got = s["train_loss"].as_f64().unwrap();
    assert!(
        (got - want).abs() <= 1e-4 * want.abs(),
        "TP=2 checkpoint resumed on 1 rank: loss {got} vs uninterrupted {want}"
    );
    // Pipeline parallel reads it too.
    let c = copy.path().to_str().unwrap();
    launch(
        &["--resume", c, "--pp", "2", "--micro-batches", "2"],
        copy.path(),
    );
    let s = summary(copy.path());
    assert_eq!(s["resumed_from_step"], 2);
    let got = s["train_loss"].as_f64().unwrap();
    assert!(
        (got - want).abs() <= 1e-4 * want.abs(),
        "TP=2 checkpoint resumed on PP=2: loss {got} vs uninterrupted {want}"
    );
}

/// A tensor-parallel launch is never silent between its first line and its end: its ranks'
/// output is a pipe (no progress bar), so rank 0 prints a plain progress line after the first
/// step (and every 10 s after).
#[test]
fn a_launched_tp_run_reports_its_first_step() {
    let mut a = vec![
        "launch",
        "--nproc-per-node",
        "2",
        "--master-port",
        "0",
        "--",
        "train",
    ];
    a.extend(RUN);
    a.extend(["--tp", "2"]);
    let o = sinter(&a);
    ok(&o);
    let e = stderr(&o);
    let at = |s: &str| e.find(s).unwrap_or_else(|| panic!("no '{s}' in {e}"));
    assert!(
        at("launch: started rank 1 of 2") < at("[rank 0] training gpt-tiny"),
        "{e}"
    );
    assert!(
        at("[rank 0] training gpt-tiny") < at("[rank 0] step 1/4 after "),
        "{e}"
    );
    assert!(
        at("[rank 0] step 1/4 after ") < at("[rank 0] done: step 4 of 4"),
        "{e}"
    );
    assert!(!e.contains("[rank 1] step"), "only rank 0 talks: {e}");
}
