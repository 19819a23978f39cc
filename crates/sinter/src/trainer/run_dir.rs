//! What a run keeps in its `--out` directory: the files it writes, the check before a new run
//! writes there, and its checkpoints' contents.

use anyhow::{bail, Context, Result};

use super::{info_of, Console, Setup, TrainOptions};
use crate::checkpoint;

/// Files a run writes in its `--out` directory (besides temporaries and `--keep-last`
/// copies).
pub const RUN_FILES: &[&str] = &[
    checkpoint::FILE_NAME,
    checkpoint::BEST_FILE,
    "metrics.jsonl",
    "metrics.csv",
    crate::metrics::EVENTS_FILE,
    "summary.json",
    "loss.svg",
];

/// Before a run writes into its directory: temporaries of killed runs are removed, and a new
/// run refuses to replace another's files unless `--overwrite` says so (then it removes them).
pub fn prepare_out_dir(opts: &TrainOptions, console: &Console) -> Result<()> {
    let Some(dir) = &opts.out else {
        console.note("no --out DIR: this run saves nothing (no checkpoint, metrics or plot); add --out DIR to keep it");
        return Ok(());
    };
    let (removed, bytes) = checkpoint::remove_stale_temporaries(dir)?;
    if !removed.is_empty() {
        console.note(format!(
            "removed {} temporary file(s) ({:.1} MB) that killed runs left in {}",
            removed.len(),
            bytes as f64 / 1e6,
            dir.display()
        ));
    }
    if opts.resume.is_some() {
        return Ok(());
    }
    let kept = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| checkpoint::kept_step(n).is_some());
    let existing: Vec<String> = RUN_FILES
        .iter()
        .map(|f| f.to_string())
        .filter(|f| dir.join(f).exists())
        .chain(kept)
        .collect();
    if existing.is_empty() {
        return Ok(());
    }
    if !opts.overwrite {
        if let Some(what) = checkpoint::run_without_checkpoint(dir) {
            let temporaries = if removed.is_empty() {
                String::new()
            } else {
                " (its unfinished checkpoint file was removed above)".into()
            };
            bail!("{} holds {what} but no checkpoint: that run was stopped or killed before its first checkpoint was written, or while it was being written{temporaries}, so it cannot be resumed. Start over there with --overwrite (its history files are replaced), or choose another --out", dir.display());
        }
        bail!("{} already holds a run ({}); continue it with --resume {}, replace it with --overwrite, or choose another --out", dir.display(), existing.join(", "), dir.display());
    }
    for f in &existing {
        std::fs::remove_file(dir.join(f))
            .with_context(|| format!("--overwrite: cannot remove {}", dir.join(f).display()))?;
    }
    Ok(())
}

/// A checkpoint of `s` at `step` (its weights, `optim_state` with `optimizer_steps` updates
/// taken, the generators, the loader's position, the config and what inference needs).
pub fn save_checkpoint(
    dir: &std::path::Path,
    s: &Setup,
    optim_state: &[(String, sinter_core::Tensor)],
    optimizer_steps: u64,
    step: u64,
    loader: &sinter_data::DataLoader,
    precision: String,
) -> Result<()> {
    let meta = checkpoint_meta(s, step, optimizer_steps, loader, Some(precision), None);
    let bytes = checkpoint::to_bytes(&s.named_tensors(), optim_state, &meta)?;
    checkpoint::write_atomic(&checkpoint::path_in(dir), &bytes)
}

/// The metadata of a checkpoint of `s` at `step`.
pub fn checkpoint_meta(
    s: &Setup,
    step: u64,
    optimizer_steps: u64,
    loader: &sinter_data::DataLoader,
    precision: Option<String>,
    trainer: Option<String>,
) -> checkpoint::Meta {
    checkpoint::Meta {
        step,
        optimizer_steps,
        rng: s.rng.state(),
        dropout_rng: s.dropout_state(),
        loader: loader.position().to_u64s(),
        config: s.config.clone(),
        precision,
        trainer,
        inference: Some(info_of(s)),
    }
}
