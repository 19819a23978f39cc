//! Attention: everything about the op in this folder (issue 26 item 1; no `BackendStorage`
//! method: the ops check their operands once, then one match on the device calls the CPU loops
//! or the CUDA launches).
//!
//! - `mod.rs` (here): the typed ops [`attention`] (flash, q/k/v [b, h, t, d]),
//!   [`attention_packed`] (straight from a packed qkv projection) and [`decode_attention`] (one
//!   decoding step against KV caches), their one backward each, the composites they fall back
//!   to and are tested against, and [`reference`], the f64 values every kernel test of every
//!   crate checks against.
//! - `geom.rs`: the geometry of a call and the checks that derive it from the operands.
//! - `cpu.rs`: FlashAttention-2 on the CPU (64 × 64 tiles whose products and softmax passes are
//!   sinter-cpu's `math/flash_tiles.rs`, stored key-major so the softmax runs down the keys;
//!   causal blocks skipped at register-tile grain; `benches/attention.rs` times it); `cpu_decode.rs`: the decoding step
//!   (a dot product per cached key and an axpy per cached value).
//! - `cuda.rs`: the tensor-core flash kernels (f16/bf16, head dims 32, 64 and 128) on CUDA storages;
//!   `flash_attention.cu` holds the kernels and `cuda_flash.rs` their launch plans (pure,
//!   checked without a device) and declared traffic. `cudnn.rs`: cuDNN's fused SDPA (issue
//!   24), tried first where the loaded cuDNN takes the case; `select.rs`: the choice
//!   (`SINTER_ATTENTION=cudnn|flash|composite`), applied in [`flash`] / [`flash_backward`] and
//!   their packed twins.
//! - `tests.rs`: the kernels against [`reference`] and the composites.
//!
//! Reads: q [b, h, tq, d], k and v [b, h, tk, d] (views whose last dimension is contiguous are
//! read in place, e.g. heads narrowed out of a packed qkv projection; other layouts and dtypes
//! are gathered once). Writes: o [b, h, tq, d] and one log-sum-exp per query row, which is all
//! the backward keeps besides its inputs. The t×t score and probability matrices are never
//! materialised, forward or backward: memory is O(b·h·t·d) instead of O(b·h·t²).
//!
//! Causal masking is aligned bottom-right: query row i sits at position tk − tq + i and sees
//! keys 0..=tk − tq + i. With tq = tk that is the usual lower triangle; with tq < tk it is
//! decoding against a KV cache that holds the earlier positions.
//!
//! Where a device has no kernel for the operands (CUDA: f32, other head dims; half-precision
//! decode caches) the op runs its composite, with the same values and gradients.

mod cpu;
mod cpu_decode;
mod cuda;
mod cuda_flash;
mod cudnn;
mod geom;
mod select;

use std::sync::Arc;

pub use geom::{AttnGeom, DecodeSeq};
pub use select::{
    attention_backend, set_attention_backend, with_attention_backend, AttentionBackend,
};

use crate::cpu::CpuStorage;
use crate::cuda::CudaStorage;
use crate::storage::Storage;
use crate::tensor::output;
use crate::{is_grad_enabled, DType, Device, Error, Result, Tensor};

