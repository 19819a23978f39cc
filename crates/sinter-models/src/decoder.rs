//! The decoder-only Transformer: token embeddings (plus a learned position table for GPT-2),
//! pre-norm blocks (`sinter_nn::TransformerBlock`, configured by `DecoderArch`: GPT-2's
//! LayerNorm/GELU/learned positions or the Llama family's RMSNorm/SwiGLU/rotary/grouped-query
//! attention), a final norm, and an output head tied to the token table or its own.
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
mod kv_cache;
mod sampling;
mod sequence;

pub use generate::GenerateOptions;
pub use kv_cache::KvCache;
pub use sampling::{sample_token, SamplingParams};
pub use sequence::{ContextPolicy, DecoderSequence};

use std::sync::{Arc, Mutex};

use crate::model::{sequence_loss, BatchLoss, Model, IGNORE_INDEX};
use crate::Task;
use sinter_core::kernels::classifier::{fused_classifier, padded_vocab};
use sinter_core::{bail, no_grad, DType, Result, Rng, Tensor};
use sinter_nn::module::{join, NamedTensor};
use sinter_nn::recompute::{block_forward, Recompute};
use sinter_nn::{
    BlockConfig, Dropout, Embedding, LayerKvCache, Linear, MlpKind, Module, Norm, NormKind,
    RopeConfig, RopeScaling, SharedRng, TransformerBlock,
};

/// The decoder's sizes and, in `arch`, the shape of its blocks: GPT-2's by default, the
/// Llama family's with `DecoderArch::llama`. One model type runs both (`Decoder`).
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    /// The context: the longest sequence the model takes.
    pub block_size: usize,
    pub vocab_size: usize,
    pub dropout: f32,
    pub arch: DecoderArch,
}

/// What a decoder block is made of beyond its sizes. `None` sizes follow GPT-2's rules
/// (n_head kv heads, n_embd / n_head per head, 4·n_embd MLP).
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderArch {
    pub n_kv_head: Option<usize>,
    pub head_dim: Option<usize>,
    pub mlp_hidden: Option<usize>,
    pub mlp: MlpKind,
    pub norm: NormKind,
    pub norm_eps: f32,
    pub qkv_bias: bool,
    pub out_bias: bool,
    pub mlp_bias: bool,
    pub qk_norm: bool,
    /// Rotary positions; None: a learned position table (`wpe`) added to the embeddings.
    pub rope: Option<RopeConfig>,
    /// The output head is the token table (GPT-2, SmolLM2) or its own `lm_head` (Llama).
    pub tie_head: bool,
    /// Each query sees only the last `w` positions (Mistral's `sliding_window`)...
    pub sliding_window: Option<usize>,
    /// ... except in the first this many layers, which attend to every position (Qwen's
    /// `max_window_layers`; 0: every layer windows, as Mistral's do).
    pub full_attention_layers: usize,
}

impl DecoderArch {
    /// GPT-2: LayerNorm, GELU, learned positions, biases everywhere, tied head.
    pub fn gpt2() -> Self {
        DecoderArch {
            n_kv_head: None,
            head_dim: None,
            mlp_hidden: None,
            mlp: MlpKind::Gelu,
            norm: NormKind::LayerNorm,
            norm_eps: 1e-5,
            qkv_bias: true,
            out_bias: true,
            mlp_bias: true,
            qk_norm: false,
            rope: None,
            tie_head: true,
            sliding_window: None,
            full_attention_layers: 0,
        }
    }
    /// Llama: RMSNorm, SwiGLU, rotary positions with base `theta`, no biases, untied head.
    pub fn llama(theta: f64) -> Self {
        DecoderArch {
            mlp: MlpKind::SwiGlu,
            norm: NormKind::RmsNorm,
            qkv_bias: false,
            out_bias: false,
            mlp_bias: false,
            rope: Some(RopeConfig {
                theta,
                scaling: RopeScaling::None,
            }),
            tie_head: false,
            ..DecoderArch::gpt2()
        }
    }
    /// Whether this is GPT-2's block (the batched tensor-path decode step, which reads GPT-2's
    /// packed heads, takes only these; the host step and every other executor take any).
    pub fn is_gpt2(&self) -> bool {
        *self == DecoderArch::gpt2()
    }
}

