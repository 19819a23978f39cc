//! The row-task helpers of the row kernels in `kernels/` (softmax, cross-entropy, LayerNorm, ...), index gather and
//! scatter-add (the optimizer updates live in `kernels/optimizer/`). Rows are independent, so
//! they are split across cores; parameter-gradient sums use fixed row chunks so they are
//! deterministic.

use rayon::prelude::*;

/// Rows per task of the parallel row kernels: fixed, so that the parameter-gradient sums are
/// grouped the same way whatever the thread count.
pub(crate) const CHUNK_ROWS: usize = 64;
/// Values per task when rows are split only for speed (results do not depend on the split).
const TASK_LEN: usize = 1 << 14;

/// Rows per task for `len` values in rows of n: all rows in one task (run on the calling
/// thread: rayon does not split a single task) below the parallel threshold.
pub(crate) fn rows_per_task(len: usize, n: usize) -> usize {
    let n = n.max(1);
    if len < super::PAR_THRESHOLD {
        (len / n).max(1)
    } else {
        (TASK_LEN / n).max(1)
    }
}

/// `f(first_row, rows)` over blocks of whole rows of `out` (rows of n), on all cores when long.
pub(crate) fn row_tasks(out: &mut [f32], n: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if n == 0 || out.is_empty() {
        return;
    }
    let rows = rows_per_task(out.len(), n);
    out.par_chunks_mut(rows * n)
        .enumerate()
        .for_each(|(i, o)| f(i * rows, o));
}

/// `f(chunk, rows)` over fixed chunks of [`CHUNK_ROWS`] rows of `out`, in order; on all cores
/// when long. For kernels that also return per-chunk partial sums.
pub(crate) fn fixed_chunks<R: Send>(
    out: &mut [f32],
    n: usize,
    f: impl Fn(usize, &mut [f32]) -> R + Sync + Send,
) -> Vec<R> {
    let block = CHUNK_ROWS * n.max(1);
    if out.len() >= super::PAR_THRESHOLD {
        out.par_chunks_mut(block)
            .enumerate()
            .map(|(c, o)| f(c, o))
            .collect()
    } else {
        out.chunks_mut(block)
            .enumerate()
            .map(|(c, o)| f(c, o))
            .collect()
    }
}

/// The sum of per-chunk partials of length n, added in chunk order (deterministic).
pub(crate) fn sum_partials(partials: impl IntoIterator<Item = Vec<f32>>, n: usize) -> Vec<f32> {
    let mut total = vec![0f32; n];
    for p in partials {
        total.iter_mut().zip(p).for_each(|(a, b)| *a += b);
    }
    total
}

/// out[o, j, i] = x[o, idx[j], i] for x viewed as [outer, n, inner].
pub fn index_select<T: Copy + Default + Send + Sync>(
    x: &[T],
    idx: &[usize],
    outer: usize,
    n: usize,
    inner: usize,
) -> Vec<T> {
    let m = idx.len();
    let mut out = vec![T::default(); outer * m * inner];
    out.par_chunks_mut(inner.max(1))
        .with_min_len(64)
        .enumerate()
        .for_each(|(r, o)| {
            let (oi, j) = (r / m, r % m);
            let src = (oi * n + idx[j]) * inner;
            o.copy_from_slice(&x[src..src + inner]);
        });
    out
}

/// dst[o, idx[j], i] += src[o, j, i]: the scatter-add that is index_select's backward.
/// Columns are split across cores; each column sums its rows in index order (deterministic).
pub fn index_add(
    dst: &mut [f32],
    src: &[f32],
    idx: &[usize],
    outer: usize,
    n: usize,
    inner: usize,
) {
    let m = idx.len();
    for oi in 0..outer {
        let d = &mut dst[oi * n * inner..(oi + 1) * n * inner];
        let s = &src[oi * m * inner..(oi + 1) * m * inner];
        if inner >= 64 && m * inner >= super::PAR_THRESHOLD {
            // Split the inner dimension into column blocks, each owned by one task.
            let block = 64;
            let nb = inner.div_ceil(block);
            let dptr = d.as_mut_ptr() as usize;
            (0..nb).into_par_iter().for_each(|b| {
                let lo = b * block;
                let hi = (lo + block).min(inner);
                for (j, &row) in idx.iter().enumerate() {
                    for col in lo..hi {
                        // SAFETY: each task writes only columns lo..hi of every row; blocks are disjoint.
                        unsafe { *(dptr as *mut f32).add(row * inner + col) += s[j * inner + col] };
                    }
                }
            });
        } else {
            for (j, &row) in idx.iter().enumerate() {
                for col in 0..inner {
                    d[row * inner + col] += s[j * inner + col];
                }
            }
        }
    }
}
