//! The arithmetic of CPU FlashAttention's tiles; sinter-core's `kernels/attention/cpu.rs`
//! runs the algorithm (which tiles, in what order, on which threads) and owns the causal rule.
//!
//! **Layout.** A score tile is stored key-major: `tile[j·ld + i]` is key j's score for query
//! i, `ld` a whole number of vectors. The softmax's per-query reductions (max, sum) are then
//! vertical vector operations down the keys, with no horizontal reduction and no per-row
//! scalar work, and the causal mask is one comparison per vector.
//!
//! **Products**, register tiles of [`MR`] rows × [`NV`] vectors written once over [`Simd`]:
//! - scores ([`logits`], [`probabilities`], [`softmax_grad`]): `tile[j][i] = Σ_c X[j][c] ·
//!   Yᵀ[c][i]`, X's key rows read in place (one broadcast per value), Yᵀ the queries' rows
//!   transposed once by [`pack_transposed`]; each fuses what the algorithm does next to the
//!   values while they are in registers (the block maximum, e^(s − lse), P ∘ (dP − D)).
//! - [`tile_product`]: `C[r][c] (+)= α Σ_k A(r, k) · B[k][c]` with A a tile read either way
//!   (broadcasts) and B's rows in place; this is P·V, Pᵀ·dO, dS·K and dSᵀ·Q.
//!
//! **Causal skipping.** `live[i]` is how many of the tile's keys query i sees (its first
//! `live[i]`). A register tile whose keys no query of it sees is not computed (scores) or not
//! summed over (products); the scores of such blocks are written as 0.
//!
//! Edge tiles (fewer than MR rows, an odd number of query vectors, a head dimension that is
//! not a whole number of vector pairs) repeat a valid row or read zero lanes and store only
//! what exists, so each product is one monomorphised loop.

use super::exp_log::{exp, exp_softmax};
use super::reduce::dot;
use crate::simd::{load_lanes, store_lanes, Simd};
use crate::{with_isa, Isa};

/// Rows of a register tile.
pub const MR: usize = 6;
/// Vectors of a register tile.
pub const NV: usize = 2;
/// The most queries one score tile holds.
pub const MAX_QUERIES: usize = 64;

/// Lanes of one vector on `isa`.
pub fn lanes(isa: Isa) -> usize {
    with_isa!(isa, S => S::LANES)
}

/// The row stride of a score tile for `queries` queries: whole vectors.
pub fn tile_stride(isa: Isa, queries: usize) -> usize {
    queries.next_multiple_of(lanes(isa))
}

/// The row stride of a [`pack_transposed`] buffer for `n` rows, read in tiles of up to
/// [`MAX_QUERIES`] rows starting anywhere: a whole vector pair past the last row, so a tile's
/// last pair never reads past the buffer's row.
pub fn packed_stride(isa: Isa, n: usize) -> usize {
    let pair = NV * lanes(isa);
    n.next_multiple_of(pair) + pair
}

/// Rows of a matrix read in place: row r starts at `ptr + r·stride`.
#[derive(Clone, Copy)]
pub struct Rows {
    pub ptr: *const f32,
    pub stride: usize,
}

/// Rows of a matrix written in place: row r starts at `ptr + r·stride`.
#[derive(Clone, Copy)]
pub struct RowsMut {
    pub ptr: *mut f32,
    pub stride: usize,
}

