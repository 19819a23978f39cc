//! conv2d on the device — through cuDNN when `libcudnn` loads (forward, backward-data and
//! backward-filter, algorithms chosen once per shape, see `sinter_cuda::cudnn`), else, or when
//! cuDNN answers NOT_SUPPORTED for a shape, or when `SINTER_CONV=im2col` /
//! [`set_conv_backend`](super::set_conv_backend) asks for it, as im2col + cuBLASLt GEMM — and
//! 2-D max / average pooling with their backward kernels.
//!
//! im2col: images are processed in chunks whose column matrix stays under a fixed budget, so
//! memory does not grow with the batch. Per chunk and group: forward is one batched GEMM (the
//! group's weights shared across images with a zero batch stride); the input gradient is a
//! batched GEMM into a column matrix and a col2im (gather form, no atomics); the weight gradient
//! is one GEMM over all images of the chunk at once (gradient and column matrices rearranged so
//! the images are part of the contraction), accumulated across chunks.

use std::sync::Arc;

use sinter_cuda::cudnn::{ConvProblem, Ran};
use sinter_cuda::ops::conv::{self as kc, Window2d};
use sinter_cuda::{CudaDevice, DevSlice, DeviceBuffer, GemmDesc, GemmShape};

use super::matmul::gemm_dtype;
use super::storage::{CudaStorage, DevView};
use super::{alloc, OnOp};
use crate::backend::{ConvGeom, PoolGeom};
use crate::{DType, Layout, Result};

type Buf = Arc<DeviceBuffer>;

/// Elements of column matrix per chunk (128 MiB of f32).
const COL_BUDGET: usize = 1 << 25;

struct Plan {
    g: ConvGeom,
    gemm: sinter_cuda::GemmDType,
    cg: usize,
    og: usize,
    ckk: usize,
    l: usize,
    chw: usize,
    hw: usize,
    chunk: usize,
    dtype: DType,
}

impl Plan {
    fn new(g: &ConvGeom, dtype: DType) -> Result<Plan> {
        let (cg, og) = (g.c / g.p.groups, g.o / g.p.groups);
        let ckk = cg * g.kh * g.kw;
        let l = g.oh * g.ow;
        let chunk = (COL_BUDGET / (ckk * l).max(1)).clamp(1, g.n.max(1));
        Ok(Plan {
            g: *g,
            gemm: gemm_dtype("conv2d", dtype)?,
            cg,
            og,
            ckk,
            l,
            chw: g.c * g.h * g.w,
            hw: g.h * g.w,
            chunk,
            dtype,
        })
    }
    fn window(&self, nc: usize) -> Window2d {
        let p = self.g.p;
        Window2d {
            n: nc,
            c: self.cg,
            h: self.g.h,
            w: self.g.w,
            kernel: (self.g.kh, self.g.kw),
            stride: (p.stride.h, p.stride.w),
            padding: (p.padding.h, p.padding.w),
            dilation: (p.dilation.h, p.dilation.w),
            ceil_mode: false,
        }
    }
    /// (first image, images) of each chunk.
    fn chunks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.g.n)
            .step_by(self.chunk)
            .map(move |n0| (n0, self.chunk.min(self.g.n - n0)))
    }
}

fn tail(buf: &DeviceBuffer, off: usize) -> Result<DevSlice<'_>> {
    buf.slice(off, buf.len() - off).on("conv2d")
}

fn gemm(
    dev: &CudaDevice,
    p: &Plan,
    s: GemmShape,
    a: DevSlice<'_>,
    b: DevSlice<'_>,
    c: DevSlice<'_>,
    beta: f32,
) -> Result<()> {
    let mut desc = GemmDesc::new(p.gemm, s, a, b, c);
    desc.beta = beta;
    super::gemm_align::gemm(dev, &desc, "conv2d")
}

/// im2col of images n0..n0+nc, group gi, into `col` ([nc, ckk, l]).
fn im2col(
    dev: &CudaDevice,
    p: &Plan,
    x: &DevView,
    n0: usize,
    nc: usize,
    gi: usize,
    col: DevSlice<'_>,
) -> Result<()> {
    let xs = tail(&x.buf, x.off + n0 * p.chw + gi * p.cg * p.hw)?;
    kc::im2col(dev, xs, col, &p.window(nc), p.chw).on("conv2d")
}

