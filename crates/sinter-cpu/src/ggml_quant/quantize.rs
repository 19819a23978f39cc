//! f32 values to GGML blocks (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) and the plain float types, for
//! writing GGUF files (`sinter quantize --format`).
//!
//! Each block is quantized from its own minimum and maximum, its scales rounded so that the
//! block's extreme values stay representable (no clipping there): every value is then within
//! half a step of its block (or sub-block) of the original, except where a sign-symmetric
//! format (Q4_0, Q6_K) has one more negative level than positive ones and the value opposite
//! the extreme sits on the short side: within one step. `step_bound` gives each value's step
//! for the tests. This is the plain min-max quantizer; llama.cpp's `llama-quantize` also
//! searches the k-quants' sub-block scales for a lower error, which this does not.

use half::f16;
use rayon::prelude::*;

use super::blocks::{BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ6K, BlockQ8_0, QK};
use super::{GgmlBlock, GgmlError, GgmlType, QK_K};

/// The types [`quantize`] writes.
pub const QUANTIZE_TYPES: [GgmlType; 7] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// `x` as `ty`'s bytes. `x` is whole rows whose length `row` is a multiple of the type's
/// block; an error names the type and the lengths otherwise.
pub fn quantize(ty: GgmlType, x: &[f32], row: usize) -> Result<Vec<u8>, GgmlError> {
    if !QUANTIZE_TYPES.contains(&ty) {
        let names: Vec<&str> = QUANTIZE_TYPES.iter().map(|t| t.name()).collect();
        return Err(GgmlError(format!(
            "sinter cannot write {ty}; it writes {}",
            names.join(", ")
        )));
    }
    if row == 0 || !x.len().is_multiple_of(row) {
        return Err(GgmlError(format!(
            "{} values are not whole rows of {row}",
            x.len()
        )));
    }
    let row_bytes = ty.bytes_for(row)?;
    let mut out = vec![0u8; x.len() / row * row_bytes];
    out.par_chunks_mut(row_bytes)
        .zip(x.par_chunks(row))
        .for_each(|(o, x)| quantize_row(ty, x, o));
    Ok(out)
}

fn quantize_row(ty: GgmlType, x: &[f32], out: &mut [u8]) {
    match ty {
        GgmlType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
            }
        }
        GgmlType::Q8_0 => blocks_of(x, out, q8_0),
        GgmlType::Q4_0 => blocks_of(x, out, q4_0),
        GgmlType::Q4_1 => blocks_of(x, out, q4_1),
        GgmlType::Q4_K => blocks_of(x, out, q4_k),
        GgmlType::Q6_K => blocks_of(x, out, q6_k),
        _ => unreachable!("quantize checked the type"),
    }
}

fn blocks_of<B: GgmlBlock>(x: &[f32], out: &mut [u8], f: fn(&[f32]) -> B) {
    let size = std::mem::size_of::<B>();
    for (o, x) in out.chunks_exact_mut(size).zip(x.chunks_exact(B::ELEMS)) {
        o.copy_from_slice(bytemuck::bytes_of(&f(x)));
    }
}

/// The smallest f16 at least `v` (≥ 0): a scale rounded up keeps the block's extremes in range.
fn f16_up(v: f32) -> f16 {
    let h = f16::from_f32(v);
    if h.to_f32() >= v {
        h
    } else {
        f16::from_bits(h.to_bits() + 1)
    }
}

/// 1/d, or 0 for a zero scale (an all-zero block stores q = 0 or the offset).
fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// The value of largest magnitude, with its sign.
fn signed_max(x: &[f32]) -> f32 {
    x.iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m })
}

fn q8_0(x: &[f32]) -> BlockQ8_0 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = f16_up(amax / 127.0);
    let id = inverse(d.to_f32());
    BlockQ8_0 {
        d: d.to_le_bytes(),
        qs: std::array::from_fn(|j| (x[j] * id).round().clamp(-127.0, 127.0) as i8 as u8),
    }
}

/// Nibble bytes of 32 values in 0..16: byte j holds value j (low) and j + 16 (high).
fn pack_nibbles(q: &[u8]) -> [u8; QK / 2] {
    std::array::from_fn(|j| q[j] | (q[j + QK / 2] << 4))
}

