//! sinter-cpu: the CPU kernels under sinter's tensor crate, the CPU counterpart of
//! `sinter-cuda`. Everything here works on plain slices with explicit shapes and strides; it
//! never sees a tensor, a layout or autograd. `sinter-core`'s CPU storage calls into it.
//!
//! - [`isa`]: which SIMD instruction set the running CPU offers, chosen once at run time and
//!   capped by `SINTER_CPU_ISA` (so every path can be tested on any machine).
//! - [`gemm`]: f32 C = α·A·B + β·C over strided slices, batched, with a fused bias +
//!   activation epilogue and prepacked B.
//! - [`im2col`]: a convolution's gather rule (which input pixel each tap of each output pixel
//!   reads) and the int8 column rows.
//! - [`winograd`]: 3×3 stride-1 convolution (forward, input and weight gradients) by
//!   Winograd F(2×2, 3×3): 16 GEMMs over transformed tiles, 2.25× fewer multiplies.
//! - [`math`]: vectorised exp/ln/tanh/sigmoid/SiLU/erf/GELU and derivatives over slices, and
//!   fused row kernels (softmax, cross-entropy, layer norm, bias + activation, AdamW).
pub mod int8;
pub mod isa;
pub use isa::Isa;
pub mod gemm;
pub mod ggml_quant;
pub mod im2col;
pub mod math;
#[doc(hidden)]
pub mod simd;
pub mod winograd;
