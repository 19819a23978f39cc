//! Vectorised transcendental math and the fused row kernels built on it.
//!
//! Every kernel is written once over [`crate::simd::Simd`] and runs on the instruction set
//! it is given ([`Isa::get`](crate::Isa::get) by default; tests pass each one explicitly).
//! All are single-threaded and pure over their slices, so callers split rows or elements
//! into chunks across cores themselves (the partial sums of the backward kernels are
//! accumulated into the caller's buffers for that reason).
//!
//! Accuracy against f64 (max over dense sweeps plus every magnitude down to the subnormals,
//! measured by `tests/math.rs`, identical on scalar, AVX2 and AVX-512):
//!
//! | function | max error |
//! |---|---|
//! | exp | 0.88 ulp |
//! | ln | 0.75 ulp |
//! | tanh | 1.21 ulp |
//! | sigmoid | 2.07 ulp |
//! | SiLU | 2.79 ulp (normal results; subnormal ones: absolute ≤ \|x\|·2^−149) |
//! | erf | 0.86 ulp |
//! | GELU-tanh | 2.3 ulp + the definition's own conditioning for x < 0 (≈ 3·\|2u\| ulp in its tail, u = √(2/π)(x + 0.044715x³)) |
//! | GELU-erf | 3.0 ulp + ≈ 1.5·x² ulp for x < 0 (rounding x/√2) |
//! | derivatives | ≤ 5e-6 relative (absolute ≤ 5e-8 near their zero crossings) |
//!
//! - [`elementwise`]: y = f(x) and dx = g·f'(x) over slices ([`Unary`]).
//! - [`cached_attention`]: one query row against a KV cache (decode and prefill).
//! - [`flash_tiles`]: the products and softmax passes of CPU FlashAttention's tiles.
//! - [`rope`]: rotary positions over a row's heads (both directions).
//! - [`softmax`], [`cross_entropy`], [`layer_norm`], [`rms_norm`], [`bias_act`], [`adamw`]: fused row and
//!   optimizer kernels (see each module for what it reads and writes).
pub mod activation;
pub mod adamw;
pub mod bias_act;
pub mod cached_attention;
pub mod cross_entropy;
pub mod elementwise;
mod erf;
mod exp_log;
pub mod flash_tiles;
pub mod layer_norm;
mod reduce;
pub mod rms_norm;
pub mod rope;
mod sigmoid_tanh;
pub mod softmax;

pub use activation::Activation;
pub use elementwise::{
    swiglu_backward_isa, swiglu_isa, unary, unary_backward, unary_backward_isa, unary_in_place,
    unary_isa, Unary,
};
pub use reduce::dot_lanes;

/// A vector of `n` f32 values for a kernel that writes every one of them before anything
/// reads it: no zero fill (the fused kernels' outputs; a zeroed buffer costs a pass over
/// memory that the kernel's own writes repeat).
#[allow(clippy::uninit_vec)]
pub fn output_vec(n: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(n);
    // SAFETY: f32 has no invalid bit patterns, and every caller overwrites all n values before
    // the vector is read or returned.
    unsafe { v.set_len(n) };
    v
}
