//! Matrix products through cuBLASLt: fp32 math for f32 (TF32 when allowed, see
//! `set_allow_tf32`), bf16/f16 storage with fp32 accumulation.
//!
//! Operands are passed as they lie in memory whenever cuBLASLt can read them: a matrix whose
//! rows or columns have unit stride is a (possibly transposed) operand with that leading
//! dimension, and the batch dimensions must collapse to one stride (0 for a broadcast batch).
//! Anything else is gathered into a contiguous copy first. A broadcast right operand against a
//! batch of row-major left matrices (every `nn.Linear`) becomes one tall GEMM.

use sinter_cuda::{CudaError, Epilogue, GemmDType, GemmDesc, GemmShape};

use super::storage::{CudaStorage, DevView};
use super::{alloc, alloc_zeros, OnOp};
use crate::{bail, DType, Error, Layout, Result};

/// How one operand is handed to cuBLASLt.
struct Operand {
    data: DevView,
    trans: bool,
    ld: usize,
    /// Elements between consecutive matrices of the batch (0 = the same matrix for all).
    batch_stride: usize,
}

/// (transposed, leading dimension) for a rows x cols matrix with strides (rs, cs), if cuBLASLt
/// can read it in place.
fn mat_layout(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<(bool, usize)> {
    if (cs == 1 || cols <= 1) && (rows <= 1 || rs >= cols.max(1)) {
        let ld = if rows <= 1 { cols.max(1) } else { rs };
        return Some((false, ld));
    }
    if (rs == 1 || rows <= 1) && (cols <= 1 || cs >= rows.max(1)) {
        let ld = if cols <= 1 { rows.max(1) } else { cs };
        return Some((true, ld));
    }
    None
}

/// One stride that walks all batch dims in row-major order, if there is one.
fn batch_stride(shape: &[usize], strides: &[usize]) -> Option<usize> {
    let mut flat: Option<usize> = None;
    let mut expected = 0usize;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n == 1 {
            continue;
        }
        match flat {
            None => {
                flat = Some(s);
                expected = s * n;
            }
            Some(_) => {
                if s != expected {
                    return None;
                }
                expected = s * n;
            }
        }
    }
    Some(flat.unwrap_or(0))
}

/// `t` seen through `l` (already broadcast to [batch.., rows, cols]).
fn operand(t: &CudaStorage, l: &Layout, nb: usize, rows: usize, cols: usize) -> Result<Operand> {
    let (dev, buf) = (t.device(), t.buffer().clone());
    let st = l.strides();
    let fast =
        mat_layout(rows, cols, st[nb], st[nb + 1]).zip(batch_stride(&l.shape()[..nb], &st[..nb]));
    if let Some(((trans, ld), bs)) = fast {
        let len = buf.len() - l.offset();
        return Ok(Operand {
            data: DevView {
                buf,
                off: l.offset(),
                len,
            },
            trans,
            ld,
            batch_stride: bs,
        });
    }
    // Gather the (broadcast) view into [batch, rows, cols].
    let out = alloc(dev, l.numel(), t.dtype())?;
    super::gather_into(dev, &buf, l, &out, 0)?;
    Ok(Operand {
        data: DevView::whole(out),
        trans: false,
        ld: cols.max(1),
        batch_stride: rows * cols,
    })
}

/// The cuBLASLt compute type of a float dtype (an error for the others).
pub(crate) fn gemm_dtype(op: &'static str, d: DType) -> Result<GemmDType> {
    Ok(match d {
        DType::F32 if super::allow_tf32() => GemmDType::Tf32,
        DType::F32 => GemmDType::F32,
        DType::BF16 => GemmDType::BF16,
        DType::F16 => GemmDType::F16,
        DType::I64 | DType::I32 | DType::U8 | DType::Bool => {
            return Err(Error::UnsupportedDType {
                op,
                dtype: d,
                supported: "f32, f16 or bf16",
            })
        }
    })
}

/// [batch.., m, k] @ [batch.., k, n] with `la`, `lb` already broadcast over the batch dims.
/// An exact i64 product (wrapping): contiguous copies of the operands (broadcast batches
/// materialised), one thread per output (`int.cu`).
fn int_matmul(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    dims: [usize; 4],
) -> Result<CudaStorage> {
    let dev = a.device();
    let [batch, m, n, _] = dims;
    let out = alloc(dev, batch * m * n, DType::I64)?;
    let (ca, cb) = (
        super::elementwise::copy_strided(a, la)?,
        super::elementwise::copy_strided(b, lb)?,
    );
    sinter_cuda::ops::int::int_matmul(
        dev,
        ca.buffer().as_slice(),
        cb.buffer().as_slice(),
        out.as_slice(),
        dims,
    )
    .on("matmul")?;
    Ok(a.sibling(out, DType::I64))
}

