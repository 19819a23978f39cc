//! Continuous batching and generation past the context: a batched decode step of sequences
//! with different lengths (joining and leaving between steps) gives each sequence the logits
//! and greedy tokens it gets alone; chunked prefill equals a whole one; both context policies
//! give the same tokens with and without the KV cache, and keep the window they promise.

use sinter_core::{no_grad, Device, Rng, Tensor};
use sinter_models::decoder::{ContextPolicy, DecoderSequence, GenerateOptions, SamplingParams};
use sinter_models::{Decoder, DecoderConfig};
use sinter_nn::module::shared_rng;
use sinter_nn::Module;

fn model(block_size: usize, seed: u64) -> Decoder {
    let cfg = DecoderConfig {
        n_layer: 2,
        n_head: 4,
        n_embd: 32,
        block_size,
        vocab_size: 37,
        dropout: 0.0,
        ..Default::default()
    };
    let m = Decoder::new(cfg, &mut Rng::new(seed), &shared_rng(seed)).unwrap();
    m.set_training(false);
    m
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b })
}

fn max_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Logits of the last position of `tokens`, by a full forward (no cache).
fn full_logits(m: &Decoder, tokens: &[i64]) -> Vec<f32> {
    let _g = no_grad();
    let x = Tensor::from_slice(tokens, &[1, tokens.len()], Device::Cpu).unwrap();
    let y = m.forward(&x).unwrap();
    y.narrow(1, tokens.len() - 1, 1)
        .unwrap()
        .to_vec_f32()
        .unwrap()
}

#[test]
fn batched_decode_equals_each_sequence_alone() {
    let m = model(48, 1);
    let v = 37;
    let prompts: Vec<Vec<i64>> = [1usize, 7, 20, 3]
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|j| ((i * 11 + j * 5) % v) as i64).collect())
        .collect();
    // Sequence i joins at step join[i] and leaves after `steps[i]` tokens.
    let join = [0usize, 0, 2, 5];
    let steps = [12usize, 4, 9, 10];
    let mut seqs: Vec<Option<DecoderSequence>> = prompts.iter().map(|_| None).collect();
    let mut batched_tokens: Vec<Vec<i64>> = vec![Vec::new(); prompts.len()];
    let mut sizes_seen = std::collections::BTreeSet::new();
    for step in 0..20 {
        // Join: prefill (in chunks of 3 positions) and pick the first token from it.
        for i in 0..prompts.len() {
            if join[i] == step {
                let mut s = m
                    .sequence(&prompts[i], steps[i], 48, ContextPolicy::Shift, true)
                    .unwrap();
                let logits = loop {
                    if let Some(l) = m.prefill(&mut s, 3).unwrap() {
                        break l;
                    }
                };
                let e = max_err(&logits, &full_logits(&m, s.tokens()));
                assert!(e < 1e-4, "prefill of sequence {i}: {e}");
                s.push(argmax(&logits) as i64);
                seqs[i] = Some(s);
            }
        }
        // One decode step for every active sequence, all together.
        let active: Vec<usize> = (0..prompts.len())
            .filter(|&i| {
                seqs[i]
                    .as_ref()
                    .is_some_and(|s| s.generated().len() < steps[i])
            })
            .collect();
        if active.is_empty() {
            continue;
        }
        sizes_seen.insert(active.len());
        let want: Vec<Vec<f32>> = active
            .iter()
            .map(|&i| full_logits(&m, seqs[i].as_ref().unwrap().tokens()))
            .collect();
        let mut refs: Vec<&mut DecoderSequence> = Vec::new();
        for (i, s) in seqs.iter_mut().enumerate() {
            if active.contains(&i) {
                refs.push(s.as_mut().unwrap());
            }
        }
        let logits = m.decode(&mut refs).unwrap();
        for (r, &i) in active.iter().enumerate() {
            let row = &logits[r * v..(r + 1) * v];
            let e = max_err(row, &want[r]);
            assert!(e < 1e-4, "step {step}, sequence {i}: logits differ by {e}");
            refs[r].push(argmax(row) as i64);
        }
    }
    assert!(sizes_seen.len() >= 3, "batch sizes {sizes_seen:?}");
    for (i, s) in seqs.iter().enumerate() {
        let s = s.as_ref().unwrap();
        batched_tokens[i] = s.generated().to_vec();
        // The same greedy tokens alone, through the generation loop.
        let o = GenerateOptions {
            max_new: steps[i],
            sampling: SamplingParams {
                temperature: 0.0,
                ..Default::default()
            },
            context: 48,
            policy: ContextPolicy::Shift,
            use_cache: true,
        };
        let alone = m
            .generate_streaming(&prompts[i], &o, &mut Rng::new(0), |_| true)
            .unwrap();
        assert_eq!(
            &alone[prompts[i].len()..],
            &batched_tokens[i][..],
            "sequence {i}"
        );
    }
}

