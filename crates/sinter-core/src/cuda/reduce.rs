//! Reductions over one dimension on the device: sum, max, min and argmax of a tensor viewed as
//! [outer, n, inner] — the last-dim kernels when inner = 1, the middle-dim ones otherwise. Float
//! sums accumulate in f32 in a fixed order (deterministic); i64 reductions are exact (int.cu);
//! bools reduce from their bytes (bool.cu).

use sinter_cuda::ops::reduce::{self as kr, ArgReduce};

use sinter_cuda::ops::boolean as kbool;
use sinter_cuda::ops::int as ki;

use super::storage::CudaStorage;
use super::{alloc, OnOp};
use crate::backend::reduced_dtype;
use crate::op::ReduceOp;
use crate::{DType, Layout, Result};

/// Reduces dimension `dim` of the elements `l` addresses (kept as size 1).
pub(crate) fn reduce_dim(
    x: &CudaStorage,
    l: &Layout,
    dim: usize,
    op: ReduceOp,
) -> Result<CudaStorage> {
    let shape = l.shape();
    let (outer, n, inner) = (
        shape[..dim].iter().product::<usize>(),
        shape[dim],
        shape[dim + 1..].iter().product::<usize>(),
    );
    let dev = x.device();
    if !x.dtype().is_float() {
        // i64: exact integer sums (wrapping), max/min, first-max argmax; bool: read as bytes
        // (count, any, all, first true). One thread per output.
        let xv = x.window(l)?;
        let out_dtype = reduced_dtype(op, x.dtype());
        let out = alloc(dev, outer * inner, out_dtype)?;
        let k = match op {
            ReduceOp::Sum => ki::IntReduce::Sum,
            ReduceOp::Max => ki::IntReduce::Max,
            ReduceOp::Min => ki::IntReduce::Min,
            ReduceOp::ArgMax => ki::IntReduce::ArgMax,
        };
        let (xs, os) = (xv.slice(), out.as_slice());
        if n == 0 {
            // Only a sum reaches here with an empty dimension.
            dev.zero(os).on("sum")?;
        } else if x.dtype() == DType::Bool {
            kbool::bool_reduce(dev, k, xs, os, outer, n, inner).on("reduce")?;
        } else {
            ki::int_reduce(dev, k, xs, os, outer, n, inner).on("reduce")?;
        }
        return Ok(x.sibling(out, out_dtype));
    }
    let d = x.dtype();
    let m = outer * inner;
    if n == 0 {
        // Only a sum reaches here with an empty dimension (the caller rejects the rest).
        return Ok(x.sibling(super::alloc_zeros(dev, m, d)?, d));
    }
    let xv = x.window(l)?;
    let xs = xv.slice();
    let name = match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Max => "max",
        ReduceOp::Min => "min",
        ReduceOp::ArgMax => "argmax",
    };
    let out = alloc(dev, m, d)?;
    let which = if op == ReduceOp::Min {
        ArgReduce::Min
    } else {
        ArgReduce::Max
    };
    match op {
        ReduceOp::Sum => {
            if inner == 1 {
                kr::sum_last(dev, xs, out.as_slice(), outer, n, 1.0).on(name)?;
            } else {
                kr::sum_mid(dev, xs, out.as_slice(), outer, n, inner, 1.0).on(name)?;
            }
        }
        ReduceOp::Max | ReduceOp::Min => {
            if inner == 1 {
                kr::arg_last(dev, which, xs, out.as_slice(), None, outer, n).on(name)?;
            } else {
                kr::arg_mid(dev, which, xs, out.as_slice(), None, outer, n, inner).on(name)?;
            }
        }
        ReduceOp::ArgMax => {
            let idx = alloc(dev, m, DType::I64)?;
            if inner == 1 {
                kr::arg_last(
                    dev,
                    which,
                    xs,
                    out.as_slice(),
                    Some(idx.as_slice()),
                    outer,
                    n,
                )
                .on(name)?;
            } else {
                kr::arg_mid(
                    dev,
                    which,
                    xs,
                    out.as_slice(),
                    Some(idx.as_slice()),
                    outer,
                    n,
                    inner,
                )
                .on(name)?;
            }
            return Ok(x.sibling(idx, DType::I64));
        }
    }
    Ok(x.sibling(out, d))
}
