//! # sinter-data
//!
//! The data layer of sinter: datasets, file-format readers and a background [`DataLoader`].
//! It does not depend on `sinter-core`; it hands out plain host arrays ([`HostArray`]) that
//! the trainer turns into tensors.
//!
//! ## Core types
//!
//! ```text
//! pub enum HostData { F32(Vec<f32>), I64(Vec<i64>) }
//! pub struct HostArray { pub shape: Vec<usize>, pub data: HostData }      // row-major
//! pub struct Batch { pub inputs: HostArray, pub targets: HostArray,
//!                    pub indices: Vec<usize>, pub position: LoaderPosition }
//! pub trait Dataset: Send + Sync {
//!     fn len(&self) -> usize;
//!     fn get(&self, index: usize) -> (HostArray, HostArray);   // (input, target)
//!     fn input_shape(&self) -> Vec<usize>;                       // one example
//!     fn target_shape(&self) -> Vec<usize>;
//!     fn num_classes(&self) -> Option<usize>;                    // classes, or vocab size
//!     fn input_encoding(&self) -> InputEncoding;                 // provided: how raw inputs map
//!     fn class_names(&self) -> Option<Vec<String>>;              // provided
//!     fn append_example(&self, index, inputs: &mut HostData, targets: &mut HostData); // provided
//! }
//! ```
//!
//! ## Data sets and formats
//!
//! | function | data | input | target |
//! | --- | --- | --- | --- |
//! | [`digits`]`(split)` | bundled 8×8 digits (1,797: 1,437 train / 360 validation) | f32 `[1,8,8]` in 0–1 | i64 `[]` |
//! | [`mnist`]`(dir, split)` | MNIST IDX files, raw or gzip | f32 `[1,28,28]` normalised | i64 `[]` |
//! | [`cifar10`]`(dir, split)` | CIFAR-10 binary batches | f32 `[3,32,32]` normalised per channel | i64 `[]` |
//! | [`shakespeare`]`(split, T)` / [`text`]`(path, split, T)` | bytes of a text, vocab 256 | i64 `[T]` | i64 `[T]` (shifted by one) |
//! | [`tokens`]`(path, split, T, vocab)` | llm.c `.bin` token files (u16) | i64 `[T]` | i64 `[T]` (shifted by one) |
//!
//! Every reader detects gzip by its magic bytes (not by the file name) and validates
//! headers, magic numbers, sizes and label ranges; bad input gives a [`DataError`] naming the
//! file and saying what to do, never a panic. [`write_tokens`] writes an llm.c token file
//! atomically; [`Gpt2Tokenizer`] (GPT-2's BPE, tiktoken's `r50k_base`, offline) turns text
//! into the `u16` ids such files hold.
//!
//! The [`tokenizer`] module also holds the tokenizers of pretrained models: [`TextTokenizer`]
//! (Hugging Face `tokenizer.json`, or a GGUF file's vocabulary as a [`GgufVocab`]) with
//! streaming decoding, and their Jinja chat templates ([`ChatTemplate`]).
//!
//! Language-model datasets ([`LmDataset`]) have two window modes ([`Windows`]): `Sliding`
//! (example `i` is `tokens[i..i+T]` → `tokens[i+1..i+T+1]`, length `n − T`, so shuffled
//! batches are random windows) and `Strided` (non-overlapping windows with stride `T`, for
//! cheap deterministic evaluation).
//!
//! [`DataSpec::parse`] turns a command-line string (`digits`, `shakespeare`, `mnist:DIR`,
//! `cifar10:DIR`, `text:FILE`, `tokens:FILE_OR_DIR`) into a spec; [`open`] /
//! [`DataSpec::open_with`] open it as an `Arc<dyn Dataset>`, and [`DataSpec::kind`] says
//! whether it is a classification or a language-model data set.
//!
//! ## The loader
//!
//! ```text
//! DataLoader::new(dataset: Arc<dyn Dataset>, batch_size, shuffle, drop_last, seed) -> DataLoader
//!     .with_shard(rank, world_size) -> DataLoader
//!     .with_position(LoaderPosition) -> DataLoader
//!     .position() -> LoaderPosition            // of the NEXT batch
//!     .next_batch() -> Result<Batch>           // endless: epochs roll over
//!     .batches_per_epoch() -> u64
//! ```
//!
//! The order of epoch `e` is a pure function of `(seed, e)` (SplitMix64-seeded xoshiro256**
//! and Fisher–Yates, see [`rng`]), so restarting from a saved [`LoaderPosition`] reproduces
//! an uninterrupted run exactly. A background thread prepares batches ahead of the trainer
//! through a bounded channel (depth 2); dropping the loader stops it.
//!
//! ```
//! use std::sync::Arc;
//! use sinter_data::{digits, DataLoader, Split};
//!
//! let train = Arc::new(digits(Split::Train)?);
//! let mut loader = DataLoader::new(train, 32, true, true, 0);
//! let batch = loader.next_batch()?;
//! assert_eq!(batch.inputs.shape, vec![32, 1, 8, 8]);
//! assert_eq!(batch.targets.shape, vec![32]);
//! let saved = loader.position(); // store saved.to_u64s() in a checkpoint
//! # let _ = saved;
//! # Ok::<(), sinter_data::DataError>(())
//! ```

