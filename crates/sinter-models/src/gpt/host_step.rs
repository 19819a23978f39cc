//! The decode step and the prefill of a GPT on the CPU, run as one pass over preallocated
//! buffers instead of ~25 tensor ops per layer.
//!
//! A step takes rows — each one token at one absolute position of one sequence — and runs
//! every block on all of them at once: the weights are read in place (`Tensor::host_f32`)
//! or, after `Gpt::pack_weights` (the server), from copies packed once for the GEMM's
//! micro-kernels; each projection is one GEMM with its bias (and GELU) in its epilogue, the
//! residual adds are the GEMMs' β = 1 accumulation into the residual stream, LayerNorm
//! writes into a scratch buffer kept between steps, and attention appends each row's keys
//! and values into its sequence's KV cache in place and attends over the cache up to the
//! row's position (`sinter_cpu::math::cached_attention`). Nothing is allocated per op and
//! no autograd graph is built. Each GEMM runs on one thread (forking per product cost more
//! than it saved); instead a step of many rows is split in two parts, one per core (`step`).
//!
//! It is the same model as the tensor path (`Gpt::forward_step`, the reference it is tested
//! against): the same weights, the same kernels' arithmetic up to the order of a few f32
//! additions. It applies when every weight is a contiguous f32 tensor on the CPU, the caches
//! are f32 CPU buffers, and no layer is being calibrated; a Linear with an int8 form runs
//! that form on the step's rows (the rest of the step stays here). Elsewhere (CUDA,
//! half precision) the callers run the tensor path.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sinter_core::{bail, DType, Device, HostF32, Result, StorageStamp, Tensor};
use sinter_cpu::gemm::{Gemm, MatMut, MatRef, PackedB};
use sinter_cpu::math::cached_attention::{attend_row, CachedHead};
use sinter_cpu::math::layer_norm::layer_norm_rows;
use sinter_cpu::math::Activation;
use sinter_cpu::Isa;
use sinter_nn::quant::slot::Int8Layer;
use sinter_nn::quant::{QuantSlot, QuantState};
use sinter_nn::{Embedding, LayerNorm, Linear};

use super::{Gpt, KvCache};

/// One row of a step: `token` at position `pos` of the sequence whose cache is
/// `caches[seq]`. Rows of one sequence are consecutive, in position order, and start at
/// its cache's length.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepRow {
    pub token: i64,
    pub pos: usize,
    pub seq: usize,
}

/// The buffers of a step, kept between steps (they grow to the largest step seen): one set
/// per part of a step that is split across two threads.
#[derive(Default)]
pub(crate) struct Scratch {
    parts: [Buffers; 2],
    /// The weights packed for the GEMMs (`Gpt::pack_weights`), while they match the model.
    packed: Option<PackedWeights>,
}

/// The f32 weights of the projections and of the tied head, packed once for the GEMM's
/// micro-kernels, so that a product packs only the step's rows. Read in place, a weight goes
/// through the dot form, which is slower (gpt-tiny's decode step on 2 Zen 5 cores, in place
/// → packed: 1 sequence 0.050 → 0.041 ms, 12 sequences 0.144 → 0.107, 16 sequences 0.166
/// → 0.120; `benches/generate.rs -- batch`).
pub(crate) struct PackedWeights {
    /// Per block: qkv, proj, fc, fc2 (None: an int8 layer).
    blocks: Vec<[Option<PackedB>; 4]>,
    head: Option<PackedB>,
    isa: Isa,
    /// The packed weights as they were (`Fingerprint`), in `HostModel::f32_weights` order.
    prints: Vec<Fingerprint>,
}

/// Which storage a packed weight was read from, how many times that storage had been
/// written then (`Tensor::storage_stamp`: every in-place change counts, so an optimizer step,
/// a loaded checkpoint or one edited value all show), and where in it the weight lies. When
/// one differs at a step, the packs are dropped.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    stamp: StorageStamp,
    at: usize,
    len: usize,
}

impl Fingerprint {
    fn of(w: &[f32], stamp: StorageStamp) -> Fingerprint {
        Fingerprint {
            stamp,
            at: w.as_ptr() as usize,
            len: w.len(),
        }
    }
}

