//! CPU attention (FlashAttention-2 tiles, sinter-cpu's `math/flash_tiles.rs`) at the shapes of the
//! decoders' training steps: forward, and forward + backward, from a packed qkv projection.
//!
//!     chrt -f 1 cargo bench -p sinter-core --bench attention
//!     SINTER_ATTN_SHAPES=12x4x64x32,4x12x256x64 cargo bench -p sinter-core --bench attention
//!
//! A shape is batch × heads × tokens × head dim, causal. The pool's other workers spin for
//! work meanwhile ([`HotWorkers`]), as they do through a training step. GFLOP/s counts only
//! the causal part of each product (t·(t + 1)/2 of a head's t × t scores, each a length-d dot
//! product; 2 products forward, 5 backward), not the masked part of the register tiles along
//! the diagonal, which are computed whole. PyTorch's side, to run alternately beside it:
//! `bench/vs-torch/attention_torch.py`.

mod common;

use common::{budget, machine_line, rounds, time_it, Stats};
use sinter_core::cpu::hot_workers::HotWorkers;
use sinter_core::fused::attention_packed;
use sinter_core::{DType, Device, Rng, Tensor};

fn shapes() -> Vec<[usize; 4]> {
    let spec = std::env::var("SINTER_ATTN_SHAPES").unwrap_or_else(|_| "12x4x64x32".into());
    spec.split(',')
        .map(|s| {
            let d: Vec<usize> = s
                .split('x')
                .map(|v| v.parse().expect("SINTER_ATTN_SHAPES: BxHxTxD,…"))
                .collect();
            assert!(d.len() == 4, "SINTER_ATTN_SHAPES: '{s}' is not BxHxTxD");
            [d[0], d[1], d[2], d[3]]
        })
        .collect()
}

fn main() {
    println!(
        "## CPU attention (causal, packed qkv)\n\n{}\n",
        machine_line()
    );
    println!("| b×h×t×d | pass | median µs | best µs | GFLOP/s (causal) | reps |");
    println!("|---|---|---:|---:|---:|---:|");
    for [b, h, t, d] in shapes() {
        let mut rng = Rng::new(7);
        let qkv = Tensor::randn(
            &[b, t, 3 * h * d],
            0.0,
            1.0,
            &mut rng,
            DType::F32,
            Device::Cpu,
        )
        .and_then(|x| x.to_var())
        .expect("qkv");
        let scale = 1.0 / (d as f32).sqrt();
        // One product's causal flops over all heads: t·(t + 1)/2 scores of d multiply-adds.
        let half = (b * h) as f64 * (t * (t + 1) / 2) as f64 * d as f64 * 2.0;
        let fwd = || {
            let _g = sinter_core::no_grad();
            attention_packed(&qkv, h, true, scale).expect("forward");
        };
        let both = || {
            let y = attention_packed(&qkv, h, true, scale).expect("forward");
            y.sum_all().and_then(|s| s.backward()).expect("backward");
            qkv.zero_grad();
        };
        let _hot = HotWorkers::engage();
        for (pass, flops, f) in [
            ("forward", 2.0 * half, &fwd as &dyn Fn()),
            ("forward + backward", 7.0 * half, &both as &dyn Fn()),
        ] {
            let s = Stats::merge(
                &(0..rounds())
                    .map(|_| time_it(3, budget(), 5, 100_000, f))
                    .collect::<Vec<_>>(),
            );
            println!(
                "| {b}×{h}×{t}×{d} | {pass} | {:.1} | {:.1} | {:.1} | {} |",
                s.median() * 1e6,
                s.best() * 1e6,
                flops / s.median() / 1e9,
                s.reps()
            );
        }
    }
}
