//! The quantized blocks of GGML, byte for byte as llama.cpp's `ggml-common.h` lays them out.
//!
//! Every field is a byte array, so a block has alignment 1 and any whole-block byte slice of a
//! memory-mapped file can be viewed as `&[Block]` (`super::as_blocks`); the multi-byte scales
//! are little-endian and read through accessors. The size of each struct is asserted at
//! compile time against ggml's.
//!
//! Reading a block: most formats store 4-, 5- or 6-bit unsigned integers q and a scale d,
//! value = d·(q − offset) ("symmetric", types _0, Q3_K, Q6_K) or d·q + m / d·q − m
//! ("with a minimum", _1, Q2_K, Q4_K, Q5_K). The k-quants (256 values) nest sub-blocks of 16
//! or 32 values, each with its own small integer scale (and minimum) multiplied by the
//! block's f16 `d` (and `dmin`).

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::types::{GgmlError, GgmlType, QK_K};

/// A GGML quantized block: `ELEMS` values in `size_of::<Self>()` bytes.
pub trait GgmlBlock: Pod + Send + Sync {
    const TYPE: GgmlType;
    const ELEMS: usize;
    /// Writes the block's `ELEMS` values to `out` (which is `ELEMS` long).
    fn dequantize(&self, out: &mut [f32]);
}

fn f16_le(b: [u8; 2]) -> f32 {
    f16::from_le_bytes(b).to_f32()
}

/// Values in one block of the "legacy" formats Q4_0 … Q8_0 (`QK4_0` etc. in llama.cpp).
pub const QK: usize = 32;

/// Q4_0: 32 values, 4 bits each, value = d·(q − 8). Byte j holds value j in its low nibble
/// and value j + 16 in its high nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK / 2],
}

/// Q4_1: as Q4_0 with unsigned q and a minimum: value = d·q + m.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; QK / 2],
}

/// Q5_0: Q4_0's nibbles plus a fifth bit per value in `qh` (a little-endian u32, bit j for
/// value j), value = d·(q − 16).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_0 {
    pub d: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q5_1: Q5_0's 5-bit q, unsigned, with a minimum: value = d·q + m.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q8_0: 32 signed bytes, value = d·q.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK],
}

/// Q2_K: 16 sub-blocks of 16 values, 2 bits each; each sub-block has a 4-bit scale (low
/// nibble of `scales`) and 4-bit minimum (high nibble): value = d·sc·q − dmin·m.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: [u8; 2],
    pub dmin: [u8; 2],
}

/// Q3_K: 16 sub-blocks of 16 values, 3 bits each (2 in `qs`, the high one in `hmask`,
/// stored inverted: a clear bit subtracts 4); 6-bit sub-block scales packed into 12 bytes,
/// offset by 32: value = d·(sc − 32)·q.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: [u8; 2],
}

/// Q4_K: 8 sub-blocks of 32 values, 4 bits each, with 6-bit scales and minimums packed into
/// 12 bytes (`scale_min_k4`): value = d·sc·q − dmin·m.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}

/// Q5_K: Q4_K with a fifth bit per value in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// Q6_K: 16 sub-blocks of 16 values, 6 bits each (low 4 in `ql`, high 2 in `qh`), signed
/// 8-bit sub-block scales: value = d·sc·(q − 32).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: [u8; 2],
}

/// Q8_K: 256 signed bytes with an f32 scale, and the sums of each 16 (for dot products
/// against the other k-quants): value = d·q.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8K {
    pub d: [u8; 4],
    pub qs: [i8; QK_K],
    pub bsums: [u8; QK_K / 16 * 2],
}

