//! RMSNorm, y = x / √(mean(x²) + eps) · w over the last dimension, and its residual form
//! (s = x + a, y = rms_norm(s)), each one custom op: the forwards are sinter-cpu's vectorised
//! row kernels, the backward one more op whose pass per row recomputes the row's 1/rms
//! (cheaper than keeping it) and gives dx and the row's share of dw.
//!
//! The residual form writes the sum and its norm in one pass over x and a, and its backward
//! adds the sum's own gradient into dx in the same pass (no separate accumulation of the two
//! gradients that reach the sum): a pre-norm block's `x + attn` followed by RMSNorm.
//!
//! On CUDA the same ops launch `llama_fused.cu`'s kernels (f32, f16, bf16; the weight in x's
//! dtype or f32, autocast's master weight): the backward is dx (with each row's 1/rms, which
//! the weight's kernels read), then the weight's gradient as per-chunk column sums summed in a
//! fixed order (no atomics: deterministic).

use std::collections::HashMap;
use std::sync::Mutex;

use rayon::prelude::*;
use sinter_core::custom_op::{CustomOp, HostOutput, OutputSpec, TensorMeta};
use sinter_core::{bail, DType, Device, Result, Tensor};
use sinter_cpu::math::output_vec;
use sinter_cpu::math::rms_norm::{residual_rms_norm_rows, rms_norm_backward_rows, rms_norm_rows};
use sinter_cpu::Isa;

use super::{cuda, for_rows, in_dtype, FLOATS};

/// Rows per partial sum of dw: fixed (not per thread), so the result does not depend on the
/// thread count.
const DW_ROWS: usize = 64;

/// The width n of x [.., n] against w [n], or why they do not fit.
fn width(op: &str, x: &TensorMeta, w: &TensorMeta) -> Result<usize> {
    match (x.shape.last(), &w.shape[..]) {
        (Some(&n), &[m]) if n == m && n > 0 => Ok(n),
        _ => bail!(
            "{op}: x must be [.., n] and the weight [n]; got {:?} and {:?}",
            x.shape,
            w.shape
        ),
    }
}

/// An error unless `b` has `a`'s shape.
fn same_shape(op: &str, (an, a): (&str, &TensorMeta), (bn, b): (&str, &TensorMeta)) -> Result<()> {
    if a.shape != b.shape {
        bail!(
            "{op}: {bn} {:?} must have {an}'s shape {:?}",
            b.shape,
            a.shape
        );
    }
    Ok(())
}

/// y = rms_norm(x, w) (fused forward and backward: f32 on the CPU; f32, f16 and bf16 on CUDA,
/// the weight in x's dtype or f32).
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    Ok(ops(dtypes(x, w), eps)?.plain.apply(&[x, w])?.remove(0))
}

/// (x + a, rms_norm(x + a, w)) in one pass (fused forward and backward, as [`rms_norm`]);
/// gradients reaching either output flow to x, a and w.
pub(crate) fn residual_rms_norm(
    x: &Tensor,
    a: &Tensor,
    w: &Tensor,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    let mut out = ops(dtypes(x, w), eps)?.residual.apply(&[x, a, w])?;
    let y = out.pop().expect("two outputs");
    Ok((out.pop().expect("two outputs"), y))
}

/// Whether the fused ops take x with weight w: f32 both on the CPU; on CUDA a float x with the
/// weight in its dtype or in f32.
pub(crate) fn applies(x: &Tensor, w: &Tensor) -> bool {
    let on_cuda = matches!(x.device(), Device::Cuda(_));
    super::applies(x) && (w.dtype() == DType::F32 || (on_cuda && w.dtype() == x.dtype()))
}

/// The kernels' dtypes: x's and the weight's.
fn dtypes(x: &Tensor, w: &Tensor) -> (DType, DType) {
    (x.dtype(), w.dtype())
}

/// The ops for one pair of dtypes and one eps (models have one or two; built once each).
#[derive(Clone)]
struct Ops {
    plain: CustomOp,
    residual: CustomOp,
}

fn ops(dt: (DType, DType), eps: f32) -> Result<Ops> {
    type Key = (DType, DType, u32);
    static OPS: Mutex<Option<HashMap<Key, Ops>>> = Mutex::new(None);
    let mut all = OPS.lock().unwrap_or_else(|e| e.into_inner());
    let all = all.get_or_insert_with(HashMap::new);
    let key = (dt.0, dt.1, eps.to_bits());
    if let Some(p) = all.get(&key) {
        return Ok(p.clone());
    }
    let ops = Ops {
        plain: plain_op(dt, eps, Backward::new(dt, eps, false)?)?,
        residual: residual_op(dt, eps, Backward::new(dt, eps, true)?)?,
    };
    all.insert(key, ops.clone());
    Ok(ops)
}

