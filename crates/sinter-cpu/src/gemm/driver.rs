//! The macro-kernel: the five BLIS loops around the micro-kernel, and the split across
//! threads.
//!
//! Loop order (outermost first): column blocks of nc (jc), k blocks of kc (pc; pack B's
//! kc × nc block), row blocks of mc (ic; pack A's mc × kc block, or point into a prepacked
//! A), then NR column panels (jr) and MR row panels (ir) running the micro-kernel. Every
//! operand here is in "internal" orientation: C's rows are its unit-stride dimension (the
//! caller transposes the problem when C is row-major) so tiles are stored as whole vectors.
//!
//! Threads: a large product ([`run_shared`]) parallelises the ic loop, taking row blocks from
//! a counter, with B's block packed once for all; others split C statically ([`run`]).

use std::cell::RefCell;
use std::ops::Range;

use rayon::prelude::*;

use super::blocking::{Blocking, CacheSizes};
use super::kernel::{microkernel, microkernel_kcontig_b, prefetch_tile};
use super::pack::{pack_panels, Src};
use super::problem::{block_offset, Problem};
use crate::simd::Simd;

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

/// One k block of one column block of B: columns jc..jc + ncb, k in pc..pc + kcb, packed
/// at `panels` or (`in_place`) read from `src`.
#[derive(Clone, Copy)]
struct BBlock {
    jc: usize,
    ncb: usize,
    pc: usize,
    kcb: usize,
    src: Src,
    in_place: bool,
    panels: *const f32,
}

impl BBlock {
    /// The block of `p` at (jc, pc), to be packed into `panels` unless read in place.
    ///
    /// # Safety
    /// The block is inside B.
    #[inline(always)]
    unsafe fn new(
        p: &Problem,
        jc: usize,
        ncb: usize,
        pc: usize,
        kcb: usize,
        panels: *const f32,
        in_place: bool,
    ) -> Self {
        BBlock {
            jc,
            ncb,
            pc,
            kcb,
            src: Src {
                ptr: p.b.offset(pc as isize * p.rsb + jc as isize * p.csb),
                fs: p.csb,
                ks: p.rsb,
            },
            in_place,
            panels,
        }
    }
}

/// Tuning switches read once from the environment (for measuring; unset: the measured
/// defaults): SINTER_GEMM_B_IN_PLACE = 0 / 1 forces packing / in-place reading of a B whose k
/// is contiguous (see [`b_in_place`]); SINTER_GEMM_PREFETCH_C = 0 / 1 turns the C-tile
/// prefetch off / on; SINTER_GEMM_PANEL_FIRST = 0 / 1 / a byte count runs [`run_block`]'s
/// row panels outermost never / always / for B blocks up to that size (see [`panel_first`]).
struct Tuning {
    b_in_place: Option<bool>,
    prefetch_c: Option<bool>,
    panel_first: Option<usize>,
}

fn tuning() -> &'static Tuning {
    static ONCE: std::sync::OnceLock<Tuning> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let flag = |k: &str| std::env::var(k).ok().map(|v| v.trim() != "0");
        Tuning {
            b_in_place: flag("SINTER_GEMM_B_IN_PLACE"),
            prefetch_c: flag("SINTER_GEMM_PREFETCH_C"),
            panel_first: std::env::var("SINTER_GEMM_PANEL_FIRST").ok().and_then(|v| {
                match v.trim() {
                    "1" => Some(usize::MAX),
                    v => v.parse().ok(),
                }
            }),
        }
    })
}

/// Whether a B whose k is contiguous is read in place by the micro-kernel (packing it is a
/// transposing copy) for `rows` × `cols` of C in k blocks of `kc` (see [`in_place_pays`]).
fn b_in_place(p: &Problem, kc: usize, rows: usize, cols: usize, mc: usize) -> bool {
    let kcontig = p.rsb == 1 && p.csb != 1;
    kcontig
        && tuning()
            .b_in_place
            .unwrap_or_else(|| in_place_pays(kc.min(p.k), rows, cols, mc, CacheSizes::get().l2))
}