#[test]
fn decode_refuses_sequences_that_need_a_prefill() {
    let m = model(16, 2);
    let mut a = m
        .sequence(&[1, 2, 3], 4, 16, ContextPolicy::Shift, true)
        .unwrap();
    assert!(!a.is_decoding() && a.can_feed());
    // Without a cache, only a prefill (the whole window) can run.
    let mut b = m
        .sequence(&[1, 2, 3], 4, 16, ContextPolicy::Shift, false)
        .unwrap();
    assert!(!b.can_feed());
    let err = m.decode(&mut [&mut a, &mut b]).unwrap_err().to_string();
    assert!(err.contains("prefill"), "{err}");
    assert!(m.sequence(&[], 4, 16, ContextPolicy::Shift, true).is_err());
    let err = m
        .sequence(&[1, 99], 4, 16, ContextPolicy::Shift, true)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("99") && err.contains("vocabulary"), "{err}");
}

#[test]
fn both_policies_give_the_same_tokens_with_and_without_cache() {
    let m = model(12, 3);
    let prompt = [3i64, 1, 4, 1, 5];
    for policy in [ContextPolicy::Slide, ContextPolicy::Shift] {
        for sampling in [
            SamplingParams {
                temperature: 0.0,
                ..Default::default()
            },
            SamplingParams {
                temperature: 0.9,
                top_k: 10,
                top_p: 0.95,
            },
        ] {
            let run = |use_cache| {
                let o = GenerateOptions {
                    max_new: 40,
                    sampling,
                    context: 12,
                    policy,
                    use_cache,
                };
                m.generate_streaming(&prompt, &o, &mut Rng::new(4), |_| true)
                    .unwrap()
            };
            let (a, b) = (run(true), run(false));
            assert_eq!(a.len(), 45);
            assert_eq!(a, b, "{policy}, {sampling:?}");
        }
    }
}

#[test]
fn windows_follow_the_policy() {
    let m = model(8, 4);
    for (policy, lo) in [(ContextPolicy::Slide, 8), (ContextPolicy::Shift, 4)] {
        let mut s = m.sequence(&[1, 2, 3], 30, 8, policy, true).unwrap();
        let mut prefills = 0;
        for t in 0..30 {
            if !s.is_decoding() {
                prefills += 1;
            }
            let logits = m.next_logits(&mut s).unwrap();
            // The logits are the model's on exactly the window.
            let e = max_err(&logits, &full_logits(&m, s.window()));
            assert!(e < 1e-4, "{policy}, token {t}: {e}");
            s.push(argmax(&logits) as i64);
            let w = s.window().len();
            assert!(
                w <= 8 && (s.tokens().len() < 8 || w >= lo),
                "{policy}: window {w}"
            );
            assert_eq!(s.window(), &s.tokens()[s.tokens().len() - w..]);
        }
        // Slide re-encodes the window for every token past the context; shift once per
        // half-window.
        match policy {
            ContextPolicy::Slide => assert!(prefills >= 30 - 8, "{prefills}"),
            ContextPolicy::Shift => assert!(prefills <= 1 + 30 / 4, "{prefills}"),
        }
    }
}

