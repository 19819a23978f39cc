//! What shapes one block: its sizes, norms, MLP kind, positions and attention options. Plain
//! data that the sub-layers read while they are built; nothing here builds one.

use sinter_core::{bail, Result};

use super::norm::NormKind;
use super::rope::RopeConfig;

/// Everything that shapes one block.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockConfig {
    /// The residual stream's width.
    pub width: usize,
    pub n_head: usize,
    /// Key/value heads: n_head (multi-head), fewer (grouped-query) or 1 (multi-query).
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// The MLP's inner width (per branch for SwiGLU).
    pub mlp_hidden: usize,
    pub mlp: MlpKind,
    pub norm: NormKind,
    pub norm_eps: f32,
    /// Bias on the q, k and v projections (GPT-2, Qwen2).
    pub qkv_bias: bool,
    /// Bias on the attention's output projection (GPT-2).
    pub out_bias: bool,
    /// Biases in the MLP (GPT-2).
    pub mlp_bias: bool,
    /// RMSNorm of each query and key head before the rotation (Qwen3).
    pub qk_norm: bool,
    /// Rotary positions; None when positions are added to the input (GPT-2's table).
    pub rope: Option<RopeConfig>,
    /// Each position attends to earlier ones only (decoders) or to every position (encoders).
    pub causal: bool,
    /// Norm after each residual sum (BERT) instead of before each sub-layer.
    pub post_norm: bool,
    /// Each query sees only the last `w` positions, itself included (Mistral).
    pub sliding_window: Option<usize>,
    /// Dropout on the sub-layers' outputs.
    pub dropout: f32,
    /// Dropout on the attention probabilities (GPT-2: `dropout`; BERT: its own setting).
    pub attention_dropout: f32,
    /// The model's depth: GPT-2 initialises the projections into the residual stream with
    /// std 0.02/√(2·layers).
    pub n_layer: usize,
}

impl BlockConfig {
    /// GPT-2's block: LayerNorm (eps 1e-5), 4× GELU MLP, biases everywhere, no rotation.
    pub fn gpt2(width: usize, n_head: usize, n_layer: usize, dropout: f32) -> Self {
        BlockConfig {
            width,
            n_head,
            n_kv_head: n_head,
            head_dim: width.checked_div(n_head).unwrap_or(0),
            mlp_hidden: 4 * width,
            mlp: MlpKind::Gelu,
            norm: NormKind::LayerNorm,
            norm_eps: 1e-5,
            qkv_bias: true,
            out_bias: true,
            mlp_bias: true,
            qk_norm: false,
            rope: None,
            causal: true,
            post_norm: false,
            sliding_window: None,
            dropout,
            attention_dropout: dropout,
            n_layer,
        }
    }

    pub(crate) fn resid_std(&self) -> f64 {
        0.02 / (2.0 * self.n_layer.max(1) as f64).sqrt()
    }

    /// An error naming the first inconsistency.
    pub fn check(&self) -> Result<()> {
        let (h, kv, d) = (self.n_head, self.n_kv_head, self.head_dim);
        if self.width == 0 || h == 0 || kv == 0 || d == 0 || self.mlp_hidden == 0 {
            bail!("transformer block: width, heads, kv heads, head dim and MLP width must be positive, got {self:?}");
        }
        if h % kv != 0 {
            bail!("transformer block: {h} query heads do not share {kv} key/value heads evenly");
        }
        if self.rope.is_some() && d % 2 != 0 {
            bail!("transformer block: rotary positions need an even head dimension, got {d}");
        }
        for (what, p) in [
            ("dropout", self.dropout),
            ("attention dropout", self.attention_dropout),
        ] {
            if !(0.0..1.0).contains(&p) {
                bail!("transformer block: {what} must be in [0, 1), got {p}");
            }
        }
        if self.sliding_window == Some(0) {
            bail!("transformer block: a sliding window must hold at least one position");
        }
        if self.sliding_window.is_some() && !self.causal {
            bail!("transformer block: a sliding window needs causal attention");
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0) {
            bail!(
                "transformer block: norm eps must be positive, got {}",
                self.norm_eps
            );
        }
        Ok(())
    }
}

/// Which feed-forward network a block uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MlpKind {
    /// proj(GELU_tanh(fc(x))), fc [hidden, width].
    #[default]
    Gelu,
    /// proj(GELU_erf(fc(x))): the exact GELU (BERT's `"gelu"`).
    GeluErf,
    /// proj(ReLU(fc(x))).
    Relu,
    /// proj(SiLU(fc(x))).
    Silu,
    /// proj(SiLU(gate(x)) · up(x)); gate and up are packed in `fc` as [gate; up]
    /// [2·hidden, width] so both come from one GEMM.
    SwiGlu,
    /// proj(GELU_tanh(gate(x)) · up(x)), packed like SwiGLU.
    GeGlu,
}

impl MlpKind {
    /// Whether `fc` holds a gate and an up projection.
    pub fn gated(self) -> bool {
        matches!(self, MlpKind::SwiGlu | MlpKind::GeGlu)
    }
    /// Rows of `fc`'s weight for an inner width of `hidden`.
    pub fn fc_rows(self, hidden: usize) -> usize {
        if self.gated() {
            2 * hidden
        } else {
            hidden
        }
    }
}
