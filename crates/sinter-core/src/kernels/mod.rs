//! Fused ops as self-contained kernels (issue 26 item 1): each op is one folder holding its
//! typed op (on the custom-op mechanism, so no `BackendStorage` method), its composite
//! reference, its one backward, its CPU loops (`cpu.rs`) and its CUDA kernel (`cuda.rs` and the
//! `.cu` source). Nothing below this module imports it.

pub mod attention;
pub mod bias_gelu;
pub mod classifier;
pub mod conv_bias_relu;
pub mod cross_entropy;
mod launch;
pub mod layer_norm;
pub mod optimizer;
pub mod qmatmul;
pub mod softmax;
#[cfg(test)]
pub(crate) mod test_support;

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, OnceLock};

use crate::{DType, Result};

/// The float dtypes the folders' kernels are built for.
const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// A folder's typed ops built so far, by what their kernels are compiled for (dtype, scalars).
pub(crate) type OpCache<K, V = crate::custom_op::CustomOp> = OnceLock<Mutex<HashMap<K, V>>>;

/// The value under `key` in `cache`, built by `build` on first use: each op is built (and its
/// CUDA source registered) once per process.
pub(crate) fn cached<K: Hash + Eq, V: Clone>(
    cache: &'static OpCache<K, V>,
    key: K,
    build: impl FnOnce() -> Result<V>,
) -> Result<V> {
    let mut ops = cache
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(op) = ops.get(&key) {
        return Ok(op.clone());
    }
    let op = build()?;
    ops.insert(key, op.clone());
    Ok(op)
}
