//! File helpers shared by the format readers.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{DataError, Result};

/// The two bytes every gzip stream starts with.
pub(crate) const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Whether `bytes` start with the gzip magic number.
pub(crate) fn is_gzip(bytes: &[u8]) -> bool {
    bytes.len() >= 2 && bytes[..2] == GZIP_MAGIC
}

/// Decompresses `bytes` if they start with the gzip magic (whatever the file is called),
/// otherwise returns them unchanged. `path` is only used in error messages.
pub(crate) fn maybe_gunzip(bytes: Vec<u8>, path: &Path) -> Result<Vec<u8>> {
    if !is_gzip(&bytes) {
        return Ok(bytes);
    }
    let mut out = Vec::with_capacity(bytes.len().saturating_mul(4));
    flate2::read::MultiGzDecoder::new(&bytes[..])
        .read_to_end(&mut out)
        .map_err(|source| DataError::CorruptGzip {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(out)
}

/// Reads a whole file, decompressing it if it is gzip (detected by its magic bytes, not its
/// name). Returns the bytes and whether the file was compressed. `what` names the file's
/// role in error messages ("MNIST training images").
pub(crate) fn read_file(path: &Path, what: &str) -> Result<(Vec<u8>, bool)> {
    let bytes =
        std::fs::read(path).map_err(|e| DataError::from_read(what, path.to_path_buf(), e))?;
    let gzipped = is_gzip(&bytes);
    Ok((maybe_gunzip(bytes, path)?, gzipped))
}

/// The first of `dir/name` for `name` in `names` that is a file, or a
/// [`DataError::NotFound`] listing every name tried.
pub(crate) fn find_first(dir: &Path, names: &[String], what: &str, hint: &str) -> Result<PathBuf> {
    check_dir(dir, what)?;
    for name in names {
        let p = dir.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(DataError::NotFound {
        what: what.to_string(),
        path: dir.to_path_buf(),
        hint: format!("looked for {}; {hint}", names.join(", ")),
    })
}

/// A [`DataError::NotFound`] unless `dir` is a directory.
pub(crate) fn check_dir(dir: &Path, what: &str) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let hint = if dir.exists() {
        "the path exists but is not a directory; pass the directory that holds the files"
    } else {
        "the directory does not exist; check the path"
    };
    Err(DataError::NotFound {
        what: format!("directory for {what}"),
        path: dir.to_path_buf(),
        hint: hint.to_string(),
    })
}

/// `a * b` as u64, or `None` on overflow.
pub(crate) fn mul_u64(a: u64, b: u64) -> Option<u64> {
    a.checked_mul(b)
}

/// Reads a big-endian u32 at `offset` (the caller has checked the length).
pub(crate) fn be_u32(bytes: &[u8], offset: usize) -> u32 {
    u32::from_be_bytes([
        bytes[offset],
        bytes[offset + 1],
        bytes[offset + 2],
        bytes[offset + 3],
    ])
}

/// Reads a little-endian i32 at `offset` (the caller has checked the length).
pub(crate) fn le_i32(bytes: &[u8], offset: usize) -> i32 {
    i32::from_le_bytes([
        bytes[offset],
        bytes[offset + 1],
        bytes[offset + 2],
        bytes[offset + 3],
    ])
}

/// A short description of a byte count: "1000 bytes" or "1000 bytes after decompression".
pub(crate) fn size_note(len: usize, gzipped: bool) -> String {
    if gzipped {
        format!("{len} bytes after decompression")
    } else {
        format!("{len} bytes")
    }
}
