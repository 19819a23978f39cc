//! sinter-nn: modules with named parameters (the names are checkpoint keys, PyTorch style),
//! layers, losses, initialisers, optimizers, learning-rate schedules, gradient clipping, and BatchNorm
//! folding / fused Conv+BatchNorm (`fold`, `conv_bn`).

pub mod conv_bn;
pub mod device;
pub mod fold;
pub mod init;
pub mod layers;
pub mod lora;
pub mod loss;
pub mod mixed_precision;
pub mod module;
pub mod optim;
pub mod quant;
pub mod recompute;
pub mod schedule;
pub mod transformer;

pub use conv_bn::ConvBn;
pub use device::{module_device, move_module};
pub use layers::{
    AvgPool2d, BatchNorm2d, Conv2d, Dropout, Embedding, Flatten, Gelu, GeluApproximate, LayerNorm,
    Linear, MaxPool2d, Relu, Sequential,
};
pub use loss::{CrossEntropyLoss, MseLoss};
pub use mixed_precision::{
    LossScaler, LossScalerState, PrecisionMode, StepControl, StepControlState,
};
pub use module::{Module, NamedTensor, SharedRng, TensorKind};
pub use optim::{
    clip_grad_norm, clip_grad_norm_with, decay_groups, AdamW, GroupedParams, Optimizer, ParamGroup,
    ParamSettings, Sgd,
};
pub use recompute::{checkpoint, Recompute};
pub use schedule::LrSchedule;
pub use transformer::{
    BlockConfig, CausalSelfAttention, LayerKvCache, Mlp, MlpKind, Norm, NormKind, RmsNorm, Rope,
    RopeConfig, RopeScaling, TransformerBlock,
};
