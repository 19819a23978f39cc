//! One sequence being generated: its tokens, the window of them that the model conditions on,
//! and that window's KV cache; and what happens when the sequence outgrows the context.
//!
//! GPT learns one embedding per absolute position 0..context. A "rolling" KV cache that keeps
//! the cached keys and values and appends past the end is therefore not the model: the cached
//! entries were computed with the positions their tokens had when they were appended (and, in
//! every layer but the first, from tokens that have since left the window), while a window
//! whose first token is at position 0 has every token at a new position and every key and
//! value different. No reuse of the cache gives the window's logits. Two correct options
//! remain (`ContextPolicy`), each computing the model exactly on the window it states:
//!
//! - `Slide`: every token sees exactly the last `context` tokens. Past the context, each new
//!   token re-encodes the whole window (a prefill of `context` positions per token).
//! - `Shift` (the default for generation past the context): when the window is full, its
//!   older half is dropped and the newer half re-encoded once at positions 0.., after which
//!   tokens are decoded one position at a time again. Each token sees between context/2 and
//!   context tokens; the cost is one half-window prefill per context/2 tokens. This is what
//!   llama.cpp's context shift does for models whose positions cannot be shifted in place.

use std::str::FromStr;

use sinter_core::{bail, Result};

use super::{Decoder, KvCache};

/// How a sequence longer than the context is conditioned (see the module comment).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContextPolicy {
    /// The last `context` tokens, re-encoded for every token past the context.
    Slide,
    /// Drop the older half of a full window and re-encode the newer half once.
    #[default]
    Shift,
}

impl FromStr for ContextPolicy {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "slide" => Ok(ContextPolicy::Slide),
            "shift" => Ok(ContextPolicy::Shift),
            other => Err(format!(
                "unknown context policy '{other}'; valid: shift, slide"
            )),
        }
    }
}

impl std::fmt::Display for ContextPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ContextPolicy::Slide => "slide",
            ContextPolicy::Shift => "shift",
        })
    }
}

/// A prompt and the tokens generated after it, the window the next token is conditioned on
/// (`tokens[start..]`), and that window's KV cache (`None`: the window is recomputed for
/// every token, the reference path). The cache holds `tokens[start..start + cached]`; the
/// rest of the window is pending (one token while decoding, more after a prompt or a shift).
pub struct DecoderSequence {
    tokens: Vec<i64>,
    prompt_len: usize,
    start: usize,
    cache: Option<KvCache>,
    context: usize,
    policy: ContextPolicy,
}

impl Decoder {
    /// A sequence starting from `prompt`, conditioned on at most `context` (≤ block_size)
    /// tokens. With `use_cache` its KV cache holds `capacity` positions: `context`, or less
    /// when the whole sequence (prompt plus `max_new` tokens) is known to be shorter.
    pub fn sequence(
        &self,
        prompt: &[i64],
        max_new: usize,
        context: usize,
        policy: ContextPolicy,
        use_cache: bool,
    ) -> Result<DecoderSequence> {
        if prompt.is_empty() {
            bail!("gpt: generation needs a prompt of at least one token");
        }
        let vocab = self.config.vocab_size as i64;
        if let Some((i, t)) = prompt
            .iter()
            .enumerate()
            .find(|(_, &t)| !(0..vocab).contains(&t))
        {
            bail!("gpt: prompt token {i} is {t}, outside the vocabulary of {vocab}");
        }
        let context = context.clamp(1, self.config.block_size);
        let cache = if use_cache {
            let need = prompt.len().saturating_add(max_new).min(context);
            Some(self.kv_cache_with_capacity(1, need)?)
        } else {
            None
        };
        Ok(DecoderSequence {
            tokens: prompt.to_vec(),
            prompt_len: prompt.len(),
            start: prompt.len().saturating_sub(context),
            cache,
            context,
            policy,
        })
    }

