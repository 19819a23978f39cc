//! Row and index primitives on the device, each with its own backward kernel: cross-entropy
//! (softmax and LayerNorm are kernels: `kernels/softmax/`, `kernels/layer_norm/`), and the row gathers
//! and deterministic scatter-adds of index_select / embedding / index_add.
//!
//! Indices that live on the device are checked there (`checks`: a bad one is reported, with
//! its value and position, at the next read of device values) and the gathers clamp them, so a
//! bad index is never a bad memory access. Indices the tensor layer already checked on the host
//! arrive with `checked` set and are not checked again.

use std::sync::Arc;

use sinter_cuda::ops::cross_entropy::{self as kce, LossGrad};
use sinter_cuda::ops::embedding as ke;
use sinter_cuda::{CudaDevice, DeviceBuffer};

use super::checks::check_indices;
use super::storage::{CudaStorage, DevView};
use super::{alloc, OnOp};
use crate::backend::{CrossEntropyOut, IndexGeom, Indices};
use crate::{DType, Error, Layout, Result};

fn rows_of(l: &Layout) -> (usize, usize) {
    let n = l.shape().last().copied().unwrap_or(1);
    (l.numel().checked_div(n).unwrap_or(0), n)
}

fn float_only(op: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        return Ok(());
    }
    Err(Error::UnsupportedDType {
        op,
        dtype,
        supported: "f32, f16 or bf16",
    })
}

/// The indices as a contiguous device window, checked on the device unless already checked.
fn device_indices(
    dev: &CudaDevice,
    ids: &Indices<'_, CudaStorage>,
    bound: usize,
    ignore: Option<i64>,
) -> Result<DevView> {
    if ids.ids.dtype() != DType::I64 {
        return Err(Error::DTypeMismatch {
            op: ids.what.name(),
            expected: DType::I64,
            got: ids.ids.dtype(),
        });
    }
    let v = ids.ids.window(ids.layout)?;
    if !ids.checked {
        check_indices(dev, v.slice(), bound, ignore, ids.what)?;
    }
    Ok(v)
}

/// Cross-entropy of each row of logits [rows, c] against i64 targets (0 for a row whose target
/// is `ignore_index`), and each row's statistics for the backward (max, ln Σ e^(x − max));
/// both f32, on the device.
pub(crate) fn cross_entropy(
    logits: &CudaStorage,
    l: &Layout,
    targets: Indices<'_, CudaStorage>,
    ignore_index: i64,
) -> Result<CrossEntropyOut<CudaStorage>> {
    let op = "cross_entropy";
    float_only(op, logits.dtype())?;
    let dev = logits.device();
    let (rows, c) = rows_of(l);
    let tv = device_indices(dev, &targets, c, Some(ignore_index))?;
    let xv = logits.window(l)?;
    let loss = alloc(dev, rows, DType::F32)?;
    let stats = alloc(dev, rows * kce::STATS_PER_ROW, DType::F32)?;
    kce::cross_entropy_forward(
        dev,
        xv.slice(),
        tv.slice(),
        loss.as_slice(),
        Some(stats.as_slice()),
        rows,
        c,
        ignore_index,
    )
    .on(op)?;
    let f = |b| logits.sibling(b, DType::F32);
    Ok(CrossEntropyOut {
        loss: f(loss),
        stats: f(stats),
    })
}

/// d Σ_r g_r loss_r / d logits = (softmax − onehot) · g_r per row, in the logits' dtype.
pub(crate) fn cross_entropy_backward(
    logits: &CudaStorage,
    l: &Layout,
    targets: Indices<'_, CudaStorage>,
    stats: &CudaStorage,
    grad: (&CudaStorage, &Layout),
    ignore_index: i64,
) -> Result<CudaStorage> {
    let op = "cross_entropy";
    let (dev, dtype) = (logits.device(), logits.dtype());
    let (rows, c) = rows_of(l);
    let tv = device_indices(dev, &targets, c, Some(ignore_index))?;
    let gv = grad.0.window_as(grad.1, DType::F32)?;
    let xv = logits.window(l)?;
    let dx = alloc(dev, xv.len, dtype)?;
    kce::cross_entropy_backward(
        dev,
        xv.slice(),
        tv.slice(),
        stats.buffer().as_slice(),
        LossGrad::PerRow(gv.slice()),
        dx.as_slice(),
        rows,
        c,
        ignore_index,
        1.0,
    )
    .on(op)?;
    Ok(logits.sibling(dx, dtype))
}

