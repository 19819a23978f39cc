//! The macro-kernel: the five BLIS loops around the micro-kernel, and the split across
//! threads.
//!
//! Loop order (outermost first): column blocks of nc (jc), k blocks of kc (pc; pack B's
//! kc × nc block), row blocks of mc (ic; pack A's mc × kc block, or point into a prepacked
//! A), then NR column panels (jr) and MR row panels (ir) running the micro-kernel. Every
//! operand here is in "internal" orientation: C's rows are its unit-stride dimension (the
//! caller transposes the problem when C is row-major) so tiles are stored as whole vectors.

use std::cell::RefCell;
use std::ops::Range;

use rayon::prelude::*;

use super::blocking::{Blocking, CacheSizes};
use super::kernel::{
    microkernel, microkernel_kcontig_b, store_tile, store_tile_strided, Acc, TileOut,
};
use super::pack::{pack_panels, Src};
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

thread_local! {
    static PACK_A: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static PACK_B: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// A 64-byte aligned scratch buffer borrowed from a thread-local cell and given back on
/// drop (a fresh one if the cell is in use, which only happens on re-entry). No closure:
/// the kernels around it must stay inside one function compiled for the ISA.
struct Scratch {
    cell: &'static std::thread::LocalKey<RefCell<Vec<f32>>>,
    buf: Vec<f32>,
    skip: usize,
    len: usize,
}

impl Scratch {
    fn take(cell: &'static std::thread::LocalKey<RefCell<Vec<f32>>>, len: usize) -> Scratch {
        let mut buf = cell.with(|c| {
            c.try_borrow_mut()
                .map(|mut v| std::mem::take(&mut *v))
                .unwrap_or_default()
        });
        if buf.len() < len + 16 {
            buf.resize(len + 16, 0.0);
        }
        let skip = buf.as_ptr().align_offset(64).min(16);
        Scratch {
            cell,
            buf,
            skip,
            len,
        }
    }
    fn slice(&mut self) -> &mut [f32] {
        &mut self.buf[self.skip..self.skip + self.len]
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        self.cell.with(|c| {
            if let Ok(mut v) = c.try_borrow_mut() {
                if v.capacity() < buf.capacity() {
                    *v = buf;
                }
            }
        });
    }
}

/// Offset of the k block starting at `pc` inside a prepacked operand with `padded` free
/// elements (a multiple of the panel width) and k blocks of `kc`.
pub(crate) fn block_offset(pc: usize, padded: usize) -> usize {
    pc * padded
}

/// C[rows, cols] of `p` on this thread.
///
/// # Safety
/// `p` is valid (see [`Problem`]); no other thread touches the same C tiles.
#[inline(always)]
pub(crate) unsafe fn run_range<S: Simd, const MV: usize, const NR: usize>(
    p: &Problem,
    blk: Blocking,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    let mr = MV * S::LANES;
    let kc_max = if p.packed_a.is_null() {
        blk.kc
    } else {
        p.packed_kc
    };
    let (mc, nc) = (blk.mc, blk.nc);
    let padded_m = p.m.div_ceil(mr) * mr;
    let mut bscratch = Scratch::take(&PACK_B, kc_max * nc.min(cols.len().div_ceil(NR) * NR));
    let mut ascratch = Scratch::take(&PACK_A, kc_max * mc.min(rows.len().div_ceil(mr) * mr));
    let (bbuf, abuf) = (bscratch.slice(), ascratch.slice());
    let mut jc = cols.start;
    while jc < cols.end {
        let ncb = nc.min(cols.end - jc);
        let mut pc = 0;
        loop {
            let kcb = kc_max.min(p.k - pc);
            let (first, last) = (pc == 0, pc + kcb >= p.k);
            let bsrc = Src {
                ptr: p.b.offset(pc as isize * p.rsb + jc as isize * p.csb),
                fs: p.csb,
                ks: p.rsb,
            };
            // B with contiguous k is read in place (see microkernel_kcontig_b).
            let b_in_place = p.rsb == 1 && p.csb != 1;
            if !b_in_place {
                pack_panels(bsrc, ncb, kcb, NR, bbuf);
            }
            let mut ic = rows.start;
            while ic < rows.end {
                let mcb = mc.min(rows.end - ic);
                let apanels: *const f32 = if p.packed_a.is_null() {
                    let asrc = Src {
                        ptr: p.a.offset(ic as isize * p.rsa + pc as isize * p.csa),
                        fs: p.rsa,
                        ks: p.csa,
                    };
                    pack_panels(asrc, mcb, kcb, mr, abuf);
                    abuf.as_ptr()
                } else {
                    // ic is a multiple of MR (threads and mc split on panel bounds).
                    p.packed_a.add(block_offset(pc, padded_m) + ic * kcb)
                };
                for jr in (0..ncb).step_by(NR) {
                    let bp = bbuf.as_ptr().add(jr * kcb);
                    for ir in (0..mcb).step_by(mr) {
                        let acc = if b_in_place {
                            let last_col = ncb - 1;
                            let cols: [*const f32; NR] = std::array::from_fn(
                                #[inline(always)]
                                |j| bsrc.ptr.offset((jr + j).min(last_col) as isize * p.csb),
                            );
                            microkernel_kcontig_b::<S, MV, NR>(kcb, apanels.add(ir * kcb), &cols)
                        } else {
                            microkernel::<S, MV, NR>(kcb, apanels.add(ir * kcb), bp)
                        };
                        let beta = if first { p.beta } else { 1.0 };
                        let (rows, cols) = (mr.min(mcb - ir), NR.min(ncb - jr));
                        p.store::<S, MV, NR>(&acc, ic + ir, jc + jr, rows, cols, beta, last);
                    }
                }
                ic += mcb;
            }
            pc += kcb;
            if pc >= p.k {
                break;
            }
        }
        jc += ncb;
    }
}

/// The whole product on `threads` threads (1: this thread only). Large dimension split into
/// `threads` parts on panel boundaries; with a prepacked A the columns are split, so no
/// thread packs anything twice.
///
/// # Safety
/// As [`run_range`].
#[inline(always)]
pub(crate) unsafe fn run<S: Simd, const MV: usize, const NR: usize>(
    p: &Problem,
    threads: usize,
    base_nr: usize,
) {
    let mr = MV * S::LANES;
    let mut blk = Blocking::for_kernel(mr, NR, CacheSizes::get());
    // k is blocked as for the ISA's usual tile (`base_nr` columns, as `PackedB` packs), so a
    // product sums in the same order whichever tile width runs it.
    blk.kc = if p.packed_a.is_null() {
        Blocking::for_kernel(mr, base_nr, CacheSizes::get()).kc
    } else {
        p.packed_kc
    };
    if super::gemv::applies(p) {
        let parts = threads.min(p.m.div_ceil(mr)).max(1);
        if parts == 1 {
            return super::gemv::run_rows::<S, MV>(p, 0..p.m);
        }
        let per = p.m.div_ceil(parts).div_ceil(mr) * mr;
        (0..parts).into_par_iter().for_each(|t| {
            let rows = (t * per).min(p.m)..((t + 1) * per).min(p.m);
            // SAFETY: each part owns its rows of C; the task re-enters S's ISA.
            unsafe {
                S::vectorize(
                    #[inline(always)]
                    || super::gemv::run_rows::<S, MV>(p, rows),
                )
            }
        });
        return;
    }
    let split_cols = !p.packed_a.is_null() || 2 * p.n >= p.m;
    let (len, unit) = if split_cols { (p.n, NR) } else { (p.m, mr) };
    let parts = threads.min(len.div_ceil(unit)).max(1);
    if parts == 1 {
        return run_range::<S, MV, NR>(p, blk, 0..p.m, 0..p.n);
    }
    let per = len.div_ceil(parts).div_ceil(unit) * unit;
    let range = |t: usize| (t * per).min(len)..((t + 1) * per).min(len);
    (0..parts).into_par_iter().for_each(|t| {
        let r = range(t);
        if r.is_empty() {
            return;
        }
        let (rows, cols) = if split_cols { (0..p.m, r) } else { (r, 0..p.n) };
        // SAFETY: each part owns its rows or columns of C; the task re-enters S's ISA.
        unsafe {
            S::vectorize(
                #[inline(always)]
                || run_range::<S, MV, NR>(p, blk, rows, cols),
            )
        }
    });
}
