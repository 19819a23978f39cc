//! The Transformer block, configured rather than copied: one definition serves the decoders —
//! GPT-2 (LayerNorm, GELU, learned positions added outside, biases everywhere) and the Llama
//! family (RMSNorm, SwiGLU or GeGLU, rotary positions, grouped-query attention, Qwen2's qkv
//! bias, Qwen3's QK-norm, Mistral's sliding window) — and the encoders (BERT: bidirectional
//! attention with a padding mask, post-norm, exact GELU). Every executor runs this block:
//! training (fast path, composite reference, recompute), generation against a KV cache,
//! pipeline stages and tensor-parallel shards (`from_named`).
//!
//! Pre-norm (decoders): x + attn(norm1(x)), then + mlp(norm2(x)).
//! Post-norm (BERT): norm1(x + attn(x)), then norm2(x + mlp(x)).

mod attention;
mod config;
mod fused;
mod mlp;
mod norm;
mod rope;

pub use attention::{CausalSelfAttention, LayerKvCache};
pub use config::{BlockConfig, MlpKind};
pub use mlp::Mlp;
pub use norm::{Norm, NormKind, RmsNorm};
pub use rope::{Rope, RopeConfig, RopeScaling};

use sinter_core::{Result, Rng, Tensor};

use crate::layers::Linear;
use crate::module::{join, Module, NamedTensor, SharedRng};

pub struct TransformerBlock {
    pub ln1: Norm,
    pub attn: CausalSelfAttention,
    pub ln2: Norm,
    pub mlp: Mlp,
    /// ln1 and ln2 follow the residual sums instead of preceding the sub-layers.
    pub post_norm: bool,
}

impl TransformerBlock {
    /// A freshly initialised block (GPT-2's initialisation: N(0, 0.02), residual projections
    /// scaled down with depth, zero biases, unit norms).
    pub fn new(cfg: &BlockConfig, rng: &mut Rng, drop_rng: &SharedRng) -> Result<Self> {
        cfg.check()?;
        Ok(TransformerBlock {
            ln1: Norm::new(cfg.norm, cfg.width, cfg.norm_eps)?,
            attn: CausalSelfAttention::new(cfg, rng, drop_rng)?,
            ln2: Norm::new(cfg.norm, cfg.width, cfg.norm_eps)?,
            mlp: Mlp::new(cfg, rng, drop_rng)?,
            post_norm: cfg.post_norm,
        })
    }

    /// A block from its weights, named as `collect` names them under `prefix` (e.g.
    /// `blocks.3.attn.qkv.weight`); `get` returns each by its full name.
    pub fn from_named(
        cfg: &BlockConfig,
        prefix: &str,
        get: &mut dyn FnMut(&str) -> Result<Tensor>,
        drop_rng: &SharedRng,
    ) -> Result<Self> {
        cfg.check()?;
        let mut t = |name: &str| get(&join(prefix, name));
        let norm = |name: &str, t: &mut dyn FnMut(&str) -> Result<Tensor>| -> Result<Norm> {
            let bias = match cfg.norm {
                NormKind::LayerNorm => Some(t(&format!("{name}.bias"))?),
                NormKind::RmsNorm => None,
            };
            Norm::from_weights(cfg.norm, t(&format!("{name}.weight"))?, bias, cfg.norm_eps)
        };
        let ln1 = norm("ln1", &mut t)?;
        let ln2 = norm("ln2", &mut t)?;
        let mut linear = |name: &str, bias: bool| -> Result<Linear> {
            let b = if bias {
                Some(t(&format!("{name}.bias"))?)
            } else {
                None
            };
            Ok(Linear::from_weights(t(&format!("{name}.weight"))?, b))
        };
        let qkv = linear("attn.qkv", cfg.qkv_bias)?;
        let proj = linear("attn.proj", cfg.out_bias)?;
        let fc = linear("mlp.fc", cfg.mlp_bias)?;
        let fc2 = linear("mlp.proj", cfg.mlp_bias)?;
        let qk = if cfg.qk_norm {
            Some((
                linear("attn.q_norm", false)?.weight,
                linear("attn.k_norm", false)?.weight,
            ))
        } else {
            None
        };
        Ok(TransformerBlock {
            ln1,
            attn: CausalSelfAttention::from_parts(cfg, qkv, proj, qk, drop_rng)?,
            ln2,
            mlp: Mlp {
                fc,
                proj: fc2,
                kind: cfg.mlp,
                dropout: crate::layers::Dropout::new(cfg.dropout, drop_rng.clone()),
            },
            post_norm: cfg.post_norm,
        })
    }