/// `dst[c·ld + i]` = value c of row i of `src` for i < n and c < d, 0 for n ≤ i < ld.
///
/// # Safety
/// Rows 0..n of `src` are readable for d values.
///
/// # Panics
/// If `dst` is shorter than d·ld or n > ld (a caller bug).
pub unsafe fn pack_transposed(isa: Isa, src: Rows, n: usize, d: usize, dst: &mut [f32], ld: usize) {
    assert!(
        n <= ld && dst.len() >= d * ld,
        "pack_transposed: {n} rows into {} values at stride {ld}",
        dst.len()
    );
    // Whole groups of 8 rows × 8 values through registers (the GEMM's transposing pack).
    let rows8 = n / 8 * 8;
    #[cfg(target_arch = "x86_64")]
    let done = if isa != Isa::Scalar && rows8 > 0 {
        crate::gemm::pack::transpose_rows_x86(src.ptr, src.stride as isize, rows8, d, (dst, ld))
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = {
        let _ = isa;
        0
    };
    for (c, out) in dst.chunks_exact_mut(ld).take(d).enumerate() {
        let from = if c < done { rows8 } else { 0 };
        for (i, o) in out.iter_mut().enumerate().take(n).skip(from) {
            *o = *src.ptr.add(i * src.stride + c);
        }
        out[n..ld].fill(0.0);
    }
}

/// `live` as f32 lanes padded with 0 to the tile stride (lane i: keys j < live[i] count).
fn live_lanes(live: &[usize]) -> [f32; MAX_QUERIES + 16] {
    assert!(
        live.len() <= MAX_QUERIES,
        "flash tiles: {} queries in one tile (at most {MAX_QUERIES})",
        live.len()
    );
    let mut out = [0f32; MAX_QUERIES + 16];
    for (o, &n) in out.iter_mut().zip(live) {
        *o = n as f32;
    }
    out
}

/// `vals` padded with 0 to the tile stride.
fn padded(vals: &[f32]) -> [f32; MAX_QUERIES + 16] {
    let mut out = [0f32; MAX_QUERIES + 16];
    out[..vals.len()].copy_from_slice(vals);
    out
}

/// The first query that sees key j (so every query vector before its vector sees none of
/// keys j..), or `live.len()` if none does.
fn first_query_seeing(live: &[usize], j: usize) -> usize {
    live.iter().position(|&n| n > j).unwrap_or(live.len())
}

/// A register tile's sums: `acc[r][v]` = Σ_c X[j0 + r][c]·Yᵀ[c][(v0 + v)·LANES..].
type ScoreTile<S> = [[<S as Simd>::V; NV]; MR];

/// The scores of keys 0..nk: for every register tile of MR keys × NV query vectors that some
/// query of it sees, `store(j0, rows, v0, vectors, &acc)` with the tile's first key and
/// vector, how many of its rows and vectors exist, and its sums; every other vector of the
/// tile's rows is written 0.
///
/// # Safety
/// X's rows 0..nk are readable for d values; `yt` holds d rows of `yt_stride` ≥ the vectors
/// read (see [`packed_stride`]); `tile` is writable for nk rows of `ld` ≥ nv·LANES.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn scores_with<S: Simd>(
    x: Rows,
    nk: usize,
    (yt, yt_stride): (*const f32, usize),
    d: usize,
    live: &[usize],
    (tile, ld): (*mut f32, usize),
    mut store: impl FnMut(usize, usize, usize, usize, &ScoreTile<S>),
) {
    let l = S::LANES;
    let nv = live.len().div_ceil(l);
    let mut j0 = 0;
    while j0 < nk {
        let mr = (nk - j0).min(MR);
        let first = first_query_seeing(live, j0) / l;
        for j in j0..j0 + mr {
            for v in 0..first.min(nv) {
                S::store(tile.add(j * ld + v * l), S::zero());
            }
        }
        // Rows past the last key repeat it (computed, not stored).
        let xr: [*const f32; MR] =
            std::array::from_fn(|r| x.ptr.add((j0 + r.min(mr - 1)) * x.stride));
        let mut v0 = first;
        while v0 < nv {
            let mut acc = [[S::zero(); NV]; MR];
            let y = yt.add(v0 * l);
            for c in 0..d {
                let yc = y.add(c * yt_stride);
                let yv: [S::V; NV] = std::array::from_fn(|v| S::load(yc.add(v * l)));
                for r in 0..MR {
                    let xv = S::splat(*xr[r].add(c));
                    for v in 0..NV {
                        acc[r][v] = S::fma(xv, yv[v], acc[r][v]);
                    }
                }
            }
            store(j0, mr, v0, (nv - v0).min(NV), &acc);
            v0 += NV;
        }
        j0 += MR;
    }
}

