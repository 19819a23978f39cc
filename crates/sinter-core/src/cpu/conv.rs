//! conv2d as im2col + GEMM (forward and both backward passes) and 2-D pooling.
//!
//! The batch is cut into blocks of whole images with about [`BLOCK_COLS`] output pixels in
//! all, and each block is one GEMM: the column matrix of the block's images side by side
//! ([ckk, images·oh·ow]) times the weight. One product per image would be tiny for the small
//! images of a digits CNN (a 4×4 output: 16 columns), and would pack the weight again for
//! every image. The GEMM writes [o, images, oh·ow]; one pass then moves each
//! row to its image ([images, o, oh·ow]), adding the bias and applying the ReLU of a fused
//! conv + bias + ReLU on the way. Backward gathers the output gradient the other way once and
//! runs two block GEMMs: dW += dy·colᵀ and dcol = Wᵀ·dy (then col2im). Blocks run on all
//! cores when there are several; a single block splits its GEMMs and its copies instead.
//! Weight-gradient partial sums are kept per block and added in block order, so results do
//! not depend on the thread count.
//!
//! 3×3 stride-1 ungrouped convolutions with padding ≤ 2 large enough to pay take sinter-cpu's
//! Winograd F(2×2, 3×3) path instead ([`winograd_geom`]; `SINTER_CONV` forces either path).

use std::cell::RefCell;
use std::sync::OnceLock;

use rayon::prelude::*;
use sinter_cpu::gemm::{Gemm, MatMut};

use super::matmul::MatView;
use super::output_vec;
use crate::backend::{ConvGeom, PoolGeom};
use crate::op::pool_max_replaces;
use sinter_cpu::im2col::{copy_short, Window};
use sinter_cpu::winograd::{self, Conv3x3};
use sinter_cpu::Isa;
use sinter_types::Hw;

/// Output pixels (images × oh·ow) per block GEMM: wide enough for the GEMM's register tiles
/// and to pack the weight once for several images, small enough that a batch makes several
/// blocks, which run one per core with single-threaded GEMMs and copies (one fork-join per
/// convolution instead of one per pass). Measured on the digits CNN step (chrt -f 1, 2
/// threads): 64–256 pixels 1.33–1.38 ms, 512 1.54, 1024 1.72; conv:forward-backward
/// (64×32×16×16) 255–280 GFLOP/s at 64–256 against 190 at 1024.
const BLOCK_COLS: usize = 256;

/// Below this many values a copy pass (im2col, col2im, the output scatter) of a single block
/// runs on one thread.
const PAR_COPY: usize = 1 << 16;

