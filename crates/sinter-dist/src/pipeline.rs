//! Pipeline parallelism for the GPT.
//!
//! The blocks are split into contiguous stages ([`partition_layers`]); stage 0 also holds the
//! embeddings, the last stage `ln_f`, the output head and the loss. The head is tied to `wte`:
//! the first and the last stage each hold a copy, and after backward the two copies' gradients
//! are summed over a two-rank group, so both take the same optimizer step and stay equal.
//!
//! A batch is cut into `m` micro-batches; activations travel forward and their gradients
//! backward between neighbouring stages with `send`/`recv`. Two schedules
//! ([`Schedule`]): **GPipe** runs all forwards, then all backwards (every stage keeps `m`
//! micro-batches of activations); **1F1B** runs `p − s − 1` warm-up forwards on stage `s`,
//! then alternates one forward and one backward, then drains the remaining backwards (at most
//! `p − s` micro-batches in flight). Both leave the bubble `(p − 1)/(m + p − 1)` of the
//! schedule idle ([`simulate_schedule`] counts it in steps; [`PipelineStats`] also reports
//! the wall-clock idle time measured on each stage). Gradients are averaged over the
//! micro-batches (each micro-batch loss is scaled by `1/m`), then the caller steps the
//! optimizer over the stage's [`PipelineGpt::parameters`].
//!
//! [`hybrid`] combines these with tensor parallelism and data parallelism on a device mesh.

pub mod hybrid;

pub use hybrid::{
    all_reduce_grads, train_gpt_parallel, MakeOptimizer, ParallelReport, ParallelSpec,
    ParallelTrainer,
};

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::time::{Duration, Instant};

use sinter_core::{bail, DType, Error, Result, Tensor};
use sinter_models::{Decoder, DecoderConfig};
use sinter_nn::module::{join, shared_rng, NamedTensor};
use sinter_nn::{Dropout, Embedding, Linear, Module, Norm, TransformerBlock};

use crate::comm::{Communicator, ReduceOp};
use crate::tensor_parallel::{
    block_param_specs, comm_err, f32_tensor, gpt_param_specs, WeightSource, IGNORE_INDEX,
};

// ---------------------------------------------------------------------------------------------
// Schedules
// ---------------------------------------------------------------------------------------------

/// Order in which a stage runs the forward and backward passes of its micro-batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Schedule {
    /// All forwards, then all backwards.
    GPipe,
    /// Warm-up forwards, then one forward / one backward alternately, then the cool-down
    /// backwards (PipeDream-flush, Megatron's default).
    OneFOneB,
}

impl std::str::FromStr for Schedule {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "gpipe" => Ok(Schedule::GPipe),
            "1f1b" | "one-f-one-b" | "onefoneb" => Ok(Schedule::OneFOneB),
            _ => Err(Error::Msg(format!(
                "unknown pipeline schedule '{s}'; valid: gpipe, 1f1b"
            ))),
        }
    }
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Schedule::GPipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
        })
    }
}

/// One step of a stage's schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Forward pass of micro-batch `k`.
    Forward(usize),
    /// Backward pass of micro-batch `k`.
    Backward(usize),
}

/// The actions stage `stage` of `stages` runs for `m` micro-batches, in order.
pub fn schedule_actions(schedule: Schedule, stage: usize, stages: usize, m: usize) -> Vec<Action> {
    let mut v = Vec::with_capacity(2 * m);
    match schedule {
        Schedule::GPipe => {
            v.extend((0..m).map(Action::Forward));
            v.extend((0..m).map(Action::Backward));
        }
        Schedule::OneFOneB => {
            let warm = (stages - stage - 1).min(m);
            v.extend((0..warm).map(Action::Forward));
            for i in 0..m - warm {
                v.push(Action::Forward(warm + i));
                v.push(Action::Backward(i));
            }
            v.extend((m - warm..m).map(Action::Backward));
        }
    }
    v
}