fn q4_0(x: &[f32]) -> BlockQ4_0 {
    // The extreme maps to level −8 (the format has 8 negative levels, 7 positive).
    let max = signed_max(x);
    let d = f16_up(max.abs() / 8.0);
    let d = if max > 0.0 { -d } else { d };
    let id = inverse(d.to_f32());
    let q: Vec<u8> = x
        .iter()
        .map(|v| ((v * id).round() + 8.0).clamp(0.0, 15.0) as u8)
        .collect();
    BlockQ4_0 {
        d: d.to_le_bytes(),
        qs: pack_nibbles(&q),
    }
}

fn q4_1(x: &[f32]) -> BlockQ4_1 {
    let min = x.iter().fold(f32::INFINITY, |m, &v| m.min(v));
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    // m is rounded to f16 down, d up, so that both extremes stay within the 16 levels.
    let m = if min < 0.0 {
        -f16_up(-min)
    } else {
        let m = f16::from_f32(min);
        match m.to_f32() > min {
            true => f16::from_bits(m.to_bits() - 1), // m > min ≥ 0: the next f16 down
            false => m,
        }
    };
    let d = f16_up((max - m.to_f32()) / 15.0);
    let id = inverse(d.to_f32());
    let q: Vec<u8> = x
        .iter()
        .map(|v| ((v - m.to_f32()) * id).round().clamp(0.0, 15.0) as u8)
        .collect();
    BlockQ4_1 {
        d: d.to_le_bytes(),
        m: m.to_le_bytes(),
        qs: pack_nibbles(&q),
    }
}

/// The 12 bytes holding eight 6-bit scales and minimums (the inverse of
/// `blocks::scale_min_k4`).
fn pack_scale_min_k4(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            q[j] |= sc[j];
            q[j + 4] |= m[j];
        } else {
            q[j + 4] = (sc[j] & 0xF) | ((m[j] & 0xF) << 4);
            q[j - 4] |= (sc[j] >> 4) << 6;
            q[j] |= (m[j] >> 4) << 6;
        }
    }
    q
}

fn q4_k(x: &[f32]) -> BlockQ4K {
    // Sub-block j (32 values) holds d·sc_j·q − dmin·m_j: its minimum (≤ 0, as the format
    // subtracts) from m_j, rounded up; then its scale, rounded up to cover the maximum.
    let subs: Vec<(f32, f32)> = x
        .chunks_exact(32)
        .map(|s| {
            let lo = s.iter().fold(0f32, |m, &v| m.min(v));
            let hi = s.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            (-lo, hi)
        })
        .collect();
    let max_min = subs.iter().fold(0f32, |m, s| m.max(s.0));
    let dmin = f16_up(max_min / 63.0);
    let m: [u8; 8] =
        std::array::from_fn(|j| (subs[j].0 * inverse(dmin.to_f32())).ceil().min(63.0) as u8);
    let ranges: [f32; 8] =
        std::array::from_fn(|j| (subs[j].1 + dmin.to_f32() * m[j] as f32).max(0.0) / 15.0);
    let d = f16_up(ranges.iter().fold(0f32, |a, &r| a.max(r)) / 63.0);
    let sc: [u8; 8] =
        std::array::from_fn(|j| (ranges[j] * inverse(d.to_f32())).ceil().min(63.0) as u8);
    let mut qs = [0u8; QK_K / 2];
    for (pair, qs) in qs.chunks_exact_mut(32).enumerate() {
        let level = |j: usize, v: f32| {
            let step = d.to_f32() * sc[j] as f32;
            ((v + dmin.to_f32() * m[j] as f32) * inverse(step))
                .round()
                .clamp(0.0, 15.0) as u8
        };
        let (lo, hi) = (2 * pair, 2 * pair + 1);
        for (l, q) in qs.iter_mut().enumerate() {
            *q = level(lo, x[64 * pair + l]) | (level(hi, x[64 * pair + 32 + l]) << 4);
        }
    }
    BlockQ4K {
        d: d.to_le_bytes(),
        dmin: dmin.to_le_bytes(),
        scales: pack_scale_min_k4(&sc, &m),
        qs,
    }
}

