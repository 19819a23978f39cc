//! Data parallel and ZeRO through the real binary: `sinter launch` starts processes that
//! rendezvous over TCP on 127.0.0.1.

mod common;

use common::*;
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

/// `mpirun -n 2 sinter train --dist-backend mpi` (or `auto`): data parallel and ZeRO 1/2 over
/// MPI's collectives (rank and world from MPI, no rendezvous) end with the weights and optimizer
/// state of one process with the doubled batch; ranks started by `sinter launch` instead are
/// refused, naming the fix.
#[test]
fn mpi_ranks_equal_one_process() {
    let one = tempfile::tempdir().unwrap();
    let mut a: Vec<&str> = vec!["train", "--quiet", "--batch-size", "32", "--out"];
    a.push(one.path().to_str().unwrap());
    a.extend_from_slice(&MLP);
    let mut runs = Vec::new();
    // ZeRO 0 through `--dist-backend auto`, which under mpirun means MPI (no rendezvous).
    for (zero, backend) in [("0", "auto"), ("1", "mpi"), ("2", "mpi")] {
        let dir = tempfile::tempdir().unwrap();
        let mut b: Vec<&str> = vec!["train", "--dist-backend", backend, "--zero", zero];
        b.extend(["--batch-size", "16", "--out", dir.path().to_str().unwrap()]);
        b.extend_from_slice(&MLP);
        let Some(o) = mpirun(2, &b) else { return };
        ok(&o);
        assert!(
            stderr(&o).contains("distributed backend: MPI"),
            "--dist-backend {backend}: {}",
            stderr(&o)
        );
        runs.push(dir);
    }
    ok(&sinter(&a));
    for dir in &runs {
        assert_close(dir.path(), one.path(), "model.", 1e-5);
        assert_close(dir.path(), one.path(), "optim.", 1e-4);
        let s = summary(dir.path());
        assert_eq!(
            (s["world_size"].as_u64(), s["global_batch_size"].as_u64()),
            (Some(2), Some(32))
        );
    }
    let o = launch_train(
        2,
        &["--dist-backend", "mpi", "--model", "mlp", "--steps", "1"],
    );
    fails_with(&o, &["--dist-backend mpi", "mpirun -n 2"]);
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
fn launch_shares_the_cores_among_its_ranks_unless_rayon_num_threads_is_set() {
    let dry = |threads: Option<&str>| {
        let mut c = sinter_cmd();
        c.args([
            "launch",
            "--nproc-per-node",
            "2",
            "--dry-run",
            "--",
            "train",
        ]);
        match threads {
            Some(t) => c.env("RAYON_NUM_THREADS", t),
            None => c.env_remove("RAYON_NUM_THREADS"),
        };
        let o = c.output().unwrap();
        ok(&o);
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let cores = std::thread::available_parallelism().unwrap().get();
    let text = dry(None);
    for (rank, share) in [(0, cores.div_ceil(2)), (1, (cores / 2).max(1))] {
        let line = text
            .lines()
            .find(|l| l.contains(&format!("[rank {rank}]")))
            .unwrap_or_else(|| panic!("no rank {rank} in {text}"));
        let want = format!("RAYON_NUM_THREADS={share}");
        assert!(
            line.split_whitespace().any(|w| w == want),
            "rank {rank} of 2 on {cores} cores: {line}"
        );
    }
    // The user's count reaches every rank as it is: the launcher sets nothing over it.
    assert!(!dry(Some("3")).contains("RAYON_NUM_THREADS="));
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
    // A measured link (--link-gbs) replaces the assumed network, and a slower one scales worse.
    let efficiency_at_64 = |link: &[&str]| -> f64 {
        let d = tempfile::tempdir().unwrap();
        let mut args = vec!["bench", "scaling", "--max-gpus", "64", "--out"];
        args.push(d.path().to_str().unwrap());
        args.extend_from_slice(link);
        let text = ok(&sinter(&args));
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("64 "))
            .unwrap_or_else(|| panic!("no 64-GPU row: {text}"));
        let dp_eff = row
            .split('|')
            .nth(1)
            .unwrap()
            .split_whitespace()
            .last()
            .unwrap();
        dp_eff.trim_end_matches('%').parse().unwrap()
    };
    let assumed = efficiency_at_64(&[]);
    let measured = efficiency_at_64(&["--link-gbs", "0.92", "--link-latency-us", "50"]);
    assert!(measured < assumed / 2.0, "{measured} % vs {assumed} %");
    fails_with(
        &sinter(&["bench", "scaling", "--link-gbs", "0"]),
        &["--link-gbs"],
    );
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
    a.extend(["--dist-backend", "ucc"]);
    fails_with(&sinter(&a), &["ucc", "auto, nccl, host or mpi"]);
    // MPI in a build without it names the feature (with it: `mpi_ranks_equal_one_process`).
    if !cfg!(feature = "mpi") {
        a.pop();
        a.push("mpi");
        fails_with(
            &sinter(&a),
            &["--dist-backend mpi", "--features sinter/mpi"],
        );
    }
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

/// Variables of the job systems `sinter launch` reads, removed from a test's child so that
/// the machine's own environment cannot leak in.
const JOB_VARS: [&str; 22] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "LWS_LEADER_ADDRESS",
    "LWS_GROUP_SIZE",
    "LWS_WORKER_INDEX",
    "JOB_COMPLETION_INDEX",
    "JOBSET_NAME",
    "REPLICATED_JOB_NAME",
    "JOBSET_SUBDOMAIN",
    "JOB_INDEX",
    "VC_TASK_INDEX",
    "SINTER_TEST_EXIT_AFTER_STEP",
    "SINTER_RESTART_ROUND",
];

fn clean_cmd() -> Command {
    let mut c = sinter_cmd();
    for v in JOB_VARS {
        c.env_remove(v);
    }
    c
}

/// (variables, extra flags, expected source, nodes × ranks, this node, master)
type DryRunCase = (
    &'static [(&'static str, &'static str)],
    &'static [&'static str],
    &'static str,
    &'static str,
    usize,
    &'static str,
);

