//! Flash attention on the device: sinter-cuda's kernels (f16/bf16, head dims 64 and 128, views
//! read in place when their last dimension is contiguous). Other dtypes and head dims are
//! declined (`None`), and `fused::attention` runs its composite of device ops instead (same
//! values and gradients).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sinter_cuda::ops::flash_attention::{self as kfa, AttnShape, AttnView};
use sinter_cuda::{CudaError, DeviceBuffer};

use super::storage::CudaStorage;
use super::{alloc, OnOp};
use crate::backend::AttnGeom;
use crate::{DType, Layout, Result};

/// True when the flash attention kernels cover these operands: f16/bf16, head dim 64 or 128.
/// Layouts never disqualify: a view whose last dim is not contiguous is gathered first.
pub(crate) fn flash_applies(dtype: DType, head_dim: usize) -> bool {
    kfa::supported(dtype, head_dim) && !FLASH_UNCOMPILABLE.load(Ordering::Relaxed)
}

/// Set when NVRTC could not compile `flash_attention.cu` (CUDA headers without `crt/mma.h`, the
/// WMMA API): attention then runs as the composite instead of failing, and NVRTC is not retried.
static FLASH_UNCOMPILABLE: AtomicBool = AtomicBool::new(false);

fn shape_of(g: &AttnGeom) -> AttnShape {
    AttnShape {
        b: g.b,
        h: g.h,
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
struct Operand {
    buf: Arc<DeviceBuffer>,
    off: usize,
    strides: [usize; 3],
}

impl Operand {
    fn of(s: &CudaStorage, l: &Layout) -> Result<Operand> {
        let st = l.strides();
        if l.shape()[3] <= 1 || st[3] == 1 {
            return Ok(Operand {
                buf: s.buffer().clone(),
                off: l.offset(),
                strides: [st[0], st[1], st[2]],
            });
        }
        let c = s.window(l)?;
        let sh = l.shape();
        Ok(Operand {
            buf: c.buf,
            off: c.off,
            strides: [sh[1] * sh[2] * sh[3], sh[2] * sh[3], sh[3]],
        })
    }
    fn view(&self) -> Result<AttnView<'_>> {
        Ok(AttnView {
            data: self
                .buf
                .slice(self.off, self.buf.len().saturating_sub(self.off))
                .on("flash_attention")?,
            strides: self.strides,
        })
    }
}

/// Forward: Some((o, lse)) from the flash kernel, or None where it does not apply (or cannot
/// be compiled here).
pub(crate) fn attention(
    q: (&CudaStorage, &Layout),
    k: (&CudaStorage, &Layout),
    v: (&CudaStorage, &Layout),
    g: &AttnGeom,
) -> Result<Option<(CudaStorage, CudaStorage)>> {
    let dtype = q.0.dtype();
    if !flash_applies(dtype, g.d) {
        return Ok(None);
    }
    let op = "flash_attention";
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
    match kfa::flash_forward(
        dev,
        &s,
        qo.view()?,
        ko.view()?,
        vo.view()?,
        o.as_slice(),
        lse.as_slice(),
    ) {
        Ok(()) => Ok(Some((q.0.sibling(o, dtype), q.0.sibling(lse, DType::F32)))),
        Err(CudaError::Compile { .. }) => {
            FLASH_UNCOMPILABLE.store(true, Ordering::Relaxed);
            Ok(None)
        }
        Err(e) => Err(e).on(op),
    }
}

/// Backward: (dq, dk, dv) from the operands, the forward's output `o` and log-sum-exp, and the
/// output gradient.
pub(crate) fn attention_backward(
    q: (&CudaStorage, &Layout),
    k: (&CudaStorage, &Layout),
    v: (&CudaStorage, &Layout),
    o: (&CudaStorage, &Layout),
    grad: (&CudaStorage, &Layout),
    lse: &CudaStorage,
    g: &AttnGeom,
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let op = "flash_attention";
    let s = shape_of(g);
    let dev = q.0.device();
    let dtype = q.0.dtype();
    let (qo, ko, vo) = (
        Operand::of(q.0, q.1)?,
        Operand::of(k.0, k.1)?,
        Operand::of(v.0, v.1)?,
    );
    let (yv, gv) = (o.0.window(o.1)?, grad.0.window_as(grad.1, dtype)?);
    let rows = s.b * s.h * s.tq;
    let dq = alloc(dev, rows * s.d, dtype)?;
    let dk = alloc(dev, s.b * s.h * s.tk * s.d, dtype)?;
    let dv = alloc(dev, s.b * s.h * s.tk * s.d, dtype)?;
    kfa::flash_backward(
        dev,
        &s,
        qo.view()?,
        ko.view()?,
        vo.view()?,
        yv.slice(),
        gv.slice(),
        lse.buffer().as_slice(),
        dq.as_slice(),
        dk.as_slice(),
        dv.as_slice(),
    )
    .on(op)?;
    let w = |b| q.0.sibling(b, dtype);
    Ok((w(dq), w(dk), w(dv)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_or_composite() {
        assert!(flash_applies(DType::BF16, 64));
        assert!(flash_applies(DType::F16, 128));
        assert!(!flash_applies(DType::F32, 64), "f32: composite");
        assert!(!flash_applies(DType::BF16, 80), "head dim 80: composite");
    }
}