pub(crate) fn matmul(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
) -> Result<CudaStorage> {
    let nb = la.rank() - 2;
    let batch: usize = la.shape()[..nb].iter().product();
    let (m, k, n) = (la.shape()[nb], la.shape()[nb + 1], lb.shape()[nb + 1]);
    let dev = a.device();
    let dtype = a.dtype();
    if dtype == DType::I64 {
        return int_matmul(a, la, b, lb, [batch, m, n, k]);
    }
    let gemm_type = gemm_dtype("matmul", dtype)?;
    let total = batch * m * n;
    let out = if total == 0 || k == 0 {
        alloc_zeros(dev, total, dtype)?
    } else {
        let oa = operand(a, la, nb, m, k)?;
        let ob = operand(b, lb, nb, k, n)?;
        let out = alloc(dev, total, dtype)?;
        // A shared right matrix and row-major left matrices packed one after another: one GEMM
        // of batch*m rows.
        let fold = batch > 1 && ob.batch_stride == 0 && !oa.trans && oa.batch_stride == m * oa.ld;
        let mut s = if fold {
            GemmShape::new(batch * m, n, k)
        } else {
            GemmShape::new(m, n, k).batched(batch)
        };
        s = s.trans(oa.trans, ob.trans);
        s.lda = Some(oa.ld);
        s.ldb = Some(ob.ld);
        if !fold && batch > 1 {
            s.stride_a = Some(oa.batch_stride);
            s.stride_b = Some(ob.batch_stride);
            s.stride_c = Some(m * n);
        }
        let desc = GemmDesc::new(
            gemm_type,
            s,
            oa.data.slice(),
            ob.data.slice(),
            out.as_slice(),
        );
        super::gemm_align::gemm(dev, &desc, "matmul")?;
        out
    };
    Ok(a.sibling(out, dtype))
}

/// y [rows, out] = x Wᵀ (+ b) as one GEMM (x's elements read row-major as [rows, in], W
/// [out, in]), the bias added by the BIAS epilogue as the output is stored: no separate add
/// pass over y, and the op's backward (`fused::linear`) writes dW in the weight's layout and,
/// at f16/bf16, the bias gradient beside it. None for non-float dtypes or mixed operands (the
/// op then runs its composite, which reports them).
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear(
    x: &CudaStorage,
    xl: &Layout,
    w: &CudaStorage,
    wl: &Layout,
    bias: Option<(&CudaStorage, &Layout)>,
    rows: usize,
    inp: usize,
    out: usize,
) -> Result<Option<CudaStorage>> {
    let op = "linear";
    let dtype = x.dtype();
    let same = w.dtype() == dtype && bias.is_none_or(|(b, _)| b.dtype() == dtype);
    if !dtype.is_float() || !same {
        return Ok(None);
    }
    let dev = x.device();
    if rows * out == 0 || inp == 0 {
        // An empty output, or an empty sum: y is the bias broadcast (or zeros); the
        // composite says that more simply than a GEMM.
        return Ok(None);
    }
    let (xv, wv) = (x.window(xl)?, w.window(wl)?);
    let bv = bias.map(|(b, bl)| b.window(bl)).transpose()?;
    let y = alloc(dev, rows * out, dtype)?;
    // B is the weight stored [out, in]: x Wᵀ is the transposed-B product.
    let mut desc = GemmDesc::new(
        gemm_dtype(op, dtype)?,
        GemmShape::new(rows, out, inp).trans(false, true),
        xv.slice(),
        wv.slice(),
        y.as_slice(),
    );
    if let Some(bv) = &bv {
        desc.epilogue = Epilogue::Bias(bv.slice());
    }
    super::gemm_align::gemm(dev, &desc, op)?;
    Ok(Some(x.sibling(y, dtype)))
}

