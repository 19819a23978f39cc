//! Generation speed on the CPU, random weights:
//!
//! * one sequence (batch 1), gpt-tiny shapes: tokens/s for 200 and 1000 new tokens at
//!   context 64 and 256, with the `slide` policy (past the context, the window is re-encoded
//!   for every token: exact sliding window) and `shift` (a full window drops its older half
//!   and re-encodes the newer half once), and without the KV cache (the reference);
//! * continuous batching: one decode step of n sequences (each 32 positions cached, its own
//!   cache) for n = 1, 4, 16, 64 → tokens/s, on gpt-tiny and GPT-2 124M shapes.
//!
//!     cargo bench -p sinter-models --bench generate [-- batch|single]
//!
//! Rounds alternate the compared cases; `SINTER_BENCH_SECS` / `SINTER_BENCH_ROUNDS` as in
//! the other benches.

#[path = "../../sinter-core/benches/common/mod.rs"]
mod common;

use common::{budget, machine_line, rounds, time_it, Stats};
use sinter_core::Rng;
use sinter_models::decoder::{ContextPolicy, DecoderSequence, GenerateOptions, SamplingParams};
use sinter_models::{Decoder, DecoderConfig};
use sinter_nn::module::shared_rng;
use sinter_nn::Module;

fn model(preset: &str, block_size: usize) -> Decoder {
    let cfg = DecoderConfig {
        block_size,
        ..DecoderConfig::preset(preset).unwrap()
    };
    let m = Decoder::new(cfg, &mut Rng::new(0), &shared_rng(0)).unwrap();
    m.set_training(false);
    m
}

fn single() {
    println!("### One sequence, gpt-tiny shapes (4 layers, width 128, vocab 256), greedy, prompt \"ROMEO:\"");
    println!();
    println!(
        "| context | new tokens | path | median s | tokens/s (median) | tokens/s (best) | runs |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|");
    let prompt: Vec<i64> = "ROMEO:".bytes().map(i64::from).collect();
    for context in [64usize, 256] {
        let m = model("gpt-tiny", context);
        for n in [200usize, 1000] {
            let paths: [(&str, ContextPolicy, bool); 3] = [
                ("KV cache, slide", ContextPolicy::Slide, true),
                ("KV cache, shift", ContextPolicy::Shift, true),
                ("no cache, slide", ContextPolicy::Slide, false),
            ];
            let mut stats: Vec<Vec<Stats>> = vec![Vec::new(); paths.len()];
            for _ in 0..rounds() {
                for (i, &(_, policy, use_cache)) in paths.iter().enumerate() {
                    let o = GenerateOptions {
                        max_new: n,
                        sampling: SamplingParams {
                            temperature: 0.0,
                            ..Default::default()
                        },
                        context,
                        policy,
                        use_cache,
                    };
                    // The uncached path is slow: fewer repetitions.
                    let max = if use_cache { 1000 } else { 3 };
                    stats[i].push(time_it(1, budget(), 2, max, || {
                        let out = m
                            .generate_streaming(&prompt, &o, &mut Rng::new(0), |_| true)
                            .unwrap();
                        assert_eq!(out.len(), prompt.len() + n);
                    }));
                }
            }
            for ((name, _, _), s) in paths.iter().zip(&stats) {
                let s = Stats::merge(s);
                println!(
                    "| {context} | {n} | {name} | {:.4} | {:.0} | {:.0} | {} |",
                    s.median(),
                    n as f64 / s.median(),
                    n as f64 / s.best(),
                    s.reps()
                );
            }
        }
    }
    println!();
}

/// n sequences with `cached` positions each, ready to decode.
fn sequences(m: &Decoder, n: usize, cached: usize) -> Vec<DecoderSequence> {
    let v = m.config.vocab_size;
    (0..n)
        .map(|i| {
            let prompt: Vec<i64> = (0..cached).map(|j| ((i * 7 + j * 13) % v) as i64).collect();
            let mut s = m
                .sequence(
                    &prompt,
                    1 << 20,
                    m.config.block_size,
                    ContextPolicy::Shift,
                    true,
                )
                .unwrap();
            m.prefill(&mut s, usize::MAX).unwrap();
            s.push(1);
            s
        })
        .collect()
}

