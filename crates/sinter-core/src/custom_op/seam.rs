//! The custom-op primitive of the backend seam: each backend runs an op's forward for its own
//! storage (`cpu.rs`: the Rust closure; `cuda.rs`: the NVRTC kernel) or says it has none.
//! `Storage::custom_forward` dispatches to it, once, like every other primitive.

use super::op::OpDef;
use super::spec::{OutputSpec, TensorMeta};
use crate::backend::BackendStorage;
use crate::{Layout, Result};

/// One forward call: the op, its inputs' metadata and the outputs it must make.
pub(crate) struct ForwardCall<'a> {
    pub def: &'a OpDef,
    pub metas: &'a [TensorMeta],
    pub specs: &'a [OutputSpec],
}

pub(crate) trait CustomForward: BackendStorage {
    /// The op's outputs (fresh, contiguous, one per spec, in order) computed from `inputs`
    /// (all of this backend, at least one), or None when the op has no forward for it.
    fn custom_forward(
        call: &ForwardCall<'_>,
        inputs: &[(&Self, &Layout)],
    ) -> Result<Option<Vec<Self>>>;
}