/// Reading B in place pays while its kc × cols block stays in L2 or is swept once (one row
/// block of `mc`): the skinny products of training (kc 128, 768 columns) ran 1.05–1.25× faster
/// in place than packed. A larger block swept once per row block streams from L3 or memory
/// as NR strided rows that the prefetcher follows badly; packed once and shared by the row
/// blocks, 2048³ ran ~1.1–1.3× faster on 2 threads (Zen 3, 2026-11-29, `benches/gemm.rs`).
fn in_place_pays(kc: usize, rows: usize, cols: usize, mc: usize, l2: usize) -> bool {
    kc * cols * std::mem::size_of::<f32>() <= l2 || rows <= mc
}

/// The tiles of C's rows ic..ic + mcb against the B block `b`: packs A's block into `abuf`
/// (or points into a prepacked A) and runs the micro-kernel over every tile.
///
/// Two orders. Column panels outermost (BLIS's): one B micro-panel stays in L1 while the
/// whole packed A block streams from L2 past it, which suits a B block too large for L2.
/// Row panels outermost, each A panel packed just before its tiles (see [`panel_first`]):
/// the panel is written into L1 and every column panel reads it there, instead of the whole
/// packed block going out to L2 and streaming back once per column panel, and B's block
/// streams from L2 instead — cheaper for thin products whose B block fits L2 (x·Wᵀ on 64
/// rows, where each call packs the whole weight).
///
/// # Safety
/// As [`run_range`]; `b`'s panels are packed; `abuf` holds mcb (rounded up to MR) · kcb.
#[inline(always)]
unsafe fn run_block<S: Simd, const MV: usize, const NR: usize>(
    p: &Problem,
    b: &BBlock,
    ic: usize,
    mcb: usize,
    abuf: &mut [f32],
) {
    let mr = MV * S::LANES;
    let kcb = b.kcb;
    // A's rows ic + r.. of this k block, to pack (only without a prepacked A, whose `a` is
    // null).
    let a_rows = |r: usize| Src {
        ptr: p
            .a
            .offset((ic + r) as isize * p.rsa + b.pc as isize * p.csa),
        fs: p.rsa,
        ks: p.csa,
    };
    let prepacked = if p.packed_a.is_null() {
        None
    } else {
        // ic is a multiple of MR (threads and mc split on panel bounds).
        let padded_m = p.m.div_ceil(mr) * mr;
        Some(p.packed_a.add(block_offset(b.pc, padded_m) + ic * kcb))
    };
    if panel_first(S::LANES, b.ncb, kcb) {
        for ir in (0..mcb).step_by(mr) {
            let panel = match prepacked {
                Some(a) => a.add(ir * kcb),
                None => {
                    pack_panels(a_rows(ir), mr.min(mcb - ir), kcb, mr, abuf, S::LANES >= 8);
                    abuf.as_ptr()
                }
            };
            for jr in (0..b.ncb).step_by(NR) {
                run_tile::<S, MV, NR>(p, b, ic, ir, mcb, jr, panel);
            }
        }
        return;
    }
    let apanels: *const f32 = match prepacked {
        Some(a) => a,
        None => {
            pack_panels(a_rows(0), mcb, kcb, mr, abuf, S::LANES >= 8);
            abuf.as_ptr()
        }
    };
    for jr in (0..b.ncb).step_by(NR) {
        for ir in (0..mcb).step_by(mr) {
            run_tile::<S, MV, NR>(p, b, ic, ir, mcb, jr, apanels.add(ir * kcb));
        }
    }
}

/// Whether [`run_block`] runs row panels outermost for a B block of `ncb` columns × `kcb` with
/// `lanes`-wide vectors: on AVX2 (16 × 6 tiles) while that block takes at most a quarter of
/// L2. Measured with `benches/gemm.rs` capped to AVX2 on a Xeon (2 MiB L2, 2 threads, 2026-11-30):
/// x·Wᵀ 64 × 3072 × 768 122–129 → 131–135 GFLOP/s, 32 rows 91–101 → 107–108, 256³ 129–139 →
/// 149–151, gpt-tiny's shapes unchanged within the noise. AVX-512's 32 × 12 tiles lost up to
/// 10 % on gpt-tiny's k = 128 products that way, so they keep the column order.
fn panel_first(lanes: usize, ncb: usize, kcb: usize) -> bool {
    let bytes = ncb * kcb * std::mem::size_of::<f32>();
    match tuning().panel_first {
        Some(limit) => bytes <= limit,
        None => panel_first_pays(lanes, bytes, CacheSizes::get().l2),
    }
}

