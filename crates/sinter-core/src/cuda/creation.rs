//! The device as a backend device (allocation, fills, `arange`, uploads), reading values back,
//! and moving long-lived buffers into the permanent pool.
//!
//! Random tensors (`rand_uniform`, `randn`) are drawn on the host from the caller's `Rng` and
//! uploaded (by the tensor layer), so the same seed gives the same values on the CPU and on
//! CUDA (initialisation is a one-off; dropout, which runs every step, uses the device's Philox
//! generator instead).

use std::sync::Arc;

use sinter_cuda::{CudaDevice, Pool};

use super::storage::CudaStorage;
use super::{alloc, OnOp};
use crate::backend::BackendDevice;
use crate::cpu::CpuStorage;
use crate::{DType, Device, Layout, Result};

impl BackendDevice for Arc<CudaDevice> {
    type Storage = CudaStorage;
    fn location(&self) -> Device {
        Device::Cuda(self.ordinal())
    }
    fn alloc(&self, n: usize, dtype: DType) -> Result<CudaStorage> {
        Ok(CudaStorage::new(
            self.clone(),
            alloc(self, n, dtype)?,
            dtype,
        ))
    }
    fn zeros(&self, n: usize, dtype: DType) -> Result<CudaStorage> {
        let b = super::alloc_zeros(self, n, dtype)?;
        Ok(CudaStorage::new(self.clone(), b, dtype))
    }
    fn full(&self, n: usize, value: f64, dtype: DType) -> Result<CudaStorage> {
        if value == 0.0 && !value.is_sign_negative() {
            return self.zeros(n, dtype);
        }
        let b = alloc(self, n, dtype)?;
        if dtype.is_float() {
            sinter_cuda::ops::unary::fill(self, b.as_slice(), value as f32).on("full")?;
        } else if dtype == DType::Bool {
            let v = <bool as crate::Element>::from_f64(value);
            sinter_cuda::ops::boolean::fill_bool(self, b.as_slice(), v).on("full")?;
        } else {
            sinter_cuda::ops::int::fill_i64(self, b.as_slice(), value as i64).on("full")?;
        }
        Ok(CudaStorage::new(self.clone(), b, dtype))
    }
    /// n values start + i · step, computed in f64 and cast like the CPU backend.
    fn arange(&self, start: f64, step: f64, n: usize, dtype: DType) -> Result<CudaStorage> {
        let b = alloc(self, n, dtype)?;
        sinter_cuda::ops::int::arange(self, b.as_slice(), start, step).on("arange")?;
        Ok(CudaStorage::new(self.clone(), b, dtype))
    }
    fn upload(&self, host: &CpuStorage) -> Result<CudaStorage> {
        let b = match host {
            CpuStorage::F32(v) => self.htod(v, Pool::Temporary),
            CpuStorage::F16(v) => self.htod(v, Pool::Temporary),
            CpuStorage::BF16(v) => self.htod(v, Pool::Temporary),
            CpuStorage::I64(v) => self.htod(v, Pool::Temporary),
            CpuStorage::Bool(v) => {
                // A bool buffer holds the bytes 0 and 1 (what the kernels write and read).
                let bytes: Vec<u8> = v.iter().map(|&b| b as u8).collect();
                let b = alloc(self, v.len(), DType::Bool)?;
                let slice = b.as_slice().reinterpret(DType::U8).on("to_device")?;
                self.copy_htod(&bytes, slice).on("to_device")?;
                return Ok(CudaStorage::new(self.clone(), b, DType::Bool));
            }
        }
        .on("to_device")?;
        Ok(CudaStorage::new(self.clone(), Arc::new(b), host.dtype()))
    }
}

/// The elements `l` addresses, row-major, in host memory (waits for the queued work).
pub(crate) fn download(x: &CudaStorage, l: &Layout) -> Result<CpuStorage> {
    let dev = x.device();
    // The host waits for the device here anyway: report a bad device-side index first.
    super::checks::take_error(dev)?;
    let v = x.window(l)?;
    let s = v.slice();
    Ok(match x.dtype() {
        DType::F32 => CpuStorage::F32(dev.dtoh(s).on("to_device")?),
        DType::F16 => CpuStorage::F16(dev.dtoh(s).on("to_device")?),
        DType::BF16 => CpuStorage::BF16(dev.dtoh(s).on("to_device")?),
        DType::I64 => CpuStorage::I64(dev.dtoh(s).on("to_device")?),
        DType::Bool => {
            let bytes: Vec<u8> = dev
                .dtoh(s.reinterpret(DType::U8).on("to_device")?)
                .on("to_device")?;
            CpuStorage::Bool(bytes.iter().map(|&b| b != 0).collect())
        }
        d @ (DType::I32 | DType::U8) => {
            return Err(crate::Error::UnsupportedDType {
                op: "to_device",
                dtype: d,
                supported: "tensors hold f32, f16, bf16, i64 or bool",
            })
        }
    })
}

/// Moves the whole buffer of `x` into the permanent pool, in place, when it is in the
/// temporary pool: the optimizer does this to each parameter and its state on its first step
/// (and `move_to_device_` to what it moves), so what lives for the whole run never fragments
/// the activation pool.
pub(crate) fn promote_in_place(x: &mut CudaStorage) -> Result<()> {
    if x.pool() == Pool::Permanent {
        return Ok(());
    }
    let dev = x.device().clone();
    let b = CudaDevice::alloc(&dev, x.len(), x.dtype(), Pool::Permanent).on("optimizer state")?;
    dev.copy(x.buffer().as_slice(), b.as_slice())
        .on("optimizer state")?;
    x.replace_buffer(Arc::new(b));
    Ok(())
}
