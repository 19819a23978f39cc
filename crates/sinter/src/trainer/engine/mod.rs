//! Step engines: how one optimizer step runs, for each strategy. The trainer
//! ([`super::Trainer`]) owns everything around the step (data, schedule of reads, logging,
//! evaluation, checkpoints, summary); an engine owns the optimizer, the communicators and the
//! step itself:
//!
//! - [`local::LocalEngine`]: one process, or data parallel over the host ring or NCCL, or
//!   ZeRO-1/2; with the device step control block (clipping, fp16 loss scaling and the
//!   learning rate on the device) and, on CUDA, `--cuda-graph` ([`graph`]);
//! - [`parallel::ParallelEngine`]: tensor or pipeline parallel GPT replicas (with data
//!   parallel across them).

pub(crate) mod backend;
pub mod graph;
pub mod local;
pub mod parallel;

use anyhow::Result;
use serde_json::Value;
use sinter_core::{Device, Tensor};
use sinter_nn::LrSchedule;

use super::Setup;

/// The learning rate of every step: the schedule over the run's steps, times the base rate.
#[derive(Clone, Debug)]
pub struct LrPlan {
    pub schedule: LrSchedule,
    pub base: f64,
}

impl LrPlan {
    pub fn at(&self, step: u64) -> f64 {
        self.schedule.lr_at(self.base, step)
    }
}

/// How a rank reads the training data.
#[derive(Clone, Copy, Debug)]
pub struct LoaderShard {
    /// Examples per loader batch.
    pub batch_size: usize,
    pub rank: usize,
    pub ranks: usize,
}

/// What an engine reports at a read (the steps where the trainer logs, evaluates or
/// checkpoints), agreed over all ranks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Readout {
    /// Sum of the step losses since the last read.
    pub loss_sum: f64,
    /// The loss of the last step.
    pub last_loss: f64,
    /// Global gradient norm of the last step, where the engine knows it.
    pub grad_norm: Option<f64>,
    /// fp16: the loss scale, and steps skipped in the whole run so far and since the last read.
    pub loss_scale: Option<f64>,
    pub skipped_steps: u64,
    pub newly_skipped: u64,
    /// Some rank asked to stop (a signal, or its output went away).
    pub stop: bool,
}

/// One optimizer step of a strategy, and what the trainer needs around it. Collective
/// methods are called by every rank at the same steps.
pub trait StepEngine {
    /// The run's device (where the model lives).
    fn device(&self) -> Device;
    /// " on 2 data-parallel rank(s) with ZeRO-1", for the line that starts a run.
    fn describe(&self) -> String;
    /// Processes in the job (for the summary).
    fn world_size(&self) -> usize;
    /// Examples per optimizer step over all ranks.
    fn global_batch(&self, s: &Setup) -> usize;
    /// How this rank reads the training data.
    fn loader_shard(&self, s: &Setup) -> LoaderShard;
    /// Loader batches per optimizer step on this rank.
    fn batches_per_step(&self, s: &Setup) -> u64;
    /// Loads a checkpoint's optimizer (and precision) state; the model's weights are loaded.
    fn load_state(
        &mut self,
        optimizer_steps: u64,
        state: &std::collections::HashMap<String, Tensor>,
        precision: Option<&str>,
    ) -> Result<()>;
    /// Begins training at step `start` of `total`, with learning rates `lr`.
    fn begin(&mut self, s: &Setup, start: u64, total: u64, lr: LrPlan) -> Result<()>;
    /// One optimizer step of 0-based step `step` over its prepared host micro-batches.
    fn step(&mut self, s: &Setup, step: u64, batches: &[(Tensor, Tensor)]) -> Result<()>;
    /// Losses and step statistics since the last read (collective). `stop`: this rank wants
    /// to stop; the readout says whether any rank does.
    fn read(&mut self, s: &Setup, step: u64, stop: bool) -> Result<Readout>;
    /// Makes `s.model` hold the whole current model (weights, and buffers agreed over the
    /// ranks) for an evaluation or a checkpoint (collective).
    fn sync_model(&mut self, s: &Setup) -> Result<()>;
    /// Any rank's `flag` set → true on every rank (collective; rank 0 decides things like
    /// early stopping that all ranks must follow).
    fn agree(&mut self, flag: bool) -> Result<bool>;
    /// The optimizer's step count and its whole state in checkpoint layout (collective; ranks
    /// that do not write may get an empty state).
    fn checkpoint_state(&mut self, writer: bool) -> Result<(u64, Vec<(String, Tensor)>)>;
    /// The precision hooks' state for the checkpoint (the fp16 loss scale).
    fn precision_state(&self) -> Option<String>;
    /// Adds what this strategy knows to the run's summary.
    fn summarize(&self, summary: &mut Value);
    /// Ends the run (frees what the step held, e.g. a captured CUDA graph).
    fn end(&mut self) {}
}

/// The parameter groups of a run, for every optimizer and strategy alike: the default
/// grouping ([`sinter_nn::decay_groups`]: biases and norm gains do not decay) with the
/// `--param-group` rules applied.
pub fn param_groups(
    c: &crate::config::TrainConfig,
    params: Vec<(String, Tensor)>,
) -> anyhow::Result<Vec<sinter_nn::ParamGroup>> {
    crate::param_groups::assign(&c.param_groups, params, c.weight_decay)
}

/// The optimizer a config names, over `params` in the run's groups (shared by every engine
/// that steps a plain optimizer).
pub fn make_optimizer(
    c: &crate::config::TrainConfig,
    params: Vec<(String, Tensor)>,
) -> sinter_core::Result<Box<dyn sinter_nn::Optimizer>> {
    use sinter_nn::{AdamW, Sgd};
    let groups = param_groups(c, params).map_err(|e| sinter_core::Error::Msg(format!("{e:#}")))?;
    Ok(match c.optimizer.as_str() {
        "sgd" => Box::new(Sgd::with_groups(
            groups,
            c.lr,
            c.momentum,
            c.momentum > 0.0,
            c.weight_decay,
        )?),
        "adamw" => Box::new(AdamW::with_groups(groups, c.lr, c.weight_decay)?),
        other => sinter_core::bail!(
            "unknown optimizer '{other}'; valid optimizers: {}",
            crate::config::OPTIMIZERS.join(", ")
        ),
    })
}
