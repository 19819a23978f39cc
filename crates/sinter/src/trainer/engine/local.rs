//! The step of one process, of data parallel ranks (bucketed all-reduce overlapped with
//! backward, over the host ring or NCCL) and of ZeRO-1/2, with gradient accumulation. The
//! step's decisions (clip factor, fp16 loss scale and skip flag, learning rate, step count)
//! live on the device in a step control block and the loss accumulates there, so a step reads
//! nothing back; the host reads at the trainer's read steps only. ZeRO keeps its own step
//! (its shard on the model's device; it clips inside, over the shards).

use std::collections::HashMap;

use anyhow::{Context, Result};
use serde_json::{json, Value};
use sinter_core::{no_grad, DType, Device, Tensor};
use sinter_dist::data_parallel::{average_tensors, broadcast_tensors, bucket_bytes, shared};
use sinter_dist::{
    DataParallel, DistEnv, ReduceOp, ShardedAlgo, SharedComm, ZeroOptimizer, ZeroOptions,
};
use sinter_nn::{Optimizer, StepControl, TensorKind};

use super::graph::{self, GraphMode, GraphRun};
use super::{make_optimizer, param_groups, LoaderShard, LrPlan, Readout, StepEngine};
use crate::config::TrainConfig;
use crate::precision::Precision;
use crate::trainer::{Console, Setup};

/// This process's place in a data-parallel job.
pub struct Dist {
    rank: usize,
    world: usize,
    comm: SharedComm,
    /// With NCCL: the communicator for device gradient buckets. The TCP ring stays alive
    /// beside it (rank 0's store, which NCCL's id exchange uses, lives inside it).
    nccl_grads: Option<sinter_dist::NcclCommunicator>,
    _host: Option<SharedComm>,
}

impl Dist {
    /// Joins the data-parallel group of the launched job (every rank calls it).
    pub fn join(
        env: &DistEnv,
        backend: sinter_dist::BackendChoice,
        device: Device,
        talk: bool,
    ) -> Result<Dist> {
        let comm = super::backend::join_world(env, backend).with_context(|| {
            format!(
                "rank {} of {} could not join the data-parallel group",
                env.rank, env.world_size
            )
        })?;
        let (comm, nccl_grads, _host) =
            super::backend::pick_backend(env, shared(comm), backend, device, talk)?;
        Ok(Dist {
            rank: env.rank,
            world: env.world_size,
            comm,
            nccl_grads,
            _host,
        })
    }

    pub fn world(&self) -> usize {
        self.world
    }
}

/// The optimizer: an ordinary one (single process or data parallel), or ZeRO.
enum Opt {
    Plain(Box<dyn Optimizer>),
    Zero(Box<ZeroOptimizer>),
}

impl Opt {
    fn get(&self) -> &dyn Optimizer {
        match self {
            Opt::Plain(o) => o.as_ref(),
            Opt::Zero(z) => z.as_ref(),
        }
    }
    fn get_mut(&mut self) -> &mut dyn Optimizer {
        match self {
            Opt::Plain(o) => o.as_mut(),
            Opt::Zero(z) => z.as_mut(),
        }
    }
}

fn zero_algo(c: &TrainConfig) -> ShardedAlgo {
    match c.optimizer.as_str() {
        "sgd" => ShardedAlgo::Sgd {
            momentum: c.momentum,
            nesterov: c.momentum > 0.0,
            weight_decay: c.weight_decay,
        },
        _ => ShardedAlgo::adamw(c.weight_decay),
    }
}

/// The optimizer (plain, or ZeRO over the group) and the data-parallel gradient reducer.
fn optimizer(
    c: &TrainConfig,
    dist: Option<&mut Dist>,
    params: &[(String, Tensor)],
) -> Result<(Opt, Option<DataParallel>)> {
    let bucket = bucket_bytes(c.bucket_mb);
    Ok(match dist {
        Some(d) if c.zero > 0 => {
            let zo = ZeroOptions {
                stage: c.zero,
                bucket_bytes: bucket,
                grad_clip: c.grad_clip,
            };
            let groups = param_groups(c, params.to_vec())?;
            let z = ZeroOptimizer::with_groups(d.comm.clone(), groups, c.lr, zero_algo(c), zo)?;
            (Opt::Zero(Box::new(z)), None)
        }
        Some(d) => {
            let mut dp = DataParallel::new(d.comm.clone(), params.to_vec(), bucket)?;
            if let Some(n) = d.nccl_grads.take() {
                dp.use_nccl(n)?;
            }
            (Opt::Plain(make_optimizer(c, params.to_vec())?), Some(dp))
        }
        None => (Opt::Plain(make_optimizer(c, params.to_vec())?), None),
    })
}

