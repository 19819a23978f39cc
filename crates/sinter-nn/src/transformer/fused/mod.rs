//! The Llama family's pointwise ops as fused kernels with fused backwards: RMSNorm, rotary
//! positions and SwiGLU, each one custom op (`sinter_core::custom_op`, the mechanism every
//! fused op outside the engine uses; see ARCHITECTURE.md) with a CPU forward (sinter-cpu's
//! vectorised kernels, f32), a CUDA forward (`llama_fused.cu` through `cuda.rs`: f32, f16 and
//! bf16) and one backward, itself more such ops. The composites they replace (tensor ops,
//! differentiated by autograd) stay beside them in `norm.rs`, `rope.rs` and `mlp.rs`: they are
//! the reference the tests hold these kernels to, and the path every other dtype and device
//! takes.
//!
//! Why: as composites, each of these is 4–7 tensor ops forward and about twice that backward,
//! each a pass over memory and a rayon fork; a llama-tiny training step spent more time in
//! them (and in the copies `cat` and `narrow`'s backward make) than in its attention.

mod cuda;
pub(crate) mod rms_norm;
pub(crate) mod rope;
pub(crate) mod swiglu;

use rayon::prelude::*;
use sinter_core::{DType, Device, Tensor};

/// The dtypes the CUDA kernels take.
const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Whether `x` takes the fused kernels: f32 on the CPU, f32/f16/bf16 on CUDA. Elsewhere (the
/// CPU in half precision) the composite runs, with the same values and gradients.
pub(crate) fn applies(x: &Tensor) -> bool {
    match x.device() {
        Device::Cpu => x.dtype() == DType::F32,
        Device::Cuda(_) => FLOATS.contains(&x.dtype()),
    }
}

/// `t` in `dtype` (itself when it already is): an output gradient as a backward kernel reads
/// it, in its output's dtype.
fn in_dtype(t: &Tensor, dtype: DType) -> sinter_core::Result<Tensor> {
    if t.dtype() == dtype {
        Ok(t.clone())
    } else {
        t.to_dtype(dtype)
    }
}

/// Below this many elements a kernel runs on one thread: rayon's fork costs more than it saves
/// (the LLTM kernels measured the same threshold on 2 cores).
pub(super) const PARALLEL_FROM: usize = 1 << 14;

/// Runs `f(row index, input rows, output rows)` over rows of `n_in` inputs and `n_out` outputs,
/// in parallel chunks of whole rows once there is enough work.
fn for_rows(
    x: &[f32],
    n_in: usize,
    y: &mut [f32],
    n_out: usize,
    f: impl Fn(usize, &[f32], &mut [f32]) + Sync,
) {
    let rows = y.len() / n_out.max(1);
    if x.len() + y.len() < PARALLEL_FROM || rows < 2 {
        for (r, (xi, yi)) in x.chunks(n_in).zip(y.chunks_mut(n_out)).enumerate() {
            f(r, xi, yi);
        }
        return;
    }
    // Chunks of rows big enough to amortise the fork, at least one per thread.
    let per = rows.div_ceil(rayon::current_num_threads() * 4).max(1);
    y.par_chunks_mut(per * n_out)
        .enumerate()
        .for_each(|(c, yc)| {
            let first = c * per;
            let xc = &x[first * n_in..][..yc.len() / n_out * n_in];
            for (r, (xi, yi)) in xc.chunks(n_in).zip(yc.chunks_mut(n_out)).enumerate() {
                f(first + r, xi, yi);
            }
        });
}
