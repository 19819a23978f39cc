//! The portable GGML dot kernels: the reference for the SIMD ones in `dot_x86`.

use super::act::{ActQ8, ActQ8K};
use super::blocks::{scale_min_k4, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ6K, BlockQ8_0, QK};
use half::f16;

pub(crate) fn f16v(b: [u8; 2]) -> f32 {
    f16::from_le_bytes(b).to_f32()
}

pub fn q8_0(w: &[BlockQ8_0], x: &[ActQ8]) -> f32 {
    let mut acc = 0f32;
    for (w, x) in w.iter().zip(x) {
        let s: i32 = (w.qs.iter().zip(&x.qs))
            .map(|(&a, &b)| (a as i8 as i32) * b as i32)
            .sum();
        acc += f16v(w.d) * x.d * s as f32;
    }
    acc
}

/// Σ nibble·q over a 4-bit block (byte j: value j low, j + 16 high) and Σ q.
fn nibble_dot(qs: &[u8; QK / 2], x: &[i8; QK]) -> i32 {
    let mut s = 0;
    for (j, &b) in qs.iter().enumerate() {
        s += (b & 0xF) as i32 * x[j] as i32 + (b >> 4) as i32 * x[j + QK / 2] as i32;
    }
    s
}

pub fn q4_0(w: &[BlockQ4_0], x: &[ActQ8]) -> f32 {
    let mut acc = 0f32;
    for (w, x) in w.iter().zip(x) {
        let sum_q: i32 = x.qs.iter().map(|&q| q as i32).sum();
        let s = nibble_dot(&w.qs, &x.qs) - 8 * sum_q;
        acc += f16v(w.d) * x.d * s as f32;
    }
    acc
}

pub fn q4_1(w: &[BlockQ4_1], x: &[ActQ8]) -> f32 {
    let mut acc = 0f32;
    for (w, x) in w.iter().zip(x) {
        acc += f16v(w.d) * x.d * nibble_dot(&w.qs, &x.qs) as f32 + f16v(w.m) * x.s;
    }
    acc
}

/// Σ_j min_j · (Σ q over sub-block j of 32) for a Q4_K block.
pub(crate) fn q4_k_mins(w: &BlockQ4K, x: &ActQ8K) -> i32 {
    (0..8)
        .map(|j| {
            let (_, m) = scale_min_k4(j, &w.scales);
            m as i32 * (x.bsums[2 * j] as i32 + x.bsums[2 * j + 1] as i32)
        })
        .sum()
}

pub fn q4_k(w: &[BlockQ4K], x: &[ActQ8K]) -> f32 {
    let mut acc = 0f32;
    for (w, x) in w.iter().zip(x) {
        let mut s = 0i32;
        for (pair, qs) in w.qs.chunks_exact(32).enumerate() {
            let (sc0, _) = scale_min_k4(2 * pair, &w.scales);
            let (sc1, _) = scale_min_k4(2 * pair + 1, &w.scales);
            let xs = &x.qs[64 * pair..64 * pair + 64];
            let (mut lo, mut hi) = (0i32, 0i32);
            for (l, &b) in qs.iter().enumerate() {
                lo += (b & 0xF) as i32 * xs[l] as i32;
                hi += (b >> 4) as i32 * xs[l + 32] as i32;
            }
            s += sc0 as i32 * lo + sc1 as i32 * hi;
        }
        acc += x.d * (f16v(w.d) * s as f32 - f16v(w.dmin) * q4_k_mins(w, x) as f32);
    }
    acc
}

/// 32·Σ_s scale_s · (Σ q over sub-block s of 16): the offset of Q6_K's values.
pub(crate) fn q6_k_offset(w: &BlockQ6K, x: &ActQ8K) -> i32 {
    32 * (w.scales.iter().zip(&x.bsums))
        .map(|(&s, &b)| s as i32 * b as i32)
        .sum::<i32>()
}

pub fn q6_k(w: &[BlockQ6K], x: &[ActQ8K]) -> f32 {
    let mut acc = 0f32;
    for (w, x) in w.iter().zip(x) {
        let mut s = 0i32;
        // Layout as `BlockQ6K::dequantize`: value 128h + 32k + l, scale index value / 16.
        for h in 0..2 {
            let (ql, qh) = (&w.ql[64 * h..64 * h + 64], &w.qh[32 * h..32 * h + 32]);
            for k in 0..4 {
                for l in 0..32 {
                    let low_byte = ql[l + 32 * (k % 2)];
                    let low = if k < 2 { low_byte & 0xF } else { low_byte >> 4 };
                    let q = (low | (((qh[l] >> (2 * k)) & 3) << 4)) as i32;
                    let e = 128 * h + 32 * k + l;
                    s += w.scales[e / 16] as i32 * q * x.qs[e] as i32;
                }
            }
        }
        acc += f16v(w.d) * x.d * (s - q6_k_offset(w, x)) as f32;
    }
    acc
}
