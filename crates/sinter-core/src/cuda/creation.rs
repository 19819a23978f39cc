//! Creation on the device, host <-> device transfer (differentiable), reading values back, and
//! moving long-lived tensors into the permanent pool.
//!
//! Random tensors (`rand_uniform`, `randn`) are drawn on the host from the caller's `Rng` and
//! uploaded, so the same seed gives the same values on the CPU and on CUDA (initialisation is a
//! one-off; dropout, which runs every step, uses the device's Philox generator instead).

use std::sync::Arc;

use sinter_cuda::{CudaDevice, DeviceBuffer, Pool};

use super::{alloc, contig, device, storage_of, tensor_of, DevView, OnOp};
use crate::autograd::output;
use crate::cpu::CpuStorage;
use crate::storage::Storage;
use crate::{DType, Device, Result, Tensor};

/// `check_device` for `Device::Cuda(n)`: Ok when the device can be used.
pub(crate) fn check(ordinal: usize) -> Result<()> {
    device(ordinal).map(|_| ())
}

/// A tensor of `shape` filled with `value` on device `ordinal`.
pub(crate) fn full(value: f64, shape: &[usize], dtype: DType, ordinal: usize) -> Result<Tensor> {
    let dev = device(ordinal)?;
    let n: usize = shape.iter().product();
    let buf = if value == 0.0 && !value.is_sign_negative() {
        super::alloc_zeros(&dev, n, dtype)?
    } else if dtype.is_float() {
        let b = alloc(&dev, n, dtype)?;
        sinter_cuda::ops::unary::fill(&dev, b.as_slice(), value as f32).on("full")?;
        b
    } else {
        let b = alloc(&dev, n, dtype)?;
        sinter_cuda::ops::int::fill_i64(&dev, b.as_slice(), value as i64).on("full")?;
        b
    };
    Ok(tensor_of(&dev, buf, dtype, shape))
}

/// `arange` on device `ordinal`: n values start + i * step, computed in f64 and cast like the
/// CPU backend (the caller checked the range and computed n).
pub(crate) fn arange(
    start: f64,
    step: f64,
    n: usize,
    dtype: DType,
    ordinal: usize,
) -> Result<Tensor> {
    let dev = device(ordinal)?;
    let b = alloc(&dev, n, dtype)?;
    sinter_cuda::ops::int::arange(&dev, b.as_slice(), start, step).on("arange")?;
    Ok(tensor_of(&dev, b, dtype, &[n]))
}

/// A fresh CPU tensor (the result of a host-side constructor) placed on `device`.
pub(crate) fn place(t: Tensor, device: Device) -> Result<Tensor> {
    match device {
        Device::Cpu => Ok(t),
        Device::Cuda(_) => t.detach().to_device(device),
    }
}

/// Copies host data into a new device buffer.
pub(crate) fn upload(dev: &CudaDevice, s: &CpuStorage, pool: Pool) -> Result<Arc<DeviceBuffer>> {
    let b = crate::with_cpu_vec!(s, v => dev.htod(v, pool).on("to_device")?);
    Ok(Arc::new(b))
}

/// The values of a CUDA tensor as a contiguous, detached CPU tensor.
pub(crate) fn download(t: &Tensor) -> Result<Tensor> {
    Ok(Tensor::from_cpu(download_storage(t)?, t.shape()))
}

/// The values of a CUDA tensor, row-major, in host memory (waits for the queued work).
pub(crate) fn download_storage(t: &Tensor) -> Result<CpuStorage> {
    let (dev, _) = super::parts(t)?;
    // The host waits for the device here anyway: report a bad device-side index first.
    super::checks::take_error(&dev)?;
    let v = contig(t)?;
    let s = v.slice();
    Ok(match t.dtype() {
        DType::F32 => CpuStorage::F32(dev.dtoh(s).on("to_device")?),
        DType::F16 => CpuStorage::F16(dev.dtoh(s).on("to_device")?),
        DType::BF16 => CpuStorage::BF16(dev.dtoh(s).on("to_device")?),
        DType::I64 => CpuStorage::I64(dev.dtoh(s).on("to_device")?),
        d @ (DType::I32 | DType::U8) => {
            unreachable!("a tensor never holds {d} (refused where tensors are made)")
        }
    })
}

/// `Tensor::to_device` for every pair of devices. Differentiable: the backward moves the
/// gradient back to where the input lives.
pub(crate) fn to_device(t: &Tensor, to: Device) -> Result<Tensor> {
    let from = t.device();
    if from == to {
        return Ok(t.clone());
    }
    let s = match (from, to) {
        (Device::Cpu, Device::Cuda(n)) => {
            let dev = device(n)?;
            let host = t.storage().cpu().copy_strided(t.layout());
            storage_of(&dev, upload(&dev, &host, Pool::Temporary)?, t.dtype())
        }
        (Device::Cuda(_), Device::Cpu) => Storage::Cpu(download_storage(t)?),
        (Device::Cuda(_), Device::Cuda(n)) => {
            // Between GPUs through the host: simple and rare (multi-GPU training moves
            // gradients with NCCL, not through tensors).
            let dev = device(n)?;
            let host = download_storage(t)?;
            storage_of(&dev, upload(&dev, &host, Pool::Temporary)?, t.dtype())
        }
        (Device::Cpu, Device::Cpu) => unreachable!("same device handled above"),
    };
    Ok(output(s, t.shape(), "to_device", &[t], move |g, _| {
        Ok(vec![Some(g.to_device(from)?)])
    }))
}

fn permanent_copy(dev: &CudaDevice, v: &DevView, dtype: DType) -> Result<Arc<DeviceBuffer>> {
    let b = dev
        .alloc(v.len, dtype, Pool::Permanent)
        .on("optimizer state")?;
    dev.copy(v.slice(), b.as_slice()).on("optimizer state")?;
    Ok(Arc::new(b))
}

/// Moves the whole storage of `t` (all its views and clones) into the permanent pool, in place,
/// when it is in the temporary pool: the optimizer does this to each parameter and its state on
/// its first step, so what lives for the whole run never fragments the activation pool.
pub(crate) fn promote_in_place(t: &Tensor) -> Result<()> {
    let (dev, buf) = super::parts(t)?;
    if buf.pool() == Pool::Permanent {
        return Ok(());
    }
    let dtype = t.dtype();
    let perm = permanent_copy(&dev, &DevView::whole(buf), dtype)?;
    // (dtype read before locking: `t.dtype()` reads the storage.)
    let mut guard = t.0.storage.write().unwrap_or_else(|e| e.into_inner());
    *guard = storage_of(&dev, perm, dtype);
    Ok(())
}