#[test]
fn launch_dry_run_under_each_kubernetes_environment() {
    let cases: [DryRunCase; 6] = [
        (
            &[
                ("PET_NNODES", "2"),
                ("PET_NPROC_PER_NODE", "3"),
                ("PET_NODE_RANK", "1"),
                ("PET_MASTER_ADDR", "tj-node-0-0.tj"),
                ("PET_MASTER_PORT", "29400"),
            ],
            &[],
            "Kubeflow Trainer",
            "world size 6 = 2 node(s) × 3 rank(s)",
            1,
            "master tj-node-0-0.tj:29400",
        ),
        (
            &[
                ("LWS_LEADER_ADDRESS", "lws-0.lws"),
                ("LWS_GROUP_SIZE", "3"),
                ("LWS_WORKER_INDEX", "2"),
            ],
            &["--nproc-per-node", "2"],
            "LeaderWorkerSet",
            "world size 6 = 3 node(s) × 2 rank(s)",
            2,
            "master lws-0.lws:29500",
        ),
        (
            &[
                ("JOB_COMPLETION_INDEX", "1"),
                ("JOBSET_NAME", "js"),
                ("REPLICATED_JOB_NAME", "node"),
            ],
            &["--nproc-per-node", "2", "--nnodes", "2"],
            "JobSet",
            "world size 4 = 2 node(s) × 2 rank(s)",
            1,
            "master js-node-0-0.js:29500",
        ),
        (
            &[
                ("RANK", "1"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "pj-master-0"),
                ("MASTER_PORT", "23456"),
            ],
            &["--nproc-per-node", "1"],
            "PyTorchJob v1",
            "world size 2 = 2 node(s) × 1 rank(s)",
            1,
            "master pj-master-0:23456",
        ),
        (
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "vc-master-0.vc"),
                ("VC_TASK_INDEX", "0"),
            ],
            &["--nproc-per-node", "2"],
            "Volcano",
            "world size 4 = 2 node(s) × 2 rank(s)",
            0,
            "master vc-master-0.vc:29500",
        ),
        // Flags override the variables.
        (
            &[
                ("PET_NNODES", "2"),
                ("PET_NPROC_PER_NODE", "3"),
                ("PET_NODE_RANK", "1"),
                ("PET_MASTER_ADDR", "tj-node-0-0.tj"),
            ],
            &[
                "--nproc-per-node",
                "1",
                "--node-rank",
                "0",
                "--master-addr",
                "h",
            ],
            "Kubeflow Trainer",
            "world size 2 = 2 node(s) × 1 rank(s)",
            0,
            "master h:29500",
        ),
    ];
    for (vars, flags, source, layout, node, master) in cases {
        let mut c = clean_cmd();
        c.arg("launch")
            .args(flags)
            .args(["--dry-run", "--", "train"]);
        c.envs(vars.iter().copied());
        let o = c.output().unwrap();
        let out = ok(&o);
        assert!(
            out.contains(&format!("job variables: {source}")),
            "{vars:?}\n{out}"
        );
        assert!(out.contains(layout), "{vars:?}: want `{layout}`\n{out}");
        assert!(
            out.contains(&format!("this is node {node}; {master}")),
            "{vars:?}: want node {node}, {master}\n{out}"
        );
        // The ranks it would start are exactly this node's.
        let nproc: usize = layout.split(" × ").nth(1).unwrap()[..1].parse().unwrap();
        let mine: Vec<usize> = out
            .lines()
            .filter(|l| l.ends_with("(this node)"))
            .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(
            mine,
            (node * nproc..(node + 1) * nproc).collect::<Vec<_>>(),
            "{out}"
        );
    }
    // Two systems that disagree are refused, both named.
    let o = clean_cmd()
        .args(["launch", "--dry-run", "--", "train"])
        .envs([
            ("PET_NNODES", "2"),
            ("PET_NPROC_PER_NODE", "1"),
            ("PET_NODE_RANK", "1"),
            ("LWS_WORKER_INDEX", "0"),
            ("LWS_GROUP_SIZE", "2"),
        ])
        .output()
        .unwrap();
    fails_with(
        &o,
        &[
            "conflicting job variables",
            "PET_NODE_RANK",
            "LWS_WORKER_INDEX",
        ],
    );
    // `-- sinter train` (the deploy/ manifests' form) runs `train`, not `sinter sinter train`.
    let plain = clean_cmd()
        .args([
            "launch",
            "--nproc-per-node",
            "1",
            "--dry-run",
            "--",
            "sinter",
            "train",
        ])
        .output()
        .unwrap();
    let out = ok(&plain);
    let cmd = out.lines().find(|l| l.starts_with("command: ")).unwrap();
    assert!(
        cmd.ends_with("/sinter train") && !cmd.contains("sinter sinter"),
        "{out}"
    );
}

