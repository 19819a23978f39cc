//! sinter-core: runtime-typed tensors with strided views, reverse-mode autograd, and the
//! backends behind one seam (`backend`: storage-level primitives that the CPU and CUDA storages
//! implement). Higher layers (nn, models, dist) build only on the `Tensor` API here.

pub mod amp;
pub mod autograd;
pub mod backend;
pub mod cpu;
pub mod cuda;
pub mod custom_op;
pub mod device;
pub mod dtype;
pub mod error;
pub mod fused;
mod graph;
pub mod kernels;
pub mod layout;
mod logical;
pub mod loss;
mod nn_ops;
pub mod op;
mod ops;
pub mod rng;
pub mod storage;
pub mod tensor;

pub use amp::{autocast, AutocastGuard};
pub use autograd::{is_grad_enabled, no_grad, with_custom_backward, NoGradGuard};
pub use backend::{AdamWParams, Conv2dParams, Pool2dParams, SgdParams};
pub use device::Device;
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use kernels::optimizer::step_ctl;
pub use layout::Layout;
pub use loss::{CrossEntropyOptions, Reduction};
pub use rng::Rng;
pub use sinter_types::Hw;
pub use tensor::{HostF32, HostF32Mut, HostValues, StorageStamp, Tensor, TensorId};

pub use half::{bf16, f16};
