//! Shared-prefix KV reuse: the keys and values of a prompt's first tokens (a chat's system
//! prompt, a few-shot preamble) are kept after its prefill, and a later prompt that starts
//! with the same tokens copies them into its cache instead of computing them again.
//!
//! Prefixes are block-aligned (`block` tokens): an entry holds a prompt's longest aligned
//! prefix shorter than the prompt, and is found by the hash of each of its aligned prefixes,
//! so a prompt that shares only its first blocks with it (the same system prompt, another
//! question) reuses those. The tokens are compared on a hit (no trust in the hash). Entries
//! are dropped least recently used first to stay within `max_bytes`.
//!
//! Exactness: a causal model's keys and values at positions 0..n depend on tokens 0..n only,
//! so copied ones are the ones the prefill would compute (up to the GEMM's row blocking).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use sinter_models::decoder::KvCache;

/// One cached prefix: its tokens and each layer's keys and values, [kv_heads, n, head_dim].
struct Entry {
    tokens: Vec<i64>,
    layers: Vec<(Vec<f32>, Vec<f32>)>,
    kv_heads: usize,
    head_dim: usize,
    last_used: u64,
}

impl Entry {
    fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|(k, v)| 4 * (k.len() + v.len()))
            .sum()
    }
}

pub struct PrefixCache {
    /// Prefixes are multiples of this many tokens.
    pub block: usize,
    pub max_bytes: usize,
    bytes: usize,
    clock: u64,
    next_id: u64,
    entries: HashMap<u64, Entry>,
    /// The hash of each aligned prefix of each entry → that entry.
    index: HashMap<u64, u64>,
}

fn hash(tokens: &[i64]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    tokens.hash(&mut h);
    h.finish()
}

impl PrefixCache {
    pub fn new(block: usize, max_bytes: usize) -> PrefixCache {
        PrefixCache {
            block: block.max(1),
            max_bytes,
            bytes: 0,
            clock: 0,
            next_id: 0,
            entries: HashMap::new(),
            index: HashMap::new(),
        }
    }

    /// The longest aligned prefix of `prompt` worth caching or reusing: shorter than the
    /// prompt (its last token must be computed for the next token's logits).
    fn aligned(&self, prompt: &[i64]) -> usize {
        prompt.len().saturating_sub(1) / self.block * self.block
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Copies the longest cached prefix of `prompt` into `cache` (empty, with room for the
    /// prompt); returns how many positions it now holds (0: none cached, or a cache the
    /// host cannot write).
    pub fn restore(&mut self, prompt: &[i64], cache: &mut KvCache) -> usize {
        let mut n = self.aligned(prompt);
        while n > 0 {
            if let Some(id) = self.index.get(&hash(&prompt[..n])).copied() {
                let e = self.entries.get_mut(&id).expect("indexed entries exist");
                if e.tokens.len() >= n && e.tokens[..n] == prompt[..n] {
                    self.clock += 1;
                    e.last_used = self.clock;
                    return if copy_in(e, n, cache) { n } else { 0 };
                }
            }
            n -= self.block;
        }
        0
    }

    /// Keeps the aligned prefix of `prompt` from `cache` (which holds at least the prompt's
    /// positions), unless an entry already holds it.
    pub fn store(&mut self, prompt: &[i64], cache: &KvCache) {
        let n = self.aligned(prompt);
        if n == 0 || cache.len() < n {
            return;
        }
        if let Some(id) = self.index.get(&hash(&prompt[..n])) {
            if self.entries[id].tokens[..n] == prompt[..n] {
                return;
            }
        }
        let Some(entry) = copy_out(&prompt[..n], cache) else {
            return;
        };
        let size = entry.bytes();
        if size > self.max_bytes {
            return;
        }
        while self.bytes + size > self.max_bytes {
            self.evict_oldest();
        }
        self.clock += 1;
        self.next_id += 1;
        let id = self.next_id;
        for j in (self.block..=n).step_by(self.block) {
            self.index.insert(hash(&prompt[..j]), id);
        }
        self.bytes += size;
        self.entries.insert(
            id,
            Entry {
                last_used: self.clock,
                ..entry
            },
        );
    }

    fn evict_oldest(&mut self) {
        let Some((&id, _)) = self.entries.iter().min_by_key(|(_, e)| e.last_used) else {
            return;
        };
        let e = self.entries.remove(&id).expect("found above");
        self.bytes -= e.bytes();
        // Only the keys that still lead to it (a newer entry may have taken some over).
        self.index.retain(|_, v| *v != id);
    }
}

/// Each layer's first `n` positions of `cache`, or None when it is not a host f32 buffer.
fn copy_out(tokens: &[i64], cache: &KvCache) -> Option<Entry> {
    let n = tokens.len();
    let first = cache.layers.first()?;
    let s = first.k.shape().to_vec();
    let (kv, cap, d) = (s[1], s[2], s[3]);
    let mut layers = Vec::with_capacity(cache.layers.len());
    for l in &cache.layers {
        let (k, v) = (l.k.host_f32()?, l.v.host_f32()?);
        let take = |src: &[f32]| -> Vec<f32> {
            (0..kv)
                .flat_map(|h| src[h * cap * d..(h * cap + n) * d].iter().copied())
                .collect()
        };
        layers.push((take(&k[..]), take(&v[..])));
    }
    Some(Entry {
        tokens: tokens.to_vec(),
        layers,
        kv_heads: kv,
        head_dim: d,
        last_used: 0,
    })
}

/// Writes the entry's first `n` positions into `cache` and sets its length to `n`.
fn copy_in(e: &Entry, n: usize, cache: &mut KvCache) -> bool {
    let m = e.tokens.len();
    let fits = cache.layers.len() == e.layers.len()
        && cache.layers.iter().all(|l| {
            let s = l.k.shape();
            s.len() == 4 && s[1] == e.kv_heads && s[3] == e.head_dim && s[2] >= n
        });
    if !fits {
        return false;
    }
    let d = e.head_dim;
    for (l, (ek, ev)) in cache.layers.iter_mut().zip(&e.layers) {
        let cap = l.k.shape()[2];
        let (Some(mut k), Some(mut v)) = (l.k.host_f32_mut(), l.v.host_f32_mut()) else {
            return false;
        };
        for h in 0..e.kv_heads {
            let (dst, src) = (h * cap * d, h * m * d);
            k[dst..dst + n * d].copy_from_slice(&ek[src..src + n * d]);
            v[dst..dst + n * d].copy_from_slice(&ev[src..src + n * d]);
        }
        drop((k, v));
        l.len = n;
    }
    true
}
