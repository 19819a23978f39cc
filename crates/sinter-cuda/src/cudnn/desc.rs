//! What a convolution is, apart from who runs it: the problem ([`ConvProblem`]: shapes,
//! parameters, dtype, math modes), the choice among cuDNN's ranked algorithms ([`pick`]) and
//! the passes. cuDNN (`cudnn/mod.rs`) and the emulated device's host convolutions
//! (`emulated::dnn`) both take it; it imports neither.

use cudarc::cudnn::sys as cs;

use crate::dtype::DType;
use crate::error::{CudaError, Result};
use sinter_types::{conv_out_size, Hw};

/// The largest workspace an algorithm may ask for; bigger ones are skipped for the next
/// candidate (the activations of a training step must still fit).
pub const MAX_WORKSPACE: usize = 1 << 30;

/// One convolution: input [n, c, h, w], weight [o, c/groups, kh, kw], per-axis stride, padding
/// and dilation (as `Tensor::conv2d` takes them), in `dtype` with f32 accumulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvProblem {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: Hw,
    pub padding: Hw,
    pub dilation: Hw,
    pub groups: usize,
    pub dtype: DType,
    /// f32 only: let cuDNN use TF32 tensor cores (the precision mode allows it).
    pub allow_tf32: bool,
}

/// Whether a cuDNN call ran, or why cuDNN cannot do it (the caller falls back to im2col).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ran {
    Done,
    Unsupported(String),
}

fn to_i32(op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| CudaError::invalid(op, format!("{what} = {v} exceeds cuDNN's int range")))
}

impl ConvProblem {
    /// Output height and width, or an error when the kernel does not fit.
    pub fn out_hw(&self) -> Result<(usize, usize)> {
        let op = "cudnn conv2d";
        let one = |input: usize, k: usize, s: usize, pd: usize, d: usize, what: &str| {
            conv_out_size(input, k, s, pd, d).ok_or_else(|| {
                CudaError::invalid(
                    op,
                    format!(
                        "a {what} kernel of {k} (dilation {d}, stride {s}) does not fit {input} \
                         (+2x{pd} padding)"
                    ),
                )
            })
        };
        let (s, pd, d) = (self.stride, self.padding, self.dilation);
        Ok((
            one(self.h, self.kh, s.h, pd.h, d.h, "height")?,
            one(self.w, self.kw, s.w, pd.w, d.w, "width")?,
        ))
    }

    /// Checks what cuDNN needs: a float dtype, groups dividing both channel counts, every
    /// dimension in `int` range, strides and dilations of at least 1.
    pub fn validate(&self) -> Result<()> {
        let op = "cudnn conv2d";
        if !self.dtype.is_float() {
            return Err(CudaError::invalid(
                op,
                format!("needs f32, f16 or bf16, got {}", self.dtype),
            ));
        }
        if self.groups == 0 || self.stride.any_zero() || self.dilation.any_zero() {
            return Err(CudaError::invalid(
                op,
                "stride, dilation and groups must be at least 1",
            ));
        }
        if !self.c.is_multiple_of(self.groups) || !self.o.is_multiple_of(self.groups) {
            return Err(CudaError::invalid(
                op,
                format!(
                    "{} groups do not divide {} input / {} output channels",
                    self.groups, self.c, self.o
                ),
            ));
        }
        for (what, v) in [
            ("n", self.n),
            ("c", self.c),
            ("h", self.h),
            ("w", self.w),
            ("o", self.o),
            ("kh", self.kh),
            ("kw", self.kw),
            ("stride h", self.stride.h),
            ("stride w", self.stride.w),
            ("padding h", self.padding.h),
            ("padding w", self.padding.w),
            ("dilation h", self.dilation.h),
            ("dilation w", self.dilation.w),
            ("groups", self.groups),
        ] {
            to_i32(op, what, v)?;
        }
        // cuDNN indexes each tensor with 32-bit ints.
        let (oh, ow) = self.out_hw()?;
        for (what, v) in [
            (
                "input elements",
                self.n.checked_mul(self.c * self.h * self.w),
            ),
            ("output elements", self.n.checked_mul(self.o * oh * ow)),
        ] {
            to_i32(op, what, v.unwrap_or(usize::MAX))?;
        }
        Ok(())
    }

