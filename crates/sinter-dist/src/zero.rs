//! ZeRO stages 1 and 2 (Rajbhandari et al., 2020): the optimizer state — and with stage 2
//! the gradients — are sharded across the data-parallel ranks.
//!
//! The parameters are laid out in one flat f32 buffer of padded gradient buckets
//! ([`FlatLayout`]); rank `r` owns chunk `r` of every bucket. Each step:
//!
//! 1. gradients are reduce-scattered (average) bucket by bucket, so each rank receives the
//!    averaged gradient of its own chunks only — during backward if the caller uses
//!    [`ZeroOptimizer::backward`] (buckets are submitted from the backward hook as they
//!    complete), otherwise from the parameters' `grad()` at the start of [`Optimizer::step`];
//! 2. optionally the global gradient norm is clipped (one all-reduce of a scalar);
//! 3. this rank steps its shard with the optimizer kernels every optimizer uses
//!    (`sinter_core::kernels::optimizer`: [`adamw_step_many`], the multi-tensor AdamW — on CUDA
//!    one launch per 32 pieces —, and `Tensor::sgd_step`), on the parameters' own device, each
//!    piece with its parameter group's learning rate and weight decay
//!    ([`sinter_nn::ParamGroup`]; `new` uses the default grouping [`sinter_nn::decay_groups`],
//!    as [`sinter_nn::AdamW::new`] and [`sinter_nn::Sgd::new`] do);
//! 4. the updated chunks are all-gathered and written back into every rank's parameters.
//!
//! The shard lives on the parameters' device (issue 26 item 3: ZeRO through the seam): the
//! reduced gradients, the optimizer state (one tensor per piece of a parameter in this rank's
//! shard) and the update. The parameters are fp32, so they double as the master weights: a
//! piece is stepped in place as a view of its parameter. The communicators exchange host
//! buffers, so each bucket's chunk crosses to the host and back once per collective.
//!
//! Stage 1 keeps an unpartitioned (full, local) gradient buffer, into which the reduced chunk
//! is written; stage 2 keeps only the reduced shard, and the per-parameter gradients are
//! released inside the backward hook as soon as they are copied into their bucket.
//!
//! [`ZeroOptimizer`] implements [`Optimizer`]: `state()` all-gathers the shards and returns
//! the *full* state under the names `AdamW`/`Sgd` use (`<param>.exp_avg`, `.exp_avg_sq`,
//! `.momentum_buffer`), and `load_state` cuts this rank's shard out of full tensors, so a
//! checkpoint written by any world size (or by the plain optimizers) loads into any other.
//! `state()` is a collective: every rank must call it.

use std::collections::HashMap;

use sinter_core::fused::global_grad_norm;
use sinter_core::kernels::optimizer::{adamw_step_many, AdamWSlot};
use sinter_core::{bail, no_grad, AdamWParams, DType, Device, Result, SgdParams, Tensor, TensorId};
use sinter_nn::{decay_groups, Optimizer, ParamGroup, ParamSettings};

use crate::checkpoint_layout::{to_tensors, FlatLayout, Piece};
use crate::comm::ReduceOp;
use crate::data_parallel::{
    backward_into, broadcast_tensors, dist_err, index_params, wait, BucketOp, BucketPass,
    PassResult, SharedComm, StepTrace,
};
use crate::scaling::zero_bytes_per_rank;

/// The update rule run on each shard. Its `weight_decay` is for parameter groups that name
/// none (as the plain optimizers' `weight_decay` argument).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ShardedAlgo {
    /// As [`sinter_nn::AdamW`].
    AdamW {
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    },
    /// As [`sinter_nn::Sgd`] (a momentum buffer only when `momentum > 0`).
    Sgd {
        momentum: f64,
        nesterov: bool,
        weight_decay: f64,
    },
}

impl ShardedAlgo {
    /// AdamW with `sinter_nn::AdamW`'s defaults (β = 0.9, 0.999, ε = 1e-8).
    pub fn adamw(weight_decay: f64) -> Self {
        ShardedAlgo::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
        }
    }

    /// The weight decay of groups that name none.
    pub fn weight_decay(&self) -> f64 {
        match *self {
            ShardedAlgo::AdamW { weight_decay, .. } | ShardedAlgo::Sgd { weight_decay, .. } => {
                weight_decay
            }
        }
    }
}