impl PackedWeights {
    fn of(m: &HostModel) -> Result<PackedWeights> {
        let isa = m.isa;
        let blocks = (m.blocks.iter())
            .map(|b| {
                let [q, p, f, f2] = [&b.qkv, &b.proj, &b.fc, &b.fc2].map(|l| l.pack(isa));
                Ok([q?, p?, f?, f2?])
            })
            .collect::<Result<Vec<_>>>()?;
        let head = match &m.wte {
            Table::F32(w, _) => Some(pack(isa, w, m.c, m.vocab)?),
            Table::Int8(_) => None,
        };
        Ok(PackedWeights {
            blocks,
            head,
            isa,
            prints: m.f32_weights().collect(),
        })
    }

    /// Whether these packs are `m`'s weights as they are now.
    fn matches(&self, m: &HostModel) -> bool {
        self.isa == m.isa
            && self.blocks.len() == m.blocks.len()
            && m.f32_weights().eq(self.prints.iter().copied())
    }
}

/// W [out, inp] row-major packed as the B operand (Wᵀ, inp × out) of x Wᵀ.
fn pack(isa: Isa, w: &[f32], inp: usize, out: usize) -> Result<PackedB> {
    let wt = MatRef {
        data: w,
        offset: 0,
        rs: 1,
        cs: inp as isize,
    };
    PackedB::new_isa(isa, wt, inp, out)
        .map_err(|e| sinter_core::Error::Msg(format!("gpt: packing a weight: {e}")))
}

#[derive(Default)]
struct Buffers {
    x: Vec<f32>,
    h: Vec<f32>,
    qkv: Vec<f32>,
    y: Vec<f32>,
    f: Vec<f32>,
    p: Vec<f32>,
    mean: Vec<f32>,
    rstd: Vec<f32>,
}

impl Buffers {
    fn size(&mut self, rows: usize, c: usize, max_len: usize) {
        let fit = |v: &mut Vec<f32>, n: usize| v.resize(n, 0.0);
        fit(&mut self.x, rows * c);
        fit(&mut self.h, rows * c);
        fit(&mut self.qkv, rows * 3 * c);
        fit(&mut self.y, rows * c);
        fit(&mut self.f, rows * 4 * c);
        fit(&mut self.p, max_len);
        fit(&mut self.mean, rows);
        fit(&mut self.rstd, rows);
    }
}

/// Steps with at least this many rows run as two parts on two threads (a guess, not tuned:
/// with fewer, a part is too small to pay for the fork; gpt-tiny, 16 sequences: 157 µs per
/// step, 4.9× the tokens/s of one sequence's 48 µs).
const SPLIT_ROWS: usize = 8;

/// How the second part of a split step waits for the first: the number of layers whose
/// keys and values the first part has appended (`usize::MAX` once it has stopped, however).
struct Progress(AtomicUsize);

impl Progress {
    /// Waits until the first part has appended layer `l` (or stopped).
    fn wait_for(&self, l: usize) {
        let mut spins = 0u32;
        while self.0.load(Ordering::Acquire) <= l {
            if spins < 64 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// Marks the first part as stopped when dropped (on success, error or panic), so the second
/// never waits for it in vain.
struct Stopped<'a>(&'a Progress);

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        self.0 .0.store(usize::MAX, Ordering::Release);
    }
}

/// A part's place in a split step.
#[derive(Clone, Copy)]
enum Role<'a> {
    /// The step is not split.
    Whole,
    /// The first part: publishes each layer's appended keys and values.
    First(&'a Progress),
    /// The second part: its first sequence's earlier rows are the first part's, so its
    /// attention of layer l waits for them.
    Second(&'a Progress),
}

/// A Linear as the step runs it.
enum Proj<'a> {
    /// Its f32 weight [out, in] and bias, read in place; the weight's stamp taken with its
    /// read lock held (packs made from it stay valid while it is unchanged).
    F32 {
        w: HostF32<'a>,
        b: Option<HostF32<'a>>,
        inp: usize,
        out: usize,
        stamp: StorageStamp,
    },
    /// Its int8 form (bias included).
    Int8(Arc<dyn Int8Layer>),
}

/// Host views of a tensor that must have one; None sends the step to the tensor path.
fn host(t: &Tensor) -> Option<HostF32<'_>> {
    t.host_f32()
}