/// (images per block, number of blocks).
fn blocks(g: &ConvGeom) -> (usize, usize) {
    let per = (BLOCK_COLS / g.l().max(1)).clamp(1, g.n.max(1));
    (per, g.n.div_ceil(per))
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on a per-thread buffer of `n` values (contents unspecified: `f` writes what it
/// reads). Re-entrant: a nested call while the buffer is out gets a fresh one.
fn with_scratch<R>(n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut buf = SCRATCH
        .with(|c| c.try_borrow_mut().map(|mut v| std::mem::take(&mut *v)))
        .unwrap_or_default();
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    let r = f(&mut buf[..n]);
    SCRATCH.with(|c| {
        if let Ok(mut v) = c.try_borrow_mut() {
            if v.capacity() < buf.capacity() {
                *v = buf;
            }
        }
    });
    r
}

/// Runs `f(i, chunk)` over `data` in chunks of `len`, on all cores when `par`.
fn for_chunks(data: &mut [f32], len: usize, par: bool, f: impl Fn(usize, &mut [f32]) + Sync) {
    if len == 0 {
        return;
    }
    if par {
        data.par_chunks_mut(len)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    } else {
        data.chunks_mut(len).enumerate().for_each(|(i, c)| f(i, c));
    }
}

/// One plane's window of the convolution (sinter-cpu's im2col rule, shared with the int8
/// convolution).
fn window(g: &ConvGeom) -> Window {
    let p = &g.p;
    Window {
        h: g.h,
        w: g.w,
        kh: g.kh,
        kw: g.kw,
        oh: g.oh,
        ow: g.ow,
        stride: (p.stride.h, p.stride.w),
        padding: (p.padding.h, p.padding.w),
        dilation: (p.dilation.h, p.dilation.w),
    }
}

/// For output row `oy` and kernel offset (ky, kx): the input row (None: padding), the column
/// shift and the range of output columns whose input column is inside the image.
fn tap(g: &ConvGeom, oy: usize, ky: usize, kx: usize) -> (Option<usize>, isize, usize, usize) {
    let t = window(g).tap(oy, ky, kx);
    (t.row, t.shift, t.lo, t.hi)
}

/// Where tap (ky, kx) reads when the output rows are as wide as the input rows at stride 1
/// ("same" convolutions): output pixel q reads input pixel q + off for q in [a, b), except the
/// columns outside [lo, hi) of each row, which wrap to a neighbouring input row (padding).
/// None for other geometries, or when the tap reads only padding.
#[derive(Clone, Copy)]
struct Flat {
    a: usize,
    b: usize,
    off: isize,
    oy0: usize,
    oy1: usize,
    lo: usize,
    hi: usize,
}

fn flat_window(g: &ConvGeom, ky: usize, kx: usize) -> Option<Flat> {
    if g.p.stride != Hw::square(1) || g.ow != g.w {
        return None;
    }
    let inside = |oy: usize| tap(g, oy, ky, kx).0;
    let oy0 = (0..g.oh).find(|&oy| inside(oy).is_some())?;
    let oy1 = (oy0..g.oh).find(|&oy| inside(oy).is_none()).unwrap_or(g.oh);
    let (_, shift, lo, hi) = tap(g, oy0, ky, kx);
    if hi <= lo {
        return None;
    }
    let iy0 = inside(oy0)?;
    let (a, b) = (oy0 * g.ow + lo, (oy1 - 1) * g.ow + hi);
    let off = (iy0 * g.w) as isize + lo as isize + shift - a as isize;
    Some(Flat {
        a,
        b,
        off,
        oy0,
        oy1,
        lo,
        hi,
    })
}

/// For each tap of a "same" convolution ([`flat_window`]), whether output pixel q of the
/// window reads the image (false: a wrapped column, which reads padding).
fn flat_masks(g: &ConvGeom) -> Option<Vec<(Flat, Vec<bool>)>> {
    (0..g.kh * g.kw)
        .map(|t| {
            let f = flat_window(g, t / g.kw, t % g.kw)?;
            let keep = (0..g.l())
                .map(|q| (f.lo..f.hi).contains(&(q % g.ow)))
                .collect();
            Some((f, keep))
        })
        .collect()
}

/// dst = 0, short runs without a `memset` call (see [`copy_short`]).
#[inline(always)]
fn zero_short(dst: &mut [f32]) {
    const Z: [f32; 8] = [0.0; 8];
    if dst.len() > 32 {
        return dst.fill(0.0);
    }
    let mut rest = dst;
    while rest.len() >= 8 {
        let (a, b) = rest.split_at_mut(8);
        a.copy_from_slice(&Z);
        rest = b;
    }
    copy_short(rest, &Z[..rest.len()]);
}

/// One row of a block's column matrix: for kernel tap `r` = (ci, ky, kx) of group input
/// channel offset `c0`, the input value under that tap for every output pixel of every image
/// of the block (`imgs` images starting at `x`), 0 over padding.
fn im2col_row(x: &[f32], g: &ConvGeom, c0: usize, r: usize, dst: &mut [f32]) {
    let (kx, ky, ci) = (r % g.kw, (r / g.kw) % g.kh, r / (g.kw * g.kh));
    let (l, img_len, s) = (g.l(), g.c * g.h * g.w, g.p.stride.w);
    let (_, shift, lo, hi) = tap(g, 0, ky, kx);
    let inside = |oy: usize| tap(g, oy, ky, kx).0;
    let flat = flat_window(g, ky, kx);
    for (i, out) in dst.chunks_mut(l).enumerate() {
        let plane = &x[i * img_len + (c0 + ci) * g.h * g.w..][..g.h * g.w];
        if let Some(f) = flat {
            // One flat copy of the window, then the wrapped columns cleared.
            zero_short(&mut out[..f.a]);
            zero_short(&mut out[f.b..]);
            let src0 = (f.a as isize + f.off) as usize;
            copy_short(&mut out[f.a..f.b], &plane[src0..src0 + (f.b - f.a)]);
            for oy in f.oy0..f.oy1 {
                zero_short(&mut out[oy * g.ow..oy * g.ow + f.lo]);
                zero_short(&mut out[oy * g.ow + f.hi..(oy + 1) * g.ow]);
            }
            continue;
        }
        for oy in 0..g.oh {
            let o = &mut out[oy * g.ow..(oy + 1) * g.ow];
            let Some(iy) = inside(oy) else {
                zero_short(o);
                continue;
            };
            let src = &plane[iy * g.w..(iy + 1) * g.w];
            zero_short(&mut o[..lo]);
            zero_short(&mut o[hi..]);
            if s == 1 {
                let a = (lo as isize + shift) as usize;
                copy_short(&mut o[lo..hi], &src[a..a + (hi - lo)]);
            } else {
                for (ox, v) in o[lo..hi].iter_mut().enumerate() {
                    *v = src[(((lo + ox) * s) as isize + shift) as usize];
                }
            }
        }
    }
}

/// col2im for one image: adds every column entry of the group's taps back to the input
/// pixel it was read from. `col` holds the block's columns with row stride `ld`, this
/// image's starting at column 0. `flat`: the taps' windows of a "same" convolution (one
/// masked flat add per tap instead of one short add per output row).
fn col2im_image(
    col: &[f32],
    ld: usize,
    g: &ConvGeom,
    c0: usize,
    flat: Option<&[(Flat, Vec<bool>)]>,
    img: &mut [f32],
) {
    let s = g.p.stride.w;
    for r in 0..g.ckk() {
        let (kx, ky, ci) = (r % g.kw, (r / g.kw) % g.kh, r / (g.kw * g.kh));
        let plane = &mut img[(c0 + ci) * g.h * g.w..][..g.h * g.w];
        let row = &col[r * ld..r * ld + g.l()];
        if let Some(taps) = flat {
            let (f, keep) = &taps[r % (g.kh * g.kw)];
            let d0 = (f.a as isize + f.off) as usize;
            let dst = &mut plane[d0..d0 + (f.b - f.a)];
            for ((d, &v), &k) in dst.iter_mut().zip(&row[f.a..f.b]).zip(&keep[f.a..f.b]) {
                *d += if k { v } else { 0.0 };
            }
            continue;
        }
        for oy in 0..g.oh {
            let (irow, shift, lo, hi) = tap(g, oy, ky, kx);
            let Some(iy) = irow else { continue };
            let dst = &mut plane[iy * g.w..(iy + 1) * g.w];
            let src = &row[oy * g.ow + lo..oy * g.ow + hi];
            if s == 1 {
                let a = (lo as isize + shift) as usize;
                for (d, &v) in dst[a..a + (hi - lo)].iter_mut().zip(src) {
                    *d += v;
                }
            } else {
                for (j, &v) in src.iter().enumerate() {
                    dst[(((lo + j) * s) as isize + shift) as usize] += v;
                }
            }
        }
    }
}

/// Output planes of at most this many pixels (a digits CNN's 8×8 and 4×4) take the table
/// path of im2col and col2im: per (image, channel) the plane is read once and every tap's
/// pixels are picked from it through [`tap_table`], instead of a few short runs per tap.
const SMALL_PLANE: usize = 64;

/// For tap t and output pixel q, `table[t·l + q]`: the input pixel (in its plane) that q
/// reads, or h·w (a zero slot after the plane) over padding. Only for small planes.
fn tap_table(g: &ConvGeom) -> Option<Vec<u32>> {
    if g.l() > SMALL_PLANE || g.h * g.w >= u32::MAX as usize {
        return None;
    }
    Some(window(g).tap_table())
}

/// The block's column matrix for group input channels from `c0`: [ckk, imgs·l], row stride
/// imgs·l (on all cores when `par`), through `table` ([`tap_table`]) when given.
fn im2col_block(
    x: &[f32],
    g: &ConvGeom,
    c0: usize,
    imgs: usize,
    col: &mut [f32],
    par: bool,
    table: Option<&[u32]>,
) {
    let cols = imgs * g.l();
    let Some(table) = table else {
        return for_chunks(&mut col[..g.ckk() * cols], cols, par, |r, dst| {
            im2col_row(x, g, c0, r, dst)
        });
    };
    let (l, hw, kk, img_len) = (g.l(), g.h * g.w, g.kh * g.kw, g.c * g.h * g.w);
    // One input channel's kk rows per task.
    for_chunks(&mut col[..g.ckk() * cols], kk * cols, par, |ci, rows| {
        let mut plane = vec![0f32; hw + 1];
        for i in 0..imgs {
            copy_short(&mut plane[..hw], &x[i * img_len + (c0 + ci) * hw..][..hw]);
            for t in 0..kk {
                let out = &mut rows[t * cols + i * l..][..l];
                for (o, &j) in out.iter_mut().zip(&table[t * l..(t + 1) * l]) {
                    // SAFETY: tap_table's entries are at most hw, the zero slot.
                    *o = unsafe { *plane.get_unchecked(j as usize) };
                }
            }
        }
    });
}

/// [`col2im_image`] through `table` ([`tap_table`]): each channel's taps are added into a
/// local plane (padding into the zero slot), which is then added to the image.
fn col2im_image_table(
    col: &[f32],
    ld: usize,
    g: &ConvGeom,
    c0: usize,
    table: &[u32],
    img: &mut [f32],
) {
    let (l, hw, kk) = (g.l(), g.h * g.w, g.kh * g.kw);
    let mut plane = vec![0f32; hw + 1];
    for ci in 0..g.cg() {
        plane.fill(0.0);
        for t in 0..kk {
            let row = &col[(ci * kk + t) * ld..][..l];
            for (&v, &j) in row.iter().zip(&table[t * l..(t + 1) * l]) {
                // SAFETY: tap_table's entries are at most hw, the zero slot.
                unsafe { *plane.get_unchecked_mut(j as usize) += v };
            }
        }
        for (d, &v) in img[(c0 + ci) * hw..][..hw].iter_mut().zip(&plane[..hw]) {
            *d += v;
        }
    }
}

/// dst (m×n, row-major, overwritten or accumulated) = a · b with strided views, on one
/// thread or (threads None) as the GEMM decides.
#[allow(clippy::too_many_arguments)]
fn gemm_into(
    dst: &mut [f32],
    accumulate: bool,
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    av: MatView,
    b: &[f32],
    bv: MatView,
    single: bool,
) {
    let mut g = Gemm::new(m, n, k).beta(if accumulate { 1.0 } else { 0.0 });
    if single {
        g = g.threads(1);
    }
    g.run(av.of(a), bv.of(b), MatMut::row_major(dst, n))
        .expect("internal error: convolution GEMM views out of bounds");
}

fn row_major(offset: usize, cols: usize) -> MatView {
    MatView {
        offset,
        rs: cols as isize,
        cs: 1,
    }
}
fn transposed(offset: usize, cols: usize) -> MatView {
    MatView {
        offset,
        rs: 1,
        cs: cols as isize,
    }
}

/// What a forward pass adds after the convolution: a bias per output channel and a ReLU.
#[derive(Clone, Copy, Default)]
pub struct Epilogue<'a> {
    pub bias: Option<&'a [f32]>,
    pub relu: bool,
}

/// PyTorch's relu: negative values to 0; -0 and NaN kept.
#[inline(always)]
fn relu(v: f32) -> f32 {
    if v < 0.0 {
        0.0
    } else {
        v
    }
}

/// dst = relu?(src + bias): one output row (no bias: the values as they are, -0 kept).
#[inline(always)]
fn finish_row(dst: &mut [f32], src: &[f32], bias: Option<f32>, relu_on: bool) {
    let Some(bias) = bias else {
        if relu_on {
            for (d, &v) in dst.iter_mut().zip(src) {
                *d = relu(v);
            }
        } else {
            dst.copy_from_slice(src);
        }
        return;
    };
    if relu_on {
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = relu(v + bias);
        }
    } else {
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = v + bias;
        }
    }
}