/// The forward's scores for one key block: `tile[j][i] = α · q_i · k_j` for the keys some
/// query of each register tile sees (0 elsewhere), and `block_max[i]` = the maximum of query
/// i's live scores (−inf if it sees none; a NaN score need not show in it, its exponential
/// in [`online_softmax`] carries the NaN to the query's sum and output).
///
/// # Safety
/// `keys`' rows 0..nk are readable for d values; `qt` is the block's queries from
/// [`pack_transposed`] at stride `qt_stride` (≥ [`packed_stride`] of their count).
///
/// # Panics
/// If `tile` or `block_max` is shorter than the tile needs, or live has more than
/// [`MAX_QUERIES`] (a caller bug).
#[allow(clippy::too_many_arguments)]
pub unsafe fn logits(
    isa: Isa,
    keys: Rows,
    nk: usize,
    (qt, qt_stride): (&[f32], usize),
    d: usize,
    alpha: f32,
    live: &[usize],
    (tile, ld): (&mut [f32], usize),
    block_max: &mut [f32],
) {
    check_scores(
        isa,
        live.len(),
        nk,
        (tile.len(), ld),
        (qt.len(), qt_stride),
        d,
    );
    assert!(block_max.len() >= ld, "logits: block_max shorter than {ld}");
    let lim = live_lanes(live);
    block_max[..ld].fill(f32::NEG_INFINITY);
    let (t, bm) = (tile.as_mut_ptr(), block_max.as_mut_ptr());
    with_isa!(isa, S => {
        let a = S::splat(alpha);
        let ninf = S::splat(f32::NEG_INFINITY);
        let tile_out = |j0: usize, mr: usize, v0: usize, nvh: usize, acc: &ScoreTile<S>| {
            for v in 0..nvh {
                let at = (v0 + v) * S::LANES;
                let limv = S::load(lim.as_ptr().add(at));
                // The tile's maximum in registers first: one update of block_max per vector.
                let mut mx = ninf;
                for (r, row) in acc.iter().enumerate().take(mr) {
                    let s = S::mul(row[v], a);
                    S::store(t.add((j0 + r) * ld + at), s);
                    let seen = S::lt(S::splat((j0 + r) as f32), limv);
                    mx = S::max_fast(mx, S::select(seen, s, ninf));
                }
                S::store(bm.add(at), S::max_fast(S::load(bm.add(at)), mx));
            }
        };
        scores_with::<S>(keys, nk, (qt.as_ptr(), qt_stride), d, live, (t, ld), tile_out)
    })
}

/// The backward's probabilities for one (key block, query block) tile: `tile[j][i] =
/// e^(α · q_i · k_j − lse[i])` where query i sees key j, 0 elsewhere.
///
/// # Safety
/// As [`logits`].
///
/// # Panics
/// As [`logits`]; also if lse's length is not live's.
#[allow(clippy::too_many_arguments)]
pub unsafe fn probabilities(
    isa: Isa,
    keys: Rows,
    nk: usize,
    (qt, qt_stride): (&[f32], usize),
    d: usize,
    alpha: f32,
    live: &[usize],
    lse: &[f32],
    (tile, ld): (&mut [f32], usize),
) {
    check_scores(
        isa,
        live.len(),
        nk,
        (tile.len(), ld),
        (qt.len(), qt_stride),
        d,
    );
    assert_eq!(lse.len(), live.len(), "probabilities: lse per query");
    let (lim, lse) = (live_lanes(live), padded(lse));
    let t = tile.as_mut_ptr();
    with_isa!(isa, S => {
        let a = S::splat(alpha);
        let tile_out = |j0: usize, mr: usize, v0: usize, nvh: usize, acc: &ScoreTile<S>| {
            for v in 0..nvh {
                let at = (v0 + v) * S::LANES;
                let (limv, lsev) = (S::load(lim.as_ptr().add(at)), S::load(lse.as_ptr().add(at)));
                for (r, row) in acc.iter().enumerate().take(mr) {
                    let seen = S::lt(S::splat((j0 + r) as f32), limv);
                    let e = exp_softmax::<S>(S::sub(S::mul(row[v], a), lsev));
                    S::store(t.add((j0 + r) * ld + at), S::select(seen, e, S::zero()));
                }
            }
        };
        scores_with::<S>(keys, nk, (qt.as_ptr(), qt_stride), d, live, (t, ld), tile_out)
    })
}

