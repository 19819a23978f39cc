//! Differentiable neural-network ops with dedicated (fused) kernels: conv2d, pooling,
//! layer norm, gather/scatter, concatenation, selection and dropout (losses: `loss.rs`).

use crate::backend::{
    check_indices, Conv2dParams, ConvGeom, IndexGeom, IndexUse, Indices, Pool2dParams, PoolGeom,
};
use crate::layout::{broadcast_shape, resolve_dim};
use crate::storage::Storage;
use crate::tensor::output;
use crate::{bail, DType, Error, Result, Rng, Tensor};
use sinter_types::{pool_out_size, Hw};

impl Tensor {
    /// An error naming `op` unless this tensor holds floats.
    pub(crate) fn float_op(&self, op: &'static str) -> Result<()> {
        if self.dtype().is_float() {
            return Ok(());
        }
        Err(Error::UnsupportedDType {
            op,
            dtype: self.dtype(),
            supported: "f32, f16 or bf16",
        })
    }

    fn expect_rank(&self, op: &'static str, rank: usize, what: &str) -> Result<()> {
        if self.rank() != rank {
            bail!(
                "{op}: expected {what} of rank {rank}, got shape {:?}",
                self.shape()
            );
        }
        Ok(())
    }

    /// 2-D convolution of x [n, c, h, w] with weight [o, c/groups, kh, kw] (no bias; add it
    /// with broadcasting). On the CPU and as the CUDA fall-back it runs as im2col + GEMM; on CUDA
    /// it runs through cuDNN when that loads (see `cuda::set_conv_backend`).
    pub fn conv2d(&self, weight: &Tensor, p: Conv2dParams) -> Result<Tensor> {
        let g = self.conv_geom(weight, p)?;
        let (oh, ow) = (g.oh, g.ow);
        // Under autocast, float operands are cast (differentiably) to the autocast dtype.
        if let Some((x, w)) = crate::amp::autocast_operands(self, weight)? {
            return x.conv2d(&w, p);
        }
        self.float_op("conv2d")?;
        if self.device() != weight.device() {
            return Err(Error::DeviceMismatch {
                op: "conv2d",
                lhs: self.device(),
                rhs: weight.device(),
            });
        }
        let y = self
            .storage()
            .conv2d(self.layout(), &weight.storage(), weight.layout(), &g)?;
        let (x, w) = (self.clone(), weight.clone());
        Ok(output(
            y,
            &[g.n, g.o, oh, ow],
            "conv2d",
            &[self, weight],
            move |gr, _| {
                Ok(vec![
                    x.conv2d_grad_input(gr, &w, &g)?,
                    w.conv2d_grad_weight(gr, &x, &g)?,
                ])
            },
        ))
    }

    /// dx of a conv2d of `self` (None when `self` needs no gradient) from grad_out `gr`.
    pub(crate) fn conv2d_grad_input(
        &self,
        gr: &Tensor,
        w: &Tensor,
        g: &ConvGeom,
    ) -> Result<Option<Tensor>> {
        if !self.tracks_grad() {
            return Ok(None);
        }
        let s = gr
            .storage()
            .conv2d_backward_data(gr.layout(), &w.storage(), w.layout(), g)?;
        Ok(Some(Tensor::from_storage(s, self.shape())))
    }

    /// dw of a conv2d with weight `self` (None when it needs no gradient) from grad_out `gr`.
    pub(crate) fn conv2d_grad_weight(
        &self,
        gr: &Tensor,
        x: &Tensor,
        g: &ConvGeom,
    ) -> Result<Option<Tensor>> {
        if !self.tracks_grad() {
            return Ok(None);
        }
        let s = gr
            .storage()
            .conv2d_backward_filter(gr.layout(), &x.storage(), x.layout(), g)?;
        Ok(Some(Tensor::from_storage(s, self.shape())))
    }

