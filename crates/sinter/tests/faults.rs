//! Trainer and CLI faults (issue 14): checkpoints that are byte-reproducible and checked on
//! load, history that survives resumes, flags that are applied or refused on resume, huge
//! step counts, silent wrong values made errors, and inference from the checkpoint alone.

mod common;

use common::*;
use std::path::Path;
use std::process::Output;

/// A small MLP run (a few seconds) with a checkpoint every 2 steps.
fn mlp_run(dir: &Path, steps: &str, more: &[&str]) -> Output {
    let mut a = vec![
        "train",
        "--quiet",
        "--model",
        "mlp",
        "--steps",
        steps,
        "--batch-size",
        "16",
        "--checkpoint-interval",
        "2",
        "--log-interval",
        "1",
        "--eval-batches",
        "1",
        "--eval-interval",
        "3",
        "--seed",
        "9",
        "--out",
        dir.to_str().unwrap(),
    ];
    a.extend_from_slice(more);
    sinter(&a)
}

fn checkpoint_bytes(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join("checkpoint.safetensors")).unwrap()
}

/// The logged steps of metrics.jsonl, training rows and validation rows separately.
fn logged_steps(dir: &Path) -> (Vec<u64>, Vec<u64>) {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let mut train = Vec::new();
    let mut val = Vec::new();
    for l in text.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        let s = v["step"].as_u64().unwrap();
        if v.get("train_loss").is_some() {
            train.push(s);
        } else {
            val.push(s);
        }
    }
    (train, val)
}

#[test]
fn checkpoints_are_byte_reproducible_and_resume_to_the_same_file() {
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    ok(&mlp_run(a.path(), "6", &[]));
    ok(&mlp_run(b.path(), "6", &[]));
    // Two identical runs write identical files (so identical sha256).
    assert!(checkpoint_bytes(a.path()) == checkpoint_bytes(b.path()));
    // A run stopped at step 3 and resumed writes the uninterrupted run's file.
    ok(&mlp_run(c.path(), "6", &["--stop-at-step", "3"]));
    ok(&sinter(&[
        "train",
        "--quiet",
        "--resume",
        c.path().to_str().unwrap(),
    ]));
    assert!(checkpoint_bytes(a.path()) == checkpoint_bytes(c.path()));
    // History: each step once, as in the uninterrupted run.
    assert_eq!(logged_steps(a.path()), logged_steps(c.path()));
    assert_eq!(logged_steps(c.path()).0, (1..=6).collect::<Vec<_>>());
}

