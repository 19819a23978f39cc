//! Elementwise ops on the device: unary maps and their backward, binary ops over
//! strided/broadcast operands, where, dtype casts, strided copies (contiguous, assign).
//!
//! These return the output `Storage`; the caller in `ops.rs` / `tensor.rs` records the autograd
//! node, whose backward is written in tensor ops and so runs here too. Float math runs in f32 in
//! the kernels and rounds once to f16/bf16, like the CPU backend. Integer (i64) arithmetic,
//! comparisons and where run in the i64 kernels of `int.cu`, exact and wrapping like the CPU.

use sinter_cuda::ops::binary::{self as kb, StridedIn};
use sinter_cuda::ops::int as ki;
use sinter_cuda::ops::unary::{self as ku, Saved};

use super::{alloc, contig, contig_as, parts, same_device, storage_of, strides_i64, tail_of, OnOp};
use crate::layout::numel;
use crate::op::{BinaryOp, UnaryOp};
use crate::storage::Storage;
use crate::{DType, Layout, Result, Tensor};

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
pub(crate) fn unary(x: &Tensor, op: UnaryOp) -> Result<Storage> {
    let (dev, _) = parts(x)?;
    let xv = contig(x)?;
    let y = alloc(&dev, xv.len, x.dtype())?;
    match kernel_unary(op) {
        Some(k) => ku::unary(&dev, k, xv.slice(), y.as_slice()).on(op.name())?,
        None => kb::binary(
            &dev,
            kb::BinaryOp::Mul,
            xv.slice(),
            xv.slice(),
            y.as_slice(),
        )
        .on(op.name())?,
    }
    Ok(storage_of(&dev, y, x.dtype()))
}