fn q6_k(x: &[f32]) -> BlockQ6K {
    // Sub-block j (16 values) holds d·sc_j·(q − 32), sc_j signed: its extreme maps to −32
    // (|sc_j| rounded up so it stays in range).
    let want: Vec<f32> = x.chunks_exact(16).map(|s| -signed_max(s) / 32.0).collect();
    let d = f16_up(want.iter().fold(0f32, |m, w| m.max(w.abs())) / 127.0);
    let id = inverse(d.to_f32());
    let scales: [i8; 16] = std::array::from_fn(|j| {
        let s = (want[j].abs() * id).ceil().min(127.0);
        (if want[j] < 0.0 { -s } else { s }) as i8
    });
    let mut q = [0u8; QK_K];
    for (j, (qj, xj)) in q.chunks_exact_mut(16).zip(x.chunks_exact(16)).enumerate() {
        let inv = inverse(d.to_f32() * scales[j] as f32);
        for (q, v) in qj.iter_mut().zip(xj) {
            *q = ((v * inv).round() + 32.0).clamp(0.0, 63.0) as u8;
        }
    }
    // The inverse of BlockQ6K's layout: value l of quarter k of each half of 128 keeps its
    // low nibble in ql[l + 32·(k % 2)] (low for k < 2, high otherwise), its top 2 bits in
    // qh[l] at bit 2k.
    let (mut ql, mut qh) = ([0u8; QK_K / 2], [0u8; QK_K / 4]);
    for half in 0..2 {
        for k in 0..4 {
            for l in 0..32 {
                let v = q[128 * half + 32 * k + l];
                let low = v & 0xF;
                ql[64 * half + l + 32 * (k % 2)] |= if k < 2 { low } else { low << 4 };
                qh[32 * half + l] |= (v >> 4) << (2 * k);
            }
        }
    }
    BlockQ6K {
        ql,
        qh,
        scales,
        d: d.to_le_bytes(),
    }
}

/// For each of `bytes`' values (type `ty`, whole blocks), the step between its block's (or
/// sub-block's) levels: [`quantize`] puts every value within half a step of its original,
/// or one step for Q4_0 and Q6_K's short side (see the module's comment).
pub fn step_bound(ty: GgmlType, bytes: &[u8]) -> Result<Vec<f32>, GgmlError> {
    let f = |b: [u8; 2]| f16::from_le_bytes(b).to_f32();
    let blocks = bytes.len() / ty.block_bytes();
    let mut out = Vec::with_capacity(blocks * ty.block_elems());
    let bad = || GgmlError(format!("{} bytes are not whole {ty} blocks", bytes.len()));
    match ty {
        GgmlType::Q8_0 => {
            for b in super::as_blocks::<BlockQ8_0>(bytes).ok_or_else(bad)? {
                out.extend([f(b.d).abs(); QK]);
            }
        }
        GgmlType::Q4_0 => {
            for b in super::as_blocks::<BlockQ4_0>(bytes).ok_or_else(bad)? {
                out.extend([f(b.d).abs(); QK]);
            }
        }
        GgmlType::Q4_1 => {
            for b in super::as_blocks::<BlockQ4_1>(bytes).ok_or_else(bad)? {
                out.extend([f(b.d).abs(); QK]);
            }
        }
        GgmlType::Q4_K => {
            for b in super::as_blocks::<BlockQ4K>(bytes).ok_or_else(bad)? {
                for j in 0..8 {
                    let (sc, _) = super::blocks::scale_min_k4(j, &b.scales);
                    out.extend([f(b.d) * sc as f32; 32]);
                }
            }
        }
        GgmlType::Q6_K => {
            for b in super::as_blocks::<BlockQ6K>(bytes).ok_or_else(bad)? {
                for s in b.scales {
                    out.extend([(f(b.d) * s as f32).abs(); 16]);
                }
            }
        }
        _ => return Err(GgmlError(format!("no steps for {ty}: not a block format"))),
    }
    Ok(out)
}
