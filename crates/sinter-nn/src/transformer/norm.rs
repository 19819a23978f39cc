//! The two normalisations a Transformer block uses: LayerNorm (GPT-2, BERT) and RMSNorm
//! (Llama, Mistral, Qwen), behind one `Norm` so a block is configured, not copied.

use sinter_core::{DType, Result, Tensor};

use crate::init;
use crate::layers::LayerNorm;
use crate::module::{param, Module, NamedTensor};

/// Which normalisation a block uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NormKind {
    #[default]
    LayerNorm,
    RmsNorm,
}

/// y = x / √(mean(x²) + eps) · weight over the last dimension (no mean subtraction, no bias).
///
/// The statistics are taken in f32 whatever the input's dtype and the result cast back, as
/// Hugging Face's `LlamaRMSNorm` does, so a bf16 model normalises like its reference.
pub struct RmsNorm {
    pub weight: Tensor,
    pub eps: f32,
}

impl RmsNorm {
    pub fn new(n: usize, eps: f32) -> Result<Self> {
        Ok(RmsNorm {
            weight: init::ones(&[n])?,
            eps,
        })
    }
}

impl RmsNorm {
    /// The normalisation in tensor ops: the reference of the fused kernel, and the path of
    /// every dtype and device the kernel does not take.
    pub fn forward_composite(&self, x: &Tensor) -> Result<Tensor> {
        let dtype = x.dtype();
        let xf = if dtype == DType::F32 {
            x.clone()
        } else {
            x.to_dtype(DType::F32)?
        };
        let inv_rms = xf
            .sqr()?
            .mean(&[-1], true)?
            .add_scalar(self.eps)?
            .sqrt()?
            .recip()?;
        let w = if self.weight.dtype() == DType::F32 {
            self.weight.clone()
        } else {
            self.weight.to_dtype(DType::F32)?
        };
        let y = xf.mul(&inv_rms)?.mul(&w)?;
        if dtype == DType::F32 {
            Ok(y)
        } else {
            y.to_dtype(dtype)
        }
    }
}

impl RmsNorm {
    /// Whether the fused kernels take `x`: f32 on the CPU with f32 weights; on CUDA f32, f16 or
    /// bf16 with the weights in x's dtype or f32.
    fn fused_applies(&self, x: &Tensor) -> bool {
        super::fused::rms_norm::applies(x, &self.weight)
    }
}

impl Module for RmsNorm {
    /// The fused kernels where they apply (see `fused_applies`), else the composite.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.fused_applies(x) {
            super::fused::rms_norm::rms_norm(x, &self.weight, self.eps)
        } else {
            self.forward_composite(x)
        }
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        param(prefix, "weight", &self.weight, out);
    }
}

/// A block's normalisation layer.
pub enum Norm {
    Layer(LayerNorm),
    Rms(RmsNorm),
}

impl Norm {
    pub fn new(kind: NormKind, n: usize, eps: f32) -> Result<Self> {
        Ok(match kind {
            NormKind::LayerNorm => {
                let mut ln = LayerNorm::new(n)?;
                ln.eps = eps;
                Norm::Layer(ln)
            }
            NormKind::RmsNorm => Norm::Rms(RmsNorm::new(n, eps)?),
        })
    }
    /// A norm from its weights (`bias` only for LayerNorm).
    pub fn from_weights(
        kind: NormKind,
        weight: Tensor,
        bias: Option<Tensor>,
        eps: f32,
    ) -> Result<Self> {
        Ok(match (kind, bias) {
            (NormKind::LayerNorm, Some(bias)) => Norm::Layer(LayerNorm { weight, bias, eps }),
            (NormKind::LayerNorm, None) => sinter_core::bail!("a LayerNorm needs a bias"),
            (NormKind::RmsNorm, _) => Norm::Rms(RmsNorm { weight, eps }),
        })
    }
    pub fn kind(&self) -> NormKind {
        match self {
            Norm::Layer(_) => NormKind::LayerNorm,
            Norm::Rms(_) => NormKind::RmsNorm,
        }
    }
    /// The LayerNorm, when this is one (the fused residual + LayerNorm kernel takes it).
    pub fn as_layer_norm(&self) -> Option<&LayerNorm> {
        match self {
            Norm::Layer(ln) => Some(ln),
            Norm::Rms(_) => None,
        }
    }
    pub fn weight(&self) -> &Tensor {
        match self {
            Norm::Layer(ln) => &ln.weight,
            Norm::Rms(n) => &n.weight,
        }
    }
    pub fn eps(&self) -> f32 {
        match self {
            Norm::Layer(ln) => ln.eps,
            Norm::Rms(n) => n.eps,
        }
    }
    /// The normalisation in tensor ops where it has a fused kernel (RMSNorm), the reference of
    /// the block's composite path.
    pub fn forward_composite(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Norm::Layer(ln) => ln.forward(x),
            Norm::Rms(n) => n.forward_composite(x),
        }
    }
    /// x + a and its normalisation in one fused pass (RMSNorm: where its kernel applies to x
    /// and a of one dtype; elsewhere the sum, then the norm).
    pub fn residual(&self, x: &Tensor, a: &Tensor) -> Result<(Tensor, Tensor)> {
        match self {
            Norm::Layer(ln) => {
                sinter_core::fused::residual_layer_norm(x, a, &ln.weight, &ln.bias, ln.eps)
            }
            Norm::Rms(n) if n.fused_applies(x) && a.dtype() == x.dtype() => {
                super::fused::rms_norm::residual_rms_norm(x, a, &n.weight, n.eps)
            }
            Norm::Rms(n) => {
                let sum = x.add(a)?;
                let y = n.forward(&sum)?;
                Ok((sum, y))
            }
        }
    }
}

impl Module for Norm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Norm::Layer(ln) => ln.forward(x),
            Norm::Rms(n) => n.forward(x),
        }
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        match self {
            Norm::Layer(ln) => ln.collect(prefix, out),
            Norm::Rms(n) => n.collect(prefix, out),
        }
    }
}
