//! Bias add + GELU (tanh approximation, GPT-2's) in one pass, alone (`fused::bias_gelu`) and
//! fused into the preceding Linear's GEMM (`fused::linear_bias_gelu`): everything about the op
//! in this folder.
//!
//! - `mod.rs` (here): the typed ops on the custom-op mechanism (no `BackendStorage` method),
//!   shape checks, the backward rules, the composites [`bias_gelu_reference`] and
//!   [`linear_bias_gelu_reference`], and [`reference`], the f64 values every kernel test of
//!   every crate checks against.
//! - `cpu.rs`: the CPU rows over sinter-cpu's bias-activation kernels, and the f32 epilogue
//!   GEMM; `cuda.rs`: the cuBLASLt epilogue GEMM (alone, the op is the composite on CUDA).
//! - `tests.rs`: both devices (the emulated one in CI) against [`reference`].
//!
//! Why it is fast: the composite `x.add(bias)?.gelu()` writes the pre-activation to memory
//! and reads it back, and keeps both x and x + bias alive for the backward; here each element
//! is biased and activated in registers (one read, one write, half the saved activations: the
//! backward re-derives x + bias from x), and the backward produces dx and the bias gradient
//! together. Values are bit-identical to the composite's. Linear + bias + GELU stores the
//! pre-activation u = x Wᵀ + b from the GEMM's epilogue, which is all its backward needs:
//! du = dy ∘ gelu'(u), db = Σ_rows du, dx = du W and dW = duᵀ x.

mod cpu;
mod cuda;

use std::sync::OnceLock;

use super::{cached, OpCache};
use crate::custom_op::{CustomOp, OutputSpec};
use crate::fused::float_input;
use crate::fused::linear::check;
use crate::op::UnaryOp;
use crate::tensor::output_of;
use crate::{no_grad, DType, Device, Error, Result, Tensor};

const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// (x, bias) → gelu(x + bias), on the CPU.
fn forward_op() -> Result<CustomOp> {
    static OPS: OpCache<()> = OnceLock::new();
    cached(&OPS, (), || {
        CustomOp::builder("bias_gelu")
            .inputs(2)
            .dtypes(&FLOATS)
            .outputs(|m| Ok(vec![OutputSpec::new(&m[0].shape, m[0].dtype)]))
            .cpu(cpu::forward)
            .build()
    })
}

/// (gy, x, bias) → (dx, dbias), on the CPU.
fn backward_op() -> Result<CustomOp> {
    static OPS: OpCache<()> = OnceLock::new();
    cached(&OPS, (), || {
        CustomOp::builder("bias_gelu_backward")
            .inputs(3)
            .dtypes(&FLOATS)
            .outputs(|m| {
                Ok(vec![
                    OutputSpec::new(&m[1].shape, m[1].dtype),
                    OutputSpec::new(&m[2].shape, m[2].dtype),
                ])
            })
            .cpu(cpu::backward)
            .build()
    })
}

/// gelu(x + bias) with `bias` broadcast over the last dimension; differentiable in both.
pub fn bias_gelu(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    float_input("bias_gelu", x)?;
    let n = *x
        .shape()
        .last()
        .ok_or_else(|| Error::Msg("bias_gelu: input is a scalar".into()))?;
    if bias.shape() != [n] {
        return Err(Error::ShapeMismatch {
            op: "bias_gelu",
            lhs: x.shape().to_vec(),
            rhs: bias.shape().to_vec(),
        });
    }
    if let Some((x, bias)) = crate::amp::promote_operands(x, bias)? {
        // Mixed floats (an autocast product and an f32 bias) promote as `x + bias` would.
        return bias_gelu(&x, &bias);
    }
    if x.dtype() != bias.dtype() {
        return Err(Error::DTypeMismatch {
            op: "bias_gelu",
            expected: x.dtype(),
            got: bias.dtype(),
        });
    }
    if x.device() != Device::Cpu || bias.device() != Device::Cpu {
        // CUDA fuses bias + GELU into the GEMM before it (`linear_bias_gelu`); alone it runs
        // as the composite (which also reports operands on two devices).
        return bias_gelu_reference(x, bias);
    }
    let y = {
        let _g = no_grad();
        let out = forward_op()?.apply(&[&x.detach(), &bias.detach()])?;
        out.into_iter().next().expect("one output")
    };
    let (xt, bt) = (x.detach(), bias.clone());
    Ok(output_of(&y, "bias_gelu", &[x, bias], move |g, _| {
        let mut d = backward_op()?
            .apply(&[&g.detach(), &xt, &bt.detach()])?
            .into_iter();
        let (dx, db) = (d.next(), d.next());
        Ok(vec![dx, db.filter(|_| bt.tracks_grad())])
    }))
}

/// The composite reference: `x.add(bias)?.gelu()`.
pub fn bias_gelu_reference(x: &Tensor, bias: &Tensor) -> Result<Tensor> {
    x.add(bias)?.gelu()
}