    /// The geometry of conv2d(self, weight, p), after checking ranks, channels and sizes.
    pub(crate) fn conv_geom(&self, weight: &Tensor, p: Conv2dParams) -> Result<ConvGeom> {
        self.expect_rank("conv2d", 4, "input [n, c, h, w]")?;
        weight.expect_rank("conv2d", 4, "weight [o, c/groups, kh, kw]")?;
        let (xs, ws) = (self.shape(), weight.shape());
        if p.groups == 0 || p.stride.any_zero() || p.dilation.any_zero() {
            bail!("conv2d: stride, dilation and groups must be at least 1, got {p:?}");
        }
        if xs[1] % p.groups != 0 || ws[0] % p.groups != 0 || ws[1] * p.groups != xs[1] {
            return Err(Error::ShapeMismatch {
                op: "conv2d",
                lhs: xs.to_vec(),
                rhs: ws.to_vec(),
            });
        }
        let (oh, ow) = match ConvGeom::out_hw(xs[2], xs[3], ws[2], ws[3], &p) {
            Some((a, b)) if a > 0 && b > 0 => (a, b),
            _ => bail!(
                "conv2d: a {}x{} kernel with dilation {} does not fit a {}x{} input with padding {} \
                 (the padded input must be at least dilation·(k−1)+1 along each axis)",
                ws[2],
                ws[3],
                p.dilation,
                xs[2],
                xs[3],
                p.padding
            ),
        };
        Ok(ConvGeom {
            n: xs[0],
            c: xs[1],
            h: xs[2],
            w: xs[3],
            o: ws[0],
            kh: ws[2],
            kw: ws[3],
            oh,
            ow,
            p,
        })
    }

    /// The geometry of a 2-D pooling, after PyTorch's checks (`pool2d_shape_check`): kernel,
    /// stride and dilation ≥ 1, padding at most half the kernel, at least one output pixel.
    fn pool_geom(&self, op: &'static str, p: Pool2dParams) -> Result<PoolGeom> {
        self.expect_rank(op, 4, "input [n, c, h, w]")?;
        self.float_op(op)?;
        let s = self.shape();
        let (k, st, pd, d) = (p.kernel, p.stride, p.padding, p.dilation);
        if k.any_zero() || st.any_zero() || d.any_zero() {
            bail!("{op}: kernel, stride and dilation must be at least 1, got {p:?}");
        }
        if 2 * pd.h > k.h || 2 * pd.w > k.w {
            bail!(
                "{op}: padding {} must be at most half the kernel {} (as PyTorch requires: every \
                 window must hold an input pixel)",
                pd,
                k
            );
        }
        if op == "avg_pool2d" && d != Hw::square(1) {
            bail!(
                "{op}: average pooling takes no dilation (PyTorch's AvgPool2d has none), got {d}"
            );
        }
        let out = |i: usize, k: usize, s: usize, pd: usize, d: usize| {
            pool_out_size(i, k, s, pd, d, p.ceil_mode).filter(|&o| o > 0)
        };
        match (
            out(s[2], k.h, st.h, pd.h, d.h),
            out(s[3], k.w, st.w, pd.w, d.w),
        ) {
            (Some(oh), Some(ow)) => Ok(PoolGeom {
                n: s[0],
                c: s[1],
                h: s[2],
                w: s[3],
                oh,
                ow,
                p,
            }),
            _ => bail!(
                "{op}: a {} kernel with dilation {} and padding {} does not fit a {}x{} input \
                 (output size would be below 1)",
                k,
                d,
                pd,
                s[2],
                s[3]
            ),
        }
    }

    pub fn max_pool2d(&self, p: Pool2dParams) -> Result<Tensor> {
        let g = self.pool_geom("max_pool2d", p)?;
        if !(crate::is_grad_enabled() && self.tracks_grad()) {
            // No backward will route a gradient: the values only, without each argmax.
            let y = self.storage().max_pool2d_values(self.layout(), &g)?;
            return Ok(Tensor::from_storage(y, &[g.n, g.c, g.oh, g.ow]));
        }
        let (y, arg) = self.storage().max_pool2d(self.layout(), &g)?;
        let xshape = self.shape().to_vec();
        Ok(output(
            y,
            &[g.n, g.c, g.oh, g.ow],
            "max_pool2d",
            &[self],
            move |gr, _| {
                let dx = gr.storage().max_pool2d_backward(gr.layout(), &arg, &g)?;
                Ok(vec![Some(Tensor::from_storage(dx, &xshape))])
            },
        ))
    }

