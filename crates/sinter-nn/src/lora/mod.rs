//! LoRA: low-rank adapters on frozen `Linear` layers (PEFT's `LoraModel` for the decoder
//! block). `adapter` is the layer-level piece that `Linear` holds; `targets` maps Hugging
//! Face's projection names onto the block's packed layers, installs adapters and freezes the
//! base.

pub mod adapter;
pub mod qbase;
pub mod targets;

pub use adapter::{LoraAdapter, LoraConfig, LoraSlot, Segment};
pub use qbase::{freeze_ggml_slot, FrozenGgml, FrozenInt8};
pub use targets::{
    freeze_base, install, is_adapter_name, module_name, projections, Projection, DEFAULT_TARGETS,
};
