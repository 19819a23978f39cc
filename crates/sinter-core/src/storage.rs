//! Device dispatch: `Storage` is the one place that matches on where data lives. Each method
//! is a backend primitive (see `crate::backend`): it checks that its operands live on one
//! device, then calls that backend's implementation, once.

use crate::backend::{
    BackendDevice, BackendStorage, ConvGeom, DropoutMask, IndexGeom, Indices, PoolGeom,
};
use crate::cpu::{CpuDevice, CpuStorage};
use crate::cuda::CudaStorage;
use crate::custom_op::seam::{CustomForward, ForwardCall};
use crate::op::{BinaryOp, ReduceOp, UnaryOp};
use crate::{bail, DType, Device, Error, Layout, Result, Rng};

#[derive(Clone, Debug)]
pub enum Storage {
    Cpu(CpuStorage),
    Cuda(CudaStorage),
}

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

/// The backend storages of `parts` when they all live on the device `first` does (else
/// `Error::DeviceMismatch` naming `op`).
macro_rules! all_on {
    ($op:expr, $parts:expr, $variant:path) => {{
        let mut out = Vec::with_capacity($parts.len());
        for (s, l) in $parts {
            match s {
                $variant(s) => out.push((s, *l)),
                other => {
                    return Err(Error::DeviceMismatch {
                        op: $op,
                        lhs: $parts[0].0.device(),
                        rhs: other.device(),
                    })
                }
            }
        }
        out
    }};
}

