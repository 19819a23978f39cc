//! Elementwise primitives on the device: unary maps and their backward, binary ops over
//! strided/broadcast operands, where, dtype casts, strided copies (contiguous, assign).
//!
//! Float math runs in f32 in the kernels and rounds once to f16/bf16, like the CPU backend.
//! Integer (i64) arithmetic runs in the i64 kernels of `int.cu`, exact and wrapping like the
//! CPU. Comparisons (bool outputs), two-bool ops and `where` (bool condition, any tensor dtype)
//! run in `bool.cu`.

use sinter_cuda::ops::binary::{self as kb, StridedIn};
use sinter_cuda::ops::boolean as kbool;
use sinter_cuda::ops::int as ki;
use sinter_cuda::ops::unary::{self as ku, Saved};

use super::storage::{CudaStorage, DevView};
use super::{alloc, strides_i64, OnOp};
use crate::backend::check_where;
use crate::op::{BinaryOp, UnaryOp};
use crate::{DType, Error, Layout, Result};

fn kernel_unary(op: UnaryOp) -> Option<ku::UnaryOp> {
    Some(match op {
        UnaryOp::Neg => ku::UnaryOp::Neg,
        UnaryOp::Exp => ku::UnaryOp::Exp,
        UnaryOp::Log => ku::UnaryOp::Log,
        UnaryOp::Sqrt => ku::UnaryOp::Sqrt,
        UnaryOp::Recip => ku::UnaryOp::Recip,
        UnaryOp::Abs => ku::UnaryOp::Abs,
        UnaryOp::Tanh => ku::UnaryOp::Tanh,
        UnaryOp::Sigmoid => ku::UnaryOp::Sigmoid,
        UnaryOp::Relu => ku::UnaryOp::Relu,
        UnaryOp::GeluTanh => ku::UnaryOp::GeluTanh,
        UnaryOp::GeluErf => ku::UnaryOp::GeluErf,
        UnaryOp::Silu => ku::UnaryOp::Silu,
        UnaryOp::Powf(e) => ku::UnaryOp::Powf(e),
        UnaryOp::Affine(mul, add) => ku::UnaryOp::Affine { mul, add },
        // x² is computed exactly as x·x (the binary kernel); its backward is powf's with p = 2.
        UnaryOp::Sqr => return None,
    })
}

/// y = op(x) (x float; the caller checked).
pub(crate) fn unary(x: &CudaStorage, l: &Layout, op: UnaryOp) -> Result<CudaStorage> {
    let dev = x.device();
    let xv = x.window(l)?;
    let y = alloc(dev, xv.len, x.dtype())?;
    match kernel_unary(op) {
        Some(k) => ku::unary(dev, k, xv.slice(), y.as_slice()).on(op.name())?,
        None => {
            kb::binary(dev, kb::BinaryOp::Mul, xv.slice(), xv.slice(), y.as_slice()).on(op.name())?
        }
    }
    Ok(x.sibling(y, x.dtype()))
}

/// grad_in = grad_out · f'(x), from x, y = f(x) and grad_out `g` (all of one shape).
pub(crate) fn unary_backward(
    g: &CudaStorage,
    gl: &Layout,
    op: UnaryOp,
    x: (&CudaStorage, &Layout),
    y: (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let dev = g.device();
    let d = g.dtype();
    let k = kernel_unary(op).unwrap_or(ku::UnaryOp::Powf(2.0));
    let gv = g.window(gl)?;
    let saved = match k.saves() {
        Saved::Input => x.0.window_as(x.1, d)?,
        Saved::Output => y.0.window_as(y.1, d)?,
        Saved::Nothing => gv.clone(),
    };
    let gx = alloc(dev, gv.len, d)?;
    ku::unary_backward(dev, k, saved.slice(), gv.slice(), gx.as_slice()).on(op.name())?;
    Ok(g.sibling(gx, d))
}

/// The arithmetic kernel of `op`; None for a comparison (a bool kernel, [`kernel_bool`]).
fn kernel_binary(op: BinaryOp) -> Option<kb::BinaryOp> {
    Some(match op {
        BinaryOp::Add => kb::BinaryOp::Add,
        BinaryOp::Sub => kb::BinaryOp::Sub,
        BinaryOp::Mul => kb::BinaryOp::Mul,
        BinaryOp::Div => kb::BinaryOp::Div,
        BinaryOp::FloorDiv => kb::BinaryOp::FloorDiv,
        BinaryOp::Maximum => kb::BinaryOp::Maximum,
        BinaryOp::Minimum => kb::BinaryOp::Minimum,
        _ => return None,
    })
}

/// The bool-writing kernel of `op` for a comparison, or for two bool operands (`+` and maximum
/// are or, `*` and minimum and, as `BinaryOp::apply_bool`); None where PyTorch refuses two
/// bools.
fn kernel_bool(op: BinaryOp) -> Option<kbool::BoolOp> {
    Some(match op {
        BinaryOp::Eq => kbool::BoolOp::Eq,
        BinaryOp::Ne => kbool::BoolOp::Ne,
        BinaryOp::Lt => kbool::BoolOp::Lt,
        BinaryOp::Le => kbool::BoolOp::Le,
        BinaryOp::Gt => kbool::BoolOp::Gt,
        BinaryOp::Ge => kbool::BoolOp::Ge,
        BinaryOp::Add | BinaryOp::Maximum => kbool::BoolOp::Or,
        BinaryOp::Mul | BinaryOp::Minimum => kbool::BoolOp::And,
        BinaryOp::Sub | BinaryOp::Div | BinaryOp::FloorDiv => return None,
    })
}

/// A strided kernel operand: the buffer from the layout's offset, with its strides.
fn strided<'a>(
    s: &'a CudaStorage,
    l: &Layout,
    strides: &'a [i64],
    op: &'static str,
) -> Result<StridedIn<'a>> {
    Ok(StridedIn {
        data: s.tail(l.offset(), op)?,
        strides,
    })
}

