//! The block's feed-forward network: one activation (GPT-2's tanh GELU, BERT's exact GELU,
//! ReLU, SiLU) or a gated pair (SwiGLU: Llama, Mistral, Qwen; GeGLU: Gemma, T5 v1.1).

use sinter_core::{Result, Rng, Tensor};

use super::attention::init_linear;
use super::config::{BlockConfig, MlpKind};
use crate::layers::{Dropout, Linear};
use crate::module::{join, Module, NamedTensor, SharedRng};

/// The activation of an MLP kind, beside the MLP that applies it.
impl MlpKind {
    /// The activation of `fc`'s output h: [.., fc_rows] → [.., hidden] (SwiGLU's fused
    /// kernels where they apply: f32 on the CPU, every float dtype on CUDA).
    pub fn activate(self, h: &Tensor) -> Result<Tensor> {
        match self {
            MlpKind::SwiGlu if super::fused::applies(h) => super::fused::swiglu::swiglu(h),
            kind => kind.activate_composite(h),
        }
    }
    /// [`MlpKind::activate`] in tensor ops (the fused kernel's reference).
    pub fn activate_composite(self, h: &Tensor) -> Result<Tensor> {
        match self {
            MlpKind::Gelu => h.gelu(),
            MlpKind::GeluErf => h.gelu_erf(),
            MlpKind::Relu => h.relu(),
            MlpKind::Silu => h.silu(),
            MlpKind::SwiGlu => {
                let (gate, up) = halves(h)?;
                gate.silu()?.mul(&up)
            }
            MlpKind::GeGlu => {
                let (gate, up) = halves(h)?;
                gate.gelu()?.mul(&up)
            }
        }
    }
}

/// [..., 2n] = [gate | up] → (gate, up).
fn halves(h: &Tensor) -> Result<(Tensor, Tensor)> {
    let n = h.shape().last().copied().unwrap_or(0) / 2;
    let last = h.rank() as isize - 1;
    Ok((h.narrow(last, 0, n)?, h.narrow(last, n, n)?))
}

pub struct Mlp {
    pub fc: Linear,
    pub proj: Linear,
    pub kind: MlpKind,
    pub dropout: Dropout,
}

impl Mlp {
    pub fn new(cfg: &BlockConfig, rng: &mut Rng, drop_rng: &SharedRng) -> Result<Self> {
        Ok(Mlp {
            fc: init_linear(
                cfg.width,
                cfg.mlp.fc_rows(cfg.mlp_hidden),
                0.02,
                cfg.mlp_bias,
                rng,
            )?,
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
    /// matmul then the fused bias + GELU elsewhere), then the projection; with both biases
    /// and plain layers, one op (`fused::mlp_gelu`: its backward folds GELU's gradient and
    /// both bias gradients into the GEMMs' epilogues on CUDA at f16/bf16).
    pub fn forward_fused(&self, x: &Tensor) -> Result<Tensor> {
        let both = (&self.fc.bias, &self.proj.bias);
        if let (MlpKind::Gelu, (Some(bf), Some(bp))) = (self.kind, both) {
            if self.fc.is_plain() && self.proj.is_plain() {
                let y = sinter_core::fused::mlp_gelu(
                    x,
                    (&self.fc.weight, bf),
                    (&self.proj.weight, bp),
                )?;
                return self.dropout.forward(&y);
            }
        }
        let h = match self.kind {
            MlpKind::Gelu => self.fc.forward_gelu(x)?,
            kind => kind.activate(&self.fc.forward(x)?)?,
        };
        self.dropout.forward(&self.proj.forward(&h)?)
    }
    pub fn forward_composite(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.kind.activate_composite(&self.fc.forward(x)?)?;
        self.dropout.forward(&self.proj.forward(&h)?)
    }
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
        self.fc.set_training(training);
        self.proj.set_training(training);
        self.dropout.set_training(training);
    }
}
