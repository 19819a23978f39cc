//! The global L2 norm of all gradients in one pass.
//!
//! Reads: every gradient tensor, once, in place (no copies for contiguous f32 data).
//! Writes: one f64.
//! Why it is fast: the composite (square, sum, per tensor, then add up) allocates a squared
//! copy of every gradient and synchronises per tensor; here each device streams its gradients
//! once (the `sum_squares` primitive: on the CPU squared and summed in f64 over fixed
//! 16 Ki-element chunks added in order, so the result does not depend on the thread count; on
//! CUDA one deterministic kernel pass).

use crate::storage::Storage;
use crate::{Device, Layout, Result, Tensor};

/// Runs `f` on the (storage, layout) of each tensor, all read-locked for the call.
fn with_parts<R>(ts: &[&Tensor], f: impl FnOnce(&[(&Storage, &Layout)]) -> R) -> R {
    let guards: Vec<_> = ts.iter().map(|t| t.storage()).collect();
    let parts: Vec<(&Storage, &Layout)> = guards
        .iter()
        .zip(ts)
        .map(|(g, t)| (&**g, t.layout()))
        .collect();
    f(&parts)
}

/// Σ g² over all gradients, one pass per device (in the order devices first appear).
fn sum_squares(grads: &[Tensor]) -> Result<f64> {
    let mut by_device: Vec<(Device, Vec<&Tensor>)> = Vec::new();
    for g in grads {
        match by_device.iter_mut().find(|(d, _)| *d == g.device()) {
            Some((_, v)) => v.push(g),
            None => by_device.push((g.device(), vec![g])),
        }
    }
    let mut total = 0f64;
    for (_, gs) in by_device {
        total += with_parts(&gs, Storage::sum_squares_host)?;
    }
    Ok(total)
}

/// sqrt(Σ over all tensors and elements of g²), accumulated in f64 on the host. Deterministic.
/// NaN if a device fails (the signature has no error).
pub fn global_grad_norm(grads: &[Tensor]) -> f64 {
    sum_squares(grads).map(f64::sqrt).unwrap_or(f64::NAN)
}

/// Σ g² over gradients that all live on `device`, as a one-element f32 tensor there (no host
/// read where the data is not on the host).
pub(crate) fn grad_sum_squares_on(grads: &[Tensor], device: Device) -> Result<Tensor> {
    if grads.is_empty() {
        return Tensor::zeros(&[1], crate::DType::F32, device);
    }
    let refs: Vec<&Tensor> = grads.iter().collect();
    let s = with_parts(&refs, Storage::sum_squares)?;
    Ok(Tensor::from_storage(s, &[1]))
}