/// The idle fraction of a pipeline of `p` stages over `m` micro-batches: `(p − 1)/(m + p − 1)`.
pub fn theoretical_bubble(stages: usize, m: usize) -> f64 {
    if stages + m <= 1 {
        return 0.0;
    }
    (stages as f64 - 1.0) / (m as f64 + stages as f64 - 1.0)
}

/// A schedule played out with fixed durations per forward and backward.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleSim {
    /// Time from the first forward to the last backward.
    pub makespan: f64,
    /// Time each stage spends computing.
    pub busy: Vec<f64>,
    /// Idle fraction of each stage: `1 − busy/makespan`.
    pub bubble: Vec<f64>,
    /// Largest number of micro-batches whose activations each stage holds at once.
    pub max_in_flight: Vec<usize>,
}

/// Plays out `schedule` on `stages` stages and `m` micro-batches, a forward taking `t_fwd` and
/// a backward `t_bwd` time units, each action starting as soon as its stage is free and its
/// inputs (the activation from the previous stage, the gradient from the next) exist.
pub fn simulate_schedule(
    schedule: Schedule,
    stages: usize,
    m: usize,
    t_fwd: f64,
    t_bwd: f64,
) -> Result<ScheduleSim> {
    if stages == 0 || m == 0 {
        bail!("pipeline schedule: need at least one stage and one micro-batch (got {stages} stages, {m} micro-batches)");
    }
    let p = stages;
    let acts: Vec<Vec<Action>> = (0..p)
        .map(|s| schedule_actions(schedule, s, p, m))
        .collect();
    let mut fdone = vec![vec![None::<f64>; m]; p];
    let mut bdone = vec![vec![None::<f64>; m]; p];
    let mut pos = vec![0usize; p];
    let mut free = vec![0f64; p];
    let mut busy = vec![0f64; p];
    let mut in_flight = vec![0usize; p];
    let mut max_in_flight = vec![0usize; p];
    loop {
        let mut progressed = false;
        for s in 0..p {
            while pos[s] < acts[s].len() {
                let a = acts[s][pos[s]];
                let (ready, dur) = match a {
                    Action::Forward(k) => (if s == 0 { Some(0.0) } else { fdone[s - 1][k] }, t_fwd),
                    Action::Backward(k) => {
                        let next = if s == p - 1 {
                            Some(0.0)
                        } else {
                            bdone[s + 1][k]
                        };
                        (fdone[s][k].zip(next).map(|(a, b)| a.max(b)), t_bwd)
                    }
                };
                let Some(ready) = ready else { break };
                let end = free[s].max(ready) + dur;
                free[s] = end;
                busy[s] += dur;
                match a {
                    Action::Forward(k) => {
                        fdone[s][k] = Some(end);
                        in_flight[s] += 1;
                        max_in_flight[s] = max_in_flight[s].max(in_flight[s]);
                    }
                    Action::Backward(k) => {
                        bdone[s][k] = Some(end);
                        in_flight[s] -= 1;
                    }
                }
                pos[s] += 1;
                progressed = true;
            }
        }
        if (0..p).all(|s| pos[s] == acts[s].len()) {
            break;
        }
        if !progressed {
            bail!("pipeline schedule {schedule} deadlocks with {p} stages and {m} micro-batches");
        }
    }
    let makespan = free.iter().copied().fold(0.0, f64::max);
    let bubble = busy
        .iter()
        .map(|b| {
            if makespan > 0.0 {
                1.0 - b / makespan
            } else {
                0.0
            }
        })
        .collect();
    Ok(ScheduleSim {
        makespan,
        busy,
        bubble,
        max_in_flight,
    })
}

// ---------------------------------------------------------------------------------------------
// Stages
// ---------------------------------------------------------------------------------------------

/// Splits `n_layer` blocks into `stages` contiguous ranges of near-equal size (earlier stages
/// take the remainder). An error when there are fewer blocks than stages.
pub fn partition_layers(n_layer: usize, stages: usize) -> Result<Vec<Range<usize>>> {
    if stages == 0 {
        bail!("pipeline parallel: need at least one stage");
    }
    if n_layer < stages {
        bail!("pipeline parallel: {n_layer} layers cannot fill {stages} stages (each stage needs at least one block; use at most {n_layer} stages)");
    }
    let (q, r) = (n_layer / stages, n_layer % stages);
    let mut start = 0;
    Ok((0..stages)
        .map(|s| {
            let len = q + usize::from(s < r);
            let range = start..start + len;
            start += len;
            range
        })
        .collect())
}

