//! Pre-tokenised data in llm.c's `.bin` format.
//!
//! Layout: a header of 256 little-endian i32 — `header[0]` = [`TOKENS_MAGIC`] (20240520),
//! `header[1]` = [`TOKENS_VERSION`] (1), `header[2]` = number of tokens, the rest zero —
//! followed by that many little-endian u16 tokens.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{DataError, Result};
use crate::io::{le_i32, read_file, size_note};
use crate::text::{split_dataset, LmDataset, Windows};
use crate::{InputEncoding, Split};

/// `header[0]` of an llm.c token file.
pub const TOKENS_MAGIC: i32 = 20240520;
/// `header[1]` of an llm.c token file with u16 tokens.
pub const TOKENS_VERSION: i32 = 1;
/// GPT-2's vocabulary size, the default for token files.
pub const GPT2_VOCAB_SIZE: usize = 50257;

const HEADER_INTS: usize = 256;
const HEADER_BYTES: usize = HEADER_INTS * 4;
const FORMAT: &str = "token";

/// Reads an llm.c token file, validating the magic number, the version and that the
/// length is exactly what the header says.
pub fn read_tokens(path: impl AsRef<Path>) -> Result<Vec<u16>> {
    let path = path.as_ref();
    let (bytes, gz) = read_file(path, "token file")?;
    let magic = if bytes.len() >= 4 {
        le_i32(&bytes, 0)
    } else {
        TOKENS_MAGIC
    };
    if magic != TOKENS_MAGIC {
        return Err(DataError::BadMagic {
            format: FORMAT,
            path: path.to_path_buf(),
            found: magic as u32 as u64,
            expected: TOKENS_MAGIC as u64,
            hint: "it is not an llm.c token file (write one with sinter_data::write_tokens or \
                   llm.c's data scripts)"
                .into(),
        });
    }
    if bytes.len() < HEADER_BYTES {
        return Err(DataError::Truncated {
            format: FORMAT,
            path: path.to_path_buf(),
            detail: format!(
                "the header alone is {HEADER_BYTES} bytes but the file has {}",
                size_note(bytes.len(), gz)
            ),
        });
    }
    let version = le_i32(&bytes, 4);
    if version != TOKENS_VERSION {
        return Err(DataError::Malformed {
            format: FORMAT,
            path: path.to_path_buf(),
            detail: format!(
                "version {version} is not supported (only version {TOKENS_VERSION}, u16 tokens); \
                 regenerate it with GPT-2-style u16 tokens"
            ),
        });
    }
    let count = le_i32(&bytes, 8);
    if count < 0 {
        return Err(DataError::Malformed {
            format: FORMAT,
            path: path.to_path_buf(),
            detail: format!("the header's token count is negative ({count}); regenerate it"),
        });
    }
    let count = count as usize;
    let expected = HEADER_BYTES as u64 + 2 * count as u64;
    let actual = bytes.len() as u64;
    if actual < expected {
        return Err(DataError::Truncated {
            format: FORMAT,
            path: path.to_path_buf(),
            detail: format!(
                "header says {count} tokens ({expected} bytes) but the file has {}",
                size_note(bytes.len(), gz)
            ),
        });
    }
    if actual > expected {
        return Err(DataError::Malformed {
            format: FORMAT,
            path: path.to_path_buf(),
            detail: format!(
                "header says {count} tokens ({expected} bytes) but the file has {} \
                 ({} extra bytes); it is corrupt: regenerate it",
                size_note(bytes.len(), gz),
                actual - expected
            ),
        });
    }
    Ok(bytes[HEADER_BYTES..]
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect())
}