#![warn(missing_docs)]

mod cifar;
mod digits;
mod error;
mod io;
mod loader;
mod mnist;
pub mod rng;
mod spec;
mod text;
pub mod tokenizer;
mod tokens;

pub use cifar::{cifar10, Cifar10Dataset, CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD};
pub use digits::{digits, DigitsDataset};
pub use error::{DataError, Result};
pub use loader::{DataLoader, LoaderPosition};
pub use mnist::{mnist, MnistDataset, MNIST_MEAN, MNIST_STD};
pub use spec::{open, DataKind, DataSpec, OpenOptions};
pub use text::{shakespeare, split_dataset, text, LmDataset, Windows, TEXT_VOCAB_SIZE};
pub use tokenizer::{ChatMessage, ChatTemplate, GgufVocab, Gpt2Tokenizer, TextTokenizer};
pub use tokens::{
    read_tokens, tokens, write_tokens, GPT2_VOCAB_SIZE, TOKENS_MAGIC, TOKENS_VERSION,
};

/// Which part of a data set: the training part or the held-out validation part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Split {
    /// The training examples.
    Train,
    /// The held-out examples.
    Validation,
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Split::Train => "train",
            Split::Validation => "validation",
        })
    }
}

/// The element type of a [`HostData`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HostDType {
    /// 32-bit float.
    F32,
    /// 64-bit signed integer (class labels, token ids).
    I64,
}

/// The elements of a host array.
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    /// Floats (image pixels).
    F32(Vec<f32>),
    /// Integers (class labels, token ids).
    I64(Vec<i64>),
}

impl HostData {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostData::F32(v) => v.len(),
            HostData::I64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn dtype(&self) -> HostDType {
        match self {
            HostData::F32(_) => HostDType::F32,
            HostData::I64(_) => HostDType::I64,
        }
    }

    /// The floats, if this is `F32`.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            HostData::F32(v) => Some(v),
            HostData::I64(_) => None,
        }
    }

    /// The integers, if this is `I64`.
    pub fn as_i64(&self) -> Option<&[i64]> {
        match self {
            HostData::I64(v) => Some(v),
            HostData::F32(_) => None,
        }
    }

    /// Appends `other`'s elements. Returns `false` (and appends nothing) if the element
    /// types differ.
    pub fn extend_from(&mut self, other: &HostData) -> bool {
        match (self, other) {
            (HostData::F32(a), HostData::F32(b)) => a.extend_from_slice(b),
            (HostData::I64(a), HostData::I64(b)) => a.extend_from_slice(b),
            _ => return false,
        }
        true
    }

    /// Reserves room for `additional` more elements.
    pub fn reserve(&mut self, additional: usize) {
        match self {
            HostData::F32(v) => v.reserve(additional),
            HostData::I64(v) => v.reserve(additional),
        }
    }
}

/// A row-major array in host memory: a shape and its elements.
#[derive(Clone, Debug, PartialEq)]
pub struct HostArray {
    /// The dimensions; `[]` is a scalar.
    pub shape: Vec<usize>,
    /// The elements, `shape.iter().product()` of them.
    pub data: HostData,
}

