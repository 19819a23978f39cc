//! The decode step and the prefill of a decoder on the CPU, run as one pass over
//! preallocated buffers instead of ~25 tensor ops per layer: an executor of the one
//! Transformer block (`sinter_nn::transformer`), for every configuration it takes — GPT-2
//! (LayerNorm, GELU, learned positions) and the Llama family (RMSNorm, SwiGLU, rotary
//! positions, grouped-query attention, qkv bias, QK-norm, untied head).
//!
//! A step takes rows — each one token at one absolute position of one sequence — and runs
//! every block on all of them at once: the weights are read in place (`Tensor::host_f32`)
//! or, after `Decoder::pack_weights` (the server), from copies packed once for the GEMM's
//! micro-kernels; each projection is one GEMM with its bias (and GELU) in its epilogue, the
//! residual adds are the GEMMs' β = 1 accumulation into the residual stream, the norms
//! write into scratch buffers kept between steps, and attention rotates each row's query and
//! key heads, appends its keys and values into its sequence's KV cache in place and attends
//! over the cache up to the row's position (`sinter_cpu::math::cached_attention`; a query
//! head reads the kv head its group shares). Nothing is allocated per op and no autograd
//! graph is built. A product whose weight fits the core's cache runs on one thread (forking
//! per product cost more than it saved); a step of many rows is split in two parts instead,
//! one per core (`step`). A larger weight (a real model's) is streamed by every core.
//!
//! It is the same model as the tensor path (`Decoder::forward_step`, the reference it is tested
//! against): the same weights, the same kernels' arithmetic up to the order of a few f32
//! additions. It applies when every weight is a contiguous f32 tensor on the CPU, the caches
//! are f32 CPU buffers, and no layer is being calibrated; a Linear with an int8 form runs
//! that form on the step's rows (the rest of the step stays here). Elsewhere (CUDA,
//! half precision) the callers run the tensor path.

mod weights;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sinter_core::{bail, DType, Device, HostF32, Result};
use sinter_cpu::gemm::PackedB;
use sinter_cpu::math::cached_attention::{attend_row, CachedHead};
use sinter_cpu::math::rms_norm::rms_norm_rows;
use sinter_cpu::math::{swiglu_isa, Activation};
use sinter_cpu::Isa;
use sinter_nn::transformer::{MlpKind, Norm};
use sinter_nn::{Embedding, Linear, TransformerBlock};

use super::kv_cache::KvCache;
use weights::{host, Fingerprint, HostNorm, Proj, Stats, Table};

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
    /// The weights packed for the GEMMs (`Decoder::pack_weights`), while they match the model.
    packed: Option<PackedWeights>,
}

/// The f32 weights of the projections and of the head, packed once for the GEMM's
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