/// Which convolution algorithm runs: `SINTER_CONV=auto|im2col|winograd` (read once; unset or
/// anything else: auto). `winograd` still falls back to im2col for geometries it cannot do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConvPath {
    Auto,
    Im2col,
    Winograd,
}

fn conv_path() -> ConvPath {
    static PATH: OnceLock<ConvPath> = OnceLock::new();
    *PATH.get_or_init(|| match std::env::var("SINTER_CONV").as_deref() {
        Ok("im2col") => ConvPath::Im2col,
        Ok("winograd") => ConvPath::Winograd,
        _ => ConvPath::Auto,
    })
}

/// Output planes at least this large (oh·ow) take Winograd under `auto`. Measured on a Zen 1
/// (2026-11-28, `RAYON_NUM_THREADS=2 chrt -f 1 sinter bench cpu conv cnn-step`, SINTER_CONV
/// alternated twice): the conv bench's 16×16 planes (32 → 64 channels) 37.3–38.5 ms forward +
/// backward on im2col, 26.3–26.4 ms on Winograd; the digits CNN step (8×8 and 4×4 planes: 4
/// and 16 tiles per channel pair, where the transforms and 16 small GEMMs cost more than they
/// save) 4.2–4.6 ms on im2col, 7.6–7.7 ms on Winograd. Sizes between 64 and 256 pixels were
/// not timed: 144 splits them.
const WINOGRAD_MIN_PLANE: usize = 144;