/// Names and shapes of the parameters stage `s` owns (the last stage's copy of the tied
/// `wte` is not listed: stage 0 owns it).
fn owned_specs(cfg: &DecoderConfig, parts: &[Range<usize>], s: usize) -> Vec<(String, Vec<usize>)> {
    let all = gpt_param_specs(cfg);
    let last = parts.len() - 1;
    let mut v: Vec<(String, Vec<usize>)> = Vec::new();
    if s == 0 {
        v.extend(
            all.iter()
                .filter(|(n, _)| n == "wte.weight" || n == "wpe.weight")
                .cloned(),
        );
    }
    for i in parts[s].clone() {
        v.extend(block_param_specs(cfg, i));
    }
    if s == last {
        v.extend(
            all.iter()
                .filter(|(n, _)| n.starts_with("ln_f.") || n == "lm_head.weight")
                .cloned(),
        );
    }
    v
}

/// One pipeline stage of the GPT: blocks `layers`, plus the embeddings on the first stage and
/// `ln_f` and the (tied) head on the last. Parameter names are the full model's.
pub struct DecoderStage {
    pub config: DecoderConfig,
    pub stage: usize,
    pub num_stages: usize,
    /// Global indices of this stage's blocks.
    pub layers: Range<usize>,
    /// Token embedding: on the first stage, and on the last as the tied head.
    pub wte: Option<Embedding>,
    /// The learned position table (GPT-2), on the first stage.
    pub wpe: Option<Embedding>,
    pub blocks: Vec<TransformerBlock>,
    pub ln_f: Option<Norm>,
    /// An untied output head, on the last stage.
    pub lm_head: Option<Linear>,
    drop: Dropout,
}

impl DecoderStage {
    /// Stage `stage` of `num_stages` built from the full, standard-named weights (copied).
    /// Dropout (if the config has any) draws from a generator seeded per stage.
    pub fn from_named(
        cfg: &DecoderConfig,
        weights: &[(String, Tensor)],
        stage: usize,
        num_stages: usize,
    ) -> Result<Self> {
        let parts = partition_layers(cfg.n_layer, num_stages)?;
        if stage >= num_stages {
            bail!("pipeline parallel: stage {stage} out of range for {num_stages} stages");
        }
        cfg.check()?;
        let src = WeightSource::new(cfg, weights)?;
        let rng = shared_rng(0x5EED_0000 + stage as u64);
        let (first, last) = (stage == 0, stage == num_stages - 1);
        let mut blocks = Vec::new();
        for i in parts[stage].clone() {
            blocks.push(TransformerBlock::from_named(
                &cfg.layer_config(i),
                &format!("blocks.{i}"),
                &mut |n| src.var(n),
                &rng,
            )?);
        }
        let tied = cfg.arch.tie_head;
        Ok(DecoderStage {
            config: cfg.clone(),
            stage,
            num_stages,
            layers: parts[stage].clone(),
            wte: if first || (last && tied) {
                Some(Embedding::from_weights(src.var("wte.weight")?))
            } else {
                None
            },
            wpe: if first && cfg.arch.rope.is_none() {
                Some(Embedding::from_weights(src.var("wpe.weight")?))
            } else {
                None
            },
            blocks,
            ln_f: if last {
                let bias = match cfg.arch.norm {
                    sinter_nn::NormKind::LayerNorm => Some(src.var("ln_f.bias")?),
                    sinter_nn::NormKind::RmsNorm => None,
                };
                Some(Norm::from_weights(
                    cfg.arch.norm,
                    src.var("ln_f.weight")?,
                    bias,
                    cfg.arch.norm_eps,
                )?)
            } else {
                None
            },
            lm_head: if last && !tied {
                Some(Linear::from_weights(src.var("lm_head.weight")?, None))
            } else {
                None
            },
            drop: Dropout::new(cfg.dropout, rng),
        })
    }

