//! The row passes of CPU FlashAttention's tiles, between the tiles' products (sinter-core's
//! `kernels/attention/cpu.rs` runs those through the GEMM): the forward's online-softmax step,
//! and the backward's probabilities, the softmax gradient and D = rowsum(dO ∘ O).
//!
//! Each call covers a whole tile of rows under one ISA dispatch, in whole vectors (no scalar
//! tails). Timed with `benches/attention.rs` (capped to AVX2, 1 thread, 2026-11-30), the
//! per-row calls these replace took 331 µs of a gpt-tiny layer's 880 µs forward, more than
//! either of its products (274 and 203 µs); one causal 64 × 64 online-softmax tile went from
//! 6.3 to 5.4 µs here. Most of what remains is the exp itself.
//!
//! A tile is `rows × nc` values, row-major with stride nc. `live[r]` says how many leading
//! values of row r the row sees (the causal mask); the rest are written as 0.

use super::exp_log::exp;
use super::reduce::{dot, for_vectors, load_lanes, store_lanes};
use crate::simd::Simd;
use crate::{with_isa, Isa};

fn check_tile(what: &str, len: usize, nc: usize, rows: usize) {
    assert!(
        nc > 0 && len == rows * nc,
        "{what}: a tile of {len} values is not {rows} rows of {nc}"
    );
}

/// Lanes i.. of a row whose first `live` values count, as one vector with −inf in the lanes
/// past `live` (a whole-vector load while i + LANES ≤ nc stays inside the row; past that only
/// the row's own values are loaded).
#[inline(always)]
unsafe fn live_vector<S: Simd>(row: *const f32, i: usize, live: usize, nc: usize) -> S::V {
    let lanes = (live - i).min(S::LANES);
    if lanes == S::LANES {
        return S::load(row.add(i));
    }
    let v = if i + S::LANES <= nc {
        S::load(row.add(i))
    } else {
        S::load_partial(row.add(i), nc - i)
    };
    let keep = S::lt(S::zero(), S::keep_first(S::splat(1.0), lanes));
    S::select(keep, v, S::splat(f32::NEG_INFINITY))
}

/// The maximum of a row's first `live` ≥ 1 values (NaN if one is NaN).
#[inline(always)]
unsafe fn live_max<S: Simd>(row: *const f32, live: usize, nc: usize) -> f32 {
    let mut m = S::splat(f32::NEG_INFINITY);
    let mut nan = S::zero();
    let mut i = 0;
    while i < live {
        let v = live_vector::<S>(row, i, live, nc);
        nan = S::add(nan, S::select(S::is_nan(v), S::splat(1.0), S::zero()));
        m = S::max(m, v);
        i += S::LANES;
    }
    if S::reduce_add(nan) > 0.0 {
        f32::NAN
    } else {
        S::reduce_max(m)
    }
}

/// e^(x[i] − shift) over the first `live` values of a row of nc, in place, and 0 past them;
/// returns the sum of the live ones. Whole vectors where the row has them, the lanes past
/// `live` cleared after the exp (feeding them −inf instead made e^−104 subnormal, and
/// subnormal arithmetic takes a slow microcode path).
#[inline(always)]
unsafe fn exp_live<S: Simd>(row: *mut f32, nc: usize, live: usize, shift: f32) -> f32 {
    let sv = S::splat(shift);
    let mut acc = S::zero();
    let mut i = 0;
    while i < live {
        let whole = i + S::LANES <= nc;
        let v = if whole {
            S::load(row.add(i))
        } else {
            S::load_partial(row.add(i), nc - i)
        };
        let e = exp::<S>(S::sub(v, sv));
        let lanes = (live - i).min(S::LANES);
        let e = if lanes == S::LANES {
            e
        } else {
            S::keep_first(e, lanes)
        };
        acc = S::add(acc, e);
        if whole {
            S::store(row.add(i), e);
        } else {
            S::store_partial(row.add(i), e, nc - i);
        }
        i += S::LANES;
    }
    if i < nc {
        std::slice::from_raw_parts_mut(row.add(i), nc - i).fill(0.0);
    }
    S::reduce_add(acc)
}