/// Rewrites a checkpoint file with `edit` applied to its metadata and `tensor` to the bytes
/// of its first float tensor.
fn edit_checkpoint(
    src: &Path,
    dst: &Path,
    edit: impl Fn(&mut std::collections::HashMap<String, String>),
    tensor: impl Fn(&mut Vec<u8>),
) {
    let bytes = std::fs::read(src.join("checkpoint.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut md = header.metadata().clone().unwrap();
    edit(&mut md);
    let mut names: Vec<String> = st.names().into_iter().cloned().collect();
    names.sort();
    let mut data: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = names
        .iter()
        .map(|n| {
            let v = st.tensor(n).unwrap();
            (n.clone(), v.dtype(), v.shape().to_vec(), v.data().to_vec())
        })
        .collect();
    tensor(&mut data[0].3);
    let views: Vec<(String, safetensors::tensor::TensorView)> = data
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    std::fs::create_dir_all(dst).unwrap();
    std::fs::write(
        dst.join("checkpoint.safetensors"),
        safetensors::serialize(views, &Some(md)).unwrap(),
    )
    .unwrap();
}

#[test]
fn checkpoints_are_checked_on_load_like_flags() {
    let good = tempfile::tempdir().unwrap();
    ok(&mlp_run(good.path(), "2", &[]));
    let root = tempfile::tempdir().unwrap();
    let cases: [(&str, &str, &str); 6] = [
        ("model", "\"vgg\"", "unknown model 'vgg'"),
        ("lr_schedule", "\"zigzag\"", "unknown lr-schedule 'zigzag'"),
        ("log_interval", "0", "--log-interval must be at least 1"),
        ("optimizer", "\"lion\"", "unknown optimizer 'lion'"),
        ("lr", "-1.0", "--lr must be a positive number"),
        (
            "weight_decay",
            "-0.5",
            "--weight-decay must be a number of at least 0",
        ),
    ];
    for (key, value, want) in cases {
        let dir = root.path().join(key);
        edit_checkpoint(
            good.path(),
            &dir,
            |md| {
                let mut c: serde_json::Value = serde_json::from_str(&md["config"]).unwrap();
                c[key] = serde_json::from_str(value).unwrap();
                md.insert("config".into(), c.to_string());
            },
            |_| {},
        );
        let file = dir.join("checkpoint.safetensors");
        for o in [
            sinter(&["eval", "--checkpoint", dir.to_str().unwrap()]),
            sinter(&["train", "--resume", dir.to_str().unwrap(), "--steps", "4"]),
        ] {
            fails_with(&o, &[want, file.to_str().unwrap()]);
        }
    }
    // A NaN weight fails the checksum; without the check (--no-verify) it is still
    // reported at load, naming the tensor.
    let nan = root.path().join("nan");
    edit_checkpoint(
        good.path(),
        &nan,
        |_| {},
        |b| b[..4].copy_from_slice(&f32::NAN.to_le_bytes()),
    );
    fails_with(
        &sinter(&["eval", "--checkpoint", nan.to_str().unwrap()]),
        &["checksum", "checkpoint.safetensors"],
    );
    fails_with(
        &sinter(&["eval", "--checkpoint", nan.to_str().unwrap(), "--no-verify"]),
        &["NaN or infinite", "model.", "checkpoint.safetensors"],
    );
    // A truncated file is named and explained in words.
    let cut = root.path().join("cut");
    std::fs::create_dir(&cut).unwrap();
    let bytes = checkpoint_bytes(good.path());
    std::fs::write(
        cut.join("checkpoint.safetensors"),
        &bytes[..bytes.len() - 100],
    )
    .unwrap();
    fails_with(
        &sinter(&["eval", "--checkpoint", cut.to_str().unwrap()]),
        &[
            "corrupt or truncated",
            "does not match the tensor data",
            cut.to_str().unwrap(),
        ],
    );
}

#[test]
fn history_keeps_each_step_once_over_a_killed_runs_leftovers() {
    let dir = tempfile::tempdir().unwrap();
    ok(&mlp_run(dir.path(), "6", &["--stop-at-step", "4"]));
    // A run killed after step 5 left lines past its checkpoint (step 4) and a torn line, and
    // a temporary checkpoint.
    let metrics = dir.path().join("metrics.jsonl");
    let mut text = std::fs::read_to_string(&metrics).unwrap();
    text.push_str("{\"step\":5,\"train_loss\":9.0}\n{\"step\":6,\"train_lo");
    std::fs::write(&metrics, text).unwrap();
    let stale = dir.path().join(".checkpoint.safetensors.tmp-4194305");
    std::fs::write(&stale, vec![0u8; 4096]).unwrap();
    let o = sinter(&["train", "--resume", dir.path().to_str().unwrap()]);
    ok(&o);
    assert!(
        stderr(&o).contains("removed 1 temporary file"),
        "{}",
        stderr(&o)
    );
    assert!(!stale.exists());
    assert_eq!(logged_steps(dir.path()).0, (1..=6).collect::<Vec<_>>());
    let text = std::fs::read_to_string(&metrics).unwrap();
    // The killed run's step-5 line is gone (matched by its key: a throughput figure such as
    // 56289.07 also holds "9.0").
    assert!(!text.contains("\"train_loss\":9.0"), "{text}");
    // CSV: the header and the same rows as metrics.jsonl.
    let csv = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().collect();
    assert!(
        rows[0].starts_with("step,epoch,train_loss,val_loss"),
        "{csv}"
    );
    assert_eq!(rows.len() - 1, text.lines().count(), "{csv}");
    // TensorBoard: every record's CRC-32C checks, and the scalars are there by step.
    let events = std::fs::read(dir.path().join("events.out.tfevents.sinter")).unwrap();
    let steps = tfevent_steps(&events);
    assert_eq!(steps[0], 0, "the file version record comes first");
    let mut train: Vec<u64> = steps[1..].to_vec();
    train.dedup();
    assert_eq!(train.first(), Some(&1));
    assert_eq!(train.last(), Some(&6));
}

/// TFRecord's masked CRC-32C.
fn masked(b: &[u8]) -> u32 {
    crc32c::crc32c(b).rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Parses a TensorBoard event file (checking every CRC) and returns each event's step.
fn tfevent_steps(bytes: &[u8]) -> Vec<u64> {
    let mut at = 0;
    let mut steps = Vec::new();
    while at < bytes.len() {
        let len_b = &bytes[at..at + 8];
        assert_eq!(
            u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()),
            masked(len_b)
        );
        let len = u64::from_le_bytes(len_b.try_into().unwrap()) as usize;
        let data = &bytes[at + 12..at + 12 + len];
        let end = at + 12 + len;
        assert_eq!(
            u32::from_le_bytes(bytes[end..end + 4].try_into().unwrap()),
            masked(data)
        );
        // Event: field 1 wall_time (fixed64), then field 2 step (varint).
        assert_eq!(data[0], 0x09);
        assert_eq!(data[9], 0x10);
        let (mut step, mut shift, mut i) = (0u64, 0, 10);
        loop {
            step |= u64::from(data[i] & 0x7f) << shift;
            shift += 7;
            i += 1;
            if data[i - 1] < 0x80 {
                break;
            }
        }
        steps.push(step);
        at = end + 4;
    }
    steps
}

#[test]
fn resume_applies_changeable_flags_and_refuses_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    ok(&mlp_run(dir.path(), "6", &["--stop-at-step", "3"]));
    let d = dir.path().to_str().unwrap();
    fails_with(
        &sinter(&["train", "--resume", d, "--seed", "3"]),
        &[
            "--seed 3 differs from the checkpoint's 9",
            "a resumed run keeps it",
        ],
    );
    fails_with(
        &sinter(&["train", "--resume", d, "--optimizer", "sgd"]),
        &["--optimizer sgd", "adamw's state"],
    );
    fails_with(
        &sinter(&["train", "--resume", d, "--batch-size", "8"]),
        &["--batch-size 8", "within an epoch"],
    );
    let o = sinter(&[
        "train",
        "--resume",
        d,
        "--lr",
        "0.01",
        "--steps",
        "8",
        "--param-group",
        "bias$:lr=0",
    ]);
    ok(&o);
    let e = stderr(&o);
    assert!(
        e.contains("--lr 0.01 (the checkpoint had 0.002)")
            && e.contains("--steps 8")
            && e.contains("--param-group bias$:lr=0 (the checkpoint had none)"),
        "{e}"
    );
    let s = summary(dir.path());
    assert_eq!(
        (s["lr"].as_f64(), s["steps"].as_u64()),
        (Some(0.01), Some(8))
    );
}

#[test]
fn huge_step_counts_train_lazily_or_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let o = sinter(&[
        "train",
        "--quiet",
        "--model",
        "mlp",
        "--steps",
        "18446744073709551615",
        "--stop-at-step",
        "3",
        "--eval-batches",
        "1",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    ok(&o);
    assert_eq!(summary(dir.path())["steps"], 3);
    fails_with(
        &sinter(&["train", "--model", "mlp", "--epochs", "9223372036854775808"]),
        &["more steps than can be counted"],
    );
}

#[test]
fn silent_wrong_values_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    for (args, want) in [
        (
            vec!["--optimizer", "sgd", "--momentum", "NaN"],
            "--momentum",
        ),
        (vec!["--optimizer", "sgd", "--momentum=-3"], "--momentum"),
        (vec!["--weight-decay=-0.1"], "--weight-decay"),
        (vec!["--weight-decay", "NaN"], "--weight-decay"),
        (vec!["--grad-clip", "NaN"], "--grad-clip"),
        (vec!["--log-interval", "0"], "--log-interval"),
        (vec!["--tp", "2", "--zero", "1"], "--zero 1"),
        (vec!["--micro-batches", "2"], "--micro-batches 2"),
        (vec!["--schedule", "gpipe"], "no pipeline"),
        (vec!["--checkpoint-interval", "5"], "without --out"),
    ] {
        let mut a = vec!["train", "--model", "mlp", "--steps", "1"];
        a.extend(args.iter().copied());
        fails_with(&sinter(&a), &[want]);
    }
    // A new run does not replace an existing one unless asked.
    ok(&mlp_run(dir.path(), "2", &[]));
    fails_with(
        &mlp_run(dir.path(), "2", &[]),
        &["already holds a run", "--resume", "--overwrite"],
    );
    ok(&mlp_run(dir.path(), "2", &["--overwrite"]));
    // generate's temperature.
    for t in ["--temperature=NaN", "--temperature=-1"] {
        fails_with(
            &sinter(&["generate", "--checkpoint", d, t]),
            &["--temperature must be"],
        );
    }
}

#[test]
fn generate_needs_only_the_checkpoint() {
    let root = tempfile::tempdir().unwrap();
    let text = root.path().join("corpus.txt");
    std::fs::write(&text, "hello world, hello sinter. ".repeat(400)).unwrap();
    let out = root.path().join("run");
    ok(&sinter(&[
        "train",
        "--quiet",
        "--model",
        "gpt-tiny",
        "--data",
        &format!("text:{}", text.display()),
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--context",
        "16",
        "--eval-batches",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]));
    std::fs::remove_file(&text).unwrap();
    let o = sinter(&[
        "generate",
        "--checkpoint",
        out.to_str().unwrap(),
        "--prompt",
        "hello",
        "--max-new-tokens",
        "8",
    ]);
    ok(&o);
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("hello"));
}

