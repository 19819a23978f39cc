//! Tensor / pipeline parallelism combined with data parallelism on a 2-D device mesh.
//!
//! The world of `dp × tp × pp` ranks (one of `tp`, `pp` is 1) is split with
//! [`mesh_2d`](crate::mesh_2d): consecutive blocks of `tp` (or `pp`) ranks form the model-
//! parallel groups, and the ranks at the same position in each block form a data-parallel
//! group. Each data-parallel replica takes its slice of the global batch; after backward the
//! gradients are averaged across the data-parallel group with one all-reduce, then every rank
//! steps its optimizer over its own (sharded or staged) parameters.

use sinter_core::{bail, Result, Tensor};
use sinter_models::DecoderConfig;
use sinter_nn::Optimizer;

use super::{PipelineGpt, PipelineStats, Schedule};
use crate::comm::{mesh_2d, Communicator, ReduceOp};
use crate::tensor_parallel::{check_tp_config, comm_err, f32_tensor, Shard, TpGpt};

/// Builds an optimizer over a rank's local parameters (shards or stage, full-model names).
pub type MakeOptimizer = dyn Fn(Vec<(String, Tensor)>) -> Result<Box<dyn Optimizer>>;

/// How a GPT is spread over the ranks.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ParallelSpec {
    /// Data-parallel replicas.
    pub dp: usize,
    /// Tensor-parallel ranks per replica.
    pub tp: usize,
    /// Pipeline stages per replica.
    pub pp: usize,
    /// Micro-batches per step and replica (gradient accumulation; the pipeline's `m`).
    pub micro_batches: usize,
    /// Pipeline schedule (ignored without pipeline parallelism).
    pub schedule: Schedule,
}

impl Default for ParallelSpec {
    fn default() -> Self {
        ParallelSpec {
            dp: 1,
            tp: 1,
            pp: 1,
            micro_batches: 1,
            schedule: Schedule::OneFOneB,
        }
    }
}

impl ParallelSpec {
    /// Ranks needed: `dp · tp · pp`.
    pub fn world_size(&self) -> usize {
        self.dp * self.tp * self.pp
    }

    /// Checks the spec against a model and a world size.
    pub fn validate(&self, cfg: &DecoderConfig, world: usize) -> Result<()> {
        if self.dp == 0 || self.tp == 0 || self.pp == 0 || self.micro_batches == 0 {
            bail!(
                "parallel spec: dp, tp, pp and micro_batches must all be at least 1 (got {self:?})"
            );
        }
        if self.world_size() != world {
            bail!(
                "parallel spec: dp {} × tp {} × pp {} = {} ranks, but the world has {world}",
                self.dp,
                self.tp,
                self.pp,
                self.world_size()
            );
        }
        if self.tp > 1 && self.pp > 1 {
            bail!("parallel spec: tensor and pipeline parallelism together (3-D) are not supported yet; use tp = 1 or pp = 1");
        }
        check_tp_config(cfg, self.tp)?;
        super::partition_layers(cfg.n_layer, self.pp)?;
        Ok(())
    }
}

/// Averages the gradients of `params` (missing ones count as zeros) and the values `extra`
/// (e.g. the loss) across `comm` with one all-reduce: data parallelism's gradient sync.
pub fn all_reduce_grads(
    params: &[(String, Tensor)],
    comm: &mut dyn Communicator,
    extra: &mut [f32],
) -> Result<()> {
    if comm.world_size() == 1 {
        return Ok(());
    }
    let mut flat = Vec::new();
    for (_, p) in params {
        match p.grad() {
            Some(g) => flat.extend(g.to_vec_f32()?),
            None => flat.extend(std::iter::repeat_n(0f32, p.numel())),
        }
    }
    flat.extend_from_slice(extra);
    comm.all_reduce(&mut flat, ReduceOp::Avg)
        .map_err(comm_err)?;
    let mut off = 0;
    for (_, p) in params {
        let n = p.numel();
        p.set_grad(Some(f32_tensor(flat[off..off + n].to_vec(), p.shape())?));
        off += n;
    }
    extra.copy_from_slice(&flat[off..]);
    Ok(())
}