/// Settings of a [`ZeroOptimizer`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ZeroOptions {
    /// 1 (optimizer state sharded) or 2 (gradients too).
    pub stage: u8,
    /// Gradient bucket size in bytes.
    pub bucket_bytes: usize,
    /// Clip the global gradient norm to this value inside `step` (the parameters' own
    /// gradients are not complete under ZeRO, so `clip_grad_norm` cannot be used).
    pub grad_clip: Option<f64>,
}

/// Bytes per rank of the model states, as allocated by this implementation and as the
/// ZeRO paper counts them for mixed-precision Adam.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ZeroMemory {
    pub stage: u8,
    pub world_size: usize,
    /// Ψ: number of parameter elements.
    pub params: usize,
    /// Replicated fp32 parameters: 4Ψ.
    pub param_bytes: usize,
    /// Persistent gradient storage: stage 1 the full (padded) flat buffer, stage 2 the shard.
    pub grad_bytes: usize,
    /// Optimizer state shards (AdamW: exp_avg + exp_avg_sq; SGD: momentum buffer).
    pub optimizer_bytes: usize,
    /// `param_bytes + grad_bytes + optimizer_bytes`.
    pub total_bytes: usize,
    /// Largest amount of gradient data in flight (transient bucket copies) during the last
    /// synchronisation.
    pub peak_in_flight_bytes: usize,
    /// The same element counts priced as mixed-precision Adam: 2 bytes per parameter and per
    /// stored gradient element, 12 bytes (fp32 master + m + v) per optimizer-shard element.
    pub mixed_precision_bytes: f64,
    /// [`zero_bytes_per_rank`]`(Ψ, stage, N)`: 4Ψ + 12Ψ/N (stage 1), 2Ψ + 14Ψ/N (stage 2).
    pub formula_bytes: f64,
}

/// A sharded optimizer for one data-parallel rank. See the module documentation.
pub struct ZeroOptimizer {
    comm: SharedComm,
    params: Vec<(String, Tensor)>,
    /// Each parameter's group settings (learning-rate factor, weight decay).
    settings: Vec<ParamSettings>,
    index: HashMap<TensorId, usize>,
    layout: FlatLayout,
    stage: u8,
    algo: ShardedAlgo,
    lr: f64,
    steps: u64,
    rank: usize,
    /// The parameters' device, where the shard lives.
    device: Device,
    /// This rank's pieces in shard order, each with its bucket.
    pieces: Vec<(usize, Piece)>,
    /// Per piece: AdamW exp_avg or SGD momentum buffer (empty for plain SGD).
    state_a: Vec<Tensor>,
    /// Per piece: AdamW exp_avg_sq (empty for SGD).
    state_b: Vec<Tensor>,
    /// Stage 1: the local flat gradient buffer, per bucket (padded); the owned chunk holds
    /// the reduced gradient once `ready`.
    grad_full: Vec<Tensor>,
    /// Stage 2: the reduced gradient shard.
    grad_shard: Option<Tensor>,
    /// Set when gradients have been reduced: which parameters have one.
    ready: Option<Vec<bool>>,
    pub grad_clip: Option<f64>,
    last_grad_norm: Option<f64>,
    trace: StepTrace,
    collectives: u64,
}

impl ZeroOptimizer {
    /// Shards the optimizer over the ranks of `comm`, with the default parameter grouping
    /// ([`decay_groups`]). Broadcasts the parameters from rank 0 first, so the replicas start
    /// identical. Every rank calls it with the same parameters.
    pub fn new(
        comm: SharedComm,
        params: Vec<(String, Tensor)>,
        lr: f64,
        algo: ShardedAlgo,
        opts: ZeroOptions,
    ) -> Result<Self> {
        let groups = decay_groups(params, algo.weight_decay());
        ZeroOptimizer::with_groups(comm, groups, lr, algo, opts)
    }

