//! The fused Transformer ops of `crate::fused` on the device: flash attention (f16/bf16, head
//! dims 64 and 128) and residual add + LayerNorm run their own kernels; other attention shapes
//! and dtypes run as the equivalent composite of device ops (same values and gradients). The
//! global gradient norm uses the deterministic sum-of-squares kernel.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sinter_cuda::ops::adamw as ka;
use sinter_cuda::ops::flash_attention::{self as kfa, AttnShape, AttnView};
use sinter_cuda::ops::residual_layernorm as krl;
use sinter_cuda::ops::unary as ku;
use sinter_cuda::{CudaError, DeviceBuffer, Epilogue, GemmDesc, GemmShape};

use super::{
    alloc, contig, contig_as, opt_slice, parts, same_device, storage_of, tail_of, tensor_of, OnOp,
};
use crate::autograd::output;
use crate::{bail, DType, Result, Tensor};

/// True when the flash attention kernels cover these operands (checked to agree by the caller):
/// f16/bf16, head dim 64 or 128. Layouts never disqualify: a view whose last dim is not
/// contiguous is gathered first.
pub(crate) fn flash_applies(q: &Tensor, head_dim: usize) -> bool {
    kfa::supported(q.dtype(), head_dim) && !FLASH_UNCOMPILABLE.load(Ordering::Relaxed)
}

/// Set when NVRTC could not compile `flash_attention.cu` (CUDA headers without `crt/mma.h`, the
/// WMMA API): attention then runs as the composite instead of failing, and NVRTC is not retried.
static FLASH_UNCOMPILABLE: AtomicBool = AtomicBool::new(false);

/// softmax(scale · q kᵀ [+ causal mask]) v; the mask is aligned bottom-right, as in
/// `fused::attention` (query i sees keys up to tk − tq + i). Flash kernels where they apply,
/// else the composite.
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    scale: f32,
) -> Result<Tensor> {
    let (qs, ks) = (q.shape(), k.shape());
    if !flash_applies(q, qs[3]) {
        return attention_composite(q, k, v, causal, scale);
    }
    let op = "flash_attention";
    same_device(op, q, k)?;
    same_device(op, q, v)?;
    let s = AttnShape {
        b: qs[0],
        h: qs[1],
        tq: qs[2],
        tk: ks[2],
        d: qs[3],
        causal,
        scale,
    };
    let (dev, _) = parts(q)?;
    let dtype = q.dtype();
    let (qo, ko, vo) = (Operand::of(q)?, Operand::of(k)?, Operand::of(v)?);
    let rows = s.b * s.h * s.tq;
    let o = alloc(&dev, rows * s.d, dtype)?;
    let lse = alloc(&dev, rows, DType::F32)?;
    match kfa::flash_forward(
        &dev,
        &s,
        qo.view()?,
        ko.view()?,
        vo.view()?,
        o.as_slice(),
        lse.as_slice(),
    ) {
        Ok(()) => {}
        Err(CudaError::Compile { .. }) => {
            FLASH_UNCOMPILABLE.store(true, Ordering::Relaxed);
            return attention_composite(q, k, v, causal, scale);
        }
        Err(e) => return Err(e).on(op),
    }
    let (qt, kt, vt) = (q.clone(), k.clone(), v.clone());
    Ok(output(
        storage_of(&dev, o, dtype),
        &[s.b, s.h, s.tq, s.d],
        op,
        &[q, k, v],
        move |g, y| {
            let (qo, ko, vo) = (Operand::of(&qt)?, Operand::of(&kt)?, Operand::of(&vt)?);
            let (yv, gv) = (contig(y)?, contig_as(g, dtype)?);
            let dq = alloc(&dev, rows * s.d, dtype)?;
            let dk = alloc(&dev, s.b * s.h * s.tk * s.d, dtype)?;
            let dv = alloc(&dev, s.b * s.h * s.tk * s.d, dtype)?;
            kfa::flash_backward(
                &dev,
                &s,
                qo.view()?,
                ko.view()?,
                vo.view()?,
                yv.slice(),
                gv.slice(),
                lse.as_slice(),
                dq.as_slice(),
                dk.as_slice(),
                dv.as_slice(),
            )
            .on(op)?;
            Ok(vec![
                Some(tensor_of(&dev, dq, dtype, qt.shape())),
                Some(tensor_of(&dev, dk, dtype, kt.shape())),
                Some(tensor_of(&dev, dv, dtype, vt.shape())),
            ])
        },
    ))
}

