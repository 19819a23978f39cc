//! Flash attention on the device: the kernels of `flash_attention.cu` through the plans of
//! `cuda_flash.rs` (f16/bf16, head dims 32, 64 and 128, views read in place when their last
//! dimension is contiguous). Other dtypes and head dims are
//! declined (`None`), and the op runs its composite of device ops instead (same values and
//! gradients).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sinter_cuda::{CudaDevice, CudaError, DeviceBuffer};

use super::cuda_flash::{self as kfa, AttnShape, AttnView};
use super::geom::AttnGeom;
use crate::cuda::storage::CudaStorage;
use crate::cuda::{alloc, OnOp};
use crate::{DType, Layout, Result};

/// True when the flash attention kernels cover these operands: f16/bf16, head dim 32, 64 or 128.
/// Layouts never disqualify: a view whose last dim is not contiguous is gathered first.
pub(super) fn flash_applies(dtype: DType, head_dim: usize) -> bool {
    kfa::supported(dtype, head_dim) && !FLASH_UNCOMPILABLE.load(Ordering::Relaxed)
}

/// Set when NVRTC could not compile `flash_attention.cu` (CUDA headers without `crt/mma.h`, the
/// WMMA API): attention then runs as the composite instead of failing, and NVRTC is not retried.
static FLASH_UNCOMPILABLE: AtomicBool = AtomicBool::new(false);

fn shape_of(g: &AttnGeom) -> AttnShape {
    AttnShape {
        b: g.b,
        h: g.h,
        kv_h: g.kv_h,
        tq: g.tq,
        tk: g.tk,
        d: g.d,
        causal: g.causal,
        scale: g.scale,
    }
}

/// A [b, h, t, d] attention operand as the kernels read it: the storage's own memory when its
/// last dim is contiguous (e.g. heads narrowed out of a packed qkv projection), else a
/// contiguous copy.
pub(super) struct Operand {
    pub(super) buf: Arc<DeviceBuffer>,
    pub(super) off: usize,
    pub(super) strides: [usize; 3],
}

impl Operand {
    pub(super) fn of(s: &CudaStorage, l: &Layout) -> Result<Operand> {
        let st = l.strides();
        if l.shape()[3] <= 1 || st[3] == 1 {
            return Ok(Operand {
                buf: s.buffer().clone(),
                off: l.offset(),
                strides: [st[0], st[1], st[2]],
            });
        }
        let c = s.window(l)?;
        Ok(Operand {
            buf: c.buf,
            off: c.off,
            strides: dense(l.shape()),
        })
    }
    fn view(&self) -> Result<AttnView<'_>> {
        view_of(&self.buf, self.off, self.strides)
    }
}

/// A view of `len` elements of `buf` from `off` with these [batch, head, row] strides.
fn view_of(buf: &DeviceBuffer, off: usize, strides: [usize; 3]) -> Result<AttnView<'_>> {
    Ok(AttnView {
        data: buf
            .slice(off, buf.len().saturating_sub(off))
            .on("flash_attention")?,
        strides,
    })
}

/// The [batch, head, row] strides of a contiguous [b, h, t, d] tensor.
pub(super) fn dense(shape: &[usize]) -> [usize; 3] {
    let [_, h, t, d] = [shape[0], shape[1], shape[2], shape[3]];
    [h * t * d, t * d, d]
}