/// Input and output channels at least this many under `auto`: with fewer the GEMMs are
/// too thin for the transforms to pay.
const WINOGRAD_MIN_CHANNELS: usize = 8;

/// The Winograd shape of `g` when the Winograd path takes it: a 3×3, stride-1, dilation-1,
/// ungrouped convolution with padding ≤ 2, large enough under [`ConvPath::Auto`].
fn winograd_geom(g: &ConvGeom, path: ConvPath) -> Option<Conv3x3> {
    let p = &g.p;
    let fits = g.kh == 3
        && g.kw == 3
        && p.stride == Hw::square(1)
        && p.dilation == Hw::square(1)
        && p.groups == 1
        && p.padding.h <= 2
        && p.padding.w <= 2;
    let pays =
        g.l() >= WINOGRAD_MIN_PLANE && g.c >= WINOGRAD_MIN_CHANNELS && g.o >= WINOGRAD_MIN_CHANNELS;
    let take = match path {
        ConvPath::Im2col => false,
        ConvPath::Winograd => true,
        ConvPath::Auto => pays,
    };
    (fits && take).then_some(Conv3x3 {
        n: g.n,
        c: g.c,
        o: g.o,
        h: g.h,
        w: g.w,
        padding: (p.padding.h, p.padding.w),
    })
}

pub fn conv2d_forward(x: &[f32], w: &[f32], g: &ConvGeom) -> Vec<f32> {
    conv2d_forward_fused(x, w, g, Epilogue::default())
}

/// relu?(conv2d(x, w) + bias) with the bias and the ReLU applied while the GEMM's output is
/// moved to its images (no extra pass).
pub fn conv2d_forward_fused(x: &[f32], w: &[f32], g: &ConvGeom, e: Epilogue) -> Vec<f32> {
    forward_on(conv_path(), x, w, g, e)
}