enum Engine {
    Tp(TpGpt),
    Pp(PipelineGpt),
}

/// One rank's share of data × tensor or data × pipeline parallel GPT training.
pub struct ParallelTrainer {
    pub spec: ParallelSpec,
    engine: Engine,
    dp: Box<dyn Communicator>,
    dp_rank: usize,
    optimizer: Box<dyn Optimizer>,
    last_stats: Option<PipelineStats>,
    grad_clip: Option<f64>,
    last_grad_norm: Option<f64>,
}

impl ParallelTrainer {
    /// Splits `comm` (the world, `spec.world_size()` ranks; every rank calls this) into the
    /// mesh, builds this rank's shard or stage of the model from the full weights `init`
    /// (standard names) and its optimizer with `make_optimizer(local parameters)`.
    pub fn new(
        cfg: &DecoderConfig,
        init: &[(String, Tensor)],
        spec: &ParallelSpec,
        comm: &mut dyn Communicator,
        make_optimizer: &MakeOptimizer,
    ) -> Result<Self> {
        spec.validate(cfg, comm.world_size())?;
        let inner = spec.tp * spec.pp;
        let mesh = mesh_2d(comm, inner).map_err(comm_err)?;
        let dp_rank = mesh.outer.rank();
        let engine = if spec.tp > 1 {
            Engine::Tp(TpGpt::from_named(cfg, init, mesh.inner)?)
        } else {
            Engine::Pp(PipelineGpt::from_named(
                cfg,
                init,
                mesh.inner,
                spec.schedule,
                spec.micro_batches,
            )?)
        };
        let params = match &engine {
            Engine::Tp(m) => sinter_nn::Module::parameters(m),
            Engine::Pp(m) => m.parameters(),
        };
        let optimizer = make_optimizer(params)?;
        Ok(ParallelTrainer {
            spec: spec.clone(),
            engine,
            dp: mesh.outer,
            dp_rank,
            optimizer,
            last_stats: None,
            grad_clip: None,
            last_grad_norm: None,
        })
    }