    pub fn avg_pool2d(&self, p: Pool2dParams) -> Result<Tensor> {
        let g = self.pool_geom("avg_pool2d", p)?;
        let y = self.storage().avg_pool2d(self.layout(), &g)?;
        let xshape = self.shape().to_vec();
        Ok(output(
            y,
            &[g.n, g.c, g.oh, g.ow],
            "avg_pool2d",
            &[self],
            move |gr, _| {
                let dx = gr.storage().avg_pool2d_backward(gr.layout(), &g)?;
                Ok(vec![Some(Tensor::from_storage(dx, &xshape))])
            },
        ))
    }

    /// Layer norm over the last dimension with affine gamma and beta of that size (the op
    /// lives in `kernels/layer_norm/`).
    pub fn layer_norm(&self, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
        crate::kernels::layer_norm::layer_norm(self, gamma, beta, eps)
    }

    fn index_dtype(idx: &Tensor, op: &'static str) -> Result<()> {
        if idx.dtype() != DType::I64 {
            return Err(Error::DTypeMismatch {
                op,
                expected: DType::I64,
                got: idx.dtype(),
            });
        }
        Ok(())
    }

    /// Runs `f` with this i64 tensor as the indices of a primitive (`what` names the op;
    /// `checked`: already validated, see [`Tensor::indices_here`]).
    pub(crate) fn as_indices<R>(
        &self,
        what: IndexUse,
        checked: bool,
        f: impl FnOnce(Indices<'_, Storage>) -> Result<R>,
    ) -> Result<R> {
        let s = self.storage();
        f(Indices {
            ids: &s,
            layout: self.layout(),
            what,
            checked,
        })
    }

    /// `idx` as indices for a primitive on this tensor's device, and whether they are already
    /// checked: indices that live here are checked by the backend; indices from another device
    /// are read to the host, checked there (an immediate error naming the bad one) and moved
    /// here.
    pub(crate) fn indices_here(
        &self,
        idx: &Tensor,
        bound: usize,
        ignore: Option<i64>,
        what: IndexUse,
    ) -> Result<(Tensor, bool)> {
        Self::index_dtype(idx, what.name())?;
        if idx.device() == self.device() {
            return Ok((idx.clone(), false));
        }
        let v = idx.to_vec_i64()?;
        check_indices(&v, bound, ignore, what)?;
        Ok((Tensor::from_vec(v, idx.shape(), self.device())?, true))
    }

    /// Rows along `dim` picked by the 1-D i64 tensor `idx`. Backward is a scatter-add.
    pub fn index_select(&self, dim: isize, idx: &Tensor) -> Result<Tensor> {
        if self.dtype() == DType::Bool {
            // Rows of bools move as i64 rows (the backends gather numbers).
            return self
                .to_dtype(DType::I64)?
                .index_select(dim, idx)?
                .to_dtype(DType::Bool);
        }
        let d = resolve_dim("index_select", dim, self.rank())?;
        idx.expect_rank("index_select", 1, "indices")?;
        let g = IndexGeom::around(self.shape(), d);
        let what = IndexUse::IndexSelect;
        let (ids, checked) = self.indices_here(idx, g.n, None, what)?;
        let mut out_shape = self.shape().to_vec();
        out_shape[d] = ids.numel();
        let s = ids.as_indices(what, checked, |ix| {
            self.storage().index_select(self.layout(), ix, g)
        })?;
        let xshape = self.shape().to_vec();
        Ok(output(
            s,
            &out_shape,
            "index_select",
            &[self],
            move |gr, _| {
                let dx = ids.as_indices(what, true, |ix| {
                    gr.storage().index_select_backward(gr.layout(), ix, g)
                })?;
                Ok(vec![Some(Tensor::from_storage(dx, &xshape))])
            },
        ))
    }

    /// Rows of this [vocab, dim] table for each id of `ids` (any shape): [..ids, dim].
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        self.expect_rank("embedding", 2, "table")?;
        let flat = ids.reshape(&[ids.numel()])?;
        let rows = self
            .index_select(0, &flat)
            .map_err(|e| Error::Msg(format!("embedding: {e}")))?;
        let mut shape = ids.shape().to_vec();
        shape.push(self.shape()[1]);
        rows.reshape(&shape)
    }

