//! Device storage: a shared device buffer plus the device it lives on, and the views the
//! primitives read it through.

use std::sync::Arc;

use sinter_cuda::{CudaDevice, DevSlice, DeviceBuffer, Pool};

use super::{alloc, OnOp};
use crate::{DType, Layout, Result};

/// The elements of a tensor on a CUDA device. Cloning shares the buffer (views are layouts over
/// it); the buffer goes back to its allocator pool when the last holder drops it.
#[derive(Clone, Debug)]
pub struct CudaStorage {
    dev: Arc<CudaDevice>,
    buf: Arc<DeviceBuffer>,
    dtype: DType,
}

impl CudaStorage {
    pub(crate) fn new(dev: Arc<CudaDevice>, buf: Arc<DeviceBuffer>, dtype: DType) -> Self {
        debug_assert_eq!(buf.dtype(), dtype);
        CudaStorage { dev, buf, dtype }
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Elements.
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    /// The CUDA device ordinal.
    pub fn ordinal(&self) -> usize {
        self.dev.ordinal()
    }
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }
    pub fn buffer(&self) -> &Arc<DeviceBuffer> {
        &self.buf
    }
    /// The allocator pool the buffer belongs to.
    pub fn pool(&self) -> Pool {
        self.buf.pool()
    }
    /// Storage of `buf` on this storage's device.
    pub(crate) fn sibling(&self, buf: Arc<DeviceBuffer>, dtype: DType) -> CudaStorage {
        CudaStorage::new(self.dev.clone(), buf, dtype)
    }
    /// Replaces the buffer (in place, e.g. when it moves to another pool).
    pub(crate) fn replace_buffer(&mut self, buf: Arc<DeviceBuffer>) {
        debug_assert_eq!(buf.dtype(), self.dtype);
        self.buf = buf;
    }
    /// The buffer from element `off` to its end (a strided operand's data).
    pub(crate) fn tail(&self, off: usize, op: &'static str) -> Result<DevSlice<'_>> {
        self.buf
            .slice(off, self.buf.len().saturating_sub(off))
            .on(op)
    }
    /// The elements `l` addresses as a contiguous device window: this buffer's own memory when
    /// they are contiguous, else a gathered copy.
    pub(crate) fn window(&self, l: &Layout) -> Result<DevView> {
        if let Some(r) = l.contiguous_range() {
            return Ok(DevView {
                buf: self.buf.clone(),
                off: r.start,
                len: r.len(),
            });
        }
        let out = alloc(&self.dev, l.numel(), self.dtype)?;
        super::gather_into(&self.dev, &self.buf, l, &out, 0)?;
        Ok(DevView::whole(out))
    }
    /// [`CudaStorage::window`] in `dtype` (cast on the device when it differs).
    pub(crate) fn window_as(&self, l: &Layout, dtype: DType) -> Result<DevView> {
        let v = self.window(l)?;
        if self.dtype == dtype {
            return Ok(v);
        }
        let out = alloc(&self.dev, v.len, dtype)?;
        sinter_cuda::ops::copy::cast(&self.dev, v.slice(), out.as_slice()).on("to_dtype")?;
        Ok(DevView::whole(out))
    }
}

/// A window of device memory: `len` elements of `buf` from element `off`. Holding it keeps the
/// buffer alive; kernels read it through [`DevView::slice`].
#[derive(Clone, Debug)]
pub(crate) struct DevView {
    pub buf: Arc<DeviceBuffer>,
    pub off: usize,
    pub len: usize,
}

impl DevView {
    pub fn whole(buf: Arc<DeviceBuffer>) -> DevView {
        let len = buf.len();
        DevView { buf, off: 0, len }
    }
    pub fn slice(&self) -> DevSlice<'_> {
        self.buf
            .slice(self.off, self.len)
            .expect("a DevView lies inside its buffer")
    }
}
