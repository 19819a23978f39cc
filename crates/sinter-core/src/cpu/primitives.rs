//! The CPU side of the backend seam: `CpuStorage` implements each primitive of
//! `crate::backend` as a thin call into the slice kernels of this module's siblings (which
//! never see a storage enum, a layout or a tensor beyond what they are handed), so moving a
//! kernel family to sinter-cpu changes one call here.

use super::{elementwise, reduce, CpuStorage};
use crate::backend::{BackendDevice, BackendStorage};
use crate::op::{BinaryOp, ReduceOp, UnaryOp};
use crate::{DType, Device, Layout, Result};

/// The host as a backend device.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuDevice;

impl BackendDevice for CpuDevice {
    type Storage = CpuStorage;
    fn location(&self) -> Device {
        Device::Cpu
    }
    fn alloc(&self, n: usize, dtype: DType) -> Result<CpuStorage> {
        self.zeros(n, dtype)
    }
    fn zeros(&self, n: usize, dtype: DType) -> Result<CpuStorage> {
        Ok(CpuStorage::zeros(n, dtype))
    }
    fn full(&self, n: usize, value: f64, dtype: DType) -> Result<CpuStorage> {
        Ok(CpuStorage::full(n, value, dtype))
    }
    fn arange(&self, start: f64, step: f64, n: usize, dtype: DType) -> Result<CpuStorage> {
        Ok(if dtype == DType::I64 {
            CpuStorage::I64((0..n).map(|i| (start + i as f64 * step) as i64).collect())
        } else {
            let v: Vec<f32> = (0..n).map(|i| (start + i as f64 * step) as f32).collect();
            CpuStorage::from_f32(v, dtype)
        })
    }
    fn upload(&self, host: &CpuStorage) -> Result<CpuStorage> {
        Ok(host.clone())
    }
}

/// [outer, n, inner] around dimension `dim` of `shape`.
fn split_at_dim(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    (
        shape[..dim].iter().product(),
        shape[dim],
        shape[dim + 1..].iter().product(),
    )
}

impl BackendStorage for CpuStorage {
    fn dtype(&self) -> DType {
        CpuStorage::dtype(self)
    }
    fn len(&self) -> usize {
        CpuStorage::len(self)
    }
    fn device(&self) -> Device {
        Device::Cpu
    }

    fn to_cpu(&self, l: &Layout) -> Result<CpuStorage> {
        Ok(self.gather(l))
    }
    fn copy_strided(&self, l: &Layout) -> Result<Self> {
        Ok(self.gather(l))
    }
    fn cast(&self, l: &Layout, dtype: DType) -> Result<Self> {
        Ok(self.gather_as(l, dtype))
    }
    fn assign(&mut self, dst_l: &Layout, src: &Self, src_l: &Layout) -> Result<()> {
        let data = src.gather_as(src_l, CpuStorage::dtype(self));
        self.write_strided(dst_l, &data)
    }
    fn promote_to_permanent(&mut self) -> Result<()> {
        Ok(())
    }

    fn unary(&self, l: &Layout, op: UnaryOp) -> Result<Self> {
        Ok(elementwise::unary(self, l, op))
    }
    fn unary_backward(
        &self,
        l: &Layout,
        op: UnaryOp,
        x: &Self,
        xl: &Layout,
        y: &Self,
        yl: &Layout,
    ) -> Result<Self> {
        let (xv, yv, gv) = (
            x.f32_contiguous(xl),
            y.f32_contiguous(yl),
            self.f32_contiguous(l),
        );
        Ok(elementwise::unary_backward(
            op,
            &xv,
            &yv,
            &gv,
            CpuStorage::dtype(self),
        ))
    }
    fn binary(&self, l: &Layout, rhs: &Self, rl: &Layout, op: BinaryOp) -> Result<Self> {
        Ok(elementwise::binary(self, l, rhs, rl, op))
    }
    fn where_cond(&self, l: &Layout, a: &Self, al: &Layout, b: &Self, bl: &Layout) -> Result<Self> {
        Ok(elementwise::where_cond(self, l, a, al, b, bl))
    }

    fn reduce(&self, l: &Layout, dim: usize, op: ReduceOp) -> Result<Self> {
        let (outer, n, inner) = split_at_dim(l.shape(), dim);
        let x = self.f32_contiguous(l);
        Ok(if op == ReduceOp::ArgMax {
            CpuStorage::I64(reduce::argmax_i64(&x, outer, n, inner))
        } else {
            CpuStorage::from_f32(
                reduce::reduce_f32(&x, outer, n, inner, op),
                CpuStorage::dtype(self),
            )
        })
    }
}