/// [`conv2d_forward_fused`] with the path chosen as `path` says.
fn forward_on(path: ConvPath, x: &[f32], w: &[f32], g: &ConvGeom, e: Epilogue) -> Vec<f32> {
    let (l, ckk, og) = (g.l(), g.ckk(), g.og());
    let mut out = output_vec(g.n * g.o * l);
    if out.is_empty() {
        return out;
    }
    if let Some(wg) = winograd_geom(g, path) {
        winograd::forward(Isa::get(), &wg, x, w, e.bias, e.relu, &mut out)
            .expect("internal error: the convolution's shapes were checked by its op");
        return out;
    }
    let (per, count) = blocks(g);
    let img_len = g.c * g.h * g.w;
    let table = tap_table(g);
    // One block: its GEMMs and copies use every core; several: one block per core.
    let blocks_in_parallel = count > 1;
    let block = |bi: usize, dst: &mut [f32]| {
        let imgs = dst.len() / (g.o * l);
        let cols = imgs * l;
        let xb = &x[bi * per * img_len..];
        let par = !blocks_in_parallel && ckk * cols >= PAR_COPY;
        with_scratch((ckk + og) * cols, |s| {
            let (col, tmp) = s.split_at_mut(ckk * cols);
            for gi in 0..g.p.groups {
                im2col_block(xb, g, gi * g.cg(), imgs, col, par, table.as_deref());
                // tmp (og × cols) = W_g (og × ckk) · col (ckk × cols)
                gemm_into(
                    tmp,
                    false,
                    (og, cols, ckk),
                    w,
                    row_major(gi * og * ckk, ckk),
                    col,
                    row_major(0, cols),
                    blocks_in_parallel,
                );
                let tmp = &*tmp;
                for_chunks(dst, g.o * l, par, |i, img| {
                    for o in 0..og {
                        let ch = gi * og + o;
                        let b = e.bias.map(|b| b[ch]);
                        let src = &tmp[o * cols + i * l..][..l];
                        finish_row(&mut img[ch * l..(ch + 1) * l], src, b, e.relu);
                    }
                });
            }
        })
    };
    for_chunks(&mut out, per * g.o * l, blocks_in_parallel, block);
    out
}

/// The input gradient of conv2d from the weight and the output gradient.
pub fn conv2d_backward_data(w: &[f32], dy: &[f32], g: &ConvGeom) -> Vec<f32> {
    backward_data_on(conv_path(), w, dy, g)
}

fn backward_data_on(path: ConvPath, w: &[f32], dy: &[f32], g: &ConvGeom) -> Vec<f32> {
    if let Some(wg) = winograd_geom(g, path) {
        let mut dx = output_vec(wg.input_len());
        winograd::backward_data(Isa::get(), &wg, w, dy, &mut dx)
            .expect("internal error: the convolution's shapes were checked by its op");
        return dx;
    }
    backward(None, Some(w), dy, g).0
}

/// The weight gradient of conv2d from the input and the output gradient (summed over fixed
/// blocks of samples in order: deterministic).
pub fn conv2d_backward_filter(x: &[f32], dy: &[f32], g: &ConvGeom) -> Vec<f32> {
    backward_filter_on(conv_path(), x, dy, g)
}

fn backward_filter_on(path: ConvPath, x: &[f32], dy: &[f32], g: &ConvGeom) -> Vec<f32> {
    if let Some(wg) = winograd_geom(g, path) {
        let mut dw = output_vec(wg.weight_len());
        winograd::backward_filter(Isa::get(), &wg, x, dy, &mut dw)
            .expect("internal error: the convolution's shapes were checked by its op");
        return dw;
    }
    backward(Some(x), None, dy, g).1
}

/// Returns (dx, dw): dx when the weight is given, dw when the input is (else empty).
fn backward(
    x: Option<&[f32]>,
    w: Option<&[f32]>,
    dy: &[f32],
    g: &ConvGeom,
) -> (Vec<f32>, Vec<f32>) {
    let (l, ckk, og) = (g.l(), g.ckk(), g.og());
    let img_len = g.c * g.h * g.w;
    let wlen = g.o * ckk;
    let mut dx = if w.is_some() {
        vec![0f32; g.n * img_len]
    } else {
        Vec::new()
    };
    if g.n * l == 0 {
        return (dx, vec![0f32; if x.is_some() { wlen } else { 0 }]);
    }
    let (per, count) = blocks(g);
    let blocks_in_parallel = count > 1;
    let table = tap_table(g);
    let flat = if w.is_some() && table.is_none() {
        flat_masks(g)
    } else {
        None
    };
    // Block bi: its images' dx (when wanted) and its weight-gradient partial (when wanted).
    let block = |bi: usize, dxb: &mut [f32], dwb: &mut [f32]| {
        let i0 = bi * per;
        let imgs = per.min(g.n - i0);
        let cols = imgs * l;
        let par = !blocks_in_parallel && ckk * cols >= PAR_COPY;
        with_scratch(g.o * cols + 2 * ckk * cols, |s| {
            let (dyp, rest) = s.split_at_mut(g.o * cols);
            let (col, dcol) = rest.split_at_mut(ckk * cols);
            // dyp [o, imgs·l] from dy [imgs, o, l].
            for_chunks(dyp, cols, par, |o, row| {
                for (i, r) in row.chunks_mut(l).enumerate() {
                    copy_short(r, &dy[((i0 + i) * g.o + o) * l..][..l]);
                }
            });
            for gi in 0..g.p.groups {
                if let Some(x) = x {
                    im2col_block(
                        &x[i0 * img_len..],
                        g,
                        gi * g.cg(),
                        imgs,
                        col,
                        par,
                        table.as_deref(),
                    );
                    // dw_g (og×ckk) = dy_g (og×cols) · colᵀ (cols×ckk)
                    gemm_into(
                        &mut dwb[gi * og * ckk..(gi + 1) * og * ckk],
                        false,
                        (og, ckk, cols),
                        dyp,
                        row_major(gi * og * cols, cols),
                        col,
                        transposed(0, cols),
                        blocks_in_parallel,
                    );
                }
                if let Some(w) = w {
                    // dcol (ckk×cols) = w_gᵀ (ckk×og) · dy_g (og×cols)
                    gemm_into(
                        dcol,
                        false,
                        (ckk, cols, og),
                        w,
                        transposed(gi * og * ckk, ckk),
                        dyp,
                        row_major(gi * og * cols, cols),
                        blocks_in_parallel,
                    );
                    let dcol = &*dcol;
                    for_chunks(dxb, img_len, par, |i, img| match &table {
                        Some(t) => col2im_image_table(&dcol[i * l..], cols, g, gi * g.cg(), t, img),
                        None => {
                            col2im_image(&dcol[i * l..], cols, g, gi * g.cg(), flat.as_deref(), img)
                        }
                    });
                }
            }
        })
    };
    let mut partial = vec![0f32; if x.is_some() { count * wlen } else { 0 }];
    {
        let dx_chunks: Vec<&mut [f32]> = if w.is_some() {
            dx.chunks_mut(per * img_len).collect()
        } else {
            (0..count).map(|_| <&mut [f32]>::default()).collect()
        };
        let dw_chunks: Vec<&mut [f32]> = if x.is_some() {
            partial.chunks_mut(wlen).collect()
        } else {
            (0..count).map(|_| <&mut [f32]>::default()).collect()
        };
        let work = dx_chunks.into_iter().zip(dw_chunks).enumerate();
        if blocks_in_parallel {
            work.collect::<Vec<_>>()
                .into_par_iter()
                .for_each(|(bi, (a, b))| block(bi, a, b));
        } else {
            work.for_each(|(bi, (a, b))| block(bi, a, b));
        }
    }
    if x.is_none() {
        return (dx, Vec::new());
    }
    if count == 1 {
        return (dx, partial);
    }
    let mut dw = partial[..wlen].to_vec();
    for p in partial[wlen..].chunks(wlen) {
        for (a, b) in dw.iter_mut().zip(p) {
            *a += b;
        }
    }
    (dx, dw)
}

