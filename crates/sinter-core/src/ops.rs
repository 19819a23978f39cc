//! Differentiable math: elementwise ops with broadcasting, reductions, softmax, matmul.
//! Every backward is written in terms of these same ops, so it runs on any backend.

use crate::layout::{broadcast_shape, resolve_dim};
use crate::op::{BinaryOp, ReduceOp, UnaryOp};
use crate::storage::Storage;
use crate::tensor::output;
use crate::{bail, DType, Error, Result, Tensor};

impl Tensor {
    fn same_device(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if self.device() != other.device() {
            return Err(Error::DeviceMismatch {
                op,
                lhs: self.device(),
                rhs: other.device(),
            });
        }
        Ok(())
    }

    // ---- unary ------------------------------------------------------------------------------

    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        if !self.dtype().is_float() {
            bail!("{}: needs a float tensor, got {}", op.name(), self.dtype());
        }
        let s = self.storage().unary(self.layout(), op)?;
        let x = self.clone();
        Ok(output(s, self.shape(), op.name(), &[self], move |g, y| {
            Ok(vec![Some(Tensor::unary_backward(op, &x, y, g)?)])
        }))
    }
    /// grad_out · f'(x) in one pass.
    pub(crate) fn unary_backward(
        op: UnaryOp,
        x: &Tensor,
        y: &Tensor,
        g: &Tensor,
    ) -> Result<Tensor> {
        let s = g.storage().unary_backward(
            g.layout(),
            op,
            &x.storage(),
            x.layout(),
            &y.storage(),
            y.layout(),
        )?;
        Ok(Tensor::from_storage(s, g.shape()))
    }
    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg)
    }
    pub fn exp(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Exp)
    }
    pub fn log(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Log)
    }
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqrt)
    }
    pub fn sqr(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqr)
    }
    pub fn recip(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Recip)
    }
    pub fn abs(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Abs)
    }
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Tanh)
    }
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sigmoid)
    }
    pub fn relu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Relu)
    }
    /// GELU, tanh approximation.
    pub fn gelu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::GeluTanh)
    }
    /// GELU, exact erf form.
    pub fn gelu_erf(&self) -> Result<Tensor> {
        self.unary(UnaryOp::GeluErf)
    }
    pub fn silu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Silu)
    }
    pub fn powf(&self, e: f32) -> Result<Tensor> {
        self.unary(UnaryOp::Powf(e))
    }
    /// x · mul + add.
    pub fn affine(&self, mul: f32, add: f32) -> Result<Tensor> {
        self.unary(UnaryOp::Affine(mul, add))
    }
    pub fn mul_scalar(&self, v: f32) -> Result<Tensor> {
        self.affine(v, 0.0)
    }
    pub fn add_scalar(&self, v: f32) -> Result<Tensor> {
        self.affine(1.0, v)
    }

    // ---- binary with broadcasting -------------------------------------------------------------

    pub fn binary(&self, rhs: &Tensor, op: BinaryOp) -> Result<Tensor> {
        self.same_device(op.name(), rhs)?;
        if op == BinaryOp::Div && !self.dtype().is_float() && !rhs.dtype().is_float() {
            // True division, as PyTorch's `/`: integers divide as f32 (its default float).
            return self
                .to_dtype(DType::F32)?
                .binary(&rhs.to_dtype(DType::F32)?, op);
        }
        // Mixed dtypes promote (`DType::promote`: the wider float; an integer meets a float as
        // that float); float casts are differentiable.
        if let Some((a, b)) = crate::amp::promote_operands(self, rhs)? {
            return a.binary(&b, op);
        }
        if self.dtype() != rhs.dtype() {
            return Err(Error::DTypeMismatch {
                op: op.name(),
                expected: self.dtype(),
                got: rhs.dtype(),
            });
        }
        let shape = broadcast_shape(op.name(), self.shape(), rhs.shape())?;
        if self.dtype() == DType::Bool && op.apply_bool(false, false).is_none() {
            return Err(Error::bool_operands(op));
        }
        if op == BinaryOp::FloorDiv && !rhs.dtype().is_float() {
            rhs.no_zero_divisor()?;
        }
        let (la, lb) = (
            self.layout().broadcast_as(&shape)?,
            rhs.layout().broadcast_as(&shape)?,
        );
        let s = self.storage().binary(&la, &rhs.storage(), &lb, op)?;
        // Comparisons (bool) and floor division are piecewise constant: no gradient (PyTorch's
        // is 0).
        if op.is_comparison() || op == BinaryOp::FloorDiv || !self.dtype().is_float() {
            return Ok(Tensor::from_storage(s, &shape));
        }
        let (a, b) = (self.clone(), rhs.clone());
        Ok(output(s, &shape, op.name(), &[self, rhs], move |g, _| {
            let (ga, gb) = match op {
                BinaryOp::Add => (g.clone(), g.clone()),
                BinaryOp::Sub => (g.clone(), g.neg()?),
                BinaryOp::Mul => (g.mul(&b)?, g.mul(&a)?),
                BinaryOp::Div => (g.div(&b)?, g.mul(&a)?.div(&b.sqr()?)?.neg()?),
                BinaryOp::Maximum | BinaryOp::Minimum => {
                    let pick_a = if op == BinaryOp::Maximum {
                        a.ge(&b)?
                    } else {
                        a.le(&b)?
                    };
                    let zeros = g.zeros_like()?;
                    (
                        Tensor::where_cond(&pick_a, g, &zeros)?,
                        Tensor::where_cond(&pick_a, &zeros, g)?,
                    )
                }
                _ => unreachable!("comparisons and floor division record no node"),
            };
            let want_a = a
                .tracks_grad()
                .then(|| ga.sum_to_shape(a.shape()))
                .transpose()?;
            let want_b = b
                .tracks_grad()
                .then(|| gb.sum_to_shape(b.shape()))
                .transpose()?;
            Ok(vec![want_a, want_b])
        }))
    }
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Add)
    }
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Sub)
    }
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Mul)
    }
    /// True division (PyTorch's `/` and `torch.div`): integer operands divide as f32, so
    /// [-7, 7] / [2, -2] = [-3.5, -3.5]; x / 0 is ±inf, and 0 / 0 NaN.
    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Div)
    }
    /// `torch.floor_divide` (Python's `//`): the quotient rounded toward −∞, in the operands'
    /// (promoted) dtype: [-7, 7] // [2, -2] = [-4, -4]. Floats follow IEEE for a zero divisor
    /// (±inf, NaN); an integer division by zero is an error, as PyTorch's `ZeroDivisionError`
    /// (checking it reads the integer divisor to the host). No gradient.
    pub fn floor_divide(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::FloorDiv)
    }
    /// An error naming the first zero of this integer divisor, if it has one.
    fn no_zero_divisor(&self) -> Result<()> {
        let v = self.to_vec_i64()?;
        if let Some(at) = v.iter().position(|&x| x == 0) {
            bail!(
                "floor_divide: integer division by zero (element {at} of the divisor, shape {:?}, is 0); divide as floats (`div`) for ±inf, or keep the divisor non-zero",
                self.shape()
            );
        }
        Ok(())
    }
    pub fn maximum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Maximum)
    }
    pub fn minimum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Minimum)
    }
    /// `torch.eq`: a bool tensor, true where the (promoted, broadcast) operands are equal.
    /// NaN equals nothing, itself included. The comparisons `eq`, `ne`, `lt`, `le`, `gt`, `ge`
    /// all return `DType::Bool` (as PyTorch's do), have no gradient, and follow IEEE for NaN:
    /// `ne` is true and every other comparison false when either side is NaN.
    pub fn eq(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Eq)
    }
    pub fn ne(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Ne)
    }
    pub fn lt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Lt)
    }
    pub fn le(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Le)
    }
    pub fn gt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Gt)
    }
    pub fn ge(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Ge)
    }

    // ---- reductions ---------------------------------------------------------------------------

    /// Reduces one dimension (kept as size 1): the output storage and shape.
    fn reduce_dim(&self, dim: usize, op: ReduceOp) -> Result<(Storage, Vec<usize>)> {
        let s = self.storage().reduce(self.layout(), dim, op)?;
        let mut out_shape = self.shape().to_vec();
        out_shape[dim] = 1;
        Ok((s, out_shape))
    }

    fn squeeze_dims(&self, dims: &[usize]) -> Result<Tensor> {
        let mut t = self.clone();
        let mut ds = dims.to_vec();
        ds.sort_unstable();
        for &d in ds.iter().rev() {
            t = t.squeeze(d as isize)?;
        }
        Ok(t)
    }

    pub(crate) fn resolve_dims(&self, op: &'static str, dims: &[isize]) -> Result<Vec<usize>> {
        let mut out = dims
            .iter()
            .map(|&d| resolve_dim(op, d, self.rank()))
            .collect::<Result<Vec<_>>>()?;
        out.sort_unstable();
        // PyTorch refuses a dimension named twice (as 0 and -2, say) rather than reducing once.
        if let Some(w) = out.windows(2).find(|w| w[0] == w[1]) {
            bail!(
                "{op}: dim {} appears multiple times in the list of dims {dims:?} (shape {:?})",
                w[0],
                self.shape()
            );
        }
        Ok(out)
    }

    /// Sum over `dims`; keeps them as size 1 when `keepdim`. A bool tensor sums as i64 (the
    /// count of true values), as in PyTorch.
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let ds = self.resolve_dims("sum", dims)?;
        let mut t = self.clone();
        for &d in &ds {
            let (s, shape) = t.reduce_dim(d, ReduceOp::Sum)?;
            let src_shape = t.shape().to_vec();
            t = output(s, &shape, "sum", &[&t], move |g, _| {
                Ok(vec![Some(g.broadcast_as(&src_shape)?.contiguous()?)])
            });
        }
        if keepdim {
            Ok(t)
        } else {
            t.squeeze_dims(&ds)
        }
    }
    pub fn sum_all(&self) -> Result<Tensor> {
        let all: Vec<isize> = (0..self.rank() as isize).collect();
        self.sum(&all, false)
    }
    /// Mean over `dims`; over an empty dimension it is NaN (0 / 0), as in PyTorch.
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let ds = self.resolve_dims("mean", dims)?;
        // PyTorch refuses the mean of integers and bools too (it cannot infer an output dtype).
        self.float_op("mean")?;
        let count: usize = ds.iter().map(|&d| self.shape()[d]).product();
        // 1 / 0 = inf, and the empty sum's 0 · inf is NaN.
        self.sum(dims, keepdim)?.mul_scalar(1.0 / count as f32)
    }
    /// Mean of every element; NaN for an empty tensor.
    pub fn mean_all(&self) -> Result<Tensor> {
        self.float_op("mean")?;
        self.sum_all()?.mul_scalar(1.0 / self.numel() as f32)
    }
    /// `torch.var`: Σ (x − mean)² / max(0, N − correction) over `dims` (N elements each), so
    /// `correction` 1 is Bessel's (PyTorch's default) and 0 the population variance; N ≤
    /// correction gives NaN (or inf), as in PyTorch. Computed in f32 from the mean (two passes)
    /// and returned in the input's dtype; differentiable.
    pub fn var(&self, dims: &[isize], correction: f64, keepdim: bool) -> Result<Tensor> {
        let ds = self.resolve_dims("var", dims)?;
        self.float_op("var")?;
        let n: usize = ds.iter().map(|&d| self.shape()[d]).product();
        let x = self.to_dtype(DType::F32)?;
        let deviation = x.sub(&x.mean(dims, true)?)?;
        let squares = deviation.sqr()?.sum(dims, keepdim)?;
        let denominator = (n as f64 - correction).max(0.0);
        squares
            .mul_scalar((1.0 / denominator) as f32)?
            .to_dtype(self.dtype())
    }
    /// `torch.std`: the square root of [`Tensor::var`]. Where the std is 0 (a constant row)
    /// the gradient is 0, as in PyTorch: sqrt's g / (2·std) is infinite there, and the
    /// variance's backward would turn it into inf · 0 = NaN.
    pub fn std(&self, dims: &[isize], correction: f64, keepdim: bool) -> Result<Tensor> {
        self.float_op("std")?;
        let dtype = self.dtype();
        let var = self.to_dtype(DType::F32)?.var(dims, correction, keepdim)?;
        let s = var.storage().unary(var.layout(), UnaryOp::Sqrt)?;
        let std = output(s, var.shape(), "std", &[&var], |g, y| {
            let zero = y.zeros_like()?;
            let dvar = g.div(&y.mul_scalar(2.0)?)?;
            Ok(vec![Some(Tensor::where_cond(&y.eq(&zero)?, &zero, &dvar)?)])
        });
        std.to_dtype(dtype)
    }
    /// Maximum over one dimension. Gradient goes to the maximal elements (split among ties).
    pub fn max(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.extremum(dim, keepdim, ReduceOp::Max)
    }
    pub fn min(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.extremum(dim, keepdim, ReduceOp::Min)
    }
    fn extremum(&self, dim: isize, keepdim: bool, op: ReduceOp) -> Result<Tensor> {
        let d = resolve_dim("max", dim, self.rank())?;
        let (s, shape) = self.reduce_dim(d, op)?;
        let x = self.clone();
        let t = output(s, &shape, "max", &[self], move |g, y| {
            let hit = x.eq(&y.broadcast_as(x.shape())?)?.to_dtype(x.dtype())?;
            let share = hit.div(&hit.sum(&[d as isize], true)?)?;
            Ok(vec![Some(g.broadcast_as(x.shape())?.mul(&share)?)])
        });
        if keepdim {
            Ok(t)
        } else {
            t.squeeze(d as isize)
        }
    }
    /// Index of the maximum along `dim` (i64).
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        let d = resolve_dim("argmax", dim, self.rank())?;
        let (s, shape) = self.reduce_dim(d, ReduceOp::ArgMax)?;
        let t = Tensor::from_storage(s, &shape);
        if keepdim {
            Ok(t)
        } else {
            t.squeeze(d as isize)
        }
    }
    /// Sums a broadcast gradient back down to `shape` (the adjoint of broadcasting).
    pub fn sum_to_shape(&self, shape: &[usize]) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let lead = self.rank() - shape.len();
        let mut dims: Vec<isize> = (0..lead as isize).collect();
        for (i, &d) in shape.iter().enumerate() {
            if d == 1 && self.shape()[lead + i] != 1 {
                dims.push((lead + i) as isize);
            }
        }
        self.sum(&dims, true)?.reshape(shape)
    }

    // ---- softmax --------------------------------------------------------------------------------

    /// Softmax over `dim` (the op lives in `kernels/softmax/`).
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        crate::kernels::softmax::softmax(self, dim, false)
    }
    /// Log-softmax over `dim` (the op lives in `kernels/softmax/`).
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        crate::kernels::softmax::softmax(self, dim, true)
    }

    // ---- matmul -----------------------------------------------------------------------------------

    /// `torch.matmul`: [..., m, k] @ [..., k, n] with the leading (batch) dimensions
    /// broadcast. A 1-D operand is a row on the left and a column on the right, and that
    /// dimension is removed from the result (vector · vector is a scalar). Floats are
    /// differentiable; i64 products are exact and wrap on overflow, like PyTorch's CPU.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.same_device("matmul", rhs)?;
        if self.rank() == 0 || rhs.rank() == 0 {
            bail!(
                "matmul: both operands need at least 1 dimension, got {:?} and {:?}",
                self.shape(),
                rhs.shape()
            );
        }
        if self.rank() == 1 || rhs.rank() == 1 {
            return self.matmul_vectors(rhs);
        }
        // Under autocast, float operands are cast (differentiably) to the autocast dtype.
        if let Some((a, b)) = crate::amp::autocast_operands(self, rhs)? {
            return a.matmul(&b);
        }
        if self.dtype() != rhs.dtype() {
            return Err(Error::DTypeMismatch {
                op: "matmul",
                expected: self.dtype(),
                got: rhs.dtype(),
            });
        }
        if !self.dtype().is_tensor_dtype() || self.dtype() == DType::Bool {
            return Err(Error::UnsupportedDType {
                op: "matmul",
                dtype: self.dtype(),
                supported: "f32, f16, bf16 or i64",
            });
        }
        let (ra, rb) = (self.rank(), rhs.rank());
        let (m, k) = (self.shape()[ra - 2], self.shape()[ra - 1]);
        let (k2, n) = (rhs.shape()[rb - 2], rhs.shape()[rb - 1]);
        if k != k2 {
            return Err(Error::ShapeMismatch {
                op: "matmul",
                lhs: self.shape().to_vec(),
                rhs: rhs.shape().to_vec(),
            });
        }
        let batch_shape =
            broadcast_shape("matmul", &self.shape()[..ra - 2], &rhs.shape()[..rb - 2])?;
        let full = |mm: usize, nn: usize| [batch_shape.clone(), vec![mm, nn]].concat();
        let la = self.layout().broadcast_as(&full(m, k))?;
        let lb = rhs.layout().broadcast_as(&full(k, n))?;
        let s = self.storage().matmul(&la, &rhs.storage(), &lb)?;
        let shape = full(m, n);
        if !self.dtype().is_float() {
            return Ok(Tensor::from_storage(s, &shape));
        }
        let (a, b) = (self.clone(), rhs.clone());
        Ok(output(s, &shape, "matmul", &[self, rhs], move |g, _| {
            let ga = a
                .tracks_grad()
                .then(|| g.matmul(&b.t()?)?.sum_to_shape(a.shape()))
                .transpose()?;
            let gb = b
                .tracks_grad()
                .then(|| a.t()?.matmul(g)?.sum_to_shape(b.shape()))
                .transpose()?;
            Ok(vec![ga, gb])
        }))
    }
}

impl Tensor {
    /// `matmul` with a 1-D operand: the vector as a [1, k] row (left) or a [k, 1] column
    /// (right), then that dimension squeezed out of the product.
    fn matmul_vectors(&self, rhs: &Tensor) -> Result<Tensor> {
        let k_left = self.shape()[self.rank() - 1];
        let k_right = rhs.shape()[rhs.rank().saturating_sub(2)];
        if k_left != k_right {
            bail!(
                "matmul: the inner dimensions differ: {:?} @ {:?} ({k_left} vs {k_right})",
                self.shape(),
                rhs.shape()
            );
        }
        let (row, col) = (self.rank() == 1, rhs.rank() == 1);
        let a = if row {
            self.unsqueeze(0)?
        } else {
            self.clone()
        };
        let b = if col { rhs.unsqueeze(1)? } else { rhs.clone() };
        let y = a.matmul(&b)?;
        match (row, col) {
            (true, true) => y.squeeze(-1)?.squeeze(-1),
            (true, false) => y.squeeze(-2),
            _ => y.squeeze(-1),
        }
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Tensor>();
    let _ = DType::F32;
}