impl HostArray {
    /// An f32 array.
    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> Self {
        HostArray {
            shape,
            data: HostData::F32(data),
        }
    }

    /// An i64 array.
    pub fn i64(shape: Vec<usize>, data: Vec<i64>) -> Self {
        HostArray {
            shape,
            data: HostData::I64(data),
        }
    }

    /// The number of elements the shape calls for.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// One mini-batch: inputs stacked along a new leading batch dimension, and targets likewise.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Shape `[b] + dataset.input_shape()`.
    pub inputs: HostArray,
    /// Shape `[b] + dataset.target_shape()`.
    pub targets: HostArray,
    /// The dataset indices of the `b` examples, in batch order.
    pub indices: Vec<usize>,
    /// Where this batch sits in the loader's stream (epoch, batch within the epoch).
    pub position: LoaderPosition,
}

impl Batch {
    /// The number of examples in the batch.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Whether the batch has no examples (never true for batches from a [`DataLoader`]).
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
}

/// How raw inputs become a dataset's example inputs, so a model trained on it can be run on
/// new inputs (an image file, a prompt) without the data set.
#[derive(Clone, Debug, PartialEq)]
pub enum InputEncoding {
    /// Images `[c, h, w]`: `x = (pixel / pixel_max − mean[c]) / std[c]`.
    Image {
        /// The largest raw pixel value (16 for the bundled digits, 255 for 8-bit images).
        pixel_max: f32,
        /// Per-channel mean subtracted (after scaling to 0–1).
        mean: Vec<f32>,
        /// Per-channel standard deviation divided out.
        std: Vec<f32>,
    },
    /// Text as bytes: one token per byte (vocabulary 256).
    Bytes,
    /// Text as GPT-2 BPE token ids ([`Gpt2Tokenizer`]).
    Gpt2Tokens,
    /// Not known (token files of another tokenizer).
    Unspecified,
}

/// A random-access collection of `(input, target)` examples.
///
/// Implementations must be cheap to call from a background thread (`Send + Sync`) and
/// every example of one dataset must have the same shapes and element types.
pub trait Dataset: Send + Sync {
    /// Number of examples.
    fn len(&self) -> usize;

    /// Whether there are no examples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Example `index` as `(input, target)`, shaped [`input_shape`](Self::input_shape) and
    /// [`target_shape`](Self::target_shape).
    ///
    /// # Panics
    /// If `index >= self.len()` (a caller bug, not bad data).
    fn get(&self, index: usize) -> (HostArray, HostArray);

    /// The shape of one example's input.
    fn input_shape(&self) -> Vec<usize>;

    /// The shape of one example's target (`[]` for a class label).
    fn target_shape(&self) -> Vec<usize>;

    /// For classifiers the number of classes; for language models the vocabulary size.
    fn num_classes(&self) -> Option<usize>;

    /// How raw inputs become this dataset's inputs.
    fn input_encoding(&self) -> InputEncoding {
        InputEncoding::Unspecified
    }

    /// The classes' names, by class id, where the data names them.
    fn class_names(&self) -> Option<Vec<String>> {
        None
    }

    /// Appends example `index`'s elements to `inputs` and `targets` (used to build batches
    /// without per-example allocation). The default calls [`get`](Self::get); datasets
    /// override it to write in place.
    ///
    /// # Panics
    /// If `index >= self.len()`.
    fn append_example(&self, index: usize, inputs: &mut HostData, targets: &mut HostData) {
        let (x, y) = self.get(index);
        inputs.extend_from(&x.data);
        targets.extend_from(&y.data);
    }
}

/// Pushes `values` onto an `F32` buffer (no-op on the wrong type; the loader's size check
/// then reports the mismatch).
pub(crate) fn push_f32(buf: &mut HostData, values: impl Iterator<Item = f32>) {
    if let HostData::F32(v) = buf {
        v.extend(values);
    }
}

/// Pushes `values` onto an `I64` buffer (no-op on the wrong type).
pub(crate) fn push_i64(buf: &mut HostData, values: impl Iterator<Item = i64>) {
    if let HostData::I64(v) = buf {
        v.extend(values);
    }
}
