//! A decoder's KV cache: the keys and values of every layer for the positions so far.

use sinter_nn::LayerKvCache;

/// The keys and values of every layer for the positions generated so far (batch as given
/// to `Decoder::kv_cache`, capacity `block_size`).
pub struct KvCache {
    pub layers: Vec<LayerKvCache>,
}

impl KvCache {
    /// Positions cached.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.len)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn capacity(&self) -> usize {
        self.layers.first().map_or(0, |l| l.capacity())
    }
    /// Forgets every position (the buffers are kept).
    pub fn clear(&mut self) {
        self.layers.iter_mut().for_each(|l| l.len = 0);
    }
}