/// The train flags of the restart tests: an MLP, a checkpoint every step.
fn restart_train_args(out: &Path) -> Vec<String> {
    [
        "train",
        "--quiet",
        "--model",
        "mlp",
        "--steps",
        "6",
        "--batch-size",
        "8",
        "--seed",
        "5",
        "--checkpoint-interval",
        "1",
        "--eval-batches",
        "1",
        "--eval-interval",
        "1000",
        "--out",
        out.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A unique `KEY=value` for finding this test's ranks in /proc.
fn test_tag(name: &str) -> (String, String) {
    (
        "SINTER_DP_TEST_TAG".into(),
        format!("{name}-{}-{:?}", std::process::id(), Instant::now()),
    )
}

fn assert_no_rank_left(tag: &(String, String), ranks: usize) {
    let t = format!("{}={}", tag.0, tag.1);
    for r in 0..ranks {
        assert!(find_rank(&t, r).is_none(), "rank {r} was left running");
    }
}

#[test]
fn a_rank_that_dies_restarts_the_group_to_the_same_final_weights() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, restarted) = (dir.path().join("whole"), dir.path().join("restarted"));
    let launch = |out: &Path, more: &[&str], fault: Option<&str>, tag: &(String, String)| {
        let mut c = clean_cmd();
        c.args(["launch", "--nproc-per-node", "2", "--master-port", "0"])
            .args(more)
            .arg("--")
            .args(restart_train_args(out))
            .env(&tag.0, &tag.1);
        if let Some(f) = fault {
            c.env("SINTER_TEST_EXIT_AFTER_STEP", f);
        }
        c.output().unwrap()
    };
    let tag = test_tag("restart");
    ok(&launch(&whole, &[], None, &tag));
    // Rank 1 exits after step 3 (its checkpoint written): the group restarts from it.
    let o = launch(
        &restarted,
        &["--max-restarts", "1", "--grace-period", "2"],
        Some("1:3"),
        &tag,
    );
    let err = ok(&o) + &stderr(&o);
    assert!(err.contains("rank 1 exits after step 3"), "{err}");
    assert!(
        err.contains("rank 1 (local rank 1 on node 0) failed with exit code 17; restarting the group from the last checkpoint (restart 1 of 1)"),
        "{err}"
    );
    // Rank 0 wrote step 3's checkpoint before step 4's all-reduce found rank 1 gone.
    assert_eq!(summary(&restarted)["resumed_from_step"], 3, "{err}");
    assert_eq!(
        std::fs::read(whole.join("checkpoint.safetensors")).unwrap(),
        std::fs::read(restarted.join("checkpoint.safetensors")).unwrap(),
        "the restarted run's final checkpoint differs from the undisturbed run's"
    );
    assert_no_rank_left(&tag, 2);

    // A rank that fails in every round uses up the restarts: a clear error, non-zero.
    let o = clean_cmd()
        .args([
            "launch",
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "--max-restarts",
            "1",
            "--",
            "train",
            "--model",
            "no-such-model",
        ])
        .env(&tag.0, &tag.1)
        .output()
        .unwrap();
    fails_with(
        &o,
        &["restart 1 of 1", "no restarts left (--max-restarts 1 used)"],
    );
    assert_no_rank_left(&tag, 2);
}

