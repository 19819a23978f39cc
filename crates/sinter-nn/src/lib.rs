//! sinter-nn: modules with named parameters (the names are checkpoint keys, PyTorch style),
//! layers, initialisers, optimizers, learning-rate schedules and gradient clipping.

pub mod attention;
pub mod init;
pub mod layers;
pub mod module;
pub mod optim;
pub mod schedule;

pub use attention::{CausalSelfAttention, Mlp, TransformerBlock};
pub use layers::{BatchNorm2d, Conv2d, Dropout, Embedding, Flatten, Gelu, LayerNorm, Linear, MaxPool2d, Relu, Sequential};
pub use module::{Module, NamedTensor, SharedRng, TensorKind};
pub use optim::{clip_grad_norm, AdamW, Optimizer, Sgd};
pub use schedule::LrSchedule;