// The byte sizes of ggml-common.h (its static_asserts).
const _: () = {
    use std::mem::size_of;
    assert!(size_of::<BlockQ4_0>() == 2 + QK / 2);
    assert!(size_of::<BlockQ4_1>() == 4 + QK / 2);
    assert!(size_of::<BlockQ5_0>() == 2 + 4 + QK / 2);
    assert!(size_of::<BlockQ5_1>() == 4 + 4 + QK / 2);
    assert!(size_of::<BlockQ8_0>() == 2 + QK);
    assert!(size_of::<BlockQ2K>() == 4 + QK_K / 16 + QK_K / 4);
    assert!(size_of::<BlockQ3K>() == 2 + QK_K / 4 + QK_K / 8 + 12);
    assert!(size_of::<BlockQ4K>() == 4 + 12 + QK_K / 2);
    assert!(size_of::<BlockQ5K>() == 4 + 12 + QK_K / 2 + QK_K / 8);
    assert!(size_of::<BlockQ6K>() == 2 + QK_K / 16 + 3 * QK_K / 4);
    assert!(size_of::<BlockQ8K>() == 4 + QK_K + QK_K / 16 * 2);
    assert!(std::mem::align_of::<BlockQ8K>() == 1);
};

impl GgmlBlock for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const ELEMS: usize = QK;
    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        let (lo, hi) = out.split_at_mut(QK / 2);
        for ((q, l), h) in self.qs.iter().zip(lo).zip(hi) {
            *l = d * ((q & 0xF) as i32 - 8) as f32;
            *h = d * ((q >> 4) as i32 - 8) as f32;
        }
    }
}

impl GgmlBlock for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const ELEMS: usize = QK;
    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (f16_le(self.d), f16_le(self.m));
        let (lo, hi) = out.split_at_mut(QK / 2);
        for ((q, l), h) in self.qs.iter().zip(lo).zip(hi) {
            *l = d * (q & 0xF) as f32 + m;
            *h = d * (q >> 4) as f32 + m;
        }
    }
}

/// The 5-bit values of a Q5 block: nibble j of `qs` and bit j of `qh` (low nibbles are values
/// 0..16, high nibbles 16..32).
fn q5_values(qs: &[u8; QK / 2], qh: [u8; 4]) -> [u8; QK] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; QK];
    for (j, &byte) in qs.iter().enumerate() {
        q[j] = (byte & 0xF) | ((((qh >> j) & 1) as u8) << 4);
        q[j + QK / 2] = (byte >> 4) | ((((qh >> (j + QK / 2)) & 1) as u8) << 4);
    }
    q
}

impl GgmlBlock for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const ELEMS: usize = QK;
    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        for (o, q) in out.iter_mut().zip(q5_values(&self.qs, self.qh)) {
            *o = d * (q as i32 - 16) as f32;
        }
    }
}

impl GgmlBlock for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const ELEMS: usize = QK;
    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (f16_le(self.d), f16_le(self.m));
        for (o, q) in out.iter_mut().zip(q5_values(&self.qs, self.qh)) {
            *o = d * q as f32 + m;
        }
    }
}

impl GgmlBlock for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const ELEMS: usize = QK;
    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = d * (q as i8) as f32;
        }
    }
}

impl GgmlBlock for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    const ELEMS: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (f16_le(self.d), f16_le(self.dmin));
        // Each half of the block (128 values) reads 32 bytes of qs four times, two bits
        // further each time; every pass covers two sub-blocks of 16.
        let mut scales = self.scales.iter();
        let mut out = out.chunks_exact_mut(16);
        for qs in self.qs.chunks_exact(32) {
            for shift in [0, 2, 4, 6] {
                for half in qs.chunks_exact(16) {
                    let sc = scales.next().expect("16 scales");
                    let (dl, ml) = (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32);
                    let o = out.next().expect("16 sub-blocks");
                    for (o, q) in o.iter_mut().zip(half) {
                        *o = dl * ((q >> shift) & 3) as f32 - ml;
                    }
                }
            }
        }
    }
}

impl BlockQ3K {
    /// The 16 six-bit sub-block scales: the low 4 bits are nibbles of bytes 0..8 (sub-block
    /// i < 8 in the low nibble of byte i, i ≥ 8 in the high nibble of byte i − 8); the high 2
    /// bits are 2-bit fields of bytes 8..12 (byte 8 + i % 4, field i / 4).
    pub fn sub_scales(&self) -> [i32; 16] {
        let s = &self.scales;
        std::array::from_fn(|i| {
            let low = if i < 8 { s[i] & 0xF } else { s[i - 8] >> 4 };
            let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
            (low | (high << 4)) as i32 - 32
        })
    }
}