/// A port `p` with `p` and `p + 1` free now (the elastic launchers' and the ranks' stores),
/// below Linux's ephemeral range (32768–60999): a port the OS hands out as `:0` can become a
/// client socket's local port meanwhile (a launcher connecting to `p` got `p + 1` once, and the
/// rank's store then failed to bind it), which ports below the range never do.
fn two_free_ports() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    // Tests run in parallel in this process: each call starts from its own port.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = 20_000 + (std::process::id() % 500) as u16 * 20;
    for _ in 0..200 {
        let p = start + NEXT.fetch_add(2, Ordering::Relaxed) % 2_000;
        let free = |port: u16| std::net::TcpListener::bind(("0.0.0.0", port)).is_ok();
        if free(p) && free(p + 1) {
            return p;
        }
    }
    panic!("no two consecutive free ports below 32768");
}

/// `sinter launch` of node `node` of 2, one rank each, with restarts, in the background.
fn node_launcher(
    node: usize,
    port: u16,
    more: &[&str],
    train: &[String],
    env: &[(&str, &str)],
    err: &Path,
) -> std::process::Child {
    clean_cmd()
        .args(["launch", "--nproc-per-node", "1", "--nnodes", "2"])
        .args([
            "--node-rank",
            &node.to_string(),
            "--master-port",
            &port.to_string(),
        ])
        .args(["--grace-period", "2", "--rdzv-timeout", "30"])
        .args(more)
        .arg("--")
        .args(train)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(err).unwrap()))
        .spawn()
        .unwrap()
}

#[test]
fn two_nodes_agree_on_a_restart_and_end_with_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, restarted) = (dir.path().join("whole"), dir.path().join("restarted"));
    let tag = test_tag("two-nodes");
    let run = |out: &Path, fault: Option<&str>| -> (String, String) {
        let port = two_free_ports();
        let train = restart_train_args(out);
        let mut env = vec![(tag.0.as_str(), tag.1.as_str())];
        if let Some(f) = fault {
            env.push(("SINTER_TEST_EXIT_AFTER_STEP", f));
        }
        let (e0, e1) = (dir.path().join("n0.err"), dir.path().join("n1.err"));
        let more = ["--max-restarts", "1"];
        let mut n0 = node_launcher(0, port, &more, &train, &env, &e0);
        let mut n1 = node_launcher(1, port, &more, &train, &env, &e1);
        let s1 = wait_child(&mut n1, Duration::from_secs(120), "node 1");
        let s0 = wait_child(&mut n0, Duration::from_secs(30), "node 0");
        let (t0, t1) = (
            std::fs::read_to_string(&e0).unwrap(),
            std::fs::read_to_string(&e1).unwrap(),
        );
        assert!(s0.success() && s1.success(), "node 0:\n{t0}\nnode 1:\n{t1}");
        (t0, t1)
    };
    run(&whole, None);
    // Rank 1 (node 1) dies after step 2: node 1 records it, node 0 stops its rank, and both
    // start round 1 from the checkpoint.
    let (t0, t1) = run(&restarted, Some("1:2"));
    assert!(
        t1.contains("failed with exit code 17; restarting the group"),
        "{t1}"
    );
    assert!(
        t0.contains("restarting the group from the last checkpoint (restart 1 of 1)"),
        "{t0}"
    );
    assert_eq!(
        std::fs::read(whole.join("checkpoint.safetensors")).unwrap(),
        std::fs::read(restarted.join("checkpoint.safetensors")).unwrap(),
        "the restarted two-node run's final checkpoint differs from the undisturbed run's"
    );
    assert_no_rank_left(&tag, 2);
}

