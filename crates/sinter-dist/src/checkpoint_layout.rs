//! Where each parameter lives in the flat `f32` buffers of data parallelism and ZeRO, and how
//! a rank's shard maps to and from full (unsharded) per-parameter tensors.
//!
//! Parameters are grouped into gradient buckets in *reverse* parameter order (the last
//! layers' gradients are final first during backward). The flat buffer is the concatenation
//! of the buckets; each bucket is padded with zeros to a multiple of the world size `N` and
//! cut into `N` equal chunks, chunk `r` belonging to rank `r`. A rank's shard is the
//! concatenation of its chunk of every bucket. A bucket's reduce-scatter therefore hands each
//! rank exactly its own part, and its all-gather rebuilds the bucket.
//!
//! Checkpoints never store shards: [`FlatLayout::unshard`] turns the all-gathered shards of
//! all ranks back into one full vector per parameter (saved under the usual names), and
//! [`FlatLayout::shard_from_full`] cuts any rank's shard out of full vectors, for whatever
//! world size and bucket size the loading run uses. That is what makes checkpoints
//! independent of the layout they were written from.

use std::ops::Range;

use sinter_core::Tensor;

use crate::error::{DistError, Result};

/// One parameter's place in the flat buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSlot {
    pub name: String,
    pub shape: Vec<usize>,
    pub numel: usize,
    /// Index of the bucket holding it.
    pub bucket: usize,
    /// Offset within its bucket.
    pub offset_in_bucket: usize,
}

/// One gradient bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Parameter indices in bucket order (reverse parameter order).
    pub params: Vec<usize>,
    /// Offset of the bucket in the flat buffer.
    pub offset: usize,
    /// Elements of parameters in the bucket.
    pub numel: usize,
    /// `numel` rounded up to a multiple of the world size.
    pub padded: usize,
}

/// A run of one parameter's elements inside a rank's shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Parameter index.
    pub param: usize,
    /// Range within the parameter's (flattened) elements.
    pub in_param: Range<usize>,
    /// Range within the rank's shard.
    pub in_shard: Range<usize>,
}

/// Bucketed, padded, sharded layout of a list of parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlatLayout {
    /// By parameter index (the order given to [`FlatLayout::new`]).
    pub slots: Vec<ParamSlot>,
    pub buckets: Vec<Bucket>,
    pub world_size: usize,
    /// Length of the flat buffer (sum of padded bucket lengths).
    pub total: usize,
}

impl FlatLayout {
    /// Layout of parameters given as `(name, shape)`, in module order. A bucket is closed once
    /// it holds at least `bucket_bytes` bytes of f32 (a parameter is never split across
    /// buckets; `bucket_bytes == 0` puts every parameter in its own bucket).
    pub fn new(
        params: &[(String, Vec<usize>)],
        bucket_bytes: usize,
        world_size: usize,
    ) -> Result<Self> {
        if world_size == 0 {
            return Err(DistError::InvalidArgument(
                "world size must be at least 1".into(),
            ));
        }
        let mut slots: Vec<ParamSlot> = params
            .iter()
            .map(|(n, s)| ParamSlot {
                name: n.clone(),
                shape: s.clone(),
                numel: s.iter().product(),
                bucket: 0,
                offset_in_bucket: 0,
            })
            .collect();
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut cur: Vec<usize> = Vec::new();
        let mut cur_numel = 0usize;
        let mut offset = 0usize;
        let close = |cur: &mut Vec<usize>,
                     cur_numel: &mut usize,
                     offset: &mut usize,
                     buckets: &mut Vec<Bucket>| {
            if cur.is_empty() {
                return;
            }
            let padded = cur_numel.div_ceil(world_size).max(1) * world_size;
            buckets.push(Bucket {
                params: std::mem::take(cur),
                offset: *offset,
                numel: *cur_numel,
                padded,
            });
            *offset += padded;
            *cur_numel = 0;
        };
        for i in (0..slots.len()).rev() {
            slots[i].bucket = buckets.len();
            slots[i].offset_in_bucket = cur_numel;
            cur.push(i);
            cur_numel += slots[i].numel;
            if cur_numel * 4 >= bucket_bytes {
                close(&mut cur, &mut cur_numel, &mut offset, &mut buckets);
            }
        }
        close(&mut cur, &mut cur_numel, &mut offset, &mut buckets);
        Ok(FlatLayout {
            slots,
            buckets,
            world_size,
            total: offset,
        })
    }

