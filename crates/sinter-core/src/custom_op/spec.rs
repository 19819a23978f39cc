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
    /// `Some(i)`: the output is written in place of input `i` (same shape and dtype), which the
    /// op consumes. On CUDA the kernel's output pointer is input `i`'s memory when the input
    /// is a whole contiguous buffer (else a fresh copy of its values), so the kernel may read
    /// and overwrite it in one pass and need not write every element; the input's values
    /// afterwards are the output's. The CPU forward returns the output as any other.
    pub in_place_of: Option<usize>,
}

impl OutputSpec {
    /// An output `apply` returns.
    pub fn new(shape: &[usize], dtype: DType) -> OutputSpec {
        OutputSpec {
            shape: shape.to_vec(),
            dtype,
            saved_only: false,
            in_place_of: None,
        }
    }
    /// The same output, kept for the backward (`BackwardCtx::outputs`) but not returned by
    /// `apply`. Saved-only outputs come after every returned one.
    pub fn saved(mut self) -> OutputSpec {
        self.saved_only = true;
        self
    }
    /// The same output, written in place of input `i` (see [`OutputSpec::in_place_of`]):
    /// what llm.c's fused classifier does with its logits, so a large input and an output of
    /// its size never both take memory.
    pub fn in_place(mut self, i: usize) -> OutputSpec {
        self.in_place_of = Some(i);
        self
    }
    /// Elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
}
