//! Matrix products through cuBLASLt: fp32 math for f32 (TF32 when allowed, see
//! `set_allow_tf32`), bf16/f16 storage with fp32 accumulation.
//!
//! Operands are passed as they lie in memory whenever cuBLASLt can read them: a matrix whose
//! rows or columns have unit stride is a (possibly transposed) operand with that leading
//! dimension, and the batch dimensions must collapse to one stride (0 for a broadcast batch).
//! Anything else is gathered into a contiguous copy first. A broadcast right operand against a
//! batch of row-major left matrices (every `nn.Linear`) becomes one tall GEMM.

use sinter_cuda::{GemmDType, GemmDesc, GemmShape};

use super::{alloc, alloc_zeros, parts, storage_of, DevView, OnOp};
use crate::autograd::output;
use crate::layout::broadcast_shape;
use crate::{DType, Layout, Result, Tensor};

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
fn operand(t: &Tensor, l: &Layout, nb: usize, rows: usize, cols: usize) -> Result<Operand> {
    let (dev, buf) = parts(t)?;
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
    let out = alloc(&dev, l.numel(), t.dtype())?;
    super::gather_into(&dev, &buf, l, &out, 0)?;
    Ok(Operand {
        data: DevView::whole(out),
        trans: false,
        ld: cols.max(1),
        batch_stride: rows * cols,
    })
}

pub(crate) fn gemm_dtype(d: DType) -> GemmDType {
    match d {
        DType::F32 if super::allow_tf32() => GemmDType::Tf32,
        DType::F32 => GemmDType::F32,
        DType::BF16 => GemmDType::BF16,
        DType::F16 => GemmDType::F16,
        DType::I64 | DType::I32 | DType::U8 => {
            unreachable!("matmul of integers is rejected before dispatch")
        }
    }
}

/// [..., m, k] @ [..., k, n] with broadcast batch dims (the caller checked ranks, dtypes,
/// devices and k).
pub(crate) fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (ra, rb) = (a.rank(), b.rank());
    let (m, k) = (a.shape()[ra - 2], a.shape()[ra - 1]);
    let n = b.shape()[rb - 1];
    let batch_shape = broadcast_shape("matmul", &a.shape()[..ra - 2], &b.shape()[..rb - 2])?;
    let batch: usize = batch_shape.iter().product();
    let full = |r: usize, c: usize| [batch_shape.clone(), vec![r, c]].concat();
    let shape = full(m, n);
    let (dev, _) = parts(a)?;
    let dtype = a.dtype();
    let total = batch * m * n;
    let out = if total == 0 || k == 0 {
        alloc_zeros(&dev, total, dtype)?
    } else {
        let nb = batch_shape.len();
        let la = a.layout().broadcast_as(&full(m, k))?;
        let lb = b.layout().broadcast_as(&full(k, n))?;
        let oa = operand(a, &la, nb, m, k)?;
        let ob = operand(b, &lb, nb, k, n)?;
        let out = alloc(&dev, total, dtype)?;
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
        dev.gemm(&GemmDesc::new(
            gemm_dtype(dtype),
            s,
            oa.data.slice(),
            ob.data.slice(),
            out.as_slice(),
        ))
        .on("matmul")?;
        out
    };
    let (ta, tb) = (a.clone(), b.clone());
    Ok(output(
        storage_of(&dev, out, dtype),
        &shape,
        "matmul",
        &[a, b],
        move |g, _| {
            let ga = ta
                .tracks_grad()
                .then(|| g.matmul(&tb.t()?)?.sum_to_shape(ta.shape()))
                .transpose()?;
            let gb = tb
                .tracks_grad()
                .then(|| ta.t()?.matmul(g)?.sum_to_shape(tb.shape()))
                .transpose()?;
            Ok(vec![ga, gb])
        },
    ))
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