    /// Layout of named parameter tensors.
    pub fn from_params(
        params: &[(String, Tensor)],
        bucket_bytes: usize,
        world_size: usize,
    ) -> Result<Self> {
        let shapes: Vec<(String, Vec<usize>)> = params
            .iter()
            .map(|(n, t)| (n.clone(), t.shape().to_vec()))
            .collect();
        Self::new(&shapes, bucket_bytes, world_size)
    }

    /// Number of parameter elements (Ψ), without padding.
    pub fn numel(&self) -> usize {
        self.slots.iter().map(|s| s.numel).sum()
    }

    /// Length of each rank's chunk of bucket `b`.
    pub fn chunk_len(&self, b: usize) -> usize {
        self.buckets[b].padded / self.world_size
    }

    /// Range of rank `rank`'s chunk of bucket `b` within the bucket.
    pub fn chunk_range(&self, b: usize, rank: usize) -> Range<usize> {
        let c = self.chunk_len(b);
        rank * c..(rank + 1) * c
    }

    /// Offset of bucket `b`'s chunk within every rank's shard.
    pub fn shard_offset(&self, b: usize) -> usize {
        (0..b).map(|i| self.chunk_len(i)).sum()
    }

    /// Length of every rank's shard (`total / world_size`).
    pub fn shard_len(&self) -> usize {
        self.total / self.world_size
    }

    /// The parameter runs inside rank `rank`'s shard, in shard order (padding is in none).
    pub fn shard_pieces(&self, rank: usize) -> Vec<Piece> {
        let mut out = Vec::new();
        let mut shard_off = 0;
        for (b, bucket) in self.buckets.iter().enumerate() {
            let chunk = self.chunk_range(b, rank);
            for &p in &bucket.params {
                let s = &self.slots[p];
                let start = s.offset_in_bucket.max(chunk.start);
                let end = (s.offset_in_bucket + s.numel).min(chunk.end);
                if start < end {
                    out.push(Piece {
                        param: p,
                        in_param: start - s.offset_in_bucket..end - s.offset_in_bucket,
                        in_shard: shard_off + start - chunk.start..shard_off + end - chunk.start,
                    });
                }
            }
            shard_off += chunk.len();
        }
        out
    }

    /// Rank `rank`'s shard cut out of full per-parameter vectors (one per slot, in slot order);
    /// padding is zero.
    pub fn shard_from_full(&self, rank: usize, full: &[&[f32]]) -> Result<Vec<f32>> {
        self.check_full(full)?;
        let mut shard = vec![0.0f32; self.shard_len()];
        for piece in self.shard_pieces(rank) {
            shard[piece.in_shard].copy_from_slice(&full[piece.param][piece.in_param]);
        }
        Ok(shard)
    }

    /// Full per-parameter vectors from the concatenated shards of all ranks (the output of an
    /// all-gather of the shards, rank 0 first).
    pub fn unshard(&self, gathered: &[f32]) -> Result<Vec<Vec<f32>>> {
        if gathered.len() != self.total {
            return Err(DistError::InvalidArgument(format!(
                "unshard: got {} values, the layout needs {} ({} ranks × {})",
                gathered.len(),
                self.total,
                self.world_size,
                self.shard_len()
            )));
        }
        let mut full: Vec<Vec<f32>> = self.slots.iter().map(|s| vec![0.0; s.numel]).collect();
        let sl = self.shard_len();
        for r in 0..self.world_size {
            let shard = &gathered[r * sl..(r + 1) * sl];
            for piece in self.shard_pieces(r) {
                full[piece.param][piece.in_param].copy_from_slice(&shard[piece.in_shard]);
            }
        }
        Ok(full)
    }