/// The backward's dS for one tile: `ds[j][i] = p[j][i] · (v_j · dO_i − dsum[i])`, with `dot`
/// the block's output-gradient rows packed by [`pack_transposed`] and `p` the tile's
/// [`probabilities`] (0 where masked, so dS is too).
///
/// # Safety
/// As [`logits`], with `values` for the keys.
///
/// # Panics
/// As [`logits`]; also if `p` is shorter than ds or dsum's length is not live's.
#[allow(clippy::too_many_arguments)]
pub unsafe fn softmax_grad(
    isa: Isa,
    values: Rows,
    nk: usize,
    (dot, dot_stride): (&[f32], usize),
    d: usize,
    live: &[usize],
    dsum: &[f32],
    p: &[f32],
    (ds, ld): (&mut [f32], usize),
) {
    check_scores(
        isa,
        live.len(),
        nk,
        (ds.len(), ld),
        (dot.len(), dot_stride),
        d,
    );
    assert!(p.len() >= nk * ld, "softmax_grad: p shorter than the tile");
    assert_eq!(dsum.len(), live.len(), "softmax_grad: D per query");
    let dsum = padded(dsum);
    let (t, pp) = (ds.as_mut_ptr(), p.as_ptr());
    with_isa!(isa, S => {
        let tile_out = |j0: usize, mr: usize, v0: usize, nvh: usize, acc: &ScoreTile<S>| {
            for v in 0..nvh {
                let dv = S::load(dsum.as_ptr().add((v0 + v) * S::LANES));
                for (r, row) in acc.iter().enumerate().take(mr) {
                    let at = (j0 + r) * ld + (v0 + v) * S::LANES;
                    S::store(t.add(at), S::mul(S::load(pp.add(at)), S::sub(row[v], dv)));
                }
            }
        };
        scores_with::<S>(values, nk, (dot.as_ptr(), dot_stride), d, live, (t, ld), tile_out)
    })
}

/// The forward's online-softmax step for one key block, vectorised over the queries: with
/// `block_max` from [`logits`], m[i] becomes max(m[i], block_max[i]), the live scores of query
/// i become e^(s − m[i]) and every other score of the rows a product reads (keys below the
/// largest live count) 0, l[i] = l[i]·α + Σ of them, and alpha[i] = α = e^(old m − new m),
/// by which the caller rescales query i's output (0 for a query's first keys, 1 for one that
/// has seen none yet).
///
/// # Panics
/// If the slices' lengths disagree with live's or the tile's (a caller bug).
#[allow(clippy::too_many_arguments)]
pub fn online_softmax(
    isa: Isa,
    (tile, ld): (&mut [f32], usize),
    live: &[usize],
    block_max: &[f32],
    m: &mut [f32],
    l: &mut [f32],
    alpha: &mut [f32],
) {
    let nq = live.len();
    let rows = live.iter().copied().max().unwrap_or(0);
    check_tile(isa, nq, rows, tile.len(), ld);
    assert!(
        block_max.len() >= ld && m.len() == nq && l.len() == nq && alpha.len() == nq,
        "online_softmax: {nq} queries but {} maxima, {} m, {} l, {} α",
        block_max.len(),
        m.len(),
        l.len(),
        alpha.len()
    );
    let lim = live_lanes(live);
    let t = tile.as_mut_ptr();
    with_isa!(isa, S => {
        let l_ = S::LANES;
        let ninf = S::splat(f32::NEG_INFINITY);
        for v in 0..nq.div_ceil(l_) {
            let (at, lanes) = (v * l_, (nq - v * l_).min(l_));
            let keys = live[at..at + lanes].iter().copied().max().unwrap_or(0);
            let limv = S::load(lim.as_ptr().add(at));
            let m_old = load_lanes::<S>(m.as_ptr(), at, lanes);
            let m_new = S::max(m_old, S::load(block_max.as_ptr().add(at)));
            let a = S::select(S::eq(m_old, ninf), S::zero(), exp::<S>(S::sub(m_old, m_new)));
            let a = S::select(S::eq(m_new, ninf), S::splat(1.0), a);
            let mut sum = S::zero();
            for j in 0..keys {
                let p = t.add(j * ld + at);
                let seen = S::lt(S::splat(j as f32), limv);
                // Masked lanes may hold anything (±inf after subtracting a −inf maximum):
                // exp_softmax clamps, and the select drops them.
                let e = exp_softmax::<S>(S::sub(S::load(p), m_new));
                let e = S::select(seen, e, S::zero());
                sum = S::add(sum, e);
                S::store(p, e);
            }
            for j in keys..rows {
                S::store(t.add(j * ld + at), S::zero());
            }
            let l_new = S::fma(load_lanes::<S>(l.as_ptr(), at, lanes), a, sum);
            store_lanes::<S>(m.as_mut_ptr().add(at), m_new, lanes);
            store_lanes::<S>(l.as_mut_ptr().add(at), l_new, lanes);
            store_lanes::<S>(alpha.as_mut_ptr().add(at), a, lanes);
        }
    })
}

