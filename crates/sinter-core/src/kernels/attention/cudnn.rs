//! Attention through cuDNN's fused SDPA (`sinter_cuda::cudnn::sdpa`) on CUDA storages: the
//! same operands, outputs and log-sum-exp as the flash kernels of `cuda.rs` (the stats are the
//! same fp32 natural-log log-sum-exp per query row), so either backward can follow either
//! forward. Each function answers None where cuDNN does not take the case — the caller runs
//! the flash kernel — and a cuDNN failure warns once and turns cuDNN off for the process.
//!
//! The forward is taken only when the backward that follows is covered too (cuDNN's own, or
//! the flash kernel's), so a training step never ends up with a forward no backward matches.

use std::sync::atomic::{AtomicBool, Ordering};

use sinter_cuda::cudnn::sdpa::{
    self as sdpa, SdpaBackward, SdpaForward, SdpaLayout, SdpaPass, SdpaProblem,
};
use sinter_cuda::cudnn::Ran;
use sinter_cuda::{CudaDevice, DeviceBuffer};

use super::cuda::{dense, flash_applies, gradient_operand, Operand};
use super::geom::AttnGeom;
use super::select::{attention_backend, AttentionBackend};
use crate::cuda::storage::CudaStorage;
use crate::cuda::{alloc, OnOp};
use crate::{DType, Layout, Result};

/// Set after a cuDNN failure: attention stays on the flash kernels from then on.
static FAILED: AtomicBool = AtomicBool::new(false);
/// Whether the "SINTER_ATTENTION=cudnn but cuDNN cannot take this" note was printed.
static NOTED: AtomicBool = AtomicBool::new(false);

/// cuDNN's SDPA takes grouped-query attention itself (its frontend documents K and V with
/// fewer heads than Q, a divisor of them), but `SdpaProblem` (and the emulated device's host
/// execution of the graph) has one head count: grouped heads are declined (the flash kernels
/// read them in place) until sinter-cuda's SDPA graph learns a kv head count.
fn problem(g: &AttnGeom, dtype: DType) -> SdpaProblem {
    SdpaProblem {
        b: g.b,
        h: g.h,
        tq: g.tq,
        tk: g.tk,
        d: g.d,
        dtype,
        causal: g.causal,
        scale: g.scale,
    }
}

/// Whether cuDNN should run `pass` of this problem on `dev`: selected, not failed before,
/// supported by the loaded cuDNN, and (for the forward) with a backward to follow.
pub(super) fn takes(dev: &CudaDevice, p: &SdpaProblem, pass: SdpaPass) -> bool {
    let chosen = attention_backend();
    if !chosen.tries_cudnn() || FAILED.load(Ordering::Relaxed) {
        return false;
    }
    // This path has never run on a GPU: on a real device cuDNN is opt-in
    // (`SINTER_ATTENTION=cudnn`) until a GPU run of `bench/gpu/prove.sh` has checked it against
    // flash (PyTorch made its cuDNN attention opt-in after correctness reports). The emulated
    // device takes it by default, so CI exercises it and the cost model prices it.
    if chosen == AttentionBackend::Auto && !sinter_cuda::runtime::is_emulated() {
        return false;
    }
    let mut ok = sdpa::supports(dev, p, pass);
    if ok.is_ok() && pass == SdpaPass::Forward && !flash_applies(p.dtype, p.d) {
        ok = sdpa::supports(dev, p, SdpaPass::Backward)
            .map_err(|why| format!("no backward would follow: {why}"));
    }
    match ok {
        Ok(()) => true,
        Err(why) => {
            // A backward cuDNN declines (e.g. the composite graph's key-count rule) runs flash
            // on cuDNN's stats: expected, not news.
            let news = pass == SdpaPass::Forward;
            if chosen == AttentionBackend::Cudnn && news && !NOTED.swap(true, Ordering::Relaxed) {
                eprintln!("sinter: SINTER_ATTENTION=cudnn, but cuDNN cannot take this attention ({why}); using sinter's flash kernel where it cannot");
            }
            false
        }
    }
}

/// True when every pointer offset and stride is a multiple of 8 elements: cuDNN's tensors
/// promise 16-byte alignment for f16/bf16.
fn aligned(offsets: &[usize], layout: &SdpaLayout) -> bool {
    let l = layout;
    offsets.iter().all(|o| o % 8 == 0)
        && [l.q, l.k, l.v, l.o, l.d_o, l.dq, l.dk, l.dv]
            .iter()
            .flatten()
            .all(|s| s % 8 == 0)
}