/// [`panel_first`]'s rule for a B block of `bytes` under an L2 of `l2` bytes.
pub(crate) fn panel_first_pays(lanes: usize, bytes: usize, l2: usize) -> bool {
    lanes == 8 && bytes <= l2 / 4
}

/// One MR × NR tile of C: row panel `ir` (at `apanel`, packed) against column panel `jr` of
/// `b`, stored through the epilogue.
///
/// # Safety
/// As [`run_block`]; `apanel` holds MR · kcb packed values.
#[inline(always)]
unsafe fn run_tile<S: Simd, const MV: usize, const NR: usize>(
    p: &Problem,
    b: &BBlock,
    ic: usize,
    ir: usize,
    mcb: usize,
    jr: usize,
    apanel: *const f32,
) {
    let mr = MV * S::LANES;
    let (ncb, kcb) = (b.ncb, b.kcb);
    let (first, last) = (b.pc == 0, b.pc + kcb >= p.k);
    let (rows, cols) = (mr.min(mcb - ir), NR.min(ncb - jr));
    // Prefetching the C tile was measured on AVX2 (Zen 3) only: the AVX-512 path (16
    // lanes) is left as it was until someone measures it there.
    if p.rsc == 1 && tuning().prefetch_c.unwrap_or(S::LANES <= 8) {
        let at = (ic + ir) as isize + (b.jc + jr) as isize * p.csc;
        prefetch_tile(p.c.offset(at), p.csc, rows, cols);
    }
    let acc = if b.in_place {
        let last_col = ncb - 1;
        let cols: [*const f32; NR] = std::array::from_fn(
            #[inline(always)]
            |j| b.src.ptr.offset((jr + j).min(last_col) as isize * p.csb),
        );
        microkernel_kcontig_b::<S, MV, NR>(kcb, apanel, &cols)
    } else {
        microkernel::<S, MV, NR>(kcb, apanel, b.panels.add(jr * kcb))
    };
    let beta = if first { p.beta } else { 1.0 };
    p.store::<S, MV, NR>(&acc, ic + ir, b.jc + jr, rows, cols, beta, last);
}

/// The k-block size of `p` under `blk` (a prepacked A fixes it).
fn kc_of(p: &Problem, blk: Blocking) -> usize {
    if p.packed_a.is_null() {
        blk.kc
    } else {
        p.packed_kc
    }
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
    let kc_max = kc_of(p, blk);
    let (mc, nc) = (blk.mc, blk.nc);
    let mut bscratch = Scratch::take(&PACK_B, kc_max * nc.min(cols.len().div_ceil(NR) * NR));
    let mut ascratch = Scratch::take(&PACK_A, kc_max * mc.min(rows.len().div_ceil(mr) * mr));
    let (bbuf, abuf) = (bscratch.slice(), ascratch.slice());
    let in_place = b_in_place(p, kc_max, rows.len(), nc.min(cols.len()), mc);
    for jc in (cols.start..cols.end).step_by(nc) {
        let ncb = nc.min(cols.end - jc);
        for (pc, kcb) in k_blocks(p.k, kc_max) {
            let b = BBlock::new(p, jc, ncb, pc, kcb, bbuf.as_ptr(), in_place);
            if !b.in_place {
                pack_panels(b.src, ncb, b.kcb, NR, bbuf, S::LANES >= 8);
            }
            for ic in (rows.start..rows.end).step_by(mc) {
                run_block::<S, MV, NR>(p, &b, ic, mc.min(rows.end - ic), abuf);
            }
        }
    }
}

/// A raw pointer shared by the tasks of one threaded product.
#[derive(Clone, Copy)]
struct Shared<T>(T);
// SAFETY: the tasks write disjoint parts of what it points to (see the uses).
unsafe impl<T> Send for Shared<T> {}
unsafe impl<T> Sync for Shared<T> {}

impl<T: Copy> Shared<T> {
    /// The value (a method, so that closures capture the whole wrapper, not its field).
    fn get(self) -> T {
        self.0
    }
}

/// The k blocks (start, length) of a product with shared dimension `k` in blocks of `kc`;
/// one empty block when k = 0 (C = β·C and the epilogue still run).
fn k_blocks(k: usize, kc: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..k.max(1))
        .step_by(kc)
        .map(move |pc| (pc, kc.min(k - pc)))
}

