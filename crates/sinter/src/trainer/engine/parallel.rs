//! Tensor parallel (Megatron) or pipeline parallel (GPipe, 1F1B) GPT replicas, data
//! parallel across replicas, on the ranks that `sinter launch` starts. Every rank builds the
//! same initial model from the seed; the parallel trainer shards or stages it. Checkpoints
//! and evaluations use the gathered full weights in `Setup::model` (the canonical layout every
//! checkpoint has), so `--resume` works on any layout and `eval` / `generate` read them like
//! any other. Gradient clipping uses the global norm over all model-parallel ranks.

use std::collections::HashMap;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use sinter_core::{Device, Tensor};
use sinter_dist::pipeline::{ParallelSpec, ParallelTrainer, Schedule};
use sinter_dist::{Communicator, DistEnv, ReduceOp};
use sinter_models::{Decoder, Task};

use super::{make_optimizer, LoaderShard, LrPlan, Readout, StepEngine};
use crate::config::TrainConfig;
use crate::trainer::Setup;

/// How the GPT is split: `--tp`, `--pp`, `--micro-batches`, `--schedule`.
#[derive(Clone, Debug)]
pub struct ModelParallel {
    pub tp: usize,
    pub pp: usize,
    pub micro_batches: usize,
    pub schedule: String,
}

/// Refuses what the model-parallel step cannot do, before anything starts.
/// `cuda_graph`: `--cuda-graph` was given (by default model-parallel steps run eagerly).
pub fn check(config: &TrainConfig, cuda_graph: bool) -> Result<()> {
    if crate::config::task_of_model(&config.model) != Some(Task::LanguageModel) {
        bail!(
            "--tp/--pp split a GPT; model {} is not one (use --dp for other models)",
            config.model
        );
    }
    if config.device.starts_with("cuda") {
        bail!("--tp/--pp run on the CPU in this build (their stages talk over the host communicator); drop --device {} or use --dp for GPUs", config.device);
    }
    if config.precision != "fp32" || cuda_graph {
        bail!("--tp/--pp train in fp32 on the CPU ranks of the host communicator; drop --precision {} / --cuda-graph (mixed precision and CUDA graphs run with --dp or a single process)", config.precision);
    }
    Ok(())
}

/// The job's mesh and the world communicator (every rank calls it).
pub fn join(
    env: &DistEnv,
    mp: &ModelParallel,
    backend: sinter_dist::BackendChoice,
) -> Result<(ParallelSpec, Box<dyn Communicator>)> {
    let schedule: Schedule = mp
        .schedule
        .parse()
        .map_err(|e| anyhow!("--schedule: {e}"))?;
    let inner = mp.tp * mp.pp;
    if inner == 0 || !env.world_size.is_multiple_of(inner) {
        bail!("--tp {} × --pp {} = {inner} ranks per replica does not divide the {} ranks started; launch a multiple of {inner} with `sinter launch --nproc-per-node N -- train …`", mp.tp, mp.pp, env.world_size);
    }
    let spec = ParallelSpec {
        dp: env.world_size / inner,
        tp: mp.tp,
        pp: mp.pp,
        micro_batches: mp.micro_batches,
        schedule,
    };
    let comm = super::backend::join_world(env, backend).with_context(|| {
        format!(
            "rank {} of {} could not join the group",
            env.rank, env.world_size
        )
    })?;
    Ok((spec, comm))
}

pub struct ParallelEngine {
    spec: ParallelSpec,
    trainer: ParallelTrainer,
    /// The whole job, for decisions all ranks must share.
    world: Box<dyn Communicator>,
    lr: LrPlan,
    loss_sum: f64,
    last_loss: f64,
}

impl ParallelEngine {
    /// Shards or stages the model in `s` (its current weights) over the mesh and builds each
    /// rank's optimizer.
    pub fn new(
        s: &Setup,
        spec: ParallelSpec,
        mut world: Box<dyn Communicator>,
    ) -> Result<ParallelEngine> {
        let gpt = s
            .model
            .as_any()
            .and_then(|m| m.downcast_ref::<Decoder>())
            .ok_or_else(|| anyhow!("--tp/--pp split a GPT; {} is not one", s.config.model))?;
        let init = s.model.parameters();
        let c = s.config.clone();
        let make = move |params: Vec<(String, Tensor)>| make_optimizer(&c, params);
        let mut trainer = ParallelTrainer::new(&gpt.config, &init, &spec, world.as_mut(), &make)?;
        trainer.set_grad_clip(s.config.grad_clip);
        Ok(ParallelEngine {
            spec,
            trainer,
            world,
            lr: LrPlan {
                schedule: sinter_nn::LrSchedule::Constant,
                base: s.config.lr,
            },
            loss_sum: 0.0,
            last_loss: f64::NAN,
        })
    }
}

