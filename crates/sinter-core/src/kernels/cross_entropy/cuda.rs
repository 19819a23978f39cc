//! Cross-entropy's CUDA side: the kernels of `cross_entropy.cu` (one row group per row) with
//! their launches and declared traffic (for `sinter bench gpu-model`).

use std::sync::OnceLock;

use sinter_cpu::math::cross_entropy::STATS_PER_ROW as STATS;

use crate::custom_op::{CudaKernel, KernelLaunch, OpClass, TensorMeta, Traffic};
use crate::kernels::launch::{bytes, kernel, row_launch, rows_n, suffix};
use crate::{DType, Result};

/// The CUDA C++ of the kernels (compiled by NVRTC at the first CUDA call).
pub const CROSS_ENTROPY_CU: &str = include_str!("cross_entropy.cu");

fn ce_kernel(
    base: &str,
    dtype: DType,
    launch: impl Fn(&[TensorMeta]) -> Result<KernelLaunch> + Send + Sync + 'static,
) -> Result<CudaKernel> {
    static SOURCE: OnceLock<CudaKernel> = OnceLock::new();
    let name = format!("{base}_{}", suffix(dtype));
    kernel(
        &SOURCE,
        ("cross_entropy.cu", CROSS_ENTROPY_CU),
        &name,
        launch,
    )
}

/// Inputs (logits, targets); outputs (loss, stats). One read of the logits.
pub(super) fn forward_kernel(dtype: DType, ignore: i64) -> Result<CudaKernel> {
    ce_kernel("cross_entropy_fwd", dtype, move |m| {
        let (rows, n) = rows_n(&m[0]);
        let t = Traffic::bytes(bytes(&m[0]) + bytes(&m[1]), rows * 4 * (1 + STATS))
            .with_flops(4 * rows * n);
        Ok(row_launch("cross_entropy", &m[0])?
            .arg(rows as i64)
            .arg(n as i64)
            .arg(ignore)
            .with_cost(OpClass::Row, t))
    })
}

/// Inputs (logits, targets, stats, per-row loss gradient); output dlogits. One read of the
/// logits and one write of their gradient.
pub(super) fn backward_kernel(dtype: DType, ignore: i64) -> Result<CudaKernel> {
    ce_kernel("cross_entropy_bwd", dtype, move |m| {
        let (rows, n) = rows_n(&m[0]);
        let read = bytes(&m[0]) + bytes(&m[1]) + bytes(&m[2]);
        let t = Traffic::bytes(read, bytes(&m[0])).with_flops(4 * rows * n);
        Ok(row_launch("cross_entropy", &m[0])?
            .arg(rows as i64)
            .arg(n as i64)
            .arg(ignore)
            .with_cost(OpClass::Row, t))
    })
}
