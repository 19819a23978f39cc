//! BERT with its masked-language-model head (Hugging Face's `BertForMaskedLM`): word +
//! position + token-type embeddings → LayerNorm → post-norm encoder layers (bidirectional
//! attention with an optional padding mask, exact-GELU feed-forward) → MLM head (dense, GELU,
//! LayerNorm, a decoder tied to the word embeddings, and a bias).
//!
//! Tensors outside the encoder are named like Hugging Face's
//! (`bert.embeddings.word_embeddings.weight`, `cls.predictions.bias`, …); an encoder layer's
//! are the block's (`bert.encoder.layer.0.attn.qkv.weight`: query, key and value packed),
//! which [`crate::hf_bert`] maps to and from Hugging Face's names. The tied decoder weight is
//! not listed separately (it *is* `bert.embeddings.word_embeddings.weight`). Linear weights
//! are `[out, in]` as in PyTorch.
//!
//! The feed-forward layer and the head use `config.hidden_act`: the exact (erf) GELU of the
//! published BERT models unless a Hugging Face `config.json` says otherwise (see
//! [`crate::hf_bert`], which also loads and saves weights and configs).
//!
//! The trainer builds `bert-tiny` and `bert-base` for `Task::MaskedLm` on token data: it
//! masks each batch on the host with [`MlmMasking::for_vocab`] (the mask token is the id one
//! past the data's vocabulary) and scores the masked positions. [`Bert::mlm_loss`] does the
//! same for callers that hold labels, running the head on the masked rows only.

use crate::model::{BatchLoss, Model};
use crate::Task;
use sinter_core::{bail, DType, Device, Result, Rng, Tensor};
use sinter_nn::init;
use sinter_nn::module::{join, NamedTensor, TensorKind};
use sinter_nn::transformer::{BlockConfig, MlpKind, TransformerBlock};
use sinter_nn::{Dropout, Embedding, LayerNorm, Linear, Module, SharedRng};

pub use crate::model::IGNORE_INDEX;

/// Special-token ids of the `bert-base-uncased` WordPiece vocabulary.
pub mod special {
    pub const PAD: i64 = 0;
    pub const UNK: i64 = 100;
    pub const CLS: i64 = 101;
    pub const SEP: i64 = 102;
    pub const MASK: i64 = 103;
}

/// The activation of BERT's feed-forward layers and MLM head (Hugging Face's `hidden_act`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HiddenAct {
    /// `"gelu"`: the exact GELU, x·Φ(x) with erf (the published BERT models').
    Gelu,
    /// `"gelu_new"`, `"gelu_pytorch_tanh"`, `"gelu_fast"`: GELU's tanh approximation.
    GeluTanh,
    /// `"relu"`.
    Relu,
    /// `"silu"` / `"swish"`.
    Silu,
}

impl HiddenAct {
    /// The activation a Hugging Face `hidden_act` names, if sinter has it.
    pub fn from_hf(name: &str) -> Option<HiddenAct> {
        Some(match name {
            "gelu" => HiddenAct::Gelu,
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => HiddenAct::GeluTanh,
            "relu" => HiddenAct::Relu,
            "silu" | "swish" => HiddenAct::Silu,
            _ => return None,
        })
    }
    /// The name Hugging Face writes for it.
    pub fn hf_name(self) -> &'static str {
        match self {
            HiddenAct::Gelu => "gelu",
            HiddenAct::GeluTanh => "gelu_pytorch_tanh",
            HiddenAct::Relu => "relu",
            HiddenAct::Silu => "silu",
        }
    }
    /// The encoder MLP with this activation.
    pub fn mlp_kind(self) -> MlpKind {
        match self {
            HiddenAct::Gelu => MlpKind::GeluErf,
            HiddenAct::GeluTanh => MlpKind::Gelu,
            HiddenAct::Relu => MlpKind::Relu,
            HiddenAct::Silu => MlpKind::Silu,
        }
    }
    pub fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            HiddenAct::Gelu => x.gelu_erf(),
            HiddenAct::GeluTanh => x.gelu(),
            HiddenAct::Relu => x.relu(),
            HiddenAct::Silu => x.silu(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden: usize,
    pub n_layer: usize,
    pub n_head: usize,
    /// Width of the feed-forward layer (4 × hidden in the published models).
    pub intermediate: usize,
    pub max_position: usize,
    pub type_vocab_size: usize,
    /// Dropout after the embeddings and on each sub-layer's output (BERT: 0.1).
    pub dropout: f32,
    /// Dropout on the attention probabilities (BERT: 0.1).
    pub attention_dropout: f32,
    pub layer_norm_eps: f32,
    /// The feed-forward and head activation (BERT: exact GELU).
    pub hidden_act: HiddenAct,
    /// The padding token, whose embedding row receives no gradient (PyTorch's `padding_idx`,
    /// as Hugging Face's BERT sets it from `pad_token_id`). `None` for the presets: the trainer
    /// feeds unpadded token streams, where id 0 is an ordinary token.
    pub pad_token_id: Option<usize>,
}

