//! The crate's error type.
//!
//! Every message says what went wrong, where (the file or the spec string) and what to do
//! about it, because these errors usually end up printed to a person running `sinter train`.

use std::path::PathBuf;

/// Shorthand for `Result<T, DataError>`.
pub type Result<T, E = DataError> = std::result::Result<T, E>;

/// The forms [`DataSpec::parse`](crate::DataSpec::parse) accepts, named in
/// [`DataError::UnknownSpec`] (here so that the error type needs nothing above it).
pub(crate) const VALID_FORMS: &str = "digits, shakespeare, mnist:DIR, cifar10:DIR, text:FILE, \
                               tokens:FILE_OR_DIR";

/// Everything that can go wrong while finding, reading, parsing or batching data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A file or directory that should be there is not.
    #[error("{what} not found: {}; {hint}", .path.display())]
    NotFound {
        /// What was being looked for, e.g. "MNIST training images".
        what: String,
        /// The path (or directory) that was searched.
        path: PathBuf,
        /// What to do about it.
        hint: String,
    },

    /// An operating-system error while reading.
    #[error("cannot read {}: {source}; check that it exists and is readable", .path.display())]
    Read {
        /// The file being read.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// An operating-system error while writing.
    #[error(
        "cannot write {}: {source}; check that the directory exists, is writable and has free space",
        .path.display()
    )]
    Write {
        /// The file being written.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The file starts like a gzip file but does not decompress.
    #[error(
        "{} looks gzip-compressed but does not decompress ({source}); it is corrupt or cut short: re-download it",
        .path.display()
    )]
    CorruptGzip {
        /// The file.
        path: PathBuf,
        /// The decompressor's complaint.
        #[source]
        source: std::io::Error,
    },

    /// The file is shorter than its header says.
    #[error("{format} file {} is truncated: {detail}; re-download or regenerate it", .path.display())]
    Truncated {
        /// The format, e.g. "MNIST".
        format: &'static str,
        /// The file.
        path: PathBuf,
        /// Sizes: what the header promised and what was found.
        detail: String,
    },

    /// The file does not start with the format's magic number.
    #[error(
        "{format} file {} has magic number {found} where {expected} was expected; {hint}",
        .path.display()
    )]
    BadMagic {
        /// The format, e.g. "MNIST".
        format: &'static str,
        /// The file.
        path: PathBuf,
        /// The number found.
        found: u64,
        /// The number expected.
        expected: u64,
        /// What to do about it.
        hint: String,
    },

    /// A structural problem other than truncation or a bad magic number.
    #[error("{format} file {} is malformed: {detail}", .path.display())]
    Malformed {
        /// The format, e.g. "CIFAR-10".
        format: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong and what to do.
        detail: String,
    },

    /// A label or token is not below the number of classes / vocabulary size.
    #[error(
        "{format} file {}: {what} {value} at position {index} is out of range (must be below {limit}); {hint}",
        .path.display()
    )]
    OutOfRange {
        /// The format.
        format: &'static str,
        /// The file.
        path: PathBuf,
        /// "label" or "token".
        what: &'static str,
        /// Which record / token.
        index: usize,
        /// The offending value.
        value: u64,
        /// The exclusive upper bound.
        limit: u64,
        /// What to do about it.
        hint: String,
    },

    /// A data spec string that is none of the known forms.
    #[error(
        "unknown data set \"{spec}\": {reason}; valid forms are {}",
        VALID_FORMS
    )]
    UnknownSpec {
        /// The string as given.
        spec: String,
        /// Why it was rejected.
        reason: String,
    },

    /// A bad combination of settings (batch size, context length, shard, …) for a data set.
    #[error("invalid data configuration: {0}")]
    Config(String),

    /// A tokenizer that cannot be built or used: a malformed `tokenizer.json` or GGUF
    /// vocabulary, an unsupported tokenizer kind, an id outside the vocabulary.
    #[error("tokenizer ({source_name}): {detail}")]
    Tokenizer {
        /// Where the tokenizer came from: a file path or "GGUF vocabulary".
        source_name: String,
        /// What is wrong and what to do.
        detail: String,
    },

    /// A chat template that does not parse or render.
    #[error("chat template ({template}): {detail}")]
    ChatTemplate {
        /// Which template: where it came from.
        template: String,
        /// What failed, with the line where the template engine knows it.
        detail: String,
    },

    /// The DataLoader's background thread stopped unexpectedly.
    #[error("the data loader's background thread stopped: {0}")]
    LoaderStopped(String),
}

impl DataError {
    /// The error for a failed `std::fs` read, mapping "not found" to [`DataError::NotFound`].
    pub(crate) fn from_read(what: &str, path: PathBuf, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            DataError::NotFound {
                what: what.to_string(),
                path,
                hint: "check the path".to_string(),
            }
        } else {
            DataError::Read { path, source }
        }
    }
}
