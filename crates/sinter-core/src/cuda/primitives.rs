//! The CUDA side of the backend seam: `CudaStorage` implements each primitive of
//! `crate::backend` by launching sinter-cuda's kernels (or cuBLASLt / cuDNN) through the
//! family modules beside this one. Nothing here sees a tensor or records a gradient.

use super::storage::CudaStorage;
use super::{conv, creation, elementwise, matmul, nn, random, reduce};
use crate::backend::{BackendStorage, ConvGeom, DropoutMask, IndexGeom, Indices, PoolGeom};
use crate::cpu::CpuStorage;
use crate::op::{BinaryOp, ReduceOp, UnaryOp};
use crate::{DType, Device, Layout, Result, Rng};

impl BackendStorage for CudaStorage {
    fn dtype(&self) -> DType {
        CudaStorage::dtype(self)
    }
    fn len(&self) -> usize {
        CudaStorage::len(self)
    }
    fn device(&self) -> Device {
        Device::Cuda(self.ordinal())
    }

    fn to_cpu(&self, l: &Layout) -> Result<CpuStorage> {
        creation::download(self, l)
    }
    fn copy_strided(&self, l: &Layout) -> Result<Self> {
        elementwise::copy_strided(self, l)
    }
    fn cast(&self, l: &Layout, dtype: DType) -> Result<Self> {
        elementwise::cast(self, l, dtype)
    }
    fn assign(&mut self, dst_l: &Layout, src: &Self, src_l: &Layout) -> Result<()> {
        elementwise::assign(self, dst_l, src, src_l)
    }
    fn promote_to_permanent(&mut self) -> Result<()> {
        creation::promote_in_place(self)
    }

    fn unary(&self, l: &Layout, op: UnaryOp) -> Result<Self> {
        elementwise::unary(self, l, op)
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
        elementwise::unary_backward(self, l, op, (x, xl), (y, yl))
    }
    fn binary(&self, l: &Layout, rhs: &Self, rl: &Layout, op: BinaryOp) -> Result<Self> {
        elementwise::binary(self, l, rhs, rl, op)
    }
    fn where_cond(&self, l: &Layout, a: &Self, al: &Layout, b: &Self, bl: &Layout) -> Result<Self> {
        elementwise::where_cond(self, l, a, al, b, bl)
    }

    fn reduce(&self, l: &Layout, dim: usize, op: ReduceOp) -> Result<Self> {
        reduce::reduce_dim(self, l, dim, op)
    }

    fn matmul(&self, l: &Layout, rhs: &Self, rl: &Layout) -> Result<Self> {
        matmul::matmul(self, l, rhs, rl)
    }
    fn linear(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        bias: Option<(&Self, &Layout)>,
        rows: usize,
        inp: usize,
        out: usize,
    ) -> Result<Option<Self>> {
        matmul::linear(self, l, w, wl, bias, rows, inp, out)
    }
    fn conv2d(&self, l: &Layout, w: &Self, wl: &Layout, g: &ConvGeom) -> Result<Self> {
        conv::conv2d(self, l, w, wl, g)
    }
    fn conv2d_backward_data(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        g: &ConvGeom,
    ) -> Result<Self> {
        conv::conv2d_backward_data(self, l, w, wl, g)
    }
    fn conv2d_backward_filter(
        &self,
        l: &Layout,
        x: &Self,
        xl: &Layout,
        g: &ConvGeom,
    ) -> Result<Self> {
        conv::conv2d_backward_filter(self, l, x, xl, g)
    }
    fn max_pool2d(&self, l: &Layout, g: &PoolGeom) -> Result<(Self, Self)> {
        conv::max_pool2d(self, l, g)
    }
    fn max_pool2d_backward(&self, l: &Layout, argmax: &Self, g: &PoolGeom) -> Result<Self> {
        conv::max_pool2d_backward(self, l, argmax, g)
    }
    fn avg_pool2d(&self, l: &Layout, g: &PoolGeom) -> Result<Self> {
        conv::avg_pool2d(self, l, g)
    }
    fn avg_pool2d_backward(&self, l: &Layout, g: &PoolGeom) -> Result<Self> {
        conv::avg_pool2d_backward(self, l, g)
    }

    fn index_select(&self, l: &Layout, ids: Indices<'_, Self>, g: IndexGeom) -> Result<Self> {
        nn::index_select(self, l, ids, g)
    }
    fn index_select_backward(
        &self,
        l: &Layout,
        ids: Indices<'_, Self>,
        g: IndexGeom,
    ) -> Result<Self> {
        nn::index_select_backward(self, l, ids, g)
    }
    fn index_add(
        &self,
        l: &Layout,
        ids: Indices<'_, Self>,
        src: &Self,
        srcl: &Layout,
        g: IndexGeom,
    ) -> Result<Self> {
        nn::index_add(self, l, ids, (src, srcl), g)
    }

    fn dropout(&self, l: &Layout, p: f32, rng: &mut Rng) -> Result<(Self, DropoutMask<Self>)> {
        random::dropout(self, l, p, rng)
    }
    fn dropout_backward(&self, l: &Layout, p: f32, mask: DropoutMask<&Self>) -> Result<Self> {
        random::dropout_backward(self, l, p, mask)
    }
}