/// A sequence started on another's used cache (`sequence_reusing`, as the server does)
/// decodes exactly as on a fresh one: the stale keys and values beyond its length are never
/// read. The pool gives the smallest cache that holds the window, and keeps its caches when
/// the prompt is refused.
#[test]
fn a_reused_cache_decodes_as_a_fresh_one() {
    let m = model(24, 6);
    let run = |s: &mut DecoderSequence, n: usize| -> Vec<Vec<f32>> {
        (0..n)
            .map(|_| {
                let logits = m.next_logits(s).unwrap();
                s.push(argmax(&logits) as i64);
                logits
            })
            .collect()
    };
    // Fill a cache with another sequence's keys and values, past the context once.
    let mut other = m
        .sequence(&[5, 4, 3, 2, 1, 0, 9], 40, 24, ContextPolicy::Shift, true)
        .unwrap();
    run(&mut other, 30);
    let small = m.kv_cache_with_capacity(1, 6).unwrap();
    let mut spare = vec![other.into_cache().unwrap(), small];
    assert_eq!(spare[0].capacity(), 24);
    // Window of 3 + 10 tokens: the 6-position cache is too small, the used 24 one fits.
    let mut reused = m
        .sequence_reusing(&[11, 12, 13], 10, 24, ContextPolicy::Shift, &mut spare)
        .unwrap();
    assert_eq!(spare.len(), 1);
    assert_eq!(spare[0].capacity(), 6);
    assert_eq!(reused.cached(), 0);
    let mut fresh = m
        .sequence(&[11, 12, 13], 10, 24, ContextPolicy::Shift, true)
        .unwrap();
    assert_eq!(run(&mut reused, 10), run(&mut fresh, 10));
    // A 2 + 3 token window takes the small one; a refused prompt takes nothing.
    assert!(m
        .sequence_reusing(&[99], 3, 24, ContextPolicy::Shift, &mut vec![])
        .is_err());
    let mut bad = vec![m.kv_cache_with_capacity(1, 6).unwrap()];
    assert!(m
        .sequence_reusing(&[1, 99], 3, 24, ContextPolicy::Shift, &mut bad)
        .is_err());
    assert_eq!(bad.len(), 1);
    let s = m
        .sequence_reusing(&[1, 2], 3, 24, ContextPolicy::Shift, &mut spare)
        .unwrap();
    assert!(spare.is_empty());
    assert_eq!(s.cache().unwrap().capacity(), 6);
}

#[test]
fn a_short_cache_grows_when_the_sequence_runs_longer_than_announced() {
    let m = model(16, 5);
    // Announced 2 new tokens (cache of 5 positions), generates 20: past 5, then past 16.
    let mut s = m
        .sequence(&[7, 8, 9], 2, 16, ContextPolicy::Shift, true)
        .unwrap();
    for _ in 0..20 {
        let logits = m.next_logits(&mut s).unwrap();
        assert!(max_err(&logits, &full_logits(&m, s.window())) < 1e-4);
        s.push(argmax(&logits) as i64);
    }
}

#[test]
fn a_prompt_fed_through_decode_steps_gives_its_prefill_logits() {
    let m = model(32, 6);
    let v = 37;
    // A is decoding; B's prompt of 5 tokens joins A's steps one token at a time.
    let mut a = m
        .sequence(&[1, 2, 3], 20, 32, ContextPolicy::Shift, true)
        .unwrap();
    let first = m.prefill(&mut a, usize::MAX).unwrap().unwrap();
    a.push(argmax(&first) as i64);
    let prompt = [4i64, 8, 15, 16, 23];
    let mut b = m
        .sequence(&prompt, 20, 32, ContextPolicy::Shift, true)
        .unwrap();
    assert!(b.can_feed() && !b.is_decoding());
    for k in 0..prompt.len() {
        assert_eq!(b.pending().len(), prompt.len() - k);
        let logits = m.decode(&mut [&mut a, &mut b]).unwrap();
        let want_a = full_logits(&m, a.tokens());
        assert!(max_err(&logits[..v], &want_a) < 1e-4);
        a.push(argmax(&logits[..v]) as i64);
        if k + 1 == prompt.len() {
            assert!(b.pending().is_empty());
            let e = max_err(&logits[v..], &full_logits(&m, &prompt));
            assert!(e < 1e-4, "{e}");
        }
    }
    // Nothing pending: no decode step for it.
    assert!(!b.can_feed());
    assert!(m.decode(&mut [&mut b]).is_err());
}

