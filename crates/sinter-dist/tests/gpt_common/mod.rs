//! Helpers shared by the tensor- and pipeline-parallel GPT tests: a model's initial weights
//! and fixed random token batches.
#![allow(dead_code)]

use sinter_core::{Device, Rng, Tensor};
use sinter_dist::tensor_parallel::snapshot_parameters;
use sinter_models::{Gpt, GptConfig};
use sinter_nn::module::shared_rng;

pub type Named = Vec<(String, Tensor)>;

/// A GPT's initial weights (fresh storage, from `model_seed`) and `n` random (ids, targets)
/// batches of `b` × block_size tokens (from `data_seed`).
pub fn setup_with(
    cfg: &GptConfig,
    b: usize,
    n: usize,
    model_seed: u64,
    data_seed: u64,
) -> (Named, Vec<(Tensor, Tensor)>) {
    let gpt = Gpt::new(cfg.clone(), &mut Rng::new(model_seed), &shared_rng(1)).unwrap();
    let init = snapshot_parameters(&gpt).unwrap();
    let mut rng = Rng::new(data_seed);
    let t = cfg.block_size;
    let mut tok = |len: usize| -> Vec<i64> {
        (0..len)
            .map(|_| rng.below(cfg.vocab_size as u64) as i64)
            .collect()
    };
    let batches = (0..n)
        .map(|_| {
            let ids = Tensor::from_vec(tok(b * t), &[b, t], Device::Cpu).unwrap();
            let tg = Tensor::from_vec(tok(b * t), &[b, t], Device::Cpu).unwrap();
            (ids, tg)
        })
        .collect();
    (init, batches)
}

/// `setup_with` the seeds the TP and checkpoint tests use.
pub fn setup(cfg: &GptConfig, b: usize, n: usize) -> (Named, Vec<(Tensor, Tensor)>) {
    setup_with(cfg, b, n, 7, 42)
}
