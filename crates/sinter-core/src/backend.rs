//! The backend seam: the storage-level primitives every device implements.
//!
//! A backend stores a tensor's elements and computes on them; it never sees a `Tensor`, a
//! gradient or an autograd node. Two traits describe it:
//!
//! - [`BackendDevice`]: where storages are made (allocation, fills, `arange`, uploads).
//! - [`BackendStorage`]: the primitives over storages. Each takes its operands as
//!   (storage, [`Layout`]) pairs, the layout giving shape, strides and offset (views are
//!   layouts; broadcast operands arrive with their layouts already broadcast to the output
//!   shape, stride 0 on the repeated dimensions), and returns a fresh contiguous storage (or
//!   updates one in place, for `assign` and `index_add`).
//!
//! Implementations: `cpu::CpuStorage` (host vectors; each primitive is a thin call into the
//! slice kernels of `cpu/`) and `cuda::CudaStorage` (device buffers; each primitive launches
//! sinter-cuda's kernels, cuBLASLt or cuDNN). `storage::Storage`, the enum of the two, is the
//! one place that matches on the device: once per primitive, and a mismatch of devices between
//! operands is an `Error::DeviceMismatch` there.
//!
//! Above the seam, `Tensor` and its ops (`tensor.rs`, `ops.rs`, `nn_ops.rs`, `fused/`) validate
//! shapes and dtypes, call one primitive for the forward pass, and record one autograd node whose
//! backward rule is written in primitives and tensor ops. So every backward rule exists once and
//! runs on every backend.
//!
//! The primitives:
//!
//! | family | primitives |
//! | --- | --- |
//! | data movement | `to_cpu`, `copy_strided`, `cast`, `assign` (strided write, casting), `promote_to_permanent` |
//! | elementwise | `unary`, `unary_backward`, `binary`, `where_cond` |
//! | reductions | `reduce` (sum, max, min, argmax over one dim; the global gradient norm is a kernel: `kernels/optimizer/grad_norm.rs`) |
//! | products | `matmul` (batched, strided, broadcast batch), `linear` (GEMM with a bias epilogue), `linear_bias_gelu` (GEMM with bias + GELU epilogue) |
//! | convolution | `conv2d`, `conv2d_backward_data`, `conv2d_backward_filter`, max / avg pool forward and backward |
//! | indexing | `index_select`, `index_select_backward` (scatter-add into zeros), `index_add` |
//! | random | `dropout`, `dropout_backward` |
//! | custom ops | `custom_forward` (`custom_op::seam`: a user's CPU closure or NVRTC kernel; None = no forward for this device) |
//!
//! Some primitives are fast paths a backend may decline by returning `Ok(None)`
//! (`linear`, `linear_bias_gelu`, `bias_gelu`): the op above the seam then runs its composite of other ops, with the
//! same values and gradients. The CPU declines the GEMM epilogues outside f32; CUDA declines
//! fused bias + GELU without a GEMM.
//! Attention and conv2d + bias + ReLU are no primitives: `kernels/attention/`,
//! `kernels/conv_bias_relu/`.
//!
//! Adding a backend: implement both traits for its storage and device, add a variant to
//! `Storage` and `Device`, and a match arm to each `Storage` method. Adding an op: if it is a
//! composite of existing ops, write it above the seam (it is differentiable for free); if it
//! needs its own kernel, add a primitive here (forward, and backward when the backward is not a
//! composite), implement it for each backend, add its `Storage` method, and write the op and
//! its backward rule once, above the seam.

use crate::cpu::CpuStorage;

use crate::op::{BinaryOp, ReduceOp, UnaryOp};
use crate::{DType, Device, Error, Layout, Result, Rng};
use sinter_types::{conv_out_size, Hw};

// ---- the parameters of the primitives ----------------------------------------------------------

/// A convolution's stride, zero padding and dilation (per axis, PyTorch's `(h, w)` order;
/// `Hw::from(2)` is the square 2) and its number of channel groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dParams {
    pub stride: Hw,
    pub padding: Hw,
    pub dilation: Hw,
    pub groups: usize,
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Conv2dParams {
            stride: Hw::square(1),
            padding: Hw::square(0),
            dilation: Hw::square(1),
            groups: 1,
        }
    }
}

