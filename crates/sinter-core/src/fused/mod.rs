//! Fused kernels for the Transformer fast path. Each op computes in one pass what the
//! composite Tensor ops would compute in several, keeps only what its backward needs, and is
//! tested against that composite (same forward values, same input gradients, within f32
//! rounding): flash attention, residual add + LayerNorm, bias + GELU (also fused into the
//! preceding Linear's GEMM: `linear_bias_gelu`), and the global gradient norm. (Softmax + cross-entropy and AdamW are already fused: `Tensor::cross_entropy`,
//! `Tensor::adamw_step`.)

pub mod grad_norm;
pub mod linear;

pub use crate::kernels::attention::{
    attention, attention_packed, attention_packed_reference, attention_reference, causal_mask,
    decode_attention, decode_attention_reference,
};
pub use crate::kernels::bias_gelu::{
    bias_gelu, bias_gelu_reference, linear_bias_gelu, linear_bias_gelu_reference,
};
pub use crate::kernels::conv_bias_relu::{conv2d_bias_relu, conv2d_bias_relu_reference};
pub use crate::kernels::layer_norm::{residual_layer_norm, residual_layer_norm_reference};
pub use grad_norm::global_grad_norm;
pub use linear::{linear, linear_reference};

use crate::{Result, Tensor};

pub(crate) fn float_input(op: &'static str, t: &Tensor) -> Result<()> {
    if !t.dtype().is_float() {
        crate::bail!("{op}: needs float tensors, got {}", t.dtype());
    }
    Ok(())
}
