//! The operand checks the launch plans share (and cuDNN's calls): dtype and length of a device
//! slice, with errors that name the op and the operand. Imports nothing above the allocator.

use crate::alloc::DevSlice;
use crate::dtype::DType;
use crate::error::{CudaError, Result};

pub fn need_float(op: &'static str, d: DType) -> Result<()> {
    if d.is_float() {
        Ok(())
    } else {
        Err(CudaError::invalid(
            op,
            format!("needs f32, f16 or bf16, got {d}"),
        ))
    }
}

pub fn need_dtype(op: &'static str, what: &str, s: &DevSlice<'_>, d: DType) -> Result<()> {
    if s.dtype() == d {
        Ok(())
    } else {
        Err(CudaError::invalid(
            op,
            format!("{what} must be {d}, got {}", s.dtype()),
        ))
    }
}

pub fn need_len(op: &'static str, what: &str, s: &DevSlice<'_>, n: usize) -> Result<()> {
    if s.len() == n {
        Ok(())
    } else {
        Err(CudaError::invalid(
            op,
            format!("{what} has {} elements, expected {n}", s.len()),
        ))
    }
}

pub fn need(op: &'static str, what: &str, s: &DevSlice<'_>, d: DType, n: usize) -> Result<()> {
    need_dtype(op, what, s, d)?;
    need_len(op, what, s, n)
}

pub fn opt_need(
    op: &'static str,
    what: &str,
    s: &Option<DevSlice<'_>>,
    d: DType,
    n: usize,
) -> Result<()> {
    s.as_ref().map_or(Ok(()), |s| need(op, what, s, d, n))
}