/// A [b, h, t, d] attention operand as the kernels read it: the tensor's own memory when its
/// last dim is contiguous (e.g. heads narrowed out of a packed qkv projection), else a
/// contiguous copy.
struct Operand {
    buf: Arc<DeviceBuffer>,
    off: usize,
    strides: [usize; 3],
}

impl Operand {
    fn of(t: &Tensor) -> Result<Operand> {
        let l = t.layout();
        let st = l.strides();
        if l.shape()[3] <= 1 || st[3] == 1 {
            let (_, buf) = parts(t)?;
            return Ok(Operand {
                buf,
                off: l.offset(),
                strides: [st[0], st[1], st[2]],
            });
        }
        let c = contig(t)?;
        let sh = t.shape();
        Ok(Operand {
            buf: c.buf,
            off: c.off,
            strides: [sh[1] * sh[2] * sh[3], sh[2] * sh[3], sh[3]],
        })
    }
    fn view(&self) -> Result<AttnView<'_>> {
        Ok(AttnView {
            data: tail_of(&self.buf, self.off, "flash_attention")?,
            strides: self.strides,
        })
    }
}

/// [tq, tk] i64, 1 where query row i may not see key j under the bottom-right causal
/// alignment (j >= i + tk + 1 - tq), built from two aranges on `device`: no host upload, so a
/// step using it can be captured in a CUDA graph.
pub(crate) fn causal_mask_on(tq: usize, tk: usize, device: crate::Device) -> Result<Tensor> {
    let cols = Tensor::arange(0.0, tk as f64, 1.0, DType::I64, device)?.reshape(&[1, tk])?;
    let first = tk as f64 + 1.0 - tq as f64;
    let rows =
        Tensor::arange(first, first + tq as f64, 1.0, DType::I64, device)?.reshape(&[tq, 1])?;
    cols.ge(&rows)
}

/// The composite of device ops: materialises the [tq, tk] scores (f32 and other head dims).
fn attention_composite(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    scale: f32,
) -> Result<Tensor> {
    let s = q.matmul(&k.t()?)?.mul_scalar(scale)?;
    let s = if causal {
        let mask = causal_mask_on(q.shape()[2], k.shape()[2], q.device())?.to_dtype(s.dtype())?;
        s.masked_fill(&mask, f32::NEG_INFINITY)?
    } else {
        s
    };
    s.softmax(-1)?.matmul(v)
}