/// Runs the forward kernel; None (and the composite from then on) when NVRTC cannot compile it.
fn forward_or_decline(
    dev: &CudaDevice,
    s: &AttnShape,
    views: [AttnView<'_>; 4],
    lse: &DeviceBuffer,
) -> Result<bool> {
    let [q, k, v, o] = views;
    match kfa::flash_forward(dev, s, q, k, v, o, lse.as_slice()) {
        Ok(()) => Ok(true),
        Err(CudaError::Compile { .. }) => {
            FLASH_UNCOMPILABLE.store(true, Ordering::Relaxed);
            Ok(false)
        }
        Err(e) => Err(e).on("flash_attention"),
    }
}

/// Forward: Some((o, lse)) from the flash kernel, or None where it does not apply (or cannot
/// be compiled here).
pub(super) fn attention(
    q: (&CudaStorage, &Layout),
    k: (&CudaStorage, &Layout),
    v: (&CudaStorage, &Layout),
    g: &AttnGeom,
) -> Result<Option<(CudaStorage, CudaStorage)>> {
    let dtype = q.0.dtype();
    if !flash_applies(dtype, g.d) {
        return Ok(None);
    }
    let s = shape_of(g);
    let dev = q.0.device();
    let (qo, ko, vo) = (
        Operand::of(q.0, q.1)?,
        Operand::of(k.0, k.1)?,
        Operand::of(v.0, v.1)?,
    );
    let rows = s.b * s.h * s.tq;
    let o = alloc(dev, rows * s.d, dtype)?;
    let lse = alloc(dev, rows, DType::F32)?;
    let views = [
        qo.view()?,
        ko.view()?,
        vo.view()?,
        view_of(&o, 0, dense(&[g.b, g.h, g.tq, g.d]))?,
    ];
    if !forward_or_decline(dev, &s, views, &lse)? {
        return Ok(None);
    }
    Ok(Some((q.0.sibling(o, dtype), q.0.sibling(lse, DType::F32))))
}

/// Backward: (dq, dk, dv) from the operands, the forward's output `o` and log-sum-exp, and the
/// output gradient (read in place when its last dim is contiguous, e.g. the transposed view
/// a head merge hands back).
pub(super) fn attention_backward(
    q: (&CudaStorage, &Layout),
    k: (&CudaStorage, &Layout),
    v: (&CudaStorage, &Layout),
    o: (&CudaStorage, &Layout),
    grad: (&CudaStorage, &Layout),
    lse: &CudaStorage,
    g: &AttnGeom,
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let s = shape_of(g);
    let dev = q.0.device();
    let dtype = q.0.dtype();
    let (qo, ko, vo, oo) = (
        Operand::of(q.0, q.1)?,
        Operand::of(k.0, k.1)?,
        Operand::of(v.0, v.1)?,
        Operand::of(o.0, o.1)?,
    );
    let go = gradient_operand(grad, dtype)?;
    let dq = alloc(dev, s.b * s.h * s.tq * s.d, dtype)?;
    let dk = alloc(dev, s.b * s.h * s.tk * s.d, dtype)?;
    let dv = alloc(dev, s.b * s.h * s.tk * s.d, dtype)?;
    kfa::flash_backward(
        dev,
        &s,
        qo.view()?,
        ko.view()?,
        vo.view()?,
        oo.view()?,
        go.view()?,
        lse.buffer().as_slice(),
        view_of(&dq, 0, dense(&[g.b, g.h, g.tq, g.d]))?,
        view_of(&dk, 0, dense(&[g.b, g.h, g.tk, g.d]))?,
        view_of(&dv, 0, dense(&[g.b, g.h, g.tk, g.d]))?,
    )
    .on("flash_attention")?;
    let w = |b| q.0.sibling(b, dtype);
    Ok((w(dq), w(dk), w(dv)))
}

/// The output gradient [b, h, tq, d] as the kernels read it: in place when it has the operands'
/// dtype, else a contiguous cast.
pub(super) fn gradient_operand(grad: (&CudaStorage, &Layout), dtype: DType) -> Result<Operand> {
    if grad.0.dtype() == dtype {
        return Operand::of(grad.0, grad.1);
    }
    let c = grad.0.window_as(grad.1, dtype)?;
    Ok(Operand {
        buf: c.buf,
        off: c.off,
        strides: dense(grad.1.shape()),
    })
}

/// Columns of a packed projection's row: (h + 2·kv_h)·d.
fn packed_width(g: &AttnGeom) -> usize {
    (g.h + 2 * g.kv_h) * g.d
}

/// The [b, heads, t, d] views of q, k and v inside a packed [b, t, (h + 2·kv_h)·d] projection
/// (and of dq, dk and dv inside its gradient): the query heads at element offset 0, the key
/// heads at h·d and the value heads at (h + kv_h)·d, row stride the projection's width.
fn head_groups<'a>(buf: &'a DeviceBuffer, off: usize, g: &AttnGeom) -> Result<[AttnView<'a>; 3]> {
    let w = packed_width(g);
    let strides = [g.tq * w, g.d, w];
    Ok([
        view_of(buf, off, strides)?,
        view_of(buf, off + g.h * g.d, strides)?,
        view_of(buf, off + (g.h + g.kv_h) * g.d, strides)?,
    ])
}