impl BertConfig {
    /// `bert-tiny` (2 layers, 2 heads, 128 wide: trainable on a CPU) or `bert-base`
    /// (12 layers, 12 heads, 768 wide, 3072 FFN: 109,514,298 parameters with the MLM head).
    pub fn preset(name: &str) -> Option<BertConfig> {
        let base = BertConfig {
            vocab_size: 30522,
            hidden: 768,
            n_layer: 12,
            n_head: 12,
            intermediate: 3072,
            max_position: 512,
            type_vocab_size: 2,
            dropout: 0.1,
            attention_dropout: 0.1,
            layer_norm_eps: 1e-12,
            hidden_act: HiddenAct::Gelu,
            pad_token_id: None,
        };
        match name {
            "bert-tiny" => Some(BertConfig {
                hidden: 128,
                n_layer: 2,
                n_head: 2,
                intermediate: 512,
                ..base
            }),
            "bert-base" => Some(base),
            _ => None,
        }
    }

    /// The encoder layer as a configuration of the one Transformer block: bidirectional,
    /// post-norm LayerNorm, biases everywhere, learned positions added outside.
    pub fn block_config(&self) -> BlockConfig {
        BlockConfig {
            mlp_hidden: self.intermediate,
            mlp: self.hidden_act.mlp_kind(),
            norm_eps: self.layer_norm_eps,
            causal: false,
            post_norm: true,
            attention_dropout: self.attention_dropout,
            ..BlockConfig::gpt2(self.hidden, self.n_head, self.n_layer, self.dropout)
        }
    }