impl Conv2dParams {
    /// The square geometry of the common case.
    pub const fn square(stride: usize, padding: usize, dilation: usize, groups: usize) -> Self {
        Conv2dParams {
            stride: Hw::square(stride),
            padding: Hw::square(padding),
            dilation: Hw::square(dilation),
            groups,
        }
    }
}

/// Geometry of one convolution: input [n, c, h, w], weight [o, c/groups, kh, kw], output
/// [n, o, oh, ow].
#[derive(Clone, Copy, Debug)]
pub struct ConvGeom {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub kh: usize,
    pub kw: usize,
    pub oh: usize,
    pub ow: usize,
    pub p: Conv2dParams,
}

impl ConvGeom {
    /// The output (height, width) of a kh×kw kernel over an h×w input, if the (dilated)
    /// kernel fits the padded input along both axes.
    pub fn out_hw(
        h: usize,
        w: usize,
        kh: usize,
        kw: usize,
        p: &Conv2dParams,
    ) -> Option<(usize, usize)> {
        let (s, pd, d) = (p.stride, p.padding, p.dilation);
        Some((
            conv_out_size(h, kh, s.h, pd.h, d.h)?,
            conv_out_size(w, kw, s.w, pd.w, d.w)?,
        ))
    }
    /// Input channels per group.
    pub fn cg(&self) -> usize {
        self.c / self.p.groups
    }
    /// Output channels per group.
    pub fn og(&self) -> usize {
        self.o / self.p.groups
    }
    /// Rows of one group's column matrix: cg · kh · kw.
    pub fn ckk(&self) -> usize {
        self.cg() * self.kh * self.kw
    }
    /// Output pixels per image: oh · ow.
    pub fn l(&self) -> usize {
        self.oh * self.ow
    }
}

/// A 2-D pooling's window (PyTorch's `MaxPool2d` / `AvgPool2d` arguments, per axis).
/// `ceil_mode`: round the output size up, keeping a last partial window that starts inside the
/// input or its left padding. `count_include_pad` (average pooling only): padding counts in
/// the divisor. Max pooling's padding is −∞ (never wins); average pooling takes no dilation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2dParams {
    pub kernel: Hw,
    pub stride: Hw,
    pub padding: Hw,
    pub dilation: Hw,
    pub ceil_mode: bool,
    pub count_include_pad: bool,
}

impl Pool2dParams {
    /// PyTorch's defaults for a kernel: stride = kernel, no padding, dilation 1, floor mode,
    /// padding counted in averages.
    pub fn new(kernel: impl Into<Hw>) -> Self {
        let kernel = kernel.into();
        Pool2dParams {
            kernel,
            stride: kernel,
            padding: Hw::square(0),
            dilation: Hw::square(1),
            ceil_mode: false,
            count_include_pad: true,
        }
    }
    /// A square kernel, stride and padding (floor mode, dilation 1).
    pub const fn square(kernel: usize, stride: usize, padding: usize) -> Self {
        Pool2dParams {
            kernel: Hw::square(kernel),
            stride: Hw::square(stride),
            padding: Hw::square(padding),
            dilation: Hw::square(1),
            ceil_mode: false,
            count_include_pad: true,
        }
    }
}

/// Geometry of one 2-D pooling: input [n, c, h, w], output [n, c, oh, ow].
#[derive(Clone, Copy, Debug)]
pub struct PoolGeom {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub oh: usize,
    pub ow: usize,
    pub p: Pool2dParams,
}

impl PoolGeom {
    /// Image planes: n · c.
    pub fn planes(&self) -> usize {
        self.n * self.c
    }
}

/// AdamW's hyper-parameters, f64 like PyTorch's Python floats; the step's arithmetic is
/// PyTorch's, the shared rule of `sinter_types::AdamW` (also the CUDA kernel's).
pub use sinter_types::AdamW as AdamWParams;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdParams {
    pub lr: f32,
    pub momentum: f32,
    pub nesterov: bool,
    pub weight_decay: f32,
}

/// A tensor viewed as [outer, n, inner], indexed along the middle dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexGeom {
    pub outer: usize,
    pub n: usize,
    pub inner: usize,
}

impl IndexGeom {
    /// `shape` split around dimension `dim`.
    pub fn around(shape: &[usize], dim: usize) -> IndexGeom {
        IndexGeom {
            outer: shape[..dim].iter().product(),
            n: shape[dim],
            inner: shape[dim + 1..].iter().product(),
        }
    }
}

