//! Matrix × vector (internal n = 1: a row-major C with one row, e.g. one token's projection
//! while generating): no packing and no 12-column tile wasting 11/12 of its FMAs. Up to
//! [`FEW_COLUMNS`] columns with A's k contiguous (a decode step of a few sequences: x·Wᵀ),
//! and on AVX-512 up to [`DOT_COLUMNS`] with a long k, take the same dot form: packing the
//! operands of a product this thin costs more than the product. A gpt-tiny decode step of 4
//! sequences took 368 µs through the packed GEMM and 131 µs this way; 16 sequences 592 → 381
//! µs (one thread, Zen 5, 2026-11-24; one sequence: 80–90 µs either way).
//!
//! A's rows contiguous in memory along the vector dimension (or prepacked): each MR-row
//! block accumulates A[i.., p]·b[p] over p in registers ("axpy" form). A's k contiguous
//! (x·Wᵀ with W read in place): tiles of a few rows of A by a few columns of B, each pair's
//! dot product summed lane-wise in a register and reduced across the lanes at the end ("dot"
//! form). Either way the result block goes through the same tile store as the GEMM, so α, β,
//! bias, activation and the pre-activation behave identically.

use std::ops::Range;

use super::kernel::Acc;
use super::problem::{block_offset, Problem};
use crate::simd::{load_lanes, Simd};

/// The most columns the dot form takes (see the module note; measured on gpt-tiny's decode).
pub(crate) const FEW_COLUMNS: usize = 16;

/// Whether [`run_rows`] handles `p` on a vector unit of `lanes` lanes: one column with A
/// prepacked or unit-stride along i or k; up to [`FEW_COLUMNS`] columns with A unit-stride
/// along k; on AVX-512, up to [`DOT_COLUMNS`] columns when B's k is contiguous too and k is
/// at least [`DOT_MIN_K`].
pub(crate) fn applies(p: &Problem, lanes: usize) -> bool {
    let dot = p.packed_a.is_null() && p.csa == 1 && p.k > 0;
    (p.n == 1 && (!p.packed_a.is_null() || p.rsa == 1 || p.csa == 1))
        || (dot && p.n <= FEW_COLUMNS)
        || (dot && lanes >= 16 && p.n <= DOT_COLUMNS && p.rsb == 1 && p.k >= DOT_MIN_K)
}

/// The most columns the AVX-512 dot form takes when B's k is contiguous too (x·Wᵀ of up to
/// this many rows: nothing transposed, nothing packed). Against the packed GEMM (the gemm
/// crate on 1 thread, ours on 2) on an Emerald Rapids Xeon, 2026-11-30, `benches/gemm.rs`:
/// 64 × 3072 × 768 ran 113–122 vs 78–85 GFLOP/s on 1 thread and 178–212 vs 162 on 2;
/// 32 × 2048 × 3072 88 vs 37 and 156–164 vs 122–127. AVX2's 16 registers hold a 4 × 2 tile
/// only, which lost to the packed 16 × 6 kernel at 64 columns (56 vs 62–65 on 1 thread), so
/// AVX2 keeps the form to [`FEW_COLUMNS`].
pub(crate) const DOT_COLUMNS: usize = 64;

/// The shortest k the AVX-512 dot form takes past [`FEW_COLUMNS`] columns: each dot product
/// ends in a reduction across the lanes, which a short k does not repay (64 × 768 × 256: 85
/// vs 98 GFLOP/s on 1 thread, 139 vs 202 on 2).
pub(crate) const DOT_MIN_K: usize = 512;

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
            let mut out = [[0f32; MAX_MR]; 1];
            dots_by_four::<S, 1>(p, i0, valid, 0, 1, &mut out);
            for (v, a) in acc[0].iter_mut().enumerate() {
                *a = S::load(out[0].as_ptr().add(v * l));
            }
        }
        p.store::<S, MV, 1>(&acc, i0, 0, valid, 1, p.beta, true);
        i0 += mr;
    }
}

/// [`run_rows`] for 2..=[`DOT_COLUMNS`] columns (A unit-stride along k): AVX-512 to
/// [`FEW_COLUMNS`] four columns at a time ([`run_rows_by_four_columns`]); otherwise, per
/// MR-row block, row groups of the ISA's dot tile against every column ([`dots`]), the
/// block's results then stored column by column through the GEMM's tile store.
#[inline(always)]
unsafe fn run_rows_few<S: Simd, const MV: usize>(p: &Problem, rows: Range<usize>) {
    if S::LANES >= 16 && p.n <= FEW_COLUMNS {
        return run_rows_by_four_columns::<S, MV>(p, rows);
    }
    // A result block as small as the product allows: it is zeroed on every call, and a
    // decode step makes dozens of these calls.
    if p.n <= FEW_COLUMNS {
        run_rows_dot::<S, MV, FEW_COLUMNS>(p, rows)
    } else {
        run_rows_dot::<S, MV, DOT_COLUMNS>(p, rows)
    }
}