    pub fn is_first(&self) -> bool {
        self.stage == 0
    }
    pub fn is_last(&self) -> bool {
        self.stage + 1 == self.num_stages
    }

    /// Embeddings (first stage) and blocks: ids `[b, t]` (first stage) or activations
    /// `[b, t, c]` → activations `[b, t, c]`.
    pub fn body(&self, x: &Tensor) -> Result<Tensor> {
        let mut x = if self.is_first() {
            if x.rank() != 2 || x.dtype() != DType::I64 {
                bail!(
                    "gpt: expected i64 token ids [batch, time], got {:?} {}",
                    x.shape(),
                    x.dtype()
                );
            }
            let t = x.shape()[1];
            if t > self.config.block_size {
                bail!(
                    "gpt: sequence of {t} tokens is longer than the context of {}",
                    self.config.block_size
                );
            }
            let wte = self.wte.as_ref().expect("first stage");
            let mut e = wte.forward(x)?;
            if let Some(wpe) = &self.wpe {
                // Positions where the table lives (no host tensor in the step).
                let pos = Tensor::arange(0.0, t as f64, 1.0, DType::I64, wpe.weight.device())?;
                e = e.add(&wpe.forward(&pos)?)?;
            }
            self.drop.forward(&e)?
        } else {
            x.clone()
        };
        for b in &self.blocks {
            x = b.forward(&x)?;
        }
        Ok(x)
    }

    /// `ln_f` and the tied head (last stage): activations `[b, t, c]` → logits `[b·t, V]`.
    fn head(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let ln_f = self
            .ln_f
            .as_ref()
            .ok_or_else(|| Error::Msg("pipeline: only the last stage has the head".into()))?;
        let h = ln_f.forward(x)?.reshape(&[b * t, c])?;
        match &self.lm_head {
            Some(head) => head.forward(&h),
            None => {
                let wte = self.wte.as_ref().expect("last stage holds the tied head");
                h.matmul(&wte.weight.t()?)
            }
        }
    }

    /// Mean cross-entropy of this (last) stage's output on `x` against `targets` `[b, t]`.
    pub fn loss(&self, x: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let logits = self.head(&self.body(x)?)?;
        logits.cross_entropy(&targets.reshape(&[targets.numel()])?, IGNORE_INDEX)
    }
}

impl Module for DecoderStage {
    /// Activations out of this stage; on the last stage, the logits `[b, t, V]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.body(x)?;
        if self.is_last() {
            let (b, t) = (h.shape()[0], h.shape()[1]);
            self.head(&h)?.reshape(&[b, t, self.config.vocab_size])
        } else {
            Ok(h)
        }
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        if let Some(w) = &self.wte {
            w.collect(&join(prefix, "wte"), out);
        }
        if let Some(w) = &self.wpe {
            w.collect(&join(prefix, "wpe"), out);
        }
        for (b, i) in self.blocks.iter().zip(self.layers.clone()) {
            b.collect(&join(prefix, &format!("blocks.{i}")), out);
        }
        if let Some(l) = &self.ln_f {
            l.collect(&join(prefix, "ln_f"), out);
        }
        if let Some(h) = &self.lm_head {
            h.collect(&join(prefix, "lm_head"), out);
        }
    }
    fn set_training(&self, t: bool) {
        self.drop.set_training(t);
        self.blocks.iter().for_each(|b| b.set_training(t));
    }
}

// ---------------------------------------------------------------------------------------------
// The pipeline runtime
// ---------------------------------------------------------------------------------------------