/// gelu(x Wᵀ + b) over the last dimension of x, differentiable in x, w and b: one GEMM with
/// a bias + GELU epilogue where the device has one for these operands, else the matmul and
/// then the fused [`bias_gelu`].
pub fn linear_bias_gelu(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    // Under autocast the whole layer runs in the region's dtype (PyTorch casts a Linear's
    // input, weight and bias alike), so the fused half-precision kernel applies.
    if let Some(c) = crate::amp::autocast_inputs(&[x, w, b])? {
        return linear_bias_gelu(&c[0], &c[1], &c[2]);
    }
    let (rows, inp, out) = check("linear_bias_gelu", x, w, Some(b))?;
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank checked") = out;
    let dims = (rows, inp, out);
    let fused = match x.device() {
        Device::Cpu => cpu::linear_bias_gelu((x, w, b), dims)?,
        _ => cuda::linear_bias_gelu((x, w, b), dims)?,
    };
    let Some((y, pre)) = fused else {
        return bias_gelu(&x.reshape(&[rows, inp])?.matmul(&w.t()?)?, b)?.reshape(&shape);
    };
    let (xt, wt, bt) = (x.clone(), w.clone(), b.clone());
    let y = output_of(&y, "linear_bias_gelu", &[x, w, b], move |g, _| {
        let (du, db) = gelu_grad_and_sum(g, &pre, bt.tracks_grad())?;
        let dx = xt
            .tracks_grad()
            .then(|| du.matmul(&wt)?.reshape(xt.shape()))
            .transpose()?;
        let dw = wt
            .tracks_grad()
            .then(|| du.t()?.matmul(&xt.reshape(&[rows, inp])?))
            .transpose()?;
        Ok(vec![dx, dw, db])
    });
    y.reshape(&shape)
}

/// du = g ∘ gelu'(pre) and, when `with_sum`, its column sums (the bias gradient): on the CPU
/// in one pass (the bias-GELU backward rows with a zero bias, so the sums come from the
/// values in registers instead of a second read of du), elsewhere the unary backward and a
/// reduction.
fn gelu_grad_and_sum(g: &Tensor, pre: &Tensor, with_sum: bool) -> Result<(Tensor, Option<Tensor>)> {
    let out = *pre.shape().last().expect("a [rows, out] pre-activation");
    if with_sum && pre.device() == Device::Cpu && g.device() == Device::Cpu {
        let zero = Tensor::zeros(&[out], pre.dtype(), Device::Cpu)?;
        let mut d = backward_op()?
            .apply(&[&g.detach(), pre, &zero])?
            .into_iter();
        let (du, db) = (d.next().expect("dx"), d.next().expect("dbias"));
        return Ok((du, Some(db)));
    }
    let du = Tensor::unary_backward(UnaryOp::GeluTanh, pre, pre, g)?;
    let db = with_sum.then(|| du.sum_to_shape(&[out])).transpose()?;
    Ok((du, db))
}

/// The composite reference: `(x Wᵀ).add(b).gelu()` from unfused ops.
pub fn linear_bias_gelu_reference(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (rows, inp, out) = check("linear_bias_gelu", x, w, Some(b))?;
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank checked") = out;
    x.reshape(&[rows, inp])?
        .matmul(&w.t()?)?
        .add(b)?
        .gelu()?
        .reshape(&shape)
}

/// Bias + GELU in f64 over row-major rows of n, from GELU's one f64 definition (the shared op
/// table's, `UnaryOp::GeluTanh`): the one reference of the op's kernel tests in every crate.
pub mod reference {
    use crate::op::UnaryOp;

    /// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
    pub fn gelu_tanh(x: f64) -> f64 {
        UnaryOp::GeluTanh.apply_f64(x)
    }

    /// d gelu_tanh / dx.
    pub fn gelu_tanh_grad(x: f64) -> f64 {
        UnaryOp::GeluTanh.derivative_f64(x, gelu_tanh(x))
    }

    /// gelu_tanh(x + bias) over row-major rows of n (bias [n]).
    pub fn forward(x: &[f64], bias: &[f64], n: usize) -> Vec<f64> {
        let at = |i: usize| x[i] + bias[i % n];
        (0..x.len()).map(|i| gelu_tanh(at(i))).collect()
    }

    /// (dx, dbias) of Σ gy·gelu_tanh(x + bias): dx = gy·gelu'(x + bias), dbias = Σ_rows dx.
    pub fn backward(x: &[f64], bias: &[f64], gy: &[f64], n: usize) -> (Vec<f64>, Vec<f64>) {
        let dx: Vec<f64> = (0..x.len())
            .map(|i| gy[i] * gelu_tanh_grad(x[i] + bias[i % n]))
            .collect();
        let mut db = vec![0.0; n];
        for (i, d) in dx.iter().enumerate() {
            db[i % n] += d;
        }
        (dx, db)
    }
}

#[cfg(test)]
mod tests;