/// Which side of a score tile a [`tile_product`]'s output rows are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Rows are queries, summed over their live keys: `C[i] (+)= α Σ_j tile[j][i] · B[j]`
    /// (P·V, dS·K).
    Queries,
    /// Rows are keys, summed over the queries that see them: `C[j] (+)= α Σ_i tile[j][i] ·
    /// B[i]` (Pᵀ·dO, dSᵀ·Q).
    Keys,
}

/// `C[r][c] = scale[r]·C[r][c] + α Σ_k A(r, k)·B[k][c]` for r < rows and c < d, with A the
/// score tile read along `side`, k over what `live` says row r can reach (the tile's entries
/// past a query's live keys must be 0), and `scale` None for 1 (accumulate); a scale of 0
/// writes C without reading it.
///
/// # Safety
/// B's rows (keys 0..max live for [`Side::Queries`], queries 0..live.len() for
/// [`Side::Keys`]) are readable for d values; C's rows 0..rows are writable for d values and
/// overlap nothing else read here.
///
/// # Panics
/// If the tile or the scales are shorter than rows need (a caller bug).
#[allow(clippy::too_many_arguments)]
pub unsafe fn tile_product(
    isa: Isa,
    side: Side,
    (tile, ld): (&[f32], usize),
    live: &[usize],
    rows: usize,
    b: Rows,
    d: usize,
    c: RowsMut,
    scale: Option<&[f32]>,
    alpha: f32,
) {
    let keys = live.iter().copied().max().unwrap_or(0);
    match side {
        Side::Queries => {
            assert!(
                rows == live.len(),
                "tile_product: {rows} query rows, {} live",
                live.len()
            );
            check_tile(isa, rows, keys, tile.len(), ld);
        }
        Side::Keys => check_tile(isa, live.len(), rows, tile.len(), ld),
    }
    if let Some(s) = scale {
        assert!(
            s.len() >= rows,
            "tile_product: {} scales for {rows} rows",
            s.len()
        );
    }
    with_isa!(isa, S => {
        let mut r0 = 0;
        while r0 < rows {
            let mr = (rows - r0).min(MR);
            // The k range this register tile's rows can reach.
            let (k0, k1) = match side {
                Side::Queries => (0, live[r0..r0 + mr].iter().copied().max().unwrap_or(0)),
                Side::Keys => (first_query_seeing(live, r0), live.len()),
            };
            // A(r, k) = tile[a_r·r + a_k·k].
            let (a_r, a_k) = match side {
                Side::Queries => (1, ld),
                Side::Keys => (ld, 1),
            };
            let ar: [*const f32; MR] =
                std::array::from_fn(|r| tile.as_ptr().add((r0 + r.min(mr - 1)) * a_r));
            let sc: [f32; MR] = std::array::from_fn(|r| scale.map_or(1.0, |s| s[r0 + r.min(mr - 1)]));
            let cr: [*mut f32; MR] =
                std::array::from_fn(|r| c.ptr.add((r0 + r.min(mr - 1)) * c.stride));
            product_rows::<S>((ar, a_k), (k0, k1), b, d, (cr, mr), sc, alpha);
            r0 += MR;
        }
    })
}

/// One register tile's rows of [`tile_product`], across d in vector pairs.
#[inline(always)]
unsafe fn product_rows<S: Simd>(
    (ar, a_k): ([*const f32; MR], usize),
    (k0, k1): (usize, usize),
    b: Rows,
    d: usize,
    (cr, mr): ([*mut f32; MR], usize),
    sc: [f32; MR],
    alpha: f32,
) {
    let l = S::LANES;
    let mut c0 = 0;
    while c0 < d {
        let width = (d - c0).min(NV * l);
        let acc = if width == NV * l {
            product_acc::<S, false>((ar, a_k), (k0, k1), b, c0, width)
        } else {
            product_acc::<S, true>((ar, a_k), (k0, k1), b, c0, width)
        };
        let a = S::splat(alpha);
        for r in 0..mr {
            for (v, &x) in acc[r].iter().enumerate() {
                let lanes = width.saturating_sub(v * l).min(l);
                if lanes == 0 {
                    break;
                }
                let p = cr[r].add(c0 + v * l);
                let y = if sc[r] == 0.0 {
                    S::mul(x, a)
                } else {
                    let old = load_lanes::<S>(p, 0, lanes);
                    S::fma(x, a, S::mul(old, S::splat(sc[r])))
                };
                store_lanes::<S>(p, y, lanes);
            }
        }
        c0 += NV * l;
    }
}