/// (x + residual, LayerNorm(x + residual)·gamma + beta) over rows of length n, in one kernel
/// (shapes and dtypes checked by the caller). Like `layer_norm`, gamma and beta are used in x's
/// dtype and their gradients come back in their own.
pub(crate) fn residual_layer_norm(
    x: &Tensor,
    residual: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    n: usize,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    let op = "residual_layer_norm";
    for t in [residual, gamma, beta] {
        same_device(op, x, t)?;
    }
    let (dev, _) = parts(x)?;
    let dtype = x.dtype();
    let rows = x.numel().checked_div(n).unwrap_or(0);
    let (xv, rv, gv, bv) = (
        contig(x)?,
        contig(residual)?,
        contig_as(gamma, dtype)?,
        contig_as(beta, dtype)?,
    );
    let h = alloc(&dev, xv.len, dtype)?;
    let y = alloc(&dev, xv.len, dtype)?;
    let mean = alloc(&dev, rows, DType::F32)?;
    let rstd = alloc(&dev, rows, DType::F32)?;
    krl::residual_layernorm_forward(
        &dev,
        xv.slice(),
        rv.slice(),
        gv.slice(),
        bv.slice(),
        h.as_slice(),
        y.as_slice(),
        mean.as_slice(),
        rstd.as_slice(),
        rows,
        n,
        eps,
    )
    .on(op)?;
    let shape = x.shape().to_vec();
    let sum = output(
        storage_of(&dev, h, dtype),
        &shape,
        "residual_add",
        &[x, residual],
        |g, _| Ok(vec![Some(g.clone()), Some(g.clone())]),
    );
    let (st, gt, bt) = (sum.clone(), gamma.clone(), beta.clone());
    let normed = output(
        storage_of(&dev, y, dtype),
        &shape,
        op,
        &[&sum, gamma, beta],
        move |g, _| {
            let (hv, gav, gyv) = (contig(&st)?, contig_as(&gt, dtype)?, contig_as(g, dtype)?);
            let dh = alloc(&dev, hv.len, dtype)?;
            let want = (gt.tracks_grad(), bt.tracks_grad());
            let dg = want.0.then(|| alloc(&dev, n, dtype)).transpose()?;
            let db = want.1.then(|| alloc(&dev, n, dtype)).transpose()?;
            krl::residual_layernorm_backward(
                &dev,
                hv.slice(),
                gav.slice(),
                gyv.slice(),
                mean.as_slice(),
                rstd.as_slice(),
                Some(dh.as_slice()),
                opt_slice(&dg),
                opt_slice(&db),
                rows,
                n,
            )
            .on(op)?;
            let param = |b: Option<Arc<DeviceBuffer>>, like: &Tensor| -> Result<Option<Tensor>> {
                b.map(|b| tensor_of(&dev, b, dtype, &[n]).to_dtype(like.dtype()))
                    .transpose()
            };
            Ok(vec![
                Some(tensor_of(&dev, dh, dtype, st.shape())),
                param(dg, &gt)?,
                param(db, &bt)?,
            ])
        },
    );
    Ok((sum, normed))
}

/// True when `linear_bias_gelu` runs as one cuBLASLt GEMM with the GELU_AUX_BIAS epilogue:
/// f16/bf16 (the mixed-precision Transformer path; f32 keeps the composite) and an output width
/// that is a multiple of 8 (cuBLASLt's rule for the aux matrix's leading dimension).
pub(crate) fn linear_gelu_applies(dtype: DType, out: usize) -> bool {
    matches!(dtype, DType::F16 | DType::BF16) && out > 0 && out.is_multiple_of(8)
}

/// y [rows, out] = gelu(x Wᵀ + b) as one GEMM that also stores the pre-activation for the
/// backward pass (operands checked by the caller; x is viewed as [rows, in]).
pub(crate) fn linear_bias_gelu(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    rows: usize,
    inp: usize,
    out: usize,
) -> Result<Tensor> {
    let op = "linear_bias_gelu";
    let (dev, _) = parts(x)?;
    let dtype = x.dtype();
    let (xv, wv, bv) = (contig(x)?, contig(w)?, contig(b)?);
    let y = alloc(&dev, rows * out, dtype)?;
    let pre = alloc(&dev, rows * out, dtype)?;
    if rows > 0 {
        if inp == 0 {
            bail!("{op}: the weight has no input features");
        }
        // B is the weight stored [out, in]: x Wᵀ is the transposed-B product.
        let mut desc = GemmDesc::new(
            super::matmul::gemm_dtype(dtype),
            GemmShape::new(rows, out, inp).trans(false, true),
            xv.slice(),
            wv.slice(),
            y.as_slice(),
        );
        desc.epilogue = Epilogue::BiasGeluAux {
            bias: bv.slice(),
            aux: pre.as_slice(),
        };
        dev.gemm(&desc).on(op)?;
    }
    let (xt, wt, bt) = (x.clone(), w.clone(), b.clone());
    Ok(output(
        storage_of(&dev, y, dtype),
        &[rows, out],
        op,
        &[x, w, b],
        move |g, _| {
            let gv = contig_as(g, dtype)?;
            let du = alloc(&dev, rows * out, dtype)?;
            ku::unary_backward(
                &dev,
                ku::UnaryOp::GeluTanh,
                pre.as_slice(),
                gv.slice(),
                du.as_slice(),
            )
            .on(op)?;
            let du = tensor_of(&dev, du, dtype, &[rows, out]);
            let x2 = xt.reshape(&[rows, inp])?;
            let dx = xt
                .tracks_grad()
                .then(|| du.matmul(&wt)?.reshape(xt.shape()))
                .transpose()?;
            let dw = wt.tracks_grad().then(|| du.t()?.matmul(&x2)).transpose()?;
            let db = bt
                .tracks_grad()
                .then(|| du.sum_to_shape(&[out]))
                .transpose()?;
            Ok(vec![dx, dw, db])
        },
    ))
}