    /// Parameters of `BertForMaskedLM` with this config (decoder tied, so counted once).
    pub fn num_parameters(&self) -> usize {
        let (h, f, v) = (self.hidden, self.intermediate, self.vocab_size);
        let embeddings = (v + self.max_position + self.type_vocab_size) * h + 2 * h;
        let layer = 4 * (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h;
        let head = (h * h + h) + 2 * h + v;
        embeddings + self.n_layer * layer + head
    }
}

/// BERT's initialisation: weights N(0, 0.02²), biases zero.
fn linear(inp: usize, out: usize, rng: &mut Rng) -> Result<Linear> {
    Ok(Linear::from_weights(
        init::normal(&[out, inp], 0.02, rng)?,
        Some(init::zeros(&[out])?),
    ))
}

fn layer_norm(n: usize, eps: f32) -> Result<LayerNorm> {
    let mut ln = LayerNorm::new(n)?;
    ln.eps = eps;
    Ok(ln)
}

fn param(prefix: &str, name: &str, t: &Tensor, out: &mut Vec<NamedTensor>) {
    out.push(NamedTensor {
        name: join(prefix, name),
        tensor: t.clone(),
        kind: TensorKind::Parameter,
        layer: None,
    });
}

pub struct BertEmbeddings {
    pub word_embeddings: Embedding,
    pub position_embeddings: Embedding,
    pub token_type_embeddings: Embedding,
    pub layer_norm: LayerNorm,
    pub dropout: Dropout,
}

impl BertEmbeddings {
    /// ids [b, t] (i64), token types [b, t] (i64, default all 0) → [b, t, hidden].
    pub fn forward(&self, ids: &Tensor, token_types: Option<&Tensor>) -> Result<Tensor> {
        let t = ids.shape()[1];
        let pos = Tensor::arange(
            0.0,
            t as f64,
            1.0,
            DType::I64,
            self.position_embeddings.weight.device(),
        )?;
        let mut x = self
            .word_embeddings
            .forward(ids)?
            .add(&self.position_embeddings.forward(&pos)?)?;
        x = match token_types {
            Some(tt) => x.add(&self.token_type_embeddings.forward(tt)?)?,
            // All type 0: add row 0 (broadcast), no lookup.
            None => x.add(&self.token_type_embeddings.weight.narrow(0, 0, 1)?)?,
        };
        self.dropout.forward(&self.layer_norm.forward(&x)?)
    }
}

impl Module for BertEmbeddings {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        BertEmbeddings::forward(self, ids, None)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.word_embeddings
            .collect(&join(prefix, "word_embeddings"), out);
        self.position_embeddings
            .collect(&join(prefix, "position_embeddings"), out);
        self.token_type_embeddings
            .collect(&join(prefix, "token_type_embeddings"), out);
        self.layer_norm.collect(&join(prefix, "LayerNorm"), out);
    }
    fn set_training(&self, training: bool) {
        self.dropout.set_training(training);
    }
}

/// One encoder layer's weights drawn as BERT initialises them (N(0, 0.02²) weights, zero
/// biases, unit norms), in its order (query, key, value, attention output, intermediate,
/// output), named as the block's `from_named` reads them (q, k and v packed in `attn.qkv`).
fn init_layer(c: &BertConfig, rng: &mut Rng) -> Result<Vec<(String, Tensor)>> {
    let (h, f) = (c.hidden, c.intermediate);
    let mut lin = |inp: usize, out: usize| -> Result<(Tensor, Tensor)> {
        Ok((init::normal(&[out, inp], 0.02, rng)?, init::zeros(&[out])?))
    };
    // Query, key and value drawn as one [3h, h] leaf, rows in that order (a concatenation of
    // three leaves would not be a parameter: its gradient would go to the leaves).
    let qkv = lin(h, 3 * h)?;
    let (out, inter, output) = (lin(h, h)?, lin(h, f)?, lin(f, h)?);
    let named = vec![
        ("attn.qkv.weight", qkv.0),
        ("attn.qkv.bias", qkv.1),
        ("attn.proj.weight", out.0),
        ("attn.proj.bias", out.1),
        ("mlp.fc.weight", inter.0),
        ("mlp.fc.bias", inter.1),
        ("mlp.proj.weight", output.0),
        ("mlp.proj.bias", output.1),
        ("ln1.weight", init::ones(&[h])?),
        ("ln1.bias", init::zeros(&[h])?),
        ("ln2.weight", init::ones(&[h])?),
        ("ln2.bias", init::zeros(&[h])?),
    ];
    Ok(named.into_iter().map(|(n, t)| (n.to_string(), t)).collect())
}

/// BERT's masked-language-model head (`cls.predictions`).
pub struct MlmHead {
    /// `cls.predictions.transform.dense`.
    pub dense: Linear,
    /// `cls.predictions.transform.LayerNorm`.
    pub norm: LayerNorm,
    /// `cls.predictions.bias` (the decoder's bias; its weight is the word embedding).
    pub bias: Tensor,
}

/// `BertForMaskedLM` (the encoder and the MLM head), or `BertModel` (the encoder alone, as
/// sentence-embedding models such as all-MiniLM-L6-v2 ship it: `head` is `None`).
pub struct Bert {
    pub config: BertConfig,
    pub embeddings: BertEmbeddings,
    /// The encoder: the one Transformer block, bidirectional and post-norm.
    pub layers: Vec<TransformerBlock>,
    /// The MLM head; `None` for an encoder-only model, which encodes and embeds but cannot
    /// predict tokens.
    pub head: Option<MlmHead>,
}