/// Whether a layer runs its f32 weights (Some(None)), an int8 form (Some(Some)), or is being
/// calibrated (None: its observer must see the inputs, so the tensor path runs).
fn int8_form(slot: &QuantSlot) -> Option<Option<Arc<dyn Int8Layer>>> {
    match slot.state() {
        QuantState::F32 => Some(None),
        QuantState::Int8(q) => Some(Some(q)),
        QuantState::Calibrating(_) => None,
    }
}

impl<'a> Proj<'a> {
    fn of(l: &'a Linear) -> Option<Proj<'a>> {
        if let Some(q) = int8_form(&l.quant)? {
            return Some(Proj::Int8(q));
        }
        let (out, inp) = (l.weight.shape()[0], l.weight.shape()[1]);
        let b = match &l.bias {
            Some(b) => Some(host(b)?),
            None => None,
        };
        let w = host(&l.weight)?;
        Some(Proj::F32 {
            stamp: l.weight.storage_stamp(),
            w,
            b,
            inp,
            out,
        })
    }

    /// Its f32 weight packed (None for an int8 layer).
    fn pack(&self, isa: Isa) -> Result<Option<PackedB>> {
        match self {
            Proj::F32 { w, inp, out, .. } => Ok(Some(pack(isa, w, *inp, *out)?)),
            Proj::Int8(_) => Ok(None),
        }
    }

    /// y = act(x Wᵀ + b) for `rows` rows of x, or y += x Wᵀ + b with `accumulate` (the
    /// residual add); with W's packed form when given.
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &self,
        isa: Isa,
        x: &[f32],
        rows: usize,
        y: &mut [f32],
        act: Activation,
        accumulate: bool,
        packed: Option<&PackedB>,
    ) -> Result<()> {
        match self {
            Proj::F32 { w, b, inp, out, .. } => {
                let geom = (rows, *inp, *out);
                let w = match packed {
                    Some(p) => Weight::Packed(p),
                    None => Weight::InPlace(w),
                };
                xwt(isa, x, w, b.as_deref(), geom, act, accumulate, y)
            }
            Proj::Int8(q) => int8_apply(q.as_ref(), x, rows, act, accumulate, y),
        }
    }
}

/// A weight up to this size stays in the core's cache between chunks of a step (`xwt`).
const CACHED_WEIGHT_BYTES: usize = 1 << 20;