impl PackedWeights {
    fn of(m: &HostModel) -> Result<PackedWeights> {
        let isa = m.isa;
        let blocks = (m.blocks.iter())
            .map(|b| {
                let [q, p, f, f2] = [&b.qkv, &b.proj, &b.fc, &b.fc2].map(|l| l.pack(isa));
                Ok([q?, p?, f?, f2?])
            })
            .collect::<Result<Vec<_>>>()?;
        let head = match &m.head {
            Head::Tied => m.wte.pack(isa, m.dims.c, m.dims.vocab)?,
            Head::Own(p) => p.pack(isa)?,
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

/// A norm's statistics buffers of a `Buffers` (a macro so the borrow is of two fields only).
macro_rules! stats {
    ($s:expr) => {
        Stats {
            mean: &mut $s.mean,
            rstd: &mut $s.rstd,
        }
    };
}

#[derive(Default)]
struct Buffers {
    x: Vec<f32>,
    h: Vec<f32>,
    qkv: Vec<f32>,
    y: Vec<f32>,
    f: Vec<f32>,
    /// SwiGLU's SiLU(gate)·up, the down projection's input.
    g: Vec<f32>,
    p: Vec<f32>,
    mean: Vec<f32>,
    rstd: Vec<f32>,
    /// One head's values before its QK-norm (the norm writes into the row).
    head: Vec<f32>,
    /// cos and sin of each row's rotation angles (head_dim / 2 each).
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Buffers {
    fn size(&mut self, rows: usize, d: &Dims, max_len: usize) {
        let fit = |v: &mut Vec<f32>, n: usize| v.resize(n, 0.0);
        fit(&mut self.x, rows * d.c);
        fit(&mut self.h, rows * d.c);
        fit(&mut self.qkv, rows * d.qkv());
        fit(&mut self.y, rows * d.q());
        fit(&mut self.f, rows * d.fc_out());
        fit(&mut self.g, rows * d.hidden * usize::from(d.mlp.gated()));
        fit(&mut self.p, max_len);
        fit(&mut self.mean, rows);
        fit(&mut self.rstd, rows);
        fit(&mut self.head, d.head_dim);
        fit(&mut self.cos, rows * d.head_dim / 2);
        fit(&mut self.sin, rows * d.head_dim / 2);
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

/// One block's layers as the step reads them.
struct Block<'a> {
    ln1: HostNorm<'a>,
    qkv: Proj<'a>,
    /// Per-head RMSNorm weights of queries and keys (QK-norm models).
    qk_norm: Option<(HostF32<'a>, HostF32<'a>)>,
    proj: Proj<'a>,
    ln2: HostNorm<'a>,
    fc: Proj<'a>,
    fc2: Proj<'a>,
}

/// The output head: the token table (tied) or its own projection.
enum Head<'a> {
    Tied,
    Own(Proj<'a>),
}

/// The shapes a step works with (one model's, every block alike).
struct Dims {
    c: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// The MLP's inner width (per branch for SwiGLU).
    hidden: usize,
    mlp: MlpKind,
    vocab: usize,
    n_pos: usize,
    /// QK-norm's eps (the block's norm eps).
    eps: f32,
}

impl Dims {
    fn q(&self) -> usize {
        self.heads * self.head_dim
    }
    fn kv(&self) -> usize {
        self.kv_heads * self.head_dim
    }
    fn qkv(&self) -> usize {
        self.q() + 2 * self.kv()
    }
    fn fc_out(&self) -> usize {
        self.mlp.fc_rows(self.hidden)
    }
}

/// A decoder's weights as the step reads them (the storages' read locks held for one step).
pub(crate) struct HostModel<'a> {
    wte: Table<'a>,
    /// The learned position table (GPT-2); None with rotary positions.
    wpe: Option<Table<'a>>,
    blocks: Vec<Block<'a>>,
    ln_f: HostNorm<'a>,
    head: Head<'a>,
    /// Rotary positions' inverse frequencies (one per pair of a head), as the block's
    /// `Rope` computes them.
    inv_freq: Option<Vec<f64>>,
    dims: Dims,
    isa: Isa,
}

/// What of a decoder the host step reads, borrowed from the model (`Decoder::host_model` fills
/// it): the modules and the sizes the blocks do not carry.
pub(crate) struct DecoderParts<'a> {
    pub wte: &'a Embedding,
    pub wpe: Option<&'a Embedding>,
    pub blocks: &'a [Arc<TransformerBlock>],
    pub ln_f: &'a Norm,
    pub lm_head: Option<&'a Linear>,
    pub mlp: MlpKind,
    pub sliding_window: bool,
    pub c: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub n_pos: usize,
    pub eps: f32,
}

impl<'a> HostModel<'a> {
    /// The host step's view of a decoder, or None when the tensor path must run (see the
    /// module comment).
    pub(crate) fn of(p: DecoderParts<'a>) -> Option<HostModel<'a>> {
        // Kernels exist for these MLPs; a sliding window is the tensor path's.
        if !matches!(p.mlp, MlpKind::Gelu | MlpKind::SwiGlu) || p.sliding_window {
            return None;
        }
        let blocks = (p.blocks.iter())
            .map(|b| {
                let qk_norm = match (&b.attn.q_norm, &b.attn.k_norm) {
                    (Some(q), Some(k)) => Some((host(&q.weight)?, host(&k.weight)?)),
                    _ => None,
                };
                Some(Block {
                    ln1: HostNorm::of(&b.ln1)?,
                    qkv: Proj::of(&b.attn.qkv)?,
                    qk_norm,
                    proj: Proj::of(&b.attn.proj)?,
                    ln2: HostNorm::of(&b.ln2)?,
                    fc: Proj::of(&b.mlp.fc)?,
                    fc2: Proj::of(&b.mlp.proj)?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let wpe = match p.wpe {
            Some(e) => Some(Table::of(e)?),
            None => None,
        };
        let head = match p.lm_head {
            Some(l) => Head::Own(Proj::of(l)?),
            None => Head::Tied,
        };
        let first = p.blocks.first()?;
        let inv_freq = (first.attn.rope.as_ref()).map(|r| r.config.inv_freq(p.head_dim));
        Some(HostModel {
            wte: Table::of(p.wte)?,
            wpe,
            blocks,
            ln_f: HostNorm::of(p.ln_f)?,
            head,
            inv_freq,
            dims: Dims {
                c: p.c,
                heads: p.heads,
                kv_heads: p.kv_heads,
                head_dim: p.head_dim,
                hidden: first.mlp.proj.in_features(),
                mlp: first.mlp.kind,
                vocab: p.vocab,
                n_pos: p.n_pos,
                eps: p.eps,
            },
            isa: Isa::get(),
        })
    }
}

impl Scratch {
    /// Packs `m`'s f32 projection and head weights for the GEMMs (`PackedWeights`); later
    /// steps use the packs while they match the model.
    pub(crate) fn pack(&mut self, m: &HostModel) -> Result<()> {
        self.packed = Some(PackedWeights::of(m)?);
        Ok(())
    }
}

/// Whether a cache's buffers can be written by the host step: f32 on the CPU, contiguous,
/// [1, kv_heads, capacity, head_dim], keys and values in different storages.
pub(crate) fn host_cache(cache: &KvCache, kv_heads: usize, head_dim: usize) -> bool {
    cache.layers.iter().all(|l| {
        let s = l.k.shape();
        [&l.k, &l.v]
            .iter()
            .all(|t| t.device() == Device::Cpu && t.dtype() == DType::F32 && t.is_contiguous())
            && s.len() == 4
            && s[0] == 1
            && s[1] == kv_heads
            && s[3] == head_dim
            && l.v.shape() == s
            && !l.k.shares_storage_with(&l.v)
    })
}

impl HostModel<'_> {
    /// The f32 weights that `PackedWeights` packs, in a fixed order.
    fn f32_weights(&self) -> impl Iterator<Item = Fingerprint> + '_ {
        let projs = (self.blocks.iter())
            .flat_map(|b| [&b.qkv, &b.proj, &b.fc, &b.fc2])
            .filter_map(Proj::print);
        let head = match &self.head {
            Head::Tied => self.wte.print(),
            Head::Own(p) => p.print(),
        };
        projs.chain(head)
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
            let mut whole = || self.part(rows, caches, logit_rows, a, packed, Role::Whole);
            if rayon::current_thread_index().is_some() {
                return whole();
            }
            // Run on a pool thread, which then takes part in each product's parallel split:
            // from outside the pool, every product (~150 per decode step) would put this
            // thread to sleep and wake it again (not measured apart: with two chains in the
            // dot kernels, SmolLM2 Q4_1 tg went 45 → 62 tok/s on 2 Zen 1 cores).
            return rayon::scope(|_| whole());
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
        let (r, isa, d) = (rows.len(), self.isa, &self.dims);
        // A split step already keeps both cores busy; a whole one lends them to the products
        // of large weights.
        let threads = match role {
            Role::Whole => rayon::current_num_threads(),
            _ => 1,
        };
        let max_len = rows.iter().map(|w| w.pos + 1).max().unwrap_or(1);
        s.size(r, d, max_len);
        self.embed(rows, &mut s.x)?;
        self.angles(rows, s);
        for (l, b) in self.blocks.iter().enumerate() {
            let [pq, pp, pf, pf2] = match packed {
                Some(p) => p.blocks[l].each_ref().map(Option::as_ref),
                None => [None; 4],
            };
            b.ln1.apply(isa, &s.x, r, &mut s.h, &mut stats!(s));
            b.qkv.apply(
                isa,
                &s.h,
                r,
                &mut s.qkv,
                Activation::None,
                false,
                pq,
                threads,
            )?;
            self.position_heads(b, r, s);
            if let Role::Second(progress) = role {
                progress.wait_for(l);
            }
            self.attention(l, rows, caches, &s.qkv, &mut s.y, &mut s.p)?;
            if let Role::First(progress) = role {
                progress.0.store(l + 1, Ordering::Release);
            }
            b.proj
                .apply(isa, &s.y, r, &mut s.x, Activation::None, true, pp, threads)?;
            b.ln2.apply(isa, &s.x, r, &mut s.h, &mut stats!(s));
            match d.mlp {
                MlpKind::Gelu => {
                    let act = Activation::GeluTanh;
                    b.fc.apply(isa, &s.h, r, &mut s.f, act, false, pf, threads)?;
                    b.fc2
                        .apply(isa, &s.f, r, &mut s.x, Activation::None, true, pf2, threads)?;
                }
                MlpKind::SwiGlu => {
                    let act = Activation::None;
                    b.fc.apply(isa, &s.h, r, &mut s.f, act, false, pf, threads)?;
                    let n = d.hidden;
                    for (gu, g) in s.f.chunks_exact(2 * n).zip(s.g.chunks_exact_mut(n)).take(r) {
                        swiglu_isa(isa, &gu[..n], &gu[n..], g);
                    }
                    b.fc2
                        .apply(isa, &s.g, r, &mut s.x, act, true, pf2, threads)?;
                }
                kind => bail!("host step: no kernel for the {kind:?} MLP (host_model refuses it)"),
            }
        }
        let head = packed.and_then(|p| p.head.as_ref());
        self.head(logit_rows, s, head, threads)
    }

    /// x[i] = wte[token] (+ wpe[pos]) per row.
    fn embed(&self, rows: &[StepRow], x: &mut [f32]) -> Result<()> {
        let (c, n_pos, vocab) = (self.dims.c, self.dims.n_pos, self.dims.vocab);
        let mut tokens = Vec::with_capacity(rows.len());
        for w in rows {
            match usize::try_from(w.token).ok().filter(|&t| t < vocab) {
                Some(t) => tokens.push(t),
                None => bail!(
                    "gpt: token {} is outside the vocabulary of {vocab}",
                    w.token
                ),
            }
            if w.pos >= n_pos {
                bail!("gpt: position {} is beyond the context of {n_pos}", w.pos);
            }
        }
        let x = &mut x[..rows.len() * c];
        self.wte.rows(&tokens, c, false, x)?;
        if let Some(wpe) = &self.wpe {
            let positions: Vec<usize> = rows.iter().map(|w| w.pos).collect();
            wpe.rows(&positions, c, true, x)?;
        }
        Ok(())
    }

    /// Each row's rotation: cos and sin of pos·θᵢ, computed in f64 and rounded to f32 as
    /// the block's `Rope` tables are.
    fn angles(&self, rows: &[StepRow], s: &mut Buffers) {
        let Some(inv_freq) = &self.inv_freq else {
            return;
        };
        let half = inv_freq.len();
        let (cos, sin) = (s.cos.chunks_exact_mut(half), s.sin.chunks_exact_mut(half));
        for ((w, cr), sr) in rows.iter().zip(cos).zip(sin) {
            for ((f, c), s) in inv_freq.iter().zip(cr).zip(sr) {
                let (sv, cv) = (w.pos as f64 * f).sin_cos();
                (*c, *s) = (cv as f32, sv as f32);
            }
        }
    }

    /// QK-norm and rotation of each row's query and key heads, in place in `s.qkv`, in the
    /// block's order (norm, then rotation).
    fn position_heads(&self, b: &Block, rows: usize, s: &mut Buffers) {
        let d = &self.dims;
        let (hd, q_heads) = (d.head_dim, d.heads);
        let qk_heads = d.heads + d.kv_heads;
        for r in 0..rows {
            let row = &mut s.qkv[r * d.qkv()..][..qk_heads * hd];
            for (i, head) in row.chunks_exact_mut(hd).enumerate() {
                if let Some((qn, kn)) = &b.qk_norm {
                    let w = if i < q_heads { qn } else { kn };
                    s.head.copy_from_slice(head);
                    rms_norm_rows(self.isa, &s.head, w, d.eps, head);
                }
                if self.inv_freq.is_some() {
                    let half = hd / 2;
                    let (cos, sin) = (&s.cos[r * half..][..half], &s.sin[r * half..][..half]);
                    rotate(head, cos, sin);
                }
            }
        }
    }

    /// Layer `l`'s attention: each row's keys and values into its cache at its position,
    /// then each row's query heads against its cache up to that position (query head i reads
    /// kv head i / (heads / kv_heads), as the block's `repeat_kv` shares them); y [rows, q].
    fn attention(
        &self,
        l: usize,
        rows: &[StepRow],
        caches: &[&mut KvCache],
        qkv: &[f32],
        y: &mut [f32],
        p: &mut [f32],
    ) -> Result<()> {
        let d = &self.dims;
        let (hd, q, kv, width) = (d.head_dim, d.q(), d.kv(), d.qkv());
        let group = d.heads / d.kv_heads;
        let scale = 1.0 / (hd as f32).sqrt();
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
                let row = &qkv[r * width..(r + 1) * width];
                for head in 0..d.kv_heads {
                    let at = (head * cap + w.pos) * hd;
                    let (k, v) = (q + head * hd, q + kv + head * hd);
                    kc[at..at + hd].copy_from_slice(&row[k..k + hd]);
                    vc[at..at + hd].copy_from_slice(&row[v..v + hd]);
                }
            }
            for (r, w) in rows.iter().enumerate().take(j).skip(i) {
                let qr = &qkv[r * width..r * width + q];
                for head in 0..d.heads {
                    let base = head / group * cap * hd;
                    let cache = CachedHead {
                        k: &kc[base..base + cap * hd],
                        v: &vc[base..base + cap * hd],
                        n: w.pos + 1,
                        stride: hd,
                    };
                    let o = &mut y[r * q + head * hd..r * q + (head + 1) * hd];
                    attend_row(
                        self.isa,
                        &qr[head * hd..(head + 1) * hd],
                        cache,
                        scale,
                        p,
                        o,
                    );
                }
            }
            i = j;
        }
        Ok(())
    }

    /// The final norm and the head on the listed rows of x.
    fn head(
        &self,
        rows: &[usize],
        s: &mut Buffers,
        packed: Option<&PackedB>,
        threads: usize,
    ) -> Result<Vec<f32>> {
        let (c, n, vocab) = (self.dims.c, rows.len(), self.dims.vocab);
        let mut logits = vec![0f32; n * vocab];
        if n == 0 {
            return Ok(logits);
        }
        let mut picked = Vec::with_capacity(n * c);
        for &r in rows {
            picked.extend_from_slice(&s.x[r * c..(r + 1) * c]);
        }
        self.ln_f
            .apply(self.isa, &picked, n, &mut s.h, &mut stats!(s));
        let (isa, h) = (self.isa, &s.h[..n * c]);
        match &self.head {
            Head::Tied => (self.wte).head(isa, h, (n, c, vocab), packed, threads, &mut logits)?,
            Head::Own(p) => {
                let act = Activation::None;
                p.apply(isa, h, n, &mut logits, act, false, packed, threads)?
            }
        }
        Ok(logits)
    }
}

/// Rotates one head in place by the angles whose cos and sin are given (one per pair):
/// x·cos + rotate_half(x)·sin with rotate_half(x) = (−x₂, x₁), operation for operation as
/// the block's `Rope::apply`.
fn rotate(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    let (x1, x2) = x.split_at_mut(half);
    for (((a, b), &c), &s) in x1.iter_mut().zip(x2.iter_mut()).zip(cos).zip(sin) {
        let (u, v) = (*a, *b);
        *a = u * c + -v * s;
        *b = v * c + u * s;
    }
}
