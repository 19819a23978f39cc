//! Data parallel and ZeRO through the real binary: `sinter launch` starts processes that
//! rendezvous over TCP on 127.0.0.1.

mod common;

use common::*;
use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `sinter launch --nproc-per-node n --master-port 0 -- train --quiet …`
fn launch_train(n: usize, train: &[&str]) -> Output {
    let ns = n.to_string();
    let mut a = vec![
        "launch",
        "--nproc-per-node",
        &ns,
        "--master-port",
        "0",
        "--",
        "train",
        "--quiet",
    ];
    a.extend_from_slice(train);
    sinter(&a)
}

fn tensors(dir: &Path) -> HashMap<String, Vec<f32>> {
    let bytes = std::fs::read(dir.join("checkpoint.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| {
            (
                n,
                v.data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            )
        })
        .collect()
}

/// Every tensor whose name starts with `prefix` agrees within `tol`, relative:
/// ‖a − b‖₂ / ‖b‖₂ per tensor (Adam divides by √v, so single elements whose gradient is
/// nearly zero may move by more than f32 rounding suggests; the tensor norm does not).
fn assert_close(a: &Path, b: &Path, prefix: &str, tol: f64) {
    let (ta, tb) = (tensors(a), tensors(b));
    let mut names: Vec<&String> = ta.keys().filter(|n| n.starts_with(prefix)).collect();
    names.sort();
    assert!(!names.is_empty(), "no {prefix} tensors");
    let mut worst = (0f64, String::new());
    for n in names {
        let (x, y) = (
            &ta[n],
            tb.get(n)
                .unwrap_or_else(|| panic!("{n} missing from {}", b.display())),
        );
        assert_eq!(x.len(), y.len(), "{n}");
        let diff: f64 = x
            .iter()
            .zip(y)
            .map(|(p, q)| (*p as f64 - *q as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        let norm: f64 = y.iter().map(|q| (*q as f64).powi(2)).sum::<f64>().sqrt();
        let rel = diff / norm.max(1e-12);
        if rel > worst.0 {
            worst = (rel, n.clone());
        }
    }
    assert!(
        worst.0 <= tol,
        "{} vs {}: {} differs by {:e} (relative L2)",
        a.display(),
        b.display(),
        worst.1,
        worst.0
    );
}

const MLP: [&str; 8] = [
    "--model",
    "mlp",
    "--steps",
    "5",
    "--seed",
    "3",
    "--eval-batches",
    "1",
];

#[test]
fn two_launched_processes_equal_one_process_with_the_doubled_batch() {
    let one = tempfile::tempdir().unwrap();
    let two = tempfile::tempdir().unwrap();
    let accum = tempfile::tempdir().unwrap();
    let zero1 = tempfile::tempdir().unwrap();
    let mut a: Vec<&str> = vec![
        "train",
        "--quiet",
        "--batch-size",
        "32",
        "--out",
        one.path().to_str().unwrap(),
    ];
    a.extend_from_slice(&MLP);
    ok(&sinter(&a));
    let mut b: Vec<&str> = vec!["--batch-size", "16", "--out", two.path().to_str().unwrap()];
    b.extend_from_slice(&MLP);
    ok(&launch_train(2, &b));
    assert_close(two.path(), one.path(), "model.", 1e-5);
    assert_close(two.path(), one.path(), "optim.", 1e-4);
    let s = summary(two.path());
    assert_eq!(
        (s["world_size"].as_u64(), s["global_batch_size"].as_u64()),
        (Some(2), Some(32))
    );
    assert!(summary(one.path())["world_size"] == 1);
    // Only rank 0 writes: the run's files, once each, and nothing else.
    let mut names: Vec<String> = std::fs::read_dir(two.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "checkpoint.safetensors",
            "events.out.tfevents.sinter",
            "loss.svg",
            "metrics.csv",
            "metrics.jsonl",
            "summary.json"
        ]
    );
    // Gradient accumulation: 2 micro-batches of 16 = one batch of 32.
    let mut c: Vec<&str> = vec![
        "train",
        "--quiet",
        "--batch-size",
        "16",
        "--grad-accum",
        "2",
        "--out",
        accum.path().to_str().unwrap(),
    ];
    c.extend_from_slice(&MLP);
    ok(&sinter(&c));
    assert_close(accum.path(), one.path(), "model.", 1e-5);
    // ZeRO-1 on 2 processes, its optimizer state gathered into the usual names.
    let mut d: Vec<&str> = vec![
        "--batch-size",
        "16",
        "--zero",
        "1",
        "--out",
        zero1.path().to_str().unwrap(),
    ];
    d.extend_from_slice(&MLP);
    ok(&launch_train(2, &d));
    assert_close(zero1.path(), one.path(), "model.", 1e-5);
    assert_close(zero1.path(), one.path(), "optim.", 1e-4);
}

#[test]
fn a_zero2_checkpoint_from_4_ranks_resumes_on_2_and_on_1() {
    let whole = tempfile::tempdir().unwrap();
    let part = tempfile::tempdir().unwrap();
    let base = [
        "--model",
        "mlp",
        "--steps",
        "6",
        "--seed",
        "4",
        "--eval-batches",
        "1",
        "--zero",
        "2",
        "--batch-size",
        "8",
        "--bucket-mb",
        "0.05",
    ];
    let mut w: Vec<&str> = base.to_vec();
    w.extend(["--out", whole.path().to_str().unwrap()]);
    ok(&launch_train(4, &w));
    let mut p: Vec<&str> = base.to_vec();
    p.extend([
        "--stop-at-step",
        "3",
        "--out",
        part.path().to_str().unwrap(),
    ]);
    ok(&launch_train(4, &p));
    let copy = |to: &Path| {
        for f in ["checkpoint.safetensors", "metrics.jsonl"] {
            std::fs::copy(part.path().join(f), to.join(f)).unwrap();
        }
    };
    // On 2 ranks (ZeRO-2, batch 16 per rank, different buckets).
    let on2 = tempfile::tempdir().unwrap();
    copy(on2.path());
    ok(&launch_train(
        2,
        &[
            "--resume",
            on2.path().to_str().unwrap(),
            "--bucket-mb",
            "0.01",
        ],
    ));
    // On 1 process with the plain optimizer (batch 32).
    let on1 = tempfile::tempdir().unwrap();
    copy(on1.path());
    ok(&sinter(&[
        "train",
        "--quiet",
        "--resume",
        on1.path().to_str().unwrap(),
        "--zero",
        "0",
    ]));
    for (dir, what) in [(on2.path(), "2 ranks"), (on1.path(), "1 process")] {
        assert_close(dir, whole.path(), "model.", 1e-5);
        assert_close(dir, whole.path(), "optim.", 1e-4);
        let s = summary(dir);
        assert_eq!(s["steps"], 6, "{what}");
        assert_eq!(s["resumed_from_step"], 3, "{what}");
        assert_eq!(s["global_batch_size"], 32, "{what}");
    }
    assert_eq!(summary(on2.path())["world_size"], 2);
    assert_eq!(summary(on1.path())["world_size"], 1);
}

#[test]
fn a_killed_rank_fails_the_launch_naming_it_and_the_last_checkpoint_loads() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("launcher.log");
    let out = dir.path().join("run");
    let tag = format!(
        "SINTER_DP_TEST_TAG={}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    );
    let (k, v) = tag.split_once('=').unwrap();
    let mut launcher = sinter_cmd()
        .args([
            "launch",
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "--grace-period",
            "2",
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
            "2",
            "--eval-interval",
            "1000000",
            "--out",
            out.to_str().unwrap(),
        ])
        .env(k, v)
        .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
        .stderr(Stdio::from(
            std::fs::File::create(dir.path().join("launcher.err")).unwrap(),
        ))
        .spawn()
        .unwrap();
    let stop = |l: &mut std::process::Child| {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(l.id().to_string())
            .status();
        let _ = l.wait();
    };
    // Wait for a checkpoint, then kill rank 1 with SIGKILL.
    let t = Instant::now();
    while !out.join("checkpoint.safetensors").exists() {
        if t.elapsed() > Duration::from_secs(60) || launcher.try_wait().unwrap().is_some() {
            stop(&mut launcher);
            panic!(
                "no checkpoint appeared: {}",
                std::fs::read_to_string(dir.path().join("launcher.err")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let Some(pid) = find_rank(&tag, 1) else {
        stop(&mut launcher);
        panic!("rank 1 not found");
    };
    let killed_at = Instant::now();
    assert!(Command::new("kill")
        .arg("-KILL")
        .arg(pid.to_string())
        .status()
        .unwrap()
        .success());
    let status = loop {
        if let Some(s) = launcher.try_wait().unwrap() {
            break s;
        }
        if killed_at.elapsed() > Duration::from_secs(30) {
            stop(&mut launcher);
            panic!("the launcher did not exit within 30 s of rank 1's death");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let waited = killed_at.elapsed();
    let err = std::fs::read_to_string(dir.path().join("launcher.err")).unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("error: rank 1 (local rank 1 on node 0) failed with signal 9 (SIGKILL)"),
        "{err}"
    );
    assert!(waited < Duration::from_secs(15), "took {waited:?}");
    // No rank is left behind.
    assert!(
        find_rank(&tag, 0).is_none() && find_rank(&tag, 1).is_none(),
        "a rank survived"
    );
    // The last checkpoint is whole and loads.
    let o = sinter(&["eval", "--checkpoint", out.to_str().unwrap()]);
    ok(&o);
    assert!(String::from_utf8_lossy(&o.stdout).contains("validation loss"));
}

#[test]
fn launch_dry_run_and_bench_commands() {
    let o = sinter(&[
        "launch",
        "--nproc-per-node",
        "2",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.1",
        "--dry-run",
        "--",
        "train",
        "--model",
        "mlp",
    ]);
    ok(&o);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("world size 4")
            && text.contains("[rank 3]")
            && text.contains("MASTER_ADDR=10.0.0.1")
            && text.contains("train --model mlp"),
        "{text}"
    );
    let dir = tempfile::tempdir().unwrap();
    let o = sinter(&[
        "bench",
        "scaling",
        "--max-gpus",
        "512",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    ok(&o);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("512 ")),
        "{text}"
    );
    assert!(std::fs::read_to_string(dir.path().join("scaling.svg"))
        .unwrap()
        .contains("<svg"));
    let o = sinter(&[
        "bench",
        "allreduce",
        "--ranks",
        "2",
        "--mb",
        "1",
        "--iters",
        "2",
    ]);
    ok(&o);
    let text = String::from_utf8_lossy(&o.stdout);
    for t in ["memcpy", "threads", "tcp threads", "tcp processes", "busbw"] {
        assert!(text.contains(t), "{t} missing: {text}");
    }
    // A bad flag is an error, not a panic.
    let o = sinter(&["train", "--zero", "3"]);
    assert!(
        !o.status.success()
            && String::from_utf8_lossy(&o.stderr).contains("--zero must be 0, 1 or 2")
    );
}

/// `--dist-backend`: NCCL asked for with a CPU model is a clear error on every rank (naming
/// the rank and the fix); an unknown backend is refused; `host` and `auto` train on the CPU.
#[test]
fn dist_backend_flag() {
    let base = ["--model", "mlp", "--steps", "1", "--batch-size", "8"];
    let mut a = base.to_vec();
    a.extend(["--dist-backend", "nccl"]);
    let o = launch_train(2, &a);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--dist-backend nccl")
            && err.contains("--device cuda")
            && err.contains("--dist-backend host"),
        "{err}"
    );
    let mut a = vec!["train", "--dp"];
    a.extend(base);
    a.extend(["--dist-backend", "mpi"]);
    let o = sinter(&a);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("mpi") && err.contains("auto, nccl or host"),
        "{err}"
    );
    for b in ["host", "auto"] {
        let mut a = base.to_vec();
        a.extend(["--dist-backend", b]);
        ok(&launch_train(2, &a));
    }
}

#[test]
fn launch_bounds_the_rank_count_and_says_when_each_rank_starts() {
    // Far more ranks than cores: refused at once, with the way to insist.
    let t = Instant::now();
    let o = sinter(&[
        "launch",
        "--nproc-per-node",
        "10000",
        "--master-port",
        "0",
        "--",
        "train",
        "--steps",
        "1",
    ]);
    fails_with(
        &o,
        &["--nproc-per-node 10000", "CPU core", "--oversubscribe"],
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    // A line per started rank, before any rank has printed anything.
    let o = sinter(&[
        "launch",
        "--nproc-per-node",
        "2",
        "--master-port",
        "0",
        "--",
        "info",
    ]);
    ok(&o);
    let e = stderr(&o);
    for r in 0..2 {
        assert!(
            e.contains(&format!("launch: started rank {r} of 2 (pid ")),
            "{e}"
        );
    }
}