/// out = a op b, with `la`/`lb` the operands' layouts broadcast to the output shape (the caller
/// checked devices and dtypes).
pub(crate) fn binary(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    op: BinaryOp,
) -> Result<CudaStorage> {
    let dev = a.device();
    let shape = la.shape();
    let (sa, sb) = (strides_i64(la), strides_i64(lb));
    let (ia, ib) = (
        strided(a, la, &sa, op.name())?,
        strided(b, lb, &sb, op.name())?,
    );
    let Some(k) = kernel_binary(op).filter(|_| a.dtype() != DType::Bool) else {
        // Comparisons write bools; two bools combine as PyTorch combines them (or / and).
        let k = kernel_bool(op).ok_or_else(|| Error::bool_operands(op))?;
        let out = alloc(dev, la.numel(), DType::Bool)?;
        kbool::bool_binary(dev, k, ia, ib, out.as_slice(), shape).on(op.name())?;
        return Ok(a.sibling(out, DType::Bool));
    };
    let out = alloc(dev, la.numel(), a.dtype())?;
    if !a.dtype().is_float() {
        // i64 arithmetic (wrapping, like the CPU).
        ki::int_binary(dev, k, ia, ib, out.as_slice(), shape).on(op.name())?;
    } else {
        kb::binary_strided(dev, k, ia, ib, out.as_slice(), shape).on(op.name())?;
    }
    Ok(a.sibling(out, a.dtype()))
}

/// out = cond ? a : b, all three broadcast to one shape; a non-bool condition, or a and b of
/// two dtypes, is refused (`backend::check_where`).
pub(crate) fn where_cond(
    cond: &CudaStorage,
    lc: &Layout,
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
) -> Result<CudaStorage> {
    check_where(cond.dtype(), a.dtype(), b.dtype())?;
    let dev = a.device();
    let shape = la.shape();
    let out = alloc(dev, la.numel(), a.dtype())?;
    let (sc, sa, sb) = (strides_i64(lc), strides_i64(la), strides_i64(lb));
    let (ic, ia, ib) = (
        strided(cond, lc, &sc, "where")?,
        strided(a, la, &sa, "where")?,
        strided(b, lb, &sb, "where")?,
    );
    kbool::where_bool(dev, ic, ia, ib, out.as_slice(), shape).on("where")?;
    Ok(a.sibling(out, a.dtype()))
}

/// A contiguous copy of the elements `l` addresses.
pub(crate) fn copy_strided(x: &CudaStorage, l: &Layout) -> Result<CudaStorage> {
    let out = alloc(x.device(), l.numel(), x.dtype())?;
    super::gather_into(x.device(), x.buffer(), l, &out, 0)?;
    Ok(x.sibling(out, x.dtype()))
}

/// The elements `l` addresses converted to `dtype` (contiguous, always a fresh buffer).
pub(crate) fn cast(x: &CudaStorage, l: &Layout, dtype: DType) -> Result<CudaStorage> {
    if x.dtype() == dtype {
        return copy_strided(x, l);
    }
    let v = x.window_as(l, dtype)?;
    Ok(x.sibling(v.buf, dtype))
}

/// dst's elements at `dl` = src's at `sl` (one shape), cast to dst's dtype: one strided copy
/// when the dtypes agree, else a cast to a contiguous copy first. The caller made sure the two
/// do not share memory.
pub(crate) fn assign(dst: &CudaStorage, dl: &Layout, src: &CudaStorage, sl: &Layout) -> Result<()> {
    if dl.numel() == 0 {
        return Ok(());
    }
    let dev = dst.device();
    let d = dst.tail(dl.offset(), "assign")?;
    if src.dtype() == dst.dtype() {
        let s = src.tail(sl.offset(), "assign")?;
        return sinter_cuda::ops::copy::strided_copy(
            dev,
            s,
            &strides_i64(sl),
            d,
            &strides_i64(dl),
            dl.shape(),
        )
        .on("assign");
    }
    let v: DevView = src.window_as(sl, dst.dtype())?;
    let src_strides = sinter_cuda::launch::contiguous_strides(dl.shape());
    sinter_cuda::ops::copy::strided_copy(
        dev,
        v.slice(),
        &src_strides,
        d,
        &strides_i64(dl),
        dl.shape(),
    )
    .on("assign")
}
