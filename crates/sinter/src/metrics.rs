//! Run outputs: the history (metrics.jsonl, metrics.csv, the TensorBoard event log) and
//! loss.svg (training and validation loss against step).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::tfevents;

/// The TensorBoard event log's file name (TensorBoard reads files with `tfevents` in it).
pub const EVENTS_FILE: &str = "events.out.tfevents.sinter";

/// CSV columns, in order (a row leaves empty what its record lacks).
const CSV_COLUMNS: &[&str] = &[
    "step",
    "epoch",
    "train_loss",
    "val_loss",
    "val_accuracy",
    "lr",
    "samples_per_s",
    "tokens_per_s",
    "grad_norm",
    "loss_scale",
    "skipped_steps",
    "elapsed_s",
];

/// Scalars that go to TensorBoard, and their tags.
const EVENT_TAGS: &[(&str, &str)] = &[
    ("train_loss", "train/loss"),
    ("val_loss", "val/loss"),
    ("val_accuracy", "val/accuracy"),
    ("lr", "train/lr"),
    ("grad_norm", "train/grad_norm"),
    ("samples_per_s", "train/samples_per_s"),
    ("tokens_per_s", "train/tokens_per_s"),
];

/// A run's history: `metrics.jsonl` (one JSON object per logged step and per evaluation),
/// `metrics.csv` (the same rows) and a TensorBoard event log. History is only appended; a
/// resumed run first drops what came after its checkpoint (a killed run's last lines) by
/// writing the kept part to a new file and renaming it over the old one, so the history is
/// never lost, whenever the run is killed.
pub struct MetricsLog {
    path: PathBuf,
    jsonl: File,
    csv: File,
    events: File,
}

fn append(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Keeps the whole lines of a text file whose step (`step_of`) is at most `step`; rewrites it
/// (write, then rename) only when something is dropped.
fn keep_lines(path: &Path, step: u64, step_of: impl Fn(&str) -> Option<u64>) -> Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    // A last line without its newline was torn by a kill.
    let whole = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    let kept: Vec<&str> = whole
        .lines()
        .filter(|l| step_of(l).is_none_or(|s| s <= step))
        .collect();
    if kept.len() == whole.lines().count() && whole.len() == text.len() {
        return Ok(());
    }
    let mut out = kept.join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    crate::checkpoint::write_atomic(path, out.as_bytes())
}

/// Keeps the whole event records of step at most `step` (see [`keep_lines`]).
fn keep_events(path: &Path, step: u64) -> Result<()> {
    let Ok(bytes) = std::fs::read(path) else {
        return Ok(());
    };
    let (records, len) = tfevents::read_records(&bytes);
    let kept: Vec<&[u8]> = records
        .iter()
        .copied()
        .filter(|r| tfevents::event_step(r) <= step)
        .collect();
    if kept.len() == records.len() && len == bytes.len() {
        return Ok(());
    }
    let out: Vec<u8> = kept.iter().flat_map(|r| tfevents::record(r)).collect();
    crate::checkpoint::write_atomic(path, &out)
}

fn wall_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl MetricsLog {
    /// Opens the history files in `dir` for appending. A new run starts them empty; a resumed
    /// run keeps what was logged up to its checkpoint's step.
    pub fn open(dir: &Path, resume_from_step: Option<u64>) -> Result<MetricsLog> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create output directory {}", dir.display()))?;
        let path = dir.join("metrics.jsonl");
        let (csv_path, events_path) = (dir.join("metrics.csv"), dir.join(EVENTS_FILE));
        match resume_from_step {
            Some(step) => {
                let json_step = |l: &str| {
                    serde_json::from_str::<Value>(l)
                        .ok()
                        .and_then(|v| v.get("step")?.as_u64())
                };
                keep_lines(&path, step, json_step)?;
                keep_lines(&csv_path, step, |l| l.split(',').next()?.parse().ok())?;
                keep_events(&events_path, step)?;
            }
            None => {
                for p in [&path, &csv_path, &events_path] {
                    crate::checkpoint::write_atomic(p, b"")?;
                }
            }
        }
        let mut log = MetricsLog {
            jsonl: append(&path)?,
            csv: append(&csv_path)?,
            events: append(&events_path)?,
            path,
        };
        if log.csv.metadata().map_or(0, |m| m.len()) == 0 {
            log.csv
                .write_all(format!("{}\n", CSV_COLUMNS.join(",")).as_bytes())?;
        }
        if log.events.metadata().map_or(0, |m| m.len()) == 0 {
            log.events
                .write_all(&tfevents::record(&tfevents::file_version(wall_time())))?;
        }
        Ok(log)
    }

    /// Appends one record (with its `step`) to every history file.
    pub fn log(&mut self, v: &Value) -> Result<()> {
        let what = |p: &Path| format!("cannot write {}", p.display());
        writeln!(self.jsonl, "{v}").with_context(|| what(&self.path))?;
        let row: Vec<String> = CSV_COLUMNS
            .iter()
            .map(|c| match v.get(*c) {
                Some(Value::Null) | None => String::new(),
                Some(x) => x.to_string(),
            })
            .collect();
        writeln!(self.csv, "{}", row.join(",")).with_context(|| what(&self.path))?;
        let scalars: Vec<(&str, f32)> = EVENT_TAGS
            .iter()
            .filter_map(|(k, tag)| Some((*tag, v.get(*k)?.as_f64()? as f32)))
            .collect();
        if !scalars.is_empty() {
            let step = v.get("step").and_then(Value::as_u64).unwrap_or(0);
            let e = tfevents::scalars(wall_time(), step, &scalars);
            self.events
                .write_all(&tfevents::record(&e))
                .with_context(|| what(&self.path))?;
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

pub fn read_lines(path: &Path) -> Result<Vec<Value>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}