/// What one `forward_backward` did on this stage.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineStats {
    pub schedule: Schedule,
    pub stage: usize,
    pub stages: usize,
    pub micro_batches: usize,
    /// Mean loss over the micro-batches (the same on every stage).
    pub loss: f32,
    /// Most micro-batches whose activations this stage held at once.
    pub max_in_flight: usize,
    /// Wall-clock time of the schedule on this stage.
    pub wall_s: f64,
    /// Time spent computing forwards and backwards.
    pub busy_s: f64,
    /// Time spent waiting for activations and gradients (`wall − busy`).
    pub idle_s: f64,
    /// Measured idle fraction `idle/wall` on this stage.
    pub measured_bubble: f64,
    /// Idle fraction of this stage in the schedule's step count ([`simulate_schedule`] with
    /// forward and backward one step each).
    pub schedule_bubble: f64,
    /// `(p − 1)/(m + p − 1)`.
    pub theoretical_bubble: f64,
}

/// Runs one stage of a pipeline-parallel GPT.
pub struct PipelineGpt {
    pub stage: DecoderStage,
    pub schedule: Schedule,
    pub micro_batches: usize,
    comm: Box<dyn Communicator>,
    /// Group {first, last stage} summing the tied embedding/head gradient (p > 1).
    tied: Option<Box<dyn Communicator>>,
    parts: Vec<Range<usize>>,
}

impl PipelineGpt {
    /// This rank's stage (its rank in `comm`, the pipeline group) of a full model.
    pub fn from_gpt(
        gpt: &Decoder,
        comm: Box<dyn Communicator>,
        schedule: Schedule,
        micro_batches: usize,
    ) -> Result<Self> {
        Self::from_named(
            &gpt.config,
            &gpt.parameters(),
            comm,
            schedule,
            micro_batches,
        )
    }

    /// This rank's stage built from the full, standard-named weights (copied).
    pub fn from_named(
        cfg: &DecoderConfig,
        weights: &[(String, Tensor)],
        mut comm: Box<dyn Communicator>,
        schedule: Schedule,
        micro_batches: usize,
    ) -> Result<Self> {
        if micro_batches == 0 {
            bail!("pipeline parallel: need at least one micro-batch");
        }
        let (s, p) = (comm.rank(), comm.world_size());
        let parts = partition_layers(cfg.n_layer, p)?;
        let stage = DecoderStage::from_named(cfg, weights, s, p)?;
        // Only a tied head has a second copy of `wte` on the last stage to keep in step.
        let tied = if p > 1 && cfg.arch.tie_head && (s == 0 || s == p - 1) {
            Some(comm.new_group(&[0, p - 1]).map_err(comm_err)?)
        } else {
            None
        };
        Ok(PipelineGpt {
            stage,
            schedule,
            micro_batches,
            comm,
            tied,
            parts,
        })
    }

