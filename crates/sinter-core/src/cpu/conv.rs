//! conv2d as im2col + GEMM (forward and both backward passes) and 2-D pooling.
//! Samples are independent, so the batch is split across cores; each core keeps its own
//! weight-gradient accumulator and they are summed in a fixed order (deterministic).

use rayon::prelude::*;
use sinter_cpu::gemm::{Gemm, MatMut};

use super::matmul::MatView;
use crate::backend::{ConvGeom, Pool2dParams};
use crate::op::pool_max_replaces;

/// col[(ci*kh + y)*kw + x, oy*ow + ox] = input[ci, oy*s - p + y*d, ox*s - p + x*d] (0 outside).
fn im2col(img: &[f32], g: &ConvGeom, c0: usize, col: &mut [f32]) {
    let (s, pd, d) = (
        g.p.stride as isize,
        g.p.padding as isize,
        g.p.dilation as isize,
    );
    let l = g.l();
    for ci in 0..g.cg() {
        let plane = &img[(c0 + ci) * g.h * g.w..(c0 + ci + 1) * g.h * g.w];
        for ky in 0..g.kh {
            for kx in 0..g.kw {
                let row = &mut col[((ci * g.kh + ky) * g.kw + kx) * l..][..l];
                for oy in 0..g.oh {
                    let iy = oy as isize * s - pd + ky as isize * d;
                    let dst = &mut row[oy * g.ow..(oy + 1) * g.ow];
                    if iy < 0 || iy >= g.h as isize {
                        dst.fill(0.0);
                        continue;
                    }
                    let src = &plane[iy as usize * g.w..(iy as usize + 1) * g.w];
                    for (ox, v) in dst.iter_mut().enumerate() {
                        let ix = ox as isize * s - pd + kx as isize * d;
                        *v = if ix < 0 || ix >= g.w as isize {
                            0.0
                        } else {
                            src[ix as usize]
                        };
                    }
                }
            }
        }
    }
}

/// The adjoint of im2col: adds each column entry back to the pixel it was read from.
fn col2im(col: &[f32], g: &ConvGeom, c0: usize, img: &mut [f32]) {
    let (s, pd, d) = (
        g.p.stride as isize,
        g.p.padding as isize,
        g.p.dilation as isize,
    );
    let l = g.l();
    for ci in 0..g.cg() {
        let plane = &mut img[(c0 + ci) * g.h * g.w..(c0 + ci + 1) * g.h * g.w];
        for ky in 0..g.kh {
            for kx in 0..g.kw {
                let row = &col[((ci * g.kh + ky) * g.kw + kx) * l..][..l];
                for oy in 0..g.oh {
                    let iy = oy as isize * s - pd + ky as isize * d;
                    if iy < 0 || iy >= g.h as isize {
                        continue;
                    }
                    for ox in 0..g.ow {
                        let ix = ox as isize * s - pd + kx as isize * d;
                        if ix >= 0 && ix < g.w as isize {
                            plane[iy as usize * g.w + ix as usize] += row[oy * g.ow + ox];
                        }
                    }
                }
            }
        }
    }
}