/// Learning rates per window of the device schedule table.
const LR_WINDOW: u64 = 1024;

pub struct LocalEngine {
    device: Device,
    precision: Precision,
    dist: Option<Dist>,
    opt: Opt,
    dp: Option<DataParallel>,
    /// The device step control block (plain optimizer only); made by `begin`.
    control: Option<StepControl>,
    graph: Option<GraphRun>,
    cuda_graph: GraphMode,
    /// Float buffers (BatchNorm running statistics): each rank updates them from its data.
    buffers: Vec<Tensor>,
    params: Vec<(String, Tensor)>,
    /// The last step's loss and the running sum since the last read, on the device.
    step_loss: Tensor,
    loss_acc: Tensor,
    skipped_seen: u64,
    resumed_optimizer_steps: u64,
    /// Steps in the run, and the first step past the learning-rate window on the device.
    total: u64,
    window_end: u64,
    lr: LrPlan,
    console: Console,
}

impl LocalEngine {
    /// Moves the model to `device` and builds the optimizer (and the data-parallel reducer)
    /// over its parameters; with `dist`, parameters and buffers start as rank 0's.
    pub fn new(
        s: &Setup,
        device: Device,
        precision: Precision,
        mut dist: Option<Dist>,
        cuda_graph: GraphMode,
        console: Console,
    ) -> Result<LocalEngine> {
        sinter_nn::move_module(s.model.as_ref(), device)
            .with_context(|| format!("moving the model to {device}"))?;
        let params = s.model.parameters();
        let (opt, dp) = optimizer(&s.config, dist.as_mut(), &params)?;
        let buffers: Vec<Tensor> = s
            .model
            .named_tensors()
            .into_iter()
            .filter(|t| t.kind == TensorKind::Buffer && t.tensor.dtype().is_float())
            .map(|t| t.tensor)
            .collect();
        if let Some(d) = &dist {
            // Parameters were broadcast from rank 0 above; buffers too.
            broadcast_tensors(&d.comm, &buffers, 0)?;
        }
        Ok(LocalEngine {
            device,
            precision,
            dist,
            opt,
            dp,
            control: None,
            graph: None,
            cuda_graph,
            buffers,
            params,
            step_loss: Tensor::zeros(&[1], DType::F32, device)?,
            loss_acc: Tensor::zeros(&[1], DType::F32, device)?,
            skipped_seen: 0,
            resumed_optimizer_steps: 0,
            total: 0,
            window_end: 0,
            lr: LrPlan {
                schedule: sinter_nn::LrSchedule::Constant,
                base: s.config.lr,
            },
            console,
        })
    }

    /// The learning rates of the steps from `from` on that the device table holds (the
    /// schedule is computed lazily, a window at a time, whatever the length of the run).
    fn lr_window(&self, from: u64) -> Vec<f64> {
        let to = self.total.min(from.saturating_add(LR_WINDOW));
        (from..to.max(from + 1)).map(|i| self.lr.at(i)).collect()
    }

    fn ranks(&self) -> usize {
        self.dist.as_ref().map_or(1, |d| d.world)
    }

    /// Forward and backward of every micro-batch (the loss accumulated on the device), then
    /// the update: with the control block, clip / fp16 unscale-and-skip / update / loss-scale
    /// and schedule update as kernels; under ZeRO, its own step.
    fn device_step(&mut self, s: &Setup, inputs: &[(Tensor, Tensor)]) -> Result<()> {
        let accum = inputs.len();
        for (micro, (x, y)) in inputs.iter().enumerate() {
            let loss = {
                let _autocast = self.precision.enter_autocast();
                s.model.loss(x, y)?.loss
            };
            let loss = if accum > 1 {
                loss.mul_scalar(1.0 / accum as f32)?
            } else {
                loss
            };
            self.add_step_loss(&loss, micro == 0)?;
            let loss = match &self.control {
                Some(c) => c.scale_loss(&loss)?,
                None => self.precision.scale_loss(&loss)?,
            };
            // Only the last micro-step communicates.
            let sync = micro + 1 == accum;
            match (&mut self.opt, self.dp.as_mut()) {
                (Opt::Zero(z), _) => z.backward_with(&loss, sync)?,
                (_, Some(dp)) => dp.backward_with(&loss, sync)?,
                _ => loss.backward()?,
            }
        }
        {
            let _g = no_grad();
            self.loss_acc.assign(&self.loss_acc.add(&self.step_loss)?)?;
        }
        self.update()?;
        self.opt.get().zero_grad();
        Ok(())
    }

