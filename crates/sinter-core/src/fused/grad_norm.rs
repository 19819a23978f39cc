//! The global L2 norm of all gradients in one pass.
//!
//! Reads: every gradient tensor, once, in place (no copies for contiguous f32 data).
//! Writes: one f64.
//! Why it is fast: the composite (square, sum, per tensor, then add up) allocates a squared
//! copy of every gradient and synchronises per tensor; here each gradient is streamed once,
//! squared and summed in f64 registers, in parallel over fixed 16 Ki-element chunks whose
//! partial sums are added in chunk order, so the result does not depend on the thread count
//! (deterministic run to run and machine to machine).

use rayon::prelude::*;

use crate::cpu::CpuStorage;
use crate::Tensor;

/// Elements per partial sum; fixed, so the summation order never changes.
const CHUNK: usize = 1 << 14;

fn sum_sq_f32(v: &[f32]) -> f64 {
    let chunk = |c: &[f32]| c.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>();
    if v.len() <= CHUNK {
        return chunk(v);
    }
    let partials: Vec<f64> = v.par_chunks(CHUNK).map(chunk).collect();
    partials.iter().sum()
}

/// sqrt(Σ over all tensors and elements of g²), accumulated in f64. Deterministic.
pub fn global_grad_norm(grads: &[Tensor]) -> f64 {
    if grads.iter().any(|g| g.device().is_cuda()) {
        return crate::cuda::fused::global_grad_norm(grads);
    }
    let mut total = 0f64;
    for g in grads {
        let s = g.storage();
        total += match (s.cpu(), g.layout().contiguous_range()) {
            (CpuStorage::F32(v), Some(r)) => sum_sq_f32(&v[r]),
            (other, _) => sum_sq_f32(&other.f32_contiguous(g.layout())),
        };
    }
    total.sqrt()
}
