//! Dot products of GGML weight blocks with quantized activations, and the GEMV/GEMM over a
//! quantized weight matrix built from them (what llama.cpp's `vec_dot` kernels do).
//!
//! Activations are quantized per block at run time, symmetric to i8 (d = max|x|/127 in f32,
//! q = round(x/d)): blocks of 32 ([`ActQ8`]) against Q8_0, Q4_0 and Q4_1 weights, blocks of
//! 256 with the sums of each 16 ([`ActQ8K`]) against Q4_K and Q6_K. Each product is then
//! integer arithmetic per block (per sub-block for the k-quants) times the two f32 scales.
//! Against the exact f32 product of the dequantized weight, the only error besides f32
//! rounding is the activation's: |x − d·q| ≤ d/2 for each value, so a row's result is off by
//! at most Σ_blocks (d_b/2)·Σ_{i∈b} |w_i| (the bound the tests assert).
//!
//! Paths ([`DotPath`]): portable Rust; AVX2 (`vpmaddubsw` + `vpmaddwd`); AVX512-VNNI
//! (`vpdpbusd` on 256-bit registers, which also drops the i16 step). A CPU with AVX-512 but
//! no VNNI runs the AVX2 kernels: one block of 32 fills a 256-bit register, and a 512-bit one
//! would need two blocks' scales per step for no fewer instructions per byte.

use rayon::prelude::*;

