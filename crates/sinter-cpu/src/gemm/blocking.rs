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
        // One micro-panel of A (mr × kc) and one of B (kc × nr) fit in L1 together.
        let kc = (c.l1d / ((mr + nr) * F32)).clamp(128, 512) / 8 * 8;
        let mc = (c.l2 / 2 / (kc * F32)).clamp(mr, 1024) / mr * mr;
        // One quarter of L3 (it is shared by the cores).
        let nc = (c.l3 / 4 / (kc * F32)).clamp(nr, 4096) / nr * nr;
        let env = |k: &str, d: usize| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        Blocking {
            mc: env("SINTER_GEMM_MC", mc),
            kc: env("SINTER_GEMM_KC", kc),
            nc: env("SINTER_GEMM_NC", nc),
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
}
