//! Elementwise kernels: unary maps and their derivatives, binary and ternary ops over
//! strided/broadcast layouts. Contiguous inputs take a flat, vectorisable, parallel path;
//! transcendental maps (exp, log, tanh, sigmoid, SiLU, GELU) run sinter-cpu's SIMD kernels.

use rayon::prelude::*;
use sinter_cpu::math::{self, Unary};

use super::{output_vec, CpuStorage, PAR_THRESHOLD};
use crate::backend::check_where;
use crate::op::{BinaryOp, UnaryOp};
use crate::{DType, Layout, Result};

fn map_flat(x: &[f32], f: impl Fn(f32) -> f32 + Sync) -> Vec<f32> {
    if x.len() >= PAR_THRESHOLD {
        x.par_iter().with_min_len(4096).map(|&v| f(v)).collect()
    } else {
        x.iter().map(|&v| f(v)).collect()
    }
}

/// Elements per task when a vectorised map runs on several cores.
const SIMD_CHUNK: usize = 1 << 14;

/// The vectorised sinter-cpu function for `op`, where one exists. ReLU stays on the scalar
/// path: it is one compare (the compiler vectorises it) and its NaN rule is the op's own.
fn simd_unary(op: UnaryOp) -> Option<Unary> {
    Some(match op {
        UnaryOp::Exp => Unary::Exp,
        UnaryOp::Log => Unary::Ln,
        UnaryOp::Tanh => Unary::Tanh,
        UnaryOp::Sigmoid => Unary::Sigmoid,
        UnaryOp::Silu => Unary::Silu,
        UnaryOp::GeluTanh => Unary::GeluTanh,
        UnaryOp::GeluErf => Unary::GeluErf,
        _ => return None,
    })
}

/// out = f(inputs) chunk by chunk: `f(range, out_chunk)`, on all cores for long inputs.
fn map_chunks(out: &mut [f32], f: impl Fn(usize, &mut [f32]) + Sync) {
    if out.len() >= PAR_THRESHOLD {
        out.par_chunks_mut(SIMD_CHUNK)
            .enumerate()
            .for_each(|(c, o)| f(c * SIMD_CHUNK, o));
    } else if !out.is_empty() {
        f(0, out);
    }
}

pub fn unary(s: &CpuStorage, layout: &Layout, op: UnaryOp) -> CpuStorage {
    let x = s.f32_contiguous(layout);
    let y = match simd_unary(op) {
        Some(f) => {
            // map_chunks writes every value: no zero fill.
            let mut y = output_vec(x.len());
            map_chunks(&mut y, |at, o| math::unary(f, &x[at..at + o.len()], o));
            y
        }
        // A constant op lets the compiler inline apply() and vectorise the loop.
        None => match op {
            UnaryOp::Relu => map_flat(&x, |v| UnaryOp::Relu.apply(v)),
            UnaryOp::Neg => map_flat(&x, |v| UnaryOp::Neg.apply(v)),
            UnaryOp::Sqr => map_flat(&x, |v| UnaryOp::Sqr.apply(v)),
            _ => map_flat(&x, |v| op.apply(v)),
        },
    };
    CpuStorage::from_f32(y, s.dtype())
}

/// grad_in = grad_out * f'(x), from contiguous x, y = f(x) and grad_out of one shape.
pub fn unary_backward(op: UnaryOp, x: &[f32], y: &[f32], g: &[f32], dtype: DType) -> CpuStorage {
    let n = g.len();
    // Every value is written below (a SIMD map or `derivative_times`): no zero fill.
    let mut out = output_vec(n);
    if let Some(f) = simd_unary(op) {
        map_chunks(&mut out, |at, o| {
            let r = at..at + o.len();
            math::unary_backward(f, &x[r.clone()], &g[r], o)
        });
        return CpuStorage::from_f32(out, dtype);
    }
    match op {
        UnaryOp::Relu => derivative_times(&mut out, x, y, g, |a, b| UnaryOp::Relu.derivative(a, b)),
        _ => derivative_times(&mut out, x, y, g, |a, b| op.derivative(a, b)),
    }
    CpuStorage::from_f32(out, dtype)
}

/// out[i] = g[i] · d(x[i], y[i]).
fn derivative_times(
    out: &mut [f32],
    x: &[f32],
    y: &[f32],
    g: &[f32],
    d: impl Fn(f32, f32) -> f32 + Sync,
) {
    let body = |(i, o): (usize, &mut f32)| *o = g[i] * d(x[i], y[i]);
    if out.len() >= PAR_THRESHOLD {
        out.par_iter_mut()
            .with_min_len(4096)
            .enumerate()
            .for_each(body);
    } else {
        out.iter_mut().enumerate().for_each(body);
    }
}