/// sqrt(Σ g²) over all gradients; NaN if the device fails (the signature has no error).
pub(crate) fn global_grad_norm(grads: &[Tensor]) -> f64 {
    grad_sum_squares_host(grads)
        .map(|s| s.sqrt())
        .unwrap_or(f64::NAN)
}

/// Σ g² over gradients on one CUDA device as a 1-element f32 tensor there (no host read).
pub(crate) fn grad_sum_squares(grads: &[Tensor]) -> Result<Tensor> {
    let (dev, _) = parts(&grads[0])?;
    let views = grads.iter().map(contig).collect::<Result<Vec<_>>>()?;
    let slices: Vec<_> = views.iter().map(|v| v.slice()).collect();
    let out = alloc(&dev, 1, DType::F32)?;
    ka::sum_squares(&dev, &slices, out.as_slice()).on("grad_sum_squares")?;
    Ok(super::tensor_of(&dev, out, DType::F32, &[1]))
}

fn grad_sum_squares_host(grads: &[Tensor]) -> Result<f64> {
    let mut total = 0f64;
    // One deterministic kernel pass per device over that device's gradients; CPU ones on the host.
    let mut by_device: Vec<(crate::Device, Vec<&Tensor>)> = Vec::new();
    for g in grads {
        match by_device.iter_mut().find(|(d, _)| *d == g.device()) {
            Some((_, v)) => v.push(g),
            None => by_device.push((g.device(), vec![g])),
        }
    }
    for (d, gs) in by_device {
        let owned: Vec<Tensor> = gs.into_iter().cloned().collect();
        if d.is_cuda() {
            total += grad_sum_squares(&owned)?.to_vec_f32()?[0] as f64;
        } else {
            let n = crate::fused::global_grad_norm(&owned);
            total += n * n;
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_mask_from_aranges_matches_the_bottom_right_rule() {
        for (tq, tk) in [(1, 1), (4, 4), (3, 7), (7, 3), (1, 9), (5, 0)] {
            let limit = |i: usize| (i + tk + 1).saturating_sub(tq).min(tk);
            let want: Vec<i64> = (0..tq * tk)
                .map(|x| ((x % tk) >= limit(x / tk)) as i64)
                .collect();
            let got = causal_mask_on(tq, tk, crate::Device::Cpu).unwrap();
            assert_eq!(got.shape(), &[tq, tk]);
            assert_eq!(got.to_vec_i64().unwrap(), want, "tq {tq}, tk {tk}");
        }
    }

    #[test]
    fn kernel_or_composite() {
        let t = |d: DType, shape: &[usize]| Tensor::zeros(shape, d, crate::Device::Cpu).unwrap();
        assert!(flash_applies(&t(DType::BF16, &[1, 1, 2, 64]), 64));
        assert!(flash_applies(&t(DType::F16, &[1, 1, 2, 128]), 128));
        assert!(
            !flash_applies(&t(DType::F32, &[1, 1, 2, 64]), 64),
            "f32: composite"
        );
        assert!(
            !flash_applies(&t(DType::BF16, &[1, 1, 2, 80]), 80),
            "head dim 80: composite"
        );
        assert!(linear_gelu_applies(DType::BF16, 3072));
        assert!(
            !linear_gelu_applies(DType::BF16, 12),
            "aux ld must be a multiple of 8"
        );
        assert!(!linear_gelu_applies(DType::F32, 64));
        assert!(!linear_gelu_applies(DType::F16, 0));
    }
}
