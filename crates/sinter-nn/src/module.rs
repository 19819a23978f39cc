//! The Module trait. A module lists its tensors under dotted names relative to itself
//! (`blocks.0.attn.qkv.weight`); those names are the checkpoint keys.

use std::sync::{Arc, Mutex};

use sinter_core::{Result, Rng, Tensor};

use crate::quant::slot::LayerHandle;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorKind {
    /// Trained by the optimizer.
    Parameter,
    /// State that is saved but not trained (BatchNorm running statistics).
    Buffer,
    /// A parameter frozen in place (`Tensor::freeze`: a LoRA run's base weights): part of the
    /// model, not trained, and not in a LoRA run's checkpoints.
    Frozen,
}

/// A parameter's kind: frozen-ness is a property of the tensor, so every walk agrees.
fn parameter_kind(t: &Tensor) -> TensorKind {
    if t.is_frozen() {
        TensorKind::Frozen
    } else {
        TensorKind::Parameter
    }
}

#[derive(Clone, Debug)]
pub struct NamedTensor {
    pub name: String,
    pub tensor: Tensor,
    pub kind: TensorKind,
    /// For the weight of a Linear, Conv2d or Embedding: a handle on its layer, through which
    /// an inference rewrite (int8 quantization, `crate::quant`) replaces the layer's forward.
    pub layer: Option<LayerHandle>,
}

/// A generator shared by the modules that draw random numbers (dropout), so that one
/// state can be checkpointed and restored.
pub type SharedRng = Arc<Mutex<Rng>>;

pub fn shared_rng(seed: u64) -> SharedRng {
    Arc::new(Mutex::new(Rng::new(seed)))
}

pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

pub trait Module: Send + Sync {
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
    /// Appends this module's tensors, named `prefix.<name>`.
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>);
    /// Switches training behaviour (dropout, batch statistics). Containers pass it on.
    fn set_training(&self, _training: bool) {}
    /// Folds each BatchNorm into the layer before it, for inference (see `fold`): the layers
    /// then run with the folded weights until `set_training(true)`. Needs evaluation mode.
    /// Returns how many BatchNorms were folded. Containers pass it on.
    fn fold_batch_norm(&self) -> Result<usize> {
        Ok(0)
    }

    /// All tensors (parameters and buffers) with their full names.
    fn named_tensors(&self) -> Vec<NamedTensor> {
        let mut v = Vec::new();
        self.collect("", &mut v);
        v
    }
    /// Trainable parameters with their full names.
    fn parameters(&self) -> Vec<(String, Tensor)> {
        self.named_tensors()
            .into_iter()
            .filter(|t| t.kind == TensorKind::Parameter && !t.tensor.is_frozen())
            .map(|t| (t.name, t.tensor))
            .collect()
    }
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(|(_, t)| t.numel()).sum()
    }
    fn zero_grad(&self) {
        for (_, p) in self.parameters() {
            p.zero_grad();
        }
    }
    /// The concrete model, for callers that need more than `forward` (a GPT's KV-cache
    /// generation, say). Models that offer such methods return `Some(self)`.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

impl<M: Module + ?Sized> Module for Box<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        (**self).forward(x)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        (**self).collect(prefix, out)
    }
    fn set_training(&self, training: bool) {
        (**self).set_training(training)
    }
    fn fold_batch_norm(&self) -> Result<usize> {
        (**self).fold_batch_norm()
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        (**self).as_any()
    }
}

pub(crate) fn param(prefix: &str, name: &str, t: &Tensor, out: &mut Vec<NamedTensor>) {
    out.push(NamedTensor {
        name: join(prefix, name),
        tensor: t.clone(),
        kind: parameter_kind(t),
        layer: None,
    });
}
/// A layer's weight, with the handle that lets `crate::quant` rewrite the layer.
pub(crate) fn layer_weight(prefix: &str, layer: LayerHandle, out: &mut Vec<NamedTensor>) {
    // A QLoRA base runs its quantized form; the f32 weight left in the layer is released.
    let frozen_base = layer.slot.int8().is_some_and(|q| q.frozen_base());
    out.push(NamedTensor {
        name: join(prefix, "weight"),
        kind: if frozen_base {
            TensorKind::Frozen
        } else {
            parameter_kind(&layer.weight)
        },
        tensor: layer.weight.clone(),
        layer: Some(layer),
    });
}
pub(crate) fn buffer(prefix: &str, name: &str, t: &Tensor, out: &mut Vec<NamedTensor>) {
    out.push(NamedTensor {
        name: join(prefix, name),
        tensor: t.clone(),
        kind: TensorKind::Buffer,
        layer: None,
    });
}