/// How many row blocks (of whole MR panels) `threads` threads share: the cache blocks of
/// `mc` rows, at least two per thread where there are panels for them (a thread held up by
/// another process then leaves its later blocks to the others), and a multiple of `threads`
/// so that equal threads finish together. Returns (blocks, rows per block).
pub(crate) fn row_blocks(m: usize, mr: usize, mc: usize, threads: usize) -> (usize, usize) {
    let panels = m.div_ceil(mr);
    let want = m.div_ceil(mc).max(2 * threads).div_ceil(threads) * threads;
    let per = panels.div_ceil(want.min(panels)) * mr;
    (m.div_ceil(per), per)
}

/// The smallest m, n and k that [`run_shared`] runs (others split C statically): there it
/// measured 1.0–1.2× the static split on 2 loaded Zen 1 cores (1024³, 2048³), while the
/// skinny products of training (k or a side of 128) measured no better and up to 10 % worse
/// (more synchronisation per flop: 2026-11-28, `gemm_timing`).
const SHARED_MIN: usize = 512;

/// Runs `f` once on each of `threads` rayon tasks, inside S's ISA (a closure does not
/// inherit its creator's target features; `f` must be `#[inline(always)]`).
///
/// Keep the wrapping closure: `S::vectorize(&f)` (clippy's `redundant_closure` suggestion)
/// calls `f` through `<&F as FnOnce>::call_once`, which is not inlined into the ISA function,
/// so `f`'s body — the whole macro-kernel — is compiled without AVX2/FMA and every intrinsic
/// becomes a call: that ran GEMM 1024³ at 3.9 instead of 67 GFLOP/s (reverted 4ec0e42).
/// `threaded_products_keep_their_simd_speed` in tests/gemm.rs catches it coming back.
#[inline(always)]
#[allow(clippy::redundant_closure)]
fn on_threads<S: Simd>(threads: usize, f: impl Fn() + Sync) {
    (0..threads).into_par_iter().for_each(|_| {
        // SAFETY: S's ISA is the product's, which the caller checked the CPU has.
        unsafe {
            S::vectorize(
                #[inline(always)]
                || f(),
            )
        }
    });
}

