//! Packing: copies a block of an operand into the layout the micro-kernel reads, so its
//! inner loop sees unit-stride, cache-resident data whatever the operand's strides were.
//!
//! Layout ("panels"): the block's free dimension (rows of A or columns of B) is cut into
//! panels of `width` (MR for A, NR for B); panel `p` holds, for each k in 0..kc, the `width`
//! values of that k consecutively, at `p · width · kc`. A last partial panel is padded with
//! zeros, so the micro-kernel never branches on edges. A prepacked operand ([`super::PackedB`])
//! is the same layout, block after block.

use crate::im2col::copy_short;

/// A strided source block: element (f, k) at `ptr + f·fs + k·ks` (f along the free dimension).
#[derive(Clone, Copy)]
pub(crate) struct Src {
    pub ptr: *const f32,
    pub fs: isize,
    pub ks: isize,
}

/// Packs `free` × `kc` values of `src` into `dst` (at least `free.div_ceil(width)·width·kc`).
///
/// # Safety
/// Every (f, k) with f < free, k < kc must address a readable element of `src`.
#[inline(always)]
pub(crate) unsafe fn pack_panels(src: Src, free: usize, kc: usize, width: usize, dst: &mut [f32]) {
    let panels = free.div_ceil(width);
    debug_assert!(dst.len() >= panels * width * kc);
    for p in 0..panels {
        let f0 = p * width;
        let w = width.min(free - f0);
        let out = &mut dst[p * width * kc..(p + 1) * width * kc];
        let base = src.ptr.offset(f0 as isize * src.fs);
        if src.fs == 1 {
            // The free dimension is contiguous: one short copy per k, in fixed-size pieces
            // (a `memcpy` call per 16–32 values costs more than the copy).
            for k in 0..kc {
                let from = std::slice::from_raw_parts(base.offset(k as isize * src.ks), w);
                let to = &mut out[k * width..k * width + width];
                copy_short(&mut to[..w], from);
                to[w..].fill(0.0);
            }
        } else if src.ks == 1 && width <= 32 {
            // k is contiguous (a transposing copy): keep one pointer per row of the panel and
            // walk k, so each row is read sequentially and the panel written in order.
            let mut rows = [base; 32];
            for (f, r) in rows.iter_mut().enumerate().take(w) {
                *r = base.offset(f as isize * src.fs);
            }
            for k in 0..kc {
                let to = &mut out[k * width..(k + 1) * width];
                for f in 0..w {
                    to[f] = *rows[f].add(k);
                }
                to[w..].fill(0.0);
            }
        } else {
            for k in 0..kc {
                let row = base.offset(k as isize * src.ks);
                let to = &mut out[k * width..(k + 1) * width];
                for (f, t) in to.iter_mut().enumerate() {
                    *t = if f < w {
                        *row.offset(f as isize * src.fs)
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}