/// A backward's ops: the CPU's one pass, and CUDA's dx (with 1/rms per row), partial column
/// sums of dw and their finish.
#[derive(Clone)]
struct Backward {
    cpu: CustomOp,
    dx: CustomOp,
    dw: CustomOp,
    finish: CustomOp,
    dtype: DType,
}

impl Backward {
    fn new(dt: (DType, DType), eps: f32, residual: bool) -> Result<Backward> {
        let (name, dx) = if residual {
            (
                "residual_rms_norm_backward",
                "residual_rms_norm_backward_dx",
            )
        } else {
            ("rms_norm_backward", "rms_norm_backward_dx")
        };
        let first = usize::from(residual);
        let dx = CustomOp::builder(dx)
            .inputs(3 + first)
            .dtypes(&FLOATS)
            .outputs(move |m| {
                let x = &m[first + 1];
                let rows = x.numel() / x.shape.last().copied().unwrap_or(1).max(1);
                Ok(vec![
                    OutputSpec::new(&x.shape, x.dtype),
                    OutputSpec::new(&[rows], DType::F32),
                ])
            })
            .cuda(cuda::rms_backward_dx(dt, eps, residual)?)
            .build()?;
        let dw = CustomOp::builder("rms_norm_backward_dw")
            .inputs(3)
            .dtypes(&FLOATS)
            .outputs(|m| {
                let n = m[0].shape.last().copied().unwrap_or(1);
                Ok(vec![OutputSpec::new(
                    &[cuda::dw_chunks(&m[0]), n],
                    DType::F32,
                )])
            })
            .cuda(cuda::rms_backward_dw(dt.0)?)
            .build()?;
        let param = dt.1;
        let finish = CustomOp::builder("rms_norm_backward_finish")
            .inputs(1)
            .outputs(move |m| Ok(vec![OutputSpec::new(&m[0].shape[1..], param)]))
            .cuda(cuda::rms_backward_finish(param)?)
            .build()?;
        Ok(Backward {
            cpu: backward_op(name, eps, residual)?,
            dx,
            dw,
            finish,
            dtype: dt.0,
        })
    }

    /// (dx, dw) from `ins`: (dy, x, w), or (ds, dy, x, w) for the residual form.
    fn apply(&self, ins: &[&Tensor]) -> Result<(Option<Tensor>, Option<Tensor>)> {
        if ins[0].device() == Device::Cpu {
            let mut g = self.cpu.apply(ins)?;
            let dw = g.pop();
            return Ok((g.pop(), dw));
        }
        // The output gradients (all but the last two inputs, x and w) in x's dtype: the kernels
        // read one activation type.
        let grads = ins.len() - 2;
        let cast: Vec<Tensor> = ins
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if i < grads {
                    in_dtype(t, self.dtype)
                } else {
                    Ok((*t).clone())
                }
            })
            .collect::<Result<_>>()?;
        let refs: Vec<&Tensor> = cast.iter().collect();
        let mut out = self.dx.apply(&refs)?;
        let rstd = out.pop().expect("two outputs");
        let dx = out.pop().expect("two outputs");
        let (dy, x) = (refs[refs.len() - 3], refs[refs.len() - 2]);
        let part = self.dw.apply(&[dy, x, &rstd])?.remove(0);
        let dw = self.finish.apply(&[&part])?.remove(0);
        Ok((Some(dx), Some(dw)))
    }
}

/// (x, w) → y; backward (dy, x, w) → (dx, dw).
fn plain_op(dt: (DType, DType), eps: f32, backward: Backward) -> Result<CustomOp> {
    CustomOp::builder("rms_norm")
        .inputs(2)
        .dtypes(&FLOATS)
        .outputs(|m| {
            width("rms_norm", &m[0], &m[1])?;
            Ok(vec![OutputSpec::new(&m[0].shape, m[0].dtype)])
        })
        .cpu(move |x| {
            let (xs, w) = (x[0].f32()?, x[1].f32()?);
            let n = w.len();
            let mut y = output_vec(xs.len());
            let isa = Isa::get();
            for_rows(xs, n, &mut y, n, |_, xr, yr| {
                rms_norm_rows(isa, xr, w, eps, yr)
            });
            Ok(vec![HostOutput::f32(y, x[0].shape())])
        })
        .cuda(cuda::rms_forward(dt, eps, false)?)
        .backward(move |ctx| {
            let (dx, dw) = backward.apply(&[ctx.grad(0), ctx.input(0), ctx.input(1)])?;
            Ok(vec![dx, dw])
        })
        .build()
}