#[cfg(test)]
thread_local! {
    static CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many cuDNN attention calls this thread has run (what the tests check the selection by).
#[cfg(test)]
pub(super) fn calls_on_this_thread() -> usize {
    CALLS.with(std::cell::Cell::get)
}

/// What a call's result means for the caller: done, or run the flash kernel instead.
fn outcome(r: sinter_cuda::Result<Ran>) -> bool {
    match r {
        Ok(Ran::Done) => {
            #[cfg(test)]
            CALLS.with(|c| c.set(c.get() + 1));
            true
        }
        Ok(Ran::Unsupported(_)) => false,
        Err(e) => {
            if !FAILED.swap(true, Ordering::Relaxed) {
                eprintln!("sinter: cuDNN fused attention failed ({e}); attention runs sinter's flash kernel from now on");
            }
            false
        }
    }
}

fn slice<'a>(buf: &'a DeviceBuffer, off: usize) -> Result<sinter_cuda::DevSlice<'a>> {
    buf.slice(off, buf.len().saturating_sub(off))
        .on("cudnn attention")
}

/// Forward: Some((o [b, h, tq, d], stats)) or None (run flash).
pub(super) fn attention(
    q: (&CudaStorage, &Layout),
    k: (&CudaStorage, &Layout),
    v: (&CudaStorage, &Layout),
    g: &AttnGeom,
) -> Result<Option<(CudaStorage, CudaStorage)>> {
    let (dev, dtype) = (q.0.device(), q.0.dtype());
    let p = problem(g, dtype);
    if !takes(dev, &p, SdpaPass::Forward) {
        return Ok(None);
    }
    let (qo, ko, vo) = (
        Operand::of(q.0, q.1)?,
        Operand::of(k.0, k.1)?,
        Operand::of(v.0, v.1)?,
    );
    let layout = SdpaLayout {
        q: qo.strides,
        k: ko.strides,
        v: vo.strides,
        ..SdpaLayout::dense(&p)
    };
    if !aligned(&[qo.off, ko.off, vo.off], &layout) {
        return Ok(None);
    }
    let rows = g.b * g.h * g.tq;
    let o = alloc(dev, rows * g.d, dtype)?;
    let stats = alloc(dev, rows, DType::F32)?;
    let ops = SdpaForward {
        q: slice(&qo.buf, qo.off)?,
        k: slice(&ko.buf, ko.off)?,
        v: slice(&vo.buf, vo.off)?,
        o: o.as_slice(),
        stats: stats.as_slice(),
    };
    if !outcome(sdpa::sdpa_forward(dev, &p, &layout, ops)) {
        return Ok(None);
    }
    Ok(Some((
        q.0.sibling(o, dtype),
        q.0.sibling(stats, DType::F32),
    )))
}

/// Backward: Some((dq, dk, dv)) or None (run flash's backward, which reads the same stats).
pub(super) fn attention_backward(
    [q, k, v, o, grad]: [(&CudaStorage, &Layout); 5],
    stats: &CudaStorage,
    g: &AttnGeom,
) -> Result<Option<(CudaStorage, CudaStorage, CudaStorage)>> {
    let (dev, dtype) = (q.0.device(), q.0.dtype());
    let p = problem(g, dtype);
    if !takes(dev, &p, SdpaPass::Backward) {
        return Ok(None);
    }
    let (qo, ko, vo, oo) = (
        Operand::of(q.0, q.1)?,
        Operand::of(k.0, k.1)?,
        Operand::of(v.0, v.1)?,
        Operand::of(o.0, o.1)?,
    );
    let go = gradient_operand(grad, dtype)?;
    let layout = SdpaLayout {
        q: qo.strides,
        k: ko.strides,
        v: vo.strides,
        o: oo.strides,
        d_o: go.strides,
        ..SdpaLayout::dense(&p)
    };
    if !aligned(&[qo.off, ko.off, vo.off, oo.off, go.off], &layout) {
        return Ok(None);
    }
    let dq = alloc(dev, g.b * g.h * g.tq * g.d, dtype)?;
    let dk = alloc(dev, g.b * g.h * g.tk * g.d, dtype)?;
    let dv = alloc(dev, g.b * g.h * g.tk * g.d, dtype)?;
    debug_assert_eq!(layout.dq, dense(&[g.b, g.h, g.tq, g.d]));
    let ops = SdpaBackward {
        q: slice(&qo.buf, qo.off)?,
        k: slice(&ko.buf, ko.off)?,
        v: slice(&vo.buf, vo.off)?,
        o: slice(&oo.buf, oo.off)?,
        d_o: slice(&go.buf, go.off)?,
        stats: stats.buffer().as_slice(),
        dq: dq.as_slice(),
        dk: dk.as_slice(),
        dv: dv.as_slice(),
    };
    if !outcome(sdpa::sdpa_backward(dev, &p, &layout, ops)) {
        return Ok(None);
    }
    let w = |b| q.0.sibling(b, dtype);
    Ok(Some((w(dq), w(dk), w(dv))))
}