/// grad_in = grad_out · f'(x), from x, y = f(x) and grad_out (all of one shape).
pub(crate) fn unary_backward(op: UnaryOp, x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Tensor> {
    let (dev, _) = parts(g)?;
    let d = g.dtype();
    let k = kernel_unary(op).unwrap_or(ku::UnaryOp::Powf(2.0));
    let gv = contig(g)?;
    let saved = match k.saves() {
        Saved::Input => contig_as(x, d)?,
        Saved::Output => contig_as(y, d)?,
        Saved::Nothing => gv.clone(),
    };
    let gx = alloc(&dev, gv.len, d)?;
    ku::unary_backward(&dev, k, saved.slice(), gv.slice(), gx.as_slice()).on(op.name())?;
    Ok(super::tensor_of(&dev, gx, d, g.shape()))
}

fn kernel_binary(op: BinaryOp) -> kb::BinaryOp {
    match op {
        BinaryOp::Add => kb::BinaryOp::Add,
        BinaryOp::Sub => kb::BinaryOp::Sub,
        BinaryOp::Mul => kb::BinaryOp::Mul,
        BinaryOp::Div => kb::BinaryOp::Div,
        BinaryOp::Maximum => kb::BinaryOp::Maximum,
        BinaryOp::Minimum => kb::BinaryOp::Minimum,
        BinaryOp::Eq => kb::BinaryOp::Eq,
        BinaryOp::Ne => kb::BinaryOp::Ne,
        BinaryOp::Lt => kb::BinaryOp::Lt,
        BinaryOp::Le => kb::BinaryOp::Le,
        BinaryOp::Gt => kb::BinaryOp::Gt,
        BinaryOp::Ge => kb::BinaryOp::Ge,
    }
}

/// out[shape] = a op b, with `la`/`lb` the operands' layouts broadcast to `shape` (the caller
/// checked devices and dtypes).
pub(crate) fn binary(
    a: &Tensor,
    la: &Layout,
    b: &Tensor,
    lb: &Layout,
    shape: &[usize],
    op: BinaryOp,
) -> Result<Storage> {
    same_device(op.name(), a, b)?;
    let (dev, abuf) = parts(a)?;
    let (_, bbuf) = parts(b)?;
    let out = alloc(&dev, numel(shape), a.dtype())?;
    let (sa, sb) = (strides_i64(la), strides_i64(lb));
    let ia = StridedIn {
        data: tail_of(&abuf, la.offset(), op.name())?,
        strides: &sa,
    };
    let ib = StridedIn {
        data: tail_of(&bbuf, lb.offset(), op.name())?,
        strides: &sb,
    };
    if !a.dtype().is_float() {
        // i64 arithmetic (wrapping, like the CPU) and comparisons (1/0).
        ki::int_binary(&dev, kernel_binary(op), ia, ib, out.as_slice(), shape).on(op.name())?;
    } else {
        kb::binary_strided(&dev, kernel_binary(op), ia, ib, out.as_slice(), shape).on(op.name())?;
    }
    Ok(storage_of(&dev, out, a.dtype()))
}

/// out = cond != 0 ? a : b, all three broadcast to `shape` (a and b of one dtype, checked).
pub(crate) fn where_cond(
    cond: &Tensor,
    a: &Tensor,
    b: &Tensor,
    shape: &[usize],
) -> Result<Storage> {
    same_device("where", a, b)?;
    same_device("where", cond, a)?;
    if !a.dtype().is_float() {
        // i64 operands: the kernel reads the condition in its own dtype.
        let (lc, la, lb) = (
            cond.layout().broadcast_as(shape)?,
            a.layout().broadcast_as(shape)?,
            b.layout().broadcast_as(shape)?,
        );
        let (dev, cbuf) = parts(cond)?;
        let (_, abuf) = parts(a)?;
        let (_, bbuf) = parts(b)?;
        let out = alloc(&dev, numel(shape), a.dtype())?;
        let (sc, sa, sb) = (strides_i64(&lc), strides_i64(&la), strides_i64(&lb));
        let ic = StridedIn {
            data: tail_of(&cbuf, lc.offset(), "where")?,
            strides: &sc,
        };
        let ia = StridedIn {
            data: tail_of(&abuf, la.offset(), "where")?,
            strides: &sa,
        };
        let ib = StridedIn {
            data: tail_of(&bbuf, lb.offset(), "where")?,
            strides: &sb,
        };
        ki::int_where(&dev, ic, ia, ib, out.as_slice(), shape).on("where")?;
        return Ok(storage_of(&dev, out, a.dtype()));
    }
    // The kernel wants the condition in the operands' dtype.
    let cond = if cond.dtype() == a.dtype() {
        cond.clone()
    } else {
        cond.detach().to_dtype(a.dtype())?
    };
    let (lc, la, lb) = (
        cond.layout().broadcast_as(shape)?,
        a.layout().broadcast_as(shape)?,
        b.layout().broadcast_as(shape)?,
    );
    let (dev, cbuf) = parts(&cond)?;
    let (_, abuf) = parts(a)?;
    let (_, bbuf) = parts(b)?;
    let out = alloc(&dev, numel(shape), a.dtype())?;
    let (sc, sa, sb) = (strides_i64(&lc), strides_i64(&la), strides_i64(&lb));
    let ic = StridedIn {
        data: tail_of(&cbuf, lc.offset(), "where")?,
        strides: &sc,
    };
    let ia = StridedIn {
        data: tail_of(&abuf, la.offset(), "where")?,
        strides: &sa,
    };
    let ib = StridedIn {
        data: tail_of(&bbuf, lb.offset(), "where")?,
        strides: &sb,
    };
    kb::where_strided(&dev, ic, ia, ib, out.as_slice(), shape).on("where")?;
    Ok(storage_of(&dev, out, a.dtype()))
}

/// A contiguous copy of the elements `x` addresses.
pub(crate) fn contiguous(x: &Tensor) -> Result<Storage> {
    let (dev, buf) = parts(x)?;
    let out = alloc(&dev, x.numel(), x.dtype())?;
    super::gather_into(&dev, &buf, x.layout(), &out, 0)?;
    Ok(storage_of(&dev, out, x.dtype()))
}

/// x converted to `dtype` (contiguous).
pub(crate) fn cast(x: &Tensor, dtype: DType) -> Result<Storage> {
    if x.dtype() == dtype {
        return contiguous(x);
    }
    let (dev, _) = parts(x)?;
    // A cast always writes a fresh buffer of exactly the tensor's elements.
    let v = contig_as(x, dtype)?;
    Ok(storage_of(&dev, v.buf, dtype))
}

/// dst's elements = src's, cast to dst's dtype (in place, outside autograd). The caller checked
/// shapes and devices.
pub(crate) fn assign(dst: &Tensor, src: &Tensor) -> Result<()> {
    let (dev, dbuf) = parts(dst)?;
    let mut v = contig_as(src, dst.dtype())?;
    if std::sync::Arc::ptr_eq(&v.buf, &dbuf) {
        // Reading and writing the same memory in different orders: copy the source first.
        let tmp = alloc(&dev, v.len, dst.dtype())?;
        dev.copy(v.slice(), tmp.as_slice()).on("assign")?;
        v = super::DevView::whole(tmp);
    }
    let l = dst.layout();
    if l.numel() == 0 {
        return Ok(());
    }
    let d = dbuf
        .slice(l.offset(), dbuf.len() - l.offset())
        .on("assign")?;
    let src_strides = sinter_cuda::launch::contiguous_strides(l.shape());
    sinter_cuda::ops::copy::strided_copy(
        &dev,
        v.slice(),
        &src_strides,
        d,
        &strides_i64(l),
        l.shape(),
    )
    .on("assign")
}
