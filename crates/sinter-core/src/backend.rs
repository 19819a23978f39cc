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
//!   updates one in place, for the optimizer and step-control primitives).
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
//! | reductions | `reduce` (sum, max, min, argmax over one dim), `sum_squares` (the global gradient norm) |
//! | products | `matmul` (batched, strided, broadcast batch), `linear_bias_gelu` (GEMM with bias + GELU epilogue) |
//! | convolution | `conv2d`, `conv2d_backward_data`, `conv2d_backward_filter`, max / avg pool forward and backward |
//! | rows | `softmax` / log-softmax and backward, `layer_norm` and backward, `residual_layer_norm`, `cross_entropy` and backward, `bias_gelu` and backward |
//! | indexing | `index_select`, `index_select_backward` (scatter-add into zeros), `index_add` |
//! | random | `dropout`, `dropout_backward` |
//! | attention | `attention` (flash, forward), `attention_backward` |
//! | optimizer | `adamw_step`, `sgd_step`, `step_prepare`, `step_finish` (the step control block) |
//!
//! Some primitives are fast paths a backend may decline by returning `Ok(None)`
//! (`linear_bias_gelu`, `bias_gelu`, `attention`): the op above the seam then runs its
//! composite of other ops, with the same values and gradients. The CPU declines the GEMM
//! epilogue; CUDA declines fused bias + GELU without a GEMM, and flash attention outside f16/bf16
//! with head dim 64 or 128.
//!
//! Adding a backend: implement both traits for its storage and device, add a variant to
//! `Storage` and `Device`, and a match arm to each `Storage` method. Adding an op: if it is a
//! composite of existing ops, write it above the seam (it is differentiable for free); if it
//! needs its own kernel, add a primitive here (forward, and backward when the backward is not a
//! composite), implement it for each backend, add its `Storage` method, and write the op and
//! its backward rule once, above the seam.

use crate::cpu::CpuStorage;
use crate::op::{BinaryOp, ReduceOp, UnaryOp};
use crate::{DType, Device, Layout, Result};

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
    /// a op b, both of one dtype, layouts broadcast to the output shape. Comparisons give 1/0
    /// in that dtype; i64 arithmetic wraps.
    fn binary(&self, l: &Layout, rhs: &Self, rl: &Layout, op: BinaryOp) -> Result<Self>;
    /// `self` is the condition: cond != 0 ? a : b, all layouts broadcast to the output shape,
    /// a and b of one dtype (the condition of any).
    fn where_cond(&self, l: &Layout, a: &Self, al: &Layout, b: &Self, bl: &Layout) -> Result<Self>;

    // -- reductions ------------------------------------------------------------------------

    /// Reduces dimension `dim` of `l` (kept as size 1). ArgMax gives i64; the others keep the
    /// dtype. Only `Sum` accepts an empty dimension (giving zeros).
    fn reduce(&self, l: &Layout, dim: usize, op: ReduceOp) -> Result<Self>;
}
