//! Automatic mixed precision, PyTorch style: master weights stay f32; inside an autocast region
//! the matrix products (`matmul`, `conv2d`) run in a lower-precision dtype (bf16 or f16, with
//! f32 accumulation), and elementwise ops between float tensors of different dtypes promote to
//! the wider one instead of failing.
//!
//! ```
//! use sinter_core::{amp, DType, Device, Tensor};
//! let x = Tensor::ones(&[2, 3], DType::F32, Device::Cpu).unwrap();
//! let w = Tensor::ones(&[3, 4], DType::F32, Device::Cpu).unwrap().to_var().unwrap();
//! let y = {
//!     let _ac = amp::autocast(DType::BF16);
//!     x.matmul(&w).unwrap() // bf16 operands, fp32 accumulation, bf16 result
//! };
//! assert_eq!(y.dtype(), DType::BF16);
//! y.sum_all().unwrap().backward().unwrap();
//! assert_eq!(w.grad().unwrap().dtype(), DType::F32); // the cast is differentiable
//! ```
//!
//! The autocast dtype is per thread (like `no_grad`); the guard restores the previous setting
//! when dropped, so regions nest. Run the backward pass outside the region, as with PyTorch
//! (inside works too: the gradients of the casts bring every gradient back to its input's
//! dtype either way).
//!
//! A Transformer's residual stream and its LayerNorms run in the autocast dtype too (llm.c's
//! bf16 activations; [`to_autocast_dtype`] at each block's entry), with f32 statistics and the
//! f32 parameters read by the kernels as they are.
//!
//! Otherwise only the matrix products are autocast: reductions and losses keep their input's
//! dtype (`cross_entropy` returns f32 for any logits). Compute a hand-written loss in f32 (cast
//! its input with `to_dtype`) so that fp16 loss scaling has the range it needs.
//!
//! Promotion rules (`promote_types`, the rule of `DType::promote`): equal dtypes stay; f32 with
//! bf16 or f16 gives f32; bf16 with f16 gives f32 (neither holds the other); i64 with a float
//! gives that float, bool with anything that other dtype (as in PyTorch). Elementwise ops and
//! `where_cond`'s value operands promote; a dtype mix in ops that do not (`cat`, and `matmul`
//! outside an autocast region) stays an error.

use std::cell::Cell;

use crate::{DType, Result, Tensor};

thread_local! {
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// The dtype matrix products run in on this thread, if an autocast region is active.
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.with(|a| a.get())
}

/// True inside an autocast region on this thread.
pub fn is_autocast_enabled() -> bool {
    autocast_dtype().is_some()
}

/// While alive, matmul and conv2d cast their float operands to the region's dtype (if any).
/// Restores the previous setting on drop.
#[must_use = "autocast ends when the guard is dropped"]
pub struct AutocastGuard {
    prev: Option<DType>,
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        AUTOCAST.with(|a| a.set(self.prev));
    }
}

/// Enters an autocast region computing matrix products in `dtype` (`F16` or `BF16`; `F32`
/// is allowed and means "compute in f32", which turns mixed-dtype products into f32 ones).
///
/// # Panics
/// If `dtype` is not a float type (a programming error, like an invalid shape literal).
pub fn autocast(dtype: DType) -> AutocastGuard {
    assert!(dtype.is_float(), "autocast: {dtype} is not a float dtype");
    let prev = AUTOCAST.with(|a| a.replace(Some(dtype)));
    AutocastGuard { prev }
}

/// Leaves any autocast region until the guard drops (for parts that must run in f32 within
/// one, e.g. a loss computed by hand).
pub fn autocast_disabled() -> AutocastGuard {
    let prev = AUTOCAST.with(|a| a.replace(None));
    AutocastGuard { prev }
}

/// `t` in the autocast dtype when a region is active and `t` is a float tensor of another
/// dtype (a differentiable cast), else `t` itself: where activations enter a model whose
/// activations all run in the region's dtype (a Transformer's residual stream).
pub fn to_autocast_dtype(t: &Tensor) -> Result<Tensor> {
    match autocast_dtype() {
        Some(dt) => cast_float(t, dt),
        None => Ok(t.clone()),
    }
}

/// The common dtype of two operands of an elementwise op, or None when they cannot be mixed
/// (different dtypes of which one is not a float).
pub fn promote_types(a: DType, b: DType) -> Option<DType> {
    DType::promote(a, b)
}

/// Casts a float tensor to `dtype` (differentiably) unless it already is; integers pass as is.
fn cast_float(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype || !t.dtype().is_float() {
        Ok(t.clone())
    } else {
        t.to_dtype(dtype)
    }
}

/// For a matrix product under autocast: the operands cast to the autocast dtype, or None when
/// there is nothing to do ([`autocast_inputs`]'s rule for two inputs).
pub(crate) fn autocast_operands(a: &Tensor, b: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    Ok(autocast_inputs(&[a, b])?.map(|c| {
        let [x, y]: [Tensor; 2] = c.try_into().expect("two inputs, two casts");
        (x, y)
    }))
}

/// For an op that runs wholly in the autocast dtype (a Linear with its bias, attention: as in
/// PyTorch, whose autocast casts every float input of these): the inputs cast to the region's
/// dtype, or None when there is nothing to do (no region, all already in it, or a non-float
/// input, which the op then rejects as usual).
pub(crate) fn autocast_inputs(ts: &[&Tensor]) -> Result<Option<Vec<Tensor>>> {
    let Some(dt) = autocast_dtype() else {
        return Ok(None);
    };
    if ts.iter().any(|t| !t.dtype().is_float()) || ts.iter().all(|t| t.dtype() == dt) {
        return Ok(None);
    }
    ts.iter()
        .map(|t| cast_float(t, dt))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// For an elementwise op: both operands in their promoted dtype, or None when they already
/// agree or cannot be promoted (the op then reports the mismatch). Float casts are
/// differentiable; an integer operand is converted (it has no gradient).
pub(crate) fn promote_operands(a: &Tensor, b: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    if a.dtype() == b.dtype() {
        return Ok(None);
    }
    match promote_types(a.dtype(), b.dtype()) {
        Some(dt) => Ok(Some((a.to_dtype(dt)?, b.to_dtype(dt)?))),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_nests_and_restores() {
        assert_eq!(autocast_dtype(), None);
        {
            let _a = autocast(DType::BF16);
            assert_eq!(autocast_dtype(), Some(DType::BF16));
            {
                let _b = autocast(DType::F16);
                assert_eq!(autocast_dtype(), Some(DType::F16));
                {
                    let _c = autocast_disabled();
                    assert!(!is_autocast_enabled());
                }
                assert_eq!(autocast_dtype(), Some(DType::F16));
            }
            assert_eq!(autocast_dtype(), Some(DType::BF16));
        }
        assert_eq!(autocast_dtype(), None);
    }

    #[test]
    fn promotion_table() {
        use DType::*;
        assert_eq!(promote_types(F32, BF16), Some(F32));
        assert_eq!(promote_types(F16, F32), Some(F32));
        assert_eq!(promote_types(BF16, F16), Some(F32));
        assert_eq!(promote_types(BF16, BF16), Some(BF16));
        assert_eq!(promote_types(I64, I64), Some(I64));
        assert_eq!(promote_types(I64, F32), Some(F32));
        assert_eq!(promote_types(BF16, I64), Some(BF16));
    }
}