/// The whole product on `threads` threads that share each packed block of B (packed by all
/// of them, once) and take C's row blocks from a common counter: no operand is packed twice,
/// and a slow thread's blocks go to the others.
///
/// # Safety
/// As [`run_range`]; `p` has no prepacked A.
#[inline(always)]
unsafe fn run_shared<S: Simd, const MV: usize, const NR: usize>(
    p: &Problem,
    blk: Blocking,
    threads: usize,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mr = MV * S::LANES;
    let kc = blk.kc;
    let (blocks, mcb) = row_blocks(p.m, mr, blk.mc, threads);
    let nc = blk.nc.min(p.n.div_ceil(NR) * NR);
    let in_place = b_in_place(p, kc, p.m, nc, blk.mc);
    if in_place {
        // B is read in place: nothing is shared, so each row block runs all of its k and
        // column blocks without waiting for the others.
        let next = AtomicUsize::new(0);
        return on_threads::<S>(
            threads,
            #[inline(always)]
            || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= blocks {
                    break;
                }
                let ic = i * mcb;
                // SAFETY: each row block is one task's alone.
                unsafe { run_range::<S, MV, NR>(p, blk, ic..(ic + mcb).min(p.m), 0..p.n) };
            },
        );
    }
    let mut bscratch = Scratch::take(&PACK_B, kc * nc);
    let bbuf = Shared(bscratch.slice().as_mut_ptr());
    for jc in (0..p.n).step_by(nc) {
        let ncb = nc.min(p.n - jc);
        for (pc, kcb) in k_blocks(p.k, kc) {
            let b = Shared(BBlock::new(p, jc, ncb, pc, kcb, bbuf.get(), in_place));
            if !b.get().in_place {
                let panels = ncb.div_ceil(NR);
                let next = AtomicUsize::new(0);
                let group = panels.div_ceil(threads * 4).max(1);
                on_threads::<S>(
                    threads,
                    #[inline(always)]
                    || loop {
                        let g0 = next.fetch_add(group, Ordering::Relaxed);
                        if g0 >= panels {
                            break;
                        }
                        let (f0, f1) = (g0 * NR, ((g0 + group) * NR).min(ncb));
                        let b = b.get();
                        // SAFETY: each group packs its own panels of the buffer.
                        unsafe {
                            let src = Src {
                                ptr: b.src.ptr.offset(f0 as isize * b.src.fs),
                                ..b.src
                            };
                            let len = (f1 - f0).div_ceil(NR) * NR * b.kcb;
                            let dst =
                                std::slice::from_raw_parts_mut(bbuf.get().add(f0 * b.kcb), len);
                            pack_panels(src, f1 - f0, b.kcb, NR, dst, S::LANES >= 8);
                        }
                    },
                );
            }
            let next = AtomicUsize::new(0);
            on_threads::<S>(
                threads,
                #[inline(always)]
                || {
                    let mut ascratch = Scratch::take(&PACK_A, kc * mcb);
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= blocks {
                            break;
                        }
                        let ic = i * mcb;
                        // SAFETY: each row block is one task's alone.
                        unsafe {
                            run_block::<S, MV, NR>(
                                p,
                                &b.get(),
                                ic,
                                mcb.min(p.m - ic),
                                ascratch.slice(),
                            )
                        };
                    }
                },
            );
        }
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
    if super::gemv::applies(p, S::LANES) {
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
    if threads > 1 && p.packed_a.is_null() && p.m.min(p.n).min(p.k) >= SHARED_MIN {
        return run_shared::<S, MV, NR>(p, blk, threads);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_blocks_cover_every_row_in_whole_panels_shared_evenly() {
        for (m, mr, mc, threads) in [
            (2048, 16, 176, 2),
            (1024, 16, 176, 2),
            (520, 16, 176, 3),
            (512, 32, 256, 2),
            (17, 16, 176, 2),
            (16, 16, 176, 4),
        ] {
            let (blocks, per) = row_blocks(m, mr, mc, threads);
            assert_eq!(per % mr, 0, "{m} {mr} {mc} {threads}");
            assert!(per <= mc.max(mr), "a block of {per} rows exceeds mc = {mc}");
            assert!(
                blocks * per >= m && (blocks - 1) * per < m,
                "{blocks} × {per} for {m} rows"
            );
            let panels = m.div_ceil(mr);
            // Two or more blocks per thread where the panels allow it.
            assert!(
                blocks >= (2 * threads).min(panels),
                "{blocks} blocks for {threads} threads, {panels} panels"
            );
        }
    }

    #[test]
    fn b_is_read_in_place_for_skinny_products_and_packed_for_large_ones() {
        // Zen 3's AVX2 blocks: kc 512, mc 128, L2 512 KiB. Internal rows are C's columns.
        let pays = |k: usize, rows, cols| in_place_pays(512.min(k), rows, cols, 128, 512 << 10);
        assert!(!pays(2048, 2048, 2048), "2048³ packs B");
        assert!(!pays(1024, 1024, 1024), "1024³ packs B");
        assert!(pays(256, 256, 256), "256³: B fits in L2");
        assert!(pays(128, 512, 768), "gpt-tiny fc1 (768×512×128)");
        assert!(pays(512, 128, 768), "gpt-tiny fc2: one row block");
        assert!(pays(4096, 100, 4096), "one row block sweeps B once");
    }

    #[test]
    fn row_panels_go_outermost_on_avx2_for_b_blocks_within_a_quarter_of_l2() {
        let l2 = 2 << 20;
        // x·Wᵀ on 64 rows: B is xᵀ, 64 columns × kc 512.
        assert!(panel_first_pays(8, 64 * 512 * 4, l2));
        assert!(panel_first_pays(8, l2 / 4, l2));
        assert!(!panel_first_pays(8, l2 / 4 + 4, l2), "past a quarter of L2");
        assert!(!panel_first_pays(8, 2048 * 512 * 4, l2), "2048³'s B block");
        assert!(
            !panel_first_pays(16, 64 * 512 * 4, l2),
            "AVX-512 keeps BLIS's order"
        );
        assert!(
            !panel_first_pays(1, 4 * 16 * 4, l2),
            "scalar keeps BLIS's order"
        );
    }

    #[test]
    fn k_blocks_cover_k_and_an_empty_k_is_one_empty_block() {
        let blocks: Vec<_> = k_blocks(1000, 368).collect();
        assert_eq!(blocks, [(0, 368), (368, 368), (736, 264)]);
        assert_eq!(k_blocks(0, 368).collect::<Vec<_>>(), [(0, 0)]);
        assert_eq!(k_blocks(368, 368).collect::<Vec<_>>(), [(0, 368)]);
    }
}