    /// As [`ZeroOptimizer::new`] over parameter groups (each with its own learning rate and
    /// weight decay), stepping exactly as the plain optimizer `with_groups` does.
    pub fn with_groups(
        comm: SharedComm,
        groups: Vec<ParamGroup>,
        lr: f64,
        algo: ShardedAlgo,
        opts: ZeroOptions,
    ) -> Result<Self> {
        if !(opts.stage == 1 || opts.stage == 2) {
            bail!("ZeRO stage must be 1 or 2, got {}", opts.stage);
        }
        if let ShardedAlgo::Sgd {
            momentum,
            nesterov: true,
            ..
        } = algo
        {
            if momentum <= 0.0 {
                bail!("SGD: Nesterov momentum needs momentum > 0");
            }
        }
        let grouped = ParamGroup::flatten(groups, lr, algo.weight_decay())?;
        let device = grouped
            .params
            .first()
            .map_or(Device::Cpu, |(_, t)| t.device());
        for (n, t) in &grouped.params {
            if t.dtype() != DType::F32 {
                bail!("ZeRO keeps f32 parameters; {n} is {}", t.dtype());
            }
            if t.device() != device {
                bail!(
                    "ZeRO steps one device's parameters; {n} is on {} but the first is on {device}: move the model to one device first",
                    t.device()
                );
            }
            if !t.is_contiguous() {
                bail!("ZeRO updates parameters in place; {n} is not contiguous");
            }
        }
        // `flatten` lists each parameter once, so the index keeps their order and settings.
        let (params, index) = index_params(&grouped.params);
        let settings = grouped.settings;
        let world = comm.world_size();
        let rank = comm.rank();
        let layout =
            FlatLayout::from_params(&params, opts.bucket_bytes, world).map_err(dist_err)?;
        let tensors: Vec<Tensor> = params.iter().map(|(_, t)| t.clone()).collect();
        broadcast_tensors(&comm, &tensors, 0)?;
        let mut pieces = Vec::new();
        let mut b = 0;
        for piece in layout.shard_pieces(rank) {
            while piece.in_shard.start >= layout.shard_offset(b) + layout.chunk_len(b) {
                b += 1;
            }
            pieces.push((b, piece));
        }
        let zeros = |n: usize| Tensor::zeros(&[n], DType::F32, device);
        let per_piece = || -> Result<Vec<Tensor>> {
            pieces
                .iter()
                .map(|(_, p)| zeros(p.in_shard.len()))
                .collect()
        };
        let (state_a, state_b) = match algo {
            ShardedAlgo::AdamW { .. } => (per_piece()?, per_piece()?),
            ShardedAlgo::Sgd { momentum, .. } if momentum > 0.0 => (per_piece()?, Vec::new()),
            ShardedAlgo::Sgd { .. } => (Vec::new(), Vec::new()),
        };
        let grad_full = if opts.stage == 1 {
            let padded = layout.buckets.iter().map(|b| zeros(b.padded));
            padded.collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        let grad_shard = if opts.stage == 2 {
            Some(zeros(layout.shard_len())?)
        } else {
            None
        };
        Ok(ZeroOptimizer {
            collectives: u64::from(world > 1),
            comm,
            params,
            settings,
            index,
            layout,
            stage: opts.stage,
            algo,
            lr,
            steps: 0,
            rank,
            device,
            pieces,
            state_a,
            state_b,
            grad_full,
            grad_shard,
            ready: None,
            grad_clip: opts.grad_clip,
            last_grad_norm: None,
            trace: StepTrace::default(),
        })
    }

    pub fn stage(&self) -> u8 {
        self.stage
    }
    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn world_size(&self) -> usize {
        self.layout.world_size
    }
    pub fn layout(&self) -> &FlatLayout {
        &self.layout
    }
    pub fn comm(&self) -> &SharedComm {
        &self.comm
    }
    /// Trace of the last gradient synchronisation.
    pub fn last_trace(&self) -> &StepTrace {
        &self.trace
    }
    /// Collectives submitted so far (the initial broadcast included).
    pub fn collectives_submitted(&self) -> u64 {
        self.collectives
    }
    /// Global gradient norm before clipping, of the last step that clipped.
    pub fn last_grad_norm(&self) -> Option<f64> {
        self.last_grad_norm
    }

    /// Backward of this rank's loss with the gradient reduce-scatter overlapped: buckets are
    /// submitted from the backward hook as they complete, and the per-parameter gradients are
    /// released once copied. With `sync == false` it only accumulates locally (no
    /// communication), for the accumulating micro-steps of gradient accumulation.
    pub fn backward_with(&mut self, loss: &Tensor, sync: bool) -> Result<()> {
        if !sync {
            loss.backward()?;
            self.trace = StepTrace {
                synced: false,
                ..Default::default()
            };
            return Ok(());
        }
        let mut pass = BucketPass::new(
            &self.layout,
            &self.params,
            &self.comm,
            BucketOp::ReduceScatter,
            self.stage == 1,
        );
        backward_into(loss, &self.index, &mut pass, true)?;
        let r = pass.wait_all()?;
        self.collect(r)
    }

    /// `backward_with(loss, true)`.
    pub fn backward(&mut self, loss: &Tensor) -> Result<()> {
        self.backward_with(loss, true)
    }

    fn reduce_from_grads(&mut self) -> Result<()> {
        let mut pass = BucketPass::new(
            &self.layout,
            &self.params,
            &self.comm,
            BucketOp::ReduceScatter,
            self.stage == 1,
        );
        pass.finish_backward(true)?;
        let r = pass.wait_all()?;
        self.collect(r)
    }

    fn collect(&mut self, r: PassResult) -> Result<()> {
        let PassResult {
            out: chunks,
            kept,
            got,
            trace,
            collectives: n,
        } = r;
        self.collectives += n;
        if self.stage == 1 {
            for (b, (chunk, local)) in chunks.into_iter().zip(kept).enumerate() {
                let mut full = local.expect("stage 1 keeps the local buckets");
                full[self.layout.chunk_range(b, self.rank)].copy_from_slice(&chunk);
                self.grad_full[b] =
                    Tensor::from_vec(full, &[self.layout.buckets[b].padded], self.device)?;
            }
        } else {
            // The chunks, in bucket order, are the shard.
            let shard: Vec<f32> = chunks.concat();
            self.grad_shard = Some(Tensor::from_vec(
                shard,
                &[self.layout.shard_len()],
                self.device,
            )?);
        }
        self.ready = Some(got);
        self.trace = trace;
        Ok(())
    }

    /// The reduced gradients this rank owns, on the device: stage 1 its chunk of each bucket,
    /// stage 2 the shard (padding is zero in both).
    fn own_grads(&self) -> Result<Vec<Tensor>> {
        match &self.grad_shard {
            Some(g) => Ok(vec![g.clone()]),
            None => (0..self.grad_full.len())
                .map(|b| {
                    let r = self.layout.chunk_range(b, self.rank);
                    self.grad_full[b].narrow(0, r.start, r.len())
                })
                .collect(),
        }
    }

    /// The reduced gradient of `piece` (in bucket `b`), a view on the device.
    fn piece_grad(&self, b: usize, piece: &Piece) -> Result<Tensor> {
        let len = piece.in_shard.len();
        match &self.grad_shard {
            Some(g) => g.narrow(0, piece.in_shard.start, len),
            None => {
                let start = self.layout.chunk_range(b, self.rank).start + piece.in_shard.start
                    - self.layout.shard_offset(b);
                self.grad_full[b].narrow(0, start, len)
            }
        }
    }

    /// Multiplies this rank's reduced gradients by `factor` in place.
    fn scale_grads(&self, factor: f32) -> Result<()> {
        for g in self.own_grads()? {
            g.assign(&g.mul_scalar(factor)?)?;
        }
        Ok(())
    }

    /// The view of `piece` in its parameter (what the update writes in place).
    fn piece_param(&self, piece: &Piece) -> Result<Tensor> {
        let t = &self.params[piece.param].1;
        t.reshape(&[t.numel()])?
            .narrow(0, piece.in_param.start, piece.in_param.len())
    }

    fn clip(&mut self, max_norm: f64) -> Result<()> {
        // One deterministic pass on the device (f64 accumulation), read back as one value.
        let local = global_grad_norm(&self.own_grads()?).powi(2);
        // The f64 partial sum travels as two f32 (high and low part).
        let hi = local as f32;
        let lo = (local - hi as f64) as f32;
        self.collectives += 1;
        let total = wait(self.comm.all_reduce(vec![hi, lo], ReduceOp::Sum))?;
        let norm = (total[0] as f64 + total[1] as f64).max(0.0).sqrt();
        self.last_grad_norm = Some(norm);
        if norm.is_finite() && norm > max_norm {
            self.scale_grads((max_norm / (norm + 1e-6)) as f32)?;
        }
        Ok(())
    }

    /// fp16 dynamic loss scaling under ZeRO: divides this rank's reduced gradient shard by
    /// `scale` and checks it for inf/NaN. Each rank holds only its shard, so the overflow flag
    /// is all-reduced: every rank gets the same verdict, and all skip the step (returning
    /// false) or all take it together. Call after the synchronising backward, before `step`;
    /// a collective.
    pub fn unscale_and_check(&mut self, scale: f64) -> Result<bool> {
        if self.ready.is_none() {
            self.reduce_from_grads()?;
        }
        let bad = !global_grad_norm(&self.own_grads()?).is_finite();
        self.scale_grads((1.0 / scale) as f32)?;
        self.collectives += 1;
        let flags = wait(
            self.comm
                .all_reduce(vec![f32::from(u8::from(bad))], ReduceOp::Sum),
        )?;
        let ok = flags[0] == 0.0;
        if !ok {
            // The step is skipped: drop the reduced gradients so the next backward starts clean.
            self.ready = None;
        }
        Ok(ok)
    }

    /// Pieces that get an update this step (their parameter has a gradient), with their
    /// index, parameter view and reduced gradient.
    fn stepped(&self, got: &[bool]) -> Result<Vec<(usize, Tensor, Tensor)>> {
        let mut out = Vec::new();
        for (i, (b, piece)) in self.pieces.iter().enumerate() {
            if got[piece.param] {
                out.push((i, self.piece_param(piece)?, self.piece_grad(*b, piece)?));
            }
        }
        Ok(out)
    }

    /// AdamW of every piece in one multi-tensor update (as `sinter_nn::AdamW`'s).
    fn adamw(&self, got: &[bool], h: AdamWParams) -> Result<()> {
        let stepped = self.stepped(got)?;
        let slots: Vec<AdamWSlot<'_>> = stepped
            .iter()
            .map(|(i, p, g)| {
                let set = self.settings[self.pieces[*i].1.param];
                AdamWSlot {
                    param: p,
                    grad: g,
                    m: &self.state_a[*i],
                    v: &self.state_b[*i],
                    weight_decay: set.weight_decay,
                    lr_scale: set.lr_scale,
                }
            })
            .collect();
        adamw_step_many(&slots, h, None)
    }

    /// SGD of every piece (as `sinter_nn::Sgd`'s).
    fn sgd(&self, got: &[bool], momentum: f64, nesterov: bool) -> Result<()> {
        for (i, p, g) in self.stepped(got)? {
            let set = self.settings[self.pieces[i].1.param];
            let h = SgdParams {
                lr: (self.lr * set.lr_scale) as f32,
                momentum: momentum as f32,
                nesterov,
                weight_decay: set.weight_decay as f32,
            };
            p.sgd_step(&g, self.state_a.get(i), h)?;
        }
        Ok(())
    }

    /// All-gathers the updated chunks (one collective per bucket, all submitted before the
    /// first wait) and writes them into every rank's parameters.
    fn gather_params(&self, got: &[bool]) -> Result<()> {
        let mut chunks: Vec<Vec<f32>> = (0..self.layout.buckets.len())
            .map(|b| vec![0.0; self.layout.chunk_len(b)])
            .collect();
        for (b, piece) in &self.pieces {
            let at = piece.in_shard.start - self.layout.shard_offset(*b);
            let v = self.piece_param(piece)?.to_vec_f32()?;
            chunks[*b][at..at + v.len()].copy_from_slice(&v);
        }
        let works: Vec<_> = chunks
            .into_iter()
            .map(|c| self.comm.all_gather(c))
            .collect();
        for (b, w) in works.into_iter().enumerate() {
            let full = wait(w)?;
            for &p in &self.layout.buckets[b].params {
                if !got[p] {
                    continue;
                }
                let s = &self.layout.slots[p];
                let t = &self.params[p].1;
                let v = &full[s.offset_in_bucket..s.offset_in_bucket + s.numel];
                t.assign(&Tensor::from_slice(v, &s.shape, self.device)?)?;
            }
        }
        Ok(())
    }

    fn names(&self) -> Vec<&'static str> {
        match self.algo {
            ShardedAlgo::AdamW { .. } => vec!["exp_avg", "exp_avg_sq"],
            ShardedAlgo::Sgd { momentum, .. } if momentum > 0.0 => vec!["momentum_buffer"],
            ShardedAlgo::Sgd { .. } => Vec::new(),
        }
    }

