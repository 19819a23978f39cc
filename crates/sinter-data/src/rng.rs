//! Small, dependency-free seeded random numbers for shuffling.
//!
//! The shuffle order of every epoch must be a pure function of `(seed, epoch)` so that a
//! resumed run sees exactly the batches an uninterrupted run would have seen. These
//! generators are fixed algorithms (SplitMix64 for seeding, xoshiro256** for the stream)
//! whose output never depends on the platform, the thread or a library version.

/// SplitMix64 (Steele, Lea & Flood): a tiny generator, used here to expand one `u64` seed
/// into well-mixed state for [`Xoshiro256`] and to derive per-epoch seeds.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// xoshiro256** (Blackman & Vigna): a fast generator with 256 bits of state.
#[derive(Clone, Debug)]
pub struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    /// A generator whose state is filled from SplitMix64 seeded with `seed`
    /// (never the all-zero state).
    pub fn new(seed: u64) -> Self {
        let mut sm = SplitMix64::new(seed);
        let s = [sm.next_u64(), sm.next_u64(), sm.next_u64(), sm.next_u64()];
        Xoshiro256 { s }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform integer in `0..bound` without modulo bias (Lemire's method).
    /// Returns 0 when `bound` is 0.
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            return 0;
        }
        let mut m = (self.next_u64() as u128) * (bound as u128);
        if (m as u64) < bound {
            let threshold = bound.wrapping_neg() % bound;
            while (m as u64) < threshold {
                m = (self.next_u64() as u128) * (bound as u128);
            }
        }
        (m >> 64) as u64
    }
}

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

/// Shuffles `items` in place with Fisher–Yates driven by [`Xoshiro256`] seeded with `seed`.
pub fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut rng = Xoshiro256::new(seed);
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
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
    fn splitmix_reference_values() {
        // First outputs of SplitMix64 seeded with 0 (published reference sequence).
        let mut sm = SplitMix64::new(0);
        assert_eq!(sm.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(sm.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut rng = Xoshiro256::new(7);
        let mut counts = [0usize; 6];
        for _ in 0..60_000 {
            let x = rng.below(6);
            counts[x as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
        assert_eq!(rng.below(0), 0);
        assert_eq!(rng.below(1), 0);
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