impl Bert {
    /// `BertForMaskedLM` with random weights.
    pub fn new(config: BertConfig, rng: &mut Rng, drop_rng: &SharedRng) -> Result<Self> {
        let mut m = Bert::encoder_only(config, rng, drop_rng)?;
        let c = &m.config;
        m.head = Some(MlmHead {
            dense: linear(c.hidden, c.hidden, rng)?,
            norm: layer_norm(c.hidden, c.layer_norm_eps)?,
            bias: init::zeros(&[c.vocab_size])?,
        });
        Ok(m)
    }

    /// `BertModel` (no MLM head) with random weights.
    pub fn encoder_only(config: BertConfig, rng: &mut Rng, drop_rng: &SharedRng) -> Result<Self> {
        let c = &config;
        if c.n_head == 0 || !c.hidden.is_multiple_of(c.n_head) {
            bail!(
                "bert: hidden width {} does not split into {} heads",
                c.hidden,
                c.n_head
            );
        }
        if c.type_vocab_size == 0 || c.max_position == 0 || c.vocab_size == 0 {
            bail!("bert: vocabulary, positions and token types must all be at least 1 (got {c:?})");
        }
        let mut word_embeddings = Embedding::new(c.vocab_size, c.hidden, 0.02, rng)?;
        if let Some(pad) = c.pad_token_id {
            if pad >= c.vocab_size {
                bail!(
                    "bert: pad_token_id {pad} is not a token below the vocabulary size {}",
                    c.vocab_size
                );
            }
            word_embeddings = word_embeddings.with_padding_idx(pad as i64)?;
        }
        let embeddings = BertEmbeddings {
            word_embeddings,
            position_embeddings: Embedding::new(c.max_position, c.hidden, 0.02, rng)?,
            token_type_embeddings: Embedding::new(c.type_vocab_size, c.hidden, 0.02, rng)?,
            layer_norm: layer_norm(c.hidden, c.layer_norm_eps)?,
            dropout: Dropout::new(c.dropout, drop_rng.clone()),
        };
        let block = c.block_config();
        let layers = (0..c.n_layer)
            .map(|_| {
                let mut weights: std::collections::HashMap<String, Tensor> =
                    init_layer(c, rng)?.into_iter().collect();
                TransformerBlock::from_named(
                    &block,
                    "",
                    &mut |name| {
                        weights
                            .remove(name)
                            .ok_or_else(|| sinter_core::Error::Msg(format!("bert: no {name}")))
                    },
                    drop_rng,
                )
            })
            .collect::<Result<_>>()?;
        Ok(Bert {
            embeddings,
            layers,
            head: None,
            config,
        })
    }

    fn check_inputs(
        &self,
        ids: &Tensor,
        token_types: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
    ) -> Result<()> {
        if ids.rank() != 2 || ids.dtype() != DType::I64 {
            bail!(
                "bert: expected i64 token ids [batch, time], got {:?} {}",
                ids.shape(),
                ids.dtype()
            );
        }
        let t = ids.shape()[1];
        if t > self.config.max_position {
            bail!(
                "bert: sequence of {t} tokens is longer than the {} positions",
                self.config.max_position
            );
        }
        if let Some(tt) = token_types {
            if tt.shape() != ids.shape() || tt.dtype() != DType::I64 {
                bail!(
                    "bert: token types must be i64 {:?} like the ids, got {:?} {}",
                    ids.shape(),
                    tt.shape(),
                    tt.dtype()
                );
            }
        }
        if let Some(m) = attention_mask {
            if m.shape() != ids.shape() {
                bail!(
                    "bert: the attention mask must have the ids' shape {:?}, got {:?}",
                    ids.shape(),
                    m.shape()
                );
            }
        }
        Ok(())
    }

