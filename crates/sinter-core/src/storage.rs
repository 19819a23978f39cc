//! Device dispatch: `Storage` is the one place that matches on where data lives. Each method
//! is a backend primitive (see `crate::backend`): it checks that its operands live on one
//! device, then calls that backend's implementation, once.

use crate::backend::{BackendDevice, BackendStorage};
use crate::cpu::{CpuDevice, CpuStorage};
use crate::cuda::CudaStorage;
use crate::op::{BinaryOp, ReduceOp, UnaryOp};
use crate::{bail, DType, Device, Error, Layout, Result};

#[derive(Clone, Debug)]
pub enum Storage {
    Cpu(CpuStorage),
    Cuda(CudaStorage),
}

/// Reaching a CPU kernel with device data is a bug in the dispatch (an op without its
/// `is_cuda()` branch), never a user error: say so plainly.
const NOT_CPU: &str = "internal error: a CPU kernel was reached with a CUDA tensor (an op is missing its CUDA dispatch; please report it)";

/// An error unless every operand lives on the device of the first.
fn same_device(op: &'static str, first: &Storage, rest: &[&Storage]) -> Result<()> {
    for s in rest {
        if s.device() != first.device() {
            return Err(Error::DeviceMismatch {
                op,
                lhs: first.device(),
                rhs: s.device(),
            });
        }
    }
    Ok(())
}