impl GgmlBlock for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    const ELEMS: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        let scales = self.sub_scales();
        // As Q2_K: two halves of 128 values, four 2-bit passes over 32 bytes of qs each. The
        // high bit of value k of a pass is bit (pass index) of hmask[k], over all 8 passes.
        let mut sub = 0;
        let mut out = out.chunks_exact_mut(16);
        let mut mask_bit = 0;
        for qs in self.qs.chunks_exact(32) {
            for shift in [0, 2, 4, 6] {
                for (half, hmask) in qs.chunks_exact(16).zip(self.hmask.chunks_exact(16)) {
                    let dl = d * scales[sub] as f32;
                    sub += 1;
                    let o = out.next().expect("16 sub-blocks");
                    for ((o, q), h) in o.iter_mut().zip(half).zip(hmask) {
                        let high = if (h >> mask_bit) & 1 == 1 { 0 } else { 4 };
                        *o = dl * (((q >> shift) & 3) as i32 - high) as f32;
                    }
                }
                mask_bit += 1;
            }
        }
    }
}

/// Scale and minimum of sub-block `j` (0..8) of a Q4_K/Q5_K block, from their 12 packed bytes
/// (`get_scale_min_k4`): sub-blocks 0..4 are the low 6 bits of bytes j and j + 4; sub-blocks
/// 4..8 take their low 4 bits from a nibble of byte j + 4 and their high 2 bits from the top
/// of bytes j − 4 (scale) and j (minimum).
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// All eight (scale, minimum) pairs of [`scale_min_k4`] at once, by word arithmetic on the
/// twelve bytes (for the dot kernels, where unpacking them one by one cost more than the
/// products): sub-blocks 0–3 are the low six bits of bytes 0–3 (scales) and 4–7
/// (minimums); sub-blocks 4–7 take their low four bits from the nibbles of bytes 8–11 (low:
/// scales, high: minimums) and their top two from the high bits of bytes 0–3 (scales) and
/// 4–7 (minimums).
#[inline(always)]
pub fn scales_mins_k4(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const TOP2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let scales_hi = (w2 & LOW4) | (((w0 >> 6) & TOP2) << 4);
    let mins_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & TOP2) << 4);
    let join = |lo: u32, hi: u32| {
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&lo.to_le_bytes());
        out[4..].copy_from_slice(&hi.to_le_bytes());
        out
    };
    (join(w0 & LOW6, scales_hi), join(w1 & LOW6, mins_hi))
}

impl GgmlBlock for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const ELEMS: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (f16_le(self.d), f16_le(self.dmin));
        // Each 32 bytes of qs hold two sub-blocks: the low nibbles, then the high ones.
        for (pair, (qs, out)) in self
            .qs
            .chunks_exact(32)
            .zip(out.chunks_exact_mut(64))
            .enumerate()
        {
            let (sc0, m0) = scale_min_k4(2 * pair, &self.scales);
            let (sc1, m1) = scale_min_k4(2 * pair + 1, &self.scales);
            let (d0, min0) = (d * sc0 as f32, dmin * m0 as f32);
            let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
            let (lo, hi) = out.split_at_mut(32);
            for ((q, l), h) in qs.iter().zip(lo).zip(hi) {
                *l = d0 * (q & 0xF) as f32 - min0;
                *h = d1 * (q >> 4) as f32 - min1;
            }
        }
    }
}

impl GgmlBlock for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    const ELEMS: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (f16_le(self.d), f16_le(self.dmin));
        // As Q4_K; the fifth bit of value l of sub-block s is bit s of qh[l].
        for (pair, (qs, out)) in self
            .qs
            .chunks_exact(32)
            .zip(out.chunks_exact_mut(64))
            .enumerate()
        {
            let (sc0, m0) = scale_min_k4(2 * pair, &self.scales);
            let (sc1, m1) = scale_min_k4(2 * pair + 1, &self.scales);
            let (d0, min0) = (d * sc0 as f32, dmin * m0 as f32);
            let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
            let (lo, hi) = out.split_at_mut(32);
            for (l, (q, h)) in qs.iter().zip(&self.qh).enumerate() {
                let h0 = ((h >> (2 * pair)) & 1) << 4;
                let h1 = ((h >> (2 * pair + 1)) & 1) << 4;
                lo[l] = d0 * ((q & 0xF) | h0) as f32 - min0;
                hi[l] = d1 * ((q >> 4) | h1) as f32 - min1;
            }
        }
    }
}