fn forward(dev: &Arc<CudaDevice>, p: &Plan, x: &DevView, w: &DevView) -> Result<Arc<DeviceBuffer>> {
    let g = &p.g;
    let y = alloc(dev, g.n * g.o * p.l, p.dtype)?;
    let col = alloc(dev, p.chunk * p.ckk * p.l, p.dtype)?;
    for (n0, nc) in p.chunks() {
        let cols = col.slice(0, nc * p.ckk * p.l).on("conv2d")?;
        for gi in 0..g.p.groups {
            im2col(dev, p, x, n0, nc, gi, cols)?;
            // y[n, group] (og x l) = W_g (og x ckk) · col[n] (ckk x l), W shared (stride 0).
            let mut s = GemmShape::new(p.og, p.l, p.ckk).batched(nc);
            if nc > 1 {
                s.stride_a = Some(0);
                s.stride_b = Some(p.ckk * p.l);
                s.stride_c = Some(g.o * p.l);
            }
            let wg = w
                .buf
                .slice(w.off + gi * p.og * p.ckk, p.og * p.ckk)
                .on("conv2d")?;
            gemm(
                dev,
                p,
                s,
                wg,
                cols,
                tail(&y, (n0 * g.o + gi * p.og) * p.l)?,
                0.0,
            )?;
        }
    }
    Ok(y)
}

/// Returns (dx, dw): dx when the weight is given, dw when the input is.
fn backward(
    dev: &Arc<CudaDevice>,
    p: &Plan,
    x: Option<&DevView>,
    w: Option<&DevView>,
    gy: &DevView,
) -> Result<(Option<Buf>, Option<Buf>)> {
    let (want_dx, want_dw) = (w.is_some(), x.is_some());
    let g = &p.g;
    let dx = if want_dx {
        Some(alloc(dev, g.n * p.chw, p.dtype)?)
    } else {
        None
    };
    let dw = if want_dw {
        Some(alloc(dev, g.o * p.ckk, p.dtype)?)
    } else {
        None
    };
    let col = alloc(dev, p.chunk * p.ckk * p.l, p.dtype)?;
    // Rearranged copies for the weight gradient of multi-image chunks.
    let (col_t, gy_t) = if want_dw && p.chunk > 1 {
        (
            Some(alloc(dev, p.chunk * p.ckk * p.l, p.dtype)?),
            Some(alloc(dev, p.chunk * p.og * p.l, p.dtype)?),
        )
    } else {
        (None, None)
    };
    for (ci, (n0, nc)) in p.chunks().enumerate() {
        let cols = col.slice(0, nc * p.ckk * p.l).on("conv2d")?;
        for gi in 0..g.p.groups {
            let gy_off = gy.off + (n0 * g.o + gi * p.og) * p.l;
            if let (Some(dw), Some(x)) = (&dw, x) {
                im2col(dev, p, x, n0, nc, gi, cols)?;
                let dwg = dw.slice(gi * p.og * p.ckk, p.og * p.ckk).on("conv2d")?;
                let beta = if ci == 0 { 0.0 } else { 1.0 };
                if nc == 1 {
                    // dW_g (og x ckk) (+)= gy_g (og x l) · colᵀ.
                    let s = GemmShape::new(p.og, p.ckk, p.l).trans(false, true);
                    gemm(dev, p, s, tail(&gy.buf, gy_off)?, cols, dwg, beta)?;
                } else {
                    let (ct, gt) = (
                        col_t.as_ref().expect("allocated"),
                        gy_t.as_ref().expect("allocated"),
                    );
                    let nl = nc * p.l;
                    // gyᵀ: [og, nc, l] from gy's [nc, og, l] window (images o*l apart).
                    let gts = gt.slice(0, p.og * nl).on("conv2d")?;
                    let (l, o) = (p.l as i64, g.o as i64);
                    let shape = [p.og, nc, p.l];
                    let dst = sinter_cuda::launch::contiguous_strides(&shape);
                    sinter_cuda::ops::copy::strided_copy(
                        dev,
                        tail(&gy.buf, gy_off)?,
                        &[l, o * l, 1],
                        gts,
                        &dst,
                        &shape,
                    )
                    .on("conv2d")?;
                    // colᵀ: [ckk, nc, l] from col's [nc, ckk, l].
                    let cts = ct.slice(0, p.ckk * nl).on("conv2d")?;
                    let shape = [p.ckk, nc, p.l];
                    let dst = sinter_cuda::launch::contiguous_strides(&shape);
                    sinter_cuda::ops::copy::strided_copy(
                        dev,
                        cols,
                        &[l, p.ckk as i64 * l, 1],
                        cts,
                        &dst,
                        &shape,
                    )
                    .on("conv2d")?;
                    let s = GemmShape::new(p.og, p.ckk, nl).trans(false, true);
                    gemm(dev, p, s, gts, cts, dwg, beta)?;
                }
            }
            if let (Some(dx), Some(w)) = (&dx, w) {
                // dcol[n] (ckk x l) = W_gᵀ (ckk x og) · gy_g[n] (og x l).
                let mut s = GemmShape::new(p.ckk, p.l, p.og)
                    .trans(true, false)
                    .batched(nc);
                if nc > 1 {
                    s.stride_a = Some(0);
                    s.stride_b = Some(g.o * p.l);
                    s.stride_c = Some(p.ckk * p.l);
                }
                let wg = w
                    .buf
                    .slice(w.off + gi * p.og * p.ckk, p.og * p.ckk)
                    .on("conv2d")?;
                gemm(dev, p, s, wg, tail(&gy.buf, gy_off)?, cols, 0.0)?;
                let xs = tail(dx, n0 * p.chw + gi * p.cg * p.hw)?;
                kc::col2im(dev, cols, xs, &p.window(nc), p.chw, false).on("conv2d")?;
            }
        }
    }
    Ok((dx, dw))
}