/// Max pooling over [planes, h, w] (padding is −∞: it never wins); returns the output and
/// each output's argmax (flat index within its plane, −1 for a window of padding only) for
/// the backward pass.
pub fn max_pool2d(x: &[f32], g: &PoolGeom) -> (Vec<f32>, Vec<i64>) {
    let mut arg = vec![0i64; g.planes() * g.oh * g.ow];
    let out = max_pool::<true>(x, g, &mut arg);
    (out, arg)
}

/// [`max_pool2d`]'s output alone (inference: no backward, so no argmax to keep).
pub fn max_pool2d_values(x: &[f32], g: &PoolGeom) -> Vec<f32> {
    max_pool::<false>(x, g, &mut [])
}

/// The output, and with `ARG` each output's argmax in `arg` (unused without).
fn max_pool<const ARG: bool>(x: &[f32], g: &PoolGeom, arg: &mut [i64]) -> Vec<f32> {
    let (h, w, oh, ow) = (g.h, g.w, g.oh, g.ow);
    let (k, s, pd, d) = (g.p.kernel, g.p.stride, g.p.padding, g.p.dilation);
    let mut out = vec![0f32; g.planes() * oh * ow];
    if out.is_empty() {
        return out;
    }
    // Without padding, dilation or a ceil-mode window past the edge, every window lies inside
    // its plane: no bounds checks per element.
    let inside = pd == Hw::square(0)
        && d == Hw::square(1)
        && (oh - 1) * s.h + k.h <= h
        && (ow - 1) * s.w + k.w <= w;
    let plane_task = |pi: usize, o: &mut [f32], a: &mut [i64]| {
        let plane = &x[pi * h * w..(pi + 1) * h * w];
        if inside {
            // The NaN rule in the inner loop costs 1.7x on the digits CNN's inference
            // (137k vs 237k samples/s at batch 256): one vectorised scan for NaN picks the
            // plain comparison for planes without any, which gives the same result there.
            return if has_nan(plane) {
                max_pool_plane_inside::<true, ARG>(plane, g, o, a)
            } else {
                max_pool_plane_inside::<false, ARG>(plane, g, o, a)
            };
        }
        for oy in 0..oh {
            for ox in 0..ow {
                let mut best = f32::NEG_INFINITY;
                let mut bi = -1i64;
                for ky in 0..k.h {
                    let iy = (oy * s.h + ky * d.h) as isize - pd.h as isize;
                    if iy < 0 || iy >= h as isize {
                        continue;
                    }
                    for kx in 0..k.w {
                        let ix = (ox * s.w + kx * d.w) as isize - pd.w as isize;
                        if ix < 0 || ix >= w as isize {
                            continue;
                        }
                        let idx = iy as usize * w + ix as usize;
                        if bi < 0 || pool_max_replaces(best, plane[idx]) {
                            best = plane[idx];
                            bi = idx as i64;
                        }
                    }
                }
                o[oy * ow + ox] = best;
                if ARG {
                    a[oy * ow + ox] = bi;
                }
            }
        }
    };
    let min_len = (4096 / (h * w).max(1)).max(1);
    let planes = out.par_chunks_mut(oh * ow);
    if ARG {
        planes
            .zip(arg.par_chunks_mut(oh * ow))
            .with_min_len(min_len)
            .enumerate()
            .for_each(|(pi, (o, a))| plane_task(pi, o, a));
    } else {
        planes
            .with_min_len(min_len)
            .enumerate()
            .for_each(|(pi, o)| plane_task(pi, o, &mut []));
    }
    out
}

