//! Wrappers for `kernels/conv.cu`: im2col/col2im for GEMM-based conv2d, max/avg pooling and
//! batch-norm statistics, all NCHW.

use super::table::{no_ops, Call, Cost, Grid, Kernel, Slot, Slot::*, Source};
use super::{need, need_float, opt_need, ptr_of};
use crate::alloc::DevSlice;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{CudaError, Result};
use crate::launch::{Arg, KernelStruct, Launch, LaunchTarget};
use crate::nvrtc::KernelFile;
use sinter_types::pool_out_size;

/// Matches `struct ConvMeta` in conv.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConvMeta {
    pub n: i64,
    pub c: i64,
    pub h: i64,
    pub w: i64,
    pub img_stride: i64,
    pub kh: i64,
    pub kw: i64,
    pub sh: i64,
    pub sw: i64,
    pub ph: i64,
    pub pw: i64,
    pub dh: i64,
    pub dw: i64,
    pub oh: i64,
    pub ow: i64,
}
// SAFETY: repr(C), i64 fields only (no padding).
unsafe impl KernelStruct for ConvMeta {}

/// Matches `struct PoolMeta` in conv.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolMeta {
    pub planes: i64,
    pub h: i64,
    pub w: i64,
    pub kh: i64,
    pub kw: i64,
    pub sh: i64,
    pub sw: i64,
    pub ph: i64,
    pub pw: i64,
    pub dh: i64,
    pub dw: i64,
    pub oh: i64,
    pub ow: i64,
    pub count_include_pad: i64,
}
// SAFETY: repr(C), i64 fields only (no padding).
unsafe impl KernelStruct for PoolMeta {}

/// Geometry of a 2-D window op over NCHW input (one channel group: `c` channels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window2d {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub kernel: (usize, usize),
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
    /// Pooling only: PyTorch's ceil mode (`sinter_types::pool_out_size`); false for conv.
    pub ceil_mode: bool,
}

impl Window2d {
    /// (out_h, out_w), or an error for an empty output / zero stride.
    pub fn out_hw(&self) -> Result<(usize, usize)> {
        let axis = |i, k, s, p, d| pool_out_size(i, k, s, p, d, self.ceil_mode);
        let oh = axis(
            self.h,
            self.kernel.0,
            self.stride.0,
            self.padding.0,
            self.dilation.0,
        );
        let ow = axis(
            self.w,
            self.kernel.1,
            self.stride.1,
            self.padding.1,
            self.dilation.1,
        );
        match (oh, ow) {
            (Some(a), Some(b)) if a > 0 && b > 0 => Ok((a, b)),
            _ => Err(CudaError::invalid(
                "conv2d",
                format!("window {self:?} gives an empty output"),
            )),
        }
    }

    /// The kernel-side description; `img_stride` is the element distance between images of the
    /// full input (c_total * h * w), which lets a channel group be addressed by pointer offset.
    pub fn conv_meta(&self, img_stride: usize) -> Result<ConvMeta> {
        let (oh, ow) = self.out_hw()?;
        Ok(ConvMeta {
            n: self.n as i64,
            c: self.c as i64,
            h: self.h as i64,
            w: self.w as i64,
            img_stride: img_stride as i64,
            kh: self.kernel.0 as i64,
            kw: self.kernel.1 as i64,
            sh: self.stride.0 as i64,
            sw: self.stride.1 as i64,
            ph: self.padding.0 as i64,
            pw: self.padding.1 as i64,
            dh: self.dilation.0 as i64,
            dw: self.dilation.1 as i64,
            oh: oh as i64,
            ow: ow as i64,
        })
    }

    /// Pooling needs every window to hold at least one input pixel (as PyTorch requires):
    /// padding at most half the effective kernel size.
    pub fn pool_meta(&self, count_include_pad: bool) -> Result<PoolMeta> {
        let (oh, ow) = self.out_hw()?;
        let eff = |k: usize, d: usize| d * (k.max(1) - 1) + 1;
        if 2 * self.padding.0 > eff(self.kernel.0, self.dilation.0)
            || 2 * self.padding.1 > eff(self.kernel.1, self.dilation.1)
        {
            return Err(CudaError::invalid(
                "pool2d",
                format!(
                    "padding {:?} exceeds half the window {:?}",
                    self.padding, self.kernel
                ),
            ));
        }
        Ok(PoolMeta {
            planes: (self.n * self.c) as i64,
            h: self.h as i64,
            w: self.w as i64,
            kh: self.kernel.0 as i64,
            kw: self.kernel.1 as i64,
            sh: self.stride.0 as i64,
            sw: self.stride.1 as i64,
            ph: self.padding.0 as i64,
            pw: self.padding.1 as i64,
            dh: self.dilation.0 as i64,
            dw: self.dilation.1 as i64,
            oh: oh as i64,
            ow: ow as i64,
            count_include_pad: count_include_pad as i64,
        })
    }