/// The cuDNN problem of a convolution, when cuDNN is to be tried for it.
fn cudnn_problem(g: &ConvGeom, dtype: DType) -> Option<ConvProblem> {
    if super::conv_backend() == super::ConvBackend::Im2col || !sinter_cuda::cudnn::available() {
        return None;
    }
    let p = to_problem(g, dtype, dtype == DType::F32 && super::allow_tf32());
    // Shapes beyond cuDNN's int range go to im2col (which chunks the batch).
    p.validate().is_ok().then_some(p)
}

/// The cuDNN description of a convolution geometry (pure).
fn to_problem(g: &ConvGeom, dtype: DType, allow_tf32: bool) -> ConvProblem {
    ConvProblem {
        n: g.n,
        c: g.c,
        h: g.h,
        w: g.w,
        o: g.o,
        kh: g.kh,
        kw: g.kw,
        stride: g.p.stride,
        padding: g.p.padding,
        dilation: g.p.dilation,
        groups: g.p.groups,
        dtype,
        allow_tf32,
    }
}

/// `v` itself when its start is 16-byte aligned (what cuDNN's vectorised kernels assume), else
/// an aligned copy (a view starting mid-buffer; rare).
fn aligned(dev: &CudaDevice, v: DevView, dtype: DType) -> Result<DevView> {
    if v.slice().ptr().is_multiple_of(16) {
        return Ok(v);
    }
    let b = alloc(dev, v.len, dtype)?;
    dev.copy(v.slice(), b.as_slice()).on("conv2d")?;
    Ok(DevView::whole(b))
}

/// Counts a pass cuDNN ran, for [`cudnn_conv_passes`](super::cudnn_conv_passes).
fn ran(r: Ran) -> bool {
    match r {
        Ran::Done => {
            super::CUDNN_PASSES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            true
        }
        Ran::Unsupported(_) => false,
    }
}

fn cudnn_forward(
    dev: &Arc<CudaDevice>,
    cp: &ConvProblem,
    x: &DevView,
    w: &DevView,
    dtype: DType,
) -> Result<Option<Buf>> {
    let (_, _, ny) = cp.numels().on("conv2d")?;
    let y = alloc(dev, ny, dtype)?;
    let r = sinter_cuda::cudnn::conv2d_forward(dev, cp, x.slice(), w.slice(), y.as_slice())
        .on("conv2d")?;
    Ok(ran(r).then_some(y))
}

fn cudnn_backward_data(
    dev: &Arc<CudaDevice>,
    cp: &ConvProblem,
    w: &DevView,
    gy: &DevView,
    dtype: DType,
) -> Result<Option<Buf>> {
    let (nx, _, _) = cp.numels().on("conv2d")?;
    let dx = alloc(dev, nx, dtype)?;
    let r = sinter_cuda::cudnn::conv2d_backward_data(dev, cp, w.slice(), gy.slice(), dx.as_slice())
        .on("conv2d")?;
    Ok(ran(r).then_some(dx))
}

fn cudnn_backward_filter(
    dev: &Arc<CudaDevice>,
    cp: &ConvProblem,
    x: &DevView,
    gy: &DevView,
    dtype: DType,
) -> Result<Option<Buf>> {
    let (_, nw, _) = cp.numels().on("conv2d")?;
    let dw = alloc(dev, nw, dtype)?;
    let r =
        sinter_cuda::cudnn::conv2d_backward_filter(dev, cp, x.slice(), gy.slice(), dw.as_slice())
            .on("conv2d")?;
    Ok(ran(r).then_some(dw))
}

