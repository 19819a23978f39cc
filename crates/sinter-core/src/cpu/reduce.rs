//! Reductions over one dimension of a contiguous tensor viewed as [outer, n, inner].
//! Sums accumulate in f64 per output so results do not depend on thread count.

use rayon::prelude::*;

use crate::op::ReduceOp;

/// Reduces x viewed as [outer, n, inner] over the middle dimension; returns outer*inner values.
pub fn reduce_f32(x: &[f32], outer: usize, n: usize, inner: usize, op: ReduceOp) -> Vec<f32> {
    let mut out = vec![0f32; outer * inner];
    if out.is_empty() {
        // Nothing to write (and `chunks_mut(0)` would panic when inner is 0).
        return out;
    }
    let work = outer * n * inner;
    if op == ReduceOp::Sum && inner > 1 && outer == 1 && work >= super::PAR_THRESHOLD {
        // Column sums of one [n, inner] matrix (a bias gradient): split the rows, not the
        // single output.
        column_sums(x, n, inner, &mut out);
        return out;
    }
    let body = |(o, dst): (usize, &mut [f32])| {
        let base = o * n * inner;
        match op {
            ReduceOp::Sum => {
                if inner == 1 {
                    let row = &x[base..base + n];
                    // Pairs of f32 lanes summed into f64: accurate and still vectorisable.
                    dst[0] = row.iter().map(|&v| v as f64).sum::<f64>() as f32;
                } else {
                    let mut acc = vec![0f64; inner];
                    for k in 0..n {
                        let r = &x[base + k * inner..base + (k + 1) * inner];
                        for (a, &v) in acc.iter_mut().zip(r) {
                            *a += v as f64;
                        }
                    }
                    for (d, a) in dst.iter_mut().zip(acc) {
                        *d = a as f32;
                    }
                }
            }
            ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax => {
                for (i, d) in dst.iter_mut().enumerate() {
                    let (best, arg) = scan(x, base + i, n, inner, op);
                    *d = if op == ReduceOp::ArgMax {
                        arg as f32
                    } else {
                        best
                    };
                }
            }
        }
    };
    if work >= super::PAR_THRESHOLD && outer > 1 {
        out.par_chunks_mut(inner)
            .with_min_len((super::PAR_THRESHOLD / (n * inner).max(1)).max(1))
            .enumerate()
            .for_each(body);
    } else {
        out.chunks_mut(inner).enumerate().for_each(body);
    }
    out
}

/// Rows summed per column chunk of the columns' sums.
const SUM_CHUNK_ROWS: usize = 64;

/// out[c] = Σ_k x[k·inner + c] in f64, over fixed chunks of rows in parallel and the chunks'
/// partial sums added in order: the same value whatever the thread count.
fn column_sums(x: &[f32], n: usize, inner: usize, out: &mut [f32]) {
    let partials: Vec<Vec<f64>> = x[..n * inner]
        .par_chunks(SUM_CHUNK_ROWS * inner)
        .map(|rows| {
            let mut acc = vec![0f64; inner];
            for r in rows.chunks_exact(inner) {
                for (a, &v) in acc.iter_mut().zip(r) {
                    *a += v as f64;
                }
            }
            acc
        })
        .collect();
    let mut total = vec![0f64; inner];
    for p in partials {
        for (t, v) in total.iter_mut().zip(p) {
            *t += v;
        }
    }
    for (o, t) in out.iter_mut().zip(total) {
        *o = t as f32;
    }
}

/// Reduces i64 x viewed as [outer, n, inner] over the middle dimension, exactly (never through
/// f32): sums wrap on overflow as PyTorch's and the CUDA kernels' do; ArgMax is the first index
/// of the maximum. Only `Sum` may have n = 0.
pub fn reduce_i64(x: &[i64], outer: usize, n: usize, inner: usize, op: ReduceOp) -> Vec<i64> {
    let mut out = vec![0i64; outer * inner];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| x[(o * n + k) * inner + i];
            out[o * inner + i] = match op {
                ReduceOp::Sum => (0..n).fold(0i64, |a, k| a.wrapping_add(at(k))),
                ReduceOp::Max => (1..n).map(at).fold(at(0), i64::max),
                ReduceOp::Min => (1..n).map(at).fold(at(0), i64::min),
                ReduceOp::ArgMax => {
                    (1..n).fold(0, |arg, k| if at(k) > at(arg) { k } else { arg }) as i64
                }
            };
        }
    }
    out
}

