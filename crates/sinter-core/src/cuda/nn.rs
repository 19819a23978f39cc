//! Fused NN ops on the device, each with its own backward kernel: softmax / log-softmax, layer
//! norm, cross-entropy, index_select / embedding and index_add (deterministic scatter-add).

use std::sync::Arc;

use sinter_cuda::ops::cross_entropy::{self as kce, LossGrad};
use sinter_cuda::ops::{
    binary as kb, embedding as ke, layernorm as kl, reduce as kr, softmax as ks,
};
use sinter_cuda::{CudaDevice, DeviceBuffer, Pool};

use super::{alloc, contig, contig_as, opt_slice, parts, same_device, storage_of, tensor_of, OnOp};
use crate::tensor::output;
use crate::{DType, Error, Result, Tensor};

/// Softmax (or log-softmax) over the last dimension.
pub(crate) fn softmax(x: &Tensor, log: bool) -> Result<Tensor> {
    let (dev, _) = parts(x)?;
    let dtype = x.dtype();
    let n = *x.shape().last().unwrap_or(&1);
    let rows = x.numel().checked_div(n).unwrap_or(0);
    let name = if log { "log_softmax" } else { "softmax" };
    let xv = contig(x)?;
    let y = alloc(&dev, xv.len, dtype)?;
    ks::softmax(&dev, log, xv.slice(), y.as_slice(), rows, n, 1.0).on(name)?;
    Ok(output(
        storage_of(&dev, y, dtype),
        x.shape(),
        name,
        &[x],
        move |g, y| {
            let (yv, gv) = (contig(y)?, contig_as(g, dtype)?);
            let gx = alloc(&dev, gv.len, dtype)?;
            ks::softmax_backward(
                &dev,
                log,
                yv.slice(),
                gv.slice(),
                gx.as_slice(),
                rows,
                n,
                1.0,
            )
            .on(name)?;
            Ok(vec![Some(tensor_of(&dev, gx, dtype, g.shape()))])
        },
    ))
}

/// Layer norm over the last dimension (size n) with affine gamma and beta (checked by the
/// caller). gamma and beta are used in x's dtype; their gradients come back in their own.
pub(crate) fn layer_norm(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    n: usize,
    eps: f32,
) -> Result<Tensor> {
    same_device("layer_norm", x, gamma)?;
    same_device("layer_norm", x, beta)?;
    let (dev, _) = parts(x)?;
    let dtype = x.dtype();
    let rows = x.numel().checked_div(n).unwrap_or(0);
    let (xv, gv, bv) = (
        contig(x)?,
        contig_as(gamma, dtype)?,
        contig_as(beta, dtype)?,
    );
    let y = alloc(&dev, xv.len, dtype)?;
    let mean = alloc(&dev, rows, DType::F32)?;
    let rstd = alloc(&dev, rows, DType::F32)?;
    kl::layernorm_forward(
        &dev,
        xv.slice(),
        Some(gv.slice()),
        Some(bv.slice()),
        y.as_slice(),
        Some(mean.as_slice()),
        Some(rstd.as_slice()),
        rows,
        n,
        eps,
    )
    .on("layer_norm")?;
    let (xt, gt, bt) = (x.clone(), gamma.clone(), beta.clone());
    Ok(output(
        storage_of(&dev, y, dtype),
        x.shape(),
        "layer_norm",
        &[x, gamma, beta],
        move |g, _| {
            let (xv, gav, gyv) = (contig(&xt)?, contig_as(&gt, dtype)?, contig_as(g, dtype)?);
            let want = (xt.tracks_grad(), gt.tracks_grad(), bt.tracks_grad());
            let dx = if want.0 {
                Some(alloc(&dev, xv.len, dtype)?)
            } else {
                None
            };
            let dg = if want.1 {
                Some(alloc(&dev, n, dtype)?)
            } else {
                None
            };
            let db = if want.2 {
                Some(alloc(&dev, n, dtype)?)
            } else {
                None
            };
            kl::layernorm_backward(
                &dev,
                xv.slice(),
                Some(gav.slice()),
                gyv.slice(),
                mean.as_slice(),
                rstd.as_slice(),
                opt_slice(&dx),
                opt_slice(&dg),
                opt_slice(&db),
                rows,
                n,
                false,
            )
            .on("layer_norm")?;
            let param = |b: Option<Arc<DeviceBuffer>>, like: &Tensor| -> Result<Option<Tensor>> {
                b.map(|b| tensor_of(&dev, b, dtype, &[n]).to_dtype(like.dtype()))
                    .transpose()
            };
            Ok(vec![
                dx.map(|b| tensor_of(&dev, b, dtype, xt.shape())),
                param(dg, &gt)?,
                param(db, &bt)?,
            ])
        },
    ))
}

