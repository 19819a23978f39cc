//! The fused Transformer ops of `crate::fused` on the device. Their CPU kernels are host code;
//! on CUDA they run as the equivalent composites of device ops (same values and gradients), and
//! the global gradient norm uses the deterministic sum-of-squares kernel.

use sinter_cuda::ops::adamw as ka;

use super::{alloc, contig, parts, OnOp};
use crate::{DType, Result, Tensor};

/// softmax(scale · q kᵀ [+ causal mask]) v; the mask is aligned bottom-right, as in
/// `fused::attention` (query i sees keys up to tk − tq + i).
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    scale: f32,
) -> Result<Tensor> {
    let s = q.matmul(&k.t()?)?.mul_scalar(scale)?;
    let s = if causal {
        let (tq, tk) = (q.shape()[2], k.shape()[2]);
        let limit = |i: usize| (i + tk + 1).saturating_sub(tq).min(tk);
        let mask: Vec<f32> = (0..tq * tk)
            .map(|x| ((x % tk) >= limit(x / tk)) as u8 as f32)
            .collect();
        let mask = Tensor::from_vec(mask, &[tq, tk], q.device())?.to_dtype(s.dtype())?;
        s.masked_fill(&mask, f32::NEG_INFINITY)?
    } else {
        s
    };
    s.softmax(-1)?.matmul(v)
}

/// sqrt(Σ g²) over all gradients; NaN if the device fails (the signature has no error).
pub(crate) fn global_grad_norm(grads: &[Tensor]) -> f64 {
    grad_sum_squares_host(grads)
        .map(|s| s.sqrt())
        .unwrap_or(f64::NAN)
}

/// Σ g² over gradients on one CUDA device as a 1-element f32 tensor there (no host read).
pub(crate) fn grad_sum_squares(grads: &[Tensor]) -> Result<Tensor> {
    let (dev, _) = parts(&grads[0])?;
    let views = grads.iter().map(contig).collect::<Result<Vec<_>>>()?;
    let slices: Vec<_> = views.iter().map(|v| v.slice()).collect();
    let out = alloc(&dev, 1, DType::F32)?;
    ka::sum_squares(&dev, &slices, out.as_slice()).on("grad_sum_squares")?;
    Ok(super::tensor_of(&dev, out, DType::F32, &[1]))
}

fn grad_sum_squares_host(grads: &[Tensor]) -> Result<f64> {
    let mut total = 0f64;
    // One deterministic kernel pass per device over that device's gradients; CPU ones on the host.
    let mut by_device: Vec<(crate::Device, Vec<&Tensor>)> = Vec::new();
    for g in grads {
        match by_device.iter_mut().find(|(d, _)| *d == g.device()) {
            Some((_, v)) => v.push(g),
            None => by_device.push((g.device(), vec![g])),
        }
    }
    for (d, gs) in by_device {
        if !d.is_cuda() {
            let owned: Vec<Tensor> = gs.into_iter().cloned().collect();
            let n = crate::fused::global_grad_norm(&owned);
            total += n * n;
            continue;
        }
        let (dev, _) = parts(gs[0])?;
        let views = gs.iter().map(|g| contig(g)).collect::<Result<Vec<_>>>()?;
        let slices: Vec<_> = views.iter().map(|v| v.slice()).collect();
        let out = alloc(&dev, 1, DType::F32)?;
        ka::sum_squares(&dev, &slices, out.as_slice()).on("global_grad_norm")?;
        let s: Vec<f32> = dev.dtoh(out.as_slice()).on("global_grad_norm")?;
        total += s[0] as f64;
    }
    Ok(total)
}