    /// `sequence` with a KV cache taken from `spare` when one holds the window: the smallest
    /// such, cleared. A server hands finished sequences' caches back (`into_cache`) and
    /// starts new ones from them, instead of allocating and zeroing a cache per request; a
    /// cache's stale positions are never read (a step writes a position before attending
    /// to it). Without a fitting spare, a new cache as `sequence` makes.
    pub fn sequence_reusing(
        &self,
        prompt: &[i64],
        max_new: usize,
        context: usize,
        policy: ContextPolicy,
        spare: &mut Vec<KvCache>,
    ) -> Result<DecoderSequence> {
        let context = context.clamp(1, self.config.block_size);
        let need = prompt.len().saturating_add(max_new).min(context);
        let fits = spare
            .iter()
            .enumerate()
            .filter(|(_, c)| c.capacity() >= need)
            .min_by_key(|(_, c)| c.capacity())
            .map(|(i, _)| i);
        // The prompt is checked before a spare cache leaves the pool.
        let mut seq = self.sequence(prompt, max_new, context, policy, fits.is_none())?;
        if let Some(i) = fits {
            let mut cache = spare.swap_remove(i);
            cache.clear();
            seq.cache = Some(cache);
        }
        Ok(seq)
    }
}

impl DecoderSequence {
    /// The sequence's KV cache, for another sequence (`Decoder::sequence_reusing`).
    pub fn into_cache(self) -> Option<KvCache> {
        self.cache
    }
    /// Prompt and generated tokens.
    pub fn tokens(&self) -> &[i64] {
        &self.tokens
    }
    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }
    /// The tokens generated so far.
    pub fn generated(&self) -> &[i64] {
        &self.tokens[self.prompt_len..]
    }
    /// The tokens the next token is conditioned on.
    pub fn window(&self) -> &[i64] {
        &self.tokens[self.start..]
    }
    pub fn context(&self) -> usize {
        self.context
    }
    pub fn policy(&self) -> ContextPolicy {
        self.policy
    }
    /// Positions held in the KV cache (0 without one).
    pub fn cached(&self) -> usize {
        self.cache.as_ref().map_or(0, KvCache::len)
    }
    /// The window's tokens not yet in the cache: the next model call feeds these.
    pub fn pending(&self) -> &[i64] {
        &self.tokens[self.start + self.cached()..]
    }
    /// Whether exactly one token is pending and the cache has room for it: the next call is
    /// a one-position decode step (`Decoder::decode`) that yields the next token's logits.
    pub fn is_decoding(&self) -> bool {
        self.can_feed() && self.pending().len() == 1
    }
    /// Whether a decode step can take this sequence's next pending token: it has a cache
    /// sized for its window. A prompt can also be fed this way, one token per step, among
    /// other sequences' decode steps (the logits are those of the next token only once
    /// nothing is pending).
    pub fn can_feed(&self) -> bool {
        let window = self.tokens.len() - self.start;
        self.cache
            .as_ref()
            .is_some_and(|c| window <= c.capacity() && c.len() < window)
    }
    /// The window's KV cache (None on the uncached reference path).
    pub fn cache(&self) -> Option<&KvCache> {
        self.cache.as_ref()
    }
    /// The cache, to fill from outside (a server copies a shared prompt prefix's keys and
    /// values in, and sets the layers' `len`: those positions are then not pending).
    pub fn cache_mut(&mut self) -> Option<&mut KvCache> {
        self.cache.as_mut()
    }

    /// Appends a generated token and moves the window as the policy says when it no longer
    /// fits the context.
    pub fn push(&mut self, token: i64) {
        self.tokens.push(token);
        let n = self.tokens.len();
        if n - self.start > self.context {
            self.start = match self.policy {
                ContextPolicy::Slide => n - self.context,
                ContextPolicy::Shift => n - (self.context / 2).max(1),
            };
            if let Some(c) = &mut self.cache {
                c.clear();
            }
        }
    }

    /// Gives the sequence a cache of the full context when its window has outgrown the
    /// capacity it was sized for (more tokens generated than it was created for).
    pub(crate) fn fit_cache(&mut self, model: &Decoder) -> Result<()> {
        let window = self.tokens.len() - self.start;
        if self.cache.as_ref().is_some_and(|c| c.capacity() < window) {
            self.cache = Some(model.kv_cache_with_capacity(1, self.context)?);
        }
        Ok(())
    }
}
