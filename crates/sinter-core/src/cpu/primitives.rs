//! The CPU side of the backend seam: `CpuStorage` implements each primitive of
//! `crate::backend` as a thin call into the slice kernels of this module's siblings (which
//! never see a storage enum, a layout or a tensor beyond what they are handed), so moving a
//! kernel family to sinter-cpu changes one call here.

use super::matmul::MatView;
use super::{conv, elementwise, matmul, nn, reduce, CpuStorage};
use crate::backend::{
    check_indices, reduced_dtype, BackendDevice, BackendStorage, ConvGeom, DropoutMask, IndexGeom,
    Indices, PoolGeom,
};
use crate::op::{BinaryOp, ReduceOp, UnaryOp};
use crate::{DType, Device, Error, Layout, Result, Rng};
use sinter_cpu::gemm::Activation;

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

/// act(x Wᵀ + bias) as one GEMM with an epilogue (see `matmul::linear_f32`): (y, the
/// pre-activation when there is an activation), or None unless every operand is f32 (half
/// precision runs the composite, which widens per op).
pub(crate) fn linear_epilogue(
    (x, xl): (&CpuStorage, &Layout),
    (w, wl): (&CpuStorage, &Layout),
    bias: Option<(&CpuStorage, &Layout)>,
    act: Activation,
    rows: usize,
    inp: usize,
    out: usize,
) -> Option<(CpuStorage, Option<CpuStorage>)> {
    let (CpuStorage::F32(xd), CpuStorage::F32(wd)) = (x, w) else {
        return None;
    };
    let b = match bias {
        Some((b @ CpuStorage::F32(_), bl)) => Some(b.f32_contiguous(bl)),
        Some(_) => return None,
        None => None,
    };
    // x as [rows, inp]: its own strides when it is 2-D, else a contiguous copy.
    let (xs, xv) = if xl.rank() == 2 {
        (std::borrow::Cow::Borrowed(&xd[..]), batch_view(xl, 0)(0))
    } else {
        let row_major = MatView {
            offset: 0,
            rs: inp as isize,
            cs: 1,
        };
        (x.f32_contiguous(xl), row_major)
    };
    let (y, pre) = matmul::linear_f32(
        (&xs, xv),
        (wd, batch_view(wl, 0)(0)),
        b.as_deref(),
        act,
        rows,
        inp,
        out,
    );
    Some((CpuStorage::F32(y), pre.map(CpuStorage::F32)))
}

/// An error unless `dtype` is a float (the kernels of `op` compute on f32 values).
fn float_only(op: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType {
            op,
            dtype,
            supported: "f32, f16 or bf16",
        })
    }
}

/// The ids as checked row numbers (the CPU checks every time: it is one pass over the ids).
fn row_ids(ids: &Indices<'_, CpuStorage>, bound: usize) -> Result<Vec<usize>> {
    if ids.ids.dtype() != DType::I64 {
        return Err(Error::DTypeMismatch {
            op: ids.what.name(),
            expected: DType::I64,
            got: ids.ids.dtype(),
        });
    }
    let v = ids.ids.i64_contiguous(ids.layout);
    check_indices(&v, bound, None, ids.what)?;
    Ok(v.iter().map(|&i| i as usize).collect())
}

