//! Vectorised transcendental math and the fused row kernels built on it.
pub mod activation;
pub mod elementwise;
pub mod erf;
pub mod exp_log;
pub mod sigmoid_tanh;

pub use activation::Activation;
pub use elementwise::{
    unary, unary_backward, unary_backward_isa, unary_in_place, unary_isa, Unary,
};