/// Which op reads a set of indices (named in the error for a bad one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexUse {
    /// Cross-entropy targets (class indices, or the ignore index).
    CrossEntropy = 1,
    IndexSelect = 2,
    IndexAdd = 3,
}

impl IndexUse {
    pub fn name(self) -> &'static str {
        match self {
            IndexUse::CrossEntropy => "cross_entropy",
            IndexUse::IndexSelect => "index_select",
            IndexUse::IndexAdd => "index_add",
        }
    }
    pub fn from_code(c: i64) -> Option<IndexUse> {
        match c {
            1 => Some(IndexUse::CrossEntropy),
            2 => Some(IndexUse::IndexSelect),
            3 => Some(IndexUse::IndexAdd),
            _ => None,
        }
    }
}

/// The refusals of [`BackendStorage::where_cond`], the same words on every backend: the
/// condition must be bool (a number is not read as non-zero here: the caller converts, as
/// `Tensor::where_cond` makes its callers do) and a, b of one dtype (the caller promotes).
pub fn check_where(cond: DType, a: DType, b: DType) -> Result<()> {
    if cond != DType::Bool {
        return Err(Error::Msg(format!(
            "where: the condition must be bool, got {cond}; compare it first or convert it with to_dtype(DType::Bool) (non-zero is true)"
        )));
    }
    if a != b {
        return Err(Error::Msg(format!(
            "where: the two value operands must have one dtype, got {a} and {b}; convert one first (Tensor::where_cond promotes them)"
        )));
    }
    Ok(())
}

/// The dtype [`BackendStorage::reduce`] gives for `op` over `dtype`: i64 for an index and for
/// the count of bools (PyTorch's `sum` of `torch.bool`), else the input's.
pub fn reduced_dtype(op: ReduceOp, dtype: DType) -> DType {
    match (op, dtype) {
        (ReduceOp::ArgMax, _) | (ReduceOp::Sum, DType::Bool) => DType::I64,
        _ => dtype,
    }
}

/// Ok when every index is in 0..bound (or equals `ignore`), else an error naming the op, the
/// first bad value and its position (the same words on every backend).
pub fn check_indices(ids: &[i64], bound: usize, ignore: Option<i64>, what: IndexUse) -> Result<()> {
    let bad = ids
        .iter()
        .enumerate()
        .find(|(_, &v)| Some(v) != ignore && (v < 0 || v as usize >= bound));
    let Some((i, &v)) = bad else {
        return Ok(());
    };
    Err(Error::Msg(match what {
        IndexUse::CrossEntropy => format!(
            "cross_entropy: target {v} at position {i} is not a class index in 0..{bound} (nor the ignore index {})",
            ignore.unwrap_or(-100)
        ),
        _ => format!(
            "{}: index {v} at position {i} is outside 0..{bound}",
            what.name()
        ),
    }))
}

/// Indices handed to a primitive, and whether it must still check them. Indices that came
/// from another device were read and checked on the host before they were moved (an immediate
/// error); indices that live where the data does are checked by the backend (the CPU at once,
/// CUDA on the device, reported at the next read of device values).
#[derive(Clone, Copy, Debug)]
pub struct Indices<'a, S> {
    pub ids: &'a S,
    pub layout: &'a Layout,
    pub what: IndexUse,
    pub checked: bool,
}

impl<'a, S> Indices<'a, S> {
    /// The same indices held as `ids` (another view of the same values).
    pub fn with<'b, T>(&self, ids: &'b T) -> Indices<'b, T>
    where
        'a: 'b,
    {
        Indices {
            ids,
            layout: self.layout,
            what: self.what,
            checked: self.checked,
        }
    }
}

/// What a dropout forward leaves for its backward: the scaled keep-mask itself (0 or 1/(1 − p)
/// per element, drawn element by element from the caller's `Rng`), or the seed of a
/// counter-based generator from which the backward regenerates the same mask.
#[derive(Clone, Debug)]
pub enum DropoutMask<S> {
    Stored(S),
    Seed(u64),
}