/// Checked (unless already) and flattened ids: [outer · k] rows of x viewed as
/// [outer · n, inner].
fn flat_ids(
    dev: &CudaDevice,
    ids: &Indices<'_, CudaStorage>,
    g: IndexGeom,
) -> Result<Arc<DeviceBuffer>> {
    let iv = device_indices(dev, ids, g.n, None)?;
    let flat = alloc(dev, g.outer * iv.len, DType::I64)?;
    sinter_cuda::ops::int::index_flat(dev, iv.slice(), flat.as_slice(), g.outer, g.n)
        .on(ids.what.name())?;
    Ok(flat)
}

/// out[o, j, i] = x[o, ids[j], i]: float rows through the embedding kernel, i64 rows through
/// the integer gather.
pub(crate) fn index_select(
    x: &CudaStorage,
    l: &Layout,
    ids: Indices<'_, CudaStorage>,
    g: IndexGeom,
) -> Result<CudaStorage> {
    let (dev, dtype) = (x.device(), x.dtype());
    let flat = flat_ids(dev, &ids, g)?;
    let k = ids.layout.numel();
    let xv = x.window(l)?;
    let out = alloc(dev, g.outer * k * g.inner, dtype)?;
    if dtype.is_float() {
        ke::embedding_forward(
            dev,
            xv.slice(),
            flat.as_slice(),
            out.as_slice(),
            g.outer * g.n,
            g.inner,
        )
        .on("index_select")?;
    } else {
        sinter_cuda::ops::int::gather_rows_i64(
            dev,
            xv.slice(),
            flat.as_slice(),
            out.as_slice(),
            g.outer * g.n,
            g.inner,
        )
        .on("index_select")?;
    }
    Ok(x.sibling(out, dtype))
}

/// The deterministic scatter-add of grad_out rows into zeros of x's shape (written, not
/// accumulated: the kernel sums each destination row's sources in order).
pub(crate) fn index_select_backward(
    gy: &CudaStorage,
    l: &Layout,
    ids: Indices<'_, CudaStorage>,
    g: IndexGeom,
) -> Result<CudaStorage> {
    let (dev, dtype) = (gy.device(), gy.dtype());
    float_only("index_select", dtype)?;
    let flat = flat_ids(dev, &ids, g)?;
    let gv = gy.window(l)?;
    let gx = alloc(dev, g.outer * g.n * g.inner, dtype)?;
    ke::embedding_backward(
        dev,
        gv.slice(),
        flat.as_slice(),
        gx.as_slice(),
        g.outer * g.n,
        g.inner,
        false,
    )
    .on("index_select")?;
    Ok(gy.sibling(gx, dtype))
}

/// A copy of x with `src` rows (used in x's dtype) added at `ids` along the middle dimension.
pub(crate) fn index_add(
    x: &CudaStorage,
    l: &Layout,
    ids: Indices<'_, CudaStorage>,
    src: (&CudaStorage, &Layout),
    g: IndexGeom,
) -> Result<CudaStorage> {
    let (dev, dtype) = (x.device(), x.dtype());
    float_only("index_add", dtype)?;
    let xv = x.window(l)?;
    let out = alloc(dev, xv.len, dtype)?;
    dev.copy(xv.slice(), out.as_slice()).on("index_add")?;
    let flat = flat_ids(dev, &ids, g)?;
    let sv = src.0.window_as(src.1, dtype)?;
    ke::embedding_backward(
        dev,
        sv.slice(),
        flat.as_slice(),
        out.as_slice(),
        g.outer * g.n,
        g.inner,
        true,
    )
    .on("index_add")?;
    Ok(x.sibling(out, dtype))
}
