//! Differentiable neural-network ops with dedicated (fused) kernels: conv2d, pooling,
//! layer norm, cross-entropy, gather/scatter, concatenation, selection and dropout.

use crate::cpu::conv::{self, Conv2dParams, ConvGeom, Pool2dParams};
use crate::cpu::{self, CpuStorage};
use crate::layout::{broadcast_shape, resolve_dim};
use crate::storage::Storage;
use crate::tensor::output;
use crate::{bail, DType, Error, Result, Rng, Tensor};

fn f32_of(t: &Tensor) -> Vec<f32> {
    t.storage().cpu().f32_contiguous(t.layout()).into_owned()
}

impl Tensor {
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
        self.expect_rank("conv2d", 4, "input [n, c, h, w]")?;
        weight.expect_rank("conv2d", 4, "weight [o, c/groups, kh, kw]")?;
        let (xs, ws) = (self.shape(), weight.shape());
        if p.groups == 0 || p.stride == 0 || p.dilation == 0 {
            bail!("conv2d: stride, dilation and groups must be at least 1, got {p:?}");
        }
        if xs[1] % p.groups != 0 || ws[0] % p.groups != 0 || ws[1] * p.groups != xs[1] {
            return Err(Error::ShapeMismatch {
                op: "conv2d",
                lhs: xs.to_vec(),
                rhs: ws.to_vec(),
            });
        }
        let (oh, ow) = match (
            ConvGeom::out_size(xs[2], ws[2], &p),
            ConvGeom::out_size(xs[3], ws[3], &p),
        ) {
            (Some(a), Some(b)) if a > 0 && b > 0 => (a, b),
            _ => bail!(
                "conv2d: a {}x{} kernel does not fit a {}x{} input with {p:?}",
                ws[2],
                ws[3],
                xs[2],
                xs[3]
            ),
        };
        let g = ConvGeom {
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
        };
        // Under autocast, float operands are cast (differentiably) to the autocast dtype.
        if let Some((x, w)) = crate::amp::autocast_operands(self, weight)? {
            return x.conv2d(&w, p);
        }
        if self.device().is_cuda() || weight.device().is_cuda() {
            return crate::cuda::conv::conv2d(self, weight, &g);
        }
        let y = conv::conv2d_forward(&f32_of(self), &f32_of(weight), &g);
        let dtype = self.dtype();
        let (x, w) = (self.clone(), weight.clone());
        Ok(output(
            Storage::Cpu(CpuStorage::from_f32(y, dtype)),
            &[g.n, g.o, oh, ow],
            "conv2d",
            &[self, weight],
            move |gr, _| {
                let (want_dx, want_dw) = (x.tracks_grad(), w.tracks_grad());
                let (dx, dw) = conv::conv2d_backward(
                    &f32_of(&x),
                    &f32_of(&w),
                    &f32_of(gr),
                    &g,
                    want_dx,
                    want_dw,
                );
                let dx =
                    want_dx.then(|| Tensor::from_cpu(CpuStorage::from_f32(dx, dtype), x.shape()));
                let dw =
                    want_dw.then(|| Tensor::from_cpu(CpuStorage::from_f32(dw, dtype), w.shape()));
                Ok(vec![dx, dw])
            },
        ))
    }

    fn pool_geom(
        &self,
        op: &'static str,
        p: Pool2dParams,
    ) -> Result<(usize, usize, usize, usize, usize)> {
        self.expect_rank(op, 4, "input [n, c, h, w]")?;
        let s = self.shape();
        if p.kernel == 0 || p.stride == 0 || p.padding * 2 > p.kernel {
            bail!("{op}: kernel and stride must be ≥ 1 and padding at most half the kernel, got {p:?}");
        }
        let out = |d: usize| {
            (d + 2 * p.padding)
                .checked_sub(p.kernel)
                .map(|v| v / p.stride + 1)
        };
        match (out(s[2]), out(s[3])) {
            (Some(oh), Some(ow)) => Ok((s[0] * s[1], s[2], s[3], oh, ow)),
            _ => bail!(
                "{op}: kernel {} does not fit a {}x{} input",
                p.kernel,
                s[2],
                s[3]
            ),
        }
    }

    pub fn max_pool2d(&self, p: Pool2dParams) -> Result<Tensor> {
        let (planes, h, w, oh, ow) = self.pool_geom("max_pool2d", p)?;
        if self.device().is_cuda() {
            return crate::cuda::conv::max_pool2d(self, p);
        }
        let (y, arg) = conv::max_pool2d(&f32_of(self), planes, h, w, oh, ow, p);
        let dtype = self.dtype();
        let shape = [self.shape()[0], self.shape()[1], oh, ow];
        let xshape = self.shape().to_vec();
        Ok(output(
            Storage::Cpu(CpuStorage::from_f32(y, dtype)),
            &shape,
            "max_pool2d",
            &[self],
            move |g, _| {
                let dx = conv::max_pool2d_backward(&f32_of(g), &arg, planes, h * w, oh * ow);
                Ok(vec![Some(Tensor::from_cpu(
                    CpuStorage::from_f32(dx, dtype),
                    &xshape,
                ))])
            },
        ))
    }

    pub fn avg_pool2d(&self, p: Pool2dParams) -> Result<Tensor> {
        let (planes, h, w, oh, ow) = self.pool_geom("avg_pool2d", p)?;
        if self.device().is_cuda() {
            return crate::cuda::conv::avg_pool2d(self, p);
        }
        let y = conv::avg_pool2d(&f32_of(self), planes, h, w, oh, ow, p);
        let dtype = self.dtype();
        let shape = [self.shape()[0], self.shape()[1], oh, ow];
        let xshape = self.shape().to_vec();
        Ok(output(
            Storage::Cpu(CpuStorage::from_f32(y, dtype)),
            &shape,
            "avg_pool2d",
            &[self],
            move |g, _| {
                let dx = conv::avg_pool2d_backward(&f32_of(g), planes, h, w, oh, ow, p);
                Ok(vec![Some(Tensor::from_cpu(
                    CpuStorage::from_f32(dx, dtype),
                    &xshape,
                ))])
            },
        ))
    }

    /// Layer norm over the last dimension with affine gamma and beta of that size.
    pub fn layer_norm(&self, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
        let n = *self
            .shape()
            .last()
            .ok_or_else(|| Error::Msg("layer_norm: input is a scalar".into()))?;
        if n == 0 {
            bail!(
                "layer_norm: the normalised dimension of {:?} is empty",
                self.shape()
            );
        }
        for p in [gamma, beta] {
            if p.shape() != [n] {
                return Err(Error::ShapeMismatch {
                    op: "layer_norm",
                    lhs: self.shape().to_vec(),
                    rhs: p.shape().to_vec(),
                });
            }
        }
        if [self, gamma, beta].iter().any(|t| t.device().is_cuda()) {
            return crate::cuda::nn::layer_norm(self, gamma, beta, n, eps);
        }
        let x = f32_of(self);
        let (y, mean, rstd) = cpu::nn::layer_norm(&x, &f32_of(gamma), &f32_of(beta), n, eps);
        let dtype = self.dtype();
        let (xt, gt, bt) = (self.clone(), gamma.clone(), beta.clone());
        Ok(output(
            Storage::Cpu(CpuStorage::from_f32(y, dtype)),
            self.shape(),
            "layer_norm",
            &[self, gamma, beta],
            move |g, _| {
                let (dx, dg, db) = cpu::nn::layer_norm_backward(
                    &f32_of(&xt),
                    &f32_of(&gt),
                    &mean,
                    &rstd,
                    &f32_of(g),
                    n,
                );
                Ok(vec![
                    Some(Tensor::from_cpu(
                        CpuStorage::from_f32(dx, dtype),
                        xt.shape(),
                    )),
                    gt.tracks_grad()
                        .then(|| Tensor::from_cpu(CpuStorage::from_f32(dg, gt.dtype()), &[n])),
                    bt.tracks_grad()
                        .then(|| Tensor::from_cpu(CpuStorage::from_f32(db, bt.dtype()), &[n])),
                ])
            },
        ))
    }

    /// Mean cross-entropy of logits [..., c] against i64 class indices [...], fused with
    /// log-softmax; targets equal to `ignore_index` count for nothing.
    pub fn cross_entropy(&self, targets: &Tensor, ignore_index: i64) -> Result<Tensor> {
        let c = *self
            .shape()
            .last()
            .ok_or_else(|| Error::Msg("cross_entropy: logits are a scalar".into()))?;
        if targets.dtype() != DType::I64 {
            return Err(Error::DTypeMismatch {
                op: "cross_entropy",
                expected: DType::I64,
                got: targets.dtype(),
            });
        }
        if targets.shape() != &self.shape()[..self.rank() - 1] {
            return Err(Error::ShapeMismatch {
                op: "cross_entropy",
                lhs: self.shape().to_vec(),
                rhs: targets.shape().to_vec(),
            });
        }
        if self.device().is_cuda() {
            return crate::cuda::nn::cross_entropy(self, targets, c, ignore_index);
        }
        let logits = f32_of(self);
        let t = targets.to_vec_i64()?;
        let (total, count, lse) =
            cpu::nn::cross_entropy(&logits, &t, c, ignore_index).map_err(Error::Msg)?;
        let loss = (total / count as f64) as f32;
        let dtype = self.dtype();
        let shape = self.shape().to_vec();
        let s = Storage::Cpu(CpuStorage::from_f32(vec![loss], DType::F32));
        Ok(output(s, &[], "cross_entropy", &[self], move |g, _| {
            let scale = g.to_scalar_f32()? / count as f32;
            let d = cpu::nn::cross_entropy_backward(&logits, &t, &lse, c, ignore_index, scale);
            Ok(vec![Some(Tensor::from_cpu(
                CpuStorage::from_f32(d, dtype),
                &shape,
            ))])
        }))
    }

    /// Mean squared error against a target of the same shape.
    pub fn mse_loss(&self, target: &Tensor) -> Result<Tensor> {
        if self.shape() != target.shape() {
            return Err(Error::ShapeMismatch {
                op: "mse_loss",
                lhs: self.shape().to_vec(),
                rhs: target.shape().to_vec(),
            });
        }
        self.sub(target)?.sqr()?.mean_all()
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

    fn index_vec(idx: &Tensor, bound: usize, op: &'static str) -> Result<Vec<usize>> {
        Self::index_dtype(idx, op)?;
        idx.to_vec_i64()?
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                if v >= 0 && (v as usize) < bound {
                    Ok(v as usize)
                } else {
                    Err(Error::Msg(format!(
                        "{op}: index {v} at position {i} is outside 0..{bound}"
                    )))
                }
            })
            .collect()
    }

    /// Rows along `dim` picked by the 1-D i64 tensor `idx`. Backward is a scatter-add.
    pub fn index_select(&self, dim: isize, idx: &Tensor) -> Result<Tensor> {
        let d = resolve_dim("index_select", dim, self.rank())?;
        idx.expect_rank("index_select", 1, "indices")?;
        let shape = self.shape();
        let (outer, n, inner) = (
            shape[..d].iter().product::<usize>(),
            shape[d],
            shape[d + 1..].iter().product::<usize>(),
        );
        if self.device().is_cuda() && idx.device().is_cuda() {
            // Device ids stay on the device: checked there, no host round trip.
            Self::index_dtype(idx, "index_select")?;
            let mut out_shape = shape.to_vec();
            out_shape[d] = idx.numel();
            return crate::cuda::nn::index_select_device(self, idx, outer, n, inner, &out_shape);
        }
        let ids = Self::index_vec(idx, n, "index_select")?;
        let mut out_shape = shape.to_vec();
        out_shape[d] = ids.len();
        if self.device().is_cuda() {
            return crate::cuda::nn::index_select(self, &ids, outer, n, inner, &out_shape);
        }
        let st = {
            let s = self.storage();
            let c = s.cpu().gather(self.layout());
            crate::with_cpu_vec!(&c, v => cpu::nn::index_select(v, &ids, outer, n, inner).into())
        };
        let xshape = shape.to_vec();
        let dtype = self.dtype();
        Ok(output(
            Storage::Cpu(st),
            &out_shape,
            "index_select",
            &[self],
            move |g, _| {
                let mut dst = vec![0f32; outer * n * inner];
                cpu::nn::index_add(&mut dst, &f32_of(g), &ids, outer, n, inner);
                Ok(vec![Some(Tensor::from_cpu(
                    CpuStorage::from_f32(dst, dtype),
                    &xshape,
                ))])
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

    /// Adds `src` rows into a copy of this tensor at positions `idx` along `dim`.
    pub fn index_add(&self, dim: isize, idx: &Tensor, src: &Tensor) -> Result<Tensor> {
        let d = resolve_dim("index_add", dim, self.rank())?;
        let shape = self.shape();
        let (outer, n, inner) = (
            shape[..d].iter().product::<usize>(),
            shape[d],
            shape[d + 1..].iter().product::<usize>(),
        );
        let on_device =
            (self.device().is_cuda() || src.device().is_cuda()) && idx.device().is_cuda();
        // Device ids are checked on the device (see cuda::checks), host ids here.
        let ids = if on_device {
            Self::index_dtype(idx, "index_add")?;
            idx.expect_rank("index_add", 1, "indices")?;
            None
        } else {
            Some(Self::index_vec(idx, n, "index_add")?)
        };
        let mut expect = shape.to_vec();
        expect[d] = idx.numel();
        if src.shape() != expect {
            return Err(Error::ShapeMismatch {
                op: "index_add",
                lhs: expect,
                rhs: src.shape().to_vec(),
            });
        }
        if self.device().is_cuda() || src.device().is_cuda() {
            return crate::cuda::nn::index_add(self, d, idx, ids.as_deref(), src, outer, n, inner);
        }
        let ids = ids.expect("host ids are checked on the host");
        let mut dst = f32_of(self);
        cpu::nn::index_add(&mut dst, &f32_of(src), &ids, outer, n, inner);
        let idx = idx.clone();
        Ok(output(
            Storage::Cpu(CpuStorage::from_f32(dst, self.dtype())),
            shape,
            "index_add",
            &[self, src],
            move |g, _| {
                Ok(vec![
                    Some(g.clone()),
                    Some(g.index_select(d as isize, &idx)?),
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

    /// Elementwise `cond != 0 ? a : b`, all three broadcast together.
    pub fn where_cond(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
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
            let c = c.to_dtype(g.dtype())?;
            Ok(vec![
                Some(Tensor::where_cond(&c, g, &z)?.sum_to_shape(&ash)?),
                Some(Tensor::where_cond(&c, &z, g)?.sum_to_shape(&bsh)?),
            ])
        }))
    }
    /// Replaces elements where `mask` is non-zero by `value` (e.g. -inf above a causal diagonal).
    pub fn masked_fill(&self, mask: &Tensor, value: f32) -> Result<Tensor> {
        let fill = Tensor::full(value as f64, &[], self.dtype(), self.device())?;
        Tensor::where_cond(mask, &fill, self)
    }

    /// Inverted dropout: zeroes each element with probability p and scales the rest by 1/(1-p).
    pub fn dropout(&self, p: f32, rng: &mut Rng) -> Result<Tensor> {
        if !(0.0..1.0).contains(&p) {
            bail!("dropout: probability must be in [0, 1), got {p}");
        }
        if p == 0.0 {
            return Ok(self.clone());
        }
        if self.device().is_cuda() {
            return crate::cuda::random::dropout(self, p, rng);
        }
        let keep = 1.0 - p as f64;
        let scale = (1.0 / keep) as f32;
        let mask: Vec<f32> = (0..self.numel())
            .map(|_| if rng.next_f64() < keep { scale } else { 0.0 })
            .collect();
        let mask = Tensor::from_cpu(CpuStorage::from_f32(mask, self.dtype()), self.shape());
        self.mul(&mask)
    }
}

impl From<Vec<f32>> for CpuStorage {
    fn from(v: Vec<f32>) -> Self {
        CpuStorage::F32(v)
    }
}
impl From<Vec<half::f16>> for CpuStorage {
    fn from(v: Vec<half::f16>) -> Self {
        CpuStorage::F16(v)
    }
}
impl From<Vec<half::bf16>> for CpuStorage {
    fn from(v: Vec<half::bf16>) -> Self {
        CpuStorage::BF16(v)
    }
}
impl From<Vec<i64>> for CpuStorage {
    fn from(v: Vec<i64>) -> Self {
        CpuStorage::I64(v)
    }
}
