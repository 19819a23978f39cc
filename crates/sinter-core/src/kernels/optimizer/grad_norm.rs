//! The global L2 norm of all gradients in one pass (issue 24 item 3, "one grad-norm pass").
//!
//! Reads: every gradient tensor, once, in place (no copies for contiguous f32 data).
//! Writes: one value (an f64 on the host, or a one-element f32 tensor on the device).
//! Why it is fast: the composite (square, sum, per tensor, then add up) allocates a squared
//! copy of every gradient and synchronises per tensor; here each device streams its gradients
//! once: on the CPU squared and summed in f64 over fixed 16 Ki-element chunks added in order
//! (the result does not depend on the thread count); on CUDA one multi-tensor launch for up to
//! `cuda::SUMSQ_SLOTS` tensors and one fixed-order finish (`optimizer.cu`), deterministic.

use super::{cpu, cuda};
use crate::cpu::CpuStorage;
use crate::cuda::storage::CudaStorage;
use crate::storage::Storage;
use crate::{Device, Error, Layout, Result, Tensor};

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

/// The parts of one device, split by backend (all of them on the first part's device).
enum OnDevice<'a> {
    Cpu(Vec<(&'a CpuStorage, &'a Layout)>),
    Cuda(Vec<(&'a CudaStorage, &'a Layout)>),
}

fn on_device<'a>(parts: &[(&'a Storage, &'a Layout)]) -> Result<OnDevice<'a>> {
    let mismatch = |s: &Storage| Error::DeviceMismatch {
        op: "grad_sum_squares",
        lhs: parts[0].0.device(),
        rhs: s.device(),
    };
    match parts.first() {
        Some((Storage::Cuda(_), _)) => {
            let mut v = Vec::with_capacity(parts.len());
            for &(s, l) in parts {
                match s {
                    Storage::Cuda(c) => v.push((c, l)),
                    other => return Err(mismatch(other)),
                }
            }
            Ok(OnDevice::Cuda(v))
        }
        _ => {
            let mut v = Vec::with_capacity(parts.len());
            for &(s, l) in parts {
                match s {
                    Storage::Cpu(c) => v.push((c, l)),
                    other => return Err(mismatch(other)),
                }
            }
            Ok(OnDevice::Cpu(v))
        }
    }
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
        total += with_parts(&gs, |parts| match on_device(parts)? {
            OnDevice::Cpu(p) => Ok(cpu::sum_squares(&p)),
            OnDevice::Cuda(p) => cuda::sum_squares_host(&p),
        })?;
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
pub(super) fn grad_sum_squares_on(grads: &[Tensor], device: Device) -> Result<Tensor> {
    if grads.is_empty() {
        return Tensor::zeros(&[1], crate::DType::F32, device);
    }
    let refs: Vec<&Tensor> = grads.iter().collect();
    let s = with_parts(&refs, |parts| match on_device(parts)? {
        OnDevice::Cpu(p) => Ok(Storage::Cpu(cpu::sum_squares_storage(&p))),
        OnDevice::Cuda(p) => cuda::sum_squares(&p).map(Storage::Cuda),
    })?;
    Ok(Tensor::from_storage(s, &[1]))
}