    /// This stage's parameters under their full-model names (on the last stage `wte.weight`
    /// is the tied head's copy).
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        self.stage.parameters()
    }

    pub fn zero_grad(&self) {
        self.stage.zero_grad();
    }

    /// Forward and backward of the whole batch (`ids`, `targets`: `[b, t]`, b divisible by the
    /// number of micro-batches; every stage passes the same batch and uses what it needs),
    /// following the schedule. Leaves each parameter's gradient averaged over micro-batches
    /// (added to what it held), with the tied embedding/head gradient summed between the
    /// first and last stage.
    pub fn forward_backward(&mut self, ids: &Tensor, targets: &Tensor) -> Result<PipelineStats> {
        let (p, s, m) = (self.stage.num_stages, self.stage.stage, self.micro_batches);
        if ids.rank() != 2 || targets.shape() != ids.shape() {
            bail!(
                "pipeline: ids {:?} and targets {:?} must both be [batch, time]",
                ids.shape(),
                targets.shape()
            );
        }
        let (b, t) = (ids.shape()[0], ids.shape()[1]);
        if !b.is_multiple_of(m) {
            bail!("pipeline: batch of {b} sequences does not split into {m} micro-batches");
        }
        let mb = b / m;
        let act_shape = [mb, t, self.stage.config.n_embd];
        let act_len: usize = act_shape.iter().product();
        let (first, last) = (s == 0, s == p - 1);
        let mut stash: VecDeque<(usize, Option<Tensor>, Tensor)> = VecDeque::new();
        let (mut max_in_flight, mut loss_sum) = (0usize, 0f64);
        let mut busy = Duration::ZERO;
        let t0 = Instant::now();
        for action in schedule_actions(self.schedule, s, p, m) {
            match action {
                Action::Forward(k) => {
                    let input = if first {
                        None
                    } else {
                        let mut buf = vec![0f32; act_len];
                        self.comm.recv(&mut buf, s - 1).map_err(comm_err)?;
                        Some(f32_tensor(buf, &act_shape)?.to_var()?)
                    };
                    let start = Instant::now();
                    let x = match &input {
                        Some(x) => x.clone(),
                        None => ids.narrow(0, k * mb, mb)?,
                    };
                    let out = if last {
                        let loss = self.stage.loss(&x, &targets.narrow(0, k * mb, mb)?)?;
                        loss_sum += loss.to_scalar_f32()? as f64;
                        loss.mul_scalar(1.0 / m as f32)?
                    } else {
                        let h = self.stage.body(&x)?;
                        self.comm.send(&h.to_vec_f32()?, s + 1).map_err(comm_err)?;
                        h
                    };
                    busy += start.elapsed();
                    stash.push_back((k, input, out));
                    max_in_flight = max_in_flight.max(stash.len());
                }
                Action::Backward(k) => {
                    let (kk, input, out) = stash
                        .pop_front()
                        .ok_or_else(|| Error::Msg("pipeline: backward before forward".into()))?;
                    debug_assert_eq!(k, kk);
                    if last {
                        let start = Instant::now();
                        out.backward()?;
                        busy += start.elapsed();
                    } else {
                        let mut buf = vec![0f32; act_len];
                        self.comm.recv(&mut buf, s + 1).map_err(comm_err)?;
                        let start = Instant::now();
                        out.backward_with_grad(&f32_tensor(buf, &act_shape)?, |_, _| Ok(()))?;
                        busy += start.elapsed();
                    }
                    if let Some(x) = input {
                        let start = Instant::now();
                        let g = match x.grad() {
                            Some(g) => g.to_vec_f32()?,
                            None => vec![0f32; act_len],
                        };
                        self.comm.send(&g, s - 1).map_err(comm_err)?;
                        busy += start.elapsed();
                    }
                }
            }
        }
        let wall = t0.elapsed();
        // The tied embedding / head: both copies get the sum of both gradients.
        if let Some(tied) = self.tied.as_mut() {
            let w = &self
                .stage
                .wte
                .as_ref()
                .expect("first and last stage hold wte")
                .weight;
            let mut g = match w.grad() {
                Some(g) => g.to_vec_f32()?,
                None => vec![0f32; w.numel()],
            };
            tied.all_reduce(&mut g, ReduceOp::Sum).map_err(comm_err)?;
            w.set_grad(Some(f32_tensor(g, w.shape())?));
        }
        let mut loss = [(loss_sum / m as f64) as f32];
        if p > 1 {
            self.comm.broadcast(&mut loss, p - 1).map_err(comm_err)?;
        }
        let sim = simulate_schedule(self.schedule, p, m, 1.0, 1.0)?;
        let (wall_s, busy_s) = (
            wall.as_secs_f64(),
            busy.as_secs_f64().min(wall.as_secs_f64()),
        );
        Ok(PipelineStats {
            schedule: self.schedule,
            stage: s,
            stages: p,
            micro_batches: m,
            loss: loss[0],
            max_in_flight,
            wall_s,
            busy_s,
            idle_s: wall_s - busy_s,
            measured_bubble: if wall_s > 0.0 {
                (wall_s - busy_s) / wall_s
            } else {
                0.0
            },
            schedule_bubble: sim.bubble[s],
            theoretical_bubble: theoretical_bubble(p, m),
        })
    }

    fn gather(&mut self, grads: bool) -> Result<Vec<(String, Tensor)>> {
        self.gather_with(&|_, t| {
            if grads {
                match t.grad() {
                    Some(g) => g.to_vec_f32(),
                    None => Ok(vec![0f32; t.numel()]),
                }
            } else {
                t.to_vec_f32()
            }
        })
    }

    /// The pipeline group (e.g. for a global gradient norm over the stages).
    pub fn comm_mut(&mut self) -> &mut dyn Communicator {
        &mut *self.comm
    }

    /// True when parameter `name` of this stage is owned here (not the last stage's copy of
    /// the tied `wte`): what a sum over the stages counts once.
    pub fn owns(&self, name: &str) -> bool {
        !(name == "wte.weight" && self.stage.num_stages > 1 && self.stage.stage > 0)
    }

    /// Full tensors from every stage: `local(name, param)` gives the values of something laid
    /// out like this stage's parameter `name` (weight, gradient, optimizer state). Collective
    /// over the pipeline group; standard names, `Decoder::parameters()` order.
    pub fn gather_with(
        &mut self,
        local_of: &dyn Fn(&str, &Tensor) -> Result<Vec<f32>>,
    ) -> Result<Vec<(String, Tensor)>> {
        let cfg = self.stage.config.clone();
        let (p, s) = (self.stage.num_stages, self.stage.stage);
        let specs: Vec<Vec<(String, Vec<usize>)>> =
            (0..p).map(|k| owned_specs(&cfg, &self.parts, k)).collect();
        let lens: Vec<usize> = specs
            .iter()
            .map(|v| v.iter().map(|(_, sh)| sh.iter().product::<usize>()).sum())
            .collect();
        let max_len = lens.iter().copied().max().unwrap_or(0);
        let mine: HashMap<String, Tensor> = self.parameters().into_iter().collect();
        let mut local = Vec::with_capacity(max_len);
        for (name, shape) in &specs[s] {
            let t = &mine[name];
            let v = local_of(name, t)?;
            if v.len() != shape.iter().product::<usize>() {
                bail!(
                    "pipeline gather: {name} gave {} values, expected shape {shape:?}",
                    v.len()
                );
            }
            local.extend(v);
        }
        local.resize(max_len, 0.0);
        let mut all = vec![0f32; max_len * p];
        if p > 1 {
            self.comm.all_gather(&local, &mut all).map_err(comm_err)?;
        } else {
            all.copy_from_slice(&local);
        }
        let mut found: HashMap<String, Tensor> = HashMap::new();
        for (k, sp) in specs.iter().enumerate() {
            let mut off = k * max_len;
            for (name, shape) in sp {
                let n: usize = shape.iter().product();
                found.insert(name.clone(), f32_tensor(all[off..off + n].to_vec(), shape)?);
                off += n;
            }
        }
        gpt_param_specs(&cfg)
            .into_iter()
            .map(|(n, _)| {
                found
                    .remove(&n)
                    .map(|t| (n.clone(), t))
                    .ok_or_else(|| Error::Msg(format!("pipeline gather: {n} not found")))
            })
            .collect()
    }

    /// The full model's weights under the standard names, in `Decoder::parameters()` order
    /// (collective over the pipeline group; every stage gets them).
    pub fn gather_weights(&mut self) -> Result<Vec<(String, Tensor)>> {
        self.gather(false)
    }

    /// The full model's gradients (the tied `wte` gradient as summed); collective.
    pub fn gather_grads(&mut self) -> Result<Vec<(String, Tensor)>> {
        self.gather(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_f_one_b_alternates_after_warm_up() {
        use Action::{Backward as B, Forward as F};
        assert_eq!(
            schedule_actions(Schedule::OneFOneB, 0, 2, 4),
            vec![F(0), F(1), B(0), F(2), B(1), F(3), B(2), B(3)]
        );
        assert_eq!(
            schedule_actions(Schedule::OneFOneB, 1, 2, 4),
            vec![F(0), B(0), F(1), B(1), F(2), B(2), F(3), B(3)]
        );
        assert_eq!(
            schedule_actions(Schedule::OneFOneB, 0, 4, 2),
            vec![F(0), F(1), B(0), B(1)]
        );
        assert_eq!(partition_layers(5, 2).unwrap(), vec![0..3, 3..5]);
        assert!(partition_layers(2, 3).is_err());
    }
}