/// The W of a product x Wᵀ: [out, inp] row-major read in place, or packed ahead (any number
/// of rows: the micro-kernels' 8- or 12-row tiles, one row the matrix × vector form).
#[derive(Clone, Copy)]
enum Weight<'w> {
    InPlace(&'w [f32]),
    Packed(&'w PackedB),
}

/// y = act(x Wᵀ + b) (or y += x Wᵀ + b with `accumulate`) for x [rows, inp], on this
/// thread.
#[allow(clippy::too_many_arguments)]
fn xwt(
    isa: Isa,
    x: &[f32],
    w: Weight,
    b: Option<&[f32]>,
    (rows, inp, out): (usize, usize, usize),
    act: Activation,
    accumulate: bool,
    y: &mut [f32],
) -> Result<()> {
    // One thread: forking each product of a step costs more than it saves (a 64-position
    // prefill of gpt-tiny: 1,695 vs 1,575 tokens/s threaded); `step` splits rows instead.
    let mut g = (Gemm::new(rows, out, inp).isa(isa))
        .activation(act)
        .threads(1);
    if accumulate {
        g = g.beta(1.0);
    }
    if let Some(b) = b {
        g = g.bias(b);
    }
    let failed = |e| sinter_core::Error::Msg(format!("gpt step: {e}"));
    let w = match w {
        Weight::Packed(p) => {
            let xs = MatRef::row_major(&x[..rows * inp], inp);
            let ys = MatMut::row_major(&mut y[..rows * out], out);
            return g.run_packed(xs, p, ys, None).map_err(failed);
        }
        Weight::InPlace(w) => w,
    };
    let wt = MatRef {
        data: w,
        offset: 0,
        rs: 1,
        cs: inp as isize,
    };
    // Up to 16 rows take sinter-cpu's few-column dot form (no packing). Larger steps of a
    // cached weight run in such chunks too: re-reading W from cache per chunk measured
    // cheaper here than packing it for one product (gpt-tiny, 32 rows per part: prefill of a
    // 64-token window ~1,510 vs ~1,320 tokens/s, serving 64 streams 30.8–48.0k vs
    // 24.9–26.1k tokens/s; noisy, load 11–13). A weight beyond the cache runs as one product.
    let chunk = if rows <= 64 && out * inp * 4 <= CACHED_WEIGHT_BYTES {
        16
    } else {
        rows
    };
    let mut r0 = 0;
    while r0 < rows {
        let n = chunk.min(rows - r0);
        let xs = MatRef::row_major(&x[r0 * inp..(r0 + n) * inp], inp);
        let g = Gemm { m: n, ..g };
        g.run(
            xs,
            wt,
            MatMut::row_major(&mut y[r0 * out..(r0 + n) * out], out),
        )
        .map_err(failed)?;
        r0 += n;
    }
    Ok(())
}

/// An int8 layer's act(x Wᵀ + b) on `rows` rows of x, stored into (or added to) y.
fn int8_apply(
    q: &dyn Int8Layer,
    x: &[f32],
    rows: usize,
    act: Activation,
    accumulate: bool,
    y: &mut [f32],
) -> Result<()> {
    let inp = x.len() / rows.max(1);
    let xt = Tensor::from_slice(&x[..rows * inp], &[rows, inp], Device::Cpu)?;
    store(&q.forward(&xt, act)?, accumulate, y)
}

/// A tensor's elements stored into (or added to) the front of y.
fn store(t: &Tensor, accumulate: bool, y: &mut [f32]) -> Result<()> {
    let v = t.to_vec_f32()?;
    let y = &mut y[..v.len()];
    if accumulate {
        y.iter_mut().zip(&v).for_each(|(y, v)| *y += v);
    } else {
        y.copy_from_slice(&v);
    }
    Ok(())
}

/// An embedding table as the step reads it: its f32 rows in place, or its int8 form (which
/// also serves the tied head).
enum Table<'a> {
    /// The rows in place and their stamp (as `Proj::F32`'s).
    F32(HostF32<'a>, StorageStamp),
    Int8(Arc<dyn Int8Layer>),
}

impl<'a> Table<'a> {
    fn of(e: &'a Embedding) -> Option<Table<'a>> {
        Some(match int8_form(&e.quant)? {
            Some(q) => Table::Int8(q),
            None => {
                let w = host(&e.weight)?;
                Table::F32(w, e.weight.storage_stamp())
            }
        })
    }

    /// x[i] (+)= the table's row ids[i], c values each.
    fn rows(&self, ids: &[usize], c: usize, accumulate: bool, x: &mut [f32]) -> Result<()> {
        match self {
            Table::F32(w, _) => {
                for (&id, xr) in ids.iter().zip(x.chunks_exact_mut(c)) {
                    let row = &w[id * c..(id + 1) * c];
                    if accumulate {
                        xr.iter_mut().zip(row).for_each(|(x, r)| *x += r);
                    } else {
                        xr.copy_from_slice(row);
                    }
                }
                Ok(())
            }
            Table::Int8(q) => {
                let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
                let t = Tensor::from_vec(ids, &[x.len() / c], Device::Cpu)?;
                store(&q.lookup(&t)?, accumulate, x)
            }
        }
    }

    /// The tied head: logits [rows, vocab] = h Tᵀ (with T's packed form when given).
    fn head(
        &self,
        isa: Isa,
        h: &[f32],
        geom: (usize, usize, usize),
        packed: Option<&PackedB>,
    ) -> Result<Vec<f32>> {
        let (rows, c, vocab) = geom;
        let mut logits = vec![0f32; rows * vocab];
        if rows == 0 {
            return Ok(logits);
        }
        let h = &h[..rows * c];
        match self {
            Table::F32(w, _) => {
                let w = packed.map_or(Weight::InPlace(w), Weight::Packed);
                xwt(isa, h, w, None, geom, Activation::None, false, &mut logits)?
            }
            Table::Int8(q) => {
                int8_apply(q.as_ref(), h, rows, Activation::None, false, &mut logits)?
            }
        }
        Ok(logits)
    }
}

/// A LayerNorm's weight and bias, read in place.
struct Norm<'a> {
    g: HostF32<'a>,
    b: HostF32<'a>,
    eps: f32,
}

impl<'a> Norm<'a> {
    fn of(n: &'a LayerNorm) -> Option<Norm<'a>> {
        Some(Norm {
            g: host(&n.weight)?,
            b: host(&n.bias)?,
            eps: n.eps,
        })
    }
    /// y = LayerNorm(x) over `rows` rows.
    fn apply(&self, isa: Isa, x: &[f32], rows: usize, y: &mut [f32], s: &mut Stats) {
        let c = self.g.len();
        let (mean, rstd) = (&mut s.mean[..rows], &mut s.rstd[..rows]);
        layer_norm_rows(
            isa,
            &x[..rows * c],
            &self.g,
            &self.b,
            self.eps,
            &mut y[..rows * c],
            mean,
            rstd,
        );
    }
}

/// The per-row statistics LayerNorm writes (not needed after the step).
struct Stats<'s> {
    mean: &'s mut [f32],
    rstd: &'s mut [f32],
}

struct Block<'a> {
    ln1: Norm<'a>,
    qkv: Proj<'a>,
    proj: Proj<'a>,
    ln2: Norm<'a>,
    fc: Proj<'a>,
    fc2: Proj<'a>,
}

