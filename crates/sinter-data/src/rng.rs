//! Seeded shuffles.
//!
//! The shuffle order of every epoch must be a pure function of `(seed, epoch)` so that a
//! resumed run sees exactly the batches an uninterrupted run would have seen. The generators
//! are fixed algorithms (SplitMix64 for seeding, xoshiro256** for the stream) whose output
//! never depends on the platform, the thread or a library version; they are defined once in
//! `sinter-types` (shared with the tensors' `Rng`).

pub use sinter_types::rng::{Rng, SplitMix64};

/// The seed for shuffling epoch `epoch` of a run seeded with `seed`: distinct epochs give
/// distinct seeds (the final mixing step is a bijection).
pub fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    // "sinter-D" in ASCII, so a loader seed does not collide with other uses of the same seed.
    let base = SplitMix64::new(seed ^ 0x7369_6E74_6572_2D44).next_u64();
    SplitMix64::new(base ^ epoch).next_u64()
}

/// A uniformly random permutation of `0..n` (Fisher–Yates), a pure function of `(n, seed)`.
pub fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    shuffle(&mut v, seed);
    v
}

/// Shuffles `items` in place with Fisher–Yates driven by xoshiro256** ([`Rng`]) seeded with
/// `seed`, drawing each index without bias ([`Rng::below_unbiased`]).
pub fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut rng = Rng::new(seed);
    for i in (1..items.len()).rev() {
        let j = rng.below_unbiased(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// The order in which one epoch visits a dataset's examples, stored compactly.
#[derive(Clone, Debug)]
pub(crate) enum EpochOrder {
    /// `0, 1, …, n-1`.
    Identity,
    /// A permutation of a dataset with fewer than 2³² examples.
    Small(Vec<u32>),
    /// A permutation of a larger dataset.
    Large(Vec<u64>),
}

impl EpochOrder {
    /// The order of epoch `epoch` over `n` examples.
    pub(crate) fn new(n: usize, shuffled: bool, seed: u64, epoch: u64) -> Self {
        if !shuffled {
            return EpochOrder::Identity;
        }
        let s = epoch_seed(seed, epoch);
        if n <= u32::MAX as usize {
            let mut v: Vec<u32> = (0..n as u32).collect();
            shuffle(&mut v, s);
            EpochOrder::Small(v)
        } else {
            let mut v: Vec<u64> = (0..n as u64).collect();
            shuffle(&mut v, s);
            EpochOrder::Large(v)
        }
    }

    /// The example visited at step `i` (`i < n`).
    pub(crate) fn get(&self, i: usize) -> usize {
        match self {
            EpochOrder::Identity => i,
            EpochOrder::Small(v) => v[i] as usize,
            EpochOrder::Large(v) => v[i] as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffles_are_those_of_saved_runs() {
        // Produced before the generators moved to sinter-types (commit 8c6f784): a resumed run
        // must see the same epoch orders.
        assert_eq!(permutation(12, 42), [0, 2, 11, 3, 9, 10, 5, 7, 8, 6, 4, 1]);
        assert_eq!(epoch_seed(7, 3), 0x8292_1840_7f50_6b30);
    }

    #[test]
    fn permutation_is_a_permutation_and_deterministic() {
        let p = permutation(1000, 42);
        let mut sorted = p.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_eq!(p, permutation(1000, 42));
        assert_ne!(p, permutation(1000, 43));
        assert_ne!(p, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn epoch_seeds_differ() {
        let seeds: std::collections::HashSet<u64> = (0..100).map(|e| epoch_seed(1, e)).collect();
        assert_eq!(seeds.len(), 100);
        assert_ne!(epoch_seed(1, 0), epoch_seed(2, 0));
    }
}
