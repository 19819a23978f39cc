//! Device storage: a shared device buffer plus the device it lives on.

use std::sync::Arc;

use sinter_cuda::{CudaDevice, DeviceBuffer, Pool};

use crate::DType;

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
}
