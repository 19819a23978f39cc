//! The LLTM cell's pointwise part as custom ops (`sinter_core::custom_op`), defined once and
//! run wherever the tensors live: `lltm_cell` (forward: the CPU loops of `cpu_kernels`, or the
//! CUDA kernel `lltm_cell_forward` of `lltm.cu`) whose one backward calls `lltm_cell_backward`,
//! a second custom op (the CPU loops, or the CUDA kernel of the same name).

use std::sync::OnceLock;

use sinter_core::custom_op::{
    CudaKernel, CustomOp, HostOutput, KernelLaunch, OutputSpec, TensorMeta,
};
use sinter_core::{bail, DType, Result, Tensor};

use super::cpu_kernels;

/// The CUDA C++ of both kernels (compiled by NVRTC at the first CUDA call).
pub const LLTM_CU: &str = include_str!("lltm.cu");

/// Threads per block of both kernels (grid-stride over batch × state).
const BLOCK: u32 = 256;

/// (batch, state) of `[batch, 3·state]` gates and a `[batch, state]` cell, or why they do not fit.
fn cell_dims(gates: &TensorMeta, cell: &TensorMeta) -> Result<(usize, usize)> {
    match (&gates.shape[..], &cell.shape[..]) {
        (&[b, g], &[b2, s]) if b == b2 && g == 3 * s => Ok((b, s)),
        _ => bail!(
            "gates must be [batch, 3·state] and the cell [batch, state]; got {:?} and {:?}",
            gates.shape,
            cell.shape
        ),
    }
}

/// The launch of either kernel: one thread per (row, unit), its scalars batch and state.
fn launch(m: &[TensorMeta], cell: usize) -> Result<KernelLaunch> {
    let (b, s) = (m[cell].shape[0], m[cell].shape[1]);
    let dims = |v: usize| {
        i32::try_from(v).map_err(|_| {
            sinter_core::Error::Msg(format!("lltm: {v} does not fit the kernel's int"))
        })
    };
    Ok(KernelLaunch::linear(b * s, BLOCK)?
        .arg(dims(b)?)
        .arg(dims(s)?))
}

fn kernel() -> Result<CudaKernel> {
    CudaKernel::new("lltm.cu", LLTM_CU, "lltm_cell_forward", |m| launch(m, 1))
}

/// (gates [B, 3S], old_cell [B, S]) → (new_h, new_cell), saving the activations [B, 3S].
pub fn lltm_cell() -> Result<&'static CustomOp> {
    static OP: OnceLock<CustomOp> = OnceLock::new();
    if let Some(op) = OP.get() {
        return Ok(op);
    }
    let backward_op = lltm_cell_backward()?;
    let op = CustomOp::builder("lltm_cell")
        .inputs(2)
        .outputs(|m| {
            let (b, s) = cell_dims(&m[0], &m[1])?;
            Ok(vec![
                OutputSpec::new(&[b, s], DType::F32),
                OutputSpec::new(&[b, s], DType::F32),
                OutputSpec::new(&[b, 3 * s], DType::F32).saved(),
            ])
        })
        .cpu(|x| {
            let (g, c) = (x[0].f32()?, x[1].f32()?);
            let shape = x[1].shape();
            let (h, c, act) = cpu_kernels::forward(g, c, shape[1]);
            Ok(vec![
                HostOutput::f32(h, shape),
                HostOutput::f32(c, shape),
                HostOutput::f32(act, x[0].shape()),
            ])
        })
        .cuda(kernel()?)
        .backward(move |ctx| {
            // Gradients of (h, c), then the new cell and the saved activations.
            let d = backward_op.apply(&[ctx.grad(0), ctx.grad(1), ctx.output(1), ctx.output(2)])?;
            Ok(vec![Some(d[0].clone()), Some(d[1].clone())])
        })
        .build()?;
    Ok(OP.get_or_init(|| op))
}

/// (grad_h, grad_cell, new_cell [B, S], act [B, 3S]) → (d_gates [B, 3S], d_old_cell [B, S]).
pub fn lltm_cell_backward() -> Result<&'static CustomOp> {
    static OP: OnceLock<CustomOp> = OnceLock::new();
    if let Some(op) = OP.get() {
        return Ok(op);
    }
    let op = CustomOp::builder("lltm_cell_backward")
        .inputs(4)
        .outputs(|m| {
            let (b, s) = cell_dims(&m[3], &m[2])?;
            if m[0].shape != [b, s] || m[1].shape != [b, s] {
                bail!(
                    "the gradients of h and c must be [{b}, {s}]; got {:?} and {:?}",
                    m[0].shape,
                    m[1].shape
                );
            }
            Ok(vec![
                OutputSpec::new(&[b, 3 * s], DType::F32),
                OutputSpec::new(&[b, s], DType::F32),
            ])
        })
        .cpu(|x| {
            let shape = x[2].shape();
            let (dg, dc) =
                cpu_kernels::backward(x[0].f32()?, x[1].f32()?, x[2].f32()?, x[3].f32()?, shape[1]);
            Ok(vec![
                HostOutput::f32(dg, x[3].shape()),
                HostOutput::f32(dc, shape),
            ])
        })
        .cuda(kernel()?.sibling("lltm_cell_backward", |m| launch(m, 2)))
        .build()?;
    Ok(OP.get_or_init(|| op))
}

/// (new_h, new_cell) of the cell's pointwise part through the custom op.
pub fn cell_fused(gates: &Tensor, old_cell: &Tensor) -> Result<(Tensor, Tensor)> {
    let mut out = lltm_cell()?.apply(&[gates, old_cell])?.into_iter();
    match (out.next(), out.next()) {
        (Some(h), Some(c)) => Ok((h, c)),
        _ => bail!("lltm_cell returns two outputs"),
    }
}
