//! Decoding many sequences at once (continuous batching) and prefilling one.
//!
//! A decode step takes n sequences, each with one new token and its own KV cache of its own
//! length. The embeddings, every projection, the MLPs and the head run on the n rows together
//! (one GEMM each: that is where batching pays, the weights are read once per step instead
//! of once per sequence); attention runs per sequence against its own cache. Sequences may
//! join or leave between steps: nothing ties one step's batch to the next. On the CPU both
//! the step and the prefill run as the host step (`host_step.rs`); elsewhere as tensor ops
//! (`fused::decode_attention`, one call per layer for all n).

use sinter_core::{bail, fused, no_grad, Device, Result, Tensor};
use sinter_nn::Module;

use super::host_step::{host_cache, DecoderParts, HostModel, StepRow};
use super::{Decoder, DecoderSequence, KvCache};

impl Decoder {
    /// Logits [n, vocab] of one new token per sequence: `ids[i]` at position
    /// `caches[i].len()` of sequence i, whose earlier keys and values are in `caches[i]`
    /// (batch 1, appended to). Equal, row by row, to `forward_step` of each sequence alone
    /// (within f32 rounding). Inference only.
    pub fn decode_step(&self, ids: &[i64], caches: &mut [&mut KvCache]) -> Result<Tensor> {
        let _g = no_grad();
        let c = &self.config;
        let n = ids.len();
        if caches.len() != n {
            bail!("gpt: {n} tokens but {} KV caches", caches.len());
        }
        let mut lens = Vec::with_capacity(n);
        for (i, cache) in caches.iter().enumerate() {
            if cache.layers.len() != self.blocks.len() || cache.layers[0].k.shape()[0] != 1 {
                bail!(
                    "gpt: sequence {i}: a decode step needs a one-sequence KV cache of {} layers",
                    self.blocks.len()
                );
            }
            if cache.len() >= cache.capacity() {
                bail!(
                    "gpt: sequence {i}: its KV cache is full ({} positions)",
                    cache.capacity()
                );
            }
            lens.push(cache.len());
        }
        if let Some(t) = ids
            .iter()
            .find(|&&t| !(0..c.vocab_size as i64).contains(&t))
        {
            bail!(
                "gpt: token {t} is outside the vocabulary of {}",
                c.vocab_size
            );
        }
        let rows: Vec<StepRow> = (ids.iter().zip(&lens).enumerate())
            .map(|(seq, (&token, &pos))| StepRow { token, pos, seq })
            .collect();
        let every: Vec<usize> = (0..n).collect();
        if let Some(logits) = self.host_rows(&rows, caches, &every)? {
            return Tensor::from_vec(logits, &[n, c.vocab_size], Device::Cpu);
        }
        let device = self.wte.weight.device();
        let Some(wpe) = self.wpe.as_ref().filter(|_| c.arch.is_gpt2()) else {
            // Rotary / grouped-query blocks: each sequence's step through the block's own
            // KV-cache path (batched decode attention reads GPT-2's packed heads only).
            let mut rows = Vec::with_capacity(n);
            for (&id, cache) in ids.iter().zip(caches.iter_mut()) {
                let one = Tensor::from_slice(&[id], &[1, 1], Device::Cpu)?.to_device(device)?;
                rows.push(
                    self.forward_step(&one, cache)?
                        .reshape(&[1, c.vocab_size])?,
                );
            }
            return Tensor::cat(&rows, 0);
        };
        let pos: Vec<i64> = lens.iter().map(|&l| l as i64).collect();
        let ids = Tensor::from_slice(ids, &[n], Device::Cpu)?.to_device(device)?;
        let pos = Tensor::from_slice(&pos, &[n], Device::Cpu)?.to_device(device)?;
        let mut x = self.wte.forward(&ids)?.add(&wpe.forward(&pos)?)?; // [n, c]
        let (h, hd) = (c.n_head, c.n_embd / c.n_head);
        let scale = 1.0 / (hd as f32).sqrt();
        for (l, block) in self.blocks.iter().enumerate() {
            // Packed [n, 3c] as [n, 3, h, hd]: q, k and v are strided views of it.
            let qkv = block
                .attn
                .qkv
                .forward(&block.ln1.forward(&x)?)?
                .reshape(&[n, 3, h, hd])?;
            let part = |i: usize| qkv.narrow(1, i, 1)?.squeeze(1);
            let ks: Vec<&Tensor> = caches.iter().map(|c| &c.layers[l].k).collect();
            let vs: Vec<&Tensor> = caches.iter().map(|c| &c.layers[l].v).collect();
            let y =
                fused::decode_attention(&part(0)?, &part(1)?, &part(2)?, &ks, &vs, &lens, scale)?;
            let a = block.attn.proj.forward(&y.reshape(&[n, c.n_embd])?)?;
            x = block.forward_after_attn(&x, &a)?;
        }
        for cache in caches.iter_mut() {
            cache.layers.iter_mut().for_each(|l| l.len += 1);
        }
        self.head_rows(&x)
    }

    /// One step for every sequence in `seqs`, each taking its next pending token
    /// (`can_feed`): returns n rows of `vocab_size` logits, row-major. A row is the next
    /// token's logits when its sequence has nothing pending left (`pending()` empty), else
    /// the logits of a prompt position, which callers skip.
    pub fn decode(&self, seqs: &mut [&mut DecoderSequence]) -> Result<Vec<f32>> {
        let mut ids = Vec::with_capacity(seqs.len());
        for (i, s) in seqs.iter().enumerate() {
            if !s.can_feed() {
                bail!(
                    "gpt: sequence {i} cannot take a decode step (no cache, nothing pending, or a window larger than its cache); prefill it"
                );
            }
            ids.push(s.pending()[0]);
        }
        let mut caches: Vec<&mut KvCache> = seqs
            .iter_mut()
            .map(|s| s.cache_mut().expect("fed sequences have a cache"))
            .collect();
        self.decode_step(&ids, &mut caches)?.to_vec_f32()
    }

