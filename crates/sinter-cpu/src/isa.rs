//! Run-time choice of the SIMD instruction set. Kernels never assume the machine they were
//! built on: each entry point asks [`Isa::get`] and calls the widest path the CPU offers.
//! `SINTER_CPU_ISA=scalar|avx2|avx512` caps the choice (a cap above what the CPU has is
//! lowered to what it has), so the tests run every narrower path on a wide machine.

use std::sync::OnceLock;

/// The instruction-set levels the kernels are written for, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable Rust; the reference every SIMD path is tested against.
    Scalar,
    /// AVX2 + FMA (x86-64-v3).
    Avx2,
    /// AVX-512 F/BW/VL/DQ (x86-64-v4).
    Avx512,
}

impl Isa {
    /// The widest level this CPU supports, ignoring any cap.
    pub fn detected() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512dq")
            {
                return Isa::Avx512;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// The level kernels use: [`Isa::detected`] capped by `SINTER_CPU_ISA` (read once).
    pub fn get() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            let detected = Isa::detected();
            match std::env::var("SINTER_CPU_ISA")
                .ok()
                .as_deref()
                .map(Isa::parse)
            {
                Some(Some(cap)) => cap.min(detected),
                _ => detected,
            }
        })
    }

    /// Every level up to the detected one (for tests that run each path).
    pub fn available() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|&i| i <= Isa::detected())
            .collect()
    }

    pub fn parse(s: &str) -> Option<Isa> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" | "none" => Some(Isa::Scalar),
            "avx2" => Some(Isa::Avx2),
            "avx512" | "avx-512" => Some(Isa::Avx512),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_never_exceeds_detection_and_names_round_trip() {
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        assert_eq!(Isa::parse("sse9"), None);
        assert!(Isa::get() <= Isa::detected());
        assert_eq!(Isa::available().last().copied(), Some(Isa::detected()));
    }
}