impl StepEngine for ParallelEngine {
    fn device(&self) -> Device {
        Device::Cpu
    }

    fn describe(&self) -> String {
        format!(
            " with dp {} × tp {} × pp {} ({} micro-batches, {} schedule) on {} ranks",
            self.spec.dp,
            self.spec.tp,
            self.spec.pp,
            self.spec.micro_batches,
            self.spec.schedule,
            self.world.world_size()
        )
    }

    fn world_size(&self) -> usize {
        self.world.world_size()
    }

    fn global_batch(&self, s: &Setup) -> usize {
        s.config.batch_size * self.spec.dp
    }

    /// Every rank reads the same global batch; the trainer gives each replica its slice.
    fn loader_shard(&self, s: &Setup) -> LoaderShard {
        LoaderShard {
            batch_size: self.global_batch(s),
            rank: 0,
            ranks: 1,
        }
    }

    fn batches_per_step(&self, _s: &Setup) -> u64 {
        1
    }

    fn load_state(
        &mut self,
        optimizer_steps: u64,
        state: &HashMap<String, Tensor>,
        _precision: Option<&str>,
    ) -> Result<()> {
        self.trainer
            .load_optimizer_state(optimizer_steps, state)
            .context("loading the optimizer state of the checkpoint")
    }

    fn begin(&mut self, _s: &Setup, _start: u64, _total: u64, lr: LrPlan) -> Result<()> {
        self.lr = lr;
        Ok(())
    }

    fn step(&mut self, _s: &Setup, step: u64, batches: &[(Tensor, Tensor)]) -> Result<()> {
        self.trainer.optimizer_mut().set_lr(self.lr.at(step));
        let [(x, y)] = batches else {
            bail!(
                "the model-parallel step takes one batch per step, got {}",
                batches.len()
            );
        };
        let loss = self.trainer.step(x, y)? as f64;
        self.loss_sum += loss;
        self.last_loss = loss;
        Ok(())
    }

    fn read(&mut self, _s: &Setup, _step: u64, stop: bool) -> Result<Readout> {
        let r = Readout {
            loss_sum: self.loss_sum,
            last_loss: self.last_loss,
            grad_norm: self.trainer.last_grad_norm(),
            stop: self.agree(stop)?,
            ..Readout::default()
        };
        self.loss_sum = 0.0;
        Ok(r)
    }

    /// Gathers the full weights into `s.model` on every rank.
    fn sync_model(&mut self, s: &Setup) -> Result<()> {
        let full: HashMap<String, Tensor> = self.trainer.gather_weights()?.into_iter().collect();
        for (n, t) in &s.model.parameters() {
            let src = full
                .get(n)
                .ok_or_else(|| anyhow!("gathered weights lack {n}"))?;
            t.assign(src)
                .with_context(|| format!("loading gathered {n}"))?;
        }
        Ok(())
    }

    fn agree(&mut self, flag: bool) -> Result<bool> {
        let mut v = [f32::from(u8::from(flag))];
        if self.world.world_size() > 1 {
            self.world
                .all_reduce(&mut v, ReduceOp::Sum)
                .context("agreeing on a decision of rank 0")?;
        }
        Ok(v[0] > 0.0)
    }

    fn checkpoint_state(&mut self, _writer: bool) -> Result<(u64, Vec<(String, Tensor)>)> {
        let state = self
            .trainer
            .gather_optimizer_state()
            .context("gathering the optimizer state")?;
        Ok((self.trainer.optimizer_mut().steps(), state))
    }

    /// The model-parallel path trains in fp32 (no loss scaler to save).
    fn precision_state(&self) -> Option<String> {
        None
    }

    fn summarize(&self, summary: &mut Value) {
        let bubble = self
            .trainer
            .pipeline_stats()
            .map(|p| (p.theoretical_bubble, p.measured_bubble));
        for (k, v) in [
            ("dp", json!(self.spec.dp)),
            ("tp", json!(self.spec.tp)),
            ("pp", json!(self.spec.pp)),
            ("micro_batches", json!(self.spec.micro_batches)),
            ("schedule", json!(self.spec.schedule.to_string())),
            ("pipeline_bubble_theoretical", json!(bubble.map(|b| b.0))),
            ("pipeline_bubble_measured", json!(bubble.map(|b| b.1))),
        ] {
            summary[k] = v;
        }
    }
}
