//! Helpers shared by the tensor- and pipeline-parallel GPT tests: a model's initial weights
//! and fixed random token batches.
#![allow(dead_code)]

use sinter_core::{Device, Rng, Tensor};
use sinter_dist::tensor_parallel::snapshot_parameters;
use sinter_models::{Decoder, DecoderConfig};
use sinter_nn::module::shared_rng;

pub type Named = Vec<(String, Tensor)>;

/// A GPT's initial weights (fresh storage, from `model_seed`) and `n` random (ids, targets)
/// batches of `b` × block_size tokens (from `data_seed`).
pub fn setup_with(
    cfg: &DecoderConfig,
    b: usize,
    n: usize,
    model_seed: u64,
    data_seed: u64,
) -> (Named, Vec<(Tensor, Tensor)>) {
    let gpt = Decoder::new(cfg.clone(), &mut Rng::new(model_seed), &shared_rng(1)).unwrap();
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
pub fn setup(cfg: &DecoderConfig, b: usize, n: usize) -> (Named, Vec<(Tensor, Tensor)>) {
    setup_with(cfg, b, n, 7, 42)
}

/// (max |a − b| / max |b|, index of the worst element), skipping the elements in `skip`.
pub fn worst_elem(a: &Tensor, b: &Tensor, skip: Option<std::ops::Range<usize>>) -> (f64, usize) {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    let scale = b.iter().fold(1e-12f64, |m, x| m.max(x.abs()));
    let skip = skip.unwrap_or(0..0);
    let (i, d) = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .enumerate()
        .filter(|(i, _)| !skip.contains(i))
        .fold(
            (0, 0.0),
            |(bi, bd), (i, d)| if d > bd { (i, d) } else { (bi, bd) },
        );
    (d / scale, i)
}

/// The key-bias elements of a `attn.qkv.bias`: their gradient is exactly zero (softmax ignores
/// a constant added to a row of scores), so they only receive rounding noise.
pub fn key_bias(name: &str, t: &Tensor) -> Option<std::ops::Range<usize>> {
    let c = t.numel() / 3;
    name.ends_with("attn.qkv.bias").then_some(c..2 * c)
}

/// Every tensor of `got` within `tol` of `want` relative to its scale, except the key-bias
/// elements, which must be within `key_bias_atol` absolutely; returns the worst relative error.
pub fn assert_named_close(
    got: &Named,
    want: &Named,
    tol: f64,
    key_bias_atol: f64,
    what: &str,
) -> f64 {
    assert_close_skipping(got, want, tol, Some(key_bias_atol), what)
}

/// Every tensor of `got` within `tol` of `want` relative to its scale, no element exempt
/// (for grouped-query models, whose qkv bias is not three equal thirds: `key_bias`).
pub fn assert_all_close(got: &Named, want: &Named, tol: f64, what: &str) -> f64 {
    assert_close_skipping(got, want, tol, None, what)
}

fn assert_close_skipping(
    got: &Named,
    want: &Named,
    tol: f64,
    key_bias_atol: Option<f64>,
    what: &str,
) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: number of tensors");
    let mut worst = 0f64;
    for ((gn, g), (wn, w)) in got.iter().zip(want) {
        assert_eq!(gn, wn, "{what}: names/order");
        let skip = key_bias_atol.and_then(|_| key_bias(gn, g));
        let (e, i) = worst_elem(g, w, skip.clone());
        assert!(
            e <= tol,
            "{what}: {gn} {:?} differs by {e:e} relative to its scale, worst at flat index {i}",
            g.shape()
        );
        if let Some(k) = skip {
            let (a, b) = (g.to_vec_f64().unwrap(), w.to_vec_f64().unwrap());
            for j in k {
                let d = (a[j] - b[j]).abs();
                assert!(
                    d <= key_bias_atol.unwrap_or(0.0),
                    "{what}: {gn}[{j}] (key bias) differs by {d:e}"
                );
            }
        }
        worst = worst.max(e);
    }
    worst
}

pub fn assert_losses_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{what}: loss of step {i}: {g} vs {w}"
        );
    }
}

/// Each stage's (losses, first-step gradients, final weights) of `cfg` trained from `init` on
/// `batches` by a `stages`-stage 1F1B pipeline of `micro` micro-batches with AdamW(lr, wd),
/// on threads that must finish within `limit`.
pub fn train_pipeline(
    cfg: &DecoderConfig,
    init: &Named,
    batches: &[(Tensor, Tensor)],
    (stages, micro): (usize, usize),
    (lr, wd): (f64, f64),
    limit: std::time::Duration,
) -> Vec<(Vec<f32>, Named, Named)> {
    use sinter_dist::pipeline::{PipelineGpt, Schedule};
    use sinter_nn::{AdamW, Optimizer};
    sinter_dist::run_on_threads(stages, limit, |c| {
        let mut pipe =
            PipelineGpt::from_named(cfg, init, Box::new(c), Schedule::OneFOneB, micro).unwrap();
        let mut opt = AdamW::new(pipe.parameters(), lr, wd).unwrap();
        let (mut losses, mut grads0) = (Vec::new(), Vec::new());
        for (i, (ids, tg)) in batches.iter().enumerate() {
            opt.zero_grad();
            let st = pipe.forward_backward(ids, tg).unwrap();
            if i == 0 {
                grads0 = pipe.gather_grads().unwrap();
            }
            opt.step().unwrap();
            losses.push(st.loss);
        }
        (losses, grads0, pipe.gather_weights().unwrap())
    })
}