/// The two layouts (of one shape) with adjacent dimensions merged wherever both are
/// contiguous across them, so that strided loops run over long rows (a [n, c, h, w] plus a
/// [1, c, 1, 1] bias becomes rows of h·w).
fn coalesce(la: &Layout, lb: &Layout) -> (Layout, Layout) {
    let (sh, sa, sb) = (la.shape(), la.strides(), lb.strides());
    let (mut shape, mut a, mut b) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..sh.len() {
        if sh[i] == 1 {
            continue;
        }
        let merges = |s: &[usize], t: &Vec<usize>| t.last().is_some_and(|&l| l == s[i] * sh[i]);
        if !shape.is_empty() && merges(sa, &a) && merges(sb, &b) {
            *shape.last_mut().expect("not empty") *= sh[i];
            *a.last_mut().expect("not empty") = sa[i];
            *b.last_mut().expect("not empty") = sb[i];
        } else {
            shape.push(sh[i]);
            a.push(sa[i]);
            b.push(sb[i]);
        }
    }
    (
        Layout::new(shape.clone(), a, la.offset()),
        Layout::new(shape, b, lb.offset()),
    )
}

/// out[i] = f(a[i], b[i]) where both layouts already have the output's shape (broadcast views).
fn zip_strided<T: Copy + Send + Sync, U: Copy + Send + Sync + Default>(
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
    f: impl Fn(T, T) -> U + Sync,
) -> Vec<U> {
    let n = la.numel();
    if let (Some(ra), Some(rb)) = (la.contiguous_range(), lb.contiguous_range()) {
        let (a, b) = (&a[ra], &b[rb]);
        return if n >= PAR_THRESHOLD {
            a.par_iter()
                .zip(b.par_iter())
                .with_min_len(4096)
                .map(|(&x, &y)| f(x, y))
                .collect()
        } else {
            a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect()
        };
    }
    let mut out = vec![U::default(); n];
    if n == 0 {
        return out;
    }
    let (la, lb) = &coalesce(la, lb);
    let (last, sa) = la.last_dim();
    let (_, sb) = lb.last_dim();
    // The common stride pairs get loops over slices (no index arithmetic: vectorised).
    let row = |(r, o): (usize, &mut [U])| {
        let (oa, ob) = (la.row_offset(r), lb.row_offset(r));
        match (sa, sb) {
            (1, 1) => {
                let (ra, rb) = (&a[oa..oa + last], &b[ob..ob + last]);
                for ((v, &p), &q) in o.iter_mut().zip(ra).zip(rb) {
                    *v = f(p, q);
                }
            }
            (1, 0) => {
                let q = b[ob];
                for (v, &p) in o.iter_mut().zip(&a[oa..oa + last]) {
                    *v = f(p, q);
                }
            }
            (0, 1) => {
                let p = a[oa];
                for (v, &q) in o.iter_mut().zip(&b[ob..ob + last]) {
                    *v = f(p, q);
                }
            }
            _ => {
                for (j, v) in o.iter_mut().enumerate() {
                    *v = f(a[oa + j * sa], b[ob + j * sb]);
                }
            }
        }
    };
    if n >= PAR_THRESHOLD {
        out.par_chunks_mut(last)
            .with_min_len((4096 / last).max(1))
            .enumerate()
            .for_each(row);
    } else {
        out.chunks_mut(last).enumerate().for_each(row);
    }
    out
}

/// a op b for a comparison, as `torch.bool` (each op a constant closure, so the loops
/// vectorise).
fn compare_strided<T: PartialOrd + Copy + Send + Sync>(
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
    op: BinaryOp,
) -> Vec<bool> {
    match op {
        BinaryOp::Eq => zip_strided(a, la, b, lb, |p, q| p == q),
        BinaryOp::Ne => zip_strided(a, la, b, lb, |p, q| p != q),
        BinaryOp::Lt => zip_strided(a, la, b, lb, |p, q| p < q),
        BinaryOp::Le => zip_strided(a, la, b, lb, |p, q| p <= q),
        BinaryOp::Gt => zip_strided(a, la, b, lb, |p, q| p > q),
        _ => zip_strided(a, la, b, lb, |p, q| op.compare(p, q)),
    }
}

