//! What a custom op's forwards see of their inputs ([`TensorMeta`]) and what they must make
//! ([`OutputSpec`]): declared once per op, so every backend's outputs are checked against (or,
//! on CUDA, allocated from) the same shapes and dtypes.

use crate::layout::numel;
use crate::{DType, Device};

/// An input's shape, dtype and device, as the op's output and launch functions see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMeta {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub device: Device,
}

impl TensorMeta {
    /// Elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
}

/// One output of a custom op: its shape and dtype, and whether `apply` returns it or only keeps
/// it for the backward (an intermediate such as a gate activation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputSpec {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub saved_only: bool,
}

impl OutputSpec {
    /// An output `apply` returns.
    pub fn new(shape: &[usize], dtype: DType) -> OutputSpec {
        OutputSpec {
            shape: shape.to_vec(),
            dtype,
            saved_only: false,
        }
    }
    /// The same output, kept for the backward (`BackwardCtx::outputs`) but not returned by
    /// `apply`. Saved-only outputs come after every returned one.
    pub fn saved(mut self) -> OutputSpec {
        self.saved_only = true;
        self
    }
    /// Elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
}