/// The matrix of batch `b` of a layout broadcast to [batch.., rows, cols] (`nb` batch dims).
fn batch_view(l: &Layout, nb: usize) -> impl Fn(usize) -> MatView + Sync + '_ {
    move |b: usize| {
        let mut off = l.offset();
        let mut rem = b;
        for i in (0..nb).rev() {
            off += (rem % l.shape()[i]) * l.strides()[i];
            rem /= l.shape()[i];
        }
        MatView {
            offset: off,
            rs: l.strides()[nb] as isize,
            cs: l.strides()[nb + 1] as isize,
        }
    }
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
        elementwise::binary(self, l, rhs, rl, op)
    }
    fn where_cond(&self, l: &Layout, a: &Self, al: &Layout, b: &Self, bl: &Layout) -> Result<Self> {
        elementwise::where_cond(self, l, a, al, b, bl)
    }

    fn reduce(&self, l: &Layout, dim: usize, op: ReduceOp) -> Result<Self> {
        let (outer, n, inner) = split_at_dim(l.shape(), dim);
        if let CpuStorage::Bool(_) = self {
            let v = reduce::reduce_bool(&self.bool_contiguous(l), outer, n, inner, op);
            return Ok(match reduced_dtype(op, DType::Bool) {
                DType::Bool => CpuStorage::Bool(v.iter().map(|&c| c != 0).collect()),
                _ => CpuStorage::I64(v),
            });
        }
        if let CpuStorage::I64(_) = self {
            let x = self.i64_contiguous(l);
            return Ok(CpuStorage::I64(reduce::reduce_i64(&x, outer, n, inner, op)));
        }
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

    fn matmul(&self, la: &Layout, rhs: &Self, lb: &Layout) -> Result<Self> {
        let nb = la.rank() - 2;
        let batch: usize = la.shape()[..nb].iter().product();
        let (m, k, n) = (la.shape()[nb], la.shape()[nb + 1], lb.shape()[nb + 1]);
        if let (CpuStorage::I64(a), CpuStorage::I64(b)) = (self, rhs) {
            let (va, vb) = (batch_view(la, nb), batch_view(lb, nb));
            let out = matmul::batched_matmul_i64(a, b, batch, m, n, k, va, vb);
            return Ok(CpuStorage::I64(out));
        }
        float_only("matmul", CpuStorage::dtype(self))?;
        let out = match (self, rhs) {
            (CpuStorage::F32(a), CpuStorage::F32(b)) => matmul::batched_gemm_f32(
                a,
                b,
                batch,
                m,
                n,
                k,
                batch_view(la, nb),
                batch_view(lb, nb),
            ),
            _ => {
                // Half precision: widen to f32 (contiguous), multiply, round back.
                let (a, b) = (self.f32_contiguous(la), rhs.f32_contiguous(lb));
                let (ca, cb) = (
                    Layout::contiguous(la.shape()),
                    Layout::contiguous(lb.shape()),
                );
                matmul::batched_gemm_f32(
                    &a,
                    &b,
                    batch,
                    m,
                    n,
                    k,
                    batch_view(&ca, nb),
                    batch_view(&cb, nb),
                )
            }
        };
        Ok(CpuStorage::from_f32(out, CpuStorage::dtype(self)))
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
        let y = linear_epilogue((self, l), (w, wl), bias, Activation::None, rows, inp, out);
        Ok(y.map(|(y, _)| y))
    }

    fn conv2d(&self, l: &Layout, w: &Self, wl: &Layout, g: &ConvGeom) -> Result<Self> {
        float_only("conv2d", CpuStorage::dtype(self))?;
        let y = conv::conv2d_forward(&self.f32_contiguous(l), &w.f32_contiguous(wl), g);
        Ok(CpuStorage::from_f32(y, CpuStorage::dtype(self)))
    }
    fn conv2d_backward_data(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        g: &ConvGeom,
    ) -> Result<Self> {
        let dx = conv::conv2d_backward_data(&w.f32_contiguous(wl), &self.f32_contiguous(l), g);
        Ok(CpuStorage::from_f32(dx, CpuStorage::dtype(self)))
    }
    fn conv2d_backward_filter(
        &self,
        l: &Layout,
        x: &Self,
        xl: &Layout,
        g: &ConvGeom,
    ) -> Result<Self> {
        let dw = conv::conv2d_backward_filter(&x.f32_contiguous(xl), &self.f32_contiguous(l), g);
        Ok(CpuStorage::from_f32(dw, CpuStorage::dtype(self)))
    }
    fn max_pool2d(&self, l: &Layout, g: &PoolGeom) -> Result<(Self, Self)> {
        float_only("max_pool2d", CpuStorage::dtype(self))?;
        let x = self.f32_contiguous(l);
        let (y, arg) = conv::max_pool2d(&x, g);
        Ok((
            CpuStorage::from_f32(y, CpuStorage::dtype(self)),
            CpuStorage::I64(arg),
        ))
    }
    fn max_pool2d_values(&self, l: &Layout, g: &PoolGeom) -> Result<Self> {
        float_only("max_pool2d", CpuStorage::dtype(self))?;
        let y = conv::max_pool2d_values(&self.f32_contiguous(l), g);
        Ok(CpuStorage::from_f32(y, CpuStorage::dtype(self)))
    }
    fn max_pool2d_backward(&self, l: &Layout, argmax: &Self, g: &PoolGeom) -> Result<Self> {
        let arg = argmax.i64_contiguous(&Layout::contiguous(&[argmax.len()]));
        let dx = conv::max_pool2d_backward(
            &self.f32_contiguous(l),
            &arg,
            g.planes(),
            g.h * g.w,
            g.oh * g.ow,
        );
        Ok(CpuStorage::from_f32(dx, CpuStorage::dtype(self)))
    }
    fn avg_pool2d(&self, l: &Layout, g: &PoolGeom) -> Result<Self> {
        float_only("avg_pool2d", CpuStorage::dtype(self))?;
        let x = self.f32_contiguous(l);
        let y = conv::avg_pool2d(&x, g);
        Ok(CpuStorage::from_f32(y, CpuStorage::dtype(self)))
    }
    fn avg_pool2d_backward(&self, l: &Layout, g: &PoolGeom) -> Result<Self> {
        let dy = self.f32_contiguous(l);
        let dx = conv::avg_pool2d_backward(&dy, g);
        Ok(CpuStorage::from_f32(dx, CpuStorage::dtype(self)))
    }

    fn index_select(&self, l: &Layout, ids: Indices<'_, Self>, g: IndexGeom) -> Result<Self> {
        let ids = row_ids(&ids, g.n)?;
        // A contiguous table is read in place (an embedding lookup copies its rows, not the table).
        Ok(crate::with_cpu_vec!(self, v => {
            let gathered;
            let src = match l.contiguous_range() {
                Some(r) => &v[r],
                None => {
                    gathered = super::gather_strided(v, l);
                    &gathered[..]
                }
            };
            nn::index_select(src, &ids, g.outer, g.n, g.inner).into()
        }))
    }
    fn index_select_backward(
        &self,
        l: &Layout,
        ids: Indices<'_, Self>,
        g: IndexGeom,
    ) -> Result<Self> {
        let ids = row_ids(&ids, g.n)?;
        let mut dst = vec![0f32; g.outer * g.n * g.inner];
        nn::index_add(
            &mut dst,
            &self.f32_contiguous(l),
            &ids,
            g.outer,
            g.n,
            g.inner,
        );
        Ok(CpuStorage::from_f32(dst, CpuStorage::dtype(self)))
    }
    fn index_add(
        &self,
        l: &Layout,
        ids: Indices<'_, Self>,
        src: &Self,
        srcl: &Layout,
        g: IndexGeom,
    ) -> Result<Self> {
        let ids = row_ids(&ids, g.n)?;
        let mut dst = self.f32_contiguous(l).into_owned();
        nn::index_add(
            &mut dst,
            &src.f32_contiguous(srcl),
            &ids,
            g.outer,
            g.n,
            g.inner,
        );
        Ok(CpuStorage::from_f32(dst, CpuStorage::dtype(self)))
    }

    fn dropout(&self, l: &Layout, p: f32, rng: &mut Rng) -> Result<(Self, DropoutMask<Self>)> {
        float_only("dropout", CpuStorage::dtype(self))?;
        // Every element draws from the caller's generator, in order (the stream saved runs
        // depend on); the scaled mask is kept for the backward.
        let keep = 1.0 - p as f64;
        let scale = (1.0 / keep) as f32;
        let mask: Vec<f32> = (0..l.numel())
            .map(|_| if rng.next_f64() < keep { scale } else { 0.0 })
            .collect();
        let mask = CpuStorage::from_f32(mask, CpuStorage::dtype(self));
        let ml = Layout::contiguous(l.shape());
        let y = elementwise::binary(self, l, &mask, &ml, crate::op::BinaryOp::Mul)?;
        Ok((y, DropoutMask::Stored(mask)))
    }
    fn dropout_backward(&self, l: &Layout, _p: f32, mask: DropoutMask<&Self>) -> Result<Self> {
        let DropoutMask::Stored(mask) = mask else {
            crate::bail!("dropout: internal error: a CPU dropout stores its mask, not a seed");
        };
        let ml = Layout::contiguous(l.shape());
        elementwise::binary(self, l, mask, &ml, crate::op::BinaryOp::Mul)
    }
}
