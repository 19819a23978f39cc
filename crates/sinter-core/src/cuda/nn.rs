//! Index primitives on the device, each with its own backward kernel (the row kernels are in
//! `kernels/`: softmax, cross-entropy, LayerNorm): the row gathers
//! and deterministic scatter-adds of index_select / embedding / index_add.
//!
//! Indices that live on the device are checked there (`checks`: a bad one is reported, with
//! its value and position, at the next read of device values) and the gathers clamp them, so a
//! bad index is never a bad memory access. Indices the tensor layer already checked on the host
//! arrive with `checked` set and are not checked again.

use std::sync::Arc;

use sinter_cuda::ops::embedding as ke;
use sinter_cuda::{CudaDevice, DeviceBuffer};

use super::checks::check_indices;
use super::storage::{CudaStorage, DevView};
use super::{alloc, OnOp};
use crate::backend::{IndexGeom, Indices};
use crate::{DType, Error, Layout, Result};

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
