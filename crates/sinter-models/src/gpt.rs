//! GPT (GPT-2's architecture): token + position embeddings, pre-norm Transformer blocks,
//! a final LayerNorm, and an output head tied to the token embedding.

use sinter_core::{bail, DType, Device, Result, Rng, Tensor};
use sinter_nn::module::{join, NamedTensor};
use sinter_nn::{Dropout, Embedding, LayerNorm, Module, SharedRng, TransformerBlock};

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
            "gpt-tiny" => Some(GptConfig { n_layer: 4, n_head: 4, n_embd: 128, block_size: 64, vocab_size: 256, dropout: 0.0 }),
            // GPT-2 small: 124M parameters.
            "gpt2" => Some(GptConfig { n_layer: 12, n_head: 12, n_embd: 768, block_size: 1024, vocab_size: 50257, dropout: 0.0 }),
            _ => None,
        }
    }
}

pub struct Gpt {
    pub config: GptConfig,
    pub wte: Embedding,
    pub wpe: Embedding,
    pub blocks: Vec<TransformerBlock>,
    pub ln_f: LayerNorm,
    drop: Dropout,
}

impl Gpt {
    pub fn new(config: GptConfig, rng: &mut Rng, drop_rng: &SharedRng) -> Result<Self> {
        let c = &config;
        let blocks = (0..c.n_layer).map(|_| TransformerBlock::new(c.n_embd, c.n_head, c.n_layer, c.dropout, rng, drop_rng)).collect::<Result<_>>()?;
        Ok(Gpt {
            wte: Embedding::new(c.vocab_size, c.n_embd, 0.02, rng)?,
            wpe: Embedding::new(c.block_size, c.n_embd, 0.01, rng)?,
            blocks,
            ln_f: LayerNorm::new(c.n_embd)?,
            drop: Dropout::new(c.dropout, drop_rng.clone()),
            config,
        })
    }
}

impl Module for Gpt {
    /// ids [b, t] (i64) → logits [b, t, vocab].
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        if ids.rank() != 2 || ids.dtype() != DType::I64 {
            bail!("gpt: expected i64 token ids [batch, time], got {:?} {}", ids.shape(), ids.dtype());
        }
        let t = ids.shape()[1];
        if t > self.config.block_size {
            bail!("gpt: sequence of {t} tokens is longer than the context of {}", self.config.block_size);
        }
        let pos = Tensor::arange(0.0, t as f64, 1.0, DType::I64, Device::Cpu)?;
        let mut x = self.drop.forward(&self.wte.forward(ids)?.add(&self.wpe.forward(&pos)?)?)?;
        for b in &self.blocks {
            x = b.forward(&x)?;
        }
        let x = self.ln_f.forward(&x)?;
        // One [b·t, c] × [c, vocab] product: the tied head's gradient is then a single GEMM.
        let (b, c) = (ids.shape()[0], self.config.n_embd);
        x.reshape(&[b * t, c])?.matmul(&self.wte.weight.t()?)?.reshape(&[b, t, self.config.vocab_size])
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