    /// Feeds up to `max_chunk` (≥ 1) of the sequence's pending tokens (a prompt, or the window
    /// after a shift) into its cache. Returns the next-token logits once nothing is pending,
    /// None while more chunks remain (long prompts are fed in chunks so that a server can
    /// interleave them with other sequences' decode steps). Without a cache, recomputes the
    /// whole window and returns its logits.
    pub fn prefill(&self, seq: &mut DecoderSequence, max_chunk: usize) -> Result<Option<Vec<f32>>> {
        let _g = no_grad();
        let device = self.wte.weight.device();
        let ids = |t: &[i64]| -> Result<Tensor> {
            Tensor::from_slice(t, &[1, t.len()], Device::Cpu)?.to_device(device)
        };
        if seq.cache().is_none() {
            let window = seq.window();
            let x = self.forward(&ids(window)?)?;
            let last = x.narrow(1, window.len() - 1, 1)?;
            return Ok(Some(last.reshape(&[self.config.vocab_size])?.to_vec_f32()?));
        }
        seq.fit_cache(self)?;
        let pending = seq.pending();
        if pending.is_empty() {
            bail!("gpt: the sequence has nothing pending; push a token first");
        }
        let take = pending.len().min(max_chunk.max(1));
        let done = take == pending.len();
        let tokens = pending[..take].to_vec();
        let cache = seq.cache_mut().expect("checked above");
        let start = cache.len();
        self.check_step(start, take, cache)?;
        let rows: Vec<StepRow> = (tokens.iter().enumerate())
            .map(|(i, &token)| StepRow {
                token,
                pos: start + i,
                seq: 0,
            })
            .collect();
        let last = if done { vec![take - 1] } else { vec![] };
        if let Some(logits) = self.host_rows(&rows, &mut [cache], &last)? {
            return Ok(done.then_some(logits));
        }
        let hidden = self.hidden_step(&ids(&tokens)?, cache)?;
        if !done {
            return Ok(None);
        }
        let last = hidden
            .narrow(1, take - 1, 1)?
            .reshape(&[1, self.config.n_embd])?;
        Ok(Some(self.head_rows(&last)?.to_vec_f32()?))
    }

    /// Runs `rows` through the host step (`host_step`): their keys and values are appended
    /// to `caches[row.seq]`, whose lengths then count them; returns the logits of the rows
    /// listed in `logit_rows`. None (nothing done) when the tensor path must run.
    fn host_rows(
        &self,
        rows: &[StepRow],
        caches: &mut [&mut KvCache],
        logit_rows: &[usize],
    ) -> Result<Option<Vec<f32>>> {
        let c = &self.config;
        let (kv, d) = (c.n_kv_head(), c.head_dim());
        let Some(model) = self.host_model() else {
            return Ok(None);
        };
        if !caches.iter().all(|k| host_cache(k, kv, d)) {
            return Ok(None);
        }
        let logits = {
            let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
            model.step(rows, caches, logit_rows, &mut scratch)?
        };
        let mut added = vec![0; caches.len()];
        rows.iter().for_each(|w| added[w.seq] += 1);
        for (cache, n) in caches.iter_mut().zip(added) {
            cache.layers.iter_mut().for_each(|l| l.len += n);
        }
        Ok(Some(logits))
    }

    /// The next-token logits of one sequence: a decode step when one token is pending, else
    /// a whole prefill.
    pub fn next_logits(&self, seq: &mut DecoderSequence) -> Result<Vec<f32>> {
        if seq.is_decoding() {
            return self.decode(&mut [seq]);
        }
        Ok(self
            .prefill(seq, usize::MAX)?
            .expect("a whole prefill returns logits"))
    }
}

impl Decoder {
    /// The host step's view of this model, or None when the tensor path must run (see
    /// `host_step`'s module comment).
    pub(crate) fn host_model(&self) -> Option<HostModel<'_>> {
        let c = &self.config;
        HostModel::of(DecoderParts {
            wte: &self.wte,
            wpe: self.wpe.as_ref(),
            blocks: &self.blocks,
            ln_f: &self.ln_f,
            lm_head: self.lm_head.as_ref(),
            mlp: c.arch.mlp,
            sliding_window: c.arch.sliding_window.is_some(),
            c: c.n_embd,
            heads: c.n_head,
            kv_heads: c.n_kv_head(),
            head_dim: c.head_dim(),
            vocab: c.vocab_size,
            n_pos: c.block_size,
            eps: c.arch.norm_eps,
        })
    }

    /// Packs the f32 weights of the projections and of the head for the host step's
    /// GEMMs (see `PackedWeights`); later steps and prefills use the packs. For inference:
    /// a step that finds any packed weight written since (trained, loaded, edited in place,
    /// moved or replaced: its `storage_stamp` changed) drops the packs and reads the weights
    /// in place again; call this again to re-pack. The packs take as much memory as the
    /// weights. Returns false (nothing packed) where the host step does not run (CUDA, half
    /// precision, calibration).
    pub fn pack_weights(&self) -> Result<bool> {
        let Some(m) = self.host_model() else {
            return Ok(false);
        };
        (self.scratch.lock().unwrap_or_else(|e| e.into_inner())).pack(&m)?;
        Ok(true)
    }
}
