//! Generation loops over one sequence: the streaming one that the CLI and tests use, and the
//! fixed-signature helpers kept from before (`generate`, `generate_uncached`, `generate_with`:
//! temperature and top-k, the `Slide` policy past the context).

use sinter_core::{Result, Rng};

use super::{ContextPolicy, Decoder, SamplingParams};

/// What to generate: how many tokens, how to pick them, and the context.
#[derive(Clone, Copy, Debug)]
pub struct GenerateOptions {
    pub max_new: usize,
    pub sampling: SamplingParams,
    /// Tokens the model conditions on (clamped to block_size).
    pub context: usize,
    pub policy: ContextPolicy,
    /// false: recompute the window for every token (the reference path; same tokens).
    pub use_cache: bool,
}

impl Decoder {
    /// Samples up to `o.max_new` tokens after `prompt`, calling `on_token` with each as soon
    /// as it is picked (it returns false to stop early). Returns prompt and continuation.
    pub fn generate_streaming(
        &self,
        prompt: &[i64],
        o: &GenerateOptions,
        rng: &mut Rng,
        mut on_token: impl FnMut(i64) -> bool,
    ) -> Result<Vec<i64>> {
        let mut seq = self.sequence(prompt, o.max_new, o.context, o.policy, o.use_cache)?;
        for _ in 0..o.max_new {
            let logits = self.next_logits(&mut seq)?;
            let t = o.sampling.sample(&logits, rng) as i64;
            seq.push(t);
            if !on_token(t) {
                break;
            }
        }
        Ok(seq.tokens().to_vec())
    }

    /// Samples `max_new` tokens after `prompt` (temperature and top-k as in `sample_token`)
    /// with a KV cache; returns prompt and continuation. The context is the last
    /// `block_size` tokens.
    pub fn generate(
        &self,
        prompt: &[i64],
        max_new: usize,
        temperature: f64,
        top_k: usize,
        rng: &mut Rng,
    ) -> Result<Vec<i64>> {
        let ctx = self.config.block_size;
        self.generate_with(prompt, max_new, temperature, top_k, ctx, true, rng)
    }

    /// `generate` recomputing the whole window for every token (no cache): the reference.
    pub fn generate_uncached(
        &self,
        prompt: &[i64],
        max_new: usize,
        temperature: f64,
        top_k: usize,
        rng: &mut Rng,
    ) -> Result<Vec<i64>> {
        let ctx = self.config.block_size;
        self.generate_with(prompt, max_new, temperature, top_k, ctx, false, rng)
    }

    /// Generation conditioned on exactly the last `context` (≤ block_size) tokens
    /// (`ContextPolicy::Slide`), with or without the KV cache (the same tokens either way).
    #[allow(clippy::too_many_arguments)]
    pub fn generate_with(
        &self,
        prompt: &[i64],
        max_new: usize,
        temperature: f64,
        top_k: usize,
        context: usize,
        use_cache: bool,
        rng: &mut Rng,
    ) -> Result<Vec<i64>> {
        let o = GenerateOptions {
            max_new,
            sampling: SamplingParams {
                temperature,
                top_k,
                top_p: 1.0,
            },
            context,
            policy: ContextPolicy::Slide,
            use_cache,
        };
        self.generate_streaming(prompt, &o, rng, |_| true)
    }
}
