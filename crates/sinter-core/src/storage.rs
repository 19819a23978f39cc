//! Device dispatch: `Storage` is the one place that matches on where data lives. Each method
//! is a backend primitive; the CPU arm calls into `cpu`, and a CUDA arm slots in beside it.

use crate::cpu::CpuStorage;
use crate::cuda::CudaStorage;
use crate::{DType, Device};

#[derive(Clone, Debug)]
pub enum Storage {
    Cpu(CpuStorage),
    Cuda(CudaStorage),
}

/// Reaching a CPU kernel with device data is a bug in the dispatch (an op without its
/// `is_cuda()` branch), never a user error: say so plainly.
const NOT_CPU: &str = "internal error: a CPU kernel was reached with a CUDA tensor (an op is missing its CUDA dispatch; please report it)";

impl Storage {
    pub fn dtype(&self) -> DType {
        match self {
            Storage::Cpu(s) => s.dtype(),
            Storage::Cuda(s) => s.dtype(),
        }
    }
    pub fn device(&self) -> Device {
        match self {
            Storage::Cpu(_) => Device::Cpu,
            Storage::Cuda(s) => Device::Cuda(s.ordinal()),
        }
    }
    pub fn len(&self) -> usize {
        match self {
            Storage::Cpu(s) => s.len(),
            Storage::Cuda(s) => s.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The host data. Only CPU code paths call this (every op dispatches CUDA tensors to
    /// `crate::cuda` first), so device data here is an internal error.
    pub fn cpu(&self) -> &CpuStorage {
        match self {
            Storage::Cpu(s) => s,
            Storage::Cuda(_) => panic!("{NOT_CPU}"),
        }
    }
    pub fn cpu_mut(&mut self) -> &mut CpuStorage {
        match self {
            Storage::Cpu(s) => s,
            Storage::Cuda(_) => panic!("{NOT_CPU}"),
        }
    }
    /// The device data, if this storage lives on a CUDA device.
    pub fn as_cuda(&self) -> Option<&CudaStorage> {
        match self {
            Storage::Cuda(s) => Some(s),
            Storage::Cpu(_) => None,
        }
    }
}