/// Σ_k A(r, k)·B[k][c0..c0 + width] for the tile's MR rows; `PARTIAL` when width is less
/// than NV whole vectors (the lanes past it read nothing and stay 0).
#[inline(always)]
unsafe fn product_acc<S: Simd, const PARTIAL: bool>(
    (ar, a_k): ([*const f32; MR], usize),
    (k0, k1): (usize, usize),
    b: Rows,
    c0: usize,
    width: usize,
) -> [[S::V; NV]; MR] {
    let l = S::LANES;
    let mut acc = [[S::zero(); NV]; MR];
    for k in k0..k1 {
        let bk = b.ptr.add(k * b.stride + c0);
        let bv: [S::V; NV] = std::array::from_fn(|v| {
            if PARTIAL {
                let lanes = width.saturating_sub(v * l).min(l);
                if lanes == 0 {
                    S::zero()
                } else {
                    load_lanes::<S>(bk, v * l, lanes)
                }
            } else {
                S::load(bk.add(v * l))
            }
        });
        for r in 0..MR {
            let av = S::splat(*ar[r].add(k * a_k));
            for v in 0..NV {
                acc[r][v] = S::fma(av, bv[v], acc[r][v]);
            }
        }
    }
    acc
}

/// out[i] = Σ_c a[i·a_stride + c] · b[i·b_stride + c] over c < n: the backward's
/// D = rowsum(dO ∘ O) over rows that sit `stride` apart.
///
/// # Panics
/// If a row would end past its slice (a caller bug).
pub fn strided_row_dots(
    isa: Isa,
    (a, a_stride): (&[f32], usize),
    (b, b_stride): (&[f32], usize),
    n: usize,
    out: &mut [f32],
) {
    let rows = out.len();
    if rows == 0 {
        return;
    }
    assert!(
        (rows - 1) * a_stride + n <= a.len() && (rows - 1) * b_stride + n <= b.len(),
        "strided_row_dots: {rows} rows of {n} at strides {a_stride} and {b_stride} pass the slices' ends ({} and {})",
        a.len(),
        b.len()
    );
    with_isa!(isa, S => {
        for (i, o) in out.iter_mut().enumerate() {
            *o = dot::<S>(a.as_ptr().add(i * a_stride), b.as_ptr().add(i * b_stride), n);
        }
    })
}

/// A score tile of `queries` × `keys` fits: at most [`MAX_QUERIES`] queries, a stride of whole
/// vectors covering them, and the buffer holding `keys` rows.
fn check_tile(isa: Isa, queries: usize, keys: usize, len: usize, ld: usize) {
    assert!(
        queries <= MAX_QUERIES
            && ld >= queries
            && ld.is_multiple_of(lanes(isa))
            && len >= keys * ld,
        "flash tiles: {queries} queries × {keys} keys do not fit a tile of {len} values at stride {ld}"
    );
}

/// The operands of a scores function fit: the tile ([`check_tile`]) and the packed queries
/// ([`check_packed`]).
fn check_scores(
    isa: Isa,
    queries: usize,
    keys: usize,
    (tile_len, ld): (usize, usize),
    (packed_len, stride): (usize, usize),
    d: usize,
) {
    check_tile(isa, queries, keys, tile_len, ld);
    check_packed(isa, queries, d, packed_len, stride);
}

/// A [`pack_transposed`] buffer for `queries` queries read in vector pairs: d rows at a
/// stride that leaves a whole pair past them.
fn check_packed(isa: Isa, queries: usize, d: usize, len: usize, stride: usize) {
    let need = queries.next_multiple_of(NV * lanes(isa));
    assert!(
        d > 0 && stride >= need && len >= (d - 1) * stride + need,
        "flash tiles: a packed operand of {len} values at stride {stride} is short for {queries} queries of {d}"
    );
}
