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
//! A product of [`F32_MIN_ROWS`] rows or more (a prompt's prefill) instead dequantizes each
//! part to f32 for the f32 GEMM (no activation rounding there, so within the same bound).
//!
//! Paths ([`DotPath`]): portable Rust; AVX2 (`vpmaddubsw` + `vpmaddwd`); AVX512-VNNI
//! (`vpdpbusd` on 256-bit registers, which also drops the i16 step). A CPU with AVX-512 but
//! no VNNI runs the AVX2 kernels: one block of 32 fills a 256-bit register, and a 512-bit one
//! would need two blocks' scales per step for no fewer instructions per byte.

use rayon::prelude::*;

use super::act::act_kind;
use super::dot_scalar as scalar;
use super::{row_blocks as blocks, GgmlError, GgmlType};
use crate::gemm::{Gemm, MatMut, MatRef};

pub use super::act::{has_dot, quantize_activations, ActQ8, ActQ8K, ActRow, DotPath, DOT_TYPES};

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
    dot_matrix(path, ty, w, w.len(), xs, out)
}

/// Each weight row of `w` (rows of `row_bytes`, whole blocks of `ty`) · each activation row
/// of `xs` (any number, all of `ty`'s kind and length), into `out` [w rows, xs.len()]
/// (weight-row major). One call per slice of rows: the kernel is chosen once, and each
/// weight block is unpacked once per group of [`MAX_ROWS`] activation rows.
pub fn dot_matrix(
    path: DotPath,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    xs: &[&ActRow],
    out: &mut [f32],
) {
    let rows = w.len().checked_div(row_bytes).unwrap_or(0);
    assert!(
        row_bytes > 0 && w.len() == rows * row_bytes && out.len() == rows * xs.len(),
        "dot_matrix: whole weight rows and one output per weight row and activation row"
    );
    if xs.is_empty() {
        return;
    }
    match xs[0] {
        ActRow::Q8(_) => {
            let rows: Vec<&[ActQ8]> = (xs.iter())
                .map(|x| match x {
                    ActRow::Q8(x) => x.as_slice(),
                    ActRow::Q8K(_) => panic!("dot_matrix: mixed activation kinds"),
                })
                .collect();
            matrix_q8(path, ty, w, row_bytes, &rows, out)
        }
        ActRow::Q8K(_) => {
            let rows: Vec<&[ActQ8K]> = (xs.iter())
                .map(|x| match x {
                    ActRow::Q8K(x) => x.as_slice(),
                    ActRow::Q8(_) => panic!("dot_matrix: mixed activation kinds"),
                })
                .collect();
            matrix_q8k(path, ty, w, row_bytes, &rows, out)
        }
    }
}

fn matrix_q8(
    path: DotPath,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    xs: &[&[ActQ8]],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if path != DotPath::Scalar {
        // SAFETY: `DotPath::for_isa` gives a SIMD path only where the CPU has it.
        return unsafe { super::dot_x86::matrix_q8(path, ty, w, row_bytes, xs, out) };
    }
    let _ = path;
    let m = xs.len();
    for (wr, o) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut(m)) {
        for (o, x) in o.iter_mut().zip(xs) {
            *o = match ty {
                GgmlType::Q8_0 => scalar::q8_0(blocks(wr), x),
                GgmlType::Q4_0 => scalar::q4_0(blocks(wr), x),
                GgmlType::Q4_1 => scalar::q4_1(blocks(wr), x),
                _ => unreachable!("act_kind sends only Q8_0/Q4_0/Q4_1 here"),
            }
        }
    }
}

fn matrix_q8k(
    path: DotPath,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    xs: &[&[ActQ8K]],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if path != DotPath::Scalar {
        // SAFETY: as in `matrix_q8`.
        return unsafe { super::dot_x86::matrix_q8k(path, ty, w, row_bytes, xs, out) };
    }
    let _ = path;
    let m = xs.len();
    for (wr, o) in w.chunks_exact(row_bytes).zip(out.chunks_exact_mut(m)) {
        for (o, x) in o.iter_mut().zip(xs) {
            *o = match ty {
                GgmlType::Q4_K => scalar::q4_k(blocks(wr), x),
                GgmlType::Q6_K => scalar::q6_k(blocks(wr), x),
                _ => unreachable!("act_kind sends only Q4_K/Q6_K here"),
            }
        }
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
        if m >= F32_MIN_ROWS {
            return self.matmul_f32(x, m, y);
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

/// From this many activation rows (a prompt's prefill), a product dequantizes each part to
/// f32 and runs the f32 GEMM: its register tiles reuse every weight value across many rows,
/// which beats the integer dot products' per-block scale work on CPUs without VNNI
/// (SmolLM2 Q4_1, a 512-token prefill on 2 Zen 1 cores: ~2× the tokens/s), and dequantizing
/// a part costs a small fraction of its product at this many rows. The weights stay
/// quantized in memory; the buffer lives for one product.
pub const F32_MIN_ROWS: usize = 32;

/// Below this many weight bytes a product runs on the calling thread.
const PARALLEL_MIN_BYTES: usize = 1 << 16;
/// Parallel tasks per thread of a product: a few, so a thread slowed by other load is
/// helped by the rest, but not one per handful of rows (each task costs a steal and a join).
const TASKS_PER_THREAD: usize = 4;
impl QuantMatrix {
    /// y = x · Wᵀ through f32: each part dequantized, then the f32 GEMM (`F32_MIN_ROWS`).
    fn matmul_f32(&self, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), GgmlError> {
        let (k, n) = (self.k, self.n());
        let mut w = Vec::new();
        let mut col = 0;
        for p in &self.parts {
            w.resize(p.rows * k, 0.0);
            super::dequantize(p.ty, &p.bytes, &mut w)?;
            let wt = MatRef {
                data: &w,
                offset: 0,
                rs: 1,
                cs: k as isize,
            };
            let ys = MatMut {
                data: &mut *y,
                offset: col,
                rs: n as isize,
                cs: 1,
            };
            (Gemm::new(m, p.rows, k).run(MatRef::row_major(x, k), wt, ys))
                .map_err(|e| GgmlError(format!("quantized matmul through f32: {e}")))?;
            col += p.rows;
        }
        Ok(())
    }
}

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
        let xs: Vec<&ActRow> = acts.iter().collect();
        let tasks = if self.bytes.len() < PARALLEL_MIN_BYTES {
            1
        } else {
            rayon::current_num_threads() * TASKS_PER_THREAD
        };
        let task_rows = self.rows.div_ceil(tasks).max(1);
        // A task's weight rows against every activation row (fewer than `F32_MIN_ROWS`, so
        // their quantized blocks stay in the core's cache), into `out` [its weight rows, m].
        let task =
            |(w, out): (&[u8], &mut [f32])| dot_matrix(path, self.ty, w, row_bytes, &xs, out);
        let run = |out: &mut [f32]| {
            let w = self.bytes.chunks(task_rows * row_bytes);
            if tasks == 1 {
                w.zip(out.chunks_mut(task_rows * m)).for_each(&task);
            } else {
                let w = self.bytes.par_chunks(task_rows * row_bytes);
                w.zip(out.par_chunks_mut(task_rows * m)).for_each(task);
            }
        };
        // One activation row (a decode step): the part's outputs are contiguous in y.
        if m == 1 {
            return run(&mut y[col..col + self.rows]);
        }
        let mut out = vec![0f32; self.rows * m];
        run(&mut out);
        for (r, vals) in out.chunks_exact(m).enumerate() {
            for (i, v) in vals.iter().enumerate() {
                y[i * n + col + r] = *v;
            }
        }
    }
}