/// gpt-tiny's shapes (width 128, 4 heads of 32: whole AVX-512 vectors), trained-scale weights.
fn tiny_model(block_size: usize, seed: u64) -> Decoder {
    let cfg = DecoderConfig {
        block_size,
        vocab_size: 64,
        ..DecoderConfig::preset("gpt-tiny").unwrap()
    };
    let m = Decoder::new(cfg, &mut Rng::new(seed), &shared_rng(seed)).unwrap();
    m.set_training(false);
    m
}

/// On the CPU, prefills and decode steps run the host step (`decoder/host_step.rs`); the tensor
/// path (`forward_step`) is the reference: same logits within f32 rounding, and the same keys
/// and values in the caches.
#[test]
fn the_host_step_equals_the_tensor_path() {
    host_step_against_tensor_path(&tiny_model(40, 8), 1e-4);
}

/// With its weights packed for the GEMMs (`Decoder::pack_weights`, as the server does) the host
/// step still equals the tensor path; after every weight moves in place (as in a training
/// step) the step notices and reads the new weights, not the stale packs.
#[test]
fn the_host_step_with_packed_weights_equals_the_tensor_path() {
    let m = tiny_model(40, 8);
    assert!(m.pack_weights().unwrap());
    host_step_against_tensor_path(&m, 1e-4);
    let _g = no_grad();
    for (_, p) in m.parameters() {
        p.assign(&p.add_scalar(0.01).unwrap()).unwrap();
    }
    host_step_against_tensor_path(&m, 1e-4);
}

/// One value of one packed weight edited in place (a change no sample of the values would
/// see) is enough: the step reads the edited weight, not the stale packs.
#[test]
fn one_edited_value_invalidates_the_packed_weights() {
    let m = tiny_model(40, 8);
    assert!(m.pack_weights().unwrap());
    let _g = no_grad();
    let (_, w) = (m.parameters().into_iter())
        .find(|(n, _)| n == "blocks.0.mlp.proj.weight")
        .expect("the first block's output projection");
    let mut v = w.to_vec_f32().unwrap();
    v[0] += 3.0;
    let edited = Tensor::from_vec(v, w.shape(), Device::Cpu).unwrap();
    w.assign(&edited).unwrap();
    host_step_against_tensor_path(&m, 1e-4);
}

/// A 32-token prefill with packed weights splits into two parts of 16 rows, each one packed
/// tile of 12 rows and 4 rows over the weights in place: still the tensor path's logits.
#[test]
fn a_packed_prefill_of_tiles_and_a_tail_equals_the_tensor_path() {
    let m = tiny_model(40, 12);
    assert!(m.pack_weights().unwrap());
    let prompt: Vec<i64> = (0..32).map(|j| (j * 5 % 64) as i64).collect();
    let mut s = m
        .sequence(&prompt, 4, 40, ContextPolicy::Shift, true)
        .unwrap();
    let got = m.prefill(&mut s, usize::MAX).unwrap().unwrap();
    let mut cache = m.kv_cache(1).unwrap();
    let x = Tensor::from_slice(&prompt, &[1, 32], Device::Cpu).unwrap();
    let y = m.forward_step(&x, &mut cache).unwrap();
    let want = y.narrow(1, 31, 1).unwrap().to_vec_f32().unwrap();
    let e = max_err(&got, &want);
    assert!(e < 1e-4, "{e}");
}