/// AVX-512's few-column products: per MR-row block, columns four at a time, four rows by
/// four columns per tile. On the small products of a decode step it ran 1.1–1.3× faster than
/// the 8 × 3 tiles of [`dots`] (4 × 384 × 128: 56 vs 43 GFLOP/s, 4 × 128 × 512: 87 vs 67,
/// 16 × 384 × 128: 66 vs 61; 1 thread, Xeon model 207, 2026-11-30), which win past 16
/// columns. Same summation order as [`dot_tile`] (lead 0 here), so the bits agree with the
/// one-column path.
#[inline(always)]
unsafe fn run_rows_by_four_columns<S: Simd, const MV: usize>(p: &Problem, rows: Range<usize>) {
    let (l, mr) = (S::LANES, MV * S::LANES);
    let mut out = [[0f32; MAX_MR]; 4];
    let mut i0 = rows.start;
    while i0 < rows.end {
        let valid = mr.min(rows.end - i0);
        let mut j0 = 0;
        while j0 < p.n {
            let cols = 4.min(p.n - j0);
            dots_by_four::<S, 4>(p, i0, valid, j0, cols, &mut out);
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
/// stride along k: four rows by C columns share each load of both (C = 1: the one-column
/// product, where it also beat [`dot_tile`]'s 8- and 4-row tiles: 1 × 384 × 128 at 48 vs 32
/// GFLOP/s on AVX-512, 34 vs 28 on AVX2).
#[inline(always)]
unsafe fn dots_by_four<S: Simd, const C: usize>(
    p: &Problem,
    i0: usize,
    rows: usize,
    j0: usize,
    cols: usize,
    out: &mut [[f32; MAX_MR]; C],
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
                *b = gather::<S>(col(c), q, lanes, p.rsb);
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

/// [`run_rows_few`] with room for `N` ≥ n columns of results.
#[inline(always)]
unsafe fn run_rows_dot<S: Simd, const MV: usize, const N: usize>(p: &Problem, rows: Range<usize>) {
    let (l, mr) = (S::LANES, MV * S::LANES);
    debug_assert!(mr <= MAX_MR && p.n <= N);
    // out[j][r]: column j, row i0 + r of the block.
    let mut out = [[0f32; MAX_MR]; N];
    let mut i0 = rows.start;
    while i0 < rows.end {
        let valid = mr.min(rows.end - i0);
        dots::<S>(p, i0, valid, &mut out);
        for (j, col) in out.iter().enumerate().take(p.n) {
            let mut acc: Acc<S, MV, 1> = [[S::zero(); MV]];
            for (v, a) in acc[0].iter_mut().enumerate() {
                *a = S::load(col.as_ptr().add(v * l));
            }
            p.store::<S, MV, 1>(&acc, i0, j, valid, 1, p.beta, true);
        }
        i0 += mr;
    }
}

/// The tallest row block of any ISA's tile (AVX-512: 2 vectors of 16).
const MAX_MR: usize = 32;

/// out[j][r] = Σ_q A[i0 + r, q]·B[q, j] for r < rows and every column j of `p`, A with unit
/// stride along k: tiles of R rows by C columns, the columns' vectors held in registers while
/// the rows' stream past, R·C accumulators (AVX-512's 32 registers: 8 × 3, 24 + 3 + 1;
/// AVX2's 16: 4 × 2, as 4 × 3 spilled an accumulator). Row groups are the outer loop so that
/// R rows of A stay in L1 while B, the small operand, is read from L2 once per group.
#[inline(always)]
unsafe fn dots<S: Simd>(p: &Problem, i0: usize, rows: usize, out: &mut [[f32; MAX_MR]]) {
    let mut r = 0;
    while r < rows {
        let wide = S::LANES >= 16;
        let group = if wide { 8 } else { 4 }.min(rows - r);
        let width = if wide { 3 } else { 2 };
        let mut j = 0;
        while j < p.n {
            let cols = width.min(p.n - j);
            // Each pass over the group's rows also brings one row of the next group into
            // L2, so that the next group does not wait on L3 or memory.
            let ahead = i0 + r + group + (j / width) % group;
            let at = Tile {
                i: i0 + r,
                rows: group,
                j,
                out_row: r,
                ahead: p.a.wrapping_offset(ahead as isize * p.rsa),
            };
            match (wide, cols) {
                (true, 3) => dot_tile::<S, 8, 3>(p, at, out),
                (true, 2) => dot_tile::<S, 8, 2>(p, at, out),
                (true, _) => dot_tile::<S, 8, 1>(p, at, out),
                (false, 2) => dot_tile::<S, 4, 2>(p, at, out),
                (false, _) => dot_tile::<S, 4, 1>(p, at, out),
            }
            j += cols;
        }
        r += group;
    }
}

/// Where one dot tile reads and writes: A's rows i..i + rows (≤ R), B's columns j..j + C, its
/// results at out[j..][out_row..].
#[derive(Clone, Copy)]
struct Tile {
    i: usize,
    rows: usize,
    j: usize,
    out_row: usize,
    /// A row to prefetch into L2 along the way (any address: a prefetch never faults).
    ahead: *const f32,
}

/// One R × C dot tile. Each dot product sums lane-wise over a leading part vector (see
/// `lead`), whole vectors of k and the zero-padded tail, then across the lanes: the same
/// order whatever the tile, so a row of C has the same bits in a product of 1, 5 or 16
/// columns (one sequence decoding alone or in a batch) and on any number of threads.
#[inline(always)]
unsafe fn dot_tile<S: Simd, const R: usize, const C: usize>(
    p: &Problem,
    t: Tile,
    out: &mut [[f32; MAX_MR]],
) {
    let (l, k) = (S::LANES, p.k);
    // Rows past the end repeat the last one (computed, never written).
    let a: [*const f32; R] =
        std::array::from_fn(|g| p.a.offset((t.i + g.min(t.rows - 1)) as isize * p.rsa));
    let b: [*const f32; C] = std::array::from_fn(|c| p.b.offset((t.j + c) as isize * p.csb));
    let mut acc = [[S::zero(); C]; R];
    // Past FEW_COLUMNS (AVX-512 only), a leading part vector first when it puts A on a
    // 64-byte boundary (all its rows, when A's row stride is whole lines): a 64-byte load
    // across two lines costs two, and large buffers from the allocator sit 16 bytes past a
    // page (64 × 3072 × 768: 82 → 113 GFLOP/s on 1 thread). The split follows A's start, not
    // the tile's first row, so the bits do not depend on how threads share the rows; but they
    // do on A's address, which the few-column products (decode, Winograd's scratch) must not
    // see: those keep lead 0 and an order fixed by the shape alone.
    let lead = if p.n > FEW_COLUMNS {
        ((64 - p.a as usize % 64) % 64 / 4).min(k) % l
    } else {
        0
    };
    if lead > 0 {
        let bv: [S::V; C] = std::array::from_fn(|c| gather::<S>(b[c], 0, lead, p.rsb));
        acc = dot_step::<S, R, C>(acc, &a, 0, lead, &bv);
    }
    let full = lead + (k - lead) / l * l;
    if p.rsb == 1 {
        let mut q = lead;
        while q < full {
            prefetch_l2(t.ahead.wrapping_add(q));
            let mut bv = [S::zero(); C];
            for (c, v) in bv.iter_mut().enumerate() {
                *v = S::load(b[c].add(q));
            }
            acc = dot_step::<S, R, C>(acc, &a, q, l, &bv);
            q += l;
        }
    } else {
        let mut q = lead;
        while q < full {
            let mut bv = [S::zero(); C];
            for (c, v) in bv.iter_mut().enumerate() {
                *v = gather::<S>(b[c], q, l, p.rsb);
            }
            acc = dot_step::<S, R, C>(acc, &a, q, l, &bv);
            q += l;
        }
    }
    if full < k {
        let lanes = k - full;
        let bv: [S::V; C] = std::array::from_fn(|c| gather::<S>(b[c], full, lanes, p.rsb));
        acc = dot_step::<S, R, C>(acc, &a, full, lanes, &bv);
    }
    // Reduced with fixed bounds first: a loop over `t.rows` reading `acc` kept the
    // accumulators on the stack, stored on every k step.
    let mut sums = [[0f32; C]; R];
    for (row, accs) in sums.iter_mut().zip(&acc) {
        for (x, v) in row.iter_mut().zip(accs) {
            *x = S::reduce_add(*v);
        }
    }
    for (g, row) in sums.iter().enumerate().take(t.rows) {
        for (c, x) in row.iter().enumerate() {
            out[t.j + c][t.out_row + g] = *x;
        }
    }
}

/// acc[g][c] + A[g, q..q + lanes] · bv[c], lane-wise (lanes past `lanes` read as zero), the
/// accumulators taken and returned by value as the micro-kernel's are.
#[inline(always)]
unsafe fn dot_step<S: Simd, const R: usize, const C: usize>(
    mut acc: [[S::V; C]; R],
    a: &[*const f32; R],
    q: usize,
    lanes: usize,
    bv: &[S::V; C],
) -> [[S::V; C]; R] {
    for (row, ag) in acc.iter_mut().zip(a) {
        let av = load_lanes::<S>(*ag, q, lanes);
        for (x, bc) in row.iter_mut().zip(bv) {
            *x = S::fma(av, *bc, *x);
        }
    }
    acc
}

/// Asks for the line at `p` in L2.
#[inline(always)]
fn prefetch_l2(p: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults, whatever the address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// `lanes` values of a column of B from k = q, `rsb` apart (unit stride: a plain load), zero
/// past `lanes`.
#[inline(always)]
unsafe fn gather<S: Simd>(col: *const f32, q: usize, lanes: usize, rsb: isize) -> S::V {
    if rsb == 1 {
        return load_lanes::<S>(col, q, lanes);
    }
    let mut tmp = [0f32; 16];
    for (t, v) in tmp.iter_mut().enumerate().take(lanes) {
        *v = *col.offset((q + t) as isize * rsb);
    }
    S::load(tmp.as_ptr())
}