    /// This rank's parameters (shards or stage), under the full model's names.
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        match &self.engine {
            Engine::Tp(m) => sinter_nn::Module::parameters(m),
            Engine::Pp(m) => m.parameters(),
        }
    }

    /// The optimizer (e.g. to set the learning rate of the next step).
    pub fn optimizer_mut(&mut self) -> &mut dyn Optimizer {
        &mut *self.optimizer
    }

    /// Index of this rank's data-parallel replica.
    pub fn dp_rank(&self) -> usize {
        self.dp_rank
    }

    /// The pipeline statistics of the last step (pipeline engine only; also with `pp = 1`).
    pub fn pipeline_stats(&self) -> Option<&PipelineStats> {
        self.last_stats.as_ref()
    }

    /// One training step on the global batch `ids`, `targets` (`[b, t]`, the same on every
    /// rank; b divisible by `dp · micro_batches`): this replica's rows, forward and backward
    /// over the micro-batches, gradient average across replicas, optimizer step. Returns the
    /// mean loss over the global batch (the same on every rank).
    pub fn step(&mut self, ids: &Tensor, targets: &Tensor) -> Result<f32> {
        let (dp, m) = (self.spec.dp, self.spec.micro_batches);
        if ids.rank() != 2 || targets.shape() != ids.shape() {
            bail!(
                "parallel step: ids {:?} and targets {:?} must both be [batch, time]",
                ids.shape(),
                targets.shape()
            );
        }
        let b = ids.shape()[0];
        if !b.is_multiple_of(dp * m) {
            bail!("parallel step: batch of {b} sequences does not split into {dp} replicas × {m} micro-batches");
        }
        let rows = b / dp;
        let ids = ids.narrow(0, self.dp_rank * rows, rows)?.contiguous()?;
        let targets = targets.narrow(0, self.dp_rank * rows, rows)?.contiguous()?;
        self.optimizer.zero_grad();
        let loss = match &mut self.engine {
            Engine::Tp(model) => {
                let mb = rows / m;
                let mut total = 0f64;
                for k in 0..m {
                    let l =
                        model.loss(&ids.narrow(0, k * mb, mb)?, &targets.narrow(0, k * mb, mb)?)?;
                    total += l.to_scalar_f32()? as f64;
                    l.mul_scalar(1.0 / m as f32)?.backward()?;
                }
                (total / m as f64) as f32
            }
            Engine::Pp(model) => {
                let stats = model.forward_backward(&ids, &targets)?;
                let l = stats.loss;
                self.last_stats = Some(stats);
                l
            }
        };
        let params = self.parameters();
        let mut extra = [loss];
        all_reduce_grads(&params, &mut *self.dp, &mut extra)?;
        if let Some(max_norm) = self.grad_clip {
            self.last_grad_norm = Some(self.clip_grad_norm(max_norm)?);
        }
        self.optimizer.step()?;
        Ok(extra[0])
    }

    /// Clip the gradients to this global L2 norm before each update (`None`: no clipping).
    pub fn set_grad_clip(&mut self, max_norm: Option<f64>) {
        self.grad_clip = max_norm;
    }

    /// The global gradient norm of the last step (with clipping on).
    pub fn last_grad_norm(&self) -> Option<f64> {
        self.last_grad_norm
    }

    /// The L2 norm of the whole model's gradient: each rank sums the squares of what it owns
    /// (shards fully, replicated tensors on tensor-parallel rank 0 only, the tied `wte` on the
    /// first stage only), one all-reduce over the model-parallel group adds them up. The
    /// data-parallel replicas already agree (gradients were averaged). Scales every local
    /// gradient by `max_norm / (norm + 1e-6)` when the norm exceeds `max_norm`, exactly as
    /// the serial `clip_grad_norm`. Collective over the model-parallel group.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> Result<f64> {
        let params = self.parameters();
        let sumsq = |t: &Tensor| -> Result<f64> {
            Ok(match t.grad() {
                Some(g) => g
                    .to_vec_f32()?
                    .iter()
                    .map(|&x| (x as f64) * (x as f64))
                    .sum(),
                None => 0.0,
            })
        };
        let mut local = 0f64;
        let total = match &mut self.engine {
            Engine::Tp(m) => {
                let first = m.tp_rank() == 0;
                for (n, t) in &params {
                    if first || Shard::of(&m.config, n) != Shard::Replicated {
                        local += sumsq(t)?;
                    }
                }
                let mut v = [local as f32];
                crate::tensor_parallel::lock(m.comm())
                    .all_reduce(&mut v, ReduceOp::Sum)
                    .map_err(comm_err)?;
                v[0] as f64
            }
            Engine::Pp(m) => {
                for (n, t) in &params {
                    if m.owns(n) {
                        local += sumsq(t)?;
                    }
                }
                let mut v = [local as f32];
                let c = m.comm_mut();
                if c.world_size() > 1 {
                    c.all_reduce(&mut v, ReduceOp::Sum).map_err(comm_err)?;
                }
                v[0] as f64
            }
        };
        let norm = total.sqrt();
        if norm.is_finite() && norm > max_norm {
            let scale = (max_norm / (norm + 1e-6)) as f32;
            for (_, p) in &params {
                if let Some(g) = p.grad() {
                    p.set_grad(Some(g.mul_scalar(scale)?));
                }
            }
        }
        Ok(norm)
    }

    /// Names of the optimizer's per-parameter state (`exp_avg`, `momentum_buffer`, …).
    fn state_suffixes(&self) -> Vec<String> {
        let params = self.parameters();
        let Some((first, _)) = params.first() else {
            return Vec::new();
        };
        let prefix = format!("{first}.");
        self.optimizer
            .state()
            .into_iter()
            .filter_map(|(n, _)| n.strip_prefix(&prefix).map(str::to_string))
            .collect()
    }

    /// The optimizer state of the whole model, in the canonical layout every checkpoint uses
    /// (`{parameter}.{exp_avg|exp_avg_sq|momentum_buffer}`, full shapes), so any layout
    /// (tensor / pipeline / data parallel, one rank) can load it. Collective over the
    /// model-parallel group; every rank gets it.
    pub fn gather_optimizer_state(&mut self) -> Result<Vec<(String, Tensor)>> {
        let state: std::collections::HashMap<String, Tensor> =
            self.optimizer.state().into_iter().collect();
        let mut out = Vec::new();
        for suffix in self.state_suffixes() {
            let local = |name: &str, p: &Tensor| -> Result<Vec<f32>> {
                match state.get(&format!("{name}.{suffix}")) {
                    Some(t) => t.to_vec_f32(),
                    None => Ok(vec![0f32; p.numel()]),
                }
            };
            let full = match &mut self.engine {
                Engine::Tp(m) => m.gather_with(&local)?,
                Engine::Pp(m) => m.gather_with(&local)?,
            };
            out.extend(full.into_iter().map(|(n, t)| (format!("{n}.{suffix}"), t)));
        }
        Ok(out)
    }

    /// Loads the canonical full optimizer state (see [`Self::gather_optimizer_state`]; also
    /// what data-parallel / ZeRO / single-process checkpoints hold): each rank takes its
    /// shard or stage. `steps` is the optimizer's step count.
    pub fn load_optimizer_state(
        &mut self,
        steps: u64,
        full: &std::collections::HashMap<String, Tensor>,
    ) -> Result<()> {
        let mut local = std::collections::HashMap::new();
        for suffix in self.state_suffixes() {
            for (name, p) in self.parameters() {
                let key = format!("{name}.{suffix}");
                let t = full.get(&key).ok_or_else(|| {
                    sinter_core::Error::Msg(format!(
                        "the checkpoint has no optimizer state {key} (was it written with another optimizer?)"
                    ))
                })?;
                let v = t.to_vec_f32()?;
                let v = match &self.engine {
                    Engine::Tp(m) => m.shard_of_full(&name, &v)?,
                    Engine::Pp(_) => v,
                };
                if v.len() != p.numel() {
                    bail!(
                        "optimizer state {key} has {} values, the parameter here has {}",
                        v.len(),
                        p.numel()
                    );
                }
                local.insert(key, f32_tensor(v, p.shape())?);
            }
        }
        self.optimizer.load_state(steps, &local)
    }

    /// The full model's weights under the standard names, in `Decoder::parameters()` order
    /// (collective over the model-parallel group; every rank gets them).
    pub fn gather_weights(&mut self) -> Result<Vec<(String, Tensor)>> {
        match &mut self.engine {
            Engine::Tp(m) => m.gather_weights(),
            Engine::Pp(m) => m.gather_weights(),
        }
    }

    /// The full model's gradients of the last step (after the data-parallel average).
    pub fn gather_grads(&mut self) -> Result<Vec<(String, Tensor)>> {
        match &mut self.engine {
            Engine::Tp(m) => m.gather_grads(),
            Engine::Pp(m) => m.gather_grads(),
        }
    }
}

