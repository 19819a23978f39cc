//! Softmax and log-softmax over one dimension (`Tensor::softmax`, `Tensor::log_softmax`):
//! everything about the op in this folder.
//!
//! - `mod.rs` (here): the typed ops on the custom-op mechanism (no `BackendStorage` method),
//!   the shape rules (any dimension: others are transposed to the last), the one backward
//!   (from the output: softmax dx = y·(g − Σ y·g), log-softmax dx = g − e^y·Σ g), and
//!   [`reference`], the f64 values every kernel test of every crate checks against.
//! - `cpu.rs`: the CPU rows over sinter-cpu's vectorised row kernels.
//! - `cuda.rs` and `softmax.cu`: the CUDA kernels, their launches and declared traffic.
//! - `tests.rs`: both devices (the emulated one in CI) against [`reference`].
//!
//! Arithmetic is f32 whatever the dtype; outputs and the input gradient are in x's dtype.

mod cpu;
mod cuda;

use std::sync::OnceLock;

use super::{cached, OpCache, FLOATS};
use crate::custom_op::{CustomOp, OutputSpec, TensorMeta};
use crate::layout::resolve_dim;
use crate::storage::Storage;
use crate::tensor::{output, output_of};
use crate::{no_grad, DType, Device, Result, Tensor};
pub use cuda::SOFTMAX_CU;

fn like_first(m: &[TensorMeta]) -> Result<Vec<OutputSpec>> {
    Ok(vec![OutputSpec::new(&m[0].shape, m[0].dtype)])
}

/// x → softmax(x) (or log_softmax) over the last dimension.
fn forward_op(dtype: DType, log: bool) -> Result<CustomOp> {
    static OPS: OpCache<(DType, bool)> = OnceLock::new();
    cached(&OPS, (dtype, log), || {
        CustomOp::builder(name(log))
            .inputs(1)
            .dtypes(&FLOATS)
            .outputs(like_first)
            .cpu(move |x| cpu::forward(x, log))
            .cuda(cuda::forward_kernel(dtype, log)?)
            .build()
    })
}

/// (y, gy) → gx over the last dimension, in y's dtype.
fn backward_op(dtype: DType, log: bool) -> Result<CustomOp> {
    static OPS: OpCache<(DType, bool)> = OnceLock::new();
    cached(&OPS, (dtype, log), || {
        CustomOp::builder(if log {
            "log_softmax_backward"
        } else {
            "softmax_backward"
        })
        .inputs(2)
        .dtypes(&FLOATS)
        .outputs(like_first)
        .cpu(move |x| cpu::backward(x, log))
        .cuda(cuda::backward_kernel(dtype, log)?)
        .build()
    })
}

fn name(log: bool) -> &'static str {
    if log {
        "log_softmax"
    } else {
        "softmax"
    }
}

/// The one backward rule: gx from the output `y` and its gradient `g` (on CUDA read in y's
/// dtype; the CPU reads every float dtype as f32 itself).
fn grad(y: &Tensor, g: &Tensor, log: bool) -> Result<Tensor> {
    let g = match y.device() {
        Device::Cpu => g.detach(),
        _ if g.dtype() != y.dtype() => g.detach().to_dtype(y.dtype())?,
        _ => g.detach(),
    };
    let gx = backward_op(y.dtype(), log)?.apply(&[&y.detach(), &g])?;
    Ok(gx.into_iter().next().expect("one output"))
}

/// Softmax (or log-softmax when `log`) of `x` over dimension `dim` (negative counts from the
/// end), differentiable; an empty `x` gives an empty result, as in PyTorch.
pub fn softmax(x: &Tensor, dim: isize, log: bool) -> Result<Tensor> {
    let d = resolve_dim("softmax", dim, x.rank())?;
    let last = x.rank() - 1;
    if d != last {
        return softmax(&x.transpose(d as isize, last as isize)?, -1, log)?
            .transpose(d as isize, last as isize);
    }
    x.float_op(name(log))?;
    if x.numel() == 0 {
        // Nothing to normalise (and no kernel to launch): an empty result of the same shape.
        let s = Storage::alloc(x.device(), 0, x.dtype())?;
        return Ok(output(s, x.shape(), name(log), &[x], |g, _| {
            Ok(vec![Some(g.clone())])
        }));
    }
    let y = {
        let _g = no_grad();
        let out = forward_op(x.dtype(), log)?.apply(&[&x.detach()])?;
        out.into_iter().next().expect("one output")
    };
    Ok(output_of(&y, name(log), &[x], move |g, y| {
        Ok(vec![Some(grad(y, g, log)?)])
    }))
}

/// Softmax in f64 over row-major rows of n, written from its definition (log-sum-exp
/// l = max + ln Σ e^(x − max); softmax e^(x − l), log-softmax x − l): the one reference of the
/// op's kernel tests in every crate.
pub mod reference {
    /// ln Σ e^x of a row (−∞ for a row of −∞, NaN for one holding a NaN).
    pub fn log_sum_exp(row: &[f64]) -> f64 {
        if row.iter().any(|v| v.is_nan()) {
            return f64::NAN;
        }
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            return m;
        }
        m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
    }

    /// softmax (or log_softmax when `log`) of each row of n.
    pub fn forward(x: &[f64], n: usize, log: bool) -> Vec<f64> {
        let mut y = Vec::with_capacity(x.len());
        for row in x.chunks(n.max(1)) {
            let l = log_sum_exp(row);
            y.extend(row.iter().map(|v| if log { v - l } else { (v - l).exp() }));
        }
        y
    }

    /// dx of Σ gy·y from the output y of [`forward`]: y·(gy − Σ y·gy), or for log-softmax
    /// gy − e^y·Σ gy.
    pub fn backward(y: &[f64], gy: &[f64], n: usize, log: bool) -> Vec<f64> {
        let mut dx = Vec::with_capacity(y.len());
        for (yr, gr) in y.chunks(n.max(1)).zip(gy.chunks(n.max(1))) {
            if log {
                let s: f64 = gr.iter().sum();
                dx.extend(yr.iter().zip(gr).map(|(y, g)| g - y.exp() * s));
            } else {
                let s: f64 = yr.iter().zip(gr).map(|(y, g)| y * g).sum();
                dx.extend(yr.iter().zip(gr).map(|(y, g)| y * (g - s)));
            }
        }
        dx
    }
}

#[cfg(test)]
mod tests;