    /// The last hidden states [b, t, hidden]. `token_types` [b, t] (i64) defaults to all 0;
    /// `attention_mask` [b, t] (any dtype) is 1 at real tokens and 0 at padding, which no
    /// position attends to (Hugging Face's convention).
    pub fn encode(
        &self,
        ids: &Tensor,
        token_types: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.check_inputs(ids, token_types, attention_mask)?;
        let pad = match attention_mask {
            // True at padding: built where the mask lives (no host round trip), any dtype.
            Some(m) => {
                let (b, t) = (ids.shape()[0], ids.shape()[1]);
                let m = m.to_device(ids.device())?;
                Some(m.logical_not()?.reshape(&[b, 1, 1, t])?)
            }
            None => None,
        };
        let mut x = self.embeddings.forward(ids, token_types)?;
        for l in &self.layers {
            x = match &pad {
                Some(pad) => l.forward_masked(&x, Some(pad))?,
                None => l.forward(&x)?,
            };
        }
        Ok(x)
    }

    /// Sentence embeddings [b, hidden]: the last hidden states averaged over each row's real
    /// tokens (`attention_mask` [b, t], 1 at real tokens and 0 at padding; all real without
    /// it), then scaled to unit length when `normalize` — sentence-transformers' Pooling
    /// (`pooling_mode_mean_tokens`) and Normalize modules.
    pub fn embed(
        &self,
        ids: &Tensor,
        attention_mask: Option<&Tensor>,
        normalize: bool,
    ) -> Result<Tensor> {
        let hidden = self.encode(ids, None, attention_mask)?;
        let (b, t) = (ids.shape()[0], ids.shape()[1]);
        let weights = match attention_mask {
            Some(m) => m.to_device(hidden.device())?.to_dtype(hidden.dtype())?,
            None => Tensor::ones(&[b, t], hidden.dtype(), hidden.device())?,
        };
        let counts = weights.sum(&[1], true)?;
        if counts.to_vec_f32()?.iter().any(|&c| c <= 0.0) {
            bail!("bert: a row of the attention mask has no real token; nothing to average");
        }
        let summed = hidden
            .mul(&weights.reshape(&[b, t, 1])?)?
            .sum(&[1], false)?;
        let mean = summed.div(&counts)?;
        if !normalize {
            return Ok(mean);
        }
        // F.normalize's floor of 1e-12 on the norm: a zero vector stays zero.
        let floor = Tensor::full(1e-12, &[1], mean.dtype(), mean.device())?;
        let norm = mean.sqr()?.sum(&[1], true)?.sqrt()?.maximum(&floor)?;
        mean.div(&norm)
    }

