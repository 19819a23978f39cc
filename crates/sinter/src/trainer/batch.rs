//! Loader batches become model batches: host tensors (no copy), then the model's own
//! preparation (BERT's masks), seeded per step, micro-step and rank so that a resumed run
//! prepares exactly what an uninterrupted one did.

use anyhow::Result;
use sinter_core::{Device, Tensor};
use sinter_data::{Batch, HostArray, HostData};

use super::Setup;

/// Takes over the loader's buffer as the tensor's storage (no copy).
pub fn to_tensor(a: HostArray) -> Result<Tensor> {
    Ok(match a.data {
        HostData::F32(v) => Tensor::from_vec(v, &a.shape, Device::Cpu)?,
        HostData::I64(v) => Tensor::from_vec(v, &a.shape, Device::Cpu)?,
    })
}

/// The seed of one batch's random preparation: distinct per run seed, step, micro-step and
/// rank.
pub fn batch_seed(seed: u64, step: u64, micro: u64, rank: usize) -> u64 {
    let mut h = seed ^ 0x6d61_736b_6c6d_0001;
    for x in [step, micro, rank as u64] {
        h = (h ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    }
    h
}

/// Validation batches are prepared the same way at every evaluation (step `u64::MAX`), so
/// losses compare over time.
pub const EVAL_STEP: u64 = u64::MAX;

/// A loader batch prepared by the model, on the host.
pub fn prepare(s: &Setup, b: Batch, seed: u64) -> Result<(Tensor, Tensor)> {
    Ok(s.model
        .prepare_batch(to_tensor(b.inputs)?, to_tensor(b.targets)?, seed)?)
}
