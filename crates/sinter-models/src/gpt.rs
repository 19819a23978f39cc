//! GPT (GPT-2's architecture): token + position embeddings, pre-norm Transformer blocks,
//! a final LayerNorm, and an output head tied to the token embedding.
//!
//! Training runs the blocks' fast path (flash attention, fused residual + LayerNorm, fused
//! bias + GELU) with optional activation checkpointing per block (`set_recompute`); the
//! unfused composite stays available (`set_fast_path(false)`) as the reference. Generation
//! keeps a KV cache (`KvCache`, `forward_step`): each new token runs the blocks on one
//! position and attends over the cached keys and values of the earlier ones. The generation
//! code lives in the submodules: `decode` (one step for many sequences at once, each with its
//! own cache: continuous batching), `sequence` (one sequence's tokens, window and cache, and
//! what happens past the context), `sampling` (logits → token) and `generate` (the loops);
//! on the CPU, decode steps and prefills run as one pass over preallocated buffers
//! (`host_step`), the tensor path (`forward_step`) being the reference and the path elsewhere.

mod decode;
mod generate;
mod host_step;
mod sampling;
mod sequence;

pub use generate::GenerateOptions;
pub use sampling::{sample_token, SamplingParams};
pub use sequence::{ContextPolicy, GptSequence};

use std::sync::{Arc, Mutex};

use crate::model::{sequence_loss, BatchLoss, Model};
use crate::Task;
use sinter_core::{bail, no_grad, DType, Result, Rng, Tensor};
use sinter_nn::module::{join, NamedTensor};
use sinter_nn::recompute::{block_forward, Recompute};
use sinter_nn::{Dropout, Embedding, LayerKvCache, LayerNorm, Module, SharedRng, TransformerBlock};

#[derive(Clone, Debug, PartialEq)]
pub struct GptConfig {
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    pub block_size: usize,
    pub vocab_size: usize,
    pub dropout: f32,
}

impl GptConfig {
    pub fn preset(name: &str) -> Option<GptConfig> {
        match name {
            // Byte-level, trainable on a 2-core CPU in minutes.
            "gpt-tiny" => Some(GptConfig {
                n_layer: 4,
                n_head: 4,
                n_embd: 128,
                block_size: 64,
                vocab_size: 256,
                dropout: 0.0,
            }),
            // GPT-2 small: 124M parameters.
            "gpt2" => Some(GptConfig {
                n_layer: 12,
                n_head: 12,
                n_embd: 768,
                block_size: 1024,
                vocab_size: 50257,
                dropout: 0.0,
            }),
            _ => None,
        }
    }
}

pub struct Gpt {
    pub config: GptConfig,
    pub wte: Embedding,
    pub wpe: Embedding,
    /// Shared so that a checkpointed block's recomputation can outlive this borrow.
    pub blocks: Vec<Arc<TransformerBlock>>,
    pub ln_f: LayerNorm,
    drop: Dropout,
    drop_rng: SharedRng,
    recompute: Recompute,
    fast_path: bool,
    /// The host decode step's buffers, kept between steps (`host_step`).
    scratch: Mutex<host_step::Scratch>,
}

/// The keys and values of every layer for the positions generated so far (batch as given
/// to `Gpt::kv_cache`, capacity `block_size`).
pub struct KvCache {
    pub layers: Vec<LayerKvCache>,
}

impl KvCache {
    /// Positions cached.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.len)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn capacity(&self) -> usize {
        self.layers.first().map_or(0, |l| l.capacity())
    }
    /// Forgets every position (the buffers are kept).
    pub fn clear(&mut self) {
        self.layers.iter_mut().for_each(|l| l.len = 0);
    }
}

impl Gpt {
    pub fn new(config: GptConfig, rng: &mut Rng, drop_rng: &SharedRng) -> Result<Self> {
        let c = &config;
        let blocks = (0..c.n_layer)
            .map(|_| {
                TransformerBlock::new(c.n_embd, c.n_head, c.n_layer, c.dropout, rng, drop_rng)
                    .map(Arc::new)
            })
            .collect::<Result<_>>()?;
        Ok(Gpt {
            wte: Embedding::new(c.vocab_size, c.n_embd, 0.02, rng)?,
            wpe: Embedding::new(c.block_size, c.n_embd, 0.01, rng)?,
            blocks,
            ln_f: LayerNorm::new(c.n_embd)?,
            drop: Dropout::new(c.dropout, drop_rng.clone()),
            drop_rng: drop_rng.clone(),
            recompute: Recompute::None,
            fast_path: true,
            scratch: Mutex::default(),
            config,
        })
    }

    /// What each block recomputes in backward instead of keeping (default: nothing).
    pub fn set_recompute(&mut self, mode: Recompute) {
        self.recompute = mode;
    }
    pub fn recompute(&self) -> Recompute {
        self.recompute
    }
    /// true (default): fused kernels; false: the unfused composite ops (the reference; no
    /// recompute there).
    pub fn set_fast_path(&mut self, on: bool) {
        self.fast_path = on;
    }
    pub fn fast_path(&self) -> bool {
        self.fast_path
    }