/// Runs `$body` with every named operand bound to its backend storage (after checking they
/// share one device) and `$wrap` bound to that backend's `Storage` constructor.
macro_rules! on_device {
    ($op:expr, [$first:ident $(, $rest:ident)*], |$wrap:ident| $body:expr) => {{
        same_device($op, $first, &[$($rest),*])?;
        match $first {
            Storage::Cpu($first) => {
                $(let Storage::Cpu($rest) = $rest else { unreachable!("devices checked") };)*
                let $wrap = Storage::Cpu;
                $body
            }
            Storage::Cuda($first) => {
                $(let Storage::Cuda($rest) = $rest else { unreachable!("devices checked") };)*
                let $wrap = Storage::Cuda;
                $body
            }
        }
    }};
}

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

    // ---- making storage ------------------------------------------------------------------

    /// Ok when `device` can be used (a CUDA device that cannot is `Error::DeviceUnavailable`
    /// saying why).
    pub fn check_device(device: Device) -> Result<()> {
        match device {
            Device::Cpu => Ok(()),
            Device::Cuda(n) => crate::cuda::device(n).map(|_| ()),
        }
    }
    /// `n` elements that the caller overwrites before reading.
    pub fn alloc(device: Device, n: usize, dtype: DType) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(CpuDevice.alloc(n, dtype)?)),
            Device::Cuda(o) => Ok(Storage::Cuda(crate::cuda::device(o)?.alloc(n, dtype)?)),
        }
    }
    pub fn full(device: Device, n: usize, value: f64, dtype: DType) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(CpuDevice.full(n, value, dtype)?)),
            Device::Cuda(o) => Ok(Storage::Cuda(
                crate::cuda::device(o)?.full(n, value, dtype)?,
            )),
        }
    }
    pub fn arange(
        device: Device,
        start: f64,
        step: f64,
        n: usize,
        dtype: DType,
    ) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(CpuDevice.arange(start, step, n, dtype)?)),
            Device::Cuda(o) => Ok(Storage::Cuda(
                crate::cuda::device(o)?.arange(start, step, n, dtype)?,
            )),
        }
    }
    /// Host data placed on `device` (moved, not copied, when that is the host).
    pub fn from_host(device: Device, host: CpuStorage) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(host)),
            Device::Cuda(o) => Ok(Storage::Cuda(crate::cuda::device(o)?.upload(&host)?)),
        }
    }

    // ---- data movement -------------------------------------------------------------------

    /// The elements `l` addresses, row-major, in host memory.
    pub fn to_cpu(&self, l: &Layout) -> Result<CpuStorage> {
        match self {
            Storage::Cpu(s) => s.to_cpu(l),
            Storage::Cuda(s) => s.to_cpu(l),
        }
    }
    /// Runs `f` on host data with its layout: this storage itself when it is on the host, else
    /// a contiguous download of the elements `l` addresses.
    pub fn with_host<R>(&self, l: &Layout, f: impl FnOnce(&CpuStorage, &Layout) -> R) -> Result<R> {
        match self {
            Storage::Cpu(s) => Ok(f(s, l)),
            other => Ok(f(&other.to_cpu(l)?, &Layout::contiguous(l.shape()))),
        }
    }
    /// The elements `l` addresses, contiguous, on `device` (through the host between devices).
    pub fn to_device(&self, l: &Layout, device: Device) -> Result<Storage> {
        if self.device() == device {
            return self.copy_strided(l);
        }
        Storage::from_host(device, self.to_cpu(l)?)
    }
    pub fn copy_strided(&self, l: &Layout) -> Result<Storage> {
        let this = self;
        on_device!("contiguous", [this], |w| Ok(w(this.copy_strided(l)?)))
    }
    pub fn cast(&self, l: &Layout, dtype: DType) -> Result<Storage> {
        let this = self;
        on_device!("to_dtype", [this], |w| Ok(w(this.cast(l, dtype)?)))
    }
    /// In place (see `BackendStorage::assign`); `src` must not share memory with `self`.
    pub fn assign(&mut self, dst_l: &Layout, src: &Storage, src_l: &Layout) -> Result<()> {
        same_device("assign", self, &[src])?;
        match (self, src) {
            (Storage::Cpu(d), Storage::Cpu(s)) => d.assign(dst_l, s, src_l),
            (Storage::Cuda(d), Storage::Cuda(s)) => d.assign(dst_l, s, src_l),
            _ => unreachable!("devices checked"),
        }
    }
    pub fn promote_to_permanent(&mut self) -> Result<()> {
        match self {
            Storage::Cpu(s) => s.promote_to_permanent(),
            Storage::Cuda(s) => s.promote_to_permanent(),
        }
    }

    // ---- elementwise ---------------------------------------------------------------------

    pub fn unary(&self, l: &Layout, op: UnaryOp) -> Result<Storage> {
        let this = self;
        on_device!(op.name(), [this], |w| Ok(w(this.unary(l, op)?)))
    }
    /// `self` is grad_out (see `BackendStorage::unary_backward`).
    pub fn unary_backward(
        &self,
        l: &Layout,
        op: UnaryOp,
        x: &Storage,
        xl: &Layout,
        y: &Storage,
        yl: &Layout,
    ) -> Result<Storage> {
        let g = self;
        on_device!(op.name(), [g, x, y], |w| Ok(w(
            g.unary_backward(l, op, x, xl, y, yl)?
        )))
    }
    pub fn binary(&self, l: &Layout, rhs: &Storage, rl: &Layout, op: BinaryOp) -> Result<Storage> {
        let lhs = self;
        on_device!(op.name(), [lhs, rhs], |w| Ok(
            w(lhs.binary(l, rhs, rl, op)?)
        ))
    }
    /// `self` is the condition (see `BackendStorage::where_cond`).
    pub fn where_cond(
        &self,
        l: &Layout,
        a: &Storage,
        al: &Layout,
        b: &Storage,
        bl: &Layout,
    ) -> Result<Storage> {
        let cond = self;
        on_device!("where", [cond, a, b], |w| Ok(w(
            cond.where_cond(l, a, al, b, bl)?
        )))
    }

    // ---- reductions ----------------------------------------------------------------------

    pub fn reduce(&self, l: &Layout, dim: usize, op: ReduceOp) -> Result<Storage> {
        if l.shape()[dim] == 0 && op != ReduceOp::Sum {
            bail!(
                "{op:?}: cannot reduce over an empty dimension {dim} of {:?}",
                l.shape()
            );
        }
        let this = self;
        on_device!("reduce", [this], |w| Ok(w(this.reduce(l, dim, op)?)))
    }
}