impl Default for DecoderArch {
    fn default() -> Self {
        DecoderArch::gpt2()
    }
}

impl Default for DecoderConfig {
    /// The `gpt-tiny` preset.
    fn default() -> Self {
        DecoderConfig::preset("gpt-tiny").expect("gpt-tiny is a preset")
    }
}

impl DecoderConfig {
    pub fn preset(name: &str) -> Option<DecoderConfig> {
        match name {
            // Byte-level, trainable on a 2-core CPU in minutes.
            "gpt-tiny" => Some(DecoderConfig {
                n_layer: 4,
                n_head: 4,
                n_embd: 128,
                block_size: 64,
                vocab_size: 256,
                dropout: 0.0,
                arch: DecoderArch::gpt2(),
            }),
            // GPT-2 small: 124M parameters.
            "gpt2" => Some(DecoderConfig {
                n_layer: 12,
                n_head: 12,
                n_embd: 768,
                block_size: 1024,
                vocab_size: 50257,
                dropout: 0.0,
                arch: DecoderArch::gpt2(),
            }),
            // gpt-tiny's size as a Llama: grouped-query attention (2 kv heads), SwiGLU of
            // 344 (≈ 8/3 · 128, as Llama sizes it), RMSNorm, rotary positions.
            "llama-tiny" => Some(DecoderConfig {
                n_layer: 4,
                n_head: 4,
                n_embd: 128,
                block_size: 64,
                vocab_size: 256,
                dropout: 0.0,
                arch: DecoderArch {
                    n_kv_head: Some(2),
                    mlp_hidden: Some(344),
                    ..DecoderArch::llama(10_000.0)
                },
            }),
            _ => None,
        }
    }

    pub fn n_kv_head(&self) -> usize {
        self.arch.n_kv_head.unwrap_or(self.n_head)
    }
    pub fn head_dim(&self) -> usize {
        self.arch
            .head_dim
            .unwrap_or(self.n_embd.checked_div(self.n_head).unwrap_or(0))
    }

    /// Block `layer`'s configuration: [`block_config`](Self::block_config), with the sliding
    /// window only where that layer has one (`DecoderArch::full_attention_layers`).
    pub fn layer_config(&self, layer: usize) -> BlockConfig {
        let mut b = self.block_config();
        if layer < self.arch.full_attention_layers {
            b.sliding_window = None;
        }
        b
    }

    /// What every block shares (sizes, norms, MLP, positions); the sliding window is that
    /// of the windowed layers (build a block from [`layer_config`](Self::layer_config)).
    pub fn block_config(&self) -> BlockConfig {
        let a = &self.arch;
        BlockConfig {
            width: self.n_embd,
            n_head: self.n_head,
            n_kv_head: self.n_kv_head(),
            head_dim: self.head_dim(),
            mlp_hidden: a.mlp_hidden.unwrap_or(4 * self.n_embd),
            mlp: a.mlp,
            norm: a.norm,
            norm_eps: a.norm_eps,
            qkv_bias: a.qkv_bias,
            out_bias: a.out_bias,
            mlp_bias: a.mlp_bias,
            qk_norm: a.qk_norm,
            rope: a.rope.clone(),
            causal: true,
            post_norm: false,
            sliding_window: a.sliding_window,
            dropout: self.dropout,
            attention_dropout: self.dropout,
            n_layer: self.n_layer,
        }
    }

    /// An error naming the first inconsistency.
    pub fn check(&self) -> Result<()> {
        if self.n_layer == 0 || self.vocab_size == 0 || self.block_size == 0 {
            bail!(
                "gpt: layers, vocabulary and context must be positive, got {} layers, vocabulary {}, context {}",
                self.n_layer, self.vocab_size, self.block_size
            );
        }
        if self.arch.head_dim.is_none()
            && (self.n_head == 0 || !self.n_embd.is_multiple_of(self.n_head))
        {
            bail!(
                "gpt: width {} does not split into {} heads",
                self.n_embd,
                self.n_head
            );
        }
        if self.arch.full_attention_layers > 0 && self.arch.sliding_window.is_none() {
            bail!(
                "gpt: {} layers attend fully instead of through a sliding window, but the model has no sliding window",
                self.arch.full_attention_layers
            );
        }
        self.block_config().check()
    }

