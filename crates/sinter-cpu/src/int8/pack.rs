//! The packed weight layout, built once per layer.
//!
//! A weight is [n, k] int8 (row j = output channel j, as in `Linear`). The kernels want, for
//! each output channel, four consecutive k values in one 32-bit lane (what `vpdpbusd` and the
//! `vpmaddubsw` + `vpmaddwd` pair consume), and sixteen channels side by side (one 512-bit
//! register, or two 256-bit ones). So the weight is cut into *panels* of 16 channels, and a
//! panel is stored as k/4 *blocks* of 64 bytes: block g holds w[j, 4g..4g+4] for the panel's
//! 16 channels j, channel-major. A kernel then streams each panel front to back, one aligned
//! 64-byte load per block. k is padded to a multiple of 4 and n to a multiple of 16 with zero
//! weights, which contribute nothing whatever the activation bytes facing them.
//!
//! Beside the data, each channel's weight sum Σ_k w[j, k] is precomputed: u8 activations with
//! zero point z give Σ_k (a − z)·w = Σ_k a·w − z·Σ_k w, so the zero-point correction costs one
//! multiply per output instead of a pass over k.

use super::Int8Error;

/// Output channels per panel (one 512-bit register of i32 accumulators).
pub const PANEL: usize = 16;
/// k values per 32-bit lane.
pub const KGROUP: usize = 4;
/// The largest k for which Σ_k a·w cannot overflow i32 (255 · 127 · k < 2³¹).
pub const MAX_K: usize = 65_536;

/// One 64-byte block: four k values of sixteen channels. The alignment makes every block load
/// an aligned one.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Block(pub [i8; PANEL * KGROUP]);

/// An [n, k] int8 weight in the kernels' layout, with its channel sums.
#[derive(Clone)]
pub struct PackedWeights {
    n: usize,
    k: usize,
    /// k/4 rounded up: the blocks per panel.
    groups: usize,
    blocks: Vec<Block>,
    /// Σ_k w[j, k] per channel, padded with zeros to whole panels.
    sums: Vec<i32>,
}

impl PackedWeights {
    /// Packs a row-major [n, k] weight. Values must lie in [-127, 127] (symmetric
    /// quantization never produces -128, and the AVX2 kernel negates weights).
    pub fn pack(w: &[i8], n: usize, k: usize) -> Result<PackedWeights, Int8Error> {
        if w.len() != n * k {
            return Err(Int8Error(format!(
                "int8 weight has {} values, [{n}, {k}] needs {}",
                w.len(),
                n * k
            )));
        }
        if k > MAX_K {
            return Err(Int8Error(format!(
                "int8 weight with k = {k} inputs: above {MAX_K} the i32 accumulators could overflow"
            )));
        }
        if let Some(i) = w.iter().position(|&v| v == i8::MIN) {
            return Err(Int8Error(format!(
                "int8 weight value -128 at row {}, column {}: symmetric int8 weights lie in [-127, 127]",
                i / k.max(1),
                i % k.max(1)
            )));
        }
        let groups = k.div_ceil(KGROUP);
        let panels = n.div_ceil(PANEL);
        let mut blocks = vec![Block([0; PANEL * KGROUP]); panels * groups];
        let mut sums = vec![0i32; panels * PANEL];
        for (j, row) in w.chunks_exact(k.max(1)).take(n).enumerate() {
            let (p, c) = (j / PANEL, j % PANEL);
            for (kk, &v) in row.iter().enumerate() {
                blocks[p * groups + kk / KGROUP].0[c * KGROUP + kk % KGROUP] = v;
            }
            sums[j] = row.iter().map(|&v| v as i32).sum();
        }
        Ok(PackedWeights {
            n,
            k,
            groups,
            blocks,
            sums,
        })
    }

    /// The row-major [n, k] weight back (for checkpoints: the file holds the plain layout).
    pub fn unpack(&self) -> Vec<i8> {
        let mut w = vec![0i8; self.n * self.k];
        for (j, row) in w.chunks_exact_mut(self.k.max(1)).take(self.n).enumerate() {
            let (p, c) = (j / PANEL, j % PANEL);
            for (kk, v) in row.iter_mut().enumerate() {
                *v = self.blocks[p * self.groups + kk / KGROUP].0[c * KGROUP + kk % KGROUP];
            }
        }
        w
    }

