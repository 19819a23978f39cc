//! `sinter bench llm`: prompt processing and greedy generation speed of a pretrained model
//! (GGUF or Hugging Face directory), one JSON line per round, for `bench/llm/vs-transformers`
//! to set beside PyTorch + transformers on the same prompt.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use sinter_models::decoder::ContextPolicy;

#[derive(Args)]
pub struct LlmBenchArgs {
    /// A .gguf file or a Hugging Face model directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt tokens processed at once (pp).
    #[arg(long, default_value_t = 512)]
    pub prompt: usize,
    /// Tokens generated greedily after a short prompt (tg).
    #[arg(long, default_value_t = 128)]
    pub gen: usize,
    /// Rounds of each (one JSON line per round).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Dequantize a GGUF file's weights to f32 (by default its Q8_0/Q4_0/Q4_1/Q4_K/Q6_K
    /// matrices stay in their blocks, as generate and serve run them).
    #[arg(long)]
    pub dequantize: bool,
}

/// The benchmark's prompt: the same ids `bench/llm/vs_transformers.py` feeds transformers,
/// spread over the vocabulary above its first 100 (mostly special) tokens where there are
/// more (their values do not change the work).
fn bench_ids(n: usize, vocab: usize) -> Vec<i64> {
    let (skip, span) = if vocab > 200 {
        (100, vocab - 100)
    } else {
        (0, vocab)
    };
    (0..n)
        .map(|i| ((i * 7919 + 13) % span + skip) as i64)
        .collect()
}

fn argmax(v: &[f32]) -> i64 {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as i64
}

pub fn run(a: &LlmBenchArgs) -> Result<()> {
    let t = Instant::now();
    let weights = crate::serve_cmd::gguf_weights(a.dequantize, sinter_core::Device::Cpu);
    let m = sinter_models::load_pretrained_as(&a.model, weights)?;
    let load_s = t.elapsed().as_secs_f64();
    let packed = m.pack_weights()?;
    let c = &m.config;
    if a.prompt == 0 || a.gen == 0 || a.prompt > c.block_size || 16 + a.gen > c.block_size {
        bail!(
            "bench llm: --prompt {} and 16 + --gen {} must be between 1 and the context of {}",
            a.prompt,
            a.gen,
            c.block_size
        );
    }
    eprintln!(
        "bench llm: {} loaded in {load_s:.2} s ({} layers, width {}, vocab {}; host step {})",
        a.model.display(),
        c.n_layer,
        c.n_embd,
        c.vocab_size,
        if packed { "packed" } else { "not available" }
    );
    for round in 0..a.rounds {
        let ids = bench_ids(a.prompt, c.vocab_size);
        let mut s = m.sequence(&ids, 1, a.prompt + 1, ContextPolicy::Shift, true)?;
        let t = Instant::now();
        m.prefill(&mut s, usize::MAX)?;
        let pp_s = t.elapsed().as_secs_f64();

        let short = bench_ids(16, c.vocab_size);
        let mut s = m.sequence(&short, a.gen, 16 + a.gen, ContextPolicy::Shift, true)?;
        let t = Instant::now();
        let mut logits = m.next_logits(&mut s)?;
        for _ in 1..a.gen {
            s.push(argmax(&logits));
            logits = m.next_logits(&mut s)?;
        }
        let tg_s = t.elapsed().as_secs_f64();
        println!(
            "{{\"engine\":\"sinter\",\"weights\":\"{weights:?}\",\"round\":{round},\"prompt_tokens\":{},\"prompt_s\":{pp_s:.4},\"prompt_tok_s\":{:.2},\"gen_tokens\":{},\"gen_s\":{tg_s:.4},\"gen_tok_s\":{:.2}}}",
            a.prompt,
            a.prompt as f64 / pp_s,
            a.gen,
            a.gen as f64 / tg_s
        );
    }
    Ok(())
}
