//! Fused ops as self-contained kernels (issue 26 item 1): each op is one folder holding its
//! typed op (on the custom-op mechanism, so no `BackendStorage` method), its composite
//! reference, its one backward, its CPU loops (`cpu.rs`) and its CUDA kernel (`cuda.rs` and the
//! `.cu` source). Nothing below this module imports it.

pub mod classifier;
pub mod layer_norm;
pub mod optimizer;