    /// Row j of the [n, k] weight (channel j), into `out` (k values).
    pub fn row_into(&self, j: usize, out: &mut [i8]) {
        assert!(
            j < self.n && out.len() == self.k,
            "row {j} of [{}, {}]",
            self.n,
            self.k
        );
        let (blocks, c) = (&self.blocks[(j / PANEL) * self.groups..], j % PANEL);
        let mut groups = out.chunks_exact_mut(KGROUP);
        // Fixed-size copies (a copy of a run-time length is a memcpy call per group).
        for (chunk, block) in (&mut groups).zip(blocks) {
            let src: &[i8; KGROUP] = block.0[c * KGROUP..][..KGROUP].try_into().expect("4");
            chunk.copy_from_slice(src);
        }
        let tail = groups.into_remainder();
        if !tail.is_empty() {
            tail.copy_from_slice(&blocks[self.k / KGROUP].0[c * KGROUP..][..tail.len()]);
        }
    }

    /// Output channels.
    pub fn n(&self) -> usize {
        self.n
    }
    /// Inputs per channel.
    pub fn k(&self) -> usize {
        self.k
    }
    /// k rounded up to a multiple of 4: the bytes a kernel reads from each activation row.
    pub fn k_padded(&self) -> usize {
        self.groups * KGROUP
    }
    /// Blocks per panel (k/4 rounded up).
    pub fn groups(&self) -> usize {
        self.groups
    }
    pub fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }
    /// Σ_k w[j, k] for each channel j (padded with zeros to whole panels).
    pub fn sums(&self) -> &[i32] {
        &self.sums
    }
    /// The blocks of panel `p` and the panels after it.
    pub(crate) fn panel_blocks(&self, p: usize) -> &[Block] {
        &self.blocks[p * self.groups..]
    }
    /// The weight w[j, kk] read from the packed layout.
    #[cfg(test)]
    fn at(&self, j: usize, kk: usize) -> i8 {
        self.blocks[(j / PANEL) * self.groups + kk / KGROUP].0[(j % PANEL) * KGROUP + kk % KGROUP]
    }
    /// Bytes held (the packed data and the sums).
    pub fn bytes(&self) -> usize {
        self.blocks.len() * std::mem::size_of::<Block>() + self.sums.len() * 4
    }
}

impl std::fmt::Debug for PackedWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedWeights[{} × {}, {} bytes]",
            self.n,
            self.k,
            self.bytes()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips_and_sums_channels() {
        for (n, k) in [(1, 1), (3, 5), (16, 4), (17, 9), (40, 64), (5, 0)] {
            let w: Vec<i8> = (0..n * k)
                .map(|i| ((i * 37 + 11) % 255) as i32 - 127)
                .map(|v| v as i8)
                .collect();
            let p = PackedWeights::pack(&w, n, k).unwrap();
            assert_eq!(p.unpack(), w, "[{n}, {k}]");
            assert_eq!(p.k_padded() % 4, 0);
            assert!(p.k_padded() >= k && p.k_padded() < k + 4);
            for j in 0..n {
                let s: i32 = w[j * k..(j + 1) * k].iter().map(|&v| v as i32).sum();
                assert_eq!(p.sums()[j], s);
                for kk in 0..k {
                    assert_eq!(p.at(j, kk), w[j * k + kk]);
                }
            }
            assert!(p.sums()[n..].iter().all(|&s| s == 0));
            let mut row = vec![0i8; k];
            for j in 0..n {
                p.row_into(j, &mut row);
                assert_eq!(row, &w[j * k..(j + 1) * k]);
            }
        }
    }

    #[test]
    fn bad_weights_are_refused_with_the_reason() {
        let e = PackedWeights::pack(&[0, -128, 3], 1, 3).unwrap_err().0;
        assert!(e.contains("-128") && e.contains("column 1"), "{e}");
        let e = PackedWeights::pack(&[0; 5], 2, 3).unwrap_err().0;
        assert!(e.contains("5 values"), "{e}");
        let e = PackedWeights::pack(&vec![0; MAX_K + 1], 1, MAX_K + 1)
            .unwrap_err()
            .0;
        assert!(e.contains("overflow"), "{e}");
    }
}