/// The same with every Linear and Embedding int8 (`quant::quantize`): the host step runs the
/// int8 forms on its rows, the tensor path through the layers; the same int8 kernels, so
/// the logits agree up to the rare activation whose int8 rounding flips.
#[test]
fn the_int8_host_step_equals_the_int8_tensor_path() {
    let m = tiny_model(40, 10);
    let report = sinter_nn::quant::quantize(&m, &mut |_| Ok(())).unwrap();
    assert!(report.int8.len() >= 4 * 4 + 2, "{:?}", report.int8);
    host_step_against_tensor_path(&m, 2e-2);
}

/// `tol` bounds the logits' and the cached keys/values' differences: f32 rounding for an f32
/// model; for an int8 one, a rounding-order difference upstream can flip an activation's u8
/// rounding, which moves a key or value by about one quantization step (seen with the
/// scalar f32 GEMM: 0.003).
fn host_step_against_tensor_path(m: &Decoder, tol: f32) {
    let v = 64;
    // Nine sequences (a step of 8 rows or more is split across two threads: between
    // sequences here, inside the 20-token prompt's prefill).
    let lens = [7usize, 1, 4, 20, 2, 3, 5, 9, 1];
    let prompts: Vec<Vec<i64>> = (lens.iter().enumerate())
        .map(|(i, &n)| (0..n).map(|j| ((i * 13 + j * 7) % v) as i64).collect())
        .collect();
    let mut seqs: Vec<DecoderSequence> = prompts
        .iter()
        .map(|p| m.sequence(p, 30, 40, ContextPolicy::Shift, true).unwrap())
        .collect();
    let mut refs: Vec<sinter_models::decoder::KvCache> =
        prompts.iter().map(|_| m.kv_cache(1).unwrap()).collect();
    let step = |cache: &mut sinter_models::decoder::KvCache, ids: &[i64]| -> Vec<f32> {
        let x = Tensor::from_slice(ids, &[1, ids.len()], Device::Cpu).unwrap();
        let y = m.forward_step(&x, cache).unwrap();
        y.narrow(1, ids.len() - 1, 1).unwrap().to_vec_f32().unwrap()
    };
    for (i, s) in seqs.iter_mut().enumerate() {
        let got = m.prefill(s, usize::MAX).unwrap().unwrap();
        let want = step(&mut refs[i], &prompts[i]);
        let e = max_err(&got, &want);
        assert!(e < tol, "prefill {i}: {e}");
        s.push(argmax(&want) as i64);
    }
    for t in 0..12 {
        let mut batch: Vec<&mut DecoderSequence> = seqs.iter_mut().collect();
        let logits = m.decode(&mut batch).unwrap();
        for (i, s) in batch.into_iter().enumerate() {
            let want = step(&mut refs[i], &s.tokens()[s.tokens().len() - 1..]);
            let row = &logits[i * v..(i + 1) * v];
            let e = max_err(row, &want);
            assert!(e < tol, "step {t}, sequence {i}: {e}");
            // Both continue with the reference's token.
            s.push(argmax(&want) as i64);
        }
    }
    for (i, (s, r)) in seqs.iter().zip(&refs).enumerate() {
        let c = s.cache().unwrap();
        assert_eq!(c.len(), r.len());
        for (l, (a, b)) in c.layers.iter().zip(&r.layers).enumerate() {
            let n = c.len();
            for (x, y) in [(&a.k, &b.k), (&a.v, &b.v)] {
                let (x, y) = (x.narrow(2, 0, n).unwrap(), y.narrow(2, 0, n).unwrap());
                let e = max_err(&x.to_vec_f32().unwrap(), &y.to_vec_f32().unwrap());
                assert!(
                    e < tol,
                    "sequence {i}, layer {l}: cached keys/values differ by {e}"
                );
            }
        }
    }
}