/// (x, a, w) → (s = x + a, y = rms_norm(s)); backward (ds, dy, s, w) → (dx = da, dw).
fn residual_op(dt: (DType, DType), eps: f32, backward: Backward) -> Result<CustomOp> {
    const OP: &str = "residual_rms_norm";
    CustomOp::builder(OP)
        .inputs(3)
        .dtypes(&FLOATS)
        .outputs(|m| {
            same_shape(OP, ("x", &m[0]), ("a", &m[1]))?;
            if m[1].dtype != m[0].dtype {
                bail!(
                    "{OP}: a is {} but x is {}: the sum needs one dtype",
                    m[1].dtype,
                    m[0].dtype
                );
            }
            width(OP, &m[0], &m[2])?;
            let spec = OutputSpec::new(&m[0].shape, m[0].dtype);
            Ok(vec![spec.clone(), spec])
        })
        .cpu(move |x| {
            let (xs, a, w) = (x[0].f32()?, x[1].f32()?, x[2].f32()?);
            let n = w.len();
            let (mut s, mut y) = (output_vec(xs.len()), output_vec(xs.len()));
            let isa = Isa::get();
            let per = DW_ROWS * n;
            let chunk = |(c, (sc, yc)): (usize, (&mut [f32], &mut [f32]))| {
                let (xc, ac) = (&xs[c * per..][..sc.len()], &a[c * per..][..sc.len()]);
                residual_rms_norm_rows(isa, xc, ac, w, eps, sc, yc)
            };
            if xs.len() >= super::PARALLEL_FROM {
                s.par_chunks_mut(per)
                    .zip(y.par_chunks_mut(per))
                    .enumerate()
                    .for_each(chunk);
            } else {
                s.chunks_mut(per)
                    .zip(y.chunks_mut(per))
                    .enumerate()
                    .for_each(chunk);
            }
            let shape = x[0].shape();
            Ok(vec![HostOutput::f32(s, shape), HostOutput::f32(y, shape)])
        })
        .cuda(cuda::rms_forward(dt, eps, true)?)
        .backward(move |ctx| {
            let ins = [ctx.grad(0), ctx.grad(1), ctx.output(0), ctx.input(2)];
            let (dx, dw) = backward.apply(&ins)?;
            Ok(vec![dx.clone(), dx, dw])
        })
        .build()
}

/// (dy, x, w) → (dx, dw), or with `with_sum` (ds, dy, x, w) → (ds + dx, dw).
fn backward_op(name: &'static str, eps: f32, with_sum: bool) -> Result<CustomOp> {
    let first = usize::from(with_sum);
    CustomOp::builder(name)
        .inputs(3 + first)
        .outputs(move |m| {
            let (dy, x, w) = (&m[first], &m[first + 1], &m[first + 2]);
            let n = width(name, x, w)?;
            same_shape(name, ("x", x), ("dy", dy))?;
            if with_sum {
                same_shape(name, ("x", x), ("ds", &m[0]))?;
            }
            Ok(vec![
                OutputSpec::new(&x.shape, DType::F32),
                OutputSpec::new(&[n], DType::F32),
            ])
        })
        .cpu(move |x| {
            let ds = if with_sum { Some(x[0].f32()?) } else { None };
            let (dy, xs, w) = (x[first].f32()?, x[first + 1].f32()?, x[first + 2].f32()?);
            let n = w.len();
            let mut dx = output_vec(xs.len());
            let per = DW_ROWS * n;
            let isa = Isa::get();
            // Chunks of DW_ROWS rows, each giving its rows' dx and its partial dw; the partials
            // are summed in chunk order.
            let chunk = |(c, dxc): (usize, &mut [f32])| -> Vec<f32> {
                let mut dw = vec![0f32; n];
                let (xc, dyc) = (&xs[c * per..][..dxc.len()], &dy[c * per..][..dxc.len()]);
                let dsc = ds.map(|d| &d[c * per..][..dxc.len()]);
                rms_norm_backward_rows(isa, xc, w, eps, dyc, dsc, dxc, &mut dw);
                dw
            };
            let partials: Vec<Vec<f32>> = if xs.len() >= super::PARALLEL_FROM {
                dx.par_chunks_mut(per).enumerate().map(chunk).collect()
            } else {
                dx.chunks_mut(per).enumerate().map(chunk).collect()
            };
            let mut dw = vec![0f32; n];
            for p in partials {
                for (a, v) in dw.iter_mut().zip(p) {
                    *a += v;
                }
            }
            Ok(vec![
                HostOutput::f32(dx, x[first + 1].shape()),
                HostOutput::f32(dw, &[n]),
            ])
        })
        .build()
}