    /// Elements of the im2col matrix for all images: n * (c*kh*kw) * (oh*ow).
    pub fn col_len(&self) -> Result<usize> {
        let (oh, ow) = self.out_hw()?;
        Ok(self.n * self.c * self.kernel.0 * self.kernel.1 * oh * ow)
    }

    fn check_32bit(&self) -> Result<()> {
        let (oh, ow) = self.out_hw()?;
        let per_img = self.c * self.kernel.0 * self.kernel.1 * oh * ow;
        if per_img >= u32::MAX as usize || self.c * self.h * self.w >= u32::MAX as usize {
            return Err(CudaError::invalid(
                "conv2d",
                "one image exceeds 2^32 elements",
            ));
        }
        Ok(())
    }
}

/// Input elements the view needs: the last image's group ends at (n-1)*img_stride + c*h*w.
fn input_extent(g: &Window2d, img_stride: usize) -> usize {
    if g.n == 0 {
        0
    } else {
        (g.n - 1) * img_stride + g.c * g.h * g.w
    }
}

const CONV_META: Slot = Struct("meta", std::mem::size_of::<ConvMeta>());
const POOL_META: Slot = Struct("meta", std::mem::size_of::<PoolMeta>());
const BN_SHAPE: [Slot; 3] = [I64("n"), I64("c"), I64("hw")];

/// A row of conv.cu over the float dtypes, one thread per item unless `grid` says otherwise,
/// its traffic estimated.
const fn conv_row(name: &'static str, args: &'static [Slot], grid: Grid) -> Kernel {
    Kernel {
        source: Source::File(KernelFile::Conv),
        name,
        ops: no_ops,
        dtypes: &DType::FLOATS,
        dtypes2: &[],
        args,
        grid,
        traffic: Cost::Estimated,
    }
}

/// One block per channel, four elements of its N*H*W a thread.
const PER_CHANNEL: Grid = Grid::BlockPerRow {
    per_thread: Some(4),
    max_threads: 1024,
};

pub static IM2COL: Kernel = conv_row(
    "im2col_{d}",
    &[In("x"), Out("col"), CONV_META],
    Grid::PerItem,
);
pub static COL2IM: Kernel = conv_row(
    "col2im_{d}",
    &[In("col"), Out("x"), CONV_META, I32("accumulate")],
    Grid::PerItem,
);
pub static MAXPOOL_FWD: Kernel = conv_row(
    "maxpool2d_fwd_{d}",
    &[In("x"), Out("y"), Ptr("argmax"), POOL_META],
    Grid::PerItem,
);
pub static MAXPOOL_BWD: Kernel = conv_row(
    "maxpool2d_bwd_{d}",
    &[In("gy"), In("argmax"), Out("gx"), POOL_META],
    Grid::PerItem,
);
pub static AVGPOOL_FWD: Kernel = conv_row(
    "avgpool2d_fwd_{d}",
    &[In("x"), Out("y"), POOL_META],
    Grid::PerItem,
);
pub static AVGPOOL_BWD: Kernel = conv_row(
    "avgpool2d_bwd_{d}",
    &[In("gy"), Out("gx"), POOL_META],
    Grid::PerItem,
);
pub static BN_STATS: Kernel = conv_row(
    "batchnorm_stats_{d}",
    &[
        In("x"),
        Out("mean"),
        Out("var"),
        BN_SHAPE[0],
        BN_SHAPE[1],
        BN_SHAPE[2],
    ],
    PER_CHANNEL,
);
pub static BN_APPLY: Kernel = conv_row(
    "batchnorm_apply_{d}",
    &[
        In("x"),
        In("mean"),
        In("invstd"),
        Ptr("gamma"),
        Ptr("beta"),
        Out("y"),
        BN_SHAPE[0],
        BN_SHAPE[1],
        BN_SHAPE[2],
    ],
    Grid::PerItem,
);
pub static BN_BWD_REDUCE: Kernel = conv_row(
    "batchnorm_bwd_reduce_{d}",
    &[
        In("x"),
        In("gy"),
        In("mean"),
        In("invstd"),
        Out("sum_gy"),
        Out("sum_gy_xhat"),
        BN_SHAPE[0],
        BN_SHAPE[1],
        BN_SHAPE[2],
    ],
    PER_CHANNEL,
);
pub static BN_BWD_DX: Kernel = conv_row(
    "batchnorm_bwd_dx_{d}",
    &[
        In("x"),
        In("gy"),
        In("mean"),
        In("invstd"),
        Ptr("gamma"),
        In("sum_gy"),
        In("sum_gy_xhat"),
        Out("dx"),
        BN_SHAPE[0],
        BN_SHAPE[1],
        BN_SHAPE[2],
    ],
    Grid::PerItem,
);

