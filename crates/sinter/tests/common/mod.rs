//! What the CLI tests share: running the binary, reading what it wrote, checking a success or
//! a clear failure, and finding a launched rank. Each test file uses some of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output};
use std::time::{Duration, Instant};

/// The binary under test, to configure.
pub fn sinter_cmd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sinter"))
}

/// Runs `sinter args` to the end.
pub fn sinter(args: &[&str]) -> Output {
    sinter_cmd().args(args).output().expect("the binary runs")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn stderr(o: &Output) -> String {
    text(&o.stderr)
}

pub fn stdout(o: &Output) -> String {
    text(&o.stdout)
}

/// A success without a panic; returns what it printed on stdout.
pub fn ok(o: &Output) -> String {
    let e = stderr(o);
    assert!(o.status.success(), "failed: {}\n{e}", stdout(o));
    assert!(!e.contains("panicked"), "{e}");
    stdout(o)
}

/// `ok(&sinter(args))`.
pub fn run_ok(args: &[&str]) -> String {
    ok(&sinter(args))
}

/// A failure: non-zero exit, a message containing every `needle`, and no panic.
pub fn fails_with(o: &Output, needles: &[&str]) {
    let e = stderr(o);
    assert!(!o.status.success(), "expected failure, got success: {e}");
    assert!(!e.contains("panicked"), "panicked: {e}");
    for n in needles {
        assert!(e.contains(n), "expected '{n}' in: {e}");
    }
}

/// A run's summary.json.
pub fn summary(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

/// No temporary file is left in `dir`.
pub fn no_temporaries(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!n.contains(".tmp"), "left a temporary file {n}");
    }
}

/// A checkpoint's tensors (name, bytes) and metadata (key, value), each sorted by name.
pub type CheckpointContent = (Vec<(String, Vec<u8>)>, Vec<(String, String)>);

/// The content of `dir`'s checkpoint.safetensors.
pub fn checkpoint_content(dir: &Path) -> CheckpointContent {
    let bytes = std::fs::read(dir.join("checkpoint.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.data().to_vec()))
        .collect();
    tensors.sort();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut meta: Vec<(String, String)> = header.metadata().clone().unwrap().into_iter().collect();
    meta.sort();
    (tensors, meta)
}

/// The process id of the launched rank `rank` whose environment holds `tag` (a `KEY=value`
/// the test set), if it is running.
pub fn find_rank(tag: &str, rank: usize) -> Option<u32> {
    let want = format!("RANK={rank}");
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        let vars: Vec<&[u8]> = env.split(|&b| b == 0).collect();
        if vars.contains(&tag.as_bytes()) && vars.contains(&want.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

/// Waits for `child` to exit (at most `limit`, then kills it and fails naming `what`).
pub fn wait_child(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A checkpoint's tensors by name (f32).
pub fn tensors(dir: &Path) -> HashMap<String, Vec<f32>> {
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
pub fn assert_close(a: &Path, b: &Path, prefix: &str, tol: f64) {
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

/// `mpirun -n N sinter ARGS…` (allowed as root, collectives bounded to 60 s), or `None` after
/// saying why when this build has no MPI backend or `mpirun` is missing; with
/// `SINTER_REQUIRE_MPI=1` (set by `.ci/run`) those are failures instead.
pub fn mpirun(n: usize, args: &[&str]) -> Option<Output> {
    let required = std::env::var("SINTER_REQUIRE_MPI").is_ok_and(|v| v == "1");
    let why = if !cfg!(feature = "mpi") {
        Some("this test build has no MPI backend (cargo test --features sinter/mpi)".to_string())
    } else {
        match Command::new("mpirun").arg("--version").output() {
            Ok(o) if o.status.success() => None,
            Ok(o) => Some(format!("mpirun --version failed: {}", stderr(&o))),
            Err(e) => Some(format!(
                "mpirun not found ({e}): apt-get install openmpi-bin"
            )),
        }
    };
    if let Some(why) = why {
        assert!(!required, "SINTER_REQUIRE_MPI=1 but {why}");
        eprintln!("skipped: {why}");
        return None;
    }
    let o = Command::new("mpirun")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        // Waiting ranks yield the core instead of spinning (2 shared cores in CI).
        .env("OMPI_MCA_mpi_yield_when_idle", "1")
        .env("SINTER_COLLECTIVE_TIMEOUT_S", "60")
        .args(["-n", &n.to_string(), env!("CARGO_BIN_EXE_sinter")])
        .args(args)
        .output()
        .expect("mpirun runs");
    Some(o)
}
