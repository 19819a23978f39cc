//! One product as the kernels see it: raw pointers and strides in internal orientation
//! (validated by the public API), the tile store through its epilogue, and where a k block
//! sits in a prepacked operand. Below both the blocked driver and the GEMV forms.

use super::kernel::{store_tile, store_tile_strided, Acc, TileOut};
use crate::math::activation::Activation;
use crate::simd::Simd;

/// One product in internal orientation, as raw pointers (validated by the public API).
#[derive(Clone, Copy)]
pub(crate) struct Problem {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: f32,
    pub beta: f32,
    /// A (m × k): element (i, p) at a + i·rsa + p·csa.
    pub a: *const f32,
    pub rsa: isize,
    pub csa: isize,
    /// B (k × n): element (p, j) at b + p·rsb + j·csb.
    pub b: *const f32,
    pub rsb: isize,
    pub csb: isize,
    /// C (m × n): element (i, j) at c + i·rsc + j·csc; `pre` (or null) at the same offsets.
    pub c: *mut f32,
    pub rsc: isize,
    pub csc: isize,
    pub pre: *mut f32,
    pub bias: *const f32,
    pub bias_along_rows: bool,
    pub act: Activation,
    /// A already packed (panels of MR, kc blocks of `packed_kc`), or null.
    pub packed_a: *const f32,
    pub packed_kc: usize,
}

// SAFETY: the pointers are only dereferenced inside the ranges each thread owns: threads
// write disjoint tiles of C (and pre) and only read A, B and the bias.
unsafe impl Send for Problem {}
unsafe impl Sync for Problem {}

impl Problem {
    /// Stores a register tile at C's (i, j) with the epilogue when `last` (see
    /// [`store_tile`]), whatever C's strides.
    ///
    /// # Safety
    /// The rows × cols tile at (i, j) is inside C; the CPU has `S`'s ISA.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) unsafe fn store<S: Simd, const MV: usize, const NR: usize>(
        &self,
        acc: &Acc<S, MV, NR>,
        i: usize,
        j: usize,
        rows: usize,
        cols: usize,
        beta: f32,
        last: bool,
    ) {
        let at = i as isize * self.rsc + j as isize * self.csc;
        let t = TileOut {
            c: self.c.offset(at),
            ldc: self.csc,
            pre: if self.pre.is_null() {
                self.pre
            } else {
                self.pre.offset(at)
            },
            pre_ldc: self.csc,
            rows,
            cols,
            alpha: self.alpha,
            beta,
            last,
            bias: if self.bias.is_null() {
                self.bias
            } else if self.bias_along_rows {
                self.bias.add(i)
            } else {
                self.bias.add(j)
            },
            bias_along_rows: self.bias_along_rows,
            act: self.act,
        };
        if self.rsc == 1 {
            store_tile::<S, MV, NR>(acc, &t);
        } else {
            store_tile_strided::<S, MV, NR>(acc, &t, self.rsc, self.csc);
        }
    }
}

/// Offset of the k block starting at `pc` inside a prepacked operand with `padded` free
/// elements (a multiple of the panel width) and k blocks of `kc`.
pub(crate) fn block_offset(pc: usize, padded: usize) -> usize {
    pc * padded
}
