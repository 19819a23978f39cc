//! The launcher library: layout, environment, output prefixes, failure handling and signal
//! forwarding, with `sh -c` children.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sinter_dist::launch::{self, dry_run, LaunchOptions, LaunchSpec, Output};
use sinter_dist::{DistError, ExitKind};

fn sh_spec(nproc: usize, script: &str) -> LaunchSpec {
    LaunchSpec {
        nproc_per_node: nproc,
        nnodes: 1,
        node_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: 29500,
        program: "sh".into(),
        args: vec!["-c".into(), script.into()],
        cpu_threads: None,
    }
}

fn capture(grace_ms: u64) -> (LaunchOptions, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let opts = LaunchOptions {
        grace_period: Duration::from_millis(grace_ms),
        forward_signals: false,
        output: Output::Capture(lines.clone()),
        extra_env: Vec::new(),
        cancel: None,
    };
    (opts, lines)
}

fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Field 3 is the state; a zombie is already dead.
        Ok(s) => {
            s.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next())
                != Some("Z")
        }
        Err(_) => false,
    }
}

#[test]
fn ranks_get_torchrun_env_and_prefixed_output() {
    let mut spec = sh_spec(
        2,
        r#"echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT"; echo "to stderr" >&2; printf 'no newline'"#,
    );
    spec.nnodes = 2;
    spec.node_rank = 1;
    spec.master_addr = "10.9.8.7".into();
    spec.master_port = 1234;
    let (opts, lines) = capture(1000);
    let report = launch::run_with(&spec, &opts).unwrap();
    assert_eq!(
        report
            .ranks
            .iter()
            .map(|r| (r.rank, r.local_rank, r.status))
            .collect::<Vec<_>>(),
        vec![(2, 0, ExitKind::Code(0)), (3, 1, ExitKind::Code(0))]
    );
    let lines = lines.lock().unwrap();
    for (rank, local) in [(2, 0), (3, 1)] {
        for want in [
            format!("[rank {rank}] {rank} 4 {local} 2 10.9.8.7 1234"),
            format!("[rank {rank}] to stderr"),
            format!("[rank {rank}] no newline"),
        ] {
            assert!(lines.contains(&want), "missing `{want}` in {lines:?}");
        }
    }
}

