//! The activation side of the GGML dot products: rows quantized per block to i8 as llama.cpp
//! does (blocks of 32 against Q8_0/Q4_0/Q4_1 weights, blocks of 256 with the sums of each 16
//! against the k-quants), and the kernel path chosen for the CPU ([`DotPath`]).

use super::blocks::QK;
use super::{GgmlType, QK_K};
use crate::Isa;

/// 32 activations quantized to i8: x ≈ d·q; `s` = d·Σq (for the minimum of Q4_1).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(32))]
pub struct ActQ8 {
    pub qs: [i8; QK],
    pub d: f32,
    pub s: f32,
}

/// 256 activations quantized to i8: x ≈ d·q, with the sum of each 16 q (for the k-quants'
/// minimums and offsets).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(32))]
pub struct ActQ8K {
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
    pub d: f32,
}

/// The scale that maps max|x| to 127, and its inverse (0 for an all-zero block).
fn scale_of(x: &[f32]) -> (f32, f32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    (d, if d > 0.0 { 1.0 / d } else { 0.0 })
}

fn quantize_values(x: &[f32], id: f32, out: &mut [i8]) {
    for (q, &v) in out.iter_mut().zip(x) {
        // |v·id| ≤ 127 up to rounding; the clamp keeps a rounding-up at the edge in range.
        *q = (v * id).round().clamp(-127.0, 127.0) as i8;
    }
}

impl ActQ8 {
    pub fn quantize(x: &[f32]) -> ActQ8 {
        debug_assert_eq!(x.len(), QK);
        let (d, id) = scale_of(x);
        let mut qs = [0i8; QK];
        quantize_values(x, id, &mut qs);
        let sum: i32 = qs.iter().map(|&q| q as i32).sum();
        ActQ8 {
            qs,
            d,
            s: d * sum as f32,
        }
    }
}

impl ActQ8K {
    pub fn quantize(x: &[f32]) -> ActQ8K {
        debug_assert_eq!(x.len(), QK_K);
        let (d, id) = scale_of(x);
        let mut qs = [0i8; QK_K];
        quantize_values(x, id, &mut qs);
        let bsums =
            std::array::from_fn(|j| qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum());
        ActQ8K { qs, bsums, d }
    }
}

/// A row of activations quantized for one kind of weight block.
pub enum ActRow {
    /// Blocks of 32 (Q8_0, Q4_0, Q4_1 weights).
    Q8(Vec<ActQ8>),
    /// Blocks of 256 (Q4_K, Q6_K weights).
    Q8K(Vec<ActQ8K>),
}

/// Which activation blocks a weight type is multiplied with (None: no dot product here).
pub(super) fn act_kind(ty: GgmlType) -> Option<bool> {
    match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 => Some(false),
        GgmlType::Q4_K | GgmlType::Q6_K => Some(true),
        _ => None,
    }
}

/// The weight types that have dot-product kernels (and so can stay quantized in memory).
pub const DOT_TYPES: [GgmlType; 5] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// Whether weights of type `ty` have dot-product kernels.
pub fn has_dot(ty: GgmlType) -> bool {
    act_kind(ty).is_some()
}

/// `x` (whole blocks) quantized as the activation side of weight type `ty`.
pub fn quantize_activations(ty: GgmlType, x: &[f32]) -> ActRow {
    if act_kind(ty) == Some(true) {
        ActRow::Q8K(x.chunks_exact(QK_K).map(ActQ8K::quantize).collect())
    } else {
        ActRow::Q8(x.chunks_exact(QK).map(ActQ8::quantize).collect())
    }
}

/// Which instructions the dot products use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DotPath {
    Scalar,
    /// `vpmaddubsw` + `vpmaddwd`.
    Avx2,
    /// `vpdpbusd` (AVX512-VNNI with VL) on 256-bit registers.
    Avx512Vnni,
}

impl DotPath {
    /// The path for ISA level `isa` on this CPU (`Isa::Avx512` without VNNI runs AVX2).
    pub fn for_isa(isa: Isa) -> DotPath {
        match isa {
            // The SIMD kernels convert the blocks' f16 scales with F16C (every AVX2 CPU has it).
            _ if !f16c_detected() => DotPath::Scalar,
            Isa::Scalar => DotPath::Scalar,
            Isa::Avx2 => DotPath::Avx2,
            Isa::Avx512 if vnni_detected() => DotPath::Avx512Vnni,
            Isa::Avx512 => DotPath::Avx2,
        }
    }

    /// The path kernels use: [`Isa::get`]'s (so `SINTER_CPU_ISA` caps it).
    pub fn get() -> DotPath {
        DotPath::for_isa(Isa::get())
    }

    /// Every path this CPU can run (for tests that run each).
    pub fn available() -> Vec<DotPath> {
        let mut v: Vec<DotPath> = Isa::available().into_iter().map(DotPath::for_isa).collect();
        v.dedup();
        v
    }

    pub fn name(self) -> &'static str {
        match self {
            DotPath::Scalar => "scalar",
            DotPath::Avx2 => "avx2",
            DotPath::Avx512Vnni => "avx512vnni",
        }
    }
}

fn f16c_detected() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn vnni_detected() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
