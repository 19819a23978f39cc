//! GPT's fast path and generation: fused kernels give the composite's logits, loss and
//! gradients; recompute gives the same gradients; the KV cache gives the full forward's
//! logits token by token, and cached generation picks the same tokens as recomputation.

use std::time::Instant;

use sinter_core::{no_grad, DType, Device, Rng, Tensor};
use sinter_models::decoder::{sample_token, KvCache};
use sinter_models::{Decoder, DecoderConfig};
use sinter_nn::module::shared_rng;
use sinter_nn::{Module, Recompute};

fn small() -> DecoderConfig {
    DecoderConfig {
        n_layer: 2,
        n_head: 4,
        n_embd: 32,
        block_size: 40,
        vocab_size: 37,
        dropout: 0.0,
        ..Default::default()
    }
}

fn model(cfg: DecoderConfig, seed: u64) -> Decoder {
    let m = Decoder::new(cfg, &mut Rng::new(seed), &shared_rng(seed)).unwrap();
    m.set_training(false);
    m
}

fn ids(b: usize, t: usize, vocab: usize, seed: u64) -> Vec<i64> {
    let mut r = Rng::new(seed);
    (0..b * t).map(|_| r.below(vocab as u64) as i64).collect()
}

fn tensor(v: &[i64], b: usize, t: usize) -> Tensor {
    Tensor::from_slice(v, &[b, t], Device::Cpu).unwrap()
}

fn vals(t: &Tensor) -> Vec<f32> {
    t.to_vec_f32().unwrap()
}

fn max_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

fn scale(v: &[f32]) -> f32 {
    v.iter().fold(1e-3f32, |m, x| m.max(x.abs()))
}

/// (logits, loss, gradients by name) of one training step's forward and backward.
type Step = (Vec<f32>, f32, Vec<(String, Vec<f32>)>);

fn step(m: &Decoder, x: &Tensor, y: &Tensor) -> Step {
    m.zero_grad();
    let logits = m.forward(x).unwrap();
    let loss = logits.cross_entropy(y, -100).unwrap();
    loss.backward().unwrap();
    let grads = m
        .parameters()
        .into_iter()
        .map(|(n, p)| {
            (
                n.clone(),
                vals(&p.grad().unwrap_or_else(|| panic!("{n}: no gradient"))),
            )
        })
        .collect();
    (vals(&logits), loss.to_scalar_f32().unwrap(), grads)
}

#[test]
fn fast_path_matches_the_composite_gpt() {
    let mut m = model(small(), 1);
    let (b, t) = (3, 40);
    let x = tensor(&ids(b, t, 37, 2), b, t);
    let y = tensor(&ids(b, t, 37, 3), b, t);
    assert!(m.fast_path());
    let fused = step(&m, &x, &y);
    m.set_fast_path(false);
    let composite = step(&m, &x, &y);
    let e = max_err(&fused.0, &composite.0);
    assert!(e <= 1e-5 * scale(&composite.0), "logits differ by {e}");
    assert!(
        (fused.1 - composite.1).abs() <= 1e-6 * composite.1.abs(),
        "loss {} vs {}",
        fused.1,
        composite.1
    );
    for ((n, a), (_, b)) in fused.2.iter().zip(&composite.2) {
        let e = max_err(a, b);
        assert!(
            e <= 1e-4 * scale(b),
            "{n}: gradients differ by {e} (scale {})",
            scale(b)
        );
    }
}

#[test]
fn recompute_modes_give_the_same_loss_and_gradients() {
    for dropout in [0.0, 0.1] {
        let cfg = DecoderConfig { dropout, ..small() };
        let drop_rng = shared_rng(4);
        let mut m = Decoder::new(cfg, &mut Rng::new(1), &drop_rng).unwrap();
        let (b, t) = (2, 33);
        let x = tensor(&ids(b, t, 37, 5), b, t);
        let y = tensor(&ids(b, t, 37, 6), b, t);
        let mut runs = Vec::new();
        for mode in [Recompute::None, Recompute::Attn, Recompute::Block] {
            m.set_recompute(mode);
            *drop_rng.lock().unwrap() = Rng::new(77);
            runs.push((mode, step(&m, &x, &y)));
        }
        let base = &runs[0].1;
        for (mode, r) in &runs[1..] {
            assert_eq!(r.0, base.0, "dropout {dropout}, recompute {mode}: logits");
            assert_eq!(r.1, base.1, "dropout {dropout}, recompute {mode}: loss");
            for ((n, a), (_, b)) in r.2.iter().zip(&base.2) {
                let e = max_err(a, b);
                assert!(
                    e <= 1e-5 * scale(b),
                    "dropout {dropout}, recompute {mode}, {n}: gradients differ by {e}"
                );
            }
        }
    }
}