    /// Adds a micro-batch's loss to the step's loss on the device.
    fn add_step_loss(&self, loss: &Tensor, first: bool) -> Result<()> {
        let _g = no_grad();
        let l = loss.detach().to_dtype(DType::F32)?.reshape(&[1])?;
        if first {
            self.step_loss.assign(&l)?;
        } else {
            self.step_loss.assign(&self.step_loss.add(&l)?)?;
        }
        Ok(())
    }

    fn update(&mut self) -> Result<()> {
        match (&mut self.opt, &self.control) {
            (Opt::Plain(o), Some(c)) => {
                c.prepare(&self.params)?;
                o.step_ctl(c.tensor())?;
                c.finish()?;
            }
            // ZeRO holds gradient shards: under fp16 the overflow verdict is agreed over all
            // ranks (the one host read of such a step; its collectives go through the host
            // anyway), and every rank skips or steps together. ZeRO clips inside its step.
            (Opt::Zero(z), _) => {
                let ok = match self.precision.loss_scale() {
                    Some(scale) => z.unscale_and_check(scale)?,
                    None => true,
                };
                self.precision.set_should_step(ok);
                if ok {
                    z.step()?;
                }
                self.precision.end_step();
            }
            (o, None) => o.get_mut().step()?,
        }
        Ok(())
    }

    /// Runs the step through the captured CUDA graph when it can; false: run it eagerly.
    fn graph_step(&mut self, s: &Setup, step: u64, batches: &[(Tensor, Tensor)]) -> Result<bool> {
        let Some(mut g) = self.graph.take() else {
            return Ok(false);
        };
        let (device, params, console) = (self.device, self.params.clone(), self.console.clone());
        let ran = g.run(step, batches, device, &params, &console, |inputs| {
            self.device_step(s, inputs)
        });
        self.graph = Some(g);
        ran
    }

    /// The loss (sum since the last read, last step) averaged over the ranks, and a stop
    /// request from any rank.
    fn agreed_losses(&self, stop: bool) -> Result<(f64, f64, bool)> {
        let acc = self.loss_acc.to_vec_f32()?[0] as f64;
        let last = self.step_loss.to_vec_f32()?[0] as f64;
        Ok(match &self.dist {
            Some(d) => {
                let v = d
                    .comm
                    .all_reduce(
                        vec![acc as f32, last as f32, f32::from(u8::from(stop))],
                        ReduceOp::Avg,
                    )
                    .wait()
                    .context("all-reducing the loss")?;
                (v[0] as f64, v[1] as f64, v[2] > 0.0)
            }
            None => (acc, last, stop),
        })
    }
}

impl StepEngine for LocalEngine {
    fn device(&self) -> Device {
        self.device
    }

    fn describe(&self) -> String {
        match (&self.dist, &self.opt) {
            (None, _) => String::new(),
            (Some(d), Opt::Plain(_)) => format!(" on {} data-parallel rank(s)", d.world),
            (Some(d), Opt::Zero(z)) => format!(
                " on {} data-parallel rank(s) with ZeRO-{}",
                d.world,
                z.stage()
            ),
        }
    }

    fn world_size(&self) -> usize {
        self.ranks()
    }

    fn global_batch(&self, s: &Setup) -> usize {
        s.config.batch_size * self.ranks() * s.config.grad_accum as usize
    }

    fn loader_shard(&self, s: &Setup) -> LoaderShard {
        LoaderShard {
            batch_size: s.config.batch_size,
            rank: self.dist.as_ref().map_or(0, |d| d.rank),
            ranks: self.ranks(),
        }
    }

    fn batches_per_step(&self, s: &Setup) -> u64 {
        s.config.grad_accum
    }