/// dst (m×n, row-major, overwritten or accumulated) = a · b with strided views.
#[allow(clippy::too_many_arguments)]
fn gemm_into(
    dst: &mut [f32],
    accumulate: bool,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    av: MatView,
    b: &[f32],
    bv: MatView,
) {
    // One thread: the callers already run one image per core.
    let g = Gemm::new(m, n, k)
        .beta(if accumulate { 1.0 } else { 0.0 })
        .threads(1);
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

pub fn conv2d_forward(x: &[f32], w: &[f32], g: &ConvGeom) -> Vec<f32> {
    let (l, ckk, og) = (g.l(), g.ckk(), g.og());
    let mut out = vec![0f32; g.n * g.o * l];
    out.par_chunks_mut(g.o * l).enumerate().for_each_init(
        || vec![0f32; ckk * l],
        |col, (ni, dst)| {
            let img = &x[ni * g.c * g.h * g.w..(ni + 1) * g.c * g.h * g.w];
            for gi in 0..g.p.groups {
                im2col(img, g, gi * g.cg(), col);
                let d = &mut dst[gi * og * l..(gi + 1) * og * l];
                gemm_into(
                    d,
                    false,
                    og,
                    l,
                    ckk,
                    w,
                    row_major(gi * og * ckk, ckk),
                    col,
                    row_major(0, l),
                );
            }
        },
    );
    out
}

/// The input gradient of conv2d from the weight and the output gradient.
pub fn conv2d_backward_data(w: &[f32], dy: &[f32], g: &ConvGeom) -> Vec<f32> {
    backward(None, Some(w), dy, g).0
}

/// The weight gradient of conv2d from the input and the output gradient (summed over fixed
/// chunks of samples in order: deterministic).
pub fn conv2d_backward_filter(x: &[f32], dy: &[f32], g: &ConvGeom) -> Vec<f32> {
    backward(Some(x), None, dy, g).1
}

/// Returns (dx, dw): dx when the weight is given, dw when the input is (else empty).
fn backward(
    x: Option<&[f32]>,
    w: Option<&[f32]>,
    dy: &[f32],
    g: &ConvGeom,
) -> (Vec<f32>, Vec<f32>) {
    let (want_dx, want_dw) = (w.is_some(), x.is_some());
    let (l, ckk, og) = (g.l(), g.ckk(), g.og());
    let img_len = g.c * g.h * g.w;
    let mut dx = if want_dx {
        vec![0f32; g.n * img_len]
    } else {
        Vec::new()
    };
    let wlen = g.o * ckk;
    // Fixed chunks of samples (not per thread) keep the weight-gradient sum order fixed.
    let chunk = 8usize;
    let n_chunks = g.n.div_ceil(chunk);
    let partial_dw: Vec<Vec<f32>> = {
        let dx_chunks: Vec<&mut [f32]> = if want_dx {
            dx.chunks_mut(chunk * img_len).collect()
        } else {
            (0..n_chunks).map(|_| <&mut [f32]>::default()).collect()
        };
        dx_chunks
            .into_par_iter()
            .enumerate()
            .map(|(ci, dxc)| {
                let mut dw = if want_dw {
                    vec![0f32; wlen]
                } else {
                    Vec::new()
                };
                let mut col = vec![0f32; ckk * l];
                let mut dcol = vec![0f32; if want_dx { ckk * l } else { 0 }];
                for ni in ci * chunk..((ci + 1) * chunk).min(g.n) {
                    let dyn_ = &dy[ni * g.o * l..(ni + 1) * g.o * l];
                    for gi in 0..g.p.groups {
                        let dyg_off = gi * og * l;
                        if let Some(x) = x {
                            let img = &x[ni * img_len..(ni + 1) * img_len];
                            im2col(img, g, gi * g.cg(), &mut col);
                            // dw_g (og×ckk) += dy_g (og×l) · colᵀ (l×ckk)
                            let dwg = &mut dw[gi * og * ckk..(gi + 1) * og * ckk];
                            gemm_into(
                                dwg,
                                true,
                                og,
                                ckk,
                                l,
                                dyn_,
                                row_major(dyg_off, l),
                                &col,
                                transposed(0, l),
                            );
                        }
                        if let Some(w) = w {
                            // dcol (ckk×l) = w_gᵀ (ckk×og) · dy_g (og×l)
                            gemm_into(
                                &mut dcol,
                                false,
                                ckk,
                                l,
                                og,
                                w,
                                transposed(gi * og * ckk, ckk),
                                dyn_,
                                row_major(dyg_off, l),
                            );
                            let local = ni - ci * chunk;
                            col2im(
                                &dcol,
                                g,
                                gi * g.cg(),
                                &mut dxc[local * img_len..(local + 1) * img_len],
                            );
                        }
                    }
                }
                dw
            })
            .collect()
    };
    let mut dw = if want_dw {
        vec![0f32; wlen]
    } else {
        Vec::new()
    };
    if want_dw {
        for p in partial_dw {
            for (a, b) in dw.iter_mut().zip(p) {
                *a += b;
            }
        }
    }
    (dx, dw)
}

/// Max pooling over [planes, h, w]; returns the output and each output's argmax (flat index
/// within its plane) for the backward pass.
pub fn max_pool2d(
    x: &[f32],
    planes: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    p: Pool2dParams,
) -> (Vec<f32>, Vec<i64>) {
    let mut out = vec![0f32; planes * oh * ow];
    let mut arg = vec![0i64; planes * oh * ow];
    if out.is_empty() {
        return (out, arg);
    }
    // Without padding every window lies inside its plane: no bounds checks per element.
    let (k, s) = (p.kernel, p.stride);
    let inside = p.padding == 0 && k > 0 && (oh - 1) * s + k <= h && (ow - 1) * s + k <= w;
    out.par_chunks_mut(oh * ow)
        .zip(arg.par_chunks_mut(oh * ow))
        .with_min_len((4096 / (h * w).max(1)).max(1))
        .enumerate()
        .for_each(|(pi, (o, a))| {
            let plane = &x[pi * h * w..(pi + 1) * h * w];
            if inside {
                return max_pool_plane_inside(plane, w, oh, ow, k, s, o, a);
            }
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut best = f32::NEG_INFINITY;
                    let mut bi = -1i64;
                    for ky in 0..p.kernel {
                        let iy = (oy * p.stride + ky) as isize - p.padding as isize;
                        if iy < 0 || iy >= h as isize {
                            continue;
                        }
                        for kx in 0..p.kernel {
                            let ix = (ox * p.stride + kx) as isize - p.padding as isize;
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
                    a[oy * ow + ox] = bi;
                }
            }
        });
    (out, arg)
}

/// One plane of [`max_pool2d`] when every window is inside it (the same scan order and
/// comparison as the general loop: the first element, then any strictly greater one or NaN).
#[allow(clippy::too_many_arguments)]
fn max_pool_plane_inside(
    plane: &[f32],
    w: usize,
    oh: usize,
    ow: usize,
    k: usize,
    s: usize,
    o: &mut [f32],
    a: &mut [i64],
) {
    for oy in 0..oh {
        for ox in 0..ow {
            let first = oy * s * w + ox * s;
            let (mut best, mut bi) = (plane[first], first);
            for ky in 0..k {
                let row = first + ky * w;
                for (kx, &v) in plane[row..row + k].iter().enumerate() {
                    if pool_max_replaces(best, v) {
                        best = v;
                        bi = row + kx;
                    }
                }
            }
            o[oy * ow + ox] = best;
            a[oy * ow + ox] = bi as i64;
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

/// Average pooling; padding counts as zeros in the average (PyTorch's default).
pub fn avg_pool2d(
    x: &[f32],
    planes: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    p: Pool2dParams,
) -> Vec<f32> {
    let inv = 1.0 / (p.kernel * p.kernel) as f32;
    let mut out = vec![0f32; planes * oh * ow];
    out.par_chunks_mut(oh * ow).enumerate().for_each(|(pi, o)| {
        let plane = &x[pi * h * w..(pi + 1) * h * w];
        for oy in 0..oh {
            for ox in 0..ow {
                let mut s = 0f32;
                for ky in 0..p.kernel {
                    let iy = (oy * p.stride + ky) as isize - p.padding as isize;
                    for kx in 0..p.kernel {
                        let ix = (ox * p.stride + kx) as isize - p.padding as isize;
                        if iy >= 0 && iy < h as isize && ix >= 0 && ix < w as isize {
                            s += plane[iy as usize * w + ix as usize];
                        }
                    }
                }
                o[oy * ow + ox] = s * inv;
            }
        }
    });
    out
}

pub fn avg_pool2d_backward(
    dy: &[f32],
    planes: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    p: Pool2dParams,
) -> Vec<f32> {
    let inv = 1.0 / (p.kernel * p.kernel) as f32;
    let mut dx = vec![0f32; planes * h * w];
    dx.par_chunks_mut(h * w).enumerate().for_each(|(pi, d)| {
        for oy in 0..oh {
            for ox in 0..ow {
                let gv = dy[pi * oh * ow + oy * ow + ox] * inv;
                for ky in 0..p.kernel {
                    let iy = (oy * p.stride + ky) as isize - p.padding as isize;
                    for kx in 0..p.kernel {
                        let ix = (ox * p.stride + kx) as isize - p.padding as isize;
                        if iy >= 0 && iy < h as isize && ix >= 0 && ix < w as isize {
                            d[iy as usize * w + ix as usize] += gv;
                        }
                    }
                }
            }
        }
    });
    dx
}
