//! The LLTM cell (PyTorch's "Custom C++ and CUDA Extensions" example), the classic case for a
//! custom kernel, three ways:
//!
//! - [`LltmImpl::Composite`]: the cell from tensor ops (`composite.rs`);
//! - [`LltmImpl::CustomOp`]: its pointwise part as one custom op ([`lltm_cell`]) with a fused
//!   CPU forward and backward (`cpu_kernels.rs`) and CUDA forward and backward kernels
//!   (`lltm.cu`); the device of the tensors picks which runs, through the backend seam.
//!
//! In every way the gate pre-activations are one matrix product, `[h, x] · Wᵀ + b`: the engine's
//! GEMM is already the fast way to compute them, so the custom op fuses what follows it — two
//! sigmoids, an ELU, the cell update and tanh, thirteen elementwise ops of the composite whose
//! intermediates go through memory — into one pass forward and one backward.
//!
//! The cell: with gates = [h, x]·Wᵀ + b split in three along the features,
//! i = σ(g₀), o = σ(g₁), c̃ = elu(g₂), c' = c + c̃·i, h' = tanh(c')·o.
//!
//! It lives here, beside the other models, because it is one: a newcomer reads it next to the
//! GPT and the CNN, its tests run with the model tests, and `cargo bench -p sinter-models
//! --bench lltm` times it.

mod cell_op;
mod composite;
mod cpu_kernels;

pub use cell_op::{cell_fused, lltm_cell, lltm_cell_backward, LLTM_CU};
pub use composite::{cell_composite, elu};

use sinter_core::{DType, Device, Result, Rng, Tensor};

/// Which implementation of the cell's pointwise part runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LltmImpl {
    /// Composite tensor ops.
    Composite,
    /// The `lltm_cell` custom op (fused CPU loops, or the CUDA kernels).
    CustomOp,
}

/// An LLTM cell: `input_features` inputs, `state_size` units.
#[derive(Clone, Debug)]
pub struct Lltm {
    /// [3·state, state + input]: the gates' weights over [h, x].
    pub weights: Tensor,
    /// [3·state].
    pub bias: Tensor,
}

impl Lltm {
    /// Weights and bias uniform in ±1/√state (PyTorch's example), as variables on `device`.
    pub fn new(
        input_features: usize,
        state_size: usize,
        rng: &mut Rng,
        device: Device,
    ) -> Result<Lltm> {
        let bound = 1.0 / (state_size as f64).sqrt();
        let mut var = |shape: &[usize]| {
            Tensor::rand_uniform(shape, -bound, bound, rng, DType::F32, device)?.to_var()
        };
        Ok(Lltm {
            weights: var(&[3 * state_size, state_size + input_features])?,
            bias: var(&[3 * state_size])?,
        })
    }

    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![
            ("weights".into(), self.weights.clone()),
            ("bias".into(), self.bias.clone()),
        ]
    }

    /// The gate pre-activations [batch, 3·state] = [h, x]·Wᵀ + b.
    pub fn gates(&self, x: &Tensor, h: &Tensor) -> Result<Tensor> {
        Tensor::cat(&[h.clone(), x.clone()], 1)?
            .matmul(&self.weights.t()?)?
            .add(&self.bias)
    }

    /// One step: (new h, new cell) from x [batch, input] and the state (h, cell) [batch, state].
    pub fn forward(
        &self,
        x: &Tensor,
        h: &Tensor,
        cell: &Tensor,
        imp: LltmImpl,
    ) -> Result<(Tensor, Tensor)> {
        let gates = self.gates(x, h)?;
        match imp {
            LltmImpl::Composite => cell_composite(&gates, cell),
            LltmImpl::CustomOp => cell_fused(&gates, cell),
        }
    }
}
