//! sinter-types: the small types every other sinter crate shares, defined once.
//!
//! - [`DType`]: the element types of tensors and device buffers, with [`Element`] for the Rust
//!   types that tensors hold.
//! - [`UnaryOp`], [`BinaryOp`], [`ReduceOp`]: the elementwise and reduction ops as data, with
//!   their f64 reference semantics and the f32 arithmetic the CPU kernels use.
//! - [`erf`]: the error function of GELU's exact form.
//! - [`AdamW`]: the optimizer's hyper-parameters and per-step factors (PyTorch's arithmetic).
//! - [`Hw`], [`conv_out_size`], [`pool_out_size`]: per-axis window sizes and PyTorch's
//!   output-size rules of convolution and pooling.
//! - [`Rng`] and [`SplitMix64`]: the seeded generators whose state checkpoints save.
//!
//! This crate depends on no other sinter crate; everything else depends on it.

pub mod adamw;
pub mod dtype;
pub mod op;
pub mod rng;
pub mod window;

pub use adamw::{AdamW, AdamWFactors};
pub use dtype::{DType, Element};
pub use op::{
    erf, floor_div_f32, floor_div_f64, floor_div_i64, pool_max_replaces, BinaryOp, ReduceOp,
    UnaryOp,
};
pub use rng::{Rng, SplitMix64};
pub use window::{conv_out_size, pool_out_size, Hw};

pub use half::{bf16, f16};
