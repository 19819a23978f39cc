//! Rust wrappers of the kernels: one module per kernel file. Each op has a pure `plan_*`
//! function (validates arguments, picks the kernel and grid, builds the argument list) and a
//! device function that runs the plan on the device's stream.

pub mod adamw;
pub mod binary;
pub mod boolean;
pub mod conv;
pub mod copy;
pub mod dropout;
pub mod embedding;
pub mod flash_attention;
pub mod int;
pub mod reduce;
pub mod unary;

use crate::alloc::DevSlice;
use crate::dtype::DType;
use crate::error::{CudaError, Result};
use crate::launch::{
    check_strided_bounds, coalesce, is_contiguous_coalesced, Arg, Launch, LaunchTarget, Step,
    StridedMeta, Traffic, ELEMWISE_BLOCK,
};
use crate::nvrtc::KernelFile;
use binary::StridedIn;

pub(crate) fn need_float(op: &'static str, d: DType) -> Result<()> {
    if d.is_float() {
        Ok(())
    } else {
        Err(CudaError::invalid(
            op,
            format!("needs f32, f16 or bf16, got {d}"),
        ))
    }
}

pub(crate) fn need_dtype(op: &'static str, what: &str, s: &DevSlice<'_>, d: DType) -> Result<()> {
    if s.dtype() == d {
        Ok(())
    } else {
        Err(CudaError::invalid(
            op,
            format!("{what} must be {d}, got {}", s.dtype()),
        ))
    }
}

pub(crate) fn need_len(op: &'static str, what: &str, s: &DevSlice<'_>, n: usize) -> Result<()> {
    if s.len() == n {
        Ok(())
    } else {
        Err(CudaError::invalid(
            op,
            format!("{what} has {} elements, expected {n}", s.len()),
        ))
    }
}

pub(crate) fn need(
    op: &'static str,
    what: &str,
    s: &DevSlice<'_>,
    d: DType,
    n: usize,
) -> Result<()> {
    need_dtype(op, what, s, d)?;
    need_len(op, what, s, n)
}

pub(crate) fn opt_need(
    op: &'static str,
    what: &str,
    s: &Option<DevSlice<'_>>,
    d: DType,
    n: usize,
) -> Result<()> {
    s.as_ref().map_or(Ok(()), |s| need(op, what, s, d, n))
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
fn coalesce_operands(
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

/// Plan one strided elementwise kernel, `kernel(in_0, .., out, n, StridedMeta)` with `n` the
/// elements of `shape`: every operand read through its strides (0 = broadcast), `out`
/// contiguous over `shape` (its dtype is the caller's to check). None for an empty shape.
pub(crate) fn plan_strided(
    t: &LaunchTarget,
    op: &'static str,
    (file, kernel): (KernelFile, String),
    ins: &[&StridedIn<'_>],
    out: DevSlice<'_>,
    shape: &[usize],
) -> Result<Option<Launch>> {
    let n = numel(op, shape)?;
    need_len(op, "out", &out, n)?;
    if n == 0 {
        return Ok(None);
    }
    let (cs, cst) = coalesce_operands(op, ins, shape)?;
    let meta = StridedMeta::new(&cs, &cst)?;
    let mut args: Vec<Arg> = ins.iter().map(|s| Arg::Ptr(s.data.ptr())).collect();
    args.extend([Arg::Ptr(out.ptr()), Arg::I64(n as i64), Arg::Strided(meta)]);
    // A broadcast operand (stride 0) is read once per distinct element.
    let read: usize = ins
        .iter()
        .zip(&cst)
        .map(|(s, st)| {
            let distinct: usize = cs
                .iter()
                .zip(st)
                .filter(|(_, &x)| x != 0)
                .map(|(&d, _)| d)
                .product();
            distinct * s.data.dtype().size()
        })
        .sum();
    Ok(Some(
        Launch::new(
            file,
            kernel,
            t.grid_for(n, ELEMWISE_BLOCK),
            ELEMWISE_BLOCK,
            args,
        )
        .with_traffic(Traffic::bytes(read, n * out.dtype().size()).with_flops(n)),
    ))
}

pub(crate) fn kname(base: &str, d: DType) -> String {
    format!("{base}_{}", d.suffix())
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

/// One sample plan per kernel instantiation that the wrappers can launch, built with fake
/// pointers. The NVRTC test checks each against the compiled PTX (name and parameter types) and
/// that no compiled kernel is left without a wrapper.
#[doc(hidden)]
pub fn sample_plans(t: &LaunchTarget) -> Vec<Launch> {
    let mut v = Vec::new();
    v.extend(unary::samples(t));
    v.extend(binary::samples(t));
    v.extend(copy::samples(t));
    v.extend(reduce::samples(t));
    v.extend(embedding::samples(t));
    v.extend(conv::samples(t));
    v.extend(dropout::samples(t));
    v.extend(adamw::samples(t));
    v.extend(int::samples(t));
    v.extend(flash_attention::samples(t));
    v.extend(boolean::samples(t));
    v
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn sample_plans_are_valid_and_cover_each_dtype() {
        let t = LaunchTarget { sm_count: 132 };
        let plans = sample_plans(&t);
        assert!(plans.len() > 300, "{}", plans.len());
        let mut names = HashSet::new();
        for p in &plans {
            p.validate().unwrap();
            names.insert(p.name.clone());
        }
        for n in [
            "add_f32",
            "add_bf16",
            "where_cond_f16",
            "cmp_lt_bool",
            "gelu_tanh_bwd_bf16",
            "cast_bf16_i64",
            "sum_mid_partial_f16",
            "embedding_bwd_bf16",
            "emb_bwd_scan",
            "adamw_copy_bf16",
            "adamw_multi_f32",
            "rand_normal_f16",
            "col2im_f32",
        ] {
            assert!(names.contains(n), "missing {n}");
        }
    }
}
