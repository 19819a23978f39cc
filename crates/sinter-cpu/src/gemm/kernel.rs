//! The micro-kernel and the tile store, written once over [`Simd`].
//!
//! The micro-kernel multiplies one packed MR × kc panel of A by one packed kc × NR panel of B
//! into MR × NR accumulators that never leave the registers: per k it loads MV vectors of A
//! and broadcasts NR values of B, MV·NR independent FMAs (AVX-512: 2 × 12 = 24 accumulators
//! of 16 lanes, 32 × 12 tile; AVX2: 2 × 6 = 12 of 8 lanes, 16 × 6; scalar: 4 × 4), enough
//! independent chains to hide the FMA latency on both FMA pipes.
//!
//! The tile store applies C = α·acc + β·C and, on the last k block, the fused epilogue (bias,
//! pre-activation copy, activation) while the tile is still in registers: the output is
//! written once, already activated.

use crate::math::activation::{apply, Activation};
use crate::simd::{load_lanes, Simd};
use crate::Isa;

/// The micro-kernel's register tile (MR, NR) for each instruction set.
pub fn kernel_shape(isa: Isa) -> (usize, usize) {
    match isa {
        Isa::Avx512 => (32, 12),
        Isa::Avx2 => (16, 6),
        Isa::Scalar => (4, 4),
    }
}

/// Register tile of a micro-kernel: MV vectors down (MR = MV · LANES) by NR columns.
pub(crate) type Acc<S, const MV: usize, const NR: usize> = [[<S as Simd>::V; MV]; NR];

/// One k step of the micro-kernel: acc += A[·, q] ⊗ B[q, ·], with A's MV vectors at `a` and
/// B's NR values read by `b(j)`.
#[inline(always)]
unsafe fn rank1<S: Simd, const MV: usize, const NR: usize>(
    acc: &mut Acc<S, MV, NR>,
    a: *const f32,
    b: impl Fn(usize) -> f32,
) {
    let mut av = [S::zero(); MV];
    for (v, x) in av.iter_mut().enumerate() {
        *x = S::load(a.add(v * S::LANES));
    }
    for (j, row) in acc.iter_mut().enumerate() {
        let bj = S::splat(b(j));
        for v in 0..MV {
            row[v] = S::fma(av[v], bj, row[v]);
        }
    }
}

/// k steps per loop iteration: four steps address their operands by constant offsets from
/// one pointer pair, so the loop's own instructions (counter, pointer bumps, branch) are paid
/// once per 4·MV·NR FMAs instead of once per MV·NR.
const UNROLL: usize = 4;

/// acc = A_panel · B_panel over kc.
///
/// # Safety
/// `a` holds kc · MR and `b` kc · NR readable values (packed panels); the CPU has `S`'s ISA.
#[inline(always)]
pub(crate) unsafe fn microkernel<S: Simd, const MV: usize, const NR: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
) -> Acc<S, MV, NR> {
    let mr = MV * S::LANES;
    let mut acc = [[S::zero(); MV]; NR];
    let (mut a, mut b) = (a, b);
    for _ in 0..kc / UNROLL {
        for u in 0..UNROLL {
            let bu = b.add(u * NR);
            rank1::<S, MV, NR>(&mut acc, a.add(u * mr), |j| *bu.add(j));
        }
        a = a.add(UNROLL * mr);
        b = b.add(UNROLL * NR);
    }
    for _ in 0..kc % UNROLL {
        rank1::<S, MV, NR>(&mut acc, a, |j| *b.add(j));
        a = a.add(mr);
        b = b.add(NR);
    }
    acc
}