fn batch() {
    println!("### One decode step of n sequences (32 cached positions each, its own KV cache)");
    println!();
    println!(
        "| model | n | step median ms | tokens/s (median) | tokens/s (best) | vs n = 1 | steps |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    // "packed": the weights packed once for the GEMMs (`Decoder::pack_weights`, as the server).
    for (preset, packed, sizes) in [
        ("gpt-tiny", false, &[1usize, 4, 16, 64][..]),
        ("gpt-tiny", true, &[1usize, 4, 16, 64][..]),
        ("gpt2", false, &[1, 4, 16][..]),
        ("gpt2", true, &[1, 4, 16][..]),
    ] {
        let m = model(preset, 128);
        let preset = if packed {
            assert!(m.pack_weights().unwrap());
            format!("{preset} packed")
        } else {
            preset.to_string()
        };
        let mut base = 0.0;
        for &n in sizes {
            // A step appends to the caches: start each timed step from a fresh copy.
            let template = sequences(&m, n, 32);
            let mut stats = Vec::new();
            for _ in 0..rounds() {
                let mut seqs = sequences(&m, n, 32);
                let mut steps = 0;
                stats.push(time_it(2, budget(), 5, 60, || {
                    if steps == 60 {
                        seqs = sequences(&m, n, 32);
                        steps = 0;
                    }
                    let mut refs: Vec<&mut DecoderSequence> = seqs.iter_mut().collect();
                    std::hint::black_box(m.decode(&mut refs).unwrap());
                    for s in refs {
                        s.push(2);
                    }
                    steps += 1;
                }));
            }
            drop(template);
            let s = Stats::merge(&stats);
            let tps = n as f64 / s.median();
            if n == 1 {
                base = tps;
            }
            println!(
                "| {preset} | {n} | {:.3} | {:.0} | {:.0} | {:.2}× | {} |",
                s.median() * 1e3,
                tps,
                n as f64 / s.best(),
                tps / base,
                s.reps()
            );
        }
    }
    println!();
}

/// One token of one sequence at positions 32..92: the general step (`forward_step`: [b, s] with
/// head transposes, the prefill path) against the batched decode step at n = 1, interleaved.
fn one_token() {
    println!("### One token, one sequence, positions 32..92: forward_step vs decode");
    println!();
    println!("| model | forward_step median µs | decode median µs | ratio |");
    println!("|---|---:|---:|---:|");
    for preset in ["gpt-tiny", "gpt2"] {
        let m = model(preset, 128);
        let ids =
            sinter_core::Tensor::from_slice(&[5i64], &[1, 1], sinter_core::Device::Cpu).unwrap();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..rounds() {
            let mut seq = sequences(&m, 1, 32).pop().unwrap();
            let mut cache = m.kv_cache(1).unwrap();
            let prompt: Vec<i64> = (0..32).collect();
            let p = sinter_core::Tensor::from_slice(&prompt, &[1, 32], sinter_core::Device::Cpu)
                .unwrap();
            m.forward_step(&p, &mut cache).unwrap();
            // 60 tokens each, positions 32..92 on both sides.
            a.push(time_it(0, budget(), 60, 60, || {
                let y = m.forward_step(&ids, &mut cache).unwrap();
                std::hint::black_box(y.to_vec_f32().unwrap());
            }));
            b.push(time_it(0, budget(), 60, 60, || {
                std::hint::black_box(m.decode(&mut [&mut seq]).unwrap());
                seq.push(5);
            }));
        }
        let (a, b) = (Stats::merge(&a), Stats::merge(&b));
        println!(
            "| {preset} | {:.1} | {:.1} | {:.2}× |",
            a.median() * 1e6,
            b.median() * 1e6,
            a.median() / b.median()
        );
    }
    println!();
}

fn main() {
    println!("## Generation (f32, CPU)");
    println!();
    println!(
        "{}; {} round(s) × {:.1} s per case",
        machine_line(),
        rounds(),
        budget().as_secs_f64()
    );
    println!();
    if common::selected("single") {
        single();
    }
    if common::selected("batch") {
        batch();
    }
    if common::selected("one_token") {
        one_token();
    }
}