/// The offset in a safetensors file of its tensor bytes (after the header).
fn data_start(bytes: &[u8]) -> usize {
    8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize
}

#[test]
fn a_flipped_weight_byte_fails_the_checksum_unless_no_verify() {
    let good = tempfile::tempdir().unwrap();
    ok(&mlp_run(good.path(), "2", &[]));
    let g = good.path().to_str().unwrap();
    let file = good.path().join("checkpoint.safetensors");
    let clean = std::fs::read(&file).unwrap();
    // The checksum is stored in the metadata and checks on a clean file.
    let (_, meta) = checkpoint_content(good.path());
    assert!(
        meta.iter()
            .any(|(k, v)| k == "tensor_crc32c" && v.len() == 8),
        "{meta:?}"
    );
    ok(&sinter(&["eval", "--checkpoint", g]));
    // One flipped bit in the lowest byte of the first weight: still a finite number, so only
    // the checksum can tell.
    let mut bytes = clean.clone();
    let at = data_start(&bytes);
    bytes[at] ^= 1;
    std::fs::write(&file, &bytes).unwrap();
    for o in [
        sinter(&["eval", "--checkpoint", g]),
        sinter(&["train", "--resume", g, "--steps", "4"]),
    ] {
        fails_with(
            &o,
            &[
                "do not match the checksum",
                "--no-verify",
                file.to_str().unwrap(),
            ],
        );
    }
    ok(&sinter(&["eval", "--checkpoint", g, "--no-verify"]));
    // A checkpoint from before checksums loads, and says once that it was not verified.
    let old = tempfile::tempdir().unwrap();
    std::fs::write(&file, &clean).unwrap();
    edit_checkpoint(
        good.path(),
        old.path(),
        |md| {
            md.remove("tensor_crc32c");
        },
        |_| {},
    );
    let o = sinter(&["eval", "--checkpoint", old.path().to_str().unwrap()]);
    ok(&o);
    assert_eq!(
        stderr(&o).matches("no checksum").count(),
        1,
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_run_killed_before_its_first_checkpoint_says_what_happened_and_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    ok(&mlp_run(dir.path(), "2", &[]));
    // What a run killed while writing its first checkpoint leaves: its history and the
    // checkpoint's temporary file (of a process that is gone), but no checkpoint.
    for f in ["checkpoint.safetensors", "summary.json", "loss.svg"] {
        std::fs::remove_file(dir.path().join(f)).unwrap();
    }
    std::fs::write(
        dir.path().join(".checkpoint.safetensors.tmp-4194305"),
        [0u8; 64],
    )
    .unwrap();
    fails_with(
        &sinter(&["train", "--resume", d]),
        &[
            "before its first checkpoint",
            "nothing to resume",
            "--overwrite",
        ],
    );
    let o = mlp_run(dir.path(), "2", &[]);
    fails_with(
        &o,
        &[
            "no checkpoint",
            "before its first checkpoint",
            "cannot be resumed",
            "--overwrite",
        ],
    );
    assert!(
        !stderr(&o).contains("continue it with --resume"),
        "{}",
        stderr(&o)
    );
    // What it says to do works.
    ok(&mlp_run(dir.path(), "2", &["--overwrite"]));
    ok(&sinter(&["train", "--resume", d, "--steps", "3"]));
}

#[test]
fn stop_at_step_zero_and_a_run_without_out_say_what_they_mean() {
    let o = sinter(&[
        "train",
        "--model",
        "mlp",
        "--steps",
        "2",
        "--stop-at-step",
        "0",
    ]);
    fails_with(&o, &["--stop-at-step 0", "before the first step"]);
    assert!(!stderr(&o).contains("checkpoint's step"), "{}", stderr(&o));
    // Without --out nothing is saved, and the run says so (unless --quiet).
    let a = [
        "train",
        "--model",
        "mlp",
        "--steps",
        "2",
        "--eval-batches",
        "1",
    ];
    let o = sinter(&a);
    ok(&o);
    assert!(
        stderr(&o).contains("no --out DIR: this run saves nothing"),
        "{}",
        stderr(&o)
    );
    let o = sinter(&[&a[..], &["--quiet"]].concat());
    ok(&o);
    assert_eq!(stderr(&o), "");
}

#[test]
fn a_config_file_takes_the_run_flags_too() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("run");
    let config = root.path().join("run.toml");
    std::fs::write(
        &config,
        format!(
            "model = \"mlp\"\nsteps = 4\nstop_at_step = 2\neval_batches = 1\nquiet = true\noverwrite = true\ntp = 1\npp = 1\ndp = false\ndist_backend = \"auto\"\ncuda_graph = false\nout = {:?}\n",
            out.to_str().unwrap()
        ),
    )
    .unwrap();
    let c = config.to_str().unwrap();
    // Twice: the second run replaces the first (overwrite), and both are quiet.
    for _ in 0..2 {
        let o = sinter(&["train", "--config", c]);
        ok(&o);
        assert_eq!(stderr(&o), "", "quiet = true");
        assert_eq!(summary(&out)["steps"], 2, "stop_at_step = 2");
    }
    // `resume` too: the run continues to its 4 steps.
    std::fs::write(
        &config,
        format!("resume = {:?}\nquiet = true\n", out.to_str().unwrap()),
    )
    .unwrap();
    ok(&sinter(&["train", "--config", c]));
    assert_eq!(summary(&out)["steps"], 4);
}
