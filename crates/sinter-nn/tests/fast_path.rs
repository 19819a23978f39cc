//! The Transformer fast path against the composite: attention, MLP and whole blocks give the
//! same outputs and gradients; activation checkpointing gives the same gradients as keeping
//! everything; the KV-cache step equals the full forward.

use std::sync::Arc;

use sinter_core::{no_grad, DType, Device, Rng, Tensor};
use sinter_nn::module::shared_rng;
use sinter_nn::recompute::{block_forward, checkpoint, Recompute};
use sinter_nn::{BlockConfig, LayerKvCache, Module, TransformerBlock};

fn randn(shape: &[usize], rng: &mut Rng) -> Tensor {
    Tensor::randn(shape, 0.0, 1.0, rng, DType::F32, Device::Cpu).unwrap()
}

fn vals(t: &Tensor) -> Vec<f32> {
    t.to_vec_f32().unwrap()
}

fn assert_close(what: &str, a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "{what}");
    let scale = b.iter().fold(1e-3f32, |m, x| m.max(x.abs()));
    let err = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(err <= tol * scale, "{what}: max error {err}, scale {scale}");
}

/// (output, input gradient, parameter gradients by name).
type Outcome = (Vec<f32>, Vec<f32>, Vec<(String, Vec<f32>)>);

fn block(width: usize, heads: usize, dropout: f32, seed: u64) -> TransformerBlock {
    let b = TransformerBlock::new(
        &BlockConfig::gpt2(width, heads, 2, dropout),
        &mut Rng::new(seed),
        &shared_rng(seed),
    )
    .unwrap();
    // Non-trivial LayerNorm parameters and biases, so every path is exercised.
    let mut rng = Rng::new(seed + 1);
    for (_, p) in b.parameters() {
        if p.rank() == 1 {
            p.assign(
                &randn(p.shape(), &mut rng)
                    .mul_scalar(0.1)
                    .unwrap()
                    .add_scalar(if p.shape()[0] == width { 1.0 } else { 0.0 })
                    .unwrap(),
            )
            .unwrap();
        }
    }
    b
}

/// (output, input gradient, parameter gradients) of Σ out ∘ w.
fn run(
    blk: &TransformerBlock,
    x0: &Tensor,
    w: &Tensor,
    f: impl Fn(&TransformerBlock, &Tensor) -> Tensor,
) -> Outcome {
    blk.zero_grad();
    let x = x0.to_var().unwrap();
    let y = f(blk, &x);
    y.mul(w).unwrap().sum_all().unwrap().backward().unwrap();
    let grads = blk
        .parameters()
        .into_iter()
        .map(|(n, p)| (n, vals(&p.grad().unwrap_or_else(|| panic!("no gradient")))))
        .collect();
    (vals(&y), vals(&x.grad().unwrap()), grads)
}

fn compare(what: &str, a: &Outcome, b: &Outcome, tol: f32) {
    assert_close(&format!("{what}: output"), &a.0, &b.0, tol);
    assert_close(&format!("{what}: input gradient"), &a.1, &b.1, tol);
    for ((n, ga), (_, gb)) in a.2.iter().zip(&b.2) {
        assert_close(&format!("{what}: gradient of {n}"), ga, gb, tol);
    }
}

#[test]
fn fused_block_matches_composite() {
    for (i, &(b, t, width, heads)) in [(1, 1, 8, 2), (2, 7, 16, 4), (2, 70, 32, 2), (1, 33, 128, 2)]
        .iter()
        .enumerate()
    {
        let blk = block(width, heads, 0.0, i as u64);
        let mut rng = Rng::new(100 + i as u64);
        let (x, w) = (
            randn(&[b, t, width], &mut rng),
            randn(&[b, t, width], &mut rng),
        );
        let fused = run(&blk, &x, &w, |m, x| m.forward(x).unwrap());
        let composite = run(&blk, &x, &w, |m, x| m.forward_composite(x).unwrap());
        compare(&format!("block {i}"), &fused, &composite, 1e-4);
        // The sub-layers on their own.
        let attn_f = vals(&blk.attn.forward_fused(&x).unwrap());
        let attn_c = vals(&blk.attn.forward_composite(&x).unwrap());
        assert_close("attention", &attn_f, &attn_c, 1e-5);
        let mlp_f = vals(&blk.mlp.forward_fused(&x).unwrap());
        let mlp_c = vals(&blk.mlp.forward_composite(&x).unwrap());
        assert_eq!(mlp_f, mlp_c, "mlp: bias + GELU fused is bit-identical");
    }
}