/// Packed forward: q, k and v read in place from qkv [b, t, 3·h·d], y [b, t, h·d] written as
/// the output projection reads it. Some((y, stats)) or None.
pub(super) fn attention_packed(
    qkv: (&CudaStorage, &Layout),
    g: &AttnGeom,
) -> Result<Option<(CudaStorage, CudaStorage)>> {
    let (dev, dtype) = (qkv.0.device(), qkv.0.dtype());
    if g.kv_h != g.h {
        return Ok(None); // grouped heads: see `problem`
    }
    let p = problem(g, dtype);
    if !takes(dev, &p, SdpaPass::Forward) {
        return Ok(None);
    }
    let layout = SdpaLayout::packed(g.tq, g.h, g.d);
    let x = qkv.0.window(qkv.1)?;
    let c = g.h * g.d;
    if !aligned(&[x.off], &layout) {
        return Ok(None);
    }
    let rows = g.b * g.h * g.tq;
    let y = alloc(dev, rows * g.d, dtype)?;
    let stats = alloc(dev, rows, DType::F32)?;
    let ops = SdpaForward {
        q: slice(&x.buf, x.off)?,
        k: slice(&x.buf, x.off + c)?,
        v: slice(&x.buf, x.off + 2 * c)?,
        o: y.as_slice(),
        stats: stats.as_slice(),
    };
    if !outcome(sdpa::sdpa_forward(dev, &p, &layout, ops)) {
        return Ok(None);
    }
    Ok(Some((
        qkv.0.sibling(y, dtype),
        qkv.0.sibling(stats, DType::F32),
    )))
}

/// Packed backward: dq, dk and dv written straight into the thirds of dqkv [b, t, 3·h·d].
/// Some(dqkv) or None.
pub(super) fn attention_packed_backward(
    qkv: (&CudaStorage, &Layout),
    y: (&CudaStorage, &Layout),
    grad: (&CudaStorage, &Layout),
    stats: &CudaStorage,
    g: &AttnGeom,
) -> Result<Option<CudaStorage>> {
    let (dev, dtype) = (qkv.0.device(), qkv.0.dtype());
    if g.kv_h != g.h {
        return Ok(None); // grouped heads: see `problem`
    }
    let p = problem(g, dtype);
    if !takes(dev, &p, SdpaPass::Backward) {
        return Ok(None);
    }
    let layout = SdpaLayout::packed(g.tq, g.h, g.d);
    let x = qkv.0.window(qkv.1)?;
    let yv = y.0.window(y.1)?;
    let gv = grad.0.window_as(grad.1, dtype)?;
    if !aligned(&[x.off, yv.off, gv.off], &layout) {
        return Ok(None);
    }
    let c = g.h * g.d;
    let dqkv = alloc(dev, g.b * g.tq * 3 * c, dtype)?;
    let ops = SdpaBackward {
        q: slice(&x.buf, x.off)?,
        k: slice(&x.buf, x.off + c)?,
        v: slice(&x.buf, x.off + 2 * c)?,
        o: slice(&yv.buf, yv.off)?,
        d_o: slice(&gv.buf, gv.off)?,
        stats: stats.buffer().as_slice(),
        dq: slice(&dqkv, 0)?,
        dk: slice(&dqkv, c)?,
        dv: slice(&dqkv, 2 * c)?,
    };
    if !outcome(sdpa::sdpa_backward(dev, &p, &layout, ops)) {
        return Ok(None);
    }
    Ok(Some(qkv.0.sibling(dqkv, dtype)))
}
