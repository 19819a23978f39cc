//! The block's feed-forward network: GELU (GPT-2, BERT) or SwiGLU (Llama, Mistral, Qwen).

use sinter_core::{Result, Rng, Tensor};

use super::attention::init_linear;
use super::BlockConfig;
use crate::layers::{Dropout, Linear};
use crate::module::{join, Module, NamedTensor, SharedRng};

/// Which feed-forward network a block uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MlpKind {
    /// proj(GELU_tanh(fc(x))), fc [hidden, width].
    #[default]
    Gelu,
    /// proj(SiLU(gate(x)) · up(x)); gate and up are packed in `fc` as [gate; up]
    /// [2·hidden, width] so both come from one GEMM.
    SwiGlu,
}

pub struct Mlp {
    pub fc: Linear,
    pub proj: Linear,
    pub kind: MlpKind,
    pub dropout: Dropout,
}

impl Mlp {
    pub fn new(cfg: &BlockConfig, rng: &mut Rng, drop_rng: &SharedRng) -> Result<Self> {
        let rows = match cfg.mlp {
            MlpKind::Gelu => cfg.mlp_hidden,
            MlpKind::SwiGlu => 2 * cfg.mlp_hidden,
        };
        Ok(Mlp {
            fc: init_linear(cfg.width, rows, 0.02, cfg.mlp_bias, rng)?,
            proj: init_linear(
                cfg.mlp_hidden,
                cfg.width,
                cfg.resid_std(),
                cfg.mlp_bias,
                rng,
            )?,
            kind: cfg.mlp,
            dropout: Dropout::new(cfg.dropout, drop_rng.clone()),
        })
    }

    /// GELU: fc, bias and GELU fused (one GEMM with a GELU epilogue on CUDA at f16/bf16; the
    /// matmul then the fused bias + GELU elsewhere), then the projection.
    pub fn forward_fused(&self, x: &Tensor) -> Result<Tensor> {
        let h = match self.kind {
            MlpKind::Gelu => self.fc.forward_gelu(x)?,
            MlpKind::SwiGlu => swiglu(&self.fc.forward(x)?)?,
        };
        self.dropout.forward(&self.proj.forward(&h)?)
    }
    pub fn forward_composite(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.fc.forward(x)?;
        let h = match self.kind {
            MlpKind::Gelu => h.gelu()?,
            MlpKind::SwiGlu => swiglu(&h)?,
        };
        self.dropout.forward(&self.proj.forward(&h)?)
    }
}

/// [..., 2n] = [gate | up] → SiLU(gate) · up [..., n].
fn swiglu(h: &Tensor) -> Result<Tensor> {
    let n = h.shape().last().copied().unwrap_or(0) / 2;
    let last = h.rank() as isize - 1;
    h.narrow(last, 0, n)?.silu()?.mul(&h.narrow(last, n, n)?)
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_fused(x)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.fc.collect(&join(prefix, "fc"), out);
        self.proj.collect(&join(prefix, "proj"), out);
    }
    fn set_training(&self, training: bool) {
        self.dropout.set_training(training);
    }
}
