//! Which int8 dot-product instructions the GEMM uses, chosen once at run time.
//!
//! The paths, narrowest first: portable Rust, AVX2 (`vpmaddubsw` + `vpmaddwd`), AVX-VNNI
//! (256-bit `vpdpbusd`, VEX-encoded: Alder Lake and later, Zen 5) and AVX512-VNNI (512-bit
//! `vpdpbusd`: Ice Lake / Cascade Lake and later, Zen 4 and later). AVX-VNNI and AVX512-VNNI
//! are independent features (Cascade Lake has only the second, Alder Lake only the first), so
//! each path is checked on its own. `SINTER_CPU_INT8=scalar|avx2|avxvnni|avx512vnni` caps the
//! choice, and so does `SINTER_CPU_ISA` (scalar → scalar; avx2 → the 256-bit paths); a cap the
//! CPU cannot honour falls to the widest path below it that it can. Every path computes the same
//! i32 accumulators bit for bit, so the choice changes speed only.

use std::sync::OnceLock;

use crate::Isa;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Int8Path {
    /// Portable Rust over the packed layout; the reference the others are tested against.
    Scalar,
    /// AVX2: `vpmaddubsw` on re-centred activations with the sign trick (see `kernel_avx2`).
    Avx2,
    /// AVX-VNNI: 256-bit `vpdpbusd`.
    AvxVnni,
    /// AVX512-VNNI: 512-bit `vpdpbusd`.
    Avx512Vnni,
}

impl Int8Path {
    pub const ALL: [Int8Path; 4] = [
        Int8Path::Scalar,
        Int8Path::Avx2,
        Int8Path::AvxVnni,
        Int8Path::Avx512Vnni,
    ];

    /// Whether this CPU can run the path.
    pub fn supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            match self {
                Int8Path::Scalar => true,
                Int8Path::Avx2 => avx2,
                Int8Path::AvxVnni => avx2 && is_x86_feature_detected!("avxvnni"),
                Int8Path::Avx512Vnni => {
                    is_x86_feature_detected!("avx512f")
                        && is_x86_feature_detected!("avx512bw")
                        && is_x86_feature_detected!("avx512vl")
                        && is_x86_feature_detected!("avx512vnni")
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Int8Path::Scalar
        }
    }

    /// Every path this CPU can run (for tests that run each one).
    pub fn available() -> Vec<Int8Path> {
        Int8Path::ALL
            .into_iter()
            .filter(|p| p.supported())
            .collect()
    }

    /// The widest supported path at or below `cap`.
    pub fn best_up_to(cap: Int8Path) -> Int8Path {
        Int8Path::ALL
            .into_iter()
            .rev()
            .find(|&p| p <= cap && p.supported())
            .unwrap_or(Int8Path::Scalar)
    }

    /// The widest path the CPU offers, ignoring any cap.
    pub fn detected() -> Int8Path {
        Int8Path::best_up_to(Int8Path::Avx512Vnni)
    }

    /// The path the GEMM uses: [`Int8Path::detected`] capped by `SINTER_CPU_INT8` and
    /// `SINTER_CPU_ISA` (read once).
    pub fn get() -> Int8Path {
        static PATH: OnceLock<Int8Path> = OnceLock::new();
        *PATH.get_or_init(|| {
            let env = std::env::var("SINTER_CPU_INT8").ok();
            Int8Path::from_caps(env.as_deref(), Isa::get())
        })
    }

    /// The path for a `SINTER_CPU_INT8` value and an ISA cap (an unknown name is ignored).
    pub fn from_caps(int8_cap: Option<&str>, isa: Isa) -> Int8Path {
        let isa_cap = match isa {
            Isa::Scalar => Int8Path::Scalar,
            Isa::Avx2 => Int8Path::AvxVnni,
            Isa::Avx512 => Int8Path::Avx512Vnni,
        };
        let cap = int8_cap
            .and_then(Int8Path::parse)
            .unwrap_or(Int8Path::Avx512Vnni);
        Int8Path::best_up_to(cap.min(isa_cap))
    }

    pub fn parse(s: &str) -> Option<Int8Path> {
        match s
            .trim()
            .to_ascii_lowercase()
            .replace(['-', '_'], "")
            .as_str()
        {
            "scalar" | "none" => Some(Int8Path::Scalar),
            "avx2" => Some(Int8Path::Avx2),
            "avxvnni" => Some(Int8Path::AvxVnni),
            "avx512vnni" | "avx512" | "vnni" => Some(Int8Path::Avx512Vnni),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Int8Path::Scalar => "scalar",
            Int8Path::Avx2 => "avx2",
            Int8Path::AvxVnni => "avxvnni",
            Int8Path::Avx512Vnni => "avx512vnni",
        }
    }
}

impl std::fmt::Display for Int8Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_never_exceed_the_cpu_and_names_round_trip() {
        for p in Int8Path::ALL {
            assert_eq!(Int8Path::parse(p.name()), Some(p));
            assert!(Int8Path::best_up_to(p) <= p);
            assert!(Int8Path::best_up_to(p).supported());
        }
        assert_eq!(Int8Path::parse("AVX512-VNNI"), Some(Int8Path::Avx512Vnni));
        assert_eq!(Int8Path::parse("amx"), None);
        assert!(Int8Path::get().supported());
        assert_eq!(
            Int8Path::from_caps(Some("scalar"), Isa::Avx512),
            Int8Path::Scalar
        );
        // The ISA cap wins over a wider int8 request; an unknown name means no int8 cap.
        assert_eq!(
            Int8Path::from_caps(Some("avx512vnni"), Isa::Scalar),
            Int8Path::Scalar
        );
        assert!(Int8Path::from_caps(Some("avx512vnni"), Isa::Avx2) <= Int8Path::AvxVnni);
        assert_eq!(
            Int8Path::from_caps(Some("bogus"), Isa::detected()),
            Int8Path::from_caps(None, Isa::detected())
        );
        assert_eq!(Int8Path::available().first(), Some(&Int8Path::Scalar));
    }
}