/// The rows of `kernels/conv.cu`.
pub static KERNELS: [&Kernel; 10] = [
    &IM2COL,
    &COL2IM,
    &MAXPOOL_FWD,
    &MAXPOOL_BWD,
    &AVGPOOL_FWD,
    &AVGPOOL_BWD,
    &BN_STATS,
    &BN_APPLY,
    &BN_BWD_REDUCE,
    &BN_BWD_DX,
];

/// Plan col = im2col(x). `x` starts at the group's first channel; images are `img_stride` apart.
pub fn plan_im2col(
    t: &LaunchTarget,
    x: DevSlice<'_>,
    col: DevSlice<'_>,
    g: &Window2d,
    img_stride: usize,
) -> Result<Option<Launch>> {
    let d = x.dtype();
    need_float("im2col", d)?;
    g.check_32bit()?;
    if x.len() < input_extent(g, img_stride) {
        return Err(CudaError::invalid("im2col", "x too short for the geometry"));
    }
    let n = g.col_len()?;
    need("im2col", "col", &col, d, n)?;
    let (operands, scalars) = ([x, col], [Arg::bytes(&g.conv_meta(img_stride)?)]);
    IM2COL.plan(t, &Call::new(d, n, &operands).scalars(&scalars))
}

/// Plan x (+)= col2im(col), the adjoint of im2col.
pub fn plan_col2im(
    t: &LaunchTarget,
    col: DevSlice<'_>,
    x: DevSlice<'_>,
    g: &Window2d,
    img_stride: usize,
    accumulate: bool,
) -> Result<Option<Launch>> {
    let d = x.dtype();
    need_float("col2im", d)?;
    g.check_32bit()?;
    if x.len() < input_extent(g, img_stride) {
        return Err(CudaError::invalid("col2im", "x too short for the geometry"));
    }
    need("col2im", "col", &col, d, g.col_len()?)?;
    let n = g.n * g.c * g.h * g.w;
    let operands = [col, x];
    let scalars = [
        Arg::bytes(&g.conv_meta(img_stride)?),
        Arg::I32(accumulate as i32),
    ];
    COL2IM.plan(t, &Call::new(d, n, &operands).scalars(&scalars))
}

/// Plan 2-D max pooling (argmax optional, i64, index within the plane).
pub fn plan_maxpool2d_forward(
    t: &LaunchTarget,
    x: DevSlice<'_>,
    y: DevSlice<'_>,
    argmax: Option<DevSlice<'_>>,
    g: &Window2d,
) -> Result<Option<Launch>> {
    let d = x.dtype();
    need_float("maxpool2d", d)?;
    let (oh, ow) = g.out_hw()?;
    let (nin, nout) = (g.n * g.c * g.h * g.w, g.n * g.c * oh * ow);
    need("maxpool2d", "x", &x, d, nin)?;
    need("maxpool2d", "y", &y, d, nout)?;
    opt_need("maxpool2d", "argmax", &argmax, DType::I64, nout)?;
    if nout == 0 {
        return Ok(None);
    }
    let operands = [x, y];
    let scalars = [Arg::Ptr(ptr_of(&argmax)), Arg::bytes(&g.pool_meta(false)?)];
    MAXPOOL_FWD.plan(t, &Call::new(d, nout, &operands).scalars(&scalars))
}