impl<S> DropoutMask<S> {
    pub fn map<T>(self, f: impl FnOnce(S) -> T) -> DropoutMask<T> {
        match self {
            DropoutMask::Stored(s) => DropoutMask::Stored(f(s)),
            DropoutMask::Seed(s) => DropoutMask::Seed(s),
        }
    }
    pub fn as_ref(&self) -> DropoutMask<&S> {
        match self {
            DropoutMask::Stored(s) => DropoutMask::Stored(s),
            DropoutMask::Seed(s) => DropoutMask::Seed(*s),
        }
    }
}

// ---- the traits ----------------------------------------------------------------------------------

/// Where a backend's storages are made.
pub trait BackendDevice {
    type Storage: BackendStorage;
    /// The device this is, as tensors name it.
    fn location(&self) -> Device;
    /// `n` elements whose values the caller overwrites before reading (zeros on the CPU).
    fn alloc(&self, n: usize, dtype: DType) -> Result<Self::Storage>;
    fn zeros(&self, n: usize, dtype: DType) -> Result<Self::Storage>;
    fn full(&self, n: usize, value: f64, dtype: DType) -> Result<Self::Storage>;
    /// start + i · step for i in 0..n, computed in f64 and cast to `dtype`.
    fn arange(&self, start: f64, step: f64, n: usize, dtype: DType) -> Result<Self::Storage>;
    /// A copy of host data.
    fn upload(&self, host: &CpuStorage) -> Result<Self::Storage>;
}

/// The storage-level primitives (see the module docs). Every output is a fresh contiguous
/// storage unless the primitive says it updates `self` in place. Float math runs in f32 and
/// rounds once to f16/bf16; a dtype a primitive cannot handle is an
/// `Error::UnsupportedDType` naming it.
#[allow(clippy::too_many_arguments)]
pub trait BackendStorage: Sized + Clone + Send + Sync + std::fmt::Debug {
    fn dtype(&self) -> DType;
    /// Elements held.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn device(&self) -> Device;

    // -- data movement ---------------------------------------------------------------------

    /// The elements `l` addresses, row-major, in host memory.
    fn to_cpu(&self, l: &Layout) -> Result<CpuStorage>;
    /// A contiguous copy of the elements `l` addresses.
    fn copy_strided(&self, l: &Layout) -> Result<Self>;
    /// The elements `l` addresses, converted to `dtype` (contiguous).
    fn cast(&self, l: &Layout, dtype: DType) -> Result<Self>;
    /// In place: the elements of `self` that `dst_l` addresses = `src`'s (same shape), cast to
    /// `self`'s dtype. `src` never shares memory with `self` (the caller copies it first).
    fn assign(&mut self, dst_l: &Layout, src: &Self, src_l: &Layout) -> Result<()>;
    /// Moves the data into memory meant for the whole run (parameters, optimizer state),
    /// where a backend keeps one; a no-op elsewhere.
    fn promote_to_permanent(&mut self) -> Result<()>;

    // -- elementwise -----------------------------------------------------------------------

    /// op(x) for a float x.
    fn unary(&self, l: &Layout, op: UnaryOp) -> Result<Self>;
    /// `self` is grad_out; returns grad_out · f'(x), from x and y = f(x) (one shape), in
    /// grad_out's dtype.
    fn unary_backward(
        &self,
        l: &Layout,
        op: UnaryOp,
        x: &Self,
        xl: &Layout,
        y: &Self,
        yl: &Layout,
    ) -> Result<Self>;
    /// a op b, both of one dtype, layouts broadcast to the output shape. Comparisons give
    /// `DType::Bool`; i64 arithmetic wraps; two bools combine as `BinaryOp::apply_bool` says.
    fn binary(&self, l: &Layout, rhs: &Self, rl: &Layout, op: BinaryOp) -> Result<Self>;
    /// `self` is the (bool) condition: cond ? a : b, all layouts broadcast to the output shape,
    /// a and b of one dtype (any tensor dtype), whose elements are moved unconverted. Another
    /// condition dtype, or a and b of two dtypes, is an error ([`check_where`]).
    fn where_cond(&self, l: &Layout, a: &Self, al: &Layout, b: &Self, bl: &Layout) -> Result<Self>;

    // -- reductions ------------------------------------------------------------------------

    /// Reduces dimension `dim` of `l` (kept as size 1), into [`reduced_dtype`]: ArgMax gives
    /// i64; bools reduce as PyTorch's do, read directly (`Sum` counts the true values into i64,
    /// `Max` is any, `Min` all, `ArgMax` the first true); the others keep the dtype. Only `Sum`
    /// accepts an empty dimension (giving zeros).
    fn reduce(&self, l: &Layout, dim: usize, op: ReduceOp) -> Result<Self>;

