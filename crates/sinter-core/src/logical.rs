//! Bool tensors (`DType::Bool`, PyTorch's `torch.bool`): the logical ops and the `any` / `all`
//! reductions. Each is a composite of comparisons and bool arithmetic (`+` on bools is or, `*`
//! is and, `ne` is xor), so it runs on every backend and records no gradient.
//!
//! Operands of any dtype are read as PyTorch reads them: non-zero (NaN included) is true.

use crate::{DType, Result, Tensor};

impl Tensor {
    /// This tensor as bools (itself when it already is one): non-zero, NaN included, is true.
    pub fn to_bool(&self) -> Result<Tensor> {
        self.to_dtype(DType::Bool)
    }
    /// A bool scalar on this tensor's device.
    fn bool_scalar(&self, v: bool) -> Result<Tensor> {
        Tensor::full(v as u8 as f64, &[], DType::Bool, self.device())
    }
    /// `torch.logical_and`: true where both (broadcast) operands are non-zero.
    pub fn logical_and(&self, rhs: &Tensor) -> Result<Tensor> {
        self.to_bool()?.mul(&rhs.to_bool()?)
    }
    /// `torch.logical_or`: true where either (broadcast) operand is non-zero.
    pub fn logical_or(&self, rhs: &Tensor) -> Result<Tensor> {
        self.to_bool()?.add(&rhs.to_bool()?)
    }
    /// `torch.logical_xor`: true where exactly one (broadcast) operand is non-zero.
    pub fn logical_xor(&self, rhs: &Tensor) -> Result<Tensor> {
        self.to_bool()?.ne(&rhs.to_bool()?)
    }
    /// `torch.logical_not`: true where this tensor is zero.
    pub fn logical_not(&self) -> Result<Tensor> {
        self.to_bool()?.eq(&self.bool_scalar(false)?)
    }

    /// `torch.any` over `dims` (kept as size 1 when `keepdim`): true where some element is
    /// non-zero; over an empty dimension false.
    pub fn any(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.count_true(dims, keepdim)?
            .gt(&Tensor::zeros(&[], DType::I64, self.device())?)
    }
    /// `torch.all` over `dims` (kept as size 1 when `keepdim`): true where every element is
    /// non-zero; over an empty dimension true.
    pub fn all(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let n: usize = self
            .resolve_dims("all", dims)?
            .iter()
            .map(|&d| self.shape()[d])
            .product();
        let n = Tensor::full(n as f64, &[], DType::I64, self.device())?;
        self.count_true(dims, keepdim)?.eq(&n)
    }
    /// `torch.any` of every element (a bool scalar; false for an empty tensor).
    pub fn any_all(&self) -> Result<Tensor> {
        self.any(&self.all_dims(), false)
    }
    /// `torch.all` of every element (a bool scalar; true for an empty tensor).
    pub fn all_all(&self) -> Result<Tensor> {
        self.all(&self.all_dims(), false)
    }
    fn all_dims(&self) -> Vec<isize> {
        (0..self.rank() as isize).collect()
    }
    /// The number of true values over `dims` (i64, exact; counted from the bools themselves).
    fn count_true(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.to_bool()?.sum(dims, keepdim)
    }
}
