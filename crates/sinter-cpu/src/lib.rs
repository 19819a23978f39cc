//! sinter-cpu: the CPU kernels under sinter's tensor crate, the CPU counterpart of
//! `sinter-cuda`. Everything here works on plain slices with explicit shapes and strides; it
//! never sees a tensor, a layout or autograd. `sinter-core`'s CPU storage calls into it.
//!
//! - [`isa`]: which SIMD instruction set the running CPU offers, chosen once at run time and
//!   capped by `SINTER_CPU_ISA` (so every path can be tested on any machine).
pub mod int8;
pub mod isa;
pub use isa::Isa;
pub mod gemm;
pub mod math;
#[doc(hidden)]
pub mod simd;
