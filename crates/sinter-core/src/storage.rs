//! Device dispatch: `Storage` is the one place that matches on where data lives. Each method
//! is a backend primitive; the CPU arm calls into `cpu`, and a CUDA arm slots in beside it.

use crate::cpu::CpuStorage;
use crate::{DType, Device};

#[derive(Clone, Debug)]
pub enum Storage {
    Cpu(CpuStorage),
}

impl Storage {
    pub fn dtype(&self) -> DType {
        match self {
            Storage::Cpu(s) => s.dtype(),
        }
    }
    pub fn device(&self) -> Device {
        match self {
            Storage::Cpu(_) => Device::Cpu,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            Storage::Cpu(s) => s.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn cpu(&self) -> &CpuStorage {
        match self {
            Storage::Cpu(s) => s,
        }
    }
    pub fn cpu_mut(&mut self) -> &mut CpuStorage {
        match self {
            Storage::Cpu(s) => s,
        }
    }
}
