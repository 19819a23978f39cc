//! Matrix × vector (internal n = 1: a row-major C with one row, e.g. one token's projection
//! while generating): no packing and no 12-column tile wasting 11/12 of its FMAs. Up to
//! [`FEW_COLUMNS`] columns with A's k contiguous (a decode step of a few sequences: x·Wᵀ)
//! take the same dot form, four rows × four columns per pass: packing the operands of a
//! product this thin costs more than the product. A gpt-tiny decode step of 4 sequences
//! took 368 µs through the packed GEMM and 131 µs this way; 16 sequences 592 → 381 µs
//! (one thread, Zen 5, 2026-11-24; one sequence: 80–90 µs either way).
//!
//! A's rows contiguous in memory along the vector dimension (or prepacked): each MR-row
//! block accumulates A[i.., p]·b[p] over p in registers ("axpy" form). A's k contiguous
//! (x·Wᵀ with W read in place): four dot products at a time share each load of b ("dot"
//! form). Either way the result block goes through the same tile store as the GEMM, so α, β,
//! bias, activation and the pre-activation behave identically.

use std::ops::Range;

use super::kernel::Acc;
use super::problem::{block_offset, Problem};
use crate::simd::{load_lanes, Simd};

/// The most columns the dot form takes (see the module note; measured on gpt-tiny's decode).
pub(crate) const FEW_COLUMNS: usize = 16;

/// Whether [`run_rows`] handles `p`: one column with A prepacked or unit-stride along i or
/// k, or up to [`FEW_COLUMNS`] columns with A unit-stride along k.
pub(crate) fn applies(p: &Problem) -> bool {
    (p.n == 1 && (!p.packed_a.is_null() || p.rsa == 1 || p.csa == 1))
        || (p.n <= FEW_COLUMNS && p.packed_a.is_null() && p.csa == 1 && p.k > 0)
}

/// C[rows, ..] of a problem that [`applies`]; rows start on a multiple of MR.
///
/// # Safety
/// `p` is valid and [`applies`]; no other thread writes these rows.
#[inline(always)]
pub(crate) unsafe fn run_rows<S: Simd, const MV: usize>(p: &Problem, rows: Range<usize>) {
    if p.n > 1 {
        return run_rows_few::<S, MV>(p, rows);
    }
    let (l, mr, k) = (S::LANES, MV * S::LANES, p.k);
    let padded_m = p.m.div_ceil(mr) * mr;
    let mut i0 = rows.start;
    while i0 < rows.end {
        let valid = mr.min(rows.end - i0);
        let mut acc: Acc<S, MV, 1> = [[S::zero(); MV]];
        if !p.packed_a.is_null() {
            // Panels of MR rows, k blocks of packed_kc, zero padded: always whole vectors.
            let mut pc = 0;
            while pc < k {
                let kcb = p.packed_kc.min(k - pc);
                let panel = p.packed_a.add(block_offset(pc, padded_m) + i0 * kcb);
                for q in 0..kcb {
                    let bq = S::splat(*p.b.offset((pc + q) as isize * p.rsb));
                    for (v, a) in acc[0].iter_mut().enumerate() {
                        *a = S::fma(S::load(panel.add(q * mr + v * l)), bq, *a);
                    }
                }
                pc += kcb;
            }
        } else if p.rsa == 1 {
            for q in 0..k {
                let bq = S::splat(*p.b.offset(q as isize * p.rsb));
                let col = p.a.offset(q as isize * p.csa + i0 as isize);
                for (v, a) in acc[0].iter_mut().enumerate() {
                    let lanes = l.min(valid.saturating_sub(v * l));
                    if lanes > 0 {
                        *a = S::fma(load_lanes::<S>(col, v * l, lanes), bq, *a);
                    }
                }
            }
        } else {
            let mut out = [[0f32; 64]; 1];
            dots::<S, 1>(p, i0, valid, 0, 1, &mut out);
            for (v, a) in acc[0].iter_mut().enumerate() {
                *a = S::load(out[0].as_ptr().add(v * l));
            }
        }
        p.store::<S, MV, 1>(&acc, i0, 0, valid, 1, p.beta, true);
        i0 += mr;
    }
}

/// [`run_rows`] for 2..=[`FEW_COLUMNS`] columns (A unit-stride along k): per MR-row block,
/// columns four at a time, each block of results stored through the GEMM's tile store.
#[inline(always)]
unsafe fn run_rows_few<S: Simd, const MV: usize>(p: &Problem, rows: Range<usize>) {
    let (l, mr) = (S::LANES, MV * S::LANES);
    let mut out = [[0f32; 64]; 4];
    let mut i0 = rows.start;
    while i0 < rows.end {
        let valid = mr.min(rows.end - i0);
        let mut j0 = 0;
        while j0 < p.n {
            let cols = 4.min(p.n - j0);
            dots::<S, 4>(p, i0, valid, j0, cols, &mut out);
            for (c, col) in out.iter().enumerate().take(cols) {
                let mut acc: Acc<S, MV, 1> = [[S::zero(); MV]];
                for (v, a) in acc[0].iter_mut().enumerate() {
                    *a = S::load(col.as_ptr().add(v * l));
                }
                p.store::<S, MV, 1>(&acc, i0, j0 + c, valid, 1, p.beta, true);
            }
            j0 += cols;
        }
        i0 += mr;
    }
}

/// out[c][r] = Σ_q A[i0 + r, q]·B[q, j0 + c] for r < rows, c < cols (≤ C), A with unit
/// stride along k: four rows by C columns share each load of both (C = 1: one column).
#[inline(always)]
unsafe fn dots<S: Simd, const C: usize>(
    p: &Problem,
    i0: usize,
    rows: usize,
    j0: usize,
    cols: usize,
    out: &mut [[f32; 64]; C],
) {
    let (l, k) = (S::LANES, p.k);
    let col = |c: usize| p.b.offset((j0 + c.min(cols - 1)) as isize * p.csb);
    let mut r = 0;
    while r < rows {
        let group = 4.min(rows - r);
        let row = |g: usize| p.a.offset((i0 + r + g.min(group - 1)) as isize * p.rsa);
        let mut acc = [[S::zero(); C]; 4];
        let mut q = 0;
        while q < k {
            let lanes = l.min(k - q);
            let mut bv = [S::zero(); C];
            for (c, b) in bv.iter_mut().enumerate() {
                *b = if p.rsb == 1 {
                    load_lanes::<S>(col(c), q, lanes)
                } else {
                    let mut tmp = [0f32; 16];
                    for (t, v) in tmp.iter_mut().enumerate().take(lanes) {
                        *v = *col(c).offset((q + t) as isize * p.rsb);
                    }
                    S::load(tmp.as_ptr())
                };
            }
            for (g, a) in acc.iter_mut().enumerate() {
                let av = load_lanes::<S>(row(g), q, lanes);
                for (c, x) in a.iter_mut().enumerate() {
                    *x = S::fma(av, bv[c], *x);
                }
            }
            q += l;
        }
        for (g, a) in acc.iter().enumerate().take(group) {
            for (c, x) in a.iter().enumerate().take(cols) {
                out[c][r + g] = S::reduce_add(*x);
            }
        }
        r += group;
    }
}