    /// The attention sub-layer's input: norm1(x), or x itself after a post-norm block's
    /// previous sum.
    fn attn_input(&self, x: &Tensor, composite: bool) -> Result<Tensor> {
        if self.post_norm {
            Ok(x.clone())
        } else if composite {
            self.ln1.forward_composite(x)
        } else {
            self.ln1.forward(x)
        }
    }
    /// The rest of the block given its input `x` and the attention sub-layer's output `a`:
    /// the residual sums, norms (one fused pass with each sum for LayerNorm) and MLP.
    pub fn forward_after_attn(&self, x: &Tensor, a: &Tensor) -> Result<Tensor> {
        self.after_attn(&residual_stream(x)?, a, true)
    }
    /// `forward_after_attn`, or with `fused` false the unfused reference of it (separate sums
    /// and norms, the MLP's composite).
    fn after_attn(&self, x: &Tensor, a: &Tensor, fused: bool) -> Result<Tensor> {
        let sum_norm = |norm: &Norm, x: &Tensor, a: &Tensor| -> Result<(Tensor, Tensor)> {
            if fused {
                norm.residual(x, a)
            } else {
                let sum = x.add(a)?;
                let y = norm.forward_composite(&sum)?;
                Ok((sum, y))
            }
        };
        let mlp = |h: &Tensor| {
            if fused {
                self.mlp.forward_fused(h)
            } else {
                self.mlp.forward_composite(h)
            }
        };
        if self.post_norm {
            let (_, x1) = sum_norm(&self.ln1, x, a)?;
            return Ok(sum_norm(&self.ln2, &x1, &mlp(&x1)?)?.1);
        }
        let (x1, h) = sum_norm(&self.ln2, x, a)?;
        x1.add(&mlp(&h)?)
    }
    /// The attention sub-layer's output on the fast path: what [`Self::forward_after_attn`]
    /// takes with `x` (recompute checkpoints this half).
    pub fn forward_attn(&self, x: &Tensor) -> Result<Tensor> {
        self.attn
            .forward(&self.attn_input(&residual_stream(x)?, false)?)
    }
    /// The fast path (also `forward`): flash attention, fused residual + norm, fused MLP.
    pub fn forward_fused(&self, x: &Tensor) -> Result<Tensor> {
        let x = &residual_stream(x)?;
        self.forward_after_attn(x, &self.forward_attn(x)?)
    }
    /// The unfused reference.
    pub fn forward_composite(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_masked(x, None)
    }
    /// The unfused block (every op in tensor ops) with `pad` [b, 1, 1, t] non-zero at keys no
    /// query may see (an encoder's padding).
    pub fn forward_masked(&self, x: &Tensor, pad: Option<&Tensor>) -> Result<Tensor> {
        let x = &residual_stream(x)?;
        let a = self.attn.forward_masked(&self.attn_input(x, true)?, pad)?;
        self.after_attn(x, &a, false)
    }
    /// The block for `x` [b, s, c] at positions cache.len.. of a sequence whose earlier keys
    /// and values are in `cache` (which this appends to). Inference only; decoders only.
    pub fn forward_step(&self, x: &Tensor, cache: &mut LayerKvCache) -> Result<Tensor> {
        let x = &residual_stream(x)?;
        let a = self.attn.forward_step(&self.attn_input(x, false)?, cache)?;
        self.forward_after_attn(x, &a)
    }
}

/// The residual stream as the block carries it: in the autocast dtype inside an autocast
/// region (llm.c's bf16 activations: the sums, norms and sub-layer inputs without an f32 round
/// trip or a cast around every GEMM), else as given. A no-op after the first block.
fn residual_stream(x: &Tensor) -> Result<Tensor> {
    sinter_core::amp::to_autocast_dtype(x)
}

impl Module for TransformerBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_fused(x)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.ln1.collect(&join(prefix, "ln1"), out);
        self.attn.collect(&join(prefix, "attn"), out);
        self.ln2.collect(&join(prefix, "ln2"), out);
        self.mlp.collect(&join(prefix, "mlp"), out);
    }
    fn set_training(&self, training: bool) {
        self.attn.set_training(training);
        self.mlp.set_training(training);
    }
}
