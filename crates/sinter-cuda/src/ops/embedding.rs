//! Wrappers for `kernels/embedding.cu`: row gather and the deterministic scatter-add backward.

use super::{fake_slice, kname, need, need_float, rows_times_n};
use crate::alloc::{DevSlice, Pool};
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{CudaError, Result};
use crate::launch::{Arg, Launch, LaunchTarget, Step, Traffic, ELEMWISE_BLOCK};
use crate::nvrtc::KernelFile;

/// Plan out[i, :] = weight[idx[i], :] (zero row for an out-of-range index).
pub fn plan_embedding_forward(
    t: &LaunchTarget,
    weight: DevSlice<'_>,
    idx: DevSlice<'_>,
    out: DevSlice<'_>,
    vocab: usize,
    dim: usize,
) -> Result<Option<Launch>> {
    let op = "embedding_forward";
    let d = weight.dtype();
    need_float(op, d)?;
    need(op, "weight", &weight, d, rows_times_n(op, vocab, dim)?)?;
    need(op, "idx", &idx, DType::I64, idx.len())?;
    need(op, "out", &out, d, rows_times_n(op, idx.len(), dim)?)?;
    if idx.is_empty() || dim == 0 {
        return Ok(None);
    }
    let block = dim
        .div_ceil(16 / d.size())
        .next_power_of_two()
        .clamp(32, 256) as u32;
    Ok(Some(
        Launch::new(
            KernelFile::Embedding,
            kname("embedding_fwd", d),
            idx.len().min(t.max_blocks(block) as usize) as u32,
            block,
            vec![
                Arg::Ptr(weight.ptr()),
                Arg::Ptr(idx.ptr()),
                Arg::Ptr(out.ptr()),
                Arg::I64(idx.len() as i64),
                Arg::I64(vocab as i64),
                Arg::I64(dim as i64),
            ],
        )
        // The indices, and one weight row per index, gathered.
        .with_traffic(Traffic::bytes(
            idx.num_bytes() + out.num_bytes(),
            out.num_bytes(),
        )),
    ))
}

/// i32 scratch elements the backward needs: counts and cursor ([vocab] each), offsets
/// ([vocab + 1]) and positions ([num_idx]).
pub fn backward_scratch_len(vocab: usize, num_idx: usize) -> usize {
    3 * vocab + 1 + num_idx
}