impl GgmlBlock for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const ELEMS: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        // Each half (128 values) reads 64 bytes of ql and 32 of qh. Value l of quarter k
        // (k = 0..4, l = 0..32): low 4 bits from ql[l + 32·(k % 2)] (low nibble for k < 2,
        // high for k ≥ 2), high 2 bits from qh[l] at bit 2k; scale = scales[8·half + 2k + l/16].
        for (half, ((ql, qh), out)) in self
            .ql
            .chunks_exact(64)
            .zip(self.qh.chunks_exact(32))
            .zip(out.chunks_exact_mut(128))
            .enumerate()
        {
            let scales = &self.scales[8 * half..8 * half + 8];
            for (k, out) in out.chunks_exact_mut(32).enumerate() {
                for (l, o) in out.iter_mut().enumerate() {
                    let low_byte = ql[l + 32 * (k % 2)];
                    let low = if k < 2 { low_byte & 0xF } else { low_byte >> 4 };
                    let high = (qh[l] >> (2 * k)) & 3;
                    let q = (low | (high << 4)) as i32 - 32;
                    *o = d * scales[2 * k + l / 16] as f32 * q as f32;
                }
            }
        }
    }
}

impl GgmlBlock for BlockQ8K {
    const TYPE: GgmlType = GgmlType::Q8_K;
    const ELEMS: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = f32::from_le_bytes(self.d);
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = d * q as f32;
        }
    }
}

/// The sizes of each type's blocks: they follow from the layouts above.
impl GgmlType {
    /// Values in one block (1 for the plain float types).
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 => BlockQ4_0::ELEMS,
            GgmlType::Q4_1 => BlockQ4_1::ELEMS,
            GgmlType::Q5_0 => BlockQ5_0::ELEMS,
            GgmlType::Q5_1 => BlockQ5_1::ELEMS,
            GgmlType::Q8_0 => BlockQ8_0::ELEMS,
            GgmlType::Q2_K => BlockQ2K::ELEMS,
            GgmlType::Q3_K => BlockQ3K::ELEMS,
            GgmlType::Q4_K => BlockQ4K::ELEMS,
            GgmlType::Q5_K => BlockQ5K::ELEMS,
            GgmlType::Q6_K => BlockQ6K::ELEMS,
            GgmlType::Q8_K => BlockQ8K::ELEMS,
        }
    }

    /// Bytes of one block.
    pub fn block_bytes(self) -> usize {
        use std::mem::size_of;
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => size_of::<BlockQ4_0>(),
            GgmlType::Q4_1 => size_of::<BlockQ4_1>(),
            GgmlType::Q5_0 => size_of::<BlockQ5_0>(),
            GgmlType::Q5_1 => size_of::<BlockQ5_1>(),
            GgmlType::Q8_0 => size_of::<BlockQ8_0>(),
            GgmlType::Q2_K => size_of::<BlockQ2K>(),
            GgmlType::Q3_K => size_of::<BlockQ3K>(),
            GgmlType::Q4_K => size_of::<BlockQ4K>(),
            GgmlType::Q5_K => size_of::<BlockQ5K>(),
            GgmlType::Q6_K => size_of::<BlockQ6K>(),
            GgmlType::Q8_K => size_of::<BlockQ8K>(),
        }
    }

    /// Bytes that `n` values of this type take. ggml quantizes along rows, so `n` (a row's
    /// length, or a whole tensor's) must be whole blocks; an error says so otherwise.
    pub fn bytes_for(self, n: usize) -> Result<usize, GgmlError> {
        let be = self.block_elems();
        if !n.is_multiple_of(be) {
            return Err(GgmlError(format!(
                "{n} values are not whole {} blocks of {be}: every row of a {} tensor must be a multiple of {be} long",
                self.name(),
                self.name()
            )));
        }
        (n / be).checked_mul(self.block_bytes()).ok_or_else(|| {
            GgmlError(format!(
                "{n} {} values take more bytes than fit in memory",
                self.name()
            ))
        })
    }
}