    fn load_state(
        &mut self,
        optimizer_steps: u64,
        state: &HashMap<String, Tensor>,
        precision: Option<&str>,
    ) -> Result<()> {
        // Checkpoints load on the CPU; the state goes to the run's device.
        let state: HashMap<String, Tensor> = state
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.to_device(self.device)?)))
            .collect::<Result<_>>()?;
        self.opt.get_mut().load_state(optimizer_steps, &state)?;
        if let Some(p) = precision {
            self.precision.load_state(p)?;
        }
        self.resumed_optimizer_steps = optimizer_steps;
        Ok(())
    }

    fn begin(&mut self, s: &Setup, start: u64, total: u64, lr: LrPlan) -> Result<()> {
        self.lr = lr;
        if let Opt::Plain(_) = self.opt {
            self.total = total;
            let lrs = self.lr_window(start);
            self.window_end = start + lrs.len() as u64;
            let control = StepControl::new(
                self.device,
                &lrs,
                0,
                self.resumed_optimizer_steps,
                s.config.grad_clip,
                self.precision.scaler(),
            )
            .context("setting up the training step on the device")?;
            self.control = Some(control);
        }
        self.opt.get_mut().set_lr(self.lr.at(start));
        self.graph = graph::plan(
            self.cuda_graph,
            self.device,
            s.task,
            self.dist.is_some(),
            s.config.grad_accum,
            start,
            &self.console,
        )?;
        Ok(())
    }

    fn step(&mut self, s: &Setup, step: u64, batches: &[(Tensor, Tensor)]) -> Result<()> {
        match &self.control {
            None => self.opt.get_mut().set_lr(self.lr.at(step)),
            Some(c) if step == self.window_end => {
                let lrs = self.lr_window(step);
                c.restart_schedule(&lrs)?;
                self.window_end = step + lrs.len() as u64;
            }
            Some(_) => {}
        }
        let dropout_before = s.dropout_state();
        if !self.graph_step(s, step, batches)? {
            let inputs = batches
                .iter()
                .map(|b| s.model.place_batch(b, self.device))
                .collect::<sinter_core::Result<Vec<_>>>()?;
            self.device_step(s, &inputs)?;
        }
        if let Some(g) = &self.graph {
            if let Some(why) = graph::dropout_refusal(dropout_before, s.dropout_state()) {
                if g.asked {
                    anyhow::bail!("{why}");
                }
                // By default a model with dropout simply runs eagerly (checked on the first
                // step, before any capture).
                self.console.note("CUDA graph off: this model applies dropout, whose masks are drawn on the host at each forward pass");
                self.graph = None;
            }
        }
        Ok(())
    }

    fn read(&mut self, _s: &Setup, step: u64, stop: bool) -> Result<Readout> {
        let (loss_sum, last_loss, stop) = self.agreed_losses(stop)?;
        let mut r = Readout {
            loss_sum,
            last_loss,
            stop,
            ..Readout::default()
        };
        if !(loss_sum.is_finite() && last_loss.is_finite()) {
            return Ok(r);
        }
        self.loss_acc
            .assign(&Tensor::zeros(&[1], DType::F32, self.device)?)?;
        if let Some(c) = &self.control {
            let st = c.read()?;
            r.grad_norm = Some(st.grad_norm);
            self.opt.get_mut().set_steps(st.optimizer_steps);
            self.opt.get_mut().set_lr(self.lr.at(step));
            self.precision
                .set_scaler_state(st.loss_scale, st.good_steps)?;
            r.newly_skipped = st.skipped_steps.saturating_sub(self.skipped_seen);
            self.skipped_seen = st.skipped_steps;
        }
        r.loss_scale = self.precision.loss_scale();
        r.skipped_steps = self.skipped_seen;
        Ok(r)
    }

    fn sync_model(&mut self, _s: &Setup) -> Result<()> {
        // Ranks agree on the BatchNorm statistics before they are evaluated or saved.
        if let Some(d) = &self.dist {
            average_tensors(&d.comm, &self.buffers)?;
        }
        Ok(())
    }

    fn agree(&mut self, flag: bool) -> Result<bool> {
        Ok(match &self.dist {
            Some(d) => {
                let v = d
                    .comm
                    .all_reduce(vec![f32::from(u8::from(flag))], ReduceOp::Sum)
                    .wait()
                    .context("agreeing on a decision of rank 0")?;
                v[0] > 0.0
            }
            None => flag,
        })
    }

    fn checkpoint_state(&mut self, writer: bool) -> Result<(u64, Vec<(String, Tensor)>)> {
        let state = match &self.opt {
            Opt::Plain(o) if writer => o.state(),
            Opt::Plain(_) => Vec::new(),
            // Every rank takes part in gathering ZeRO's state.
            Opt::Zero(z) => z
                .try_state()
                .context("gathering the sharded optimizer state for the checkpoint")?,
        };
        Ok((self.opt.get().steps(), state))
    }

    fn precision_state(&self) -> Option<String> {
        Some(self.precision.state())
    }

    fn summarize(&self, summary: &mut Value) {
        summary["zero"] = json!(match &self.opt {
            Opt::Zero(z) => z.stage(),
            Opt::Plain(_) => 0,
        });
        if let Opt::Zero(z) = &self.opt {
            summary["zero_memory"] = serde_json::to_value(z.memory()).unwrap_or(Value::Null);
        }
        if let Some(dp) = &self.dp {
            summary["gradient_buckets"] = json!(dp.layout().buckets.len());
        }
        summary["peak_device_memory_bytes"] =
            json!(crate::precision::peak_device_memory_bytes(self.device));
    }

    fn end(&mut self) {
        // The captured graph's memory goes back to the allocator before the summary.
        self.graph = None;
    }
}