    /// MLM logits [.., vocab] of hidden states [.., hidden].
    pub fn mlm_logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let Some(head) = &self.head else {
            bail!("bert: this model was loaded without its masked-LM head (a BertModel, e.g. a sentence-embedding encoder): it encodes and embeds, but cannot predict tokens; load a BertForMaskedLM checkpoint to predict or train with masked LM");
        };
        let h = head
            .norm
            .forward(&self.config.hidden_act.apply(&head.dense.forward(hidden)?)?)?;
        let c = self.config.hidden;
        let lead = &h.shape()[..h.rank() - 1];
        let rows: usize = lead.iter().product();
        let logits = self
            .embeddings
            .word_embeddings
            .linear(&h.reshape(&[rows, c])?)?
            .add(&head.bias)?;
        let mut shape = lead.to_vec();
        shape.push(self.config.vocab_size);
        logits.reshape(&shape)
    }

    /// Logits [b, t, vocab] at every position.
    pub fn forward_with(
        &self,
        ids: &Tensor,
        token_types: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.mlm_logits(&self.encode(ids, token_types, attention_mask)?)
    }

    /// Mean cross-entropy over the masked positions only: `labels` [b, t] (i64) hold the
    /// original token where the input was masked and [`IGNORE_INDEX`] elsewhere. The head
    /// runs only on the masked positions (the same value as `cross_entropy` of all logits
    /// with `ignore_index = -100`, for about 15% of the head's cost). With no masked
    /// position the loss is 0 (and so are the gradients, of every parameter).
    pub fn mlm_loss(
        &self,
        ids: &Tensor,
        labels: &Tensor,
        token_types: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        if labels.shape() != ids.shape() || labels.dtype() != DType::I64 {
            bail!(
                "bert: labels must be i64 {:?} like the ids, got {:?} {}",
                ids.shape(),
                labels.shape(),
                labels.dtype()
            );
        }
        let hidden = self.encode(ids, token_types, attention_mask)?;
        let lv = labels.to_vec_i64()?;
        let (rows, targets): (Vec<i64>, Vec<i64>) = lv
            .iter()
            .enumerate()
            .filter(|(_, &l)| l != IGNORE_INDEX)
            .map(|(i, &l)| (i as i64, l))
            .unzip();
        if rows.is_empty() {
            // Zero, but through the head too, so every parameter gets a (zero) gradient and
            // data-parallel ranks see the same set of gradients.
            let c = self.config.hidden;
            let first = hidden.reshape(&[ids.numel(), c])?.narrow(0, 0, 1)?;
            return self.mlm_logits(&first)?.sum_all()?.mul_scalar(0.0);
        }
        if let Some(&bad) = targets
            .iter()
            .find(|&&l| l < 0 || l as usize >= self.config.vocab_size)
        {
            bail!("bert: label {bad} is neither {IGNORE_INDEX} nor a token below the vocabulary size {}", self.config.vocab_size);
        }
        let n = rows.len();
        let c = self.config.hidden;
        let picked = hidden.reshape(&[ids.numel(), c])?.index_select(
            0,
            &Tensor::from_vec(rows, &[n], Device::Cpu)?.to_device(hidden.device())?,
        )?;
        let targets = Tensor::from_vec(targets, &[n], Device::Cpu)?.to_device(hidden.device())?;
        self.mlm_logits(&picked)?
            .cross_entropy(&targets, IGNORE_INDEX)
    }
}

impl Module for Bert {
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
    /// ids [b, t] (i64) → MLM logits [b, t, vocab], token type 0, no padding.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.forward_with(ids, None, None)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.embeddings
            .collect(&join(prefix, "bert.embeddings"), out);
        for (i, l) in self.layers.iter().enumerate() {
            l.collect(&join(prefix, &format!("bert.encoder.layer.{i}")), out);
        }
        if let Some(head) = &self.head {
            head.dense
                .collect(&join(prefix, "cls.predictions.transform.dense"), out);
            head.norm
                .collect(&join(prefix, "cls.predictions.transform.LayerNorm"), out);
            param(prefix, "cls.predictions.bias", &head.bias, out);
        }
    }
    fn set_training(&self, training: bool) {
        self.embeddings.set_training(training);
        self.layers.iter().for_each(|l| l.set_training(training));
    }
}

/// How [`mask_tokens`] corrupts its input (BERT's recipe by default).
#[derive(Clone, Debug, PartialEq)]
pub struct MlmMasking {
    /// Probability that a (non-special) token is selected for prediction: 0.15.
    pub mask_prob: f64,
    /// Of the selected tokens, the share replaced by `mask_token` (0.8); of the rest, half
    /// become a random token and half stay as they are.
    pub replace_prob: f64,
    pub mask_token: i64,
    /// Random replacements are drawn uniformly from `0..vocab_size`.
    pub vocab_size: usize,
    /// Never selected ([CLS], [SEP], [PAD]).
    pub special_tokens: Vec<i64>,
}

impl MlmMasking {
    /// BERT's recipe for the `bert-base-uncased` vocabulary ([MASK] = 103; [PAD], [CLS] and
    /// [SEP] are never masked).
    pub fn bert(vocab_size: usize) -> Self {
        MlmMasking {
            mask_prob: 0.15,
            replace_prob: 0.8,
            mask_token: special::MASK,
            vocab_size,
            special_tokens: vec![special::PAD, special::CLS, special::SEP],
        }
    }
}