/// A GPT's weights as the step reads them (the storages' read locks held for one step).
pub(crate) struct HostModel<'a> {
    wte: Table<'a>,
    wpe: Table<'a>,
    blocks: Vec<Block<'a>>,
    ln_f: Norm<'a>,
    c: usize,
    heads: usize,
    vocab: usize,
    n_pos: usize,
    isa: Isa,
}

impl Gpt {
    /// The host step's view of this model, or None when the tensor path must run (see the
    /// module comment).
    pub(crate) fn host_model(&self) -> Option<HostModel<'_>> {
        // GPT-2's block only, so far: the Llama family runs the tensor path.
        if !self.config.arch.is_gpt2() {
            return None;
        }
        let blocks = self
            .blocks
            .iter()
            .map(|b| {
                Some(Block {
                    ln1: Norm::of(b.ln1.as_layer_norm()?)?,
                    qkv: Proj::of(&b.attn.qkv)?,
                    proj: Proj::of(&b.attn.proj)?,
                    ln2: Norm::of(b.ln2.as_layer_norm()?)?,
                    fc: Proj::of(&b.mlp.fc)?,
                    fc2: Proj::of(&b.mlp.proj)?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let c = &self.config;
        Some(HostModel {
            wte: Table::of(&self.wte)?,
            wpe: Table::of(self.wpe.as_ref()?)?,
            blocks,
            ln_f: Norm::of(self.ln_f.as_layer_norm()?)?,
            c: c.n_embd,
            heads: c.n_head,
            vocab: c.vocab_size,
            n_pos: c.block_size,
            isa: Isa::get(),
        })
    }

    /// Packs the f32 weights of the projections and of the tied head for the host step's
    /// GEMMs (see `PackedWeights`); later steps and prefills use the packs. For inference:
    /// a step that finds any packed weight written since (trained, loaded, edited in place,
    /// moved or replaced: its `storage_stamp` changed) drops the packs and reads the weights
    /// in place again; call this again to re-pack. The packs take as much memory as the
    /// weights. Returns false (nothing packed) where the host step does not run (CUDA, half
    /// precision, calibration).
    pub fn pack_weights(&self) -> Result<bool> {
        let Some(m) = self.host_model() else {
            return Ok(false);
        };
        let packed = PackedWeights::of(&m)?;
        self.scratch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .packed = Some(packed);
        Ok(true)
    }
}

/// Whether a cache's buffers can be written by the host step: f32 on the CPU, contiguous,
/// [1, heads, capacity, head_dim], keys and values in different storages.
pub(crate) fn host_cache(cache: &KvCache, heads: usize, head_dim: usize) -> bool {
    cache.layers.iter().all(|l| {
        let s = l.k.shape();
        [&l.k, &l.v]
            .iter()
            .all(|t| t.device() == Device::Cpu && t.dtype() == DType::F32 && t.is_contiguous())
            && s.len() == 4
            && s[0] == 1
            && s[1] == heads
            && s[3] == head_dim
            && l.v.shape() == s
            && !l.k.shares_storage_with(&l.v)
    })
}

impl HostModel<'_> {
    /// The f32 weights that `PackedWeights` packs, in a fixed order.
    fn f32_weights(&self) -> impl Iterator<Item = Fingerprint> + '_ {
        let projs = self
            .blocks
            .iter()
            .flat_map(|b| [&b.qkv, &b.proj, &b.fc, &b.fc2]);
        let head = match &self.wte {
            Table::F32(w, stamp) => Some(Fingerprint::of(w, *stamp)),
            Table::Int8(_) => None,
        };
        (projs.filter_map(|p| match p {
            Proj::F32 { w, stamp, .. } => Some(Fingerprint::of(w, *stamp)),
            Proj::Int8(_) => None,
        }))
        .chain(head)
    }

    /// Runs the rows through every block, appending their keys and values to their caches
    /// (the caller then counts the positions as cached), and returns the logits of the rows
    /// listed in `logit_rows` (ascending), [logit_rows.len(), vocab] row-major.
    ///
    /// A step of `SPLIT_ROWS` rows or more runs as two parts, one per thread: the rows before
    /// and after the middle. Rows of different sequences are independent; where one sequence
    /// spans both parts, the second part's attention in layer l waits until the first part
    /// has appended its keys and values of layer l (the first never waits for the second,
    /// so the parts cannot deadlock, and run one after the other when no second thread is
    /// free).
    pub(crate) fn step(
        &self,
        rows: &[StepRow],
        caches: &[&mut KvCache],
        logit_rows: &[usize],
        s: &mut Scratch,
    ) -> Result<Vec<f32>> {
        debug_assert!(logit_rows.windows(2).all(|w| w[0] < w[1]));
        let Scratch {
            parts: [a, b],
            packed,
        } = s;
        if packed.as_ref().is_some_and(|p| !p.matches(self)) {
            *packed = None;
        }
        let packed = packed.as_ref();
        if rows.len() < SPLIT_ROWS || rayon::current_num_threads() < 2 {
            return self.part(rows, caches, logit_rows, a, packed, Role::Whole);
        }
        let mid = rows.len() / 2;
        let (ra, rb) = rows.split_at(mid);
        let split = logit_rows.partition_point(|&r| r < mid);
        let la = &logit_rows[..split];
        let lb: Vec<usize> = logit_rows[split..].iter().map(|r| r - mid).collect();
        let progress = Progress(AtomicUsize::new(0));
        let (first, second) = rayon::join(
            || {
                let _stopped = Stopped(&progress);
                self.part(ra, caches, la, a, packed, Role::First(&progress))
            },
            || {
                let role = if ra.last().map(|w| w.seq) == rb.first().map(|w| w.seq) {
                    Role::Second(&progress)
                } else {
                    Role::Whole
                };
                self.part(rb, caches, &lb, b, packed, role)
            },
        );
        let mut logits = first?;
        logits.extend(second?);
        Ok(logits)
    }

    /// One part of a step (see `step`) with its own buffers.
    fn part(
        &self,
        rows: &[StepRow],
        caches: &[&mut KvCache],
        logit_rows: &[usize],
        s: &mut Buffers,
        packed: Option<&PackedWeights>,
        role: Role,
    ) -> Result<Vec<f32>> {
        let (r, c, isa) = (rows.len(), self.c, self.isa);
        let max_len = rows.iter().map(|w| w.pos + 1).max().unwrap_or(1);
        s.size(r, c, max_len);
        self.embed(rows, &mut s.x)?;
        let Buffers {
            x,
            h,
            qkv,
            y,
            f,
            p,
            mean,
            rstd,
        } = s;
        let mut st = Stats { mean, rstd };
        for (l, b) in self.blocks.iter().enumerate() {
            let [pq, pp, pf, pf2] = match packed {
                Some(p) => p.blocks[l].each_ref().map(Option::as_ref),
                None => [None; 4],
            };
            b.ln1.apply(isa, x, r, h, &mut st);
            b.qkv.apply(isa, h, r, qkv, Activation::None, false, pq)?;
            if let Role::Second(progress) = role {
                progress.wait_for(l);
            }
            self.attention(l, rows, caches, qkv, y, p)?;
            if let Role::First(progress) = role {
                progress.0.store(l + 1, Ordering::Release);
            }
            b.proj.apply(isa, y, r, x, Activation::None, true, pp)?;
            b.ln2.apply(isa, x, r, h, &mut st);
            b.fc.apply(isa, h, r, f, Activation::GeluTanh, false, pf)?;
            b.fc2.apply(isa, f, r, x, Activation::None, true, pf2)?;
        }
        self.head(
            x,
            logit_rows,
            h,
            &mut st,
            packed.and_then(|p| p.head.as_ref()),
        )
    }

    /// x[i] = wte[token] + wpe[pos] per row.
    fn embed(&self, rows: &[StepRow], x: &mut [f32]) -> Result<()> {
        let (c, n_pos) = (self.c, self.n_pos);
        let mut tokens = Vec::with_capacity(rows.len());
        for w in rows {
            match usize::try_from(w.token).ok().filter(|&t| t < self.vocab) {
                Some(t) => tokens.push(t),
                None => bail!(
                    "gpt: token {} is outside the vocabulary of {}",
                    w.token,
                    self.vocab
                ),
            }
            if w.pos >= n_pos {
                bail!("gpt: position {} is beyond the context of {n_pos}", w.pos);
            }
        }
        let positions: Vec<usize> = rows.iter().map(|w| w.pos).collect();
        let x = &mut x[..rows.len() * c];
        self.wte.rows(&tokens, c, false, x)?;
        self.wpe.rows(&positions, c, true, x)
    }

    /// Layer `l`'s attention: each row's keys and values into its cache at its position,
    /// then each row's heads against its cache up to that position; y [rows, c].
    fn attention(
        &self,
        l: usize,
        rows: &[StepRow],
        caches: &[&mut KvCache],
        qkv: &[f32],
        y: &mut [f32],
        p: &mut [f32],
    ) -> Result<()> {
        let (c, h) = (self.c, self.heads);
        let d = c / h;
        let scale = 1.0 / (d as f32).sqrt();
        let mut i = 0;
        while i < rows.len() {
            let seq = rows[i].seq;
            let j = i + rows[i..].iter().take_while(|w| w.seq == seq).count();
            let layer = &caches[seq].layers[l];
            let cap = layer.capacity();
            let (Some(mut kc), Some(mut vc)) = (layer.k.host_f32_mut(), layer.v.host_f32_mut())
            else {
                bail!("gpt: sequence {seq}'s KV cache is not an f32 buffer on the CPU");
            };
            for (r, w) in rows.iter().enumerate().take(j).skip(i) {
                if w.pos >= cap {
                    bail!(
                        "gpt: sequence {seq}: position {} is beyond its KV cache of {cap}",
                        w.pos
                    );
                }
                let row = &qkv[r * 3 * c..(r + 1) * 3 * c];
                for head in 0..h {
                    let at = (head * cap + w.pos) * d;
                    kc[at..at + d].copy_from_slice(&row[c + head * d..c + (head + 1) * d]);
                    vc[at..at + d].copy_from_slice(&row[2 * c + head * d..2 * c + (head + 1) * d]);
                }
            }
            for (r, w) in rows.iter().enumerate().take(j).skip(i) {
                let q = &qkv[r * 3 * c..r * 3 * c + c];
                for head in 0..h {
                    let base = head * cap * d;
                    let cache = CachedHead {
                        k: &kc[base..base + cap * d],
                        v: &vc[base..base + cap * d],
                        n: w.pos + 1,
                        stride: d,
                    };
                    let o = &mut y[r * c + head * d..r * c + (head + 1) * d];
                    attend_row(self.isa, &q[head * d..(head + 1) * d], cache, scale, p, o);
                }
            }
            i = j;
        }
        Ok(())
    }

    /// The final LayerNorm and the tied head on the listed rows of x.
    fn head(
        &self,
        x: &[f32],
        rows: &[usize],
        h: &mut [f32],
        st: &mut Stats,
        packed: Option<&PackedB>,
    ) -> Result<Vec<f32>> {
        let (c, n) = (self.c, rows.len());
        let mut picked = Vec::with_capacity(n * c);
        for &r in rows {
            picked.extend_from_slice(&x[r * c..(r + 1) * c]);
        }
        self.ln_f.apply(self.isa, &picked, n, h, st);
        let logits = self.wte.head(self.isa, h, (n, c, self.vocab), packed)?;
        Ok(logits)
    }
}