    // -- products --------------------------------------------------------------------------

    /// [batch.., m, k] · [batch.., k, n] → [batch.., m, n] (float; layouts already broadcast
    /// over the batch dimensions).
    fn matmul(&self, l: &Layout, rhs: &Self, rl: &Layout) -> Result<Self>;
    /// x Wᵀ (+ b) for x [rows, in] (a view), W [out, in], b [out], as one GEMM that adds the
    /// bias as it stores its output: Some(y [rows, out]), or None where the backend has no
    /// such epilogue for these operands (the op then runs matmul and add).
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        _l: &Layout,
        _w: &Self,
        _wl: &Layout,
        _bias: Option<(&Self, &Layout)>,
        _rows: usize,
        _inp: usize,
        _out: usize,
    ) -> Result<Option<Self>> {
        Ok(None)
    }
    // -- convolution and pooling ---------------------------------------------------------------

    /// conv2d of x with weight w (used in x's dtype); output [n, o, oh, ow] in x's dtype.
    fn conv2d(&self, l: &Layout, w: &Self, wl: &Layout, g: &ConvGeom) -> Result<Self>;
    /// `self` is grad_out [n, o, oh, ow]: the input gradient, in grad_out's dtype.
    fn conv2d_backward_data(&self, l: &Layout, w: &Self, wl: &Layout, g: &ConvGeom)
        -> Result<Self>;
    /// `self` is grad_out: the weight gradient [o, c/groups, kh, kw], in grad_out's dtype.
    fn conv2d_backward_filter(
        &self,
        l: &Layout,
        x: &Self,
        xl: &Layout,
        g: &ConvGeom,
    ) -> Result<Self>;
    /// Max pooling: (output, each output's argmax as the backend records it, i64).
    fn max_pool2d(&self, l: &Layout, g: &PoolGeom) -> Result<(Self, Self)>;
    /// Max pooling's output alone, for inference (no argmax kept for a backward pass); a
    /// backend without a cheaper form drops the argmax of [`Backend::max_pool2d`].
    fn max_pool2d_values(&self, l: &Layout, g: &PoolGeom) -> Result<Self> {
        Ok(self.max_pool2d(l, g)?.0)
    }
    /// `self` is grad_out: routes each output's gradient to its recorded argmax.
    fn max_pool2d_backward(&self, l: &Layout, argmax: &Self, g: &PoolGeom) -> Result<Self>;
    /// Average pooling; padding counts as zeros in the average.
    fn avg_pool2d(&self, l: &Layout, g: &PoolGeom) -> Result<Self>;
    fn avg_pool2d_backward(&self, l: &Layout, g: &PoolGeom) -> Result<Self>;

    // -- indexing --------------------------------------------------------------------------

    /// out[o, j, i] = x[o, ids[j], i] for x viewed as `g`.
    fn index_select(&self, l: &Layout, ids: Indices<'_, Self>, g: IndexGeom) -> Result<Self>;
    /// `self` is grad_out [outer, k, inner]: the scatter-add of it into zeros viewed as `g`
    /// (index_select's backward), deterministic.
    fn index_select_backward(
        &self,
        l: &Layout,
        ids: Indices<'_, Self>,
        g: IndexGeom,
    ) -> Result<Self>;
    /// A copy of `self` (viewed as `g`) with `src` rows added at `ids`.
    fn index_add(
        &self,
        l: &Layout,
        ids: Indices<'_, Self>,
        src: &Self,
        srcl: &Layout,
        g: IndexGeom,
    ) -> Result<Self>;

    // -- random ----------------------------------------------------------------------------

    /// Inverted dropout of a float x with probability p in (0, 1): each element zeroed with
    /// probability p, the rest scaled by 1/(1 − p). Draws from `rng`.
    fn dropout(&self, l: &Layout, p: f32, rng: &mut Rng) -> Result<(Self, DropoutMask<Self>)>;
    /// `self` is grad_out: grad_out times the forward's scaled mask.
    fn dropout_backward(&self, l: &Layout, p: f32, mask: DropoutMask<&Self>) -> Result<Self>;
}