    /// Names and shapes of the parameters, in the order `Decoder::parameters()` lists them
    /// (every block shape: GPT-2's and the Llama family's).
    pub fn param_specs(&self) -> Vec<(String, Vec<usize>)> {
        let c = self.n_embd;
        let mut v = vec![("wte.weight".to_string(), vec![self.vocab_size, c])];
        if self.arch.rope.is_none() {
            v.push(("wpe.weight".to_string(), vec![self.block_size, c]));
        }
        for i in 0..self.n_layer {
            v.extend(self.block_param_specs(i));
        }
        v.push(("ln_f.weight".into(), vec![c]));
        if self.arch.norm == NormKind::LayerNorm {
            v.push(("ln_f.bias".into(), vec![c]));
        }
        if !self.arch.tie_head {
            v.push(("lm_head.weight".into(), vec![self.vocab_size, c]));
        }
        v
    }

    /// Names and shapes of block `i`'s parameters, in `TransformerBlock::collect`'s order.
    pub fn block_param_specs(&self, i: usize) -> Vec<(String, Vec<usize>)> {
        let b = self.block_config();
        let (c, q, kv) = (b.width, b.n_head * b.head_dim, b.n_kv_head * b.head_dim);
        let fc_rows = b.mlp.fc_rows(b.mlp_hidden);
        let ln_bias = b.norm == NormKind::LayerNorm;
        let mut v: Vec<(&str, Vec<usize>, bool)> = vec![
            ("ln1.weight", vec![c], true),
            ("ln1.bias", vec![c], ln_bias),
            ("attn.qkv.weight", vec![q + 2 * kv, c], true),
            ("attn.qkv.bias", vec![q + 2 * kv], b.qkv_bias),
            ("attn.q_norm.weight", vec![b.head_dim], b.qk_norm),
            ("attn.k_norm.weight", vec![b.head_dim], b.qk_norm),
            ("attn.proj.weight", vec![c, q], true),
            ("attn.proj.bias", vec![c], b.out_bias),
            ("ln2.weight", vec![c], true),
            ("ln2.bias", vec![c], ln_bias),
            ("mlp.fc.weight", vec![fc_rows, c], true),
            ("mlp.fc.bias", vec![fc_rows], b.mlp_bias),
            ("mlp.proj.weight", vec![c, b.mlp_hidden], true),
            ("mlp.proj.bias", vec![c], b.mlp_bias),
        ];
        v.retain(|(_, _, present)| *present);
        let p = format!("blocks.{i}");
        v.into_iter().map(|(n, s, _)| (join(&p, n), s)).collect()
    }
}

pub struct Decoder {
    pub config: DecoderConfig,
    pub wte: Embedding,
    /// The learned position table (GPT-2); None with rotary positions.
    pub wpe: Option<Embedding>,
    /// Shared so that a checkpointed block's recomputation can outlive this borrow.
    pub blocks: Vec<Arc<TransformerBlock>>,
    pub ln_f: Norm,
    /// The output head when it is not tied to `wte` ([vocab, n_embd], no bias).
    pub lm_head: Option<Linear>,
    drop: Dropout,
    drop_rng: SharedRng,
    recompute: Recompute,
    fast_path: bool,
    /// The host decode step's buffers, kept between steps (`host_step`).
    scratch: Mutex<host_step::Scratch>,
}

