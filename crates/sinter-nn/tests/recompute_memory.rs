//! Activation memory with and without recompute, measured: a counting global allocator
//! reports the heap bytes that are alive after the forward pass (the graph's saved
//! activations, with the loss still referenced) beyond those alive before it (parameters,
//! inputs). The model is gpt-tiny built from sinter-nn's own parts (token and position
//! embeddings, 4 pre-norm blocks of width 128 with 4 heads, final LayerNorm, tied head over
//! 256 tokens, cross-entropy) at the CLI's default GPT batch: 12 sequences of 64 tokens.
//! One test in this binary: the counters are global.
//!
//! `cargo test -p sinter-nn --test recompute_memory -- --nocapture` prints the numbers.

mod common;

use std::sync::Arc;

use common::counting_alloc::{live, peak_since, reset_peak};
use sinter_core::{DType, Device, Rng, Tensor};
use sinter_nn::module::shared_rng;
use sinter_nn::recompute::{block_forward, Recompute};
use sinter_nn::{BlockConfig, Embedding, LayerNorm, Module, SharedRng, TransformerBlock};

struct TinyGpt {
    wte: Embedding,
    wpe: Embedding,
    blocks: Vec<Arc<TransformerBlock>>,
    ln_f: LayerNorm,
    rng: SharedRng,
}

impl TinyGpt {
    fn new() -> Self {
        let (layers, heads, width, ctx, vocab) = (4, 4, 128, 64, 256);
        let mut rng = Rng::new(0);
        let drop = shared_rng(0);
        TinyGpt {
            wte: Embedding::new(vocab, width, 0.02, &mut rng).unwrap(),
            wpe: Embedding::new(ctx, width, 0.01, &mut rng).unwrap(),
            blocks: (0..layers)
                .map(|_| {
                    Arc::new(
                        TransformerBlock::new(
                            &BlockConfig::gpt2(width, heads, layers, 0.0),
                            &mut rng,
                            &drop,
                        )
                        .unwrap(),
                    )
                })
                .collect(),
            ln_f: LayerNorm::new(width).unwrap(),
            rng: drop,
        }
    }
    fn loss(&self, ids: &Tensor, targets: &Tensor, mode: Recompute) -> Tensor {
        let (b, t) = (ids.shape()[0], ids.shape()[1]);
        let pos = Tensor::arange(0.0, t as f64, 1.0, DType::I64, Device::Cpu).unwrap();
        let mut x = self
            .wte
            .forward(ids)
            .unwrap()
            .add(&self.wpe.forward(&pos).unwrap())
            .unwrap();
        for blk in &self.blocks {
            x = block_forward(blk, &x, mode, Some(&self.rng)).unwrap();
        }
        let c = x.shape()[2];
        let x = self.ln_f.forward(&x).unwrap().reshape(&[b * t, c]).unwrap();
        let logits = x.matmul(&self.wte.weight.t().unwrap()).unwrap();
        logits
            .cross_entropy(&targets.reshape(&[b * t]).unwrap(), -100)
            .unwrap()
    }
    fn zero_grad(&self) {
        self.wte.zero_grad();
        self.wpe.zero_grad();
        self.ln_f.zero_grad();
        self.blocks.iter().for_each(|b| b.zero_grad());
    }
}

#[test]
fn recompute_cuts_activation_memory() {
    let m = TinyGpt::new();
    let (b, t) = (12, 64);
    let mut rng = Rng::new(1);
    let ids: Vec<i64> = (0..b * t).map(|_| rng.below(256) as i64).collect();
    let tg: Vec<i64> = (0..b * t).map(|_| rng.below(256) as i64).collect();
    let ids = Tensor::from_vec(ids, &[b, t], Device::Cpu).unwrap();
    let tg = Tensor::from_vec(tg, &[b, t], Device::Cpu).unwrap();
    // Warm up (thread pool, allocator caches, gradient buffers of the same size).
    m.loss(&ids, &tg, Recompute::None).backward().unwrap();

    let mut kept = Vec::new();
    let mut losses = Vec::new();
    for mode in [Recompute::None, Recompute::Attn, Recompute::Block] {
        m.zero_grad();
        let before = reset_peak();
        let loss = m.loss(&ids, &tg, mode);
        let held = live() - before;
        let fwd_peak = peak_since(before);
        loss.backward().unwrap();
        let step_peak = peak_since(before);
        losses.push(loss.to_scalar_f32().unwrap());
        drop(loss);
        eprintln!(
            "recompute {mode:5}: activations kept after forward {:7.2} MiB, forward peak {:7.2} MiB, step peak (incl. backward and gradients) {:7.2} MiB",
            held as f64 / 1048576.0,
            fwd_peak as f64 / 1048576.0,
            step_peak as f64 / 1048576.0
        );
        kept.push(held);
    }
    assert_eq!(losses[0], losses[1]);
    assert_eq!(losses[0], losses[2]);
    let cut = |i: usize| 1.0 - kept[i] as f64 / kept[0] as f64;
    eprintln!(
        "reduction vs none: attn {:.1}%, block {:.1}%",
        100.0 * cut(1),
        100.0 * cut(2)
    );
    assert!(cut(1) > 0.0, "attn recompute keeps less");
    assert!(
        cut(2) >= 0.40,
        "block recompute cuts activation memory by at least 40% (got {:.1}%)",
        100.0 * cut(2)
    );
}
