//! Bias + GELU's CPU side: rows in parallel over sinter-cpu's vectorised bias-activation row
//! kernels (`sinter_cpu::math::bias_act`, the same arithmetic as the unfused GELU, so fused
//! and composite agree), the bias gradient summed over fixed row chunks (deterministic
//! whatever the thread count); and Linear + bias + GELU as one f32 GEMM with an epilogue.

use rayon::prelude::*;
use sinter_cpu::math::{bias_act, Activation};
use sinter_cpu::Isa;

use crate::cpu::nn::{fixed_chunks, rows_per_task, sum_partials, CHUNK_ROWS};
use crate::cpu::{linear_epilogue, output_vec, CpuStorage};
use crate::custom_op::{HostInput, HostOutput};
use crate::storage::Storage;
use crate::{Result, Tensor};

fn last_dim(x: &HostInput<'_>) -> usize {
    x.shape().last().copied().unwrap_or(1)
}

/// Inputs (x [.., n], bias [n]); output gelu_tanh(x + bias) in x's dtype.
pub(super) fn forward(x: &[HostInput<'_>]) -> Result<Vec<HostOutput>> {
    let (xs, bias, n) = (x[0].f32_values()?, x[1].f32_values()?, last_dim(&x[0]));
    let y = if n == 0 || xs.is_empty() {
        vec![0f32; xs.len()]
    } else {
        // Every row is written below: no zero fill.
        let mut y = output_vec(xs.len());
        let isa = Isa::get();
        let block = rows_per_task(xs.len(), n) * n;
        y.par_chunks_mut(block).enumerate().for_each(|(i, o)| {
            let xr = &xs[i * block..i * block + o.len()];
            bias_act::bias_act_rows(isa, xr, &bias, Activation::GeluTanh, o);
        });
        y
    };
    let y = CpuStorage::from_f32(y, x[0].dtype());
    Ok(vec![HostOutput::new(y, x[0].shape())])
}

/// Inputs (gy, x, bias); outputs (dx in x's dtype, dbias in the bias's). The pre-activation
/// x + bias is re-derived (one add per element) instead of stored.
pub(super) fn backward(x: &[HostInput<'_>]) -> Result<Vec<HostOutput>> {
    let (g, xs, bias) = (x[0].f32_values()?, x[1].f32_values()?, x[2].f32_values()?);
    let n = last_dim(&x[1]);
    let (dx, db) = if n == 0 || xs.is_empty() {
        (vec![0f32; xs.len()], vec![0f32; n])
    } else {
        let mut dx = output_vec(xs.len());
        let isa = Isa::get();
        let partials = fixed_chunks(&mut dx, n, |c, d| {
            let start = c * CHUNK_ROWS * n;
            let at = start..start + d.len();
            let mut db = vec![0f32; n];
            let (xr, gr) = (&xs[at.clone()], &g[at]);
            bias_act::bias_act_backward_rows(isa, xr, &bias, Activation::GeluTanh, gr, d, &mut db);
            db
        });
        (dx, sum_partials(partials, n))
    };
    Ok(vec![
        HostOutput::new(CpuStorage::from_f32(dx, x[1].dtype()), x[1].shape()),
        HostOutput::new(CpuStorage::from_f32(db, x[2].dtype()), x[2].shape()),
    ])
}

/// (y, pre-activation) [rows, out] of gelu(x Wᵀ + b) as one GEMM with a bias + GELU epilogue,
/// or None unless every operand is f32 (half precision runs the composite, which widens per
/// op). The tensors are untracked.
pub(super) fn linear_bias_gelu(
    (x, w, b): (&Tensor, &Tensor, &Tensor),
    (rows, inp, out): (usize, usize, usize),
) -> Result<Option<(Tensor, Tensor)>> {
    let (xs, ws, bs) = (x.storage(), w.storage(), b.storage());
    let (Storage::Cpu(xc), Storage::Cpu(wc), Storage::Cpu(bc)) = (&*xs, &*ws, &*bs) else {
        return Ok(None);
    };
    let bias = Some((bc, b.layout()));
    let fused = linear_epilogue(
        (xc, x.layout()),
        (wc, w.layout()),
        bias,
        Activation::GeluTanh,
        rows,
        inp,
        out,
    );
    Ok(fused.map(|(y, pre)| {
        let pre = pre.expect("an activation keeps its pre-activation");
        let t = |s| Tensor::from_storage(Storage::Cpu(s), &[rows, out]);
        (t(y), t(pre))
    }))
}