    /// The full (unsharded) optimizer state, gathered from all ranks. A collective.
    pub fn try_state(&self) -> Result<Vec<(String, Tensor)>> {
        let names = self.names();
        let mut per_kind: Vec<Vec<Tensor>> = Vec::new();
        for k in 0..names.len() {
            let state = if k == 0 { &self.state_a } else { &self.state_b };
            let mut shard = vec![0.0f32; self.layout.shard_len()];
            for ((_, piece), t) in self.pieces.iter().zip(state) {
                shard[piece.in_shard.clone()].copy_from_slice(&t.to_vec_f32()?);
            }
            let gathered = wait(self.comm.all_gather(shard))?;
            let full = self.layout.unshard(&gathered).map_err(dist_err)?;
            per_kind.push(to_tensors(&self.layout, full).map_err(dist_err)?);
        }
        let mut out = Vec::new();
        for (i, (n, _)) in self.params.iter().enumerate() {
            for (k, kind) in names.iter().enumerate() {
                out.push((format!("{n}.{kind}"), per_kind[k][i].clone()));
            }
        }
        Ok(out)
    }

    /// Bytes per rank of parameters, gradients and optimizer state (see [`ZeroMemory`]).
    pub fn memory(&self) -> ZeroMemory {
        let psi = self.layout.numel();
        let numel = |ts: &[Tensor]| ts.iter().map(Tensor::numel).sum::<usize>();
        let grad_elems = numel(&self.grad_full) + self.grad_shard.as_ref().map_or(0, Tensor::numel);
        let state_elems = numel(&self.state_a) + numel(&self.state_b);
        let shard = self.layout.shard_len();
        let n = self.world_size();
        ZeroMemory {
            stage: self.stage,
            world_size: n,
            params: psi,
            param_bytes: 4 * psi,
            grad_bytes: 4 * grad_elems,
            optimizer_bytes: 4 * state_elems,
            total_bytes: 4 * (psi + grad_elems + state_elems),
            peak_in_flight_bytes: 4 * self.trace.peak_in_flight,
            mixed_precision_bytes: 2.0 * psi as f64 + 2.0 * grad_elems as f64 + 12.0 * shard as f64,
            formula_bytes: zero_bytes_per_rank(psi as f64, self.stage, n),
        }
    }
}