/// conv2d of x [n, c, h, w] with weight [o, c/groups, kh, kw] (the caller checked shapes and
/// computed the geometry). The weight is used in x's dtype; the output is in x's dtype, as on
/// the CPU. cuDNN first (when it is to be used), else im2col.
pub(crate) fn conv2d(
    x: &CudaStorage,
    xl: &Layout,
    w: &CudaStorage,
    wl: &Layout,
    g: &ConvGeom,
) -> Result<CudaStorage> {
    let dev = x.device();
    let dtype = x.dtype();
    let p = Plan::new(g, dtype)?;
    let (xv, wv) = (x.window(xl)?, w.window_as(wl, dtype)?);
    let y = match cudnn_problem(g, dtype) {
        Some(cp) => cudnn_forward(
            dev,
            &cp,
            &aligned(dev, xv.clone(), dtype)?,
            &aligned(dev, wv.clone(), dtype)?,
            dtype,
        )?,
        None => None,
    };
    let y = match y {
        Some(y) => y,
        None => forward(dev, &p, &xv, &wv)?,
    };
    Ok(x.sibling(y, dtype))
}

/// The input gradient from the output gradient `gy` and the weight (used in gy's dtype): cuDNN
/// backward-data when it runs the shape, else im2col (GEMM + col2im).
pub(crate) fn conv2d_backward_data(
    gy: &CudaStorage,
    gyl: &Layout,
    w: &CudaStorage,
    wl: &Layout,
    g: &ConvGeom,
) -> Result<CudaStorage> {
    let dev = gy.device();
    let dtype = gy.dtype();
    let (gv, wv) = (gy.window(gyl)?, w.window_as(wl, dtype)?);
    let mut dx = None;
    if let Some(cp) = cudnn_problem(g, dtype) {
        let (wa, ga) = (
            aligned(dev, wv.clone(), dtype)?,
            aligned(dev, gv.clone(), dtype)?,
        );
        dx = cudnn_backward_data(dev, &cp, &wa, &ga, dtype)?;
    }
    let dx = match dx {
        Some(b) => b,
        None => {
            let p = Plan::new(g, dtype)?;
            backward(dev, &p, None, Some(&wv), &gv)?
                .0
                .expect("the weight was given")
        }
    };
    Ok(gy.sibling(dx, dtype))
}

/// The weight gradient from the output gradient `gy` and the input (used in gy's dtype):
/// cuDNN backward-filter when it runs the shape, else im2col (GEMMs over chunks of images).
pub(crate) fn conv2d_backward_filter(
    gy: &CudaStorage,
    gyl: &Layout,
    x: &CudaStorage,
    xl: &Layout,
    g: &ConvGeom,
) -> Result<CudaStorage> {
    let dev = gy.device();
    let dtype = gy.dtype();
    let (gv, xv) = (gy.window(gyl)?, x.window_as(xl, dtype)?);
    let mut dw = None;
    if let Some(cp) = cudnn_problem(g, dtype) {
        let (xa, ga) = (
            aligned(dev, xv.clone(), dtype)?,
            aligned(dev, gv.clone(), dtype)?,
        );
        dw = cudnn_backward_filter(dev, &cp, &xa, &ga, dtype)?;
    }
    let dw = match dw {
        Some(b) => b,
        None => {
            let p = Plan::new(g, dtype)?;
            backward(dev, &p, Some(&xv), None, &gv)?
                .1
                .expect("the input was given")
        }
    };
    Ok(gy.sibling(dw, dtype))
}

fn pool_window(g: &PoolGeom) -> Window2d {
    Window2d {
        n: g.n,
        c: g.c,
        h: g.h,
        w: g.w,
        kernel: (g.p.kernel.h, g.p.kernel.w),
        stride: (g.p.stride.h, g.p.stride.w),
        padding: (g.p.padding.h, g.p.padding.w),
        dilation: (g.p.dilation.h, g.p.dilation.w),
        ceil_mode: g.p.ceil_mode,
    }
}

