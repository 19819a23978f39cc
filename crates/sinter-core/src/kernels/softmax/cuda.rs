//! Softmax's CUDA side: the kernels of `softmax.cu` (one row group per row, deterministic) with
//! their launches and declared traffic (for `sinter bench gpu-model`).

use std::sync::OnceLock;

use crate::custom_op::{CudaKernel, OpClass, TensorMeta, Traffic};
use crate::kernels::launch::{bytes, kernel, row_launch, rows_n, suffix};
use crate::{DType, Result};

/// The CUDA C++ of the kernels (compiled by NVRTC at the first CUDA call).
pub const SOFTMAX_CU: &str = include_str!("softmax.cu");

/// The kernel `base` for `dtype`: inputs of one dtype, one output like the first input, over
/// rows of its last dimension; the scalars rows and n.
fn row_kernel(base: &str, dtype: DType) -> Result<CudaKernel> {
    static SOURCE: OnceLock<CudaKernel> = OnceLock::new();
    let name = format!("{base}_{}", suffix(dtype));
    kernel(
        &SOURCE,
        ("softmax.cu", SOFTMAX_CU),
        &name,
        |m: &[TensorMeta]| {
            let (rows, n) = rows_n(&m[0]);
            let read = m.iter().map(bytes).sum();
            let t = Traffic::bytes(read, bytes(&m[0])).with_flops(5 * rows * n);
            Ok(row_launch("softmax", &m[0])?
                .arg(rows as i64)
                .arg(n as i64)
                .with_cost(OpClass::Row, t))
        },
    )
}

/// Input x; output y = softmax(x) or log_softmax(x).
pub(super) fn forward_kernel(dtype: DType, log: bool) -> Result<CudaKernel> {
    row_kernel(if log { "log_softmax" } else { "softmax" }, dtype)
}

/// Inputs (y, gy); output gx.
pub(super) fn backward_kernel(dtype: DType, log: bool) -> Result<CudaKernel> {
    row_kernel(
        if log {
            "log_softmax_bwd"
        } else {
            "softmax_bwd"
        },
        dtype,
    )
}