    /// The padded contents of bucket `b` from full per-parameter vectors.
    pub fn bucket_from_full(&self, b: usize, full: &[&[f32]]) -> Vec<f32> {
        let bucket = &self.buckets[b];
        let mut buf = vec![0.0f32; bucket.padded];
        for &p in &bucket.params {
            let s = &self.slots[p];
            buf[s.offset_in_bucket..s.offset_in_bucket + s.numel].copy_from_slice(full[p]);
        }
        buf
    }

    fn check_full(&self, full: &[&[f32]]) -> Result<()> {
        if full.len() != self.slots.len() {
            return Err(DistError::InvalidArgument(format!(
                "expected {} parameters, got {}",
                self.slots.len(),
                full.len()
            )));
        }
        for (s, f) in self.slots.iter().zip(full) {
            if f.len() != s.numel {
                return Err(DistError::InvalidArgument(format!(
                    "{} has {} values but its shape {:?} needs {}",
                    s.name,
                    f.len(),
                    s.shape,
                    s.numel
                )));
            }
        }
        Ok(())
    }
}

/// Turns per-parameter vectors into tensors of the slots' shapes.
pub fn to_tensors(layout: &FlatLayout, full: Vec<Vec<f32>>) -> Result<Vec<Tensor>> {
    layout
        .slots
        .iter()
        .zip(full)
        .map(|(s, v)| {
            Tensor::from_vec(v, &s.shape, sinter_core::Device::Cpu)
                .map_err(|e| DistError::InvalidArgument(format!("{}: {e}", s.name)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(sizes: &[usize]) -> Vec<(String, Vec<usize>)> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (format!("p{i}"), vec![n]))
            .collect()
    }

    #[test]
    fn buckets_are_reverse_ordered_padded_and_shards_round_trip() {
        let ps = params(&[5, 3, 7, 2, 11]);
        for world in [1, 2, 3, 4] {
            for bucket_bytes in [0, 4 * 8, 4 * 100] {
                let l = FlatLayout::new(&ps, bucket_bytes, world).unwrap();
                assert_eq!(l.buckets[0].params[0], 4, "last parameter comes first");
                assert!(l
                    .buckets
                    .iter()
                    .all(|b| b.padded % world == 0 && b.padded >= b.numel));
                assert_eq!(l.total, l.buckets.iter().map(|b| b.padded).sum::<usize>());
                let full: Vec<Vec<f32>> = l
                    .slots
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (0..s.numel).map(|j| (i * 100 + j) as f32).collect())
                    .collect();
                let refs: Vec<&[f32]> = full.iter().map(|v| v.as_slice()).collect();
                let mut gathered = Vec::new();
                let mut covered = 0;
                for r in 0..world {
                    let sh = l.shard_from_full(r, &refs).unwrap();
                    assert_eq!(sh.len(), l.shard_len());
                    covered += l
                        .shard_pieces(r)
                        .iter()
                        .map(|p| p.in_param.len())
                        .sum::<usize>();
                    gathered.extend(sh);
                }
                assert_eq!(
                    covered,
                    l.numel(),
                    "every element is owned by exactly one rank"
                );
                assert_eq!(l.unshard(&gathered).unwrap(), full);
                // Bucket chunks concatenated over ranks rebuild the bucket.
                for b in 0..l.buckets.len() {
                    let buf = l.bucket_from_full(b, &refs);
                    for r in 0..world {
                        let off = l.shard_offset(b);
                        let sh = &gathered[r * l.shard_len()..(r + 1) * l.shard_len()];
                        assert_eq!(&buf[l.chunk_range(b, r)], &sh[off..off + l.chunk_len(b)]);
                    }
                }
            }
        }
    }
}