/// Plan the max-pool backward from the saved argmax (gather form, deterministic).
pub fn plan_maxpool2d_backward(
    t: &LaunchTarget,
    gy: DevSlice<'_>,
    argmax: DevSlice<'_>,
    gx: DevSlice<'_>,
    g: &Window2d,
) -> Result<Option<Launch>> {
    let d = gy.dtype();
    need_float("maxpool2d_backward", d)?;
    let (oh, ow) = g.out_hw()?;
    let (nin, nout) = (g.n * g.c * g.h * g.w, g.n * g.c * oh * ow);
    need("maxpool2d_backward", "gy", &gy, d, nout)?;
    need("maxpool2d_backward", "argmax", &argmax, DType::I64, nout)?;
    need("maxpool2d_backward", "gx", &gx, d, nin)?;
    if nin == 0 {
        return Ok(None);
    }
    let (operands, scalars) = ([gy, argmax, gx], [Arg::bytes(&g.pool_meta(false)?)]);
    MAXPOOL_BWD.plan(t, &Call::new(d, nin, &operands).scalars(&scalars))
}

fn avg_check(g: &Window2d) -> Result<()> {
    if g.dilation != (1, 1) {
        return Err(CudaError::invalid(
            "avgpool2d",
            "dilation is not supported for average pooling",
        ));
    }
    Ok(())
}

/// Plan 2-D average pooling.
pub fn plan_avgpool2d_forward(
    t: &LaunchTarget,
    x: DevSlice<'_>,
    y: DevSlice<'_>,
    g: &Window2d,
    count_include_pad: bool,
) -> Result<Option<Launch>> {
    let d = x.dtype();
    need_float("avgpool2d", d)?;
    avg_check(g)?;
    let (oh, ow) = g.out_hw()?;
    let (nin, nout) = (g.n * g.c * g.h * g.w, g.n * g.c * oh * ow);
    need("avgpool2d", "x", &x, d, nin)?;
    need("avgpool2d", "y", &y, d, nout)?;
    if nout == 0 {
        return Ok(None);
    }
    let (operands, scalars) = ([x, y], [Arg::bytes(&g.pool_meta(count_include_pad)?)]);
    AVGPOOL_FWD.plan(t, &Call::new(d, nout, &operands).scalars(&scalars))
}

/// Plan the average-pool backward (gather form).
pub fn plan_avgpool2d_backward(
    t: &LaunchTarget,
    gy: DevSlice<'_>,
    gx: DevSlice<'_>,
    g: &Window2d,
    count_include_pad: bool,
) -> Result<Option<Launch>> {
    let d = gy.dtype();
    need_float("avgpool2d_backward", d)?;
    avg_check(g)?;
    let (oh, ow) = g.out_hw()?;
    let (nin, nout) = (g.n * g.c * g.h * g.w, g.n * g.c * oh * ow);
    need("avgpool2d_backward", "gy", &gy, d, nout)?;
    need("avgpool2d_backward", "gx", &gx, d, nin)?;
    if nin == 0 {
        return Ok(None);
    }
    let (operands, scalars) = ([gy, gx], [Arg::bytes(&g.pool_meta(count_include_pad)?)]);
    AVGPOOL_BWD.plan(t, &Call::new(d, nin, &operands).scalars(&scalars))
}

/// Batch-norm shape: x is [n, c, hw].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BnShape {
    pub n: usize,
    pub c: usize,
    pub hw: usize,
}

impl BnShape {
    fn numel(&self) -> usize {
        self.n * self.c * self.hw
    }
    fn args(&self) -> [Arg; 3] {
        [
            Arg::I64(self.n as i64),
            Arg::I64(self.c as i64),
            Arg::I64(self.hw as i64),
        ]
    }
}

/// A per-channel call: one item per channel, rows of N*H*W.
fn per_channel<'a>(
    d: DType,
    s: &BnShape,
    operands: &'a [DevSlice<'a>],
    scalars: &'a [Arg],
) -> Call<'a> {
    Call::new(d, s.c, operands).row(s.n * s.hw).scalars(scalars)
}