use super::blocks::QK;
use super::{as_blocks, GgmlBlock, GgmlError, GgmlType, QK_K};
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
fn act_kind(ty: GgmlType) -> Option<bool> {
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

/// One weight row (whole blocks of `ty`) · one quantized activation row of the same length.
/// The caller guarantees the row matches `ty`'s activation kind and length.
pub fn dot_row(path: DotPath, ty: GgmlType, w: &[u8], x: &ActRow) -> f32 {
    let mut out = [0f32];
    dot_rows(path, ty, w, &[x], &mut out);
    out[0]
}

/// Most activation rows one call of [`dot_rows`] takes.
pub const MAX_ROWS: usize = 4;

/// One weight row · each of 1 to [`MAX_ROWS`] activation rows (all of `ty`'s kind), into
/// `out`: the SIMD paths unpack each weight block once for all rows.
pub fn dot_rows(path: DotPath, ty: GgmlType, w: &[u8], xs: &[&ActRow], out: &mut [f32]) {
    assert!(
        (1..=MAX_ROWS).contains(&xs.len()) && out.len() == xs.len(),
        "dot_rows: 1 to {MAX_ROWS} rows, one output each"
    );
    let n = xs.len();
    match xs[0] {
        ActRow::Q8(_) => {
            let mut rows: [&[ActQ8]; MAX_ROWS] = [&[]; MAX_ROWS];
            for (r, x) in rows.iter_mut().zip(xs) {
                let ActRow::Q8(x) = x else {
                    panic!("dot_rows: mixed activation kinds")
                };
                *r = x;
            }
            dot_rows_q8(path, ty, w, &rows[..n], out)
        }
        ActRow::Q8K(_) => {
            let mut rows: [&[ActQ8K]; MAX_ROWS] = [&[]; MAX_ROWS];
            for (r, x) in rows.iter_mut().zip(xs) {
                let ActRow::Q8K(x) = x else {
                    panic!("dot_rows: mixed activation kinds")
                };
                *r = x;
            }
            dot_rows_q8k(path, ty, w, &rows[..n], out)
        }
    }
}

fn blocks<B: GgmlBlock>(w: &[u8]) -> &[B] {
    as_blocks::<B>(w).expect("a weight row is whole blocks")
}

fn dot_rows_q8(path: DotPath, ty: GgmlType, w: &[u8], xs: &[&[ActQ8]], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if path != DotPath::Scalar {
        // SAFETY: `DotPath::for_isa` gives a SIMD path only where the CPU has it.
        return unsafe { super::dot_x86::dot_q8(path, ty, w, xs, out) };
    }
    let _ = path;
    for (o, x) in out.iter_mut().zip(xs) {
        *o = match ty {
            GgmlType::Q8_0 => scalar::q8_0(blocks(w), x),
            GgmlType::Q4_0 => scalar::q4_0(blocks(w), x),
            GgmlType::Q4_1 => scalar::q4_1(blocks(w), x),
            _ => unreachable!("act_kind sends only Q8_0/Q4_0/Q4_1 here"),
        }
    }
}

fn dot_rows_q8k(path: DotPath, ty: GgmlType, w: &[u8], xs: &[&[ActQ8K]], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if path != DotPath::Scalar {
        // SAFETY: as in `dot_rows_q8`.
        return unsafe { super::dot_x86::dot_q8k(path, ty, w, xs, out) };
    }
    let _ = path;
    for (o, x) in out.iter_mut().zip(xs) {
        *o = match ty {
            GgmlType::Q4_K => scalar::q4_k(blocks(w), x),
            GgmlType::Q6_K => scalar::q6_k(blocks(w), x),
            _ => unreachable!("act_kind sends only Q4_K/Q6_K here"),
        }
    }
}

/// The portable kernels: the reference for the SIMD ones.
pub(super) mod scalar {
    use super::super::blocks::{scale_min_k4, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ6K, BlockQ8_0};
    use super::{ActQ8, ActQ8K, QK};
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
}

/// A quantized weight matrix [n, k], row-major (each row whole blocks), possibly stacked from
/// parts of different types (a fused Q/K/V projection whose V is Q6_K and Q/K are Q4_K):
/// rows `[r0, r0 + part rows)` are one type.
#[derive(Clone, Debug)]
pub struct QuantMatrix {
    k: usize,
    parts: Vec<QuantPart>,
}

#[derive(Clone, Debug)]
struct QuantPart {
    ty: GgmlType,
    rows: usize,
    bytes: Vec<u8>,
}

impl QuantMatrix {
    /// A matrix of `rows` rows of `k` values of type `ty`, from their bytes. `ty` must have
    /// dot kernels and `k` be whole blocks; errors say which.
    pub fn new(
        ty: GgmlType,
        rows: usize,
        k: usize,
        bytes: Vec<u8>,
    ) -> Result<QuantMatrix, GgmlError> {
        let part = QuantPart::new(ty, rows, k, bytes)?;
        Ok(QuantMatrix {
            k,
            parts: vec![part],
        })
    }

    /// `parts` stacked by rows (all of the same k).
    pub fn stack(parts: Vec<QuantMatrix>) -> Result<QuantMatrix, GgmlError> {
        let Some(k) = parts.first().map(|p| p.k) else {
            return Err(GgmlError("stacking no quantized matrices".into()));
        };
        if let Some(p) = parts.iter().find(|p| p.k != k) {
            return Err(GgmlError(format!(
                "cannot stack quantized matrices of {k} and {} columns",
                p.k
            )));
        }
        Ok(QuantMatrix {
            k,
            parts: parts.into_iter().flat_map(|p| p.parts).collect(),
        })
    }

    pub fn k(&self) -> usize {
        self.k
    }

    /// Rows (outputs).
    pub fn n(&self) -> usize {
        self.parts.iter().map(|p| p.rows).sum()
    }

    /// Bytes of the quantized data.
    pub fn bytes(&self) -> usize {
        self.parts.iter().map(|p| p.bytes.len()).sum()
    }

    /// The types of its parts, in row order.
    pub fn types(&self) -> Vec<GgmlType> {
        self.parts.iter().map(|p| p.ty).collect()
    }

    /// The matrix dequantized to f32 [n, k] row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.n() * self.k];
        let mut at = 0;
        for p in &self.parts {
            let len = p.rows * self.k;
            super::dequantize(p.ty, &p.bytes, &mut out[at..at + len])
                .expect("checked at construction");
            at += len;
        }
        out
    }

    /// Row `r` (< n) dequantized into `out` (k values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), GgmlError> {
        let mut first = 0;
        for p in &self.parts {
            if r < first + p.rows {
                let rb = p.ty.bytes_for(self.k)?;
                let at = (r - first) * rb;
                return super::dequantize(p.ty, &p.bytes[at..at + rb], out);
            }
            first += p.rows;
        }
        Err(GgmlError(format!(
            "row {r} of a quantized matrix of {first} rows"
        )))
    }

    /// y [m, n] = x [m, k] · Wᵀ (row-major), on the path `DotPath::get()`.
    pub fn matmul(&self, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), GgmlError> {
        self.matmul_with(DotPath::get(), x, m, y)
    }

    /// [`QuantMatrix::matmul`] on a given path (for tests of each).
    pub fn matmul_with(
        &self,
        path: DotPath,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), GgmlError> {
        let (k, n) = (self.k, self.n());
        if x.len() != m * k || y.len() != m * n {
            return Err(GgmlError(format!(
                "quantized matmul: x has {} values and y {}, but [{m}, {k}] · [{n}, {k}]ᵀ needs {} and {}",
                x.len(),
                y.len(),
                m * k,
                m * n
            )));
        }
        // The activations quantized once per kind of block the parts need (32 or 256).
        let mut acts: [Option<Vec<ActRow>>; 2] = [None, None];
        let mut col = 0;
        for p in &self.parts {
            let kind = act_kind(p.ty).expect("checked at construction") as usize;
            let acts = acts[kind].get_or_insert_with(|| {
                x.chunks_exact(k)
                    .map(|row| quantize_activations(p.ty, row))
                    .collect()
            });
            p.matmul(path, k, acts, col, n, y);
            col += p.rows;
        }
        Ok(())
    }
}

