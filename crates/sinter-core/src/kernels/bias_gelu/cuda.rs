//! Bias + GELU's CUDA side. Alone, the op runs as its composite (add, then GELU) on the
//! device; after a GEMM it is the GEMM's epilogue: Linear + bias + GELU is one cuBLASLt GEMM
//! whose GELU_AUX_BIAS epilogue adds the bias, applies GELU and stores the pre-activation
//! (`cuda::matmul::linear_bias_gelu`, which the GEMM code owns), for f16/bf16 and output
//! widths that are multiples of 8.

use crate::storage::Storage;
use crate::{Result, Tensor};

/// (y, pre-activation) [rows, out] of gelu(x Wᵀ + b) as one epilogue GEMM, or None where the
/// epilogue does not apply (dtype, width). The tensors are untracked.
pub(super) fn linear_bias_gelu(
    (x, w, b): (&Tensor, &Tensor, &Tensor),
    (rows, inp, out): (usize, usize, usize),
) -> Result<Option<(Tensor, Tensor)>> {
    let (xs, ws, bs) = (x.storage(), w.storage(), b.storage());
    let (Storage::Cuda(xc), Storage::Cuda(wc), Storage::Cuda(bc)) = (&*xs, &*ws, &*bs) else {
        return Ok(None);
    };
    let (xl, wl, bl) = (x.layout(), w.layout(), b.layout());
    let fused = crate::cuda::matmul::linear_bias_gelu(xc, xl, wc, wl, bc, bl, rows, inp, out)?;
    Ok(fused.map(|(y, pre)| {
        let t = |s| Tensor::from_storage(Storage::Cuda(s), &[rows, out]);
        (t(y), t(pre))
    }))
}