/// The operands' backend storages, when all live on the first's device.
enum On<'a, const N: usize> {
    Cpu([&'a CpuStorage; N]),
    Cuda([&'a CudaStorage; N]),
}

fn on<'a, const N: usize>(op: &'static str, parts: [&'a Storage; N]) -> Result<On<'a, N>> {
    let cpu = parts.map(|s| match s {
        Storage::Cpu(c) => Some(c),
        Storage::Cuda(_) => None,
    });
    if cpu.iter().all(Option::is_some) {
        return Ok(On::Cpu(cpu.map(|c| c.expect("checked"))));
    }
    let cuda = parts.map(|s| match s {
        Storage::Cuda(c) => Some(c),
        Storage::Cpu(_) => None,
    });
    if cuda.iter().all(Option::is_some) {
        return Ok(On::Cuda(cuda.map(|c| c.expect("checked"))));
    }
    let rhs = parts.iter().find(|s| s.device() != parts[0].device());
    Err(Error::DeviceMismatch {
        op,
        lhs: parts[0].device(),
        rhs: rhs.map_or(parts[0].device(), |s| s.device()),
    })
}

/// The flash forward on the operands' device: Some((o, lse f32)), or None where the device has
/// no kernel for them.
fn flash(q: &Tensor, k: &Tensor, v: &Tensor, g: &AttnGeom) -> Result<Option<(Storage, Storage)>> {
    let (qs, ks, vs) = (q.storage(), k.storage(), v.storage());
    let (ql, kl, vl) = (q.layout(), k.layout(), v.layout());
    Ok(match on("attention", [&*qs, &*ks, &*vs])? {
        On::Cpu([a, b, c]) => {
            let (o, lse) = cpu::attention((a, ql), (b, kl), (c, vl), g);
            Some((Storage::Cpu(o), Storage::Cpu(lse)))
        }
        On::Cuda([a, b, c]) => match cudnn::attention((a, ql), (b, kl), (c, vl), g)? {
            Some(r) => Some(r),
            None => cuda::attention((a, ql), (b, kl), (c, vl), g)?,
        }
        .map(|(o, lse)| (Storage::Cuda(o), Storage::Cuda(lse))),
    })
}

/// The one backward of [`attention`]'s kernels: (dq, dk, dv) from the operands, the forward's
/// output `o` and log-sum-exp, and the output gradient.
fn flash_backward(
    [q, k, v]: [&Tensor; 3],
    o: &Tensor,
    grad: &Tensor,
    lse: &Storage,
    g: &AttnGeom,
) -> Result<[Tensor; 3]> {
    let (qs, ks, vs, os, gs) = (
        q.storage(),
        k.storage(),
        v.storage(),
        o.storage(),
        grad.storage(),
    );
    let (ql, kl, vl, ol, gl) = (
        q.layout(),
        k.layout(),
        v.layout(),
        o.layout(),
        grad.layout(),
    );
    let [dq, dk, dv] = match on("attention", [&*qs, &*ks, &*vs, &*os, &*gs, lse])? {
        On::Cpu([a, b, c, o, gr, lse]) => {
            cpu::attention_backward([(a, ql), (b, kl), (c, vl)], (o, ol), (gr, gl), lse, g)
                .map(Storage::Cpu)
        }
        On::Cuda([a, b, c, o, gr, lse]) => {
            let ops = [(a, ql), (b, kl), (c, vl), (o, ol), (gr, gl)];
            let (dq, dk, dv) = match cudnn::attention_backward(ops, lse, g)? {
                Some(r) => r,
                None => {
                    cuda::attention_backward((a, ql), (b, kl), (c, vl), (o, ol), (gr, gl), lse, g)?
                }
            };
            [dq, dk, dv].map(Storage::Cuda)
        }
    };
    let t = |s, like: &Tensor| Tensor::from_storage(s, like.shape());
    Ok([t(dq, q), t(dk, k), t(dv, v)])
}

/// softmax(scale · q kᵀ [+ causal mask]) v for q [b, h, tq, d], k and v [b, h, tk, d], as one
/// fused, differentiable op that never builds the [tq, tk] matrices (see the module docs).
/// `causal` masks future keys, aligned bottom-right (query i is position tk − tq + i).
/// Under autocast q, k and v are cast to the region's dtype first (PyTorch's rule for
/// scaled_dot_product_attention), which is also what lets CUDA's f16/bf16 kernel run.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, scale: f32) -> Result<Tensor> {
    if let Some(c) = crate::amp::autocast_inputs(&[q, k, v])? {
        return attention(&c[0], &c[1], &c[2], causal, scale);
    }
    if attention_backend() == AttentionBackend::Composite {
        return attention_reference(q, k, v, causal, scale);
    }
    let g = geom::of_qkv(q, k, v, causal, scale)?;
    let Some((o, lse)) = flash(q, k, v, &g)? else {
        // No kernel for these operands on this device: the composite.
        return attention_reference(q, k, v, causal, scale);
    };
    let (qt, kt, vt) = (q.clone(), k.clone(), v.clone());
    Ok(output(
        o,
        &[g.b, g.h, g.tq, g.d],
        "flash_attention",
        &[q, k, v],
        move |grad, y| {
            let [dq, dk, dv] = flash_backward([&qt, &kt, &vt], y, grad, &lse, &g)?;
            Ok(vec![Some(dq), Some(dk), Some(dv)])
        },
    ))
}

/// [tq, tk] bool, true where query row i may not see key j under the bottom-right causal
/// alignment (j ≥ i + tk + 1 − tq), built from two aranges on `device`: no host upload, so a
/// step using it can be captured in a CUDA graph.
pub fn causal_mask(tq: usize, tk: usize, device: Device) -> Result<Tensor> {
    let cols = Tensor::arange(0.0, tk as f64, 1.0, DType::I64, device)?.reshape(&[1, tk])?;
    let first = tk as f64 + 1.0 - tq as f64;
    let rows =
        Tensor::arange(first, first + tq as f64, 1.0, DType::I64, device)?.reshape(&[tq, 1])?;
    cols.ge(&rows)
}

/// The composite reference: the same attention from unfused ops (materialises [tq, tk]); also
/// what `attention` runs where a backend has no kernel for the operands.
pub fn attention_reference(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    scale: f32,
) -> Result<Tensor> {
    let g = geom::of_qkv(q, k, v, causal, scale)?;
    let (dead, live) = (g.tq.saturating_sub(g.tk), g.tq.min(g.tk));
    if causal && dead > 0 && live > 0 {
        // The first tq − tk query rows see no key: their output is 0 (as the kernels give). A
        // softmax over an all −inf row would be NaN, forward and backward, so only the live
        // rows (the last tk, whose alignment is the square one) go through it.
        let o = attention_reference(&q.narrow(2, dead, live)?, k, v, true, scale)?;
        let zeros = Tensor::zeros(&[g.b, g.h, dead, g.d], o.dtype(), o.device())?;
        return Tensor::cat(&[zeros, o], 2);
    }
    let s = q.matmul(&k.t()?)?.mul_scalar(scale)?;
    if g.tk == 0 {
        // No keys at all: every output is 0 (a softmax over nothing has no value), still
        // differentiable (the gradients are 0).
        return s.matmul(v);
    }
    let s = if causal {
        s.masked_fill(&causal_mask(g.tq, g.tk, q.device())?, f32::NEG_INFINITY)?
    } else {
        s
    };
    s.softmax(-1)?.matmul(v)
}

/// The packed forward on qkv's device: Some((y [b, t, h·d], lse)) or None.
fn packed(qkv: &Tensor, g: &AttnGeom) -> Result<Option<(Storage, Storage)>> {
    let (s, l) = (qkv.storage(), qkv.layout());
    Ok(match on("attention", [&*s])? {
        On::Cpu([x]) => {
            let (y, lse) = cpu::packed((x, l), g);
            Some((Storage::Cpu(y), Storage::Cpu(lse)))
        }
        On::Cuda([x]) => match cudnn::attention_packed((x, l), g)? {
            Some(r) => Some(r),
            None => cuda::attention_packed((x, l), g)?,
        }
        .map(|(y, lse)| (Storage::Cuda(y), Storage::Cuda(lse))),
    })
}

/// dqkv of [`packed`] from qkv, its output y, the output gradient and the log-sum-exp.
fn packed_backward(
    qkv: &Tensor,
    y: &Tensor,
    grad: &Tensor,
    lse: &Storage,
    g: &AttnGeom,
) -> Result<Tensor> {
    let (xs, ys, gs) = (qkv.storage(), y.storage(), grad.storage());
    let (xl, yl, gl) = (qkv.layout(), y.layout(), grad.layout());
    let d = match on("attention", [&*xs, &*ys, &*gs, lse])? {
        On::Cpu([x, y, gr, lse]) => {
            Storage::Cpu(cpu::packed_backward((x, xl), (y, yl), (gr, gl), lse, g))
        }
        On::Cuda([x, y, gr, lse]) => Storage::Cuda(
            match cudnn::attention_packed_backward((x, xl), (y, yl), (gr, gl), lse, g)? {
                Some(d) => d,
                None => cuda::attention_packed_backward((x, xl), (y, yl), (gr, gl), lse, g)?,
            },
        ),
    };
    Ok(Tensor::from_storage(d, qkv.shape()))
}

/// Self-attention of a packed projection qkv [b, t, 3·c] (c = heads · head_dim; q, k and v side
/// by side, each split into heads along its c columns: GPT-2's layout) with `n_head` heads:
/// [b, t, c] (heads merged), differentiable in qkv. Equal to [`attention_packed_reference`].
///
/// Why: the composite splits the heads with narrow + transpose views and merges them with
/// transpose + reshape; the merge is a copy, dy reaches the kernel as a transposed view (a
/// copy), and each of q, k and v gets its own gradient (three zero-filled [b, t, 3·c] tensors
/// summed into dqkv). Here the kernels read every operand and write every result in the packed
/// layouts: none of those passes. Under autocast qkv is cast to the region's dtype first.
pub fn attention_packed(qkv: &Tensor, n_head: usize, causal: bool, scale: f32) -> Result<Tensor> {
    attention_packed_gqa(qkv, n_head, n_head, causal, scale)
}

/// [`attention_packed`] with grouped-query attention: qkv [b, t, (h + 2·kv)·d] holds `n_head`
/// query heads, then `n_kv_head` key heads and as many value heads (Llama's packed projection);
/// query head i reads kv head i / (n_head / n_kv_head). [b, t, h·d] out. The CPU and CUDA
/// kernels read the shared heads in place (no repeated k and v, forward or backward; a kv
/// head's gradient is summed over its query heads in the kernel). cuDNN runs multi-head only.
/// Equal to [`attention_packed_gqa_reference`].
pub fn attention_packed_gqa(
    qkv: &Tensor,
    n_head: usize,
    n_kv_head: usize,
    causal: bool,
    scale: f32,
) -> Result<Tensor> {
    if let Some(c) = crate::amp::autocast_inputs(&[qkv])? {
        return attention_packed_gqa(&c[0], n_head, n_kv_head, causal, scale);
    }
    let g = geom::of_packed(qkv, n_head, n_kv_head, causal, scale)?;
    if attention_backend() == AttentionBackend::Composite {
        return packed_reference(qkv, &g);
    }
    let Some((y, lse)) = packed(qkv, &g)? else {
        return packed_reference(qkv, &g);
    };
    let x = qkv.clone();
    Ok(output(
        y,
        &[g.b, g.tq, g.h * g.d],
        "attention_packed",
        &[qkv],
        move |grad, y| Ok(vec![Some(packed_backward(&x, y, grad, &lse, &g)?)]),
    ))
}

/// The composite: q, k and v as [b, h, t, d] views of qkv, [`attention`], and the heads
/// merged back to [b, t, c].
pub fn attention_packed_reference(
    qkv: &Tensor,
    n_head: usize,
    causal: bool,
    scale: f32,
) -> Result<Tensor> {
    attention_packed_gqa_reference(qkv, n_head, n_head, causal, scale)
}

/// The composite of [`attention_packed_gqa`]: the heads as views of qkv, each kv head repeated
/// for the query heads that share it, [`attention`], and the heads merged.
pub fn attention_packed_gqa_reference(
    qkv: &Tensor,
    n_head: usize,
    n_kv_head: usize,
    causal: bool,
    scale: f32,
) -> Result<Tensor> {
    packed_reference(
        qkv,
        &geom::of_packed(qkv, n_head, n_kv_head, causal, scale)?,
    )
}

fn packed_reference(qkv: &Tensor, g: &AttnGeom) -> Result<Tensor> {
    let (b, t, h, kv, d) = (g.b, g.tq, g.h, g.kv_h, g.d);
    // Split into heads before narrowing: a reshape of the narrowed columns would copy them.
    let all = qkv.reshape(&[b, t, h + 2 * kv, d])?;
    // [b, t, n, d] heads from head `head0` on, as [b, n, t, d] with each repeated `rep` times.
    let heads = |head0: usize, n: usize, rep: usize| -> Result<Tensor> {
        let x = all.narrow(2, head0, n)?.transpose(1, 2)?;
        if rep == 1 {
            return Ok(x);
        }
        x.unsqueeze(2)?
            .broadcast_as(&[b, n, rep, t, d])?
            .contiguous()?
            .reshape(&[b, n * rep, t, d])
    };
    let q = heads(0, h, 1)?;
    let k = heads(h, kv, g.group())?;
    let v = heads(h + kv, kv, g.group())?;
    let y = attention(&q, &k, &v, g.causal, g.scale)?;
    y.transpose(1, 2)?.reshape(&[b, t, h * d])
}

/// The decoding step's kernel on q's device: o, or None where the device has none for these
/// operands (nothing is written then). `caches` holds every cache storage once.
fn decode_step(
    [q, k, v]: [&Tensor; 3],
    caches: &mut [&mut Storage],
    seqs: &[DecodeSeq<'_>],
    scale: f32,
) -> Result<Option<Storage>> {
    let (qs, ks, vs) = (q.storage(), k.storage(), v.storage());
    let On::Cpu([qc, kc, vc]) = on("decode_attention", [&*qs, &*ks, &*vs])? else {
        // CUDA has no decoding kernel: the composite of device ops.
        return Ok(None);
    };
    let mut cs = Vec::with_capacity(caches.len());
    for c in caches.iter_mut() {
        match &mut **c {
            Storage::Cpu(c) => cs.push(c),
            other => {
                return Err(Error::DeviceMismatch {
                    op: "decode_attention",
                    lhs: Device::Cpu,
                    rhs: other.device(),
                })
            }
        }
    }
    let (ql, kl, vl) = (q.layout(), k.layout(), v.layout());
    let o = cpu_decode::decode_attention((qc, ql), (kc, kl), (vc, vl), &mut cs, seqs, scale)?;
    Ok(o.map(Storage::Cpu))
}

/// One decoding step of attention for a batch of independent sequences, each against its own
/// KV cache (continuous batching: sequences of different lengths decode together).
///
/// q, k, v [n, h, d] hold one new position per sequence (views whose last dimension is
/// contiguous, e.g. thirds of a packed qkv projection, are fine); sequence i's caches k_i, v_i
/// [1, h, capacity, d] have their first `lens[i]` positions filled. Writes k[i], v[i] into
/// cache i at position lens[i] (in place; the caller then counts one more cached position) and
/// returns o [n, h, d] with o[i, j] = softmax(scale · q[i, j] · K_i[j, 0..=lens[i]]ᵀ) ·
/// V_i[j, 0..=lens[i]]. One call per layer instead of several small ops per sequence.
/// Inference only (no gradient is recorded): call it under `no_grad`. The CPU runs its kernel
/// for f32 caches; elsewhere the op is [`decode_attention_reference`].
pub fn decode_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    k_caches: &[&Tensor],
    v_caches: &[&Tensor],
    lens: &[usize],
    scale: f32,
) -> Result<Tensor> {
    let g = geom::of_decode(q, k, v, k_caches, v_caches, lens)?;
    if is_grad_enabled() && [q, k, v].iter().any(|t| t.tracks_grad()) {
        crate::bail!("decode_attention: inference only; run it under no_grad");
    }
    // Every cache storage once (sequences may hold views of one pool), locked for writing in
    // address order, so that two steps over the same caches cannot deadlock.
    let mut storages: Vec<&Arc<crate::tensor::StorageCell>> = k_caches
        .iter()
        .chain(v_caches)
        .map(|t| &t.0.storage)
        .collect();
    storages.sort_by_key(|a| Arc::as_ptr(a));
    storages.dedup_by(|a, b| Arc::ptr_eq(a, b));
    let index = |t: &Tensor| {
        storages
            .iter()
            .position(|a| Arc::ptr_eq(a, &t.0.storage))
            .expect("every cache is listed")
    };
    let seqs: Vec<DecodeSeq<'_>> = (0..g.n)
        .map(|i| DecodeSeq {
            k: index(k_caches[i]),
            kl: k_caches[i].layout(),
            v: index(v_caches[i]),
            vl: v_caches[i].layout(),
            len: lens[i],
        })
        .collect();
    let out = {
        let mut guards: Vec<_> = storages
            .iter()
            .map(|a| a.write().unwrap_or_else(|e| e.into_inner()))
            .collect();
        let mut caches: Vec<&mut Storage> = guards.iter_mut().map(|g| &mut **g).collect();
        decode_step([q, k, v], &mut caches, &seqs, scale)?
    };
    match out {
        Some(o) => Ok(Tensor::from_storage(o, &[g.n, g.h, g.d])),
        None => decode_attention_reference(q, k, v, k_caches, v_caches, lens, scale),
    }
}

/// The composite of device ops: per sequence, the new keys and values are assigned into the
/// cache and [`attention`] runs the one query row against the filled positions. The reference
/// for the kernel above and the path on CUDA and for half-precision caches.
pub fn decode_attention_reference(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    k_caches: &[&Tensor],
    v_caches: &[&Tensor],
    lens: &[usize],
    scale: f32,
) -> Result<Tensor> {
    let g = geom::of_decode(q, k, v, k_caches, v_caches, lens)?;
    let mut rows = Vec::with_capacity(g.n);
    for (i, &len) in lens.iter().enumerate() {
        // [1, h, d] → [1, h, 1, d]: the cache's layout for one position.
        let at = |t: &Tensor| t.narrow(0, i, 1)?.unsqueeze(2);
        k_caches[i].narrow(2, len, 1)?.assign(&at(k)?)?;
        v_caches[i].narrow(2, len, 1)?.assign(&at(v)?)?;
        let (kc, vc) = (
            k_caches[i].narrow(2, 0, len + 1)?,
            v_caches[i].narrow(2, 0, len + 1)?,
        );
        rows.push(attention(&at(q)?, &kc, &vc, false, scale)?);
    }
    if rows.is_empty() {
        return Tensor::zeros(&[0, g.h, g.d], q.dtype(), q.device());
    }
    Tensor::cat(&rows, 0)?.reshape(&[g.n, g.h, g.d])
}

/// Attention in f64 over row-major q [b, h, tq, d] and k, v [b, h, tk, d], written from its
/// definition: the one reference of the op's kernel tests in every crate. Causal masking is
/// aligned bottom-right; a query row that sees no key gives 0 (and log-sum-exp −∞).
pub mod reference {
    /// The sizes of a problem: (b·h, tq, tk, d).
    #[derive(Clone, Copy, Debug)]
    pub struct Dims {
        pub bh: usize,
        pub tq: usize,
        pub tk: usize,
        pub d: usize,
    }

    /// softmax(scale · q kᵀ) of query `r` of head `bh` over the keys it sees, and the
    /// log-sum-exp of those scores (−∞ when it sees none).
    fn probs(
        q: &[f64],
        k: &[f64],
        z: Dims,
        (bh, r): (usize, usize),
        causal: bool,
        scale: f64,
    ) -> (Vec<f64>, f64) {
        let seen = if causal {
            (r + z.tk + 1).saturating_sub(z.tq).min(z.tk)
        } else {
            z.tk
        };
        let (qr, kb) = ((bh * z.tq + r) * z.d, bh * z.tk * z.d);
        let s: Vec<f64> = (0..seen)
            .map(|j| {
                let key = &k[kb + j * z.d..kb + (j + 1) * z.d];
                scale
                    * q[qr..qr + z.d]
                        .iter()
                        .zip(key)
                        .map(|(a, b)| a * b)
                        .sum::<f64>()
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if s.is_empty() {
            return (s, m);
        }
        let lse = m + s.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
        (s.iter().map(|x| (x - lse).exp()).collect(), lse)
    }

    /// (o [b, h, tq, d], lse [b, h, tq]).
    pub fn forward(
        q: &[f64],
        k: &[f64],
        v: &[f64],
        z: Dims,
        causal: bool,
        scale: f64,
    ) -> (Vec<f64>, Vec<f64>) {
        let mut o = vec![0.0; z.bh * z.tq * z.d];
        let mut lse = vec![f64::NEG_INFINITY; z.bh * z.tq];
        for bh in 0..z.bh {
            for r in 0..z.tq {
                let (p, l) = probs(q, k, z, (bh, r), causal, scale);
                lse[bh * z.tq + r] = l;
                let out = &mut o[(bh * z.tq + r) * z.d..(bh * z.tq + r + 1) * z.d];
                for (j, pj) in p.iter().enumerate() {
                    let val = &v[(bh * z.tk + j) * z.d..(bh * z.tk + j + 1) * z.d];
                    for (oe, ve) in out.iter_mut().zip(val) {
                        *oe += pj * ve;
                    }
                }
            }
        }
        (o, lse)
    }

    /// The vector-Jacobian product: (dq, dk, dv) of Σ dout ∘ attention(q, k, v), with
    /// dS = P ∘ (dP − rowsum(P ∘ dP)), dP = dout · vᵀ.
    pub fn backward(
        q: &[f64],
        k: &[f64],
        v: &[f64],
        dout: &[f64],
        z: Dims,
        causal: bool,
        scale: f64,
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let d = z.d;
        let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
        for bh in 0..z.bh {
            let kb = bh * z.tk * d;
            for r in 0..z.tq {
                let (p, _) = probs(q, k, z, (bh, r), causal, scale);
                let qr = (bh * z.tq + r) * d;
                let dy = &dout[qr..qr + d];
                let dp: Vec<f64> = (0..p.len())
                    .map(|j| (0..d).map(|e| dy[e] * v[kb + j * d + e]).sum())
                    .collect();
                let pdp: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for (j, (pj, dpj)) in p.iter().zip(&dp).enumerate() {
                    let ds = pj * (dpj - pdp);
                    for (e, &dye) in dy.iter().enumerate() {
                        dq[qr + e] += scale * ds * k[kb + j * d + e];
                        dk[kb + j * d + e] += scale * ds * q[qr + e];
                        dv[kb + j * d + e] += pj * dye;
                    }
                }
            }
        }
        (dq, dk, dv)
    }
}

#[cfg(test)]
mod tests;
