//! Matrix products through the `gemm` crate, which takes arbitrary row and column strides:
//! transposed operands are multiplied in place, never copied.

use rayon::prelude::*;

/// One strided matrix operand: element (i, j) is at `offset + i * rs + j * cs`.
#[derive(Clone, Copy, Debug)]
pub struct MatView {
    pub offset: usize,
    pub rs: isize,
    pub cs: isize,
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
    let mut out = vec![0f32; batch * m * n];
    if m == 0 || n == 0 {
        return out;
    }
    let flops = 2 * m * n * k;
    // Large products: let gemm split each product across all cores. Many small products:
    // one product per core.
    let big = flops >= 1 << 21;
    let threads = rayon::current_num_threads();
    let run = |b: usize, dst: &mut [f32], par: gemm::Parallelism| {
        let (l, r) = (lhs_view(b), rhs_view(b));
        // SAFETY: the views address elements inside lhs/rhs (checked by the caller's layout
        // arithmetic) and dst is an exclusive m×n row-major block.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.as_mut_ptr(),
                1,
                n as isize,
                false,
                lhs.as_ptr().add(l.offset),
                l.cs,
                l.rs,
                rhs.as_ptr().add(r.offset),
                r.cs,
                r.rs,
                0.0,
                1.0,
                false,
                false,
                false,
                par,
            )
        }
    };
    if big || batch == 1 {
        let par = if big && threads > 1 {
            gemm::Parallelism::Rayon(threads)
        } else {
            gemm::Parallelism::None
        };
        for (b, dst) in out.chunks_mut(m * n).enumerate() {
            run(b, dst, par);
        }
    } else {
        out.par_chunks_mut(m * n)
            .enumerate()
            .for_each(|(b, dst)| run(b, dst, gemm::Parallelism::None));
    }
    out
}
