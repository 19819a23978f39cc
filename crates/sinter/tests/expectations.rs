//! What a user of a trainer expects: `train --help` (every flag with its default, grouped),
//! `bench --help`, epochs numbered alike on the terminal and in metrics.jsonl, `eval`
//! agreeing with the run's last validation loss or saying why not, `--keep-last`,
//! `--keep-best` and `--early-stop`.

mod common;

use common::*;
use std::process::Output;

/// (flag, its help text) of every option in a `--help` page.
fn options(help: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in help.lines() {
        let t = line.trim_start();
        if t.starts_with("-") && line.starts_with("  ") {
            let flag = t
                .split([' ', ','])
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
    assert!(
        model.contains("bert-tiny") && model.contains("bert-base"),
        "{model}"
    );
    // Common flags first, the parallel ones grouped after.
    let at = |s: &str| {
        help.find(s)
            .unwrap_or_else(|| panic!("{s} missing: {help}"))
    };
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
        assert!(
            bench.contains(name) && gpu.contains(name),
            "{name}: {bench}"
        );
    }
}

#[test]
fn epochs_match_eval_agrees_with_the_runs_last_validation_loss_and_the_files_are_named() {
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
        "--keep-best",
        "--out",
        d,
    ]);
    ok(&o);
    let err = stderr(&o);
    // The closing line names every file the run wrote.
    let wrote = err.lines().find(|l| l.starts_with("wrote ")).unwrap_or("");
    assert!(
        wrote.contains("best.safetensors") && wrote.contains("checkpoint.safetensors"),
        "{err}"
    );
    let metrics = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    let val_epochs: Vec<u64> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("val_loss").is_some())
        .map(|v| v["epoch"].as_u64().unwrap())
        .collect();
    assert_eq!(val_epochs, [1, 2], "{metrics}");
    assert!(
        err.contains("epoch 1: ") && err.contains("epoch 2: "),
        "{err}"
    );
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
    assert!(
        same.contains(&want) && same.contains("2 of 6"),
        "{same} vs {want}"
    );
}

fn mlp(dir: &std::path::Path, more: &[&str]) -> Output {
    let mut a = vec![
        "train",
        "--quiet",
        "--model",
        "mlp",
        "--batch-size",
        "16",
        "--eval-batches",
        "1",
        "--seed",
        "2",
        "--out",
        dir.to_str().unwrap(),
    ];
    a.extend_from_slice(more);
    sinter(&a)
}

fn meta_step(path: &std::path::Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    let (_, h) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    h.metadata().clone().unwrap()["step"].clone()
}

#[test]
fn keep_last_keeps_the_newest_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let o = mlp(
        dir.path(),
        &[
            "--steps",
            "8",
            "--checkpoint-interval",
            "2",
            "--keep-last",
            "2",
        ],
    );
    ok(&o);
    let p = |s: u64| dir.path().join(format!("checkpoint-step{s}.safetensors"));
    assert!(!p(2).exists() && !p(4).exists() && p(6).exists() && p(8).exists());
    assert_eq!(meta_step(&p(6)), "6");
    assert_eq!(
        std::fs::read(p(8)).unwrap(),
        std::fs::read(dir.path().join("checkpoint.safetensors")).unwrap()
    );
}