#[test]
fn kv_cache_logits_equal_full_forward_token_by_token() {
    let m = model(small(), 7);
    let (b, t) = (2, 40);
    let all = ids(b, t, 37, 8);
    let _g = no_grad();
    let full = m.forward(&tensor(&all, b, t)).unwrap();
    let mut cache: KvCache = m.kv_cache(b).unwrap();
    assert_eq!((cache.len(), cache.capacity()), (0, 40));
    // Prefill 5 positions at once, then one token per step.
    let column = |from: usize, len: usize| -> Tensor {
        let v: Vec<i64> = (0..b)
            .flat_map(|r| all[r * t + from..r * t + from + len].to_vec())
            .collect();
        tensor(&v, b, len)
    };
    let mut at = 0;
    while at < t {
        let len = if at == 0 { 5 } else { 1 };
        let got = m.forward_step(&column(at, len), &mut cache).unwrap();
        let want = full.narrow(1, at, len).unwrap();
        let e = max_err(&vals(&got), &vals(&want));
        assert!(
            e <= 2e-5 * scale(&vals(&want)),
            "positions {at}..{}: logits differ by {e}",
            at + len
        );
        at += len;
    }
    assert_eq!(cache.len(), t);
    assert!(
        m.forward_step(&column(0, 1), &mut cache).is_err(),
        "past the context"
    );
    cache.clear();
    assert!(cache.is_empty());
    let again = m.forward_step(&column(0, 3), &mut cache).unwrap();
    assert!(max_err(&vals(&again), &vals(&full.narrow(1, 0, 3).unwrap())) <= 1e-5);
}

#[test]
fn cached_generation_picks_the_same_tokens() {
    let m = model(small(), 9);
    let prompt = [3i64, 1, 4, 1, 5];
    // Greedy and sampled; 60 new tokens run past the context of 40 (the window slides).
    for (temperature, top_k) in [(0.0, 0), (1.0, 0), (0.8, 5)] {
        let a = m
            .generate(&prompt, 60, temperature, top_k, &mut Rng::new(11))
            .unwrap();
        let b = m
            .generate_uncached(&prompt, 60, temperature, top_k, &mut Rng::new(11))
            .unwrap();
        assert_eq!(a.len(), 65);
        assert_eq!(&a[..5], &prompt);
        assert_eq!(a, b, "temperature {temperature}, top-k {top_k}");
    }
    assert!(m.generate(&[], 3, 1.0, 0, &mut Rng::new(0)).is_err());
    // A shorter context than the model's.
    let a = m
        .generate_with(&prompt, 20, 0.0, 0, 8, true, &mut Rng::new(0))
        .unwrap();
    let b = m
        .generate_with(&prompt, 20, 0.0, 0, 8, false, &mut Rng::new(0))
        .unwrap();
    assert_eq!(a, b);
}

#[test]
fn sample_token_greedy_and_top_k() {
    let logits = [0.1f32, 2.0, -1.0, 1.9];
    assert_eq!(sample_token(&logits, 0.0, 0, &mut Rng::new(0)), 1);
    for s in 0..50 {
        let t = sample_token(&logits, 1.0, 2, &mut Rng::new(s));
        assert!(t == 1 || t == 3, "top-2 sampled {t}");
    }
}

/// Times 200 generated tokens with and without the KV cache on gpt-tiny's shapes (4 layers,
/// 4 heads, width 128, vocab 256). gpt-tiny's context is 64, so past 64 tokens the window
/// slides and both paths recompute it; the first run uses a 256-token context (every token
/// is one cached step), the second the real 64. Run with
/// `cargo test --release -p sinter-models --test gpt_kv_cache -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_generation_with_and_without_kv_cache() {
    for block_size in [256, 64] {
        let cfg = DecoderConfig {
            block_size,
            ..DecoderConfig::preset("gpt-tiny").unwrap()
        };
        let m = model(cfg, 0);
        let prompt: Vec<i64> = "ROMEO:".bytes().map(|b| b as i64).collect();
        let n = 200;
        let time = |cached: bool| {
            let t0 = Instant::now();
            let out = m
                .generate_with(&prompt, n, 0.0, 0, block_size, cached, &mut Rng::new(0))
                .unwrap();
            (t0.elapsed().as_secs_f64(), out)
        };
        let _ = time(true); // warm-up
        let (tc, a) = time(true);
        let (tu, b) = time(false);
        assert_eq!(a, b);
        eprintln!(
            "gpt-tiny shapes, context {block_size}: {n} tokens with KV cache {:.3} s ({:.2} ms/token), without {:.3} s ({:.2} ms/token): {:.1}x",
            tc,
            tc * 1e3 / n as f64,
            tu,
            tu * 1e3 / n as f64,
            tu / tc
        );
    }
    let _ = DType::F32;
}
