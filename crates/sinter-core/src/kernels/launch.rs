//! What the folders' `cuda.rs` files share: a kernel of a folder's one `.cu` source (compiled
//! once for all its kernels), the launch target of the device a tensor lives on, and the
//! row-group launch of the row kernels (one group of threads per row).

use std::sync::OnceLock;

use sinter_cuda::launch::{row_block, rows_grid, LaunchTarget};

use crate::custom_op::{CudaKernel, KernelLaunch, TensorMeta};
use crate::{bail, DType, Device, Result};

/// The suffix of a kernel's instantiation for `dtype` (`layernorm_fwd_bf16`).
pub(super) fn suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => "f32",
    }
}

/// Kernel `name` of `source` (named `file` in compiler errors); `cache` holds the folder's
/// first kernel, whose source the others share so that NVRTC compiles it once.
pub(super) fn kernel(
    cache: &'static OnceLock<CudaKernel>,
    (file, source): (&str, &str),
    name: &str,
    launch: impl Fn(&[TensorMeta]) -> Result<KernelLaunch> + Send + Sync + 'static,
) -> Result<CudaKernel> {
    if let Some(k) = cache.get() {
        return Ok(k.sibling(name, launch));
    }
    let k = CudaKernel::new(file, source, name, launch)?;
    let _ = cache.set(k.clone());
    Ok(k)
}

/// The launch target (SM count) of the device `m` lives on.
pub(super) fn target(op: &str, m: &TensorMeta) -> Result<LaunchTarget> {
    match m.device {
        Device::Cuda(o) => Ok(crate::cuda::device(o)?.target()),
        d => bail!("{op}: a CUDA kernel launched for a tensor on {d}"),
    }
}

/// (rows, n) of a [.., n] operand.
pub(super) fn rows_n(m: &TensorMeta) -> (usize, usize) {
    let n = m.shape.last().copied().unwrap_or(1).max(1);
    (m.numel() / n, n)
}

/// Bytes of an operand.
pub(super) fn bytes(m: &TensorMeta) -> usize {
    m.numel() * m.dtype.size_in_bytes()
}

/// A row-group launch over the rows of `m` (one group of threads per row, several rows a
/// block for short rows), its scalars to be added.
pub(super) fn row_launch(op: &str, m: &TensorMeta) -> Result<KernelLaunch> {
    let (rows, n) = rows_n(m);
    let (bx, by) = row_block(n);
    Ok(KernelLaunch::new(
        (rows_grid(&target(op, m)?, rows, by, bx * by), 1, 1),
        (bx, by, 1),
    ))
}

/// Queues the device check of `targets` (class indices on a CUDA device) against [0, bound),
/// `ignore` passing: a bad one is reported, naming `op`, by the next call that waits for the
/// device. Nothing to do for targets on the CPU (their op checks them on the host).
pub(super) fn check_device_targets(
    op: &str,
    targets: &crate::Tensor,
    bound: usize,
    ignore: i64,
) -> Result<()> {
    let s = targets.storage();
    let crate::storage::Storage::Cuda(c) = &*s else {
        return Ok(());
    };
    let v = c.window(targets.layout())?;
    crate::cuda::checks::check_indices(
        c.device(),
        v.slice(),
        bound,
        Some(ignore),
        crate::backend::IndexUse::CrossEntropy,
    )
    .map_err(|e| crate::Error::Msg(format!("{op}: {e}")))
}
