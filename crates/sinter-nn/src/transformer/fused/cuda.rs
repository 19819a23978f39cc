//! The CUDA side of this folder's custom ops: the kernels of `llama_fused.cu`, their launches
//! and their declared traffic (for `sinter bench gpu-model`). Each op takes its kernel from
//! here for the dtypes it runs in; the instantiation is picked by name (`rmsnorm_fwd_bf16_pf32`).

use std::sync::OnceLock;

use sinter_core::custom_op::{CudaKernel, KernelLaunch, OpClass, TensorMeta, Traffic};
use sinter_core::{DType, Result};

/// The CUDA C++ of the kernels (compiled by NVRTC at the first CUDA call).
pub(crate) const LLAMA_FUSED_CU: &str = include_str!("llama_fused.cu");

/// Rows of an RMSNorm block: 8 row groups of one warp (blockDim (32, 8)).
const ROWS_PER_BLOCK: usize = 8;
/// Rows per partial sum of the RMSNorm weight's gradient: fixed, so the sum's order (and the
/// result) does not depend on the device.
pub(super) const DW_CHUNK: usize = 256;

/// The suffix of a kernel's instantiation for `dtype`.
fn suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => "f32",
    }
}

/// Kernel `name` of the folder's source (compiled once for all of them).
fn kernel(
    name: String,
    launch: impl Fn(&[TensorMeta]) -> Result<KernelLaunch> + Send + Sync + 'static,
) -> Result<CudaKernel> {
    static SOURCE: OnceLock<CudaKernel> = OnceLock::new();
    if let Some(k) = SOURCE.get() {
        return Ok(k.sibling(&name, launch));
    }
    let k = CudaKernel::new("llama_fused.cu", LLAMA_FUSED_CU, &name, launch)?;
    let _ = SOURCE.set(k.clone());
    Ok(k)
}

/// The RMSNorm kernel `base` for activations in `dt.0` and the weight in `dt.1` (x's dtype, or
/// f32 master weights: the `_pf32` variants).
fn rms_name(base: &str, (dtype, param): (DType, DType)) -> String {
    let pf32 = if param == DType::F32 && dtype != DType::F32 {
        "_pf32"
    } else {
        ""
    };
    format!("{base}_{}{pf32}", suffix(dtype))
}

/// (rows, n) of a [.., n] operand.
fn rows_n(m: &TensorMeta) -> (usize, usize) {
    let n = m.shape.last().copied().unwrap_or(1).max(1);
    (m.numel() / n, n)
}

fn bytes(m: &TensorMeta) -> usize {
    m.numel() * m.dtype.size_in_bytes()
}

/// One warp per row of `m`, 8 rows a block.
fn row_launch(m: &TensorMeta) -> Result<KernelLaunch> {
    let (rows, _) = rows_n(m);
    let mut l = KernelLaunch::linear(rows, ROWS_PER_BLOCK as u32)?;
    l.block = (32, ROWS_PER_BLOCK as u32, 1);
    Ok(l)
}

/// Inputs (x, w) or, `residual`, (x, a, w); outputs y or (s, y).
pub(super) fn rms_forward(dt: (DType, DType), eps: f32, residual: bool) -> Result<CudaKernel> {
    let base = if residual {
        "resrms_fwd"
    } else {
        "rmsnorm_fwd"
    };
    kernel(rms_name(base, dt), move |m| {
        let (rows, n) = rows_n(&m[0]);
        let x = bytes(&m[0]);
        let w = bytes(&m[m.len() - 1]);
        // The residual form reads x and a, writes s and y, and reads s back once (from L2).
        let t = if residual {
            Traffic::bytes(2 * x + w, 2 * x).with_flops(5 * rows * n)
        } else {
            Traffic::bytes(x + w, x).with_flops(4 * rows * n)
        };
        Ok(row_launch(&m[0])?
            .arg(rows as i64)
            .arg(n as i64)
            .arg(eps)
            .with_cost(OpClass::Row, t))
    })
}

/// Inputs (dy, x, w) or, `residual`, (ds, dy, x, w); outputs (dx, rstd f32 [rows]).
pub(super) fn rms_backward_dx(dt: (DType, DType), eps: f32, residual: bool) -> Result<CudaKernel> {
    let base = if residual {
        "resrms_bwd_dx"
    } else {
        "rmsnorm_bwd_dx"
    };
    kernel(rms_name(base, dt), move |m| {
        let x = &m[m.len() - 2];
        let (rows, n) = rows_n(x);
        let acts = if residual { 3 } else { 2 };
        let read = acts * bytes(x) + bytes(&m[m.len() - 1]);
        let t = Traffic::bytes(read, bytes(x) + rows * 4).with_flops(8 * rows * n);
        Ok(row_launch(x)?
            .arg(rows as i64)
            .arg(n as i64)
            .arg(eps)
            .with_cost(OpClass::Row, t))
    })
}

