//! Seeded generators whose whole state is a few u64s, so checkpoints save and restore them
//! exactly, and whose output never depends on the platform, the thread or a library version.
//!
//! [`Rng`] is xoshiro256** (Blackman & Vigna) seeded through [`SplitMix64`] (Steele, Lea &
//! Flood). It serves both the tensors (initialisation, dropout: `sinter_core::Rng`) and the data
//! loader's shuffles (`sinter_data::rng`). The two draw bounded integers differently, and both
//! ways are kept because saved runs depend on each stream: [`Rng::below`] (one draw, multiply
//! high; the tensor side) and [`Rng::below_unbiased`] (Lemire's rejection; the shuffles).

/// SplitMix64: a tiny generator that expands one `u64` seed into well-mixed state for [`Rng`]
/// and derives independent seeds from one another.
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// xoshiro256**, 256 bits of state (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator whose state is filled from SplitMix64 seeded with `seed` (never all zero).
    pub fn new(seed: u64) -> Self {
        let mut sm = SplitMix64::new(seed);
        Rng {
            s: [sm.next_u64(), sm.next_u64(), sm.next_u64(), sm.next_u64()],
        }
    }
    /// The whole state (for checkpoints).
    pub fn state(&self) -> [u64; 4] {
        self.s
    }
    /// A generator continuing from a saved [`Rng::state`].
    pub fn from_state(s: [u64; 4]) -> Self {
        Rng { s }
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }
    /// Uniform in [0, 1) with 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }
    /// Standard normal by Box–Muller (one value per call keeps the state simple to save).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
    /// An integer in [0, n) from one draw (the high word of draw × n; its bias is below
    /// n / 2⁶⁴). 0 when n is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    /// A uniform integer in [0, n) without bias (Lemire's method: redraws the rare draws that
    /// would favour some values). 0 when n is 0, without drawing.
    pub fn below_unbiased(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let mut m = (self.next_u64() as u128) * (n as u128);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = (self.next_u64() as u128) * (n as u128);
            }
        }
        (m >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_reference_values() {
        // First outputs of SplitMix64 seeded with 0 (the published reference sequence).
        let mut sm = SplitMix64::new(0);
        assert_eq!(sm.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(sm.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    /// The streams saved runs depend on. These values were produced by the generators as they
    /// stood in sinter-core and sinter-data before they moved here (commit 8c6f784); a change
    /// to any of them would make old checkpoints resume differently.
    #[test]
    fn streams_are_those_of_saved_runs() {
        let mut r = Rng::new(42);
        let xs: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(
            xs,
            [
                1_546_998_764_402_558_742,
                6_990_951_692_964_543_102,
                12_544_586_762_248_559_009
            ]
        );
        assert_eq!(r.normal().to_bits(), 0x4002_2b8e_83d7_22d9);
        assert_eq!(r.below(1000), 769);
        assert_eq!(r.uniform(-1.0, 2.0).to_bits(), 0x3ff2_863f_d900_f318);
        let mut u = Rng::new(5);
        let ys: Vec<u64> = (0..5).map(|_| u.below_unbiased(7)).collect();
        assert_eq!(ys, [2, 4, 4, 5, 3]);
    }

    #[test]
    fn state_round_trip_continues_the_same_stream() {
        let mut a = Rng::new(7);
        for _ in 0..10 {
            a.next_u64();
        }
        let mut b = Rng::from_state(a.state());
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }

    #[test]
    fn normal_has_unit_moments() {
        let mut r = Rng::new(3);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "var {var}");
    }

    #[test]
    fn bounded_draws_are_in_range_and_roughly_uniform() {
        let mut rng = Rng::new(7);
        let mut counts = [[0usize; 6]; 2];
        for _ in 0..60_000 {
            counts[0][rng.below_unbiased(6) as usize] += 1;
            counts[1][rng.below(6) as usize] += 1;
        }
        for c in counts.iter().flatten() {
            assert!((9_000..11_000).contains(c), "{counts:?}");
        }
        assert_eq!(rng.below_unbiased(0), 0);
        assert_eq!(rng.below_unbiased(1), 0);
        assert_eq!(rng.below(0), 0);
    }
}