/// Below this many weight bytes a product runs on the calling thread.
const PARALLEL_MIN_BYTES: usize = 1 << 16;
/// Weight rows per parallel task.
const ROWS_PER_TASK: usize = 16;

impl QuantPart {
    fn new(ty: GgmlType, rows: usize, k: usize, bytes: Vec<u8>) -> Result<QuantPart, GgmlError> {
        if !has_dot(ty) {
            let kinds: Vec<&str> = DOT_TYPES.iter().map(|t| t.name()).collect();
            return Err(GgmlError(format!(
                "{ty} weights have no dot-product kernels (those are {}); dequantize them to f32 instead",
                kinds.join(", ")
            )));
        }
        let row_bytes = ty.bytes_for(k)?;
        if bytes.len() != rows * row_bytes {
            return Err(GgmlError(format!(
                "{rows} rows of {k} {ty} values take {} bytes, but {} were given",
                rows * row_bytes,
                bytes.len()
            )));
        }
        Ok(QuantPart { ty, rows, bytes })
    }

    /// Columns `col..col + rows` of y [m, n] from the quantized activation rows.
    fn matmul(
        &self,
        path: DotPath,
        k: usize,
        acts: &[ActRow],
        col: usize,
        n: usize,
        y: &mut [f32],
    ) {
        let row_bytes = self.ty.bytes_for(k).expect("checked at construction");
        let m = acts.len();
        // Each task computes its weight rows against every activation row (a weight row stays
        // in cache while the activations stream), column-major into its own buffer.
        let task = |(t, w): (usize, &[u8])| -> (usize, Vec<f32>) {
            let mut out = Vec::with_capacity(w.len() / row_bytes * m);
            let mut vals = [0f32; MAX_ROWS];
            for wr in w.chunks_exact(row_bytes) {
                for group in acts.chunks(MAX_ROWS) {
                    let xs: [&ActRow; MAX_ROWS] =
                        std::array::from_fn(|r| &group[r.min(group.len() - 1)]);
                    let vals = &mut vals[..group.len()];
                    dot_rows(path, self.ty, wr, &xs[..group.len()], vals);
                    out.extend_from_slice(vals);
                }
            }
            (t * ROWS_PER_TASK, out)
        };
        let chunk = ROWS_PER_TASK * row_bytes;
        let results: Vec<(usize, Vec<f32>)> = if self.bytes.len() < PARALLEL_MIN_BYTES {
            self.bytes.chunks(chunk).enumerate().map(task).collect()
        } else {
            self.bytes.par_chunks(chunk).enumerate().map(task).collect()
        };
        for (r0, out) in results {
            for (r, vals) in out.chunks_exact(m).enumerate() {
                for (i, v) in vals.iter().enumerate() {
                    y[i * n + col + r0 + r] = *v;
                }
            }
        }
    }
}