/// Greedy and sampled generation on the host step give the tokens of the uncached reference
/// (a full forward over the window per token), past the context too.
#[test]
fn host_generation_gives_the_reference_tokens() {
    let m = tiny_model(24, 9);
    for policy in [ContextPolicy::Slide, ContextPolicy::Shift] {
        for temperature in [0.0, 0.8] {
            let [cached, uncached] = generate_both_ways(&m, policy, temperature);
            assert_eq!(cached, uncached, "{policy}, temperature {temperature}");
        }
    }
}

/// 40 tokens after a fixed prompt at context 24, with the KV cache (the host step) and
/// without (a full forward over the window per token).
fn generate_both_ways(m: &Decoder, policy: ContextPolicy, temperature: f64) -> [Vec<i64>; 2] {
    let prompt = [3i64, 1, 4, 1, 5, 9, 2, 6];
    [true, false].map(|use_cache| {
        let o = GenerateOptions {
            max_new: 40,
            sampling: SamplingParams {
                temperature,
                ..Default::default()
            },
            context: 24,
            policy,
            use_cache,
        };
        m.generate_streaming(&prompt, &o, &mut Rng::new(11), |_| true)
            .unwrap()
    })
}

/// A Llama-family model with every option the block takes (RMSNorm, SwiGLU, rotary positions
/// with Llama 3's scaling, 4 query heads sharing 2 kv heads, qkv bias, QK-norm, an untied
/// head), its norms' and biases' weights drawn at random so that none is an identity.
fn llama_model(block_size: usize, seed: u64) -> Decoder {
    use sinter_nn::transformer::{RopeConfig, RopeScaling};
    let base = DecoderConfig::preset("llama-tiny").unwrap();
    let cfg = DecoderConfig {
        block_size,
        vocab_size: 64,
        arch: sinter_models::DecoderArch {
            qkv_bias: true,
            qk_norm: true,
            rope: Some(RopeConfig {
                theta: 500_000.0,
                scaling: RopeScaling::Llama3 {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position: 16.0,
                },
            }),
            ..base.arch.clone()
        },
        ..base
    };
    let m = Decoder::new(cfg, &mut Rng::new(seed), &shared_rng(seed)).unwrap();
    m.set_training(false);
    let _g = no_grad();
    let mut rng = Rng::new(seed + 100);
    for (_, p) in m.parameters() {
        if p.rank() == 1 {
            let n = p.shape()[0];
            let f32 = sinter_core::DType::F32;
            let noise = Tensor::randn(&[n], 0.0, 0.2, &mut rng, f32, Device::Cpu).unwrap();
            p.assign(&p.add(&noise).unwrap()).unwrap();
        }
    }
    m
}

/// The host step runs the Llama block too (it is an executor of the one block, not GPT-2's
/// copy): prefills and decode steps equal the tensor path, with weights in place, packed,
/// and int8.
#[test]
fn the_host_step_runs_the_llama_block_like_the_tensor_path() {
    let m = llama_model(40, 21);
    assert!(m.lm_head.is_some() && m.wpe.is_none());
    host_step_against_tensor_path(&m, 1e-4);
    assert!(
        m.pack_weights().unwrap(),
        "the host step must take this model"
    );
    host_step_against_tensor_path(&m, 1e-4);
    let report = sinter_nn::quant::quantize(&m, &mut |_| Ok(())).unwrap();
    assert!(!report.int8.is_empty());
    host_step_against_tensor_path(&m, 2e-2);
}

/// Llama generation on the host step gives the uncached reference's tokens, past the
/// context (the shifted window re-rotates every key).
#[test]
fn llama_host_generation_gives_the_reference_tokens() {
    let m = llama_model(24, 22);
    for policy in [ContextPolicy::Slide, ContextPolicy::Shift] {
        let [cached, uncached] = generate_both_ways(&m, policy, 0.0);
        assert_eq!(cached, uncached, "{policy}");
    }
}