/// Plan per-channel mean and biased variance (f32, [c]) over N*H*W.
pub fn plan_batchnorm_stats(
    t: &LaunchTarget,
    x: DevSlice<'_>,
    mean: DevSlice<'_>,
    var: DevSlice<'_>,
    s: &BnShape,
) -> Result<Option<Launch>> {
    let d = x.dtype();
    need_float("batchnorm_stats", d)?;
    need("batchnorm_stats", "x", &x, d, s.numel())?;
    need("batchnorm_stats", "mean", &mean, DType::F32, s.c)?;
    need("batchnorm_stats", "var", &var, DType::F32, s.c)?;
    if s.c == 0 {
        return Ok(None);
    }
    if s.n * s.hw == 0 {
        return Err(CudaError::invalid(
            "batchnorm_stats",
            "statistics over zero elements",
        ));
    }
    BN_STATS.plan(t, &per_channel(d, s, &[x, mean, var], &s.args()))
}

/// Plan y = (x - mean) * invstd * gamma + beta per channel (gamma/beta optional).
#[allow(clippy::too_many_arguments)]
pub fn plan_batchnorm_apply(
    t: &LaunchTarget,
    x: DevSlice<'_>,
    mean: DevSlice<'_>,
    invstd: DevSlice<'_>,
    gamma: Option<DevSlice<'_>>,
    beta: Option<DevSlice<'_>>,
    y: DevSlice<'_>,
    s: &BnShape,
) -> Result<Option<Launch>> {
    let d = x.dtype();
    need_float("batchnorm_apply", d)?;
    need("batchnorm_apply", "x", &x, d, s.numel())?;
    need("batchnorm_apply", "y", &y, d, s.numel())?;
    need("batchnorm_apply", "mean", &mean, DType::F32, s.c)?;
    need("batchnorm_apply", "invstd", &invstd, DType::F32, s.c)?;
    opt_need("batchnorm_apply", "gamma", &gamma, d, s.c)?;
    opt_need("batchnorm_apply", "beta", &beta, d, s.c)?;
    let operands = [x, mean, invstd, y];
    let affine = [Arg::Ptr(ptr_of(&gamma)), Arg::Ptr(ptr_of(&beta))];
    let scalars = [&affine[..], &s.args()].concat();
    BN_APPLY.plan(t, &Call::new(d, s.numel(), &operands).scalars(&scalars))
}

/// Plan per-channel Σ gy and Σ gy * xhat (f32, [c]) for the training-mode backward.
#[allow(clippy::too_many_arguments)]
pub fn plan_batchnorm_backward_reduce(
    t: &LaunchTarget,
    x: DevSlice<'_>,
    gy: DevSlice<'_>,
    mean: DevSlice<'_>,
    invstd: DevSlice<'_>,
    sum_gy: DevSlice<'_>,
    sum_gy_xhat: DevSlice<'_>,
    s: &BnShape,
) -> Result<Option<Launch>> {
    let op = "batchnorm_backward_reduce";
    let d = x.dtype();
    need_float(op, d)?;
    need(op, "x", &x, d, s.numel())?;
    need(op, "gy", &gy, d, s.numel())?;
    for (w, v) in [
        ("mean", &mean),
        ("invstd", &invstd),
        ("sum_gy", &sum_gy),
        ("sum_gy_xhat", &sum_gy_xhat),
    ] {
        need(op, w, v, DType::F32, s.c)?;
    }
    if s.c == 0 {
        return Ok(None);
    }
    let operands = [x, gy, mean, invstd, sum_gy, sum_gy_xhat];
    BN_BWD_REDUCE.plan(t, &per_channel(d, s, &operands, &s.args()))
}