/// Reduces bools viewed as [outer, n, inner] over the middle dimension, straight from the
/// bools: `Sum` counts the true values, `Max` is any and `Min` all (as 0/1), `ArgMax` the index
/// of the first true (0 when none is: the first of equal maxima). Only `Sum` may have n = 0.
pub fn reduce_bool(x: &[bool], outer: usize, n: usize, inner: usize, op: ReduceOp) -> Vec<i64> {
    let mut out = vec![0i64; outer * inner];
    for o in 0..outer {
        for i in 0..inner {
            let mut column = (0..n).map(|k| x[(o * n + k) * inner + i]);
            out[o * inner + i] = match op {
                ReduceOp::Sum => column.filter(|&b| b).count() as i64,
                ReduceOp::Max => column.any(|b| b) as i64,
                ReduceOp::Min => column.all(|b| b) as i64,
                ReduceOp::ArgMax => column.position(|b| b).unwrap_or(0) as i64,
            };
        }
    }
    out
}

/// The max / min (and its index) of the n values at `at`, `at + inner`, …: the scan rule of
/// `ReduceOp::replaces` (PyTorch's: the first NaN wins, ties keep the earlier element).
#[inline]
fn scan(x: &[f32], at: usize, n: usize, inner: usize, op: ReduceOp) -> (f32, usize) {
    let (mut best, mut arg) = (x[at], 0);
    for k in 1..n {
        let v = x[at + k * inner];
        if op.replaces(best, v) {
            (best, arg) = (v, k);
        }
    }
    (best, arg)
}

/// Index of the max along the middle dimension as i64 (exact for any n; a NaN is the max).
pub fn argmax_i64(x: &[f32], outer: usize, n: usize, inner: usize) -> Vec<i64> {
    let mut out = vec![0i64; outer * inner];
    for o in 0..outer {
        for i in 0..inner {
            out[o * inner + i] = scan(x, o * n * inner + i, n, inner, ReduceOp::ArgMax).1 as i64;
        }
    }
    out
}

/// Elements per partial sum of [`sum_squares`]; fixed, so the summation order never changes.
const SUMSQ_CHUNK: usize = 1 << 14;

/// Σ x² accumulated in f64, in parallel over fixed 16 Ki-element chunks whose partial sums are
/// added in chunk order: the result does not depend on the thread count.
pub fn sum_squares(v: &[f32]) -> f64 {
    let chunk = |c: &[f32]| c.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>();
    if v.len() <= SUMSQ_CHUNK {
        return chunk(v);
    }
    let partials: Vec<f64> = v.par_chunks(SUMSQ_CHUNK).map(chunk).collect();
    partials.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn i64_reductions_are_exact_beyond_f32() {
        let big = (1i64 << 40) + 1;
        // [2, 3] reduced over dim 0 (inner 3) and dim 1 (inner 1).
        let x = [big, -3, i64::MAX, 1, 7, 1];
        assert_eq!(
            reduce_i64(&x, 1, 2, 3, ReduceOp::Sum),
            [big + 1, 4, i64::MIN]
        );
        assert_eq!(reduce_i64(&x, 2, 3, 1, ReduceOp::Max), [i64::MAX, 7]);
        assert_eq!(reduce_i64(&x, 2, 3, 1, ReduceOp::Min), [-3, 1]);
        assert_eq!(reduce_i64(&x, 2, 3, 1, ReduceOp::ArgMax), [2, 1]);
        assert_eq!(
            reduce_i64(&[big, big - 1], 1, 2, 1, ReduceOp::Sum),
            [2 * big - 1]
        );
    }

    #[test]
    fn empty_reductions_do_not_panic() {
        // [2, 0] over dim 0: no outputs; [0, 3] over dim 0: three zero sums.
        assert!(reduce_f32(&[], 1, 2, 0, ReduceOp::Sum).is_empty());
        assert_eq!(reduce_f32(&[], 1, 0, 3, ReduceOp::Sum), [0.0; 3]);
        assert!(reduce_i64(&[], 1, 2, 0, ReduceOp::Sum).is_empty());
        assert_eq!(reduce_i64(&[], 1, 0, 3, ReduceOp::Sum), [0; 3]);
    }

    /// A bias gradient's column sums (one [n, inner] matrix, split by rows across threads):
    /// the f64 sums of every column, and the same bits on 1 thread and on 3.
    #[test]
    fn column_sums_match_f64_and_do_not_depend_on_threads() {
        let (n, inner) = (301, 150);
        let x: Vec<f32> = (0..n * inner)
            .map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 13.0)
            .collect();
        let on = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| reduce_f32(&x, 1, n, inner, ReduceOp::Sum))
        };
        let (one, three) = (on(1), on(3));
        assert_eq!(one, three);
        for (c, &got) in one.iter().enumerate() {
            let want: f64 = (0..n).map(|k| x[k * inner + c] as f64).sum();
            assert!(
                (got as f64 - want).abs() <= 1e-6 * want.abs().max(1.0),
                "column {c}: {got} vs {want}"
            );
        }
    }
}