impl Decoder {
    pub fn new(config: DecoderConfig, rng: &mut Rng, drop_rng: &SharedRng) -> Result<Self> {
        config.check()?;
        let c = &config;
        let blocks = (0..c.n_layer)
            .map(|i| TransformerBlock::new(&c.layer_config(i), rng, drop_rng).map(Arc::new))
            .collect::<Result<_>>()?;
        // Drawn in GPT-2's order (blocks, token table, positions; then an untied head) so a
        // GPT-2 model is the same for a seed as before the block was generalised.
        let wte = Embedding::new(c.vocab_size, c.n_embd, 0.02, rng)?;
        let wpe = match c.arch.rope {
            None => Some(Embedding::new(c.block_size, c.n_embd, 0.01, rng)?),
            Some(_) => None,
        };
        let lm_head = if c.arch.tie_head {
            None
        } else {
            Some(Linear::from_weights(
                sinter_nn::init::normal(&[c.vocab_size, c.n_embd], 0.02, rng)?,
                None,
            ))
        };
        Ok(Decoder {
            wte,
            wpe,
            blocks,
            ln_f: Norm::new(c.arch.norm, c.n_embd, c.arch.norm_eps)?,
            lm_head,
            drop: Dropout::new(c.dropout, drop_rng.clone()),
            drop_rng: drop_rng.clone(),
            recompute: Recompute::None,
            fast_path: true,
            scratch: Mutex::default(),
            config,
        })
    }