/// Plan gw (+)= scatter-add of gy rows by idx, deterministic (see embedding.cu). `scratch` is i32
/// of [`backward_scratch_len`] elements.
#[allow(clippy::too_many_arguments)]
pub fn plan_embedding_backward(
    t: &LaunchTarget,
    gy: DevSlice<'_>,
    idx: DevSlice<'_>,
    gw: DevSlice<'_>,
    scratch: DevSlice<'_>,
    vocab: usize,
    dim: usize,
    accumulate: bool,
) -> Result<Vec<Step>> {
    let op = "embedding_backward";
    let d = gw.dtype();
    need_float(op, d)?;
    let num_idx = idx.len();
    need(op, "idx", &idx, DType::I64, num_idx)?;
    need(op, "gy", &gy, d, rows_times_n(op, num_idx, dim)?)?;
    need(op, "gw", &gw, d, rows_times_n(op, vocab, dim)?)?;
    need(
        op,
        "scratch",
        &scratch,
        DType::I32,
        backward_scratch_len(vocab, num_idx),
    )?;
    if num_idx >= i32::MAX as usize || vocab >= i32::MAX as usize {
        return Err(CudaError::invalid(op, "more than 2^31 indices or rows"));
    }
    if vocab == 0 || dim == 0 {
        return Ok(vec![]);
    }
    let counts = scratch.slice(0, vocab)?;
    let cursor = scratch.slice(vocab, vocab)?;
    let offsets = scratch.slice(2 * vocab, vocab + 1)?;
    let pos = scratch.slice(3 * vocab + 1, num_idx)?;
    let (ni, v) = (Arg::I64(num_idx as i64), Arg::I64(vocab as i64));
    let mut steps = vec![Step::Zero {
        ptr: counts.ptr(),
        bytes: 2 * vocab * 4,
    }];
    let g = t.grid_for(num_idx, ELEMWISE_BLOCK);
    steps.push(Step::Kernel(Launch::new(
        KernelFile::Embedding,
        "emb_bwd_count",
        g,
        ELEMWISE_BLOCK,
        vec![Arg::Ptr(idx.ptr()), Arg::Ptr(counts.ptr()), ni, v],
    )));
    steps.push(Step::Kernel(Launch::new(
        KernelFile::Embedding,
        "emb_bwd_scan",
        1,
        1024,
        vec![Arg::Ptr(counts.ptr()), Arg::Ptr(offsets.ptr()), v],
    )));
    steps.push(Step::Kernel(Launch::new(
        KernelFile::Embedding,
        "emb_bwd_fill",
        g,
        ELEMWISE_BLOCK,
        vec![
            Arg::Ptr(idx.ptr()),
            Arg::Ptr(offsets.ptr()),
            Arg::Ptr(cursor.ptr()),
            Arg::Ptr(pos.ptr()),
            ni,
            v,
        ],
    )));
    steps.push(Step::Kernel(
        Launch::new(
            KernelFile::Embedding,
            kname("embedding_bwd", d),
            vocab.min(t.max_blocks(256) as usize) as u32,
            256,
            vec![
                Arg::Ptr(gy.ptr()),
                Arg::Ptr(idx.ptr()),
                Arg::Ptr(offsets.ptr()),
                Arg::Ptr(pos.ptr()),
                Arg::Ptr(gw.ptr()),
                ni,
                v,
                Arg::I64(dim as i64),
                Arg::I32(accumulate as i32),
            ],
        )
        // Every gradient row is written (zero where no index points); gy, idx and the position
        // lists are read once.
        .with_traffic(Traffic::bytes(
            gy.num_bytes()
                + idx.num_bytes()
                + (vocab + 1 + num_idx) * 4
                + if accumulate { gw.num_bytes() } else { 0 },
            gw.num_bytes(),
        )),
    ));
    Ok(steps)
}

/// out[i, :] = weight[idx[i], :].
pub fn embedding_forward(
    dev: &CudaDevice,
    weight: DevSlice<'_>,
    idx: DevSlice<'_>,
    out: DevSlice<'_>,
    vocab: usize,
    dim: usize,
) -> Result<()> {
    dev.run_opt(plan_embedding_forward(
        &dev.target(),
        weight,
        idx,
        out,
        vocab,
        dim,
    )?)
}

/// gw (+)= scatter-add of gy by idx; deterministic; allocates scratch from the temporary pool.
#[allow(clippy::too_many_arguments)]
pub fn embedding_backward(
    dev: &CudaDevice,
    gy: DevSlice<'_>,
    idx: DevSlice<'_>,
    gw: DevSlice<'_>,
    vocab: usize,
    dim: usize,
    accumulate: bool,
) -> Result<()> {
    let scratch = dev.alloc(
        backward_scratch_len(vocab, idx.len()),
        DType::I32,
        Pool::Temporary,
    )?;
    let steps = plan_embedding_backward(
        &dev.target(),
        gy,
        idx,
        gw,
        scratch.as_slice(),
        vocab,
        dim,
        accumulate,
    )?;
    dev.run_steps(steps.into_iter())
}

pub(crate) fn samples(t: &LaunchTarget) -> Vec<Launch> {
    let mut v = Vec::new();
    let (vocab, dim, ni) = (100, 64, 10);
    let idx = fake_slice(DType::I64, ni);
    let scratch = fake_slice(DType::I32, backward_scratch_len(vocab, ni));
    for (k, d) in DType::FLOATS.into_iter().enumerate() {
        let (w, o) = (fake_slice(d, vocab * dim), fake_slice(d, ni * dim));
        v.extend(plan_embedding_forward(t, w, idx, o, vocab, dim).unwrap());
        let steps = plan_embedding_backward(t, o, idx, w, scratch, vocab, dim, false).unwrap();
        let ks = super::kernels_of(steps);
        // The dtype-independent helpers once.
        v.extend(
            ks.into_iter()
                .filter(|l| k == 0 || l.name.starts_with("embedding_")),
        );
    }
    v
}
