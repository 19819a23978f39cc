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
        // Ties to even, as the SIMD rounding does (so both give the same bytes).
        *q = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
}

impl ActQ8 {
    pub fn quantize(x: &[f32]) -> ActQ8 {
        debug_assert_eq!(x.len(), QK);
        const { assert!(QK == 32, "x86::quantize_q8 handles blocks of 32") };
        #[cfg(target_arch = "x86_64")]
        if simd_quantize() {
            // SAFETY: AVX2 is present (`simd_quantize`) and x is one block (checked by the
            // callers' chunks; asserted inside).
            let (qs, d, sum) = unsafe { x86::quantize_q8(x) };
            return ActQ8::of(qs, d, sum);
        }
        ActQ8::quantize_portable(x)
    }

    /// `quantize` in portable Rust (the reference of the AVX2 form).
    fn quantize_portable(x: &[f32]) -> ActQ8 {
        let (d, id) = scale_of(x);
        let mut qs = [0i8; QK];
        quantize_values(x, id, &mut qs);
        let sum: i32 = qs.iter().map(|&q| q as i32).sum();
        ActQ8::of(qs, d, sum)
    }

    /// The block of these quants, scale and quant sum.
    fn of(qs: [i8; QK], d: f32, sum: i32) -> ActQ8 {
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

/// Whether blocks of 32 are quantized with AVX2 (bit for bit as the portable loop): per
/// generated token a model quantizes thousands of them, and the portable loop's rounding is
/// a libm call per value.
#[cfg(target_arch = "x86_64")]
fn simd_quantize() -> bool {
    Isa::get() >= Isa::Avx2
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Values in a block (`QK`; restated so that this module needs nothing from its parent).
    const BLOCK: usize = 32;

    /// `ActQ8::quantize` of one block on AVX2: the same max, scale, products and rounding
    /// (to nearest, ties to even) as the portable loop; (quants, scale, sum of the quants).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_q8(x: &[f32]) -> ([i8; BLOCK], f32, i32) {
        assert_eq!(x.len(), BLOCK);
        unsafe {
            let p = x.as_ptr();
            // Loops, not closures: a closure would not inherit the target feature.
            let mut v = [_mm256_setzero_ps(); 4];
            for (i, vi) in v.iter_mut().enumerate() {
                *vi = _mm256_loadu_ps(p.add(8 * i));
            }
            let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
            let mut m = _mm256_and_ps(v[0], abs);
            for vi in &v[1..] {
                m = _mm256_max_ps(m, _mm256_and_ps(*vi, abs));
            }
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
            let d = amax / 127.0;
            let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
            const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
            let mut q = [_mm256_setzero_si256(); 4];
            for (qi, vi) in q.iter_mut().zip(v) {
                *qi = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(vi, id), NEAREST));
            }
            // i32 → i16 → i8 saturating (|q| ≤ 127 already); the packs interleave 128-bit
            // lanes, which the final permute puts back in order.
            let q16a = _mm256_packs_epi32(q[0], q[1]);
            let q16b = _mm256_packs_epi32(q[2], q[3]);
            let q8 = _mm256_packs_epi16(q16a, q16b);
            let q8 = _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            let mut qs = [0i8; BLOCK];
            _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, q8);
            let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let sum = _mm_add_epi32(
                _mm256_castsi256_si128(sum),
                _mm256_extracti128_si256(sum, 1),
            );
            let sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0b01_00_11_10));
            let sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0b10_11_00_01));
            (qs, d, _mm_cvtsi128_si32(sum))
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_block_quantization_equals_the_portable_loop_bit_for_bit() {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") {
            // Values at exact half steps (ties), an outlier, zeros and a tiny block.
            let mut seed = 7u64;
            let mut blocks: Vec<Vec<f32>> = (0..200)
                .map(|b| {
                    (0..QK)
                        .map(|i| {
                            seed ^= seed << 13;
                            seed ^= seed >> 7;
                            seed ^= seed << 17;
                            let u = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                            match (b % 4, i) {
                                (0, 0) => 127.0,
                                (0, _) => (i as f32 - 16.0) + 0.5,
                                (1, 3) => 40.0 * u,
                                (2, _) => 1e-30 * u,
                                _ => u,
                            }
                        })
                        .collect()
                })
                .collect();
            blocks.push(vec![0.0; QK]);
            for (n, x) in blocks.iter().enumerate() {
                // SAFETY: AVX2 is present (checked above).
                let (qs, d, sum) = unsafe { x86::quantize_q8(x) };
                let simd = ActQ8::of(qs, d, sum);
                let port = ActQ8::quantize_portable(x);
                assert_eq!(simd.qs, port.qs, "block {n}");
                assert_eq!(simd.d.to_bits(), port.d.to_bits(), "block {n}");
                assert_eq!(simd.s.to_bits(), port.s.to_bits(), "block {n}");
            }
        }
    }
}
