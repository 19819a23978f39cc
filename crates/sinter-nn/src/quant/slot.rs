//! The hook through which quantization rewrites a layer in place.
//!
//! `Linear`, `Conv2d` and `Embedding` each own a [`QuantSlot`], shared with the
//! [`LayerHandle`] they list beside their weight in `Module::collect`. A model's forward code
//! is unchanged: each layer's forward asks its slot first, and runs its f32 path only when the
//! slot holds no int8 form. So `quant::quantize` reaches every such layer of any model through
//! the one walk every module already implements, without knowing the model's structure.
//!
//! This file depends on nothing else in `quant` but the plain [`Gram`] accumulator (the int8
//! forms are behind [`Int8Layer`]), so the layers can use it without an import circle.

use std::any::Any;
use std::sync::{Arc, Mutex, RwLock};

use sinter_core::{bail, Conv2dParams, DType, Result, Tensor};

use super::gptq::Gram;
pub use sinter_cpu::int8::Activation;

/// A quantized replacement of a layer's forward: int8 (`QuantizedLinear`,
/// `QuantizedConv2d`) or GGML blocks (`GgmlLinear`).
pub trait Int8Layer: Send + Sync {
    /// activation(layer(x)): `x Wᵀ + b` for a Linear or a tied output head, the convolution
    /// for a Conv2d.
    fn forward(&self, x: &Tensor, activation: Activation) -> Result<Tensor>;
    /// The table's rows for i64 ids (an Embedding's lookup).
    fn lookup(&self, ids: &Tensor) -> Result<Tensor> {
        let _ = ids;
        bail!("this int8 layer is not an embedding table")
    }
    fn as_any(&self) -> &dyn Any;
    /// True for a trainable model's frozen base kept quantized (QLoRA, `lora::FrozenInt8`):
    /// the layer's f32 weight is released, so it lists as frozen.
    fn frozen_base(&self) -> bool {
        false
    }
}

/// What calibration records of a layer's inputs: their running min and max (a Conv2d's
/// static input range) and, when asked, their Gram matrix XᵀX (for error-feedback rounding of
/// the layer's weights, `quant::gptq`).
#[derive(Default, Debug)]
pub struct InputObserver {
    range: Mutex<Option<(f32, f32)>>,
    gram: Option<Mutex<Option<Gram>>>,
}

impl InputObserver {
    /// An observer that also accumulates XᵀX over the inputs' rows (the last dimension).
    pub fn with_gram() -> InputObserver {
        InputObserver {
            range: Mutex::new(None),
            gram: Some(Mutex::new(None)),
        }
    }

    pub fn observe(&self, x: &Tensor) -> Result<()> {
        let (lo, hi) = sinter_cpu::int8::quant::min_max(&x.to_vec_f32()?);
        if !(lo.is_finite() && hi.is_finite()) {
            if x.numel() == 0 {
                return Ok(());
            }
            bail!("calibration: a layer input holds NaN or infinite values ({lo}, {hi})");
        }
        {
            let mut r = self.range.lock().unwrap_or_else(|e| e.into_inner());
            *r = Some(match *r {
                Some((a, b)) => (a.min(lo), b.max(hi)),
                None => (lo, hi),
            });
        }
        if let Some(gram) = &self.gram {
            let k = *x.shape().last().unwrap_or(&1);
            let rows = x.numel() / k.max(1);
            let x2 = x.to_dtype(DType::F32)?.reshape(&[rows, k])?;
            let xtx = x2.t()?.matmul(&x2)?.to_vec_f32()?;
            let mut g = gram.lock().unwrap_or_else(|e| e.into_inner());
            let g = g.get_or_insert_with(|| Gram::new(k));
            if g.k != k {
                bail!("calibration: a layer saw inputs of width {} and {k}", g.k);
            }
            g.add(&xtx, rows);
        }
        Ok(())
    }
    /// (min, max) seen, or None when no batch reached the layer.
    pub fn range(&self) -> Option<(f32, f32)> {
        *self.range.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// XᵀX over every input row seen (None when not asked for or no batch reached the layer).
    pub fn take_gram(&self) -> Option<Gram> {
        self.gram
            .as_ref()?
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

/// What a layer runs.
#[derive(Clone, Default)]
pub enum QuantState {
    /// Its f32 weights.
    #[default]
    F32,
    /// Its f32 weights, recording the range of its inputs.
    Calibrating(Arc<InputObserver>),
    /// An int8 form.
    Int8(Arc<dyn Int8Layer>),
}

/// A layer's [`QuantState`], shared between the layer and its handles.
#[derive(Clone, Default)]
pub struct QuantSlot(Arc<RwLock<QuantState>>);

impl QuantSlot {
    pub fn state(&self) -> QuantState {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub fn set(&self, state: QuantState) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = state;
    }
    /// The int8 form, if one is installed.
    pub fn int8(&self) -> Option<Arc<dyn Int8Layer>> {
        match self.state() {
            QuantState::Int8(q) => Some(q),
            _ => None,
        }
    }
    /// What a layer's forward calls first: the int8 result when an int8 form is installed
    /// (None: run the f32 path), recording the input's range when calibrating.
    pub fn forward(&self, x: &Tensor, activation: Activation) -> Result<Option<Tensor>> {
        match self.state() {
            QuantState::F32 => Ok(None),
            QuantState::Calibrating(obs) => {
                obs.observe(x)?;
                Ok(None)
            }
            QuantState::Int8(q) => q.forward(x, activation).map(Some),
        }
    }
    /// An Embedding's lookup through its int8 table, if one is installed.
    pub fn lookup(&self, ids: &Tensor) -> Result<Option<Tensor>> {
        match self.int8() {
            Some(q) => q.lookup(ids).map(Some),
            None => Ok(None),
        }
    }
}

impl std::fmt::Debug for QuantSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self.state() {
            QuantState::F32 => "f32",
            QuantState::Calibrating(_) => "calibrating",
            QuantState::Int8(_) => "int8",
        };
        write!(f, "QuantSlot({s})")
    }
}

/// Which layer a handle is on, with what the int8 form needs besides the tensors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LayerKind {
    Linear,
    Conv2d(Conv2dParams),
    Embedding,
}

/// A quantizable layer as its `collect` lists it: its kind, its tensors and its slot.
#[derive(Clone, Debug)]
pub struct LayerHandle {
    pub kind: LayerKind,
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub slot: QuantSlot,
}