impl Optimizer for ZeroOptimizer {
    fn step(&mut self) -> Result<()> {
        let _g = no_grad();
        if self.ready.is_none() {
            self.reduce_from_grads()?;
        }
        let got = self.ready.take().expect("reduced above");
        if let Some(c) = self.grad_clip {
            self.clip(c)?;
        }
        self.steps += 1;
        match self.algo {
            ShardedAlgo::AdamW {
                beta1, beta2, eps, ..
            } => {
                let h = AdamWParams {
                    lr: self.lr,
                    beta1,
                    beta2,
                    eps,
                    weight_decay: 0.0,
                    step: self.steps,
                };
                self.adamw(&got, h)?;
            }
            ShardedAlgo::Sgd {
                momentum, nesterov, ..
            } => self.sgd(&got, momentum, nesterov)?,
        }
        self.collectives += self.layout.buckets.len() as u64;
        self.gather_params(&got)
    }
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn steps(&self) -> u64 {
        self.steps
    }
    /// The full state, gathered from every rank: a collective, every rank must call it.
    /// Panics if the communication fails (use [`ZeroOptimizer::try_state`] to handle that).
    fn state(&self) -> Vec<(String, Tensor)> {
        self.try_state()
            .unwrap_or_else(|e| panic!("ZeRO: gathering the optimizer state failed: {e}"))
    }
    fn load_state(&mut self, steps: u64, tensors: &HashMap<String, Tensor>) -> Result<()> {
        let names = self.names();
        for (k, kind) in names.iter().enumerate() {
            let mut full: Vec<Vec<f32>> = Vec::with_capacity(self.params.len());
            for (n, p) in &self.params {
                let key = format!("{n}.{kind}");
                match tensors.get(&key) {
                    Some(t) if t.shape() == p.shape() => full.push(t.to_vec_f32()?),
                    Some(t) => bail!(
                        "optimizer state {key} has shape {:?} but its parameter needs {:?}",
                        t.shape(),
                        p.shape()
                    ),
                    None => bail!("optimizer state {key} is missing from the checkpoint"),
                }
            }
            let refs: Vec<&[f32]> = full.iter().map(Vec::as_slice).collect();
            let shard = self
                .layout
                .shard_from_full(self.rank, &refs)
                .map_err(dist_err)?;
            let pieces = self.pieces.iter().map(|(_, p)| {
                Tensor::from_slice(&shard[p.in_shard.clone()], &[p.in_shard.len()], self.device)
            });
            let pieces = pieces.collect::<Result<Vec<_>>>()?;
            if k == 0 {
                self.state_a = pieces;
            } else {
                self.state_b = pieces;
            }
        }
        self.steps = steps;
        Ok(())
    }
    fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }
    fn zero_grad(&self) {
        for (_, p) in &self.params {
            p.zero_grad();
        }
    }
}