/// Plan the training-mode dx from the reductions.
#[allow(clippy::too_many_arguments)]
pub fn plan_batchnorm_backward_dx(
    t: &LaunchTarget,
    x: DevSlice<'_>,
    gy: DevSlice<'_>,
    mean: DevSlice<'_>,
    invstd: DevSlice<'_>,
    gamma: Option<DevSlice<'_>>,
    sum_gy: DevSlice<'_>,
    sum_gy_xhat: DevSlice<'_>,
    dx: DevSlice<'_>,
    s: &BnShape,
) -> Result<Option<Launch>> {
    let op = "batchnorm_backward_dx";
    let d = x.dtype();
    need_float(op, d)?;
    need(op, "x", &x, d, s.numel())?;
    need(op, "gy", &gy, d, s.numel())?;
    need(op, "dx", &dx, d, s.numel())?;
    opt_need(op, "gamma", &gamma, d, s.c)?;
    for (w, v) in [
        ("mean", &mean),
        ("invstd", &invstd),
        ("sum_gy", &sum_gy),
        ("sum_gy_xhat", &sum_gy_xhat),
    ] {
        need(op, w, v, DType::F32, s.c)?;
    }
    let operands = [x, gy, mean, invstd, sum_gy, sum_gy_xhat, dx];
    let scalars = [&[Arg::Ptr(ptr_of(&gamma))][..], &s.args()].concat();
    BN_BWD_DX.plan(t, &Call::new(d, s.numel(), &operands).scalars(&scalars))
}

/// col = im2col(x).
pub fn im2col(
    dev: &CudaDevice,
    x: DevSlice<'_>,
    col: DevSlice<'_>,
    g: &Window2d,
    img_stride: usize,
) -> Result<()> {
    dev.run_opt(plan_im2col(&dev.target(), x, col, g, img_stride)?)
}
/// x (+)= col2im(col).
pub fn col2im(
    dev: &CudaDevice,
    col: DevSlice<'_>,
    x: DevSlice<'_>,
    g: &Window2d,
    img_stride: usize,
    accumulate: bool,
) -> Result<()> {
    dev.run_opt(plan_col2im(
        &dev.target(),
        col,
        x,
        g,
        img_stride,
        accumulate,
    )?)
}
/// Max pooling forward.
pub fn maxpool2d_forward(
    dev: &CudaDevice,
    x: DevSlice<'_>,
    y: DevSlice<'_>,
    argmax: Option<DevSlice<'_>>,
    g: &Window2d,
) -> Result<()> {
    dev.run_opt(plan_maxpool2d_forward(&dev.target(), x, y, argmax, g)?)
}
/// Max pooling backward.
pub fn maxpool2d_backward(
    dev: &CudaDevice,
    gy: DevSlice<'_>,
    argmax: DevSlice<'_>,
    gx: DevSlice<'_>,
    g: &Window2d,
) -> Result<()> {
    dev.run_opt(plan_maxpool2d_backward(&dev.target(), gy, argmax, gx, g)?)
}
/// Average pooling forward.
pub fn avgpool2d_forward(
    dev: &CudaDevice,
    x: DevSlice<'_>,
    y: DevSlice<'_>,
    g: &Window2d,
    count_include_pad: bool,
) -> Result<()> {
    dev.run_opt(plan_avgpool2d_forward(
        &dev.target(),
        x,
        y,
        g,
        count_include_pad,
    )?)
}
/// Average pooling backward.
pub fn avgpool2d_backward(
    dev: &CudaDevice,
    gy: DevSlice<'_>,
    gx: DevSlice<'_>,
    g: &Window2d,
    count_include_pad: bool,
) -> Result<()> {
    dev.run_opt(plan_avgpool2d_backward(
        &dev.target(),
        gy,
        gx,
        g,
        count_include_pad,
    )?)
}
/// Per-channel mean and biased variance.
pub fn batchnorm_stats(
    dev: &CudaDevice,
    x: DevSlice<'_>,
    mean: DevSlice<'_>,
    var: DevSlice<'_>,
    s: &BnShape,
) -> Result<()> {
    dev.run_opt(plan_batchnorm_stats(&dev.target(), x, mean, var, s)?)
}
/// y = (x - mean) * invstd * gamma + beta.
#[allow(clippy::too_many_arguments)]
pub fn batchnorm_apply(
    dev: &CudaDevice,
    x: DevSlice<'_>,
    mean: DevSlice<'_>,
    invstd: DevSlice<'_>,
    gamma: Option<DevSlice<'_>>,
    beta: Option<DevSlice<'_>>,
    y: DevSlice<'_>,
    s: &BnShape,
) -> Result<()> {
    dev.run_opt(plan_batchnorm_apply(
        &dev.target(),
        x,
        mean,
        invstd,
        gamma,
        beta,
        y,
        s,
    )?)
}
/// Σ gy and Σ gy * xhat per channel.
#[allow(clippy::too_many_arguments)]
pub fn batchnorm_backward_reduce(
    dev: &CudaDevice,
    x: DevSlice<'_>,
    gy: DevSlice<'_>,
    mean: DevSlice<'_>,
    invstd: DevSlice<'_>,
    sum_gy: DevSlice<'_>,
    sum_gy_xhat: DevSlice<'_>,
    s: &BnShape,
) -> Result<()> {
    dev.run_opt(plan_batchnorm_backward_reduce(
        &dev.target(),
        x,
        gy,
        mean,
        invstd,
        sum_gy,
        sum_gy_xhat,
        s,
    )?)
}
/// Training-mode dx.
#[allow(clippy::too_many_arguments)]
pub fn batchnorm_backward_dx(
    dev: &CudaDevice,
    x: DevSlice<'_>,
    gy: DevSlice<'_>,
    mean: DevSlice<'_>,
    invstd: DevSlice<'_>,
    gamma: Option<DevSlice<'_>>,
    sum_gy: DevSlice<'_>,
    sum_gy_xhat: DevSlice<'_>,
    dx: DevSlice<'_>,
    s: &BnShape,
) -> Result<()> {
    dev.run_opt(plan_batchnorm_backward_dx(
        &dev.target(),
        x,
        gy,
        mean,
        invstd,
        gamma,
        sum_gy,
        sum_gy_xhat,
        dx,
        s,
    )?)
}