#[test]
fn failing_rank_is_reported_and_others_are_stopped_quickly() {
    let dir = std::env::temp_dir().join(format!("sinter-launch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Ranks 0 and 2 start a long sleep in the background (a grandchild) and wait; rank 1
    // fails with exit code 3.
    let script = format!(
        r#"if [ "$RANK" = 1 ]; then sleep 0.2; echo failing; exit 3; fi
sleep 30 & echo $! > {dir}/sleep.$RANK
echo started
wait"#,
        dir = dir.display()
    );
    let (opts, lines) = capture(5000);
    let t = Instant::now();
    let err = launch::run_with(&sh_spec(3, &script), &opts).unwrap_err();
    let elapsed = t.elapsed();
    match &err {
        DistError::RankFailed {
            rank,
            local_rank,
            node,
            status,
        } => {
            assert_eq!(
                (*rank, *local_rank, *node, *status),
                (1, 1, 0, ExitKind::Code(3))
            );
        }
        e => panic!("unexpected error {e}"),
    }
    assert_eq!(
        err.to_string(),
        "rank 1 (local rank 1 on node 0) failed with exit code 3"
    );
    // SIGTERM reaches the whole process group at once: no need to wait for the 5 s grace period
    // or the 30 s sleeps.
    assert!(elapsed < Duration::from_secs(4), "took {elapsed:?}");
    assert!(lines
        .lock()
        .unwrap()
        .contains(&"[rank 1] failing".to_string()));
    for r in [0, 2] {
        let pid: u32 = std::fs::read_to_string(dir.join(format!("sleep.{r}")))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(2);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!alive(pid), "rank {r}'s grandchild {pid} survived");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rank_ignoring_sigterm_is_killed_after_grace() {
    // Rank 1 fails only once rank 0 ignores SIGTERM (bounded wait for its marker file).
    let marker = std::env::temp_dir().join(format!("sinter-trap-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let script = format!(
        r#"if [ "$RANK" = 1 ]; then
  i=0; while [ ! -e {m} ] && [ $i -lt 200 ]; do sleep 0.01; i=$((i+1)); done
  exit 1
fi
trap '' TERM
touch {m}
sleep 30"#,
        m = marker.display()
    );
    let script = script.as_str();
    let (opts, _) = capture(300);
    let t = Instant::now();
    let err = launch::run_with(&sh_spec(2, script), &opts).unwrap_err();
    assert!(
        matches!(
            err,
            DistError::RankFailed {
                rank: 1,
                status: ExitKind::Code(1),
                ..
            }
        ),
        "{err}"
    );
    let el = t.elapsed();
    assert!(
        el >= Duration::from_millis(250) && el < Duration::from_secs(3),
        "took {el:?}"
    );
    let _ = std::fs::remove_file(&marker);
}

#[test]
fn rank_killed_by_signal_is_reported() {
    let script = r#"if [ "$RANK" = 0 ]; then kill -9 $$; fi; sleep 30"#;
    let (opts, _) = capture(1000);
    let err = launch::run_with(&sh_spec(2, script), &opts).unwrap_err();
    assert!(
        matches!(
            err,
            DistError::RankFailed {
                rank: 0,
                status: ExitKind::Signal(9),
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "rank 0 (local rank 0 on node 0) failed with signal 9 (SIGKILL)"
    );
}

#[test]
fn missing_program_and_bad_spec() {
    let mut spec = sh_spec(2, "true");
    spec.program = "/nonexistent/sinter-no-such-program".into();
    let (opts, _) = capture(100);
    let err = launch::run_with(&spec, &opts).unwrap_err();
    assert!(matches!(err, DistError::Launch(_)), "{err}");
    let mut spec = sh_spec(2, "true");
    spec.node_rank = 3;
    assert!(matches!(
        launch::run_with(&spec, &opts),
        Err(DistError::InvalidArgument(_))
    ));
}

#[test]
fn dry_run_shows_layout_and_env() {
    let spec = LaunchSpec {
        nproc_per_node: 2,
        nnodes: 2,
        node_rank: 1,
        master_addr: "node0".into(),
        master_port: 29500,
        program: "train".into(),
        args: vec!["--config".into(), "my run.toml".into()],
        cpu_threads: None,
    };
    let s = dry_run(&spec);
    assert!(
        s.contains("world size 4 = 2 node(s) × 2 rank(s); this is node 1; master node0:29500"),
        "{s}"
    );
    assert!(s.contains("command: train --config 'my run.toml'"), "{s}");
    assert!(s.contains("     3      1     1  (this node)"), "{s}");
    assert!(s.contains("     0      0     0\n"), "{s}");
    assert!(s.contains(
        "[rank 2] RANK=2 WORLD_SIZE=4 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 GROUP_RANK=1 NODE_RANK=1 MASTER_ADDR=node0 MASTER_PORT=29500"
    ), "{s}");
    assert!(!s.contains("[rank 0] RANK"), "only this node's env: {s}");
}

/// Launcher process for `sigterm_is_forwarded_to_ranks` (no-op in a normal test run).
#[test]
fn launcher_child_entry() {
    if std::env::var("SINTER_DIST_TEST_LAUNCHER").as_deref() != Ok("1") {
        return;
    }
    let script = r#"trap 'echo got-term; exit 7' TERM
echo ready
i=0
while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"#;
    let opts = LaunchOptions {
        grace_period: Duration::from_secs(5),
        ..LaunchOptions::default()
    };
    match launch::run_with(&sh_spec(2, script), &opts) {
        Ok(_) => std::process::exit(0),
        Err(e) => {
            println!("launcher error: {e}");
            std::process::exit(42);
        }
    }
}

#[test]
fn sigterm_is_forwarded_to_ranks() {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "launcher_child_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SINTER_DIST_TEST_LAUNCHER", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    let ready = |lines: &Vec<String>| {
        (0..2).all(|r| {
            lines
                .iter()
                .any(|l| l.ends_with(&format!("[rank {r}] ready")))
        })
    };
    while !ready(&lines) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => lines.push(l),
            Err(_) => {
                let _ = child.kill();
                panic!("ranks never became ready: {lines:?}");
            }
        }
    }
    // SIGTERM to the launcher only: the ranks are in their own process groups, so they hear
    // of it only by forwarding.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("launcher did not exit after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(500)) {
        lines.push(l);
    }
    assert_eq!(status.code(), Some(42), "{lines:?}");
    for r in 0..2 {
        assert!(
            lines
                .iter()
                .any(|l| l.ends_with(&format!("[rank {r}] got-term"))),
            "{lines:?}"
        );
    }
    assert!(
        lines.iter().any(|l| l
            .contains("launcher error: launcher interrupted by SIGTERM (15); ranks were stopped")),
        "{lines:?}"
    );
}

#[test]
fn a_cancelled_launch_stops_its_ranks_and_says_why() {
    let (mut opts, _lines) = capture(500);
    let cancel = Arc::new(Mutex::new(None));
    opts.cancel = Some(cancel.clone());
    let c = cancel.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        *c.lock().unwrap() = Some("node 1 failed".to_string());
    });
    let started = Instant::now();
    let e = launch::run_with(&sh_spec(2, "sleep 30"), &opts).unwrap_err();
    t.join().unwrap();
    assert!(
        matches!(&e, DistError::Stopped(why) if why == "node 1 failed"),
        "{e}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn elastic_restarts_rerun_the_group_until_it_succeeds_or_restarts_run_out() {
    use sinter_dist::elastic::{run_elastic, ElasticOptions};
    let el = |max_restarts| ElasticOptions {
        max_restarts,
        min_nodes: 1,
        max_nodes: 1,
        rdzv_timeout: Duration::from_secs(5),
        last_call: Duration::from_secs(1),
    };
    // Rank 1 fails in the first two rounds; the round number reaches the ranks, and round
    // `g` runs the arguments built for it.
    let script = r#"echo "round $SINTER_RESTART_ROUND arg $0"; [ "$RANK" = 1 ] && [ "$SINTER_RESTART_ROUND" -lt 2 ] && exit 3; exit 0"#;
    let spec = sh_spec(2, script);
    let args = |g: usize| vec!["-c".to_string(), script.to_string(), format!("a{g}")];
    let (opts, lines) = capture(500);
    let rep = run_elastic(&spec, &opts, &el(2), &args).unwrap();
    assert_eq!(rep.ranks.len(), 2);
    let out = lines.lock().unwrap().join("\n");
    for want in [
        "[rank 1] round 0 arg a0",
        "[rank 1] round 2 arg a2",
        "failed with exit code 3; restarting the group from the last checkpoint (restart 2 of 2)",
    ] {
        assert!(out.contains(want), "want `{want}` in:\n{out}");
    }
    // One restart is not enough: the last failure, and that no restarts are left.
    let (opts, _) = capture(500);
    let e = run_elastic(&spec, &opts, &el(1), &args)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rank 1 (local rank 1 on node 0) failed with exit code 3; no restarts left (--max-restarts 1 used)"),
        "{e}"
    );
}

#[test]
fn ranks_share_the_nodes_cpu_threads_when_asked() {
    use sinter_dist::launch::thread_share;
    // 7 threads over 3 ranks: 3, 2, 2; never 0 (more ranks than threads: 1 each).
    assert_eq!(
        (0..3).map(|r| thread_share(7, 3, r)).collect::<Vec<_>>(),
        [3, 2, 2]
    );
    assert_eq!(
        (0..4).map(|r| thread_share(2, 4, r)).collect::<Vec<_>>(),
        [1, 1, 1, 1]
    );
    assert_eq!(thread_share(16, 1, 0), 16);

    let mut spec = sh_spec(2, r#"echo "threads ${RAYON_NUM_THREADS:-unset}""#);
    spec.cpu_threads = Some(5);
    let (opts, lines) = capture(1000);
    launch::run_with(&spec, &opts).unwrap();
    let lines = lines.lock().unwrap().clone();
    for want in ["[rank 0] threads 3", "[rank 1] threads 2"] {
        assert!(lines.iter().any(|l| l == want), "{want:?} not in {lines:?}");
    }
    assert!(
        dry_run(&spec).contains("RAYON_NUM_THREADS=3"),
        "{}",
        dry_run(&spec)
    );

    // None: the variable is left to the environment the ranks inherit (this test's own).
    spec.cpu_threads = None;
    let inherited = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "unset".into());
    let (opts, lines) = capture(1000);
    launch::run_with(&spec, &opts).unwrap();
    let lines = lines.lock().unwrap().clone();
    for rank in 0..2 {
        let want = format!("[rank {rank}] threads {inherited}");
        assert!(lines.contains(&want), "{want:?} not in {lines:?}");
    }
    assert!(!dry_run(&spec).contains("RAYON_NUM_THREADS="));
}
