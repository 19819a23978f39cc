//! What the scheduler needs from a model, and the f32 GPT that provides it.
//!
//! `ServeModel` is the extension point for other kinds of model: an int8 GPT (from `sinter
//! quantize`) implements the same calls over its own weights, and everything above —
//! batching, streaming, HTTP — stays as it is.

use std::sync::Mutex;

use anyhow::Result;
use sinter_models::decoder::{ContextPolicy, DecoderSequence, KvCache};
use sinter_models::Decoder;

use crate::prefix::PrefixCache;

/// A language model that decodes many sequences at once, each with its own cache.
pub trait ServeModel: Send + 'static {
    /// One sequence's state (its tokens, window and KV cache).
    type Seq: Send;
    fn vocab_size(&self) -> usize;
    /// The most tokens a prompt may have.
    fn context(&self) -> usize;
    /// A new sequence for `prompt`, about to generate up to `max_new` tokens.
    fn start(&self, prompt: &[i64], max_new: usize) -> Result<Self::Seq>;
    /// Tokens of `seq` not yet fed to the model (its prompt at first, then the last token).
    fn pending(&self, seq: &Self::Seq) -> usize;
    /// Whether a decode step can take `seq`'s next pending token.
    fn can_feed(&self, seq: &Self::Seq) -> bool;
    /// Feeds up to `max_chunk` pending tokens; the next-token logits once none are left.
    fn prefill(&self, seq: &mut Self::Seq, max_chunk: usize) -> Result<Option<Vec<f32>>>;
    /// One decode step that feeds every sequence its next pending token: a row of logits
    /// each, row-major (the next token's for sequences left with nothing pending).
    fn decode(&self, seqs: &mut [&mut Self::Seq]) -> Result<Vec<f32>>;
    /// Appends a picked token (the window moves on past the context).
    fn push(&self, seq: &mut Self::Seq, token: i64);
    /// Positions of `seq` already in its cache when it starts (a shared prefix reused).
    fn reused(&self, seq: &Self::Seq) -> usize {
        let _ = seq;
        0
    }
    /// `seq`'s prompt has been fed in full (its first token is next): its prefix may be kept
    /// for later prompts.
    fn prompt_done(&self, seq: &Self::Seq) {
        let _ = seq;
    }
    /// A sequence that left the batch (finished, failed or cancelled): its buffers may serve
    /// a later `start`.
    fn recycle(&self, seq: Self::Seq) {
        drop(seq);
    }
}

/// A GPT with f32 weights, and how its sequences outgrow the context.
pub struct DecoderModel {
    pub gpt: Decoder,
    /// Tokens a sequence is conditioned on (≤ block_size).
    pub context: usize,
    pub policy: ContextPolicy,
    /// KV caches of sequences that left, for the next ones (`Decoder::sequence_reusing`: no
    /// allocation, zeroing or page faults per request). Never more than the most sequences
    /// that ran at once: each came from a running sequence, and `start` takes from here
    /// before it allocates.
    spare: Mutex<Vec<KvCache>>,
    /// Shared-prompt-prefix KV reuse (`prefix.rs`); None: off.
    pub prefix: Option<Mutex<PrefixCache>>,
}

/// Prefixes are multiples of this many tokens.
pub const PREFIX_BLOCK: usize = 16;

impl DecoderModel {
    /// Serves `gpt` with up to `context` tokens per sequence. Its weights are packed for the
    /// CPU decode step once here (`Decoder::pack_weights`; a step that finds a weight written
    /// since reads it in place again).
    pub fn new(gpt: Decoder, context: usize) -> Result<DecoderModel> {
        let context = context.clamp(1, gpt.config.block_size);
        gpt.pack_weights()?;
        Ok(DecoderModel {
            gpt,
            context,
            policy: ContextPolicy::Shift,
            spare: Mutex::default(),
            prefix: Some(Mutex::new(PrefixCache::new(PREFIX_BLOCK, 64 << 20))),
        })
    }

    /// Keeps at most `max_bytes` of shared prompt prefixes' keys and values (0: no reuse).
    pub fn with_prefix_cache(mut self, max_bytes: usize) -> DecoderModel {
        self.prefix =
            (max_bytes > 0).then(|| Mutex::new(PrefixCache::new(PREFIX_BLOCK, max_bytes)));
        self
    }

    fn prefix_cache(&self) -> Option<std::sync::MutexGuard<'_, PrefixCache>> {
        self.prefix
            .as_ref()
            .map(|p| p.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl ServeModel for DecoderModel {
    type Seq = DecoderSequence;
    fn vocab_size(&self) -> usize {
        self.gpt.config.vocab_size
    }
    fn context(&self) -> usize {
        self.context
    }
    fn start(&self, prompt: &[i64], max_new: usize) -> Result<DecoderSequence> {
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        let mut seq =
            self.gpt
                .sequence_reusing(prompt, max_new, self.context, self.policy, &mut spare)?;
        drop(spare);
        if let (Some(mut p), Some(cache)) = (self.prefix_cache(), seq.cache_mut()) {
            p.restore(prompt, cache);
        }
        Ok(seq)
    }
    fn reused(&self, seq: &DecoderSequence) -> usize {
        seq.cached()
    }
    fn prompt_done(&self, seq: &DecoderSequence) {
        if let (Some(mut p), Some(cache)) = (self.prefix_cache(), seq.cache()) {
            p.store(&seq.tokens()[..seq.prompt_len()], cache);
        }
    }
    fn pending(&self, seq: &DecoderSequence) -> usize {
        seq.pending().len()
    }
    fn can_feed(&self, seq: &DecoderSequence) -> bool {
        seq.can_feed()
    }
    fn prefill(&self, seq: &mut DecoderSequence, max_chunk: usize) -> Result<Option<Vec<f32>>> {
        Ok(self.gpt.prefill(seq, max_chunk)?)
    }
    fn decode(&self, seqs: &mut [&mut DecoderSequence]) -> Result<Vec<f32>> {
        Ok(self.gpt.decode(seqs)?)
    }
    fn push(&self, seq: &mut DecoderSequence, token: i64) {
        seq.push(token)
    }
    fn recycle(&self, seq: DecoderSequence) {
        if let Some(cache) = seq.into_cache() {
            let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
            spare.push(cache);
        }
    }
}

/// The engine's model in a server without a generation model (embeddings only): the HTTP
/// layer refuses completions before they reach it, so none of its calls run.
pub struct NoGeneration;

impl ServeModel for NoGeneration {
    type Seq = ();
    fn vocab_size(&self) -> usize {
        usize::MAX
    }
    fn context(&self) -> usize {
        0
    }
    fn start(&self, _: &[i64], _: usize) -> Result<()> {
        anyhow::bail!("this server has no generation model")
    }
    fn pending(&self, _: &()) -> usize {
        0
    }
    fn can_feed(&self, _: &()) -> bool {
        false
    }
    fn prefill(&self, _: &mut (), _: usize) -> Result<Option<Vec<f32>>> {
        anyhow::bail!("this server has no generation model")
    }
    fn decode(&self, _: &mut [&mut ()]) -> Result<Vec<f32>> {
        anyhow::bail!("this server has no generation model")
    }
    fn push(&self, _: &mut (), _: i64) {}
}