/// Whether `v` holds a NaN: 16 lanes at a time without an early exit, so it vectorises (an
/// `any` with its early exit compares one value per step).
fn has_nan(v: &[f32]) -> bool {
    let mut chunks = v.chunks_exact(16);
    let mut nan = false;
    for c in &mut chunks {
        nan |= c.iter().fold(false, |a, x| a | x.is_nan());
    }
    nan || chunks.remainder().iter().any(|x| x.is_nan())
}

/// One plane of [`max_pool2d`] when every window is inside it (the same scan order and
/// comparison as the general loop: the first element, then any strictly greater one or NaN;
/// `NAN` false: the plane holds no NaN, so a plain `>` decides the same). `ARG`: record each
/// output's argmax in `a`.
fn max_pool_plane_inside<const NAN: bool, const ARG: bool>(
    plane: &[f32],
    g: &PoolGeom,
    o: &mut [f32],
    a: &mut [i64],
) {
    let (w, k, s) = (g.w, g.p.kernel, g.p.stride);
    for oy in 0..g.oh {
        for ox in 0..g.ow {
            let first = oy * s.h * w + ox * s.w;
            let (mut best, mut bi) = (plane[first], first);
            for ky in 0..k.h {
                let row = first + ky * w;
                for (kx, &v) in plane[row..row + k.w].iter().enumerate() {
                    if (NAN && pool_max_replaces(best, v)) || (!NAN && v > best) {
                        best = v;
                        bi = row + kx;
                    }
                }
            }
            o[oy * g.ow + ox] = best;
            if ARG {
                a[oy * g.ow + ox] = bi as i64;
            }
        }
    }
}

pub fn max_pool2d_backward(
    dy: &[f32],
    arg: &[i64],
    planes: usize,
    hw: usize,
    ohw: usize,
) -> Vec<f32> {
    let mut dx = vec![0f32; planes * hw];
    dx.par_chunks_mut(hw)
        .with_min_len((4096 / hw.max(1)).max(1))
        .enumerate()
        .for_each(|(pi, d)| {
            for j in 0..ohw {
                let a = arg[pi * ohw + j];
                if a >= 0 {
                    d[a as usize] += dy[pi * ohw + j];
                }
            }
        });
    dx
}

/// Average pooling's window (oy, ox), PyTorch's rule: the input rows y0..y1 and columns
/// x0..x1 it covers, and its divisor — the window clipped to the padded input (kh·kw except
/// for a ceil-mode window hanging past the padding) with `count_include_pad`, else the input
/// pixels it covers. None: a window over padding only (output 0).
fn avg_window(g: &PoolGeom, oy: usize, ox: usize) -> Option<([usize; 4], f32)> {
    let (k, s, pd) = (g.p.kernel, g.p.stride, g.p.padding);
    let axis = |o: usize, k: usize, s: usize, pd: usize, len: usize| {
        let start = (o * s) as isize - pd as isize;
        let end = (start + k as isize).min((len + pd) as isize);
        let padded = end - start;
        let (a, b) = (
            start.max(0) as usize,
            (end.min(len as isize)).max(0) as usize,
        );
        (a, b, padded as usize)
    };
    let (y0, y1, ph) = axis(oy, k.h, s.h, pd.h, g.h);
    let (x0, x1, pw) = axis(ox, k.w, s.w, pd.w, g.w);
    if y0 >= y1 || x0 >= x1 {
        return None;
    }
    let div = if g.p.count_include_pad {
        ph * pw
    } else {
        (y1 - y0) * (x1 - x0)
    };
    Some(([y0, y1, x0, x1], div as f32))
}

/// Average pooling ([`avg_window`]'s divisor).
pub fn avg_pool2d(x: &[f32], g: &PoolGeom) -> Vec<f32> {
    let (h, w, oh, ow) = (g.h, g.w, g.oh, g.ow);
    let mut out = vec![0f32; g.planes() * oh * ow];
    out.par_chunks_mut((oh * ow).max(1))
        .enumerate()
        .for_each(|(pi, o)| {
            let plane = &x[pi * h * w..(pi + 1) * h * w];
            for oy in 0..oh {
                for ox in 0..ow {
                    let Some(([y0, y1, x0, x1], div)) = avg_window(g, oy, ox) else {
                        continue;
                    };
                    let mut s = 0f32;
                    for iy in y0..y1 {
                        for &v in &plane[iy * w + x0..iy * w + x1] {
                            s += v;
                        }
                    }
                    o[oy * ow + ox] = s / div;
                }
            }
        });
    out
}

