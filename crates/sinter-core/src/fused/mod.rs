//! The Transformer fast path's fused ops under one name: each computes in one pass what the
//! composite Tensor ops would in several and keeps only what its backward needs. They live in
//! their kernel folders (`crate::kernels`: attention, bias + GELU and Linear + bias + GELU,
//! conv + bias + ReLU, residual add + LayerNorm, the global gradient norm), re-exported here;
//! `linear` (x Wᵀ + b with the bias in the GEMM's epilogue) is a backend primitive.

pub mod linear;
pub mod mlp;

pub use crate::kernels::attention::{
    attention, attention_packed, attention_packed_gqa, attention_packed_gqa_reference,
    attention_packed_reference, attention_reference, causal_mask, decode_attention,
    decode_attention_reference,
};
pub use crate::kernels::bias_gelu::{
    bias_gelu, bias_gelu_reference, linear_bias_gelu, linear_bias_gelu_reference,
};
pub use crate::kernels::conv_bias_relu::{conv2d_bias_relu, conv2d_bias_relu_reference};
pub use crate::kernels::layer_norm::{residual_layer_norm, residual_layer_norm_reference};
pub use crate::kernels::optimizer::grad_norm::global_grad_norm;
pub use linear::{linear, linear_reference};
pub use mlp::{mlp_gelu, mlp_gelu_reference};

use crate::{Result, Tensor};

pub(crate) fn float_input(op: &'static str, t: &Tensor) -> Result<()> {
    if !t.dtype().is_float() {
        crate::bail!("{op}: needs float tensors, got {}", t.dtype());
    }
    Ok(())
}
