//! `sinter tokenize text:PATH --out DIR`: GPT-2 BPE token files in llm.c's format.
//!
//! Writes `DIR/<name>_train.bin` (the first 90% of the tokens) and `DIR/<name>_val.bin` (the
//! rest), each atomically, where `<name>` is the file's stem; `--data tokens:DIR` then reads
//! them. The text is one document, so its tokens start with `<|endoftext|>` (50256), as in
//! llm.c's data scripts. Large files are encoded in parallel, in pieces cut where GPT-2's
//! pre-tokeniser always cuts, so the ids are exactly those of encoding the whole text.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use rayon::prelude::*;
use sinter_data::{write_tokens, Gpt2Tokenizer};

#[derive(Args)]
pub struct TokenizeArgs {
    /// text:PATH — a UTF-8 text file.
    pub input: String,
    /// Directory for <name>_train.bin and <name>_val.bin (created if needed).
    #[arg(long)]
    pub out: PathBuf,
    /// Base name of the output files (default: the input file's stem).
    #[arg(long)]
    pub name: Option<String>,
    /// Share of the tokens (at the end) that becomes validation data.
    #[arg(long, default_value_t = 0.1)]
    pub val_fraction: f64,
    /// No progress line.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Bytes per piece handed to one encoder thread.
const PIECE_BYTES: usize = 1 << 20;

pub fn run(a: &TokenizeArgs) -> Result<()> {
    let path = match a.input.split_once(':') {
        Some((kind, p)) if kind.eq_ignore_ascii_case("text") && !p.trim().is_empty() => {
            PathBuf::from(p)
        }
        _ => bail!(
            "tokenize takes text:PATH (a UTF-8 text file), got '{}'",
            a.input
        ),
    };
    if !(a.val_fraction > 0.0 && a.val_fraction < 1.0) {
        bail!(
            "--val-fraction must be between 0 and 1 (exclusive), got {}",
            a.val_fraction
        );
    }
    let name = match &a.name {
        Some(n) => n.clone(),
        None => path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
    };
    check_name(&name)?;
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        anyhow::anyhow!(
            "{} is not UTF-8 text (invalid byte at offset {at}); convert it to UTF-8 first",
            path.display()
        )
    })?;

    let tokens = encode(&text, &name, a.quiet);
    if tokens.len() < 3 {
        bail!(
            "{} holds only {} tokens; a train and a validation split need more text",
            path.display(),
            tokens.len() - 1
        );
    }
    let n_val =
        ((tokens.len() as f64 * a.val_fraction).round() as usize).clamp(1, tokens.len() - 1);
    let (train, val) = tokens.split_at(tokens.len() - n_val);
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("cannot create {}", a.out.display()))?;
    let train_path = a.out.join(format!("{name}_train.bin"));
    let val_path = a.out.join(format!("{name}_val.bin"));
    write_tokens(&train_path, train)?;
    write_tokens(&val_path, val)?;
    if !a.quiet {
        eprintln!(
            "wrote {} ({} tokens) and {} ({} tokens)",
            train_path.display(),
            train.len(),
            val_path.display(),
            val.len()
        );
    }
    Ok(())
}

/// `tokens:DIR` picks files by `train` / `val` in their names, so the base name must hold
/// neither.
fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.contains(['/', '\\']) {
        bail!("'{name}' is not a usable file name; give one with --name");
    }
    let lower = name.to_lowercase();
    if lower.contains("train") || lower.contains("val") {
        bail!("the output name '{name}' contains 'train' or 'val', which would confuse tokens:DIR (it tells the splits apart by those words); give another with --name");
    }
    Ok(())
}

/// [EOT] + the ids of `text`, encoded in parallel pieces, with a progress line on stderr.
fn encode(text: &str, name: &str, quiet: bool) -> Vec<u16> {
    let tok = Gpt2Tokenizer::new();
    let pieces = Gpt2Tokenizer::split_for_encoding(text, PIECE_BYTES);
    let total = text.len();
    let tty = std::io::stderr().is_terminal();
    let t0 = Instant::now();
    let mut tokens = vec![Gpt2Tokenizer::EOT];
    let mut done = 0usize;
    let batch = rayon::current_num_threads().max(1) * 4;
    for group in pieces.chunks(batch) {
        let encoded: Vec<Vec<u16>> = group.par_iter().map(|p| tok.encode(p)).collect();
        for (p, ids) in group.iter().zip(encoded) {
            done += p.len();
            tokens.extend_from_slice(&ids);
        }
        if !quiet && tty {
            progress(name, done, total, tokens.len() - 1, t0, false);
        }
    }
    if !quiet {
        progress(name, done, total, tokens.len() - 1, t0, true);
    }
    tokens
}

fn progress(name: &str, done: usize, total: usize, n: usize, t0: Instant, last: bool) {
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    let mb = |b: usize| b as f64 / 1e6;
    let pct = if total == 0 {
        100.0
    } else {
        100.0 * done as f64 / total as f64
    };
    let mut e = std::io::stderr();
    let _ = write!(
        e,
        "\rtokenizing {name}: {:.1}/{:.1} MB ({pct:.0}%), {n} tokens, {:.1} MB/s",
        mb(done),
        mb(total),
        mb(done) / secs
    );
    let _ = if last { writeln!(e) } else { e.flush() };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_confuse_the_split_are_refused() {
        assert!(check_name("shakespeare").is_ok());
        for bad in ["interval", "retrain", "Validation", "", "a/b"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