/// The targets as a device i64 buffer. Host-resident targets are checked here, before upload
/// (an immediate error naming the bad one). Device-resident ones are checked on the device
/// without a sync: a bad target makes its row's loss NaN and is reported, with its value and
/// position, at the next read of device values (`checks`), e.g. when the loss is logged.
fn device_targets(
    dev: &Arc<CudaDevice>,
    targets: &Tensor,
    c: usize,
    ignore_index: i64,
) -> Result<super::DevView> {
    if targets.device().is_cuda() {
        same_device_ordinal("cross_entropy", dev, targets)?;
        let tv = contig(targets)?;
        super::checks::check_indices(
            dev,
            tv.slice(),
            c,
            Some(ignore_index),
            super::checks::IndexUse::CrossEntropy,
        )?;
        return Ok(tv);
    }
    let t = targets.to_vec_i64()?;
    if let Some((i, &v)) = t
        .iter()
        .enumerate()
        .find(|(_, &v)| v != ignore_index && (v < 0 || v as usize >= c))
    {
        return Err(Error::Msg(format!("cross_entropy: target {v} at position {i} is not a class index in 0..{c} (nor the ignore index {ignore_index})")));
    }
    Ok(super::DevView::whole(Arc::new(
        dev.htod(&t, Pool::Temporary).on("cross_entropy")?,
    )))
}

fn same_device_ordinal(op: &'static str, dev: &CudaDevice, t: &Tensor) -> Result<()> {
    let d = crate::Device::Cuda(dev.ordinal());
    if t.device() != d {
        return Err(Error::DeviceMismatch {
            op,
            lhs: d,
            rhs: t.device(),
        });
    }
    Ok(())
}

/// Mean cross-entropy of logits [..., c] against i64 targets [...] (checked by the caller); rows
/// whose target is `ignore_index` count for nothing. The loss is an f32 scalar on the device.
pub(crate) fn cross_entropy(
    logits: &Tensor,
    targets: &Tensor,
    c: usize,
    ignore_index: i64,
) -> Result<Tensor> {
    let (dev, _) = parts(logits)?;
    let dtype = logits.dtype();
    let rows = targets.numel();
    let tv = device_targets(&dev, targets, c, ignore_index)?;
    let xv = contig(logits)?;
    let loss_rows = alloc(&dev, rows, DType::F32)?;
    let lse = alloc(&dev, rows, DType::F32)?;
    kce::cross_entropy_forward(
        &dev,
        xv.slice(),
        tv.slice(),
        loss_rows.as_slice(),
        Some(lse.as_slice()),
        rows,
        c,
        ignore_index,
    )
    .on("cross_entropy")?;
    let count = alloc(&dev, 1, DType::F32)?;
    kce::count_valid(&dev, tv.slice(), count.as_slice(), ignore_index).on("cross_entropy")?;
    let total = alloc(&dev, 1, DType::F32)?;
    kr::sum_last(&dev, loss_rows.as_slice(), total.as_slice(), 1, rows, 1.0).on("cross_entropy")?;
    let loss = alloc(&dev, 1, DType::F32)?;
    kb::binary(
        &dev,
        kb::BinaryOp::Div,
        total.as_slice(),
        count.as_slice(),
        loss.as_slice(),
    )
    .on("cross_entropy")?;
    let lt = logits.clone();
    Ok(output(
        storage_of(&dev, loss, DType::F32),
        &[],
        "cross_entropy",
        &[logits],
        move |g, _| {
            // d loss / d logits = (softmax - onehot) · g / count.
            let gv = contig_as(g, DType::F32)?;
            let dl = alloc(&dev, 1, DType::F32)?;
            kb::binary(
                &dev,
                kb::BinaryOp::Div,
                gv.slice(),
                count.as_slice(),
                dl.as_slice(),
            )
            .on("cross_entropy")?;
            let xv = contig(&lt)?;
            let dx = alloc(&dev, xv.len, dtype)?;
            kce::cross_entropy_backward(
                &dev,
                xv.slice(),
                tv.slice(),
                lse.as_slice(),
                LossGrad::Scalar(dl.as_slice()),
                dx.as_slice(),
                rows,
                c,
                ignore_index,
                1.0,
            )
            .on("cross_entropy")?;
            Ok(vec![Some(tensor_of(&dev, dx, dtype, lt.shape()))])
        },
    ))
}

/// Indices into x viewed as [outer * n, inner] for picking `ids` along the middle dimension of
/// [outer, n, inner], uploaded.
fn flat_ids(dev: &CudaDevice, ids: &[usize], outer: usize, n: usize) -> Result<Arc<DeviceBuffer>> {
    let flat: Vec<i64> = (0..outer)
        .flat_map(|o| ids.iter().map(move |&j| (o * n + j) as i64))
        .collect();
    Ok(Arc::new(
        dev.htod(&flat, Pool::Temporary).on("index_select")?,
    ))
}

/// out[o, j, i] = x[o, ids[j], i] (ids checked by the caller). The backward is the
/// deterministic scatter-add of the embedding kernels.
pub(crate) fn index_select(
    x: &Tensor,
    ids: &[usize],
    outer: usize,
    n: usize,
    inner: usize,
    out_shape: &[usize],
) -> Result<Tensor> {
    let (dev, _) = parts(x)?;
    let idx = flat_ids(&dev, ids, outer, n)?;
    gather(x, idx, outer, n, inner, ids.len(), out_shape)
}

