//! Language-model data: a token sequence cut into (context → next-token) windows, and the
//! byte-level text readers (bundled tiny Shakespeare or any file).

use std::path::{Path, PathBuf};

use crate::error::{DataError, Result};
use crate::io::read_file;
use crate::{push_i64, Dataset, HostArray, HostData, InputEncoding, Split};

/// The vocabulary size of byte-level text.
pub const TEXT_VOCAB_SIZE: usize = 256;

/// Tiny Shakespeare (karpathy/char-rnn; see `data/README.md`), embedded in the binary.
static SHAKESPEARE: &[u8] = include_bytes!("../../../data/tinyshakespeare.txt");

/// How an [`LmDataset`] cuts its token sequence into examples.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Windows {
    /// Every start offset: example `i` is `tokens[i..i+T]` → `tokens[i+1..i+T+1]`, so there
    /// are `n − T` examples and shuffled batches are random windows (as in nanoGPT).
    #[default]
    Sliding,
    /// Non-overlapping windows with stride `T`: example `k` starts at `k·T`; there are
    /// `(n − 1) / T` examples. For cheap, deterministic evaluation.
    Strided,
}

/// A next-token-prediction dataset over one token sequence.
///
/// Input and target are i64 `[T]`; the target is the input shifted by one token.
/// [`num_classes`](Dataset::num_classes) is the vocabulary size.
#[derive(Clone, Debug)]
pub struct LmDataset {
    /// u32: the vocabularies of today's LLMs (Llama 3, Qwen) exceed 16 bits.
    tokens: Vec<u32>,
    vocab_size: usize,
    context_len: usize,
    windows: Windows,
    encoding: InputEncoding,
}

impl LmDataset {
    /// Windows of `context_len` tokens over `tokens`, all of which must be below
    /// `vocab_size`. Needs at least `context_len + 1` tokens.
    pub fn new(
        tokens: Vec<u32>,
        vocab_size: usize,
        context_len: usize,
        windows: Windows,
    ) -> Result<Self> {
        if context_len == 0 {
            return Err(DataError::Config(
                "context length is 0; use a context length of at least 1".into(),
            ));
        }
        if vocab_size == 0 {
            return Err(DataError::Config(
                "vocabulary size is 0; give the tokenizer's vocabulary size".into(),
            ));
        }
        if tokens.len() <= context_len {
            return Err(DataError::Config(format!(
                "{} tokens are too few for a context length of {context_len} (need at least {}); \
                 use more data or a shorter context",
                tokens.len(),
                context_len + 1
            )));
        }
        if let Some((i, &t)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= vocab_size)
        {
            return Err(DataError::Config(format!(
                "token {t} at position {i} is not below the vocabulary size {vocab_size}; \
                 give the tokenizer's vocabulary size"
            )));
        }
        Ok(LmDataset {
            tokens,
            vocab_size,
            context_len,
            windows,
            encoding: InputEncoding::Unspecified,
        })
    }

    /// The same tokens cut with another window mode.
    pub fn with_windows(mut self, windows: Windows) -> Self {
        self.windows = windows;
        self
    }

    /// The same tokens, saying how text became them.
    pub fn with_encoding(mut self, encoding: InputEncoding) -> Self {
        self.encoding = encoding;
        self
    }

    /// The window mode.
    pub fn windows(&self) -> Windows {
        self.windows
    }

    /// The context length `T`.
    pub fn context_len(&self) -> usize {
        self.context_len
    }

    /// The vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The whole token sequence of this split.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The offset in [`tokens`](Self::tokens) where example `index`'s input starts.
    pub fn window_start(&self, index: usize) -> usize {
        assert!(
            index < self.len(),
            "window {index} out of range ({})",
            self.len()
        );
        match self.windows {
            Windows::Sliding => index,
            Windows::Strided => index * self.context_len,
        }
    }