impl MlmMasking {
    /// BERT's 15% / 80-10-10 recipe for token data with `data_vocab` ids and no special
    /// tokens (character or GPT-2 token files): the mask token is `data_vocab` itself, so
    /// the model's vocabulary is `data_vocab + 1`, and random replacements are data tokens.
    pub fn for_vocab(data_vocab: usize) -> Self {
        MlmMasking {
            mask_prob: 0.15,
            replace_prob: 0.8,
            mask_token: data_vocab as i64,
            vocab_size: data_vocab,
            special_tokens: Vec::new(),
        }
    }
}

/// BERT's masking: each non-special token is selected with probability `mask_prob`; a
/// selected token becomes `mask_token` with probability 0.8, a uniformly random token with
/// 0.1, and stays with 0.1. Returns (inputs, labels): labels hold the original token at
/// selected positions and [`IGNORE_INDEX`] elsewhere. Deterministic given `rng`.
pub fn mask_tokens(ids: &[i64], m: &MlmMasking, rng: &mut Rng) -> (Vec<i64>, Vec<i64>) {
    let mut inputs = ids.to_vec();
    let mut labels = vec![IGNORE_INDEX; ids.len()];
    for (i, &id) in ids.iter().enumerate() {
        if m.special_tokens.contains(&id) || rng.next_f64() >= m.mask_prob {
            continue;
        }
        labels[i] = id;
        let r = rng.next_f64();
        if r < m.replace_prob {
            inputs[i] = m.mask_token;
        } else if r < m.replace_prob + (1.0 - m.replace_prob) / 2.0 {
            inputs[i] = rng.below(m.vocab_size as u64) as i64;
        }
    }
    (inputs, labels)
}

/// [`mask_tokens`] on an i64 tensor of any shape: (inputs, labels) of the same shape.
pub fn mask_batch(ids: &Tensor, m: &MlmMasking, rng: &mut Rng) -> Result<(Tensor, Tensor)> {
    if ids.dtype() != DType::I64 {
        bail!("mask_batch: expected i64 token ids, got {}", ids.dtype());
    }
    let (inputs, labels) = mask_tokens(&ids.to_vec_i64()?, m, rng);
    Ok((
        Tensor::from_vec(inputs, ids.shape(), Device::Cpu)?,
        Tensor::from_vec(labels, ids.shape(), Device::Cpu)?,
    ))
}

// ---- Hugging Face weights --------------------------------------------------------------------

impl Model for Bert {
    fn task(&self) -> Task {
        Task::MaskedLm
    }
    /// Masks the token batch with BERT's recipe (the mask token is the id after the data's
    /// vocabulary); the targets become the original tokens at the selected positions and
    /// [`IGNORE_INDEX`] elsewhere.
    fn prepare_batch(
        &self,
        inputs: Tensor,
        _targets: Tensor,
        seed: u64,
    ) -> Result<(Tensor, Tensor)> {
        if inputs.dtype() != DType::I64 {
            bail!(
                "masked-LM training needs token ids, but the data gives {}",
                inputs.dtype()
            );
        }
        let masking = MlmMasking::for_vocab(self.config.vocab_size - 1);
        let (x, y) = mask_tokens(&inputs.to_vec_i64()?, &masking, &mut Rng::new(seed));
        let shape = inputs.shape().to_vec();
        Ok((
            Tensor::from_vec(x, &shape, Device::Cpu)?,
            Tensor::from_vec(y, &shape, Device::Cpu)?,
        ))
    }
    /// The labels stay on the host: the loss picks the masked rows from them without reading
    /// the device.
    fn place_batch(&self, batch: &(Tensor, Tensor), device: Device) -> Result<(Tensor, Tensor)> {
        Ok((batch.0.to_device(device)?, batch.1.clone()))
    }
    fn loss(&self, inputs: &Tensor, targets: &Tensor) -> Result<BatchLoss> {
        Ok(BatchLoss {
            loss: self.mlm_loss(inputs, targets, None, None)?,
            logits: None,
        })
    }
}