#[test]
fn a_node_that_cannot_reach_the_rendezvous_is_named_and_the_launch_fails() {
    let dir = tempfile::tempdir().unwrap();
    let port = two_free_ports();
    let p = port.to_string();
    let common: [&str; 11] = [
        "launch",
        "--nproc-per-node",
        "1",
        "--nnodes",
        "2",
        "--master-port",
        &p,
        "--max-restarts",
        "1",
        "--rdzv-timeout",
        "2",
    ];
    // Node 1 with no node 0 serving the rendezvous.
    let t = Instant::now();
    let o = clean_cmd()
        .args(common)
        .args(["--node-rank", "1", "--", "train", "--model", "mlp"])
        .output()
        .unwrap();
    fails_with(
        &o,
        &[
            "node 1 (host ",
            &format!("could not reach the launchers' rendezvous at 127.0.0.1:{port}"),
            "within 2 s",
        ],
    );
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
    // Node 0 alone: node 1 never joins.
    let out = dir.path().join("run");
    let t = Instant::now();
    let o = clean_cmd()
        .args(common)
        .args(["--node-rank", "0", "--", "train", "--model", "mlp", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    fails_with(
        &o,
        &[
            &format!("round 0 of the rendezvous at 127.0.0.1:{port}"),
            "only 1 of the 2 node(s)",
            "within 2 s",
            "node rank(s) [1] never reached it",
        ],
    );
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn a_killed_node_launcher_lets_the_other_node_continue_alone_with_min_nodes_1() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let tag = test_tag("min-nodes");
    let port = two_free_ports();
    let mut train = restart_train_args(&out);
    // Long enough to be killed mid-run.
    train[5] = "400".into();
    let env = [(tag.0.as_str(), tag.1.as_str())];
    let more = [
        "--max-restarts",
        "1",
        "--min-nodes",
        "1",
        "--max-nodes",
        "2",
        "--rdzv-last-call",
        "1",
    ];
    let (e0, e1) = (dir.path().join("n0.err"), dir.path().join("n1.err"));
    let mut n0 = node_launcher(0, port, &more, &train, &env, &e0);
    let mut n1 = node_launcher(1, port, &more, &train, &env, &e1);
    let t = Instant::now();
    while !out.join("checkpoint.safetensors").exists() {
        if t.elapsed() > Duration::from_secs(60) {
            let _ = (n0.kill(), n1.kill(), n0.wait(), n1.wait());
            panic!("no checkpoint: {}", std::fs::read_to_string(&e0).unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Node 1's launcher dies (its rank dies with it): node 0 restarts alone, world size 1,
    // from the two-rank checkpoint.
    n1.kill().unwrap();
    n1.wait().unwrap();
    let s0 = wait_child(&mut n0, Duration::from_secs(120), "node 0");
    let t0 = std::fs::read_to_string(&e0).unwrap();
    assert!(s0.success(), "{t0}");
    assert!(t0.contains("restart 1 of 1"), "{t0}");
    assert!(t0.contains("started rank 0 of 1"), "{t0}");
    assert_eq!(summary(&out)["world_size"], 1, "{t0}");
    assert_eq!(summary(&out)["steps"], 400, "{t0}");
    assert!(
        summary(&out)["resumed_from_step"].as_u64().is_some(),
        "{t0}"
    );
    assert_no_rank_left(&tag, 2);
}
