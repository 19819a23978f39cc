//! `/v1/embeddings`: an encoder model (BERT, e.g. sentence-transformers' all-MiniLM-L6-v2)
//! turns each input into one vector (mean over its tokens, unit length: `Bert::embed`).
//!
//! A request's inputs run in batches of at most `max_batch` rows, each padded to its longest
//! input with the padding masked out (so a row's vector is the one it has alone). One batch
//! runs at a time (the model sits behind a mutex) on a blocking thread, off the HTTP workers.
//!
//! Admission: one request runs and at most `max_waiting` wait for the model (the server's
//! `--max-queue`); past that a request gets 429, as a generation request does, instead of
//! piling up blocking threads. Graceful shutdown waits for the admitted ones (`in_flight`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Result};
use sinter_core::{Device, Tensor};
use sinter_models::Bert;

use crate::text::Tokenizer;

/// What `/v1/embeddings` needs from a model.
pub trait EmbedModel: Send + 'static {
    /// The most tokens one input may have (the model's positions).
    fn max_tokens(&self) -> usize;
    /// Ids are below this.
    fn vocab_size(&self) -> usize;
    /// Rows of `dim()` floats, one per input of `batch` (each non-empty, ≤ `max_tokens`).
    fn embed(&self, batch: &[Vec<i64>]) -> Result<Vec<Vec<f32>>>;
}

/// A BERT encoder's sentence embeddings: mean over the real tokens, scaled to unit length.
pub struct BertEmbedder {
    pub bert: Bert,
    /// The id padded rows are filled with (masked out; any id in the vocabulary works).
    pub pad_id: i64,
}

impl BertEmbedder {
    pub fn new(bert: Bert) -> BertEmbedder {
        let pad_id = bert.config.pad_token_id.unwrap_or(0) as i64;
        BertEmbedder { bert, pad_id }
    }
}

impl EmbedModel for BertEmbedder {
    fn max_tokens(&self) -> usize {
        self.bert.config.max_position
    }
    fn vocab_size(&self) -> usize {
        self.bert.config.vocab_size
    }
    fn embed(&self, batch: &[Vec<i64>]) -> Result<Vec<Vec<f32>>> {
        let (b, t) = (batch.len(), batch.iter().map(Vec::len).max().unwrap_or(0));
        if b == 0 {
            return Ok(Vec::new());
        }
        let mut ids = Vec::with_capacity(b * t);
        let mut mask = Vec::with_capacity(b * t);
        for row in batch {
            ids.extend_from_slice(row);
            ids.extend(std::iter::repeat_n(self.pad_id, t - row.len()));
            mask.extend(std::iter::repeat_n(1i64, row.len()));
            mask.extend(std::iter::repeat_n(0i64, t - row.len()));
        }
        let ids = Tensor::from_vec(ids, &[b, t], Device::Cpu)?;
        let mask = Tensor::from_vec(mask, &[b, t], Device::Cpu)?;
        let device = self.bert.embeddings.word_embeddings.weight.device();
        let _g = sinter_core::no_grad();
        let out = self.bert.embed(
            &ids.to_device(device)?,
            Some(&mask.to_device(device)?),
            true,
        )?;
        let flat = out.to_vec_f32()?;
        let dim = flat.len() / b;
        Ok(flat.chunks(dim).map(<[f32]>::to_vec).collect())
    }
}

/// The embedding model a server runs, with its tokenizer and name.
pub struct Embedder {
    model: Mutex<Box<dyn EmbedModel>>,
    pub tokenizer: Tokenizer,
    /// The model's name in requests and `/v1/models`.
    pub name: String,
    /// Inputs run together at most.
    pub max_batch: usize,
    /// Requests that may wait while one runs (the server sets its `max_queue`).
    pub max_waiting: usize,
    /// Requests admitted and not yet answered (running or waiting for the model).
    in_flight: Arc<AtomicUsize>,
    max_tokens: usize,
    vocab_size: usize,
}

/// An admitted embedding request's place; dropping it (when the request's work ends,
/// answered or not) frees the place.
#[derive(Debug)]
pub struct Admission(Arc<AtomicUsize>);

impl Drop for Admission {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("name", &self.name)
            .field("max_batch", &self.max_batch)
            .finish()
    }
}

/// The most inputs one request may hold (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

impl Embedder {
    pub fn new(model: impl EmbedModel, tokenizer: Tokenizer, name: impl Into<String>) -> Embedder {
        Embedder {
            max_tokens: model.max_tokens(),
            vocab_size: model.vocab_size().min(tokenizer.vocab_size()),
            model: Mutex::new(Box::new(model)),
            tokenizer,
            name: name.into(),
            max_batch: 32,
            max_waiting: 64,
            in_flight: Arc::new(AtomicUsize::new(0)),
        }
    }
    /// A place for one more request: `None` when one runs and `max_waiting` already wait.
    pub fn admit(&self) -> Option<Admission> {
        let limit = self.max_waiting.saturating_add(1);
        self.in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Admission(self.in_flight.clone()))
    }
    /// Requests admitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
    /// The most tokens one input may have.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }
    /// Ids an input may hold are below this.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// One vector per input, in order: the inputs sorted by length run in batches of at most
    /// `max_batch` (similar lengths together: little padding).
    pub fn embed_all(&self, inputs: &[Vec<i64>]) -> Result<Vec<Vec<f32>>> {
        let mut order: Vec<usize> = (0..inputs.len()).collect();
        order.sort_by_key(|&i| inputs[i].len());
        let mut out = vec![Vec::new(); inputs.len()];
        for chunk in order.chunks(self.max_batch.max(1)) {
            let batch: Vec<Vec<i64>> = chunk.iter().map(|&i| inputs[i].clone()).collect();
            let rows = {
                let model = self.model.lock().unwrap_or_else(|e| e.into_inner());
                model.embed(&batch)?
            };
            if rows.len() != batch.len() {
                bail!(
                    "the embedding model returned {} rows for {} inputs",
                    rows.len(),
                    batch.len()
                );
            }
            for (&i, row) in chunk.iter().zip(rows) {
                out[i] = row;
            }
        }
        Ok(out)
    }
}

/// Standard base64 (RFC 4648, padded) of `bytes`: OpenAI's `encoding_format: "base64"` sends
/// the little-endian f32s this way.
pub fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                out.push(ABC[((n >> (18 - 6 * k)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_is_rfc_4648() {
        for (raw, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(raw.as_bytes()), want, "{raw}");
        }
        assert_eq!(base64(&[0xff, 0xfe, 0xfd]), "//79");
    }
}
