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
//! Q8_0, Q4_0 and Q4_1 weights are stored eight rows together (`groups`) for the GEMV of a
//! decode step: one pass over a group's blocks leaves the eight rows' products in the lanes
//! of one register (SmolLM2 Q4_1 generation on one Zen 3 core: 53 → 82 tok/s with the
//! activation quantization's SIMD form). Rows after the last whole group, and the k-quants,
//! run row by row.
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
use super::groups::{self, GROUP};
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

/// As [`dot_matrix`] for weight rows stored in groups (`groups`): `w` is whole groups of
/// rows of `row_bytes`, of a grouped type (Q8_0, Q4_0, Q4_1); `out` [w rows, xs.len()].
fn dot_groups(
    path: DotPath,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    xs: &[&ActRow],
    out: &mut [f32],
) {
    let m = xs.len();
    let gb = GROUP * row_bytes;
    assert!(
        groups::layout(ty).is_some()
            && w.len().is_multiple_of(gb)
            && out.len() == w.len() / row_bytes * m,
        "dot_groups: whole groups of a grouped type and one output per weight row and activation row"
    );
    #[cfg(target_arch = "x86_64")]
    if path != DotPath::Scalar {
        let rows: Vec<&[ActQ8]> = (xs.iter())
            .map(|x| match x {
                ActRow::Q8(x) => x.as_slice(),
                ActRow::Q8K(_) => panic!("dot_groups: grouped types take blocks of 32"),
            })
            .collect();
        assert!(rows.iter().all(|x| x.len() * ty.block_bytes() == row_bytes));
        // SAFETY: `DotPath::for_isa` gives a SIMD path only where the CPU has it; the
        // lengths are checked above.
        return unsafe { super::dot_x86::groups_q8(path, ty, w, row_bytes, &rows, out) };
    }
    // The portable path: each group back to rows, then the row kernels.
    let mut rows = vec![0u8; gb];
    for (g, o) in w.chunks_exact(gb).zip(out.chunks_exact_mut(GROUP * m)) {
        groups::ungroup(ty, row_bytes, g, &mut rows);
        dot_matrix(path, ty, &rows, row_bytes, xs, o);
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
    /// The first `grouped` rows are stored in groups of eight (`groups`), the rest row by row.
    grouped: usize,
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
            p.dequantize(self.k, &mut out[at..at + len])
                .expect("checked at construction");
            at += len;
        }
        out
    }

    /// Its parts as stored in a file: (type, rows, the rows' blocks row after row). Another
    /// device's copy starts from these (the CPU keeps rows in groups of eight for its dot
    /// kernels).
    pub fn parts_row_major(&self) -> Vec<(GgmlType, usize, Vec<u8>)> {
        (self.parts.iter())
            .map(|p| {
                let rb = p.ty.bytes_for(self.k).expect("checked at construction");
                let mut bytes = p.bytes.clone();
                let mut rows = vec![0u8; GROUP * rb];
                for g in bytes[..p.grouped * rb].chunks_exact_mut(GROUP * rb) {
                    groups::ungroup(p.ty, rb, g, &mut rows);
                    g.copy_from_slice(&rows);
                }
                (p.ty, p.rows, bytes)
            })
            .collect()
    }

    /// Row `r` (< n) dequantized into `out` (k values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), GgmlError> {
        let mut first = 0;
        for p in &self.parts {
            if r < first + p.rows {
                return p.dequantize_row(self.k, r - first, out);
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
/// Parallel tasks per thread of a product: one. A decode step runs ~120 products per token,
/// and each further task is a steal and a join: SmolLM2 Q4_1 generation on 2 Zen 3 cores
/// went 122 → 140 tok/s from 4 tasks per thread to 1 (a thread slowed by other load is no
/// longer helped by the rest within a product).
const TASKS_PER_THREAD: usize = 1;
impl QuantMatrix {
    /// y = x · Wᵀ through f32: each part dequantized, then the f32 GEMM (`F32_MIN_ROWS`).
    fn matmul_f32(&self, x: &[f32], m: usize, y: &mut [f32]) -> Result<(), GgmlError> {
        let (k, n) = (self.k, self.n());
        let mut w = Vec::new();
        let mut col = 0;
        for p in &self.parts {
            w.resize(p.rows * k, 0.0);
            p.dequantize(k, &mut w)?;
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
        let mut bytes = bytes;
        let grouped = groups::grouped_rows(ty, rows);
        groups::group_rows(ty, row_bytes, grouped, &mut bytes);
        Ok(QuantPart {
            ty,
            rows,
            grouped,
            bytes,
        })
    }

    /// All of it dequantized into `out` (rows × k values): grouped rows a group at a time,
    /// groups in parallel.
    fn dequantize(&self, k: usize, out: &mut [f32]) -> Result<(), GgmlError> {
        let rb = self.ty.bytes_for(k)?;
        let (grouped, rest) = self.bytes.split_at(self.grouped * rb);
        let (out_grouped, out_rest) = out.split_at_mut(self.grouped * k);
        let group = |(g, o): (&[u8], &mut [f32])| {
            let mut rows = vec![0u8; GROUP * rb];
            groups::ungroup(self.ty, rb, g, &mut rows);
            super::dequantize(self.ty, &rows, o)
        };
        (grouped.par_chunks(GROUP * rb))
            .zip(out_grouped.par_chunks_mut(GROUP * k))
            .try_for_each(group)?;
        super::dequantize(self.ty, rest, out_rest)
    }

    /// Its row `r` dequantized into `out` (k values).
    fn dequantize_row(&self, k: usize, r: usize, out: &mut [f32]) -> Result<(), GgmlError> {
        let rb = self.ty.bytes_for(k)?;
        if r >= self.grouped {
            return super::dequantize(self.ty, &self.bytes[r * rb..(r + 1) * rb], out);
        }
        let g0 = r / GROUP * GROUP;
        let mut rows = vec![0u8; GROUP * rb];
        groups::ungroup(
            self.ty,
            rb,
            &self.bytes[g0 * rb..(g0 + GROUP) * rb],
            &mut rows,
        );
        let at = (r - g0) * rb;
        super::dequantize(self.ty, &rows[at..at + rb], out)
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
        // Whole groups per task, so that no group is split.
        let task_rows = self.rows.div_ceil(tasks).next_multiple_of(GROUP);
        // A task's weight rows against every activation row (fewer than `F32_MIN_ROWS`, so
        // their quantized blocks stay in the core's cache), into `out` [its weight rows, m]:
        // grouped rows, or the rows after the last group.
        let task = |(w, out, grouped): (&[u8], &mut [f32], bool)| match grouped {
            true => dot_groups(path, self.ty, w, row_bytes, &xs, out),
            false => dot_matrix(path, self.ty, w, row_bytes, &xs, out),
        };
        let run = |out: &mut [f32]| {
            let (wg, wr) = self.bytes.split_at(self.grouped * row_bytes);
            let (og, or) = out.split_at_mut(self.grouped * m);
            let mut jobs: Vec<(&[u8], &mut [f32], bool)> = (wg.chunks(task_rows * row_bytes))
                .zip(og.chunks_mut(task_rows * m))
                .map(|(w, o)| (w, o, true))
                .collect();
            // Rows after the groups (all of a k-quant's) are split as evenly: one job would
            // leave the other threads idle through the whole product.
            let rest_rows = (self.rows - self.grouped).div_ceil(tasks).max(1);
            jobs.extend(
                (wr.chunks(rest_rows * row_bytes))
                    .zip(or.chunks_mut(rest_rows * m))
                    .map(|(w, o)| (w, o, false)),
            );
            if tasks == 1 {
                jobs.into_iter().for_each(task);
            } else {
                jobs.into_par_iter().for_each(task);
            }
        };
        // One activation row (a decode step): the part's outputs are contiguous in y.
        if m == 1 {
            return run(&mut y[col..col + self.rows]);
        }
        let mut out = ROWS_OUT.take();
        out.resize(self.rows * m, 0.0);
        run(&mut out[..self.rows * m]);
        transpose_into(&out[..self.rows * m], m, y, n, col);
        ROWS_OUT.set(out);
    }
}

thread_local! {
    /// The weight-row-major outputs of a product of several activation rows, kept between
    /// products: a head's are megabytes, whose pages were faulted in again at every product
    /// when allocated each time. (Taken out while in use: a product that starts on this
    /// thread meanwhile, stolen by rayon, allocates its own.)
    static ROWS_OUT: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Weight rows moved to y at a time by `transpose_into`.
const TRANSPOSE_TILE: usize = 64;

/// `out` [rows, m] (weight-row major) into columns `col..col + rows` of y [m, n], a tile of
/// weight rows at a time, so that each row of y is written in runs of whole cache lines.
/// Element by element, the m stores of one weight row land n floats apart: when n·4 bytes
/// is a multiple of 4 KiB (SmolLM2's head of 49,152 rows, its gate and up of 3,072), all
/// m lines fall in one L1 set, which holds 8 (16 rows of the head: 12 % of a decode step's
/// product time in this loop, on one thread while the others waited).
fn transpose_into(out: &[f32], m: usize, y: &mut [f32], n: usize, col: usize) {
    let rows = out.len() / m;
    for r0 in (0..rows).step_by(TRANSPOSE_TILE) {
        let t = TRANSPOSE_TILE.min(rows - r0);
        let tile = &out[r0 * m..(r0 + t) * m];
        for i in 0..m {
            let dst = &mut y[i * n + col + r0..][..t];
            for (d, src) in dst.iter_mut().zip(tile.chunks_exact(m)) {
                *d = src[i];
            }
        }
    }
}
