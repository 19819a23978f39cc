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
mod dataset;
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
pub(crate) use dataset::{push_f32, push_i64};
pub use dataset::{Dataset, HostArray, HostDType, HostData, InputEncoding, Split};
pub use digits::{digits, DigitsDataset};
pub use error::{DataError, Result};
pub use loader::{Batch, DataLoader, LoaderPosition};
pub use mnist::{mnist, MnistDataset, MNIST_MEAN, MNIST_STD};
pub use spec::{open, DataKind, DataSpec, OpenOptions};
pub use text::{shakespeare, split_dataset, text, LmDataset, Windows, TEXT_VOCAB_SIZE};
pub use tokenizer::{ChatMessage, ChatTemplate, GgufVocab, Gpt2Tokenizer, TextTokenizer};
pub use tokens::{
    read_tokens, tokens, write_tokens, GPT2_VOCAB_SIZE, TOKENS_MAGIC, TOKENS_VERSION,
};