/// 2-D max pooling (the caller checked the geometry): the output and each output's argmax.
pub(crate) fn max_pool2d(
    x: &CudaStorage,
    l: &Layout,
    g: &PoolGeom,
) -> Result<(CudaStorage, CudaStorage)> {
    let dev = x.device();
    let dtype = x.dtype();
    let win = pool_window(g);
    let nout = g.planes() * g.oh * g.ow;
    let xv = x.window(l)?;
    let y = alloc(dev, nout, dtype)?;
    let arg = alloc(dev, nout, DType::I64)?;
    kc::maxpool2d_forward(dev, xv.slice(), y.as_slice(), Some(arg.as_slice()), &win)
        .on("max_pool2d")?;
    Ok((x.sibling(y, dtype), x.sibling(arg, DType::I64)))
}

/// Routes each output's gradient to its saved argmax.
pub(crate) fn max_pool2d_backward(
    gy: &CudaStorage,
    l: &Layout,
    arg: &CudaStorage,
    g: &PoolGeom,
) -> Result<CudaStorage> {
    let dev = gy.device();
    let dtype = gy.dtype();
    let gv = gy.window(l)?;
    let gx = alloc(dev, g.planes() * g.h * g.w, dtype)?;
    kc::maxpool2d_backward(
        dev,
        gv.slice(),
        arg.buffer().as_slice(),
        gx.as_slice(),
        &pool_window(g),
    )
    .on("max_pool2d")?;
    Ok(gy.sibling(gx, dtype))
}

/// 2-D average pooling (PyTorch's divisor rule, `count_include_pad` as asked; as on the CPU).
pub(crate) fn avg_pool2d(x: &CudaStorage, l: &Layout, g: &PoolGeom) -> Result<CudaStorage> {
    let dev = x.device();
    let dtype = x.dtype();
    let xv = x.window(l)?;
    let y = alloc(dev, g.planes() * g.oh * g.ow, dtype)?;
    kc::avgpool2d_forward(
        dev,
        xv.slice(),
        y.as_slice(),
        &pool_window(g),
        g.p.count_include_pad,
    )
    .on("avg_pool2d")?;
    Ok(x.sibling(y, dtype))
}

pub(crate) fn avg_pool2d_backward(
    gy: &CudaStorage,
    l: &Layout,
    g: &PoolGeom,
) -> Result<CudaStorage> {
    let dev = gy.device();
    let dtype = gy.dtype();
    let gv = gy.window(l)?;
    let gx = alloc(dev, g.planes() * g.h * g.w, dtype)?;
    kc::avgpool2d_backward(
        dev,
        gv.slice(),
        gx.as_slice(),
        &pool_window(g),
        g.p.count_include_pad,
    )
    .on("avg_pool2d")?;
    Ok(gy.sibling(gx, dtype))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Conv2dParams;

    #[test]
    fn cudnn_problems_agree_with_the_tensor_geometry() {
        let sq = Conv2dParams::square;
        let cases = [
            ([2, 3, 8, 8], [4, 3, 3, 3], sq(1, 1, 1, 1)),
            ([3, 4, 9, 7], [6, 2, 3, 2], sq(2, 1, 1, 2)),
            ([2, 2, 11, 11], [3, 2, 3, 3], sq(1, 2, 2, 1)),
            ([2, 4, 6, 6], [4, 1, 3, 3], sq(1, 1, 1, 4)),
            ([1, 8, 5, 4], [16, 8, 5, 4], sq(3, 0, 1, 1)),
            (
                [2, 2, 9, 10],
                [2, 2, 3, 2],
                Conv2dParams {
                    stride: (2, 1).into(),
                    padding: (0, 2).into(),
                    dilation: (1, 3).into(),
                    groups: 1,
                },
            ),
        ];
        for (xs, ws, p) in cases {
            let (oh, ow) = ConvGeom::out_hw(xs[2], xs[3], ws[2], ws[3], &p).unwrap();
            let g = ConvGeom {
                n: xs[0],
                c: xs[1],
                h: xs[2],
                w: xs[3],
                o: ws[0],
                kh: ws[2],
                kw: ws[3],
                oh,
                ow,
                p,
            };
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let cp = to_problem(&g, dtype, false);
                cp.validate().unwrap();
                assert_eq!(cp.out_hw().unwrap(), (oh, ow), "{xs:?} {ws:?} {p:?}");
                assert_eq!(cp.w_dims().map(|v| v as usize), ws, "filter layout");
                assert_eq!(
                    cp.y_dims().unwrap().map(|v| v as usize),
                    [xs[0], ws[0], oh, ow]
                );
                assert_eq!(cp.dtype, dtype);
            }
            assert!(to_problem(&g, DType::F32, true).allow_tf32);
        }
    }
}
