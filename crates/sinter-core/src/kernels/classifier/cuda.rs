//! The fused classifier's CUDA side: the kernels of `classifier.cu` with their launches and
//! declared traffic (for `sinter bench gpu-model`).

use sinter_cuda::launch::row_block;

use crate::custom_op::{CudaKernel, KernelLaunch, OpClass, TensorMeta, Traffic};
use crate::kernels::launch::suffix;
use crate::{DType, Result};

/// The CUDA C++ of both kernels (compiled by NVRTC at the first CUDA call).
pub const CLASSIFIER_CU: &str = include_str!("classifier.cu");

/// Blocks of a grid-stride launch at most (rows or elements beyond are strided over).
const MAX_BLOCKS: usize = 65_535;

/// The forward kernel for `dtype`: a row group per block row (as the cross-entropy kernels),
/// its scalars rows, n, valid and the ignore index.
pub(super) fn forward_kernel(dtype: DType, valid: usize, ignore: i64) -> Result<CudaKernel> {
    let name = format!("fused_classifier_{}", suffix(dtype));
    CudaKernel::new("classifier.cu", CLASSIFIER_CU, &name, move |m| {
        let (rows, n) = (m[0].shape[0], m[0].shape[1]);
        let (bx, by) = row_block(valid);
        let blocks = rows.div_ceil(by as usize).clamp(1, MAX_BLOCKS) as u32;
        let esize = m[0].dtype.size_in_bytes();
        // Logits read once and the gradient written once (over the same memory), the targets
        // read, the losses written; ~5 FLOPs per element (max, exp, sum; exp, scale).
        let t = Traffic::bytes(rows * n * esize + rows * 8 + 4, rows * n * esize + rows * 4)
            .with_flops(5 * rows * valid);
        Ok(KernelLaunch {
            grid: (blocks, 1, 1),
            block: (bx, by, 1),
            shared_mem: 0,
            scalars: Vec::new(),
            cost: None,
        }
        .arg(rows as i64)
        .arg(n as i64)
        .arg(valid as i64)
        .arg(ignore)
        .with_cost(OpClass::Row, t))
    })
}

/// The backward's scale kernel for `dtype`. Its declared traffic is the usual case, g == 1
/// (the seed of `loss.backward()`): the scalar read, nothing else; a scaled loss (gradient
/// accumulation, fp16 loss scaling) reads and writes the gradient once more, which the trace
/// cannot see (nothing runs there).
pub(super) fn grad_scale_kernel(dtype: DType) -> Result<CudaKernel> {
    let name = format!("classifier_grad_scale_{}", suffix(dtype));
    CudaKernel::new(
        "classifier.cu",
        CLASSIFIER_CU,
        &name,
        move |m: &[TensorMeta]| {
            let count = m[0].numel();
            let blocks = count.div_ceil(256).clamp(1, MAX_BLOCKS);
            Ok(KernelLaunch::linear(blocks * 256, 256)?
                .arg(count as i64)
                .with_cost(OpClass::Elementwise, Traffic::bytes(4, 0)))
        },
    )
}