#[test]
fn early_stopping_stops_when_validation_stalls_and_keeps_the_best() {
    let dir = tempfile::tempdir().unwrap();
    // An improvement must exceed 100 nats: after the first evaluation none does.
    let o = mlp(
        dir.path(),
        &[
            "--steps",
            "50",
            "--eval-interval",
            "1",
            "--early-stop",
            "2",
            "--early-stop-delta",
            "100",
            "--keep-best",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(s["steps"], 3, "{s}");
    assert!(
        s["stopped_early"]
            .as_str()
            .unwrap()
            .contains("has not improved for 2 evaluations"),
        "{s}"
    );
    assert_eq!(meta_step(&dir.path().join("best.safetensors")), "1");
    assert_eq!(meta_step(&dir.path().join("checkpoint.safetensors")), "3");
    // A run that evaluates too rarely to stop early says so.
    let o = sinter(&[
        "train",
        "--model",
        "mlp",
        "--steps",
        "3",
        "--eval-batches",
        "1",
        "--early-stop",
        "2",
    ]);
    let e = stderr(&o);
    ok(&o);
    assert!(
        e.contains("--early-stop 2 cannot stop this run: it evaluates 1 time(s) in 3 steps"),
        "{e}"
    );
}

/// Runs `sinter args` with stderr on a pseudo-terminal (so the progress bar is drawn) and
/// returns everything it wrote there.
fn on_a_terminal(args: &[&str]) -> String {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty fills in two new descriptors.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "openpty failed");
    // SAFETY: the descriptors are ours alone.
    let (mut reader, writer) = unsafe {
        (
            std::fs::File::from_raw_fd(master),
            std::fs::File::from_raw_fd(slave),
        )
    };
    let mut child = sinter_cmd()
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(writer))
        .spawn()
        .unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    // The read fails (EIO) once the child has exited and closed the terminal.
    while let Ok(n) = reader.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    assert!(child.wait().unwrap().success());
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn the_starting_line_is_not_drawn_over_by_the_progress_bar() {
    let term = on_a_terminal(&[
        "train",
        "--model",
        "mlp",
        "--steps",
        "300",
        "--eval-batches",
        "1",
    ]);
    let line = term.find("training mlp").expect("the starting line");
    let bar = term.find("ETA").expect("a progress bar frame");
    assert!(
        line < bar,
        "the bar was drawn before the line it then erases: {term:?}"
    );
    let end = line + term[line..].find('\n').expect("a whole line");
    assert!(term[line..end].contains("steps on cpu"), "{term:?}");
}

/// The model tensors of a run's checkpoint, by name.
fn model_tensors(dir: &std::path::Path) -> std::collections::HashMap<String, Vec<u8>> {
    checkpoint_content(dir)
        .0
        .into_iter()
        .filter(|(n, _)| n.starts_with("model."))
        .collect()
}

#[test]
fn parameter_groups_give_parts_of_the_model_their_own_rate() {
    let root = tempfile::tempdir().unwrap();
    let run = |name: &str, more: &[&str]| {
        let dir = root.path().join(name);
        let mut a = vec!["--steps", "3", "--optimizer", "sgd"];
        a.extend_from_slice(more);
        ok(&mlp(&dir, &a));
        model_tensors(&dir)
    };
    // Everything at rate 0: the initial weights.
    let init = run("frozen", &["--param-group", ".:lr=0"]);
    let default = run("default", &[]);
    let biases_frozen = run("biases", &["--param-group", "bias$:lr=0"]);
    let zero = run("zero", &["--param-group", "bias$:lr=0", "--zero", "1"]);
    let mut biases = 0;
    for (name, init) in &init {
        let is_bias = name.ends_with(".bias");
        biases += usize::from(is_bias);
        assert_eq!(&biases_frozen[name] == init, is_bias, "{name}");
        assert!(&default[name] != init, "{name} did not train by default");
        // ZeRO steps the groups as the plain optimizer does.
        assert!(zero[name] == biases_frozen[name], "{name} under ZeRO");
    }
    assert!(biases >= 2);
    // Rules that match nothing, or do not parse, are refused before training.
    fails_with(
        &mlp(
            &root.path().join("none"),
            &["--steps", "1", "--param-group", "^nope:lr=1"],
        ),
        &[
            "--param-group '^nope:lr=1' matches no parameter",
            "layers.0.weight",
        ],
    );
    fails_with(
        &mlp(
            &root.path().join("bad"),
            &["--steps", "1", "--param-group", "bias"],
        ),
        &["--param-group 'bias' has no ':'"],
    );
}

/// The README's first run: it says that the first build takes minutes, and shows how to
/// make `sinter` callable before the first example that calls it so.
#[test]
fn the_readme_prepares_the_first_run() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md at the workspace root");
    let install = readme
        .find("cargo install --path crates/sinter")
        .expect("the README shows `cargo install --path crates/sinter`");
    let first_call = readme
        .find("\nsinter ")
        .expect("the README has examples that call `sinter`");
    assert!(
        install < first_call,
        "`sinter …` is called before the README says how to install it"
    );
    let build_note = readme[..install].to_lowercase();
    assert!(
        build_note.contains("first build") && build_note.contains("minutes"),
        "the README does not say, before the install line, that the first build takes minutes"
    );
}