    fn check_ids(&self, ids: &Tensor) -> Result<()> {
        if ids.rank() != 2 || ids.dtype() != DType::I64 {
            bail!(
                "gpt: expected i64 token ids [batch, time], got {:?} {}",
                ids.shape(),
                ids.dtype()
            );
        }
        Ok(())
    }

    /// Final LayerNorm and the tied head: [b, t, c] → [b, t, vocab].
    fn head(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        // One [b·t, c] × [c, vocab] product: the tied head's gradient is then a single GEMM.
        self.head_rows(&x.reshape(&[b * t, c])?)?
            .reshape(&[b, t, self.config.vocab_size])
    }

    /// The head over rows of hidden states: [n, c] → [n, vocab].
    pub(crate) fn head_rows(&self, x: &Tensor) -> Result<Tensor> {
        // Through the table's `linear`, so an int8-quantized table serves the head too.
        self.wte.linear(&self.ln_f.forward(x)?)
    }

    /// An empty KV cache for `batch` sequences, holding up to `block_size` positions.
    pub fn kv_cache(&self, batch: usize) -> Result<KvCache> {
        self.kv_cache_with_capacity(batch, self.config.block_size)
    }

    /// An empty KV cache for `batch` sequences, holding up to `capacity` (≤ `block_size`)
    /// positions: a sequence known to stay short needs no more memory than its length.
    pub fn kv_cache_with_capacity(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        let c = &self.config;
        if capacity > c.block_size {
            bail!(
                "gpt: a KV cache of {capacity} positions exceeds the context of {}",
                c.block_size
            );
        }
        let layers = (0..c.n_layer)
            .map(|_| {
                LayerKvCache::new(
                    batch,
                    c.n_head,
                    capacity,
                    c.n_embd / c.n_head,
                    self.wte.weight.dtype(),
                    self.wte.weight.device(),
                )
            })
            .collect::<Result<_>>()?;
        Ok(KvCache { layers })
    }

    /// Logits [b, s, vocab] for ids [b, s] at positions cache.len()..cache.len() + s, given
    /// the earlier positions' keys and values in `cache` (which this appends to). Equal to
    /// the last s positions of `forward` over the whole sequence. Inference: runs without
    /// recording gradients; call `set_training(false)` first when the model has dropout.
    pub fn forward_step(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let _g = no_grad();
        self.head(&self.hidden_step(ids, cache)?)
    }

    /// An error unless `s` new positions after `start` cached ones fit `cache` and the context.
    pub(crate) fn check_step(&self, start: usize, s: usize, cache: &KvCache) -> Result<()> {
        if start + s > cache.capacity().min(self.config.block_size) {
            bail!(
                "gpt: {start} cached + {s} new positions exceed the KV cache's {} (context {})",
                cache.capacity(),
                self.config.block_size
            );
        }
        if cache.layers.len() != self.blocks.len() {
            bail!(
                "gpt: KV cache has {} layers, the model {}",
                cache.layers.len(),
                self.blocks.len()
            );
        }
        Ok(())
    }

    /// `forward_step` without the head: the last block's output [b, s, c] (a prefill needs
    /// the head on its last position only).
    pub fn hidden_step(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let _g = no_grad();
        self.check_ids(ids)?;
        let (start, s) = (cache.len(), ids.shape()[1]);
        self.check_step(start, s, cache)?;
        // Positions are made where the model lives (no upload inside a step).
        let pos = Tensor::arange(
            start as f64,
            (start + s) as f64,
            1.0,
            DType::I64,
            self.wpe.weight.device(),
        )?;
        let mut x = self.wte.forward(ids)?.add(&self.wpe.forward(&pos)?)?;
        for (b, layer) in self.blocks.iter().zip(cache.layers.iter_mut()) {
            x = b.forward_step(&x, layer)?;
        }
        Ok(x)
    }
}

impl Module for Gpt {
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
    /// ids [b, t] (i64) → logits [b, t, vocab].
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.check_ids(ids)?;
        let t = ids.shape()[1];
        if t > self.config.block_size {
            bail!(
                "gpt: sequence of {t} tokens is longer than the context of {}",
                self.config.block_size
            );
        }
        let pos = Tensor::arange(0.0, t as f64, 1.0, DType::I64, self.wpe.weight.device())?;
        let mut x = self
            .drop
            .forward(&self.wte.forward(ids)?.add(&self.wpe.forward(&pos)?)?)?;
        for b in &self.blocks {
            x = if self.fast_path {
                block_forward(b, &x, self.recompute, Some(&self.drop_rng))?
            } else {
                b.forward_composite(&x)?
            };
        }
        self.head(&x)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.wte.collect(&join(prefix, "wte"), out);
        self.wpe.collect(&join(prefix, "wpe"), out);
        for (i, b) in self.blocks.iter().enumerate() {
            b.collect(&join(prefix, &format!("blocks.{i}")), out);
        }
        self.ln_f.collect(&join(prefix, "ln_f"), out);
    }
    fn set_training(&self, t: bool) {
        self.drop.set_training(t);
        self.blocks.iter().for_each(|b| b.set_training(t));
    }
}

impl Model for Gpt {
    fn task(&self) -> Task {
        Task::LanguageModel
    }
    fn loss(&self, inputs: &Tensor, targets: &Tensor) -> Result<BatchLoss> {
        sequence_loss(&self.forward(inputs)?, targets)
    }
}