/// What [`train_gpt_parallel`] returns on each rank.
#[derive(Clone, Debug)]
pub struct ParallelReport {
    /// Mean loss over the global batch, per step.
    pub losses: Vec<f32>,
    /// The full weights after the last step, standard names, `Decoder::parameters()` order.
    pub weights: Vec<(String, Tensor)>,
    /// Pipeline statistics of the last step on this rank's stage (without tensor parallelism).
    pub pipeline: Option<PipelineStats>,
}

/// Trains a GPT with config `cfg` from the full weights `init` for one step per batch of
/// `batches` (global `(ids, targets)` pairs, the same on every rank) under `spec`, on the world
/// `comm`. Every rank calls it; each returns the same losses and gathered weights.
pub fn train_gpt_parallel(
    cfg: &DecoderConfig,
    init: &[(String, Tensor)],
    spec: &ParallelSpec,
    comm: &mut dyn Communicator,
    make_optimizer: &MakeOptimizer,
    batches: &[(Tensor, Tensor)],
) -> Result<ParallelReport> {
    let mut trainer = ParallelTrainer::new(cfg, init, spec, comm, make_optimizer)?;
    let mut losses = Vec::with_capacity(batches.len());
    for (ids, targets) in batches {
        losses.push(trainer.step(ids, targets)?);
    }
    let weights = trainer.gather_weights()?;
    Ok(ParallelReport {
        losses,
        weights,
        pipeline: trainer.last_stats.clone(),
    })
}