/// Chunks of [`DW_CHUNK`] rows of an operand [.., n].
pub(super) fn dw_chunks(m: &TensorMeta) -> usize {
    rows_n(m).0.div_ceil(DW_CHUNK).max(1)
}

/// Inputs (dy, x, rstd); output part f32 [chunks, n].
pub(super) fn rms_backward_dw(dtype: DType) -> Result<CudaKernel> {
    kernel(format!("rmsnorm_bwd_dw_{}", suffix(dtype)), |m| {
        let (rows, n) = rows_n(&m[0]);
        let chunks = dw_chunks(&m[0]);
        let t =
            Traffic::bytes(2 * bytes(&m[0]) + rows * 4, chunks * n * 4).with_flops(3 * rows * n);
        Ok(
            KernelLaunch::new((n.div_ceil(32) as u32, chunks as u32, 1), (32, 8, 1))
                .arg(rows as i64)
                .arg(n as i64)
                .arg(DW_CHUNK as i64)
                .with_cost(OpClass::Row, t),
        )
    })
}

/// Input part f32 [chunks, n]; output dw [n] in `param`.
pub(super) fn rms_backward_finish(param: DType) -> Result<CudaKernel> {
    kernel(format!("rmsnorm_bwd_finish_{}", suffix(param)), move |m| {
        let (chunks, n) = (m[0].shape[0], m[0].shape[1]);
        let t = Traffic::bytes(chunks * n * 4, n * param.size_in_bytes()).with_flops(chunks * n);
        Ok(KernelLaunch::linear(n, 256)?
            .arg(chunks as i64)
            .arg(n as i64)
            .with_cost(OpClass::Elementwise, t))
    })
}

/// Inputs (x [rows, w] with rows at positions row % t, cos, sin [t, d]); output y like x.
/// `rotated` heads of each row turn, by sin's sign `sign` (−1: the inverse, the backward).
pub(super) fn rope(dtype: DType, rotated: usize, sign: f32) -> Result<CudaKernel> {
    kernel(format!("rope_{}", suffix(dtype)), move |m| {
        let (x, tables) = (&m[0], &m[1]);
        let (t, d) = (tables.shape[0], tables.shape[1]);
        let w = m[0].shape.last().copied().unwrap_or(1).max(1);
        let rows = x.numel() / w;
        let n = x.numel();
        let t_read = 2 * bytes(tables);
        let traffic = Traffic::bytes(bytes(x) + t_read, bytes(x)).with_flops(3 * n);
        Ok(KernelLaunch::linear(n, 256)?
            .arg(rows as i64)
            .arg(t as i64)
            .arg(w as i64)
            .arg(d as i64)
            .arg(rotated as i64)
            .arg(sign)
            .with_cost(OpClass::Elementwise, traffic))
    })
}

/// SwiGLU forward: input h [.., 2n]; output y [.., n].
pub(super) fn swiglu_forward(dtype: DType) -> Result<CudaKernel> {
    kernel(format!("swiglu_fwd_{}", suffix(dtype)), |m| {
        let (rows, w) = rows_n(&m[0]);
        let n = w / 2;
        let t = Traffic::bytes(bytes(&m[0]), bytes(&m[0]) / 2).with_flops(6 * rows * n);
        Ok(KernelLaunch::linear(rows * n, 256)?
            .arg(rows as i64)
            .arg(n as i64)
            .with_cost(OpClass::Elementwise, t))
    })
}

/// SwiGLU backward: inputs (dy [.., n], h [.., 2n]); output dh [.., 2n].
pub(super) fn swiglu_backward(dtype: DType) -> Result<CudaKernel> {
    kernel(format!("swiglu_bwd_{}", suffix(dtype)), |m| {
        let (rows, w) = rows_n(&m[1]);
        let n = w / 2;
        let h = bytes(&m[1]);
        let t = Traffic::bytes(h + h / 2, h).with_flops(12 * rows * n);
        Ok(KernelLaunch::linear(rows * n, 256)?
            .arg(rows as i64)
            .arg(n as i64)
            .with_cost(OpClass::Elementwise, t))
    })
}