/// Writes `tokens` as an llm.c token file, atomically: the data go to a temporary file in
/// the same directory, which is flushed, fsynced and then renamed over `path`, so readers
/// never see a half-written file.
pub fn write_tokens(path: impl AsRef<Path>, tokens: &[u16]) -> Result<()> {
    let path = path.as_ref();
    let count = i32::try_from(tokens.len()).map_err(|_| {
        DataError::Config(format!(
            "{} tokens do not fit one token file (at most {}); split them into shards",
            tokens.len(),
            i32::MAX
        ))
    })?;
    let file_name = path.file_name().ok_or_else(|| DataError::Write {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path"),
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{}",
        file_name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = write_file(&tmp, count, tokens).and_then(|()| {
        std::fs::rename(&tmp, path).map_err(|source| DataError::Write {
            path: path.to_path_buf(),
            source,
        })
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return result;
    }
    // Make the rename itself durable (best effort: not every platform can open directories).
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn write_file(tmp: &Path, count: i32, tokens: &[u16]) -> Result<()> {
    let werr = |source| DataError::Write {
        path: tmp.to_path_buf(),
        source,
    };
    let file = std::fs::File::create(tmp).map_err(werr)?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut header = [0i32; HEADER_INTS];
    header[0] = TOKENS_MAGIC;
    header[1] = TOKENS_VERSION;
    header[2] = count;
    for h in header {
        w.write_all(&h.to_le_bytes()).map_err(werr)?;
    }
    for &t in tokens {
        w.write_all(&t.to_le_bytes()).map_err(werr)?;
    }
    let file = w.into_inner().map_err(|e| werr(e.into_error()))?;
    file.sync_all().map_err(werr)?;
    Ok(())
}

fn check_vocab(tokens: &[u16], vocab_size: usize, path: &Path) -> Result<()> {
    if let Some((i, &t)) = tokens
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= vocab_size)
    {
        return Err(DataError::OutOfRange {
            format: FORMAT,
            path: path.to_path_buf(),
            what: "token",
            index: i,
            value: t as u64,
            limit: vocab_size as u64,
            hint: "give the vocabulary size of the tokenizer that wrote the file".into(),
        });
    }
    Ok(())
}

/// Token-file data as sliding windows of `context_len` (vocabulary `vocab_size`, e.g.
/// [`GPT2_VOCAB_SIZE`]; every token must be below it).
///
/// If `path` is a file, its first 90% of tokens are [`Split::Train`] and the last 10%
/// [`Split::Validation`]. If `path` is a directory, the split is given by llm.c's naming:
/// every `*train*.bin` file (in name order, concatenated) is training data and every
/// `*val*.bin` file validation data.
pub fn tokens(
    path: impl AsRef<Path>,
    split: Split,
    context_len: usize,
    vocab_size: usize,
) -> Result<LmDataset> {
    let path = path.as_ref();
    if vocab_size == 0 {
        return Err(DataError::Config(
            "vocabulary size is 0; give the tokenizer's vocabulary size".into(),
        ));
    }
    // llm.c token files of GPT-2's vocabulary are GPT-2 BPE (what `sinter tokenize` writes).
    let encoding = if vocab_size == GPT2_VOCAB_SIZE {
        InputEncoding::Gpt2Tokens
    } else {
        InputEncoding::Unspecified
    };
    Ok(read_split(path, split, context_len, vocab_size)?.with_encoding(encoding))
}

fn read_split(
    path: &Path,
    split: Split,
    context_len: usize,
    vocab_size: usize,
) -> Result<LmDataset> {
    if path.is_dir() {
        let files = shard_files(path, split)?;
        let mut all = Vec::new();
        for f in &files {
            let t = read_tokens(f)?;
            check_vocab(&t, vocab_size, f)?;
            all.extend(t.iter().map(|&v| u32::from(v)));
        }
        if all.len() <= context_len {
            return Err(DataError::Config(format!(
                "the {split} files in {} hold {} tokens, too few for a context length of \
                 {context_len}; use more data or a shorter context",
                path.display(),
                all.len()
            )));
        }
        LmDataset::new(all, vocab_size, context_len, Windows::Sliding)
    } else {
        let t = read_tokens(path)?;
        check_vocab(&t, vocab_size, path)?;
        let t = t.into_iter().map(u32::from).collect();
        split_dataset(t, split, context_len, vocab_size, path)
    }
}

/// The `*train*.bin` or `*val*.bin` files of `dir`, sorted by name.
fn shard_files(dir: &Path, split: Split) -> Result<Vec<PathBuf>> {
    let key = match split {
        Split::Train => "train",
        Split::Validation => "val",
    };
    let entries = std::fs::read_dir(dir).map_err(|source| DataError::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| DataError::Read {
            path: dir.to_path_buf(),
            source,
        })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.contains(key) && name.ends_with(".bin") && entry.path().is_file() {
            files.push(entry.path());
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(DataError::NotFound {
            what: format!("{split} token files (*{key}*.bin)"),
            path: dir.to_path_buf(),
            hint: "name the shards like llm.c does, e.g. data_train_000001.bin and \
                   data_val_000000.bin, or pass a single .bin file to split 90/10"
                .into(),
        });
    }
    Ok(files)
}