/// True when `linear_bias_gelu` runs as one cuBLASLt GEMM with the GELU_AUX_BIAS epilogue:
/// f16/bf16 (the mixed-precision Transformer path; f32 keeps the composite) and an output width
/// that is a multiple of 8 (cuBLASLt's rule for the aux matrix's leading dimension).
pub(crate) fn linear_gelu_applies(dtype: DType, out: usize) -> bool {
    matches!(dtype, DType::F16 | DType::BF16) && out > 0 && out.is_multiple_of(8)
}

/// y [rows, out] = gelu(x Wᵀ + b) as one GEMM that also stores the pre-activation for the
/// backward pass (x's elements read row-major as [rows, in]); None where the epilogue does not
/// apply (see [`linear_gelu_applies`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear_bias_gelu(
    x: &CudaStorage,
    xl: &Layout,
    w: &CudaStorage,
    wl: &Layout,
    b: &CudaStorage,
    bl: &Layout,
    rows: usize,
    inp: usize,
    out: usize,
) -> Result<Option<(CudaStorage, CudaStorage)>> {
    let op = "linear_bias_gelu";
    let dtype = x.dtype();
    if !linear_gelu_applies(dtype, out) {
        return Ok(None);
    }
    let dev = x.device();
    let (xv, wv, bv) = (x.window(xl)?, w.window(wl)?, b.window(bl)?);
    let y = alloc(dev, rows * out, dtype)?;
    let pre = alloc(dev, rows * out, dtype)?;
    if rows > 0 {
        if inp == 0 {
            bail!("{op}: the weight has no input features");
        }
        // B is the weight stored [out, in]: x Wᵀ is the transposed-B product.
        let mut desc = GemmDesc::new(
            gemm_dtype(op, dtype)?,
            GemmShape::new(rows, out, inp).trans(false, true),
            xv.slice(),
            wv.slice(),
            y.as_slice(),
        );
        desc.epilogue = Epilogue::BiasGeluAux {
            bias: bv.slice(),
            aux: pre.as_slice(),
        };
        super::gemm_align::gemm(dev, &desc, op)?;
    }
    Ok(Some((x.sibling(y, dtype), x.sibling(pre, dtype))))
}

/// True when a Linear's backward runs its bias gradient in the GEMM epilogues (BGRADB beside
/// dW, DGELU_BGRAD beside a GELU's gradient): f16/bf16 only, where the forward's epilogues
/// run too (f32 keeps its separate passes), and `SINTER_GEMM_GRAD_EPILOGUES=0` not set (the
/// A/B switch against the separate passes).
pub(crate) fn grad_epilogues_apply(dtype: DType) -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    let on = *ON.get_or_init(|| {
        std::env::var("SINTER_GEMM_GRAD_EPILOGUES").map_or(true, |v| v.trim() != "0")
    });
    on && matches!(dtype, DType::F16 | DType::BF16)
}

/// (dW [out, inp], db [out]) = (gᵀ x, Σ_rows g) for g [rows, out] and x [rows, inp], as one
/// GEMM whose BGRADB epilogue reduces g while it reads it for the product; None where the
/// epilogue does not apply (see [`grad_epilogues_apply`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear_weight_bias_grad(
    g: &CudaStorage,
    gl: &Layout,
    x: &CudaStorage,
    xl: &Layout,
    rows: usize,
    inp: usize,
    out: usize,
) -> Result<Option<(CudaStorage, CudaStorage)>> {
    let op = "linear_backward";
    let dtype = g.dtype();
    if !grad_epilogues_apply(dtype) || x.dtype() != dtype || rows == 0 || out == 0 || inp == 0 {
        return Ok(None);
    }
    let dev = g.device();
    let (gv, xv) = (g.window(gl)?, x.window(xl)?);
    let dw = alloc(dev, out * inp, dtype)?;
    let db = alloc(dev, out, dtype)?;
    // A = gᵀ (g stored [rows, out] = [k, m]), B = x stored [k, n].
    let mut desc = GemmDesc::new(
        gemm_dtype(op, dtype)?,
        GemmShape::new(out, inp, rows).trans(true, false),
        gv.slice(),
        xv.slice(),
        dw.as_slice(),
    );
    desc.epilogue = Epilogue::BGradA(db.as_slice());
    if !grad_gemm(dev, &desc, op)? {
        return Ok(None);
    }
    Ok(Some((g.sibling(dw, dtype), g.sibling(db, dtype))))
}

