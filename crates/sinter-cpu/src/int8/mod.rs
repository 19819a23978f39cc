//! int8 inference kernels: u8 activations × i8 weights → i32, with run-time dispatch over
//! AVX512-VNNI, AVX-VNNI, AVX2 and portable Rust ([`Int8Path`]), a packed weight layout built
//! once per layer ([`PackedWeights`]), and a fused epilogue (dequantize with per-channel weight
//! scales and per-row or per-tensor activation scales, bias, ReLU/GELU, f32 out or u8
//! requantized for the next layer).
//!
//! - [`quant`]: f32 → int8 weights (symmetric per channel) and u8 activations (asymmetric,
//!   per row or per tensor).
//! - [`pack`]: the weight layout the kernels stream.
//! - `kernel*`: the micro-kernels; every one returns the same exact i32 accumulators.
//! - [`gemm`]: blocks, threads and tiles; [`epilogue`]: what becomes of the accumulators.
//! - [`dynamic`]: a Linear on f32 rows, each quantized at run time in one or two u8 terms.
//! - [`pool`]: max pooling of channels-last u8 (and f32) images between chained int8 layers.

pub mod dynamic;
pub mod epilogue;
pub mod gemm;
mod kernel;
#[cfg(target_arch = "x86_64")]
mod kernel_avx256;
#[cfg(target_arch = "x86_64")]
mod kernel_avx512;
pub mod pack;
pub mod path;
pub mod pool;
pub mod quant;

pub use dynamic::{
    linear_dynamic, linear_dynamic_planes, quantize_rows_terms, ActTerms, TWO_TERMS_MIN_WEIGHT,
};
pub use epilogue::{ActQuant, Activation, Epilogue};
pub use gemm::{gemm, gemm_i32, Activations, Output};
pub use pack::PackedWeights;
pub use path::Int8Path;
pub use quant::{
    quantize_rows_dynamic, quantize_rows_static, quantize_weights, QParams, WeightChannel,
};

/// A value the int8 code cannot work with (a -128 weight, a NaN activation, a shape mismatch),
/// with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Int8Error(pub String);

impl std::fmt::Display for Int8Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Int8Error {}
