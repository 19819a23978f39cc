//! What the CLI tests share: running the binary, reading what it wrote, checking a success or
//! a clear failure, and finding a launched rank. Each test file uses some of it.
#![allow(dead_code)]

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