/// (du [rows, hid], db [hid]) = ((g W) ∘ gelu'(pre), Σ_rows du) for g [rows, out], the weight
/// W [out, hid] of the Linear after the GELU and the pre-activation `pre` [rows, hid] its
/// forward stored: one GEMM with cuBLASLt's DGELU_BGRAD epilogue, in place of the product, the
/// GELU backward pass and the bias-gradient reduction. None where it does not apply (dtype, or
/// hid not a multiple of 8: the aux matrix's leading-dimension rule).
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear_dgelu_bias_grad(
    g: &CudaStorage,
    gl: &Layout,
    w: &CudaStorage,
    wl: &Layout,
    pre: &CudaStorage,
    prel: &Layout,
    rows: usize,
    out: usize,
    hid: usize,
) -> Result<Option<(CudaStorage, CudaStorage)>> {
    let op = "linear_gelu_backward";
    let dtype = g.dtype();
    let same = w.dtype() == dtype && pre.dtype() == dtype;
    let empty = rows == 0 || out == 0;
    if !grad_epilogues_apply(dtype) || !same || !linear_gelu_applies(dtype, hid) || empty {
        return Ok(None);
    }
    let dev = g.device();
    let (gv, wv, pv) = (g.window(gl)?, w.window(wl)?, pre.window(prel)?);
    let du = alloc(dev, rows * hid, dtype)?;
    let db = alloc(dev, hid, dtype)?;
    let mut desc = GemmDesc::new(
        gemm_dtype(op, dtype)?,
        GemmShape::new(rows, hid, out),
        gv.slice(),
        wv.slice(),
        du.as_slice(),
    );
    desc.epilogue = Epilogue::DGeluBGrad {
        aux: pv.slice(),
        bias_grad: db.as_slice(),
    };
    if !grad_gemm(dev, &desc, op)? {
        return Ok(None);
    }
    Ok(Some((g.sibling(du, dtype), g.sibling(db, dtype))))
}

/// Runs a GEMM with a gradient epilogue: false when cuBLASLt's heuristic offers no algorithm
/// for it (an epilogue, shape or alignment this cuBLASLt refuses), before anything ran, so the
/// caller runs the separate passes instead. Not padded (`gemm_align`): a padded copy of C
/// would need its bias gradient trimmed too, and the backward's shapes are the forward's.
fn grad_gemm(dev: &sinter_cuda::CudaDevice, desc: &GemmDesc<'_>, op: &'static str) -> Result<bool> {
    match dev.gemm(desc) {
        Ok(()) => Ok(true),
        Err(CudaError::Blas {
            op: "cublasLtMatmulAlgoGetHeuristic",
            ..
        }) => Ok(false),
        Err(e) => Err(e).on(op),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operand_layouts() {
        // Row-major 3x4.
        assert_eq!(mat_layout(3, 4, 4, 1), Some((false, 4)));
        // Its transpose (4x3 view with strides (1, 4)).
        assert_eq!(mat_layout(4, 3, 1, 4), Some((true, 4)));
        // A narrowed row-major view keeps its row stride.
        assert_eq!(mat_layout(3, 2, 4, 1), Some((false, 4)));
        // Broadcast rows (stride 0) cannot be read in place.
        assert_eq!(mat_layout(3, 4, 0, 1), None);
        // A single row or column.
        assert_eq!(mat_layout(1, 5, 0, 1), Some((false, 5)));
        assert_eq!(mat_layout(5, 1, 1, 0), Some((false, 1)));
        // Both strides non-unit: gather.
        assert_eq!(mat_layout(3, 4, 8, 2), None);
    }

    #[test]
    fn gemm_epilogue_or_composite() {
        assert!(linear_gelu_applies(DType::BF16, 3072));
        assert!(
            !linear_gelu_applies(DType::BF16, 12),
            "aux ld must be a multiple of 8"
        );
        assert!(!linear_gelu_applies(DType::F32, 64));
        assert!(!linear_gelu_applies(DType::F16, 0));
    }

    #[test]
    fn batch_strides() {
        assert_eq!(batch_stride(&[2, 3], &[36, 12]), Some(12));
        assert_eq!(batch_stride(&[2, 3], &[0, 0]), Some(0));
        assert_eq!(batch_stride(&[2, 3], &[0, 12]), None);
        assert_eq!(batch_stride(&[1, 3], &[99, 12]), Some(12));
        assert_eq!(batch_stride(&[], &[]), Some(0));
        // A permuted batch (heads before batch) does not flatten.
        assert_eq!(batch_stride(&[2, 3], &[12, 24]), None);
    }
}