/// One key block of the online softmax over an `m.len()` × nc score tile `s`: for each row r,
/// m[r] becomes max(m[r], the row's live maximum), the live scores become e^(s − m[r]) (0 past
/// them), l[r] = l[r]·α + Σ of those, and alpha[r] = α = e^(old m[r] − new m[r]), by which the
/// caller rescales the row's output accumulator (α = 1 for a row that sees no key here, 0 for
/// a row's first keys).
///
/// # Panics
/// If the slices' lengths disagree or a `live` exceeds nc (a caller bug).
pub fn online_softmax_tile(
    isa: Isa,
    s: &mut [f32],
    nc: usize,
    live: &[usize],
    m: &mut [f32],
    l: &mut [f32],
    alpha: &mut [f32],
) {
    let rows = m.len();
    check_tile("online_softmax_tile", s.len(), nc, rows);
    assert!(
        live.len() == rows && l.len() == rows && alpha.len() == rows,
        "online_softmax_tile: {rows} rows but {} live counts, {} sums, {} factors",
        live.len(),
        l.len(),
        alpha.len()
    );
    assert!(
        live.iter().all(|&n| n <= nc),
        "online_softmax_tile: a live count exceeds the tile's {nc} columns"
    );
    with_isa!(isa, S => {
        for r in 0..rows {
            let row = s.as_mut_ptr().add(r * nc);
            let n = live[r];
            if n == 0 {
                std::slice::from_raw_parts_mut(row, nc).fill(0.0);
                alpha[r] = 1.0;
                continue;
            }
            // f32::max drops a NaN maximum: a NaN score stays NaN through its exp.
            let m_new = m[r].max(live_max::<S>(row, n, nc));
            let a = (m[r] - m_new).exp();
            l[r] = l[r] * a + exp_live::<S>(row, nc, n, m_new);
            m[r] = m_new;
            alpha[r] = a;
        }
    })
}

/// The backward's probabilities: row r of the tile becomes e^(s − lse[r]) over its live
/// values and 0 past them; a row with lse[r] = −inf (it saw no key) becomes all 0.
///
/// # Panics
/// If the slices' lengths disagree or a `live` exceeds nc (a caller bug).
pub fn probabilities_tile(isa: Isa, s: &mut [f32], nc: usize, live: &[usize], lse: &[f32]) {
    let rows = lse.len();
    check_tile("probabilities_tile", s.len(), nc, rows);
    assert!(
        live.len() == rows && live.iter().all(|&n| n <= nc),
        "probabilities_tile: {} live counts for {rows} rows of {nc}",
        live.len()
    );
    with_isa!(isa, S => {
        for r in 0..rows {
            let row = s.as_mut_ptr().add(r * nc);
            let n = if lse[r] == f32::NEG_INFINITY { 0 } else { live[r] };
            exp_live::<S>(row, nc, n, lse[r]);
        }
    })
}

/// The softmax gradient in place: dp[r][j] = p[r][j] · (dp[r][j] − dsum[r]).
///
/// # Panics
/// If the slices' lengths disagree (a caller bug).
pub fn softmax_grad_tile(isa: Isa, dp: &mut [f32], p: &[f32], nc: usize, dsum: &[f32]) {
    let rows = dsum.len();
    check_tile("softmax_grad_tile", dp.len(), nc, rows);
    check_tile("softmax_grad_tile", p.len(), nc, rows);
    with_isa!(isa, S => {
        for (r, &di) in dsum.iter().enumerate() {
            let (d, pp) = (dp.as_mut_ptr().add(r * nc), p.as_ptr().add(r * nc));
            let dv = S::splat(di);
            for_vectors::<S>(d, nc, #[inline(always)] |i, v, lanes| {
                let pv = load_lanes::<S>(pp, i, lanes);
                store_lanes::<S>(d.add(i), S::mul(pv, S::sub(v, dv)), lanes)
            });
        }
    })
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