    fn window(&self, index: usize) -> (&[u32], &[u32]) {
        let s = self.window_start(index);
        let t = self.context_len;
        (&self.tokens[s..s + t], &self.tokens[s + 1..s + t + 1])
    }
}

impl Dataset for LmDataset {
    fn len(&self) -> usize {
        let n = self.tokens.len();
        match self.windows {
            Windows::Sliding => n - self.context_len,
            Windows::Strided => (n - 1) / self.context_len,
        }
    }

    fn get(&self, index: usize) -> (HostArray, HostArray) {
        let (x, y) = self.window(index);
        let t = self.context_len;
        (
            HostArray::i64(vec![t], x.iter().map(|&v| v as i64).collect()),
            HostArray::i64(vec![t], y.iter().map(|&v| v as i64).collect()),
        )
    }

    fn append_example(&self, index: usize, inputs: &mut HostData, targets: &mut HostData) {
        let (x, y) = self.window(index);
        push_i64(inputs, x.iter().map(|&v| v as i64));
        push_i64(targets, y.iter().map(|&v| v as i64));
    }

    fn input_shape(&self) -> Vec<usize> {
        vec![self.context_len]
    }

    fn target_shape(&self) -> Vec<usize> {
        vec![self.context_len]
    }

    fn num_classes(&self) -> Option<usize> {
        Some(self.vocab_size)
    }

    fn input_encoding(&self) -> InputEncoding {
        self.encoding.clone()
    }
}

/// The index where the validation part of `n` tokens starts: the first 90% (rounded down)
/// are training, the rest validation.
pub(crate) fn split_point(n: usize) -> usize {
    (n as u128 * 9 / 10) as usize
}

/// The `split` part of `tokens` (first 90% / last 10%) as sliding windows; `source` names
/// the data in error messages. Public for token sequences made outside this crate (text
/// encoded with a pretrained model's tokenizer), which split by the same rule.
pub fn split_dataset(
    mut tokens: Vec<u32>,
    split: Split,
    context_len: usize,
    vocab_size: usize,
    source: &Path,
) -> Result<LmDataset> {
    let n = tokens.len();
    let cut = split_point(n);
    let part = match split {
        Split::Train => {
            tokens.truncate(cut);
            tokens
        }
        Split::Validation => tokens.split_off(cut),
    };
    if part.len() <= context_len {
        let which = match split {
            Split::Train => "first 90%",
            Split::Validation => "last 10%",
        };
        return Err(DataError::Config(format!(
            "the {split} part of {} (the {which} of its {n} tokens) has {} tokens, too few for \
             a context length of {context_len}; use a longer text or a shorter context",
            source.display(),
            part.len(),
        )));
    }
    LmDataset::new(part, vocab_size, context_len, Windows::Sliding)
}

/// Bundled tiny Shakespeare as bytes (vocab 256): first 90% train, last 10% validation,
/// sliding windows of `context_len`.
pub fn shakespeare(split: Split, context_len: usize) -> Result<LmDataset> {
    let tokens = SHAKESPEARE.iter().map(|&b| u32::from(b)).collect();
    Ok(split_dataset(
        tokens,
        split,
        context_len,
        TEXT_VOCAB_SIZE,
        &PathBuf::from("<bundled>/data/tinyshakespeare.txt"),
    )?
    .with_encoding(InputEncoding::Bytes))
}

/// Any file as bytes (vocab 256; gzip is decompressed first): first 90% train, last 10%
/// validation, sliding windows of `context_len`.
pub fn text(path: impl AsRef<Path>, split: Split, context_len: usize) -> Result<LmDataset> {
    let path = path.as_ref();
    let (bytes, _) = read_file(path, "text file")?;
    let tokens = bytes.iter().map(|&b| u32::from(b)).collect();
    Ok(
        split_dataset(tokens, split, context_len, TEXT_VOCAB_SIZE, path)?
            .with_encoding(InputEncoding::Bytes),
    )
}