#[cfg(test)]
mod tests {
    use super::super::fake_slice;
    use super::*;

    #[test]
    fn geometry() {
        let g = Window2d {
            n: 2,
            c: 4,
            h: 5,
            w: 6,
            kernel: (3, 2),
            stride: (2, 1),
            padding: (1, 0),
            dilation: (1, 1),
            ceil_mode: false,
        };
        assert_eq!(g.out_hw().unwrap(), (3, 5));
        assert_eq!(g.col_len().unwrap(), 2 * 4 * 3 * 2 * 3 * 5);
        let m = g.conv_meta(100).unwrap();
        assert_eq!((m.oh, m.ow, m.img_stride), (3, 5, 100));
        assert_eq!(std::mem::size_of::<ConvMeta>(), 120);
        assert_eq!(std::mem::size_of::<PoolMeta>(), 112);
        let bad = Window2d {
            kernel: (2, 2),
            padding: (2, 0),
            ..g
        };
        assert!(bad.pool_meta(false).is_err(), "a window of pure padding");
        assert!(g.pool_meta(false).is_ok());
        // Ceil mode (pooling): 5 rows, kernel 2, stride 2 → 3 windows (floor 2); 3 columns,
        // kernel 2, stride 2, padding 1 → 2 (ceil's third would start in the padding).
        let ceil = Window2d {
            h: 5,
            w: 3,
            kernel: (2, 2),
            stride: (2, 2),
            padding: (0, 1),
            ceil_mode: true,
            ..g
        };
        assert_eq!(ceil.out_hw().unwrap(), (3, 2));
        let m = ceil.pool_meta(true).unwrap();
        assert_eq!((m.oh, m.ow), (3, 2));
        assert_eq!(
            Window2d {
                ceil_mode: false,
                ..ceil
            }
            .out_hw()
            .unwrap(),
            (2, 2)
        );
    }

    #[test]
    fn group_offsets_are_checked() {
        // Group 1 of 2 (channels 2..4 of 4) of a [2, 4, 5, 6] input: pointer at channel 2,
        // img_stride = 4*5*6, view length must reach the last image's group.
        let t = LaunchTarget { sm_count: 4 };
        let g = Window2d {
            n: 2,
            c: 2,
            h: 5,
            w: 6,
            kernel: (3, 3),
            stride: (1, 1),
            padding: (1, 1),
            dilation: (1, 1),
            ceil_mode: false,
        };
        let full = fake_slice(DType::F32, 2 * 4 * 30);
        let group = full.slice(2 * 30, 2 * 4 * 30 - 2 * 30).unwrap();
        let col = fake_slice(DType::F32, g.col_len().unwrap());
        assert!(plan_im2col(&t, group, col, &g, 120).unwrap().is_some());
        let short = full.slice(2 * 30, 100).unwrap();
        assert!(plan_im2col(&t, short, col, &g, 120).is_err());
    }
}