/// Self-attention straight from a packed qkv [b, t, (h + 2·kv_h)·d] (GPT-2's thirds when
/// kv_h = h, Llama's grouped heads otherwise: each kv head read in place by its query heads,
/// never repeated): Some((y, lse)) with
/// y [b, t, h·d], the heads merged by the kernel's own stores (no split or merge copies), or
/// None where the flash kernels do not apply.
pub(super) fn attention_packed(
    qkv: (&CudaStorage, &Layout),
    g: &AttnGeom,
) -> Result<Option<(CudaStorage, CudaStorage)>> {
    let dtype = qkv.0.dtype();
    if !flash_applies(dtype, g.d) {
        return Ok(None);
    }
    let s = shape_of(g);
    let dev = qkv.0.device();
    let x = qkv.0.window(qkv.1)?;
    let c = g.h * g.d;
    let rows = g.b * g.h * g.tq;
    let y = alloc(dev, rows * g.d, dtype)?;
    let lse = alloc(dev, rows, DType::F32)?;
    let [q, k, v] = head_groups(&x.buf, x.off, g)?;
    let merged = view_of(&y, 0, [g.tq * c, g.d, c])?;
    if !forward_or_decline(dev, &s, [q, k, v, merged], &lse)? {
        return Ok(None);
    }
    Ok(Some((
        qkv.0.sibling(y, dtype),
        qkv.0.sibling(lse, DType::F32),
    )))
}

/// dqkv [b, t, (h + 2·kv_h)·d] of [`attention_packed`]: the backward kernels write dq, dk and dv
/// straight into its head groups (every element once: no zero fill, no sum of partial
/// gradients; a kv head's dk and dv are summed over its query heads inside the kernel).
pub(super) fn attention_packed_backward(
    qkv: (&CudaStorage, &Layout),
    y: (&CudaStorage, &Layout),
    grad: (&CudaStorage, &Layout),
    lse: &CudaStorage,
    g: &AttnGeom,
) -> Result<CudaStorage> {
    let s = shape_of(g);
    let dev = qkv.0.device();
    let dtype = qkv.0.dtype();
    let c = g.h * g.d;
    let merged = [g.tq * c, g.d, c];
    let x = qkv.0.window(qkv.1)?;
    let yv = y.0.window(y.1)?;
    let gv = grad.0.window_as(grad.1, dtype)?;
    let dqkv = alloc(dev, g.b * g.tq * packed_width(g), dtype)?;
    let [q, k, v] = head_groups(&x.buf, x.off, g)?;
    let [dq, dk, dv] = head_groups(&dqkv, 0, g)?;
    kfa::flash_backward(
        dev,
        &s,
        q,
        k,
        v,
        view_of(&yv.buf, yv.off, merged)?,
        view_of(&gv.buf, gv.off, merged)?,
        lse.buffer().as_slice(),
        dq,
        dk,
        dv,
    )
    .on("flash_attention")?;
    Ok(qkv.0.sibling(dqkv, dtype))
}