/// a op b, both of one dtype, layouts broadcast to the output shape. Comparisons give
/// `Bool`; two bools combine as `BinaryOp::apply_bool` says (an error where PyTorch refuses).
pub fn binary(
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
    op: BinaryOp,
) -> crate::Result<CpuStorage> {
    if op.is_comparison() {
        return Ok(CpuStorage::Bool(match (a, b) {
            (CpuStorage::F32(x), CpuStorage::F32(y)) => compare_strided(x, la, y, lb, op),
            (CpuStorage::I64(x), CpuStorage::I64(y)) => compare_strided(x, la, y, lb, op),
            (CpuStorage::Bool(x), CpuStorage::Bool(y)) => compare_strided(x, la, y, lb, op),
            _ => {
                // Half types compare exactly as f32 (widening is exact).
                let (x, y) = (a.f32_contiguous(la), b.f32_contiguous(lb));
                let lc = Layout::contiguous(la.shape());
                compare_strided(&x, &lc, &y, &lc, op)
            }
        }));
    }
    Ok(match (a, b) {
        (CpuStorage::F32(x), CpuStorage::F32(y)) => CpuStorage::F32(match op {
            // A constant op lets the compiler inline apply() and vectorise the loops.
            BinaryOp::Add => zip_strided(x, la, y, lb, |p, q| BinaryOp::Add.apply(p, q)),
            BinaryOp::Sub => zip_strided(x, la, y, lb, |p, q| BinaryOp::Sub.apply(p, q)),
            BinaryOp::Mul => zip_strided(x, la, y, lb, |p, q| BinaryOp::Mul.apply(p, q)),
            BinaryOp::Div => zip_strided(x, la, y, lb, |p, q| BinaryOp::Div.apply(p, q)),
            _ => zip_strided(x, la, y, lb, |p, q| op.apply(p, q)),
        }),
        (CpuStorage::I64(x), CpuStorage::I64(y)) => {
            CpuStorage::I64(zip_strided(x, la, y, lb, |p, q| op.apply_i64(p, q)))
        }
        (CpuStorage::Bool(x), CpuStorage::Bool(y)) => {
            if op.apply_bool(false, false).is_none() {
                return Err(crate::Error::bool_operands(op));
            }
            CpuStorage::Bool(zip_strided(x, la, y, lb, |p, q| {
                op.apply_bool(p, q).unwrap_or(false)
            }))
        }
        _ => {
            // Half types: widen both operands once, compute in f32, round back.
            let dtype = a.dtype();
            let x = a.f32_contiguous(la);
            let y = b.f32_contiguous(lb);
            let lc = Layout::contiguous(la.shape());
            CpuStorage::from_f32(zip_strided(&x, &lc, &y, &lc, |p, q| op.apply(p, q)), dtype)
        }
    })
}

/// out = cond ? a : b, every layout already broadcast to the output's shape. Elements are moved,
/// never converted; a non-bool condition, or a and b of two dtypes, is refused
/// (`backend::check_where`).
pub fn where_cond(
    c: &CpuStorage,
    lc: &Layout,
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
) -> Result<CpuStorage> {
    check_where(c.dtype(), a.dtype(), b.dtype())?;
    let cond = c.bool_contiguous(lc);
    fn select<T: Copy + Send + Sync>(
        cond: &[bool],
        x: &[T],
        lx: &Layout,
        y: &[T],
        ly: &Layout,
    ) -> Vec<T> {
        let (x, y) = (super::gather_strided(x, lx), super::gather_strided(y, ly));
        let pick = |((&c, &p), &q): ((&bool, &T), &T)| if c { p } else { q };
        if cond.len() >= PAR_THRESHOLD {
            cond.par_iter()
                .zip(x.par_iter())
                .zip(y.par_iter())
                .with_min_len(4096)
                .map(pick)
                .collect()
        } else {
            cond.iter().zip(&x).zip(&y).map(pick).collect()
        }
    }
    Ok(match (a, b) {
        (CpuStorage::F32(x), CpuStorage::F32(y)) => CpuStorage::F32(select(&cond, x, la, y, lb)),
        (CpuStorage::F16(x), CpuStorage::F16(y)) => CpuStorage::F16(select(&cond, x, la, y, lb)),
        (CpuStorage::BF16(x), CpuStorage::BF16(y)) => CpuStorage::BF16(select(&cond, x, la, y, lb)),
        (CpuStorage::I64(x), CpuStorage::I64(y)) => CpuStorage::I64(select(&cond, x, la, y, lb)),
        (CpuStorage::Bool(x), CpuStorage::Bool(y)) => CpuStorage::Bool(select(&cond, x, la, y, lb)),
        _ => unreachable!("check_where refuses a and b of two dtypes"),
    })
}
