//! Matrix products through `sinter_cpu::gemm`, which takes arbitrary row and column strides:
//! transposed operands are multiplied in place, never copied.

use rayon::prelude::*;
use sinter_cpu::gemm::{Activation, Batch, Gemm, MatMut, MatRef};

/// One strided matrix operand: element (i, j) is at `offset + i * rs + j * cs`.
#[derive(Clone, Copy, Debug)]
pub struct MatView {
    pub offset: usize,
    pub rs: isize,
    pub cs: isize,
}

impl MatView {
    pub(crate) fn of<'a>(&self, data: &'a [f32]) -> MatRef<'a> {
        MatRef {
            data,
            offset: self.offset,
            rs: self.rs,
            cs: self.cs,
        }
    }
}

/// The common stride between the batch's views when their offsets step evenly (a strided or
/// broadcast batch: one call of the GEMM), None otherwise.
fn even_stride(batch: usize, view: &impl Fn(usize) -> MatView) -> Option<isize> {
    let first = view(0);
    if batch == 1 {
        return Some(0);
    }
    let step = view(1).offset as isize - first.offset as isize;
    (1..batch)
        .all(|b| {
            let v = view(b);
            v.rs == first.rs
                && v.cs == first.cs
                && v.offset as isize == first.offset as isize + b as isize * step
        })
        .then_some(step)
}

/// out[b] = lhs[b] · rhs[b] for every batch b, m×k times k×n, out contiguous [batch, m, n].
/// `lhs_batch(b)` and `rhs_batch(b)` give each batch's view (broadcast batches reuse offsets).
#[allow(clippy::too_many_arguments)]
pub fn batched_gemm_f32(
    lhs: &[f32],
    rhs: &[f32],
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    lhs_view: impl Fn(usize) -> MatView + Sync,
    rhs_view: impl Fn(usize) -> MatView + Sync,
) -> Vec<f32> {
    if m == 0 || n == 0 || batch == 0 || k == 0 {
        return vec![0f32; batch * m * n];
    }
    // β = 0 below: the GEMM writes every element, so no zero fill first (it showed as ~4 % of
    // a gpt-tiny step in memset).
    let mut out = super::output_vec(batch * m * n);
    let gemm = Gemm::new(m, n, k);
    // The views were built from checked layouts, so a GEMM error here is a bug in them.
    const BAD_VIEW: &str = "internal error: matmul operand views out of bounds";
    if let (Some(sa), Some(sb)) = (even_stride(batch, &lhs_view), even_stride(batch, &rhs_view)) {
        let bt = Batch {
            count: batch,
            a: sa,
            b: sb,
            c: (m * n) as isize,
        };
        gemm.batch(bt)
            .run(
                lhs_view(0).of(lhs),
                rhs_view(0).of(rhs),
                MatMut::row_major(&mut out, n),
            )
            .expect(BAD_VIEW);
        return out;
    }
    // Irregular batch offsets (several broadcast batch dimensions): one product per batch,
    // the small ones spread over the cores.
    let one = |b: usize, dst: &mut [f32], g: Gemm| {
        g.run(
            lhs_view(b).of(lhs),
            rhs_view(b).of(rhs),
            MatMut::row_major(dst, n),
        )
        .expect(BAD_VIEW)
    };
    if 2 * m * n * k >= sinter_cpu::gemm::PAR_MIN_FLOPS {
        for (b, dst) in out.chunks_mut(m * n).enumerate() {
            one(b, dst, gemm);
        }
    } else {
        out.par_chunks_mut(m * n)
            .enumerate()
            .for_each(|(b, dst)| one(b, dst, gemm.threads(1)));
    }
    out
}

/// act(x Wᵀ + bias) for x [rows, inp] and W [out, inp] (strided views), as one GEMM whose
/// epilogue adds the bias and applies the activation while the tile is in registers: (y
/// [rows, out], and with an activation the pre-activation x Wᵀ + bias, which its backward needs).
#[allow(clippy::too_many_arguments)]
pub fn linear_f32(
    (x, xv): (&[f32], MatView),
    (w, wv): (&[f32], MatView),
    bias: Option<&[f32]>,
    act: Activation,
    rows: usize,
    inp: usize,
    out: usize,
) -> (Vec<f32>, Option<Vec<f32>>) {
    // With k > 0 the GEMM (β = 0) writes every element of y and pre: no zero fill first (zero
    // fills showed as ~4 % of a gpt-tiny step in memset). An empty k keeps the zeros it adds
    // the bias to.
    let buffer = |n: usize| {
        if inp > 0 {
            super::output_vec(n)
        } else {
            vec![0f32; n]
        }
    };
    let mut y = buffer(rows * out);
    let mut pre = (act != Activation::None).then(|| buffer(rows * out));
    if rows == 0 || out == 0 {
        return (y, pre);
    }
    let mut gemm = Gemm::new(rows, out, inp).activation(act);
    if let Some(b) = bias {
        gemm = gemm.bias(b);
    }
    // B = Wᵀ: the weight read in place with its strides swapped.
    let wt = MatView {
        rs: wv.cs,
        cs: wv.rs,
        ..wv
    };
    let c = MatMut::row_major(&mut y, out);
    let done = match pre.as_mut() {
        Some(p) => gemm.run_pre(xv.of(x), wt.of(w), c, p),
        None => gemm.run(xv.of(x), wt.of(w), c),
    };
    // The views were built from checked layouts and shapes.
    done.expect("internal error: linear operand views out of bounds");
    (y, pre)
}

/// out[b] = lhs[b] · rhs[b] for i64 operands (views as in [`batched_gemm_f32`]): exact, wrapping
/// on overflow like PyTorch's CPU integer matmul. Integer products are small (ids, counts), so
/// this is a plain loop, not a GEMM.
#[allow(clippy::too_many_arguments)]
pub fn batched_matmul_i64(
    lhs: &[i64],
    rhs: &[i64],
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    lhs_view: impl Fn(usize) -> MatView,
    rhs_view: impl Fn(usize) -> MatView,
) -> Vec<i64> {
    let at = |v: &MatView, i: usize, j: usize| {
        (v.offset as isize + i as isize * v.rs + j as isize * v.cs) as usize
    };
    let mut out = vec![0i64; batch * m * n];
    for (b, dst) in out.chunks_mut((m * n).max(1)).enumerate().take(batch) {
        let (va, vb) = (lhs_view(b), rhs_view(b));
        for (r, d) in dst.iter_mut().enumerate() {
            let (i, j) = (r / n, r % n);
            *d = (0..k).fold(0i64, |acc, p| {
                acc.wrapping_add(lhs[at(&va, i, p)].wrapping_mul(rhs[at(&vb, p, j)]))
            });
        }
    }
    out
}