/// index_select with the ids already on the device (no host round trip): they are checked on
/// the device (a bad one is reported at the next read, see `checks`) and turned into flat row
/// ids in range, so the gather itself is always memory-safe.
pub(crate) fn index_select_device(
    x: &Tensor,
    ids: &Tensor,
    outer: usize,
    n: usize,
    inner: usize,
    out_shape: &[usize],
) -> Result<Tensor> {
    same_device("index_select", x, ids)?;
    let (dev, _) = parts(x)?;
    let flat = device_flat_ids(&dev, ids, outer, n, super::checks::IndexUse::IndexSelect)?;
    gather(x, flat, outer, n, inner, ids.numel(), out_shape)
}

/// Checked (deferred) and flattened device ids: [outer * k] rows of x viewed as [outer * n, inner].
fn device_flat_ids(
    dev: &Arc<CudaDevice>,
    ids: &Tensor,
    outer: usize,
    n: usize,
    what: super::checks::IndexUse,
) -> Result<Arc<DeviceBuffer>> {
    let iv = contig(ids)?;
    super::checks::check_indices(dev, iv.slice(), n, None, what)?;
    let flat = alloc(dev, outer * iv.len, DType::I64)?;
    sinter_cuda::ops::int::index_flat(dev, iv.slice(), flat.as_slice(), outer, n)
        .on("index_select")?;
    Ok(flat)
}

/// out[o, j, i] = x[o, ids[j], i] from flat row ids `idx` ([outer * k], in range).
fn gather(
    x: &Tensor,
    idx: Arc<DeviceBuffer>,
    outer: usize,
    n: usize,
    inner: usize,
    k: usize,
    out_shape: &[usize],
) -> Result<Tensor> {
    let (dev, _) = parts(x)?;
    let dtype = x.dtype();
    let xv = contig(x)?;
    if !dtype.is_float() {
        // i64 rows (no gradient).
        let out = alloc(&dev, outer * k * inner, dtype)?;
        sinter_cuda::ops::int::gather_rows_i64(
            &dev,
            xv.slice(),
            idx.as_slice(),
            out.as_slice(),
            outer * n,
            inner,
        )
        .on("index_select")?;
        return Ok(tensor_of(&dev, out, dtype, out_shape));
    }
    let out = alloc(&dev, outer * k * inner, dtype)?;
    ke::embedding_forward(
        &dev,
        xv.slice(),
        idx.as_slice(),
        out.as_slice(),
        outer * n,
        inner,
    )
    .on("index_select")?;
    let xshape = x.shape().to_vec();
    Ok(output(
        storage_of(&dev, out, dtype),
        out_shape,
        "index_select",
        &[x],
        move |g, _| {
            let gv = contig_as(g, dtype)?;
            let gx = alloc(&dev, outer * n * inner, dtype)?;
            ke::embedding_backward(
                &dev,
                gv.slice(),
                idx.as_slice(),
                gx.as_slice(),
                outer * n,
                inner,
                false,
            )
            .on("index_select")?;
            Ok(vec![Some(tensor_of(&dev, gx, dtype, &xshape))])
        },
    ))
}

/// A copy of x with `src` rows added at the ids of `idx` along the middle dimension of
/// [outer, n, inner] (src is used in x's dtype). `ids` are the host-checked ids when `idx` is
/// on the host; None when `idx` is on the device (checked there, see `checks`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn index_add(
    x: &Tensor,
    d: usize,
    idx: &Tensor,
    ids: Option<&[usize]>,
    src: &Tensor,
    outer: usize,
    n: usize,
    inner: usize,
) -> Result<Tensor> {
    same_device("index_add", x, src)?;
    let (dev, _) = parts(x)?;
    let dtype = x.dtype();
    if !dtype.is_float() {
        crate::bail!("index_add: needs a float tensor, got {dtype}");
    }
    let xv = contig(x)?;
    let out = alloc(&dev, xv.len, dtype)?;
    dev.copy(xv.slice(), out.as_slice()).on("index_add")?;
    let fid = match ids {
        Some(ids) => flat_ids(&dev, ids, outer, n)?,
        None => {
            same_device("index_add", x, idx)?;
            device_flat_ids(&dev, idx, outer, n, super::checks::IndexUse::IndexAdd)?
        }
    };
    let sv = contig_as(src, dtype)?;
    ke::embedding_backward(
        &dev,
        sv.slice(),
        fid.as_slice(),
        out.as_slice(),
        outer * n,
        inner,
        true,
    )
    .on("index_add")?;
    let idx = idx.clone();
    Ok(output(
        storage_of(&dev, out, dtype),
        x.shape(),
        "index_add",
        &[x, src],
        move |g, _| {
            Ok(vec![
                Some(g.clone()),
                Some(g.index_select(d as isize, &idx)?),
            ])
        },
    ))
}