pub fn avg_pool2d_backward(dy: &[f32], g: &PoolGeom) -> Vec<f32> {
    let (h, w, oh, ow) = (g.h, g.w, g.oh, g.ow);
    let mut dx = vec![0f32; g.planes() * h * w];
    dx.par_chunks_mut((h * w).max(1))
        .enumerate()
        .for_each(|(pi, d)| {
            for oy in 0..oh {
                for ox in 0..ow {
                    let Some(([y0, y1, x0, x1], div)) = avg_window(g, oy, ox) else {
                        continue;
                    };
                    let gv = dy[pi * oh * ow + oy * ow + ox] / div;
                    for iy in y0..y1 {
                        for v in &mut d[iy * w + x0..iy * w + x1] {
                            *v += gv;
                        }
                    }
                }
            }
        });
    dx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Conv2dParams, Pool2dParams};
    use sinter_types::pool_out_size;

    /// The Winograd path gives the im2col path's forward (with bias and ReLU), input gradient
    /// and weight gradient within f32 rounding, for the geometries it takes (paddings 0..=2,
    /// odd sizes, per-axis padding), and declines the others.
    #[test]
    fn winograd_path_matches_im2col() {
        let shapes = [
            (2, 3, 4, 7, 6, (0, 0)),
            (3, 9, 8, 16, 16, (1, 1)),
            (1, 5, 3, 5, 9, (2, 1)),
            (2, 2, 3, 1, 1, (2, 2)),
        ];
        let data = |len: usize, seed: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 7919 + seed * 104729) % 2001) as f32 / 1000.0 - 1.0)
                .collect()
        };
        for (n, c, o, h, w, (ph, pw)) in shapes {
            let p = Conv2dParams {
                padding: Hw::new(ph, pw),
                ..Default::default()
            };
            let (oh, ow) = ConvGeom::out_hw(h, w, 3, 3, &p).unwrap();
            let g = ConvGeom {
                n,
                c,
                h,
                w,
                o,
                kh: 3,
                kw: 3,
                oh,
                ow,
                p,
            };
            assert!(winograd_geom(&g, ConvPath::Winograd).is_some());
            assert!(winograd_geom(&g, ConvPath::Im2col).is_none());
            let (x, wt, dy, bias) = (
                data(n * c * h * w, 1),
                data(o * c * 9, 2),
                data(n * o * oh * ow, 3),
                data(o, 4),
            );
            let e = Epilogue {
                bias: Some(&bias),
                relu: true,
            };
            let close = |what: &str, a: &[f32], b: &[f32], scale: f32| {
                assert_eq!(a.len(), b.len());
                for (i, (&u, &v)) in a.iter().zip(b).enumerate() {
                    assert!(
                        (u - v).abs() <= 1e-5 * scale,
                        "{what} {g:?}: value {i}: {u} vs {v}"
                    );
                }
            };
            let k = (c * 9) as f32;
            close(
                "forward",
                &forward_on(ConvPath::Winograd, &x, &wt, &g, e),
                &forward_on(ConvPath::Im2col, &x, &wt, &g, e),
                k,
            );
            close(
                "dx",
                &backward_data_on(ConvPath::Winograd, &wt, &dy, &g),
                &backward_data_on(ConvPath::Im2col, &wt, &dy, &g),
                (o * 9) as f32,
            );
            close(
                "dw",
                &backward_filter_on(ConvPath::Winograd, &x, &dy, &g),
                &backward_filter_on(ConvPath::Im2col, &x, &dy, &g),
                (n * oh * ow) as f32,
            );
        }
        // Geometries the Winograd path does not take.
        let p = Conv2dParams {
            stride: Hw::square(2),
            ..Default::default()
        };
        let g = ConvGeom {
            n: 1,
            c: 1,
            h: 5,
            w: 5,
            o: 1,
            kh: 3,
            kw: 3,
            oh: 2,
            ow: 2,
            p,
        };
        assert!(winograd_geom(&g, ConvPath::Winograd).is_none());
    }

    /// The inference form gives the training form's values on every route: windows inside
    /// the plane (planes with and without NaN) and the general loop (padding, dilation, ceil
    /// mode).
    #[test]
    fn values_only_max_pool_equals_the_one_with_argmax() {
        let params = [
            Pool2dParams::square(2, 2, 0),
            Pool2dParams {
                ceil_mode: true,
                dilation: Hw::new(1, 2),
                ..Pool2dParams::square(3, 2, 1)
            },
        ];
        let (h, w) = (7, 9);
        let mut x: Vec<f32> = (0..3 * h * w)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.1)
            .collect();
        x[h * w + 10] = f32::NAN;
        for p in params {
            let out = |i, k: usize, s, pd, d| pool_out_size(i, k, s, pd, d, p.ceil_mode).unwrap();
            let (k, s, pd, d) = (p.kernel, p.stride, p.padding, p.dilation);
            let g = PoolGeom {
                n: 1,
                c: 3,
                h,
                w,
                oh: out(h, k.h, s.h, pd.h, d.h),
                ow: out(w, k.w, s.w, pd.w, d.w),
                p,
            };
            let (want, _) = max_pool2d(&x, &g);
            let got = max_pool2d_values(&x, &g);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{p:?}");
            assert!(
                got.iter().any(|v| v.is_nan()),
                "the NaN plane reaches the output"
            );
        }
    }
}