    /// The model from named weights (`DecoderConfig::param_specs`' names; `get` checks them),
    /// drawing nothing at random: loading a pretrained model costs its copy, not an
    /// initialisation it would overwrite.
    pub fn from_named(
        config: DecoderConfig,
        get: &mut dyn FnMut(&str) -> Result<Tensor>,
        drop_rng: &SharedRng,
    ) -> Result<Self> {
        config.check()?;
        let c = &config;
        let blocks = (0..c.n_layer)
            .map(|i| {
                TransformerBlock::from_named(
                    &c.layer_config(i),
                    &format!("blocks.{i}"),
                    get,
                    drop_rng,
                )
                .map(Arc::new)
            })
            .collect::<Result<_>>()?;
        let wte = Embedding::from_weights(get("wte.weight")?);
        let wpe = match c.arch.rope {
            None => Some(Embedding::from_weights(get("wpe.weight")?)),
            Some(_) => None,
        };
        let bias = match c.arch.norm {
            NormKind::LayerNorm => Some(get("ln_f.bias")?),
            NormKind::RmsNorm => None,
        };
        let ln_f = Norm::from_weights(c.arch.norm, get("ln_f.weight")?, bias, c.arch.norm_eps)?;
        let lm_head = match c.arch.tie_head {
            true => None,
            false => Some(Linear::from_weights(get("lm_head.weight")?, None)),
        };
        Ok(Decoder {
            wte,
            wpe,
            blocks,
            ln_f,
            lm_head,
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

    /// Token embeddings of ids [b, s] at positions start..start + s, plus the learned
    /// position table's rows where the model has one (rotary models rotate inside the
    /// attention instead).
    fn embed(&self, ids: &Tensor, start: usize) -> Result<Tensor> {
        let x = self.wte.forward(ids)?;
        let Some(wpe) = &self.wpe else {
            return Ok(x);
        };
        // Positions are made where the model lives (no upload inside a step).
        let s = ids.shape()[1];
        let pos = Tensor::arange(
            start as f64,
            (start + s) as f64,
            1.0,
            DType::I64,
            wpe.weight.device(),
        )?;
        x.add(&wpe.forward(&pos)?)
    }

    /// The embeddings and every block: ids [b, t] (i64) → hidden states [b, t, c] (before
    /// the final norm and the head).
    fn trunk(&self, ids: &Tensor) -> Result<Tensor> {
        self.check_ids(ids)?;
        let t = ids.shape()[1];
        if t > self.config.block_size {
            bail!(
                "gpt: sequence of {t} tokens is longer than the context of {}",
                self.config.block_size
            );
        }
        let mut x = self.drop.forward(&self.embed(ids, 0)?)?;
        for b in &self.blocks {
            x = if self.fast_path {
                block_forward(b, &x, self.recompute, Some(&self.drop_rng))?
            } else {
                b.forward_composite(&x)?
            };
        }
        Ok(x)
    }

    /// The head's weight [vocab, c] when training may run the fused classifier on it: on a
    /// CUDA device, on the fast path, unquantized (an int8 head keeps its own `linear`), and
    /// unless `SINTER_CLASSIFIER=composite` asks for the unfused head and cross-entropy.
    fn fused_head_weight(&self, device: sinter_core::Device) -> Option<&Tensor> {
        if std::env::var("SINTER_CLASSIFIER").as_deref() == Ok("composite") {
            return None;
        }
        let (w, slot) = match &self.lm_head {
            Some(h) if h.bias.is_none() => (&h.weight, &h.quant),
            Some(_) => return None,
            None => (&self.wte.weight, &self.wte.quant),
        };
        let plain = matches!(slot.state(), sinter_nn::quant::QuantState::F32);
        (device.is_cuda() && self.fast_path && plain).then_some(w)
    }

    /// Training's loss through the fused classifier (`sinter_core::kernels::classifier`): the
    /// head over the vocabulary padded to a multiple of 128 (zero rows appended to its weight
    /// in the compute dtype, so cuBLASLt's aligned kernels run without padding copies), then
    /// loss and dlogits in one pass over the logits, whose memory holds the gradient after.
    fn fused_loss(&self, ids: &Tensor, targets: &Tensor, w: &Tensor) -> Result<BatchLoss> {
        let x = self.trunk(ids)?;
        let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let h = self.ln_f.forward(&x.reshape(&[b * t, c])?)?;
        let w = match sinter_core::amp::autocast_dtype() {
            Some(d) if d != w.dtype() => w.to_dtype(d)?,
            _ => w.clone(),
        };
        let v = self.config.vocab_size;
        let vp = padded_vocab(v);
        let w = if vp > v {
            let pad = Tensor::zeros(&[vp - v, c], w.dtype(), w.device())?;
            Tensor::cat(&[w, pad], 0)?
        } else {
            w
        };
        let logits = sinter_core::fused::linear(&h, &w, None)?;
        let targets = targets.reshape(&[b * t])?.to_device(logits.device())?;
        let out = fused_classifier(&logits, &targets, v, IGNORE_INDEX)?;
        Ok(BatchLoss {
            loss: out.loss,
            logits: None,
        })
    }

    /// Final norm and the head: [b, t, c] → [b, t, vocab].
    fn head(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        // One [b·t, c] × [c, vocab] product: the tied head's gradient is then a single GEMM.
        self.head_rows(&x.reshape(&[b * t, c])?)?
            .reshape(&[b, t, self.config.vocab_size])
    }

    /// The head over rows of hidden states: [n, c] → [n, vocab].
    pub(crate) fn head_rows(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.ln_f.forward(x)?;
        match &self.lm_head {
            Some(head) => head.forward(&h),
            // Through the table's `linear`, so an int8-quantized table serves the head too.
            None => self.wte.linear(&h),
        }
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
                    c.n_kv_head(),
                    capacity,
                    c.head_dim(),
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
        let mut x = self.embed(ids, start)?;
        for (b, layer) in self.blocks.iter().zip(cache.layers.iter_mut()) {
            x = b.forward_step(&x, layer)?;
        }
        Ok(x)
    }
}

impl Module for Decoder {
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
    /// ids [b, t] (i64) → logits [b, t, vocab].
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.head(&self.trunk(ids)?)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.wte.collect(&join(prefix, "wte"), out);
        if let Some(wpe) = &self.wpe {
            wpe.collect(&join(prefix, "wpe"), out);
        }
        for (i, b) in self.blocks.iter().enumerate() {
            b.collect(&join(prefix, &format!("blocks.{i}")), out);
        }
        self.ln_f.collect(&join(prefix, "ln_f"), out);
        if let Some(head) = &self.lm_head {
            head.collect(&join(prefix, "lm_head"), out);
        }
    }
    fn set_training(&self, t: bool) {
        self.drop.set_training(t);
        self.blocks.iter().for_each(|b| b.set_training(t));
    }
}

impl Model for Decoder {
    fn task(&self) -> Task {
        Task::LanguageModel
    }
    fn loss(&self, inputs: &Tensor, targets: &Tensor) -> Result<BatchLoss> {
        match self.fused_head_weight(inputs.device()) {
            Some(w) => self.fused_loss(inputs, targets, w),
            None => sequence_loss(&self.forward(inputs)?, targets),
        }
    }
}
