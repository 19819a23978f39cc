//! Fused kernels for the Transformer fast path. Each op computes in one pass what the
//! composite Tensor ops would compute in several, keeps only what its backward needs, and is
//! tested against that composite (same forward values, same input gradients, within f32
//! rounding): flash attention, residual add + LayerNorm, bias + GELU (also fused into the
//! preceding Linear's GEMM: `linear_bias_gelu`), and the global gradient norm. (Softmax + cross-entropy and AdamW are already fused: `Tensor::cross_entropy`,
//! `Tensor::adamw_step`.)

pub mod attention;
pub mod attention_packed;
pub mod bias_gelu;
pub mod conv_bias_relu;
pub mod decode_attention;
pub mod linear;
pub mod linear_bias_gelu;

pub use crate::kernels::layer_norm::{residual_layer_norm, residual_layer_norm_reference};
pub use crate::kernels::optimizer::grad_norm::global_grad_norm;
pub use attention::{attention, attention_reference, causal_mask};
pub use attention_packed::{attention_packed, attention_packed_reference};
pub use bias_gelu::{bias_gelu, bias_gelu_reference};
pub use conv_bias_relu::{conv2d_bias_relu, conv2d_bias_relu_reference};
pub use decode_attention::{decode_attention, decode_attention_reference};
pub use linear::{linear, linear_reference};
pub use linear_bias_gelu::{linear_bias_gelu, linear_bias_gelu_reference};

use crate::{Result, Tensor};

pub(crate) fn float_input(op: &'static str, t: &Tensor) -> Result<()> {
    if !t.dtype().is_float() {
        crate::bail!("{op}: needs float tensors, got {}", t.dtype());
    }
    Ok(())
}
