//! LayerNorm's CUDA side: the kernels of `layer_norm.cu` with their launches and declared
//! traffic (for `sinter bench gpu-model`). The forward and the residual forward are one kernel
//! each; the backward is three: dx, then dgamma/dbeta as per-chunk column sums (no atomics)
//! summed in a fixed order by a finishing kernel, so it is deterministic.

use std::sync::OnceLock;

use sinter_cuda::launch::ELEMWISE_BLOCK;

use crate::custom_op::{CudaKernel, KernelLaunch, OpClass, TensorMeta, Traffic};
use crate::kernels::launch::{bytes, rows_n, suffix};
use crate::{DType, Result};

/// The CUDA C++ of the kernels (compiled by NVRTC at the first CUDA call).
pub const LAYER_NORM_CU: &str = include_str!("layer_norm.cu");

/// The instantiation of kernel `base` for activations in `dtype` and gamma/beta in `param`
/// (x's dtype, or f32 master parameters: the `_pf32` variants).
fn kernel(
    base: &str,
    (dtype, param): (DType, DType),
    launch: impl Fn(&[TensorMeta]) -> Result<KernelLaunch> + Send + Sync + 'static,
) -> Result<CudaKernel> {
    static SOURCE: OnceLock<CudaKernel> = OnceLock::new();
    let pf32 = if param == DType::F32 && dtype != DType::F32 {
        "_pf32"
    } else {
        ""
    };
    let name = format!("{base}_{}{pf32}", suffix(dtype));
    crate::kernels::launch::kernel(&SOURCE, ("layer_norm.cu", LAYER_NORM_CU), &name, launch)
}

fn target(m: &TensorMeta) -> Result<sinter_cuda::launch::LaunchTarget> {
    crate::kernels::launch::target("layer_norm", m)
}

fn row_launch(m: &TensorMeta) -> Result<KernelLaunch> {
    crate::kernels::launch::row_launch("layer_norm", m)
}

/// Inputs (x, gamma, beta), the parameters in `dt.1`; outputs (y, mean, rstd).
pub(super) fn forward_kernel(dt: (DType, DType), eps: f32) -> Result<CudaKernel> {
    kernel("layernorm_fwd", dt, move |m| {
        let (rows, n) = rows_n(&m[0]);
        let read = bytes(&m[0]) + bytes(&m[1]) + bytes(&m[2]);
        let t = Traffic::bytes(read, bytes(&m[0]) + 2 * rows * 4).with_flops(8 * rows * n);
        Ok(row_launch(&m[0])?
            .arg(rows as i64)
            .arg(n as i64)
            .arg(eps)
            .with_cost(OpClass::Row, t))
    })
}

/// Inputs (x, residual, gamma, beta), the parameters in `dt.1`; outputs (h, y, mean, rstd).
pub(super) fn residual_forward_kernel(dt: (DType, DType), eps: f32) -> Result<CudaKernel> {
    kernel("resln_fwd", dt, move |m| {
        let (rows, n) = rows_n(&m[0]);
        let read = 2 * bytes(&m[0]) + bytes(&m[2]) + bytes(&m[3]);
        let t = Traffic::bytes(read, 2 * bytes(&m[0]) + 2 * rows * 4).with_flops(9 * rows * n);
        Ok(row_launch(&m[0])?
            .arg(rows as i64)
            .arg(n as i64)
            .arg(eps)
            .with_cost(OpClass::Row, t))
    })
}

/// Inputs (x, gamma, gy, mean, rstd), gamma in `dt.1`; output dx.
pub(super) fn dx_kernel(dt: (DType, DType)) -> Result<CudaKernel> {
    kernel("layernorm_bwd_dx", dt, |m| {
        let (rows, n) = rows_n(&m[0]);
        let read = bytes(&m[0]) + bytes(&m[1]) + bytes(&m[2]) + 2 * rows * 4;
        let t = Traffic::bytes(read, bytes(&m[0])).with_flops(10 * rows * n);
        Ok(row_launch(&m[0])?
            .arg(rows as i64)
            .arg(n as i64)
            .with_cost(OpClass::Row, t))
    })
}

/// The one-pass backward's dynamic shared memory for rows like `m`'s (a [2, n] f32 slice per
/// row group), or None where it exceeds the 48 KiB a launch may ask for (the two-kernel
/// backward serves those rows).
fn fused_shared_mem(m: &TensorMeta) -> Option<u32> {
    let (_, n) = rows_n(m);
    let (_, by) = sinter_cuda::launch::row_block(n);
    let bytes = 2 * n * by as usize * 4;
    (bytes <= 48 * 1024).then_some(bytes as u32)
}