/// acc = A_panel · B over kc, with B read in place where its k is contiguous: column j of the
/// tile starts at `b[j]` (packing such a B would be a transposing copy, the slowest kind;
/// here each column is a sequential stream that stays in L1 across the row panels).
///
/// # Safety
/// `a` holds kc · MR packed values; each `b[j]` is readable for kc values.
#[inline(always)]
pub(crate) unsafe fn microkernel_kcontig_b<S: Simd, const MV: usize, const NR: usize>(
    kc: usize,
    a: *const f32,
    b: &[*const f32; NR],
) -> Acc<S, MV, NR> {
    let mr = MV * S::LANES;
    let mut acc = [[S::zero(); MV]; NR];
    let mut a = a;
    let mut q = 0;
    while q + UNROLL <= kc {
        for u in 0..UNROLL {
            rank1::<S, MV, NR>(&mut acc, a.add(u * mr), |j| *b[j].add(q + u));
        }
        a = a.add(UNROLL * mr);
        q += UNROLL;
    }
    while q < kc {
        rank1::<S, MV, NR>(&mut acc, a, |j| *b[j].add(q));
        a = a.add(mr);
        q += 1;
    }
    acc
}

/// Asks for the lines of a `rows` × `cols` tile of C (unit row stride, columns `ldc` apart)
/// to be brought into L1 while the micro-kernel runs: the tile store reads C (β ≠ 0, and the
/// write allocates) and a tile of C is touched once per k block, so it is always cold; its
/// load misses were ~11 % of a 2048³ product's kernel time on Zen 3 without this.
///
/// # Safety
/// None needed for the hint itself (a prefetch never faults); `c` is the tile's (0, 0).
#[inline(always)]
pub(crate) unsafe fn prefetch_tile(c: *const f32, ldc: isize, rows: usize, cols: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        if rows == 0 {
            return;
        }
        for j in 0..cols {
            let col = c.wrapping_offset(j as isize * ldc);
            // First and last element: a column of 16 floats may straddle two lines.
            _mm_prefetch::<_MM_HINT_T0>(col as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(col.wrapping_add(rows - 1) as *const i8);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (c, ldc, rows, cols);
}

/// Where and how one tile is stored.
#[derive(Clone, Copy)]
pub(crate) struct TileOut {
    /// C at the tile's (0, 0); rows (the vector dimension) have unit stride, columns `ldc`.
    pub c: *mut f32,
    pub ldc: isize,
    /// The pre-activation output at the same offsets as `c`, or null.
    pub pre: *mut f32,
    pub pre_ldc: isize,
    /// Valid rows (≤ MR) and columns (≤ NR) of the tile.
    pub rows: usize,
    pub cols: usize,
    pub alpha: f32,
    /// β for this k block (the caller's β on the first block, then 1).
    pub beta: f32,
    /// Whether this is the last k block (the epilogue runs).
    pub last: bool,
    /// The bias at the tile's first row or column, or null.
    pub bias: *const f32,
    /// The bias runs along the rows (the vector dimension) instead of the columns.
    pub bias_along_rows: bool,
    pub act: Activation,
}

/// Stores `acc` into the tile described by `t` (see the module docs).
///
/// # Safety
/// Every element of the `rows` × `cols` tile of `c` (and `pre`, when not null) and the bias
/// entries it reads are valid.
#[inline(always)]
pub(crate) unsafe fn store_tile<S: Simd, const MV: usize, const NR: usize>(
    acc: &Acc<S, MV, NR>,
    t: &TileOut,
) {
    let lanes = S::LANES;
    let epilogue = t.last && (!t.bias.is_null() || !t.pre.is_null() || t.act != Activation::None);
    if !epilogue && t.alpha == 1.0 && t.rows == MV * lanes && t.cols == NR {
        store_full_tile::<S, MV, NR>(acc, t.c, t.ldc, t.beta);
        return;
    }
    let (alpha, beta) = (S::splat(t.alpha), S::splat(t.beta));
    for (j, col) in acc.iter().enumerate().take(t.cols) {
        let c = t.c.offset(j as isize * t.ldc);
        let bias_j = (!t.bias.is_null() && !t.bias_along_rows).then(|| S::splat(*t.bias.add(j)));
        for (v, &a) in col.iter().enumerate() {
            let r0 = v * lanes;
            if r0 >= t.rows {
                break;
            }
            let n = (t.rows - r0).min(lanes);
            let full = n == lanes;
            let mut x = if t.alpha == 1.0 { a } else { S::mul(a, alpha) };
            if t.beta != 0.0 {
                x = S::fma(load_lanes::<S>(c, r0, n), beta, x);
            }
            if epilogue {
                if let Some(b) = bias_j {
                    x = S::add(x, b);
                } else if !t.bias.is_null() {
                    x = S::add(x, load_lanes::<S>(t.bias, r0, n));
                }
                if !t.pre.is_null() {
                    let p = t.pre.offset(j as isize * t.pre_ldc).add(r0);
                    if full {
                        S::store(p, x)
                    } else {
                        S::store_partial(p, x, n)
                    }
                }
                x = apply::<S>(t.act, x);
            }
            if full {
                S::store(c.add(r0), x)
            } else {
                S::store_partial(c.add(r0), x, n)
            }
        }
    }
}

/// C = acc + β·C for a whole tile with no epilogue: the common case (every interior tile of
/// every k block but the last), with constant trip counts so `acc` stays in registers and no
/// per-vector branch runs (the general loop's checks cost ~5 % of a 1024³ product on Zen 3).
///
/// # Safety
/// The MR × NR tile at `c` (unit row stride, columns `ldc` apart) is valid.
#[inline(always)]
unsafe fn store_full_tile<S: Simd, const MV: usize, const NR: usize>(
    acc: &Acc<S, MV, NR>,
    c: *mut f32,
    ldc: isize,
    beta: f32,
) {
    let lanes = S::LANES;
    if beta == 0.0 {
        for (j, col) in acc.iter().enumerate() {
            let c = c.offset(j as isize * ldc);
            for (v, &a) in col.iter().enumerate() {
                S::store(c.add(v * lanes), a);
            }
        }
    } else if beta == 1.0 {
        for (j, col) in acc.iter().enumerate() {
            let c = c.offset(j as isize * ldc);
            for (v, &a) in col.iter().enumerate() {
                S::store(c.add(v * lanes), S::add(S::load(c.add(v * lanes)), a));
            }
        }
    } else {
        let beta = S::splat(beta);
        for (j, col) in acc.iter().enumerate() {
            let c = c.offset(j as isize * ldc);
            for (v, &a) in col.iter().enumerate() {
                S::store(c.add(v * lanes), S::fma(S::load(c.add(v * lanes)), beta, a));
            }
        }
    }
}

/// [`store_tile`] for a C (or pre-activation) without a unit row stride: the tile goes
/// through a small contiguous buffer and is scattered with the real strides.
///
/// # Safety
/// As [`store_tile`], with element (i, j) of C at `c + i·rs + j·cs` (and of pre the same).
#[inline(always)]
pub(crate) unsafe fn store_tile_strided<S: Simd, const MV: usize, const NR: usize>(
    acc: &Acc<S, MV, NR>,
    t: &TileOut,
    rs: isize,
    cs: isize,
) {
    let mr = MV * S::LANES;
    // MR·NR ≤ 512 for every kernel here (see kernel_shape).
    let mut cbuf = [0f32; 32 * 16];
    let mut pbuf = [0f32; 32 * 16];
    debug_assert!(mr * NR <= cbuf.len());
    if t.beta != 0.0 {
        for j in 0..t.cols {
            for i in 0..t.rows {
                cbuf[j * mr + i] = *t.c.offset(i as isize * rs + j as isize * cs);
            }
        }
    }
    let local = TileOut {
        c: cbuf.as_mut_ptr(),
        ldc: mr as isize,
        pre: if t.pre.is_null() {
            std::ptr::null_mut()
        } else {
            pbuf.as_mut_ptr()
        },
        pre_ldc: mr as isize,
        ..*t
    };
    store_tile::<S, MV, NR>(acc, &local);
    for j in 0..t.cols {
        for i in 0..t.rows {
            let at = i as isize * rs + j as isize * cs;
            *t.c.offset(at) = cbuf[j * mr + i];
            if !t.pre.is_null() {
                *t.pre.offset(at) = pbuf[j * mr + i];
            }
        }
    }
}
