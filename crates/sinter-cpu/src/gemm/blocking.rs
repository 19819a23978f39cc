//! Cache blocking: how large the packed blocks of A (mc × kc) and B (kc × nc) are, from the
//! running CPU's cache sizes (read once from sysfs; safe defaults when it is not there).
//!
//! The BLIS rule: one kc × NR micro-panel of B stays in L1 while the micro-kernel streams the
//! MR × kc micro-panels of A through it; the mc × kc block of A lives in L2 (half of it, the
//! rest is C and B traffic); the kc × nc block of B lives in a share of L3.

use std::sync::OnceLock;

/// Per-core data cache sizes in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheSizes {
    pub l1d: usize,
    pub l2: usize,
    pub l3: usize,
}

impl CacheSizes {
    /// The running CPU's caches (sysfs, read once), or conservative defaults.
    pub fn get() -> CacheSizes {
        static SIZES: OnceLock<CacheSizes> = OnceLock::new();
        *SIZES.get_or_init(|| read_sysfs().unwrap_or(CacheSizes::DEFAULT))
    }

    pub const DEFAULT: CacheSizes = CacheSizes {
        l1d: 32 << 10,
        l2: 512 << 10,
        l3: 8 << 20,
    };
}

fn read_sysfs() -> Option<CacheSizes> {
    let mut sizes = CacheSizes {
        l1d: 0,
        l2: 0,
        l3: 0,
    };
    for index in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{index}");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
        let Some(level) = read("level") else { break };
        let kind = read("type").unwrap_or_default();
        let size = parse_size(read("size")?.trim())?;
        match (level.trim(), kind.trim()) {
            ("1", "Data") => sizes.l1d = size,
            ("2", _) => sizes.l2 = size,
            ("3", _) => sizes.l3 = size,
            _ => {}
        }
    }
    (sizes.l1d > 0 && sizes.l2 > 0).then(|| CacheSizes {
        l3: if sizes.l3 > 0 { sizes.l3 } else { sizes.l2 * 4 },
        ..sizes
    })
}

/// "48K", "1024K", "32M" or a byte count.
fn parse_size(s: &str) -> Option<usize> {
    let (num, mult) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok().map(|n| n * mult)
}

/// SINTER_GEMM_MC / _KC / _NC (for tuning), read once: `for_kernel` runs on every GEMM call,
/// dozens per decode step, and an environment lookup each time showed in serving profiles.
fn overrides() -> &'static [Option<usize>; 3] {
    static ONCE: std::sync::OnceLock<[Option<usize>; 3]> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        ["SINTER_GEMM_MC", "SINTER_GEMM_KC", "SINTER_GEMM_NC"]
            .map(|k| std::env::var(k).ok().and_then(|v| v.parse().ok()))
    })
}

/// Block sizes of one GEMM: kc (the shared dimension), mc (rows of A per packed block, a
/// multiple of mr) and nc (columns of B per packed block, a multiple of nr).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    pub mc: usize,
    pub kc: usize,
    pub nc: usize,
}

impl Blocking {
    /// Blocks for a micro-kernel of mr × nr on caches `c`.
    pub fn for_kernel(mr: usize, nr: usize, c: CacheSizes) -> Blocking {
        const F32: usize = 4;
        let kc = if mr <= 16 {
            // Tiles of 16 rows or fewer (AVX2's 16 × 6, scalar): the B micro-panel reused
            // across the row panels fills 3/8 of L1 and A's panels stream through the rest. kc
            // 512 instead of the rule below's 368 cuts the passes over C (2048: 6 → 4) and the
            // tile stores: 1.05–1.1× at 1024³–2048³ and on gpt-tiny's k = 512–768 products on
            // 2 threads, Zen 3 (2026-11-29, benches/gemm.rs with SINTER_GEMM_KC).
            c.l1d * 3 / 8 / (nr * F32)
        } else {
            // AVX-512's 32-row tiles (not re-measured): one micro-panel of A (mr × kc) and
            // one of B (kc × nr) fit in L1 together.
            c.l1d / ((mr + nr) * F32)
        };
        let kc = kc.clamp(128, 512) / 8 * 8;
        let mc = (c.l2 / 2 / (kc * F32)).clamp(mr, 1024) / mr * mr;
        // One quarter of L3 (it is shared by the cores).
        let nc = (c.l3 / 4 / (kc * F32)).clamp(nr, 4096) / nr * nr;
        Blocking { mc, kc, nc }.overridden(overrides(), mr, nr)
    }

    /// These blocks with the set overrides [mc, kc, nc] in their place, rounded to the block
    /// rules: mc and nc whole micro-tiles, kc a multiple of 8 (never 0).
    fn overridden(self, [m, k, n]: &[Option<usize>; 3], mr: usize, nr: usize) -> Blocking {
        let round = |v: usize, unit: usize| (v / unit).max(1) * unit;
        Blocking {
            mc: m.map_or(self.mc, |v| round(v, mr)),
            kc: k.map_or(self.kc, |v| round(v, 8)),
            nc: n.map_or(self.nc, |v| round(v, nr)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_blocks_are_kernel_multiples() {
        assert_eq!(parse_size("48K"), Some(48 << 10));
        assert_eq!(parse_size("32M"), Some(32 << 20));
        assert_eq!(parse_size("abc"), None);
        for c in [CacheSizes::DEFAULT, CacheSizes::get()] {
            let b = Blocking::for_kernel(32, 12, c);
            assert_eq!(b.mc % 32, 0);
            assert_eq!(b.nc % 12, 0);
            assert!(b.kc >= 128 && b.kc <= 512, "{b:?}");
            // The A block fits in L2.
            assert!(b.mc * b.kc * 4 <= c.l2, "{b:?} {c:?}");
        }
    }

    #[test]
    fn avx2_tiles_take_kc_512_on_32_kib_l1_and_avx512_tiles_keep_their_rule() {
        let zen3 = CacheSizes {
            l1d: 32 << 10,
            l2: 512 << 10,
            l3: 32 << 20,
        };
        let avx2 = Blocking::for_kernel(16, 6, zen3);
        assert_eq!((avx2.kc, avx2.mc), (512, 128), "{avx2:?}");
        // (32 + 12) · 4 bytes per k in 32 KiB: 186, rounded down to 184.
        assert_eq!(Blocking::for_kernel(32, 12, zen3).kc, 184);
    }

    #[test]
    fn overrides_take_the_place_of_the_blocks_rounded_to_their_rules() {
        let b = Blocking {
            mc: 256,
            kc: 384,
            nc: 1536,
        };
        assert_eq!(b.overridden(&[None; 3], 32, 12), b);
        let o = b.overridden(&[Some(100), Some(130), Some(50)], 32, 12);
        assert_eq!((o.mc, o.kc, o.nc), (96, 128, 48));
        let tiny = b.overridden(&[Some(1), Some(0), Some(5)], 32, 12);
        assert_eq!((tiny.mc, tiny.kc, tiny.nc), (32, 8, 12));
    }
}
