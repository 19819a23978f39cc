//! A tensor's CUDA buffer, for code that hands device memory to a library directly (the
//! distributed layer's NCCL collectives read and write gradients in place) and for tests of
//! the allocator pools. CPU tensors have none.

use std::ops::Range;
use std::sync::Arc;

use sinter_cuda::{CudaDevice, DeviceBuffer, Pool};

use crate::cuda::CudaStorage;
use crate::storage::Storage;
use crate::{bail, DType, Result, Tensor};

impl Tensor {
    /// The allocator pool holding this tensor's device buffer (None for a CPU tensor).
    pub fn cuda_pool(&self) -> Option<Pool> {
        self.storage().as_cuda().map(|s| s.pool())
    }

    /// The device, the buffer and the element range of a CUDA tensor whose elements are
    /// contiguous (None for a CPU tensor or a strided view: call `contiguous()` first).
    pub fn cuda_buffer(&self) -> Option<(Arc<CudaDevice>, Arc<DeviceBuffer>, Range<usize>)> {
        let range = self.layout().contiguous_range()?;
        let s = self.storage();
        let c = s.as_cuda()?;
        Some((c.device().clone(), c.buffer().clone(), range))
    }

    /// A contiguous tensor of `shape` owning `buf` on `dev` (its dtype and length must fit).
    pub fn from_cuda_buffer(
        dev: &Arc<CudaDevice>,
        buf: Arc<DeviceBuffer>,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        if buf.dtype() != dtype || buf.len() != n {
            bail!(
                "from_cuda_buffer: a {} x {} buffer cannot hold a {dtype} tensor of shape {shape:?}",
                buf.len(),
                buf.dtype()
            );
        }
        let s = CudaStorage::new(dev.clone(), buf, dtype);
        Ok(Tensor::from_storage(Storage::Cuda(s), shape))
    }
}