/// An optional read-only operand as the backend storage of `$variant`.
macro_rules! opt_on {
    ($op:expr, $first:expr, $opt:expr, $variant:path) => {
        match $opt {
            None => None,
            Some(($variant(s), l)) => Some((s, l)),
            Some((other, _)) => {
                return Err(Error::DeviceMismatch {
                    op: $op,
                    lhs: $first,
                    rhs: other.device(),
                })
            }
        }
    };
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

    // ---- custom ops (crate::custom_op) -----------------------------------------------------

    /// A custom op's forward on its inputs' device (`inputs` not empty), or None when the op
    /// has none for it.
    pub(crate) fn custom_forward(
        call: &ForwardCall<'_>,
        inputs: &[(&Storage, &Layout)],
    ) -> Result<Option<Vec<Storage>>> {
        let name = call.name;
        Ok(match inputs.first() {
            None => bail!("custom op `{name}`: no inputs"),
            Some((Storage::Cpu(_), _)) => {
                CpuStorage::custom_forward(call, &all_on!(name, inputs, Storage::Cpu))?
                    .map(|v| v.into_iter().map(Storage::Cpu).collect())
            }
            Some((Storage::Cuda(_), _)) => {
                CudaStorage::custom_forward(call, &all_on!(name, inputs, Storage::Cuda))?
                    .map(|v| v.into_iter().map(Storage::Cuda).collect())
            }
        })
    }

    // ---- products ------------------------------------------------------------------------

    /// [batch.., m, k] · [batch.., k, n] with both layouts broadcast over the batch dims.
    pub fn matmul(&self, l: &Layout, rhs: &Storage, rl: &Layout) -> Result<Storage> {
        let a = self;
        on_device!("matmul", [a, rhs], |w| Ok(w(a.matmul(l, rhs, rl)?)))
    }
    /// x Wᵀ (+ b) in one GEMM, or None where the backend has no epilogue for it.
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &self,
        l: &Layout,
        wt: &Storage,
        wl: &Layout,
        bias: Option<(&Storage, &Layout)>,
        rows: usize,
        inp: usize,
        out: usize,
    ) -> Result<Option<Storage>> {
        let op = "linear";
        same_device(op, self, &[wt])?;
        let dev = self.device();
        match (self, wt) {
            (Storage::Cpu(x), Storage::Cpu(w)) => {
                let b = opt_on!(op, dev, bias, Storage::Cpu);
                Ok(x.linear(l, w, wl, b, rows, inp, out)?.map(Storage::Cpu))
            }
            (Storage::Cuda(x), Storage::Cuda(w)) => {
                let b = opt_on!(op, dev, bias, Storage::Cuda);
                Ok(x.linear(l, w, wl, b, rows, inp, out)?.map(Storage::Cuda))
            }
            _ => unreachable!("devices checked"),
        }
    }
    // ---- convolution and pooling ---------------------------------------------------------

    pub fn conv2d(&self, l: &Layout, wt: &Storage, wl: &Layout, g: &ConvGeom) -> Result<Storage> {
        let x = self;
        on_device!("conv2d", [x, wt], |w| Ok(w(x.conv2d(l, wt, wl, g)?)))
    }
    /// `self` is grad_out: the input gradient.
    pub fn conv2d_backward_data(
        &self,
        l: &Layout,
        wt: &Storage,
        wl: &Layout,
        g: &ConvGeom,
    ) -> Result<Storage> {
        let gy = self;
        on_device!("conv2d", [gy, wt], |w| Ok(w(
            gy.conv2d_backward_data(l, wt, wl, g)?
        )))
    }
    /// `self` is grad_out: the weight gradient.
    pub fn conv2d_backward_filter(
        &self,
        l: &Layout,
        x: &Storage,
        xl: &Layout,
        g: &ConvGeom,
    ) -> Result<Storage> {
        let gy = self;
        on_device!("conv2d", [gy, x], |w| Ok(w(
            gy.conv2d_backward_filter(l, x, xl, g)?
        )))
    }
    /// (output, argmax).
    pub fn max_pool2d(&self, l: &Layout, g: &PoolGeom) -> Result<(Storage, Storage)> {
        let x = self;
        on_device!("max_pool2d", [x], |w| {
            let (y, arg) = x.max_pool2d(l, g)?;
            Ok((w(y), w(arg)))
        })
    }
    /// The output of [`Storage::max_pool2d`] without the argmax (no backward to follow).
    pub fn max_pool2d_values(&self, l: &Layout, g: &PoolGeom) -> Result<Storage> {
        let x = self;
        on_device!("max_pool2d", [x], |w| Ok(w(x.max_pool2d_values(l, g)?)))
    }
    pub fn max_pool2d_backward(
        &self,
        l: &Layout,
        argmax: &Storage,
        g: &PoolGeom,
    ) -> Result<Storage> {
        let gy = self;
        on_device!("max_pool2d", [gy, argmax], |w| Ok(w(
            gy.max_pool2d_backward(l, argmax, g)?
        )))
    }
    pub fn avg_pool2d(&self, l: &Layout, g: &PoolGeom) -> Result<Storage> {
        let x = self;
        on_device!("avg_pool2d", [x], |w| Ok(w(x.avg_pool2d(l, g)?)))
    }
    pub fn avg_pool2d_backward(&self, l: &Layout, g: &PoolGeom) -> Result<Storage> {
        let gy = self;
        on_device!("avg_pool2d", [gy], |w| Ok(w(gy.avg_pool2d_backward(l, g)?)))
    }

    // ---- indexing ------------------------------------------------------------------------

    pub fn index_select(
        &self,
        l: &Layout,
        ids: Indices<'_, Storage>,
        g: IndexGeom,
    ) -> Result<Storage> {
        let (x, i) = (self, ids.ids);
        on_device!("index_select", [x, i], |w| Ok(w(x.index_select(
            l,
            ids.with(i),
            g
        )?)))
    }
    /// `self` is grad_out.
    pub fn index_select_backward(
        &self,
        l: &Layout,
        ids: Indices<'_, Storage>,
        g: IndexGeom,
    ) -> Result<Storage> {
        let (gy, i) = (self, ids.ids);
        on_device!("index_select", [gy, i], |w| Ok(w(
            gy.index_select_backward(l, ids.with(i), g)?
        )))
    }
    pub fn index_add(
        &self,
        l: &Layout,
        ids: Indices<'_, Storage>,
        src: &Storage,
        srcl: &Layout,
        g: IndexGeom,
    ) -> Result<Storage> {
        let (x, i) = (self, ids.ids);
        on_device!("index_add", [x, i, src], |w| Ok(w(x.index_add(
            l,
            ids.with(i),
            src,
            srcl,
            g
        )?)))
    }

    // ---- random --------------------------------------------------------------------------

    pub fn dropout(
        &self,
        l: &Layout,
        p: f32,
        rng: &mut Rng,
    ) -> Result<(Storage, DropoutMask<Storage>)> {
        let x = self;
        on_device!("dropout", [x], |w| {
            let (y, m) = x.dropout(l, p, rng)?;
            Ok((w(y), m.map(w)))
        })
    }
    /// `self` is grad_out.
    pub fn dropout_backward(
        &self,
        l: &Layout,
        p: f32,
        mask: &DropoutMask<Storage>,
    ) -> Result<Storage> {
        let g = self;
        match mask {
            DropoutMask::Stored(m) => {
                on_device!("dropout", [g, m], |w| Ok(w(g.dropout_backward(
                    l,
                    p,
                    DropoutMask::Stored(m)
                )?)))
            }
            DropoutMask::Seed(s) => {
                on_device!("dropout", [g], |w| Ok(w(g.dropout_backward(
                    l,
                    p,
                    DropoutMask::Seed(*s)
                )?)))
            }
        }
    }
}