/// The one-pass backward's launch: the row launch capped at one wave of full occupancy (not
/// four), since every block writes a partial row of 2n floats that the finish kernel reads.
fn fused_launch(m: &TensorMeta) -> Result<KernelLaunch> {
    let mut launch = row_launch(m)?;
    let threads = launch.block.0 * launch.block.1;
    let wave = (target(m)?.max_blocks(threads) / 4).max(1);
    launch.grid.0 = launch.grid.0.min(wave);
    Ok(launch)
}

/// The one-pass backward's partial-sum rows for rows like `m`'s (one per block of its grid),
/// or None where it does not fit (see [`fused_shared_mem`]).
pub(super) fn fused_partials(m: &TensorMeta) -> Result<Option<usize>> {
    if fused_shared_mem(m).is_none() {
        return Ok(None);
    }
    Ok(Some(fused_launch(m)?.grid.0 as usize))
}

/// Inputs (x, gamma, gy, mean, rstd), gamma in `dt.1`; outputs dx and the partial column sums
/// (f32 [blocks, n] each) of gy·xhat and gy: dx and what the params kernel computes, in one
/// pass over x and gy.
pub(super) fn fused_backward_kernel(dt: (DType, DType)) -> Result<CudaKernel> {
    kernel("layernorm_bwd", dt, |m| {
        let (rows, n) = rows_n(&m[0]);
        let shared = fused_shared_mem(&m[0]).ok_or_else(|| {
            crate::Error::Msg(format!(
                "layer_norm backward: rows of {n} need more shared memory than a launch has"
            ))
        })?;
        let launch = fused_launch(&m[0])?;
        let blocks = launch.grid.0 as usize;
        let read = bytes(&m[0]) + bytes(&m[1]) + bytes(&m[2]) + 2 * rows * 4;
        let write = bytes(&m[0]) + 2 * blocks * n * 4;
        let t = Traffic::bytes(read, write).with_flops(15 * rows * n);
        Ok(KernelLaunch {
            shared_mem: shared,
            ..launch
        }
        .arg(rows as i64)
        .arg(n as i64)
        .with_cost(OpClass::Row, t))
    })
}

/// Row chunks of the dgamma/dbeta partial sums for `rows` rows of n on device `m`: (chunks,
/// rows per chunk); enough 32-column × chunk blocks to fill the GPU, at least 32 rows a chunk,
/// at most 1024 chunks.
pub(super) fn param_chunks(m: &TensorMeta) -> Result<(usize, usize)> {
    let (rows, n) = rows_n(m);
    let col_blocks = n.div_ceil(32).max(1);
    let want = (target(m)?.sm_count as usize * 8)
        .div_ceil(col_blocks)
        .min(rows.div_ceil(32))
        .clamp(1, 1024);
    let len = rows.div_ceil(want).max(1);
    Ok((rows.div_ceil(len).max(1), len))
}

/// Inputs (x, gy, mean, rstd); outputs the partial column sums (f32 [chunks, n] each) of
/// gy·xhat and gy.
pub(super) fn params_kernel(dtype: DType) -> Result<CudaKernel> {
    kernel("layernorm_bwd_params", (dtype, dtype), |m| {
        let (rows, n) = rows_n(&m[0]);
        let (chunks, len) = param_chunks(&m[0])?;
        let read = bytes(&m[0]) + bytes(&m[1]) + 2 * rows * 4;
        let t = Traffic::bytes(read, 2 * chunks * n * 4).with_flops(5 * rows * n);
        Ok(
            KernelLaunch::new((n.div_ceil(32) as u32, chunks as u32, 1), (32, 8, 1))
                .arg(rows as i64)
                .arg(n as i64)
                .arg(len as i64)
                .with_cost(OpClass::Row, t),
        )
    })
}

/// Inputs the two partial sums [chunks, n]; outputs dgamma and dbeta [n] (in `dtype`, the
/// parameters').
pub(super) fn finish_kernel(dtype: DType) -> Result<CudaKernel> {
    kernel("layernorm_bwd_finish", (dtype, dtype), move |m| {
        let (chunks, n) = (m[0].shape[0], m[0].shape[1]);
        let grid = target(&m[0])?.grid_for(n, ELEMWISE_BLOCK);
        let t = Traffic::bytes(2 * chunks * n * 4, 2 * n * dtype.size_in_bytes());
        Ok(KernelLaunch::new((grid, 1, 1), (ELEMWISE_BLOCK, 1, 1))
            .arg(chunks as i64)
            .arg(n as i64)
            .with_cost(OpClass::Row, t))
    })
}
