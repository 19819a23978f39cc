//! What the kernel wrappers share: operand checks, strided-operand coalescing, the launch of
//! an optional plan, and fake slices for plan tests. Below every wrapper module (they import it;
//! it imports none of them).

use crate::alloc::DevSlice;
use crate::dtype::DType;
use crate::error::{CudaError, Result};
use crate::launch::{check_strided_bounds, coalesce, is_contiguous_coalesced, Launch, Step};

/// An operand viewed through element strides (relative to the slice start; 0 = broadcast).
#[derive(Clone, Copy, Debug)]
pub struct StridedIn<'a> {
    pub data: DevSlice<'a>,
    pub strides: &'a [i64],
}

pub(crate) fn ptr_of(s: &Option<DevSlice<'_>>) -> u64 {
    s.as_ref().map_or(0, |s| s.ptr())
}

/// The elements of `shape` (an error naming `op` when the product overflows).
pub(crate) fn numel(op: &'static str, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &s| acc.checked_mul(s))
        .ok_or_else(|| CudaError::invalid(op, "shape overflows"))
}

/// Check that each operand's strides stay inside its slice, then merge the dims that are
/// contiguous in all of them: the coalesced shape and per-operand strides.
pub(crate) fn coalesce_operands(
    op: &'static str,
    ins: &[&StridedIn<'_>],
    shape: &[usize],
) -> Result<(Vec<usize>, Vec<Vec<i64>>)> {
    for (k, s) in ins.iter().enumerate() {
        check_strided_bounds(
            op,
            ["first operand", "second operand", "third operand"][k],
            s.data.len(),
            shape,
            s.strides,
        )?;
    }
    let strides: Vec<&[i64]> = ins.iter().map(|s| s.strides).collect();
    Ok(coalesce(shape, &strides))
}

/// Whether every operand of `ins` reads `shape` contiguously once dims are merged (so a
/// contiguous kernel can take them), after the bounds check of [`coalesce_operands`].
pub(crate) fn all_contiguous(
    op: &'static str,
    ins: &[&StridedIn<'_>],
    shape: &[usize],
) -> Result<bool> {
    let (cs, cst) = coalesce_operands(op, ins, shape)?;
    Ok(cst.iter().all(|s| is_contiguous_coalesced(&cs, s)))
}

pub(crate) fn rows_times_n(op: &'static str, rows: usize, n: usize) -> Result<usize> {
    rows.checked_mul(n)
        .ok_or_else(|| CudaError::invalid(op, "rows * n overflows"))
}

/// Wrap an optional launch as steps.
pub(crate) fn steps(l: Option<Launch>) -> Vec<Step> {
    l.into_iter().map(Step::Kernel).collect()
}

/// Fake, distinct, 256-byte-aligned device slices for plan tests (never dereferenced).
#[doc(hidden)]
pub fn fake_slice(dtype: DType, len: usize) -> DevSlice<'static> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0x7f00_0000_0000);
    let bytes = ((len * dtype.size()) as u64).div_ceil(256) * 256 + 256;
    let p = NEXT.fetch_add(bytes, Ordering::Relaxed);
    // SAFETY: never dereferenced: only used to build launch plans in tests.
    unsafe { DevSlice::from_raw(p, len, dtype) }
}

/// Kernels of `steps`, dropping memsets.
#[doc(hidden)]
pub fn kernels_of(steps: Vec<Step>) -> Vec<Launch> {
    steps
        .into_iter()
        .filter_map(|s| match s {
            Step::Kernel(l) => Some(l),
            Step::Zero { .. } | Step::Copy { .. } => None,
        })
        .collect()
}