    /// Input descriptor dims [n, c, h, w].
    pub fn x_dims(&self) -> [i32; 4] {
        [self.n, self.c, self.h, self.w].map(|v| v as i32)
    }
    /// Filter descriptor dims [o, c/groups, kh, kw] (cuDNN's grouped-filter layout, same as ours).
    pub fn w_dims(&self) -> [i32; 4] {
        [self.o, self.c / self.groups, self.kh, self.kw].map(|v| v as i32)
    }
    /// Output descriptor dims [n, o, oh, ow].
    pub fn y_dims(&self) -> Result<[i32; 4]> {
        let (oh, ow) = self.out_hw()?;
        Ok([self.n, self.o, oh, ow].map(|v| v as i32))
    }
    /// Element counts of x, w and y.
    pub fn numels(&self) -> Result<(usize, usize, usize)> {
        let (oh, ow) = self.out_hw()?;
        Ok((
            self.n * self.c * self.h * self.w,
            self.o * (self.c / self.groups) * self.kh * self.kw,
            self.n * self.o * oh * ow,
        ))
    }

    /// cuDNN's data type of the tensors.
    pub fn data_type(&self) -> cs::cudnnDataType_t {
        match self.dtype {
            DType::F16 => cs::cudnnDataType_t::CUDNN_DATA_HALF,
            DType::BF16 => cs::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
            _ => cs::cudnnDataType_t::CUDNN_DATA_FLOAT,
        }
    }

    /// The math mode the descriptor starts with (before an algorithm's own is applied): tensor
    /// cores for half types; for f32 `DEFAULT` (which lets cuDNN use TF32) only when allowed,
    /// else `FMA` (plain fp32).
    pub fn initial_math(&self) -> cs::cudnnMathType_t {
        use cs::cudnnMathType_t as M;
        match (self.dtype, self.allow_tf32) {
            (DType::F16 | DType::BF16, _) => M::CUDNN_TENSOR_OP_MATH,
            (_, true) => M::CUDNN_DEFAULT_MATH,
            (_, false) => M::CUDNN_FMA_MATH,
        }
    }

    /// Whether an algorithm's math mode keeps the precision promised: plain fp32 admits `FMA`
    /// and `DEFAULT` (cuDNN reports non-tensor-core algorithms either way; they run with `FMA`
    /// set, see [`exec_math`](Self::exec_math)) but no tensor-op algorithm; TF32 f32 admits
    /// anything but down-conversion to half; half types admit all.
    pub fn math_allowed(&self, m: cs::cudnnMathType_t) -> bool {
        use cs::cudnnMathType_t as M;
        match (self.dtype, self.allow_tf32) {
            (DType::F16 | DType::BF16, _) => true,
            (_, true) => m != M::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
            (_, false) => matches!(m, M::CUDNN_FMA_MATH | M::CUDNN_DEFAULT_MATH),
        }
    }

    /// The math mode set on the descriptor to run an algorithm whose reported mode is `m`:
    /// plain fp32 always runs with `FMA` (with `DEFAULT`, cuDNN would use TF32 on Ampere and
    /// newer); otherwise the algorithm's own mode.
    pub fn exec_math(&self, m: cs::cudnnMathType_t) -> cs::cudnnMathType_t {
        match (self.dtype, self.allow_tf32) {
            (DType::F32, false) => cs::cudnnMathType_t::CUDNN_FMA_MATH,
            _ => m,
        }
    }
}

/// One entry of cuDNN's ranked algorithm list (the common part of the three perf structs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate<A> {
    pub algo: A,
    pub ok: bool,
    pub deterministic: bool,
    pub workspace: usize,
    pub math: cs::cudnnMathType_t,
}

/// The algorithm to use from cuDNN's ranked list: the first (fastest by its heuristics) that
/// succeeded, keeps the precision (`math_allowed`) and fits [`MAX_WORKSPACE`], preferring
/// deterministic ones; None when nothing qualifies (the caller falls back).
pub fn pick<A: Copy>(p: &ConvProblem, ranked: &[Candidate<A>]) -> Option<Candidate<A>> {
    let usable = |c: &&Candidate<A>| c.ok && p.math_allowed(c.math) && c.workspace <= MAX_WORKSPACE;
    ranked
        .iter()
        .filter(usable)
        .find(|c| c.deterministic)
        .or_else(|| ranked.iter().find(usable))
        .copied()
}

/// Which of the three passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    Forward,
    BackwardData,
    BackwardFilter,
}

impl Pass {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Pass::Forward => "cudnnConvolutionForward",
            Pass::BackwardData => "cudnnConvolutionBackwardData",
            Pass::BackwardFilter => "cudnnConvolutionBackwardFilter",
        }
    }
}