#[test]
fn recompute_gives_the_same_gradients() {
    for (i, &dropout) in [0.0f32, 0.2].iter().enumerate() {
        let blk = Arc::new(block(32, 4, dropout, 10 + i as u64));
        let drop_rng = shared_rng(5);
        // The block's dropout layers draw from their own shared generator; rebuild the block
        // around `drop_rng` so the test controls (and can rewind) it.
        let blk = if dropout > 0.0 {
            let named = blk.parameters();
            let b = TransformerBlock::new(
                &BlockConfig::gpt2(32, 4, 2, dropout),
                &mut Rng::new(0),
                &drop_rng,
            )
            .unwrap();
            for ((_, dst), (_, src)) in b.parameters().iter().zip(&named) {
                dst.assign(src).unwrap();
            }
            Arc::new(b)
        } else {
            blk
        };
        let mut rng = Rng::new(20);
        let (x, w) = (randn(&[2, 40, 32], &mut rng), randn(&[2, 40, 32], &mut rng));
        let mut results = Vec::new();
        for mode in [Recompute::None, Recompute::Attn, Recompute::Block] {
            *drop_rng.lock().unwrap() = Rng::new(99);
            // Two blocks in a row, so the recomputed input's gradient is itself used.
            let r = run(&blk, &x, &w, |m, x| {
                let _ = m;
                let h = block_forward(&blk, x, mode, Some(&drop_rng)).unwrap();
                block_forward(&blk, &h, mode, Some(&drop_rng)).unwrap()
            });
            let after = drop_rng.lock().unwrap().state();
            results.push((mode, r, after));
        }
        let (_, base, rng_after) = &results[0];
        for (mode, r, after) in &results[1..] {
            compare(
                &format!("dropout {dropout}, recompute {mode}"),
                r,
                base,
                1e-5,
            );
            assert_eq!(
                after, rng_after,
                "recompute {mode} leaves the generator where the plain pass does"
            );
        }
    }
}

#[test]
fn checkpoint_keeps_parameter_gradients_with_a_constant_input() {
    let blk = Arc::new(block(16, 2, 0.0, 3));
    let x = randn(&[1, 5, 16], &mut Rng::new(1)); // not a variable
    let b2 = blk.clone();
    let y = checkpoint(&x, None, move |x| b2.forward(x)).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    let with: Vec<Vec<f32>> = blk
        .parameters()
        .iter()
        .map(|(_, p)| vals(&p.grad().unwrap()))
        .collect();
    blk.zero_grad();
    blk.forward(&x)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    for ((n, p), w) in blk.parameters().iter().zip(&with) {
        assert_close(n, w, &vals(&p.grad().unwrap()), 1e-5);
    }
    // Under no_grad a checkpoint is a plain call.
    let _g = no_grad();
    let b3 = blk.clone();
    assert_eq!(
        vals(&checkpoint(&x, None, move |x| b3.forward(x)).unwrap()),
        vals(&blk.forward(&x).unwrap())
    );
}

#[test]
fn recompute_names_parse() {
    for n in Recompute::NAMES {
        assert_eq!(n.parse::<Recompute>().unwrap().to_string(), n);
    }
    assert!("everything"
        .parse::<Recompute>()
        .unwrap_err()
        .to_string()
        .contains("none, attn, block"));
    assert_eq!(Recompute::default(), Recompute::None);
}

#[test]
fn kv_cache_step_equals_the_full_forward() {
    let blk = block(32, 4, 0.0, 7);
    let mut rng = Rng::new(8);
    let (b, t) = (2, 75);
    let x = randn(&[b, t, 32], &mut rng);
    let _g = no_grad();
    let full = blk.forward(&x).unwrap();
    let mut cache = LayerKvCache::new(b, 4, 80, 8, DType::F32, Device::Cpu).unwrap();
    // A prompt of 10 positions, then one at a time, then chunks of 3.
    let mut at = 0;
    for len in std::iter::once(10)
        .chain(std::iter::repeat_n(1, 50))
        .chain(std::iter::repeat(3))
    {
        if at >= t {
            break;
        }
        let len = len.min(t - at);
        let y = blk
            .forward_step(&x.narrow(1, at, len).unwrap(), &mut cache)
            .unwrap();
        assert_close(
            &format!("positions {at}..{}", at + len),
            &vals(&y),
            &vals(&full.narrow(1, at, len).unwrap()),
            1e-5,
        );
        at += len;
    }
    assert_eq!(cache.len, t);
    // Past the capacity is an error.
    assert!(blk
        .forward_step(&x.narrow(1, 0, 6).unwrap(), &mut cache)
        .is_err());
}