    /// Adds `src` rows into a copy of this tensor at positions `idx` (1-D i64) along `dim`.
    pub fn index_add(&self, dim: isize, idx: &Tensor, src: &Tensor) -> Result<Tensor> {
        let d = resolve_dim("index_add", dim, self.rank())?;
        idx.expect_rank("index_add", 1, "indices")?;
        let g = IndexGeom::around(self.shape(), d);
        let mut expect = self.shape().to_vec();
        expect[d] = idx.numel();
        if src.shape() != expect {
            return Err(Error::ShapeMismatch {
                op: "index_add",
                lhs: expect,
                rhs: src.shape().to_vec(),
            });
        }
        let what = IndexUse::IndexAdd;
        let (ids, checked) = self.indices_here(idx, g.n, None, what)?;
        let s = ids.as_indices(what, checked, |ix| {
            self.storage()
                .index_add(self.layout(), ix, &src.storage(), src.layout(), g)
        })?;
        Ok(output(
            s,
            self.shape(),
            "index_add",
            &[self, src],
            move |gr, _| {
                Ok(vec![
                    Some(gr.clone()),
                    Some(gr.index_select(d as isize, &ids)?),
                ])
            },
        ))
    }

    /// Joins tensors along `dim`; all other dimensions must agree.
    pub fn cat(tensors: &[Tensor], dim: isize) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::Msg("cat: no tensors given".into()))?;
        let d = resolve_dim("cat", dim, first.rank())?;
        let mut shape = first.shape().to_vec();
        shape[d] = 0;
        for t in tensors {
            let ok = t.rank() == first.rank()
                && t.dtype() == first.dtype()
                && (0..t.rank()).all(|i| i == d || t.shape()[i] == first.shape()[i]);
            if !ok {
                return Err(Error::ShapeMismatch {
                    op: "cat",
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                });
            }
            if t.device() != first.device() {
                return Err(Error::DeviceMismatch {
                    op: "cat",
                    lhs: first.device(),
                    rhs: t.device(),
                });
            }
            shape[d] += t.shape()[d];
        }
        let mut out = Storage::alloc(first.device(), shape.iter().product(), first.dtype())?;
        let full = crate::Layout::contiguous(&shape);
        let mut start = 0;
        let mut sizes = Vec::new();
        for t in tensors {
            let len = t.shape()[d];
            let region = full.narrow(d, start, len)?;
            out.assign(&region, &t.storage(), t.layout())?;
            sizes.push((start, len));
            start += len;
        }
        let refs: Vec<&Tensor> = tensors.iter().collect();
        Ok(output(out, &shape, "cat", &refs, move |g, _| {
            sizes
                .iter()
                .map(|&(s, l)| Ok(Some(g.narrow(d as isize, s, l)?.contiguous()?)))
                .collect()
        }))
    }
    /// Stacks same-shaped tensors along a new dimension.
    pub fn stack(tensors: &[Tensor], dim: isize) -> Result<Tensor> {
        let parts = tensors
            .iter()
            .map(|t| t.unsqueeze(dim))
            .collect::<Result<Vec<_>>>()?;
        Tensor::cat(&parts, dim)
    }
    /// Views of consecutive pieces along `dim` with the given sizes.
    pub fn split(&self, sizes: &[usize], dim: isize) -> Result<Vec<Tensor>> {
        let d = resolve_dim("split", dim, self.rank())?;
        if sizes.iter().sum::<usize>() != self.shape()[d] {
            bail!(
                "split: sizes {sizes:?} do not add up to dimension {d} of {:?}",
                self.shape()
            );
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&s| {
                let t = self.narrow(d as isize, start, s);
                start += s;
                t
            })
            .collect()
    }
    /// `n` equal pieces along `dim`.
    pub fn chunk(&self, n: usize, dim: isize) -> Result<Vec<Tensor>> {
        let d = resolve_dim("chunk", dim, self.rank())?;
        if n == 0 || !self.shape()[d].is_multiple_of(n) {
            bail!(
                "chunk: dimension {d} of {:?} does not split into {n} equal pieces",
                self.shape()
            );
        }
        self.split(&vec![self.shape()[d] / n; n], dim)
    }

    /// `torch.where(cond, a, b)`: a where the bool `cond` is true, else b, all three broadcast
    /// together; a and b promote to their common dtype (`DType::promote`). The condition must
    /// be a bool tensor, as in PyTorch: compare first (`x.gt(&y)`) or convert with
    /// `to_dtype(DType::Bool)` (non-zero is true). Differentiable in a and b.
    pub fn where_cond(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        cond.bool_condition("where")?;
        if let Some((a, b)) = crate::amp::promote_operands(a, b)? {
            return Tensor::where_cond(cond, &a, &b);
        }
        if a.dtype() != b.dtype() {
            return Err(Error::DTypeMismatch {
                op: "where",
                expected: a.dtype(),
                got: b.dtype(),
            });
        }
        let shape = broadcast_shape(
            "where",
            &broadcast_shape("where", cond.shape(), a.shape())?,
            b.shape(),
        )?;
        let (lc, la, lb) = (
            cond.layout().broadcast_as(&shape)?,
            a.layout().broadcast_as(&shape)?,
            b.layout().broadcast_as(&shape)?,
        );
        let s = cond
            .storage()
            .where_cond(&lc, &a.storage(), &la, &b.storage(), &lb)?;
        if !a.dtype().is_float() {
            return Ok(Tensor::from_storage(s, &shape));
        }
        let (c, ash, bsh) = (cond.clone(), a.shape().to_vec(), b.shape().to_vec());
        Ok(output(s, &shape, "where", &[a, b], move |g, _| {
            let z = g.zeros_like()?;
            Ok(vec![
                Some(Tensor::where_cond(&c, g, &z)?.sum_to_shape(&ash)?),
                Some(Tensor::where_cond(&c, &z, g)?.sum_to_shape(&bsh)?),
            ])
        }))
    }
    /// `Tensor.masked_fill(mask, value)`: `value` where the bool `mask` (broadcast to this
    /// tensor's shape) is true, e.g. -inf above a causal diagonal. The mask must be a bool
    /// tensor, as in PyTorch.
    pub fn masked_fill(&self, mask: &Tensor, value: f32) -> Result<Tensor> {
        mask.bool_condition("masked_fill")?;
        let fill = Tensor::full(value as f64, &[], self.dtype(), self.device())?;
        Tensor::where_cond(mask, &fill, self)
    }
    /// An error unless this tensor is a bool condition (for `where` / `masked_fill`).
    fn bool_condition(&self, op: &'static str) -> Result<()> {
        if self.dtype() == DType::Bool {
            return Ok(());
        }
        bail!(
            "{op}: the condition must be a bool tensor, got {} of shape {:?}; compare first (e.g. x.gt(&y) or mask.ne(&zero)) or convert with to_dtype(DType::Bool) (non-zero is true)",
            self.dtype(),
            self.shape()
        )
    }

    /// Inverted dropout: zeroes each element with probability p and scales the rest by 1/(1-p).
    pub fn dropout(&self, p: f32, rng: &mut Rng) -> Result<Tensor> {
        if !(0.0..1.0).contains(&p) {
            bail!("dropout: probability must be in [0, 1), got {p}");
        }
        if p == 0.0 {
            return Ok(self.clone());
        }
        self.float_op("dropout")?;
        let (y, mask) = self.storage().dropout(self.layout(), p, rng)?;
        Ok(output(y, self.shape(), "dropout", &[self], move |g, _| {
            let dx = g.storage().dropout_backward(g.layout(), p, &mask)?;
            Ok(vec![Some(Tensor::from_storage(dx, g.shape()))])
        }))
    }
}
