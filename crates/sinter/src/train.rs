//! The training loop: data → model → loss → backward → clip → optimizer, with evaluation,
//! metrics, checkpoints and exact resume; data parallel (bucketed all-reduce overlapped with
//! backward) or ZeRO-1/2 across the ranks of a launched job, with gradient accumulation.
//! Only rank 0 evaluates and writes files; checkpoints hold full tensors, so a run resumes
//! on any number of ranks (the global batch is kept).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use sinter_core::{no_grad, Device, Rng, Tensor};
use sinter_data::{
    DataKind, DataLoader, DataSpec, Dataset, HostArray, HostData, LoaderPosition, OpenOptions,
    Split, Windows,
};
use sinter_dist::data_parallel::{broadcast_tensors, bucket_bytes, shared};
use sinter_dist::{
    DataParallel, ReduceOp, ShardedAlgo, SharedComm, TcpOptions, ZeroOptimizer, ZeroOptions,
};
use sinter_models::{DataShape, Task};
use sinter_nn::module::shared_rng;
use sinter_nn::{clip_grad_norm, AdamW, LrSchedule, Module, Optimizer, Sgd, SharedRng, TensorKind};

use crate::checkpoint::{self, Meta};
use crate::config::TrainConfig;
use crate::metrics::{plot_losses, MetricsLog};

/// Takes over the loader's buffer as the tensor's storage (no copy).
pub fn to_tensor(a: HostArray) -> Result<Tensor> {
    Ok(match a.data {
        HostData::F32(v) => Tensor::from_vec(v, &a.shape, Device::Cpu)?,
        HostData::I64(v) => Tensor::from_vec(v, &a.shape, Device::Cpu)?,
    })
}

/// Model, data and optimizer of one run, built from a config.
pub struct Setup {
    pub config: TrainConfig,
    pub task: Task,
    pub model: Box<dyn Module>,
    pub train: Arc<dyn Dataset>,
    pub val: Arc<dyn Dataset>,
    pub rng: Rng,
    pub dropout_rng: SharedRng,
}

pub fn setup(config: TrainConfig) -> Result<Setup> {
    let spec = DataSpec::parse(&config.data)?;
    let task = sinter_models::task_of(&config.model).expect("validated model name");
    let data_task = match spec.kind() {
        DataKind::Classification => Task::Classification,
        DataKind::LanguageModel => Task::LanguageModel,
    };
    if task != data_task {
        bail!("model {} is a {:?} model but data '{}' is {:?} data; pick a matching --model or --data", config.model, task, config.data, data_task);
    }
    let (train, val) = match task {
        Task::Classification => (
            spec.open(Split::Train, 0)?,
            spec.open(Split::Validation, 0)?,
        ),
        Task::LanguageModel => {
            let mut o = OpenOptions::new(config.context);
            let train = spec.open_with(Split::Train, &o)?;
            o.windows = Windows::Strided;
            (train, spec.open_with(Split::Validation, &o)?)
        }
    };
    let classes = train.num_classes().ok_or_else(|| {
        anyhow!(
            "data '{}' does not say how many classes it has",
            config.data
        )
    })?;
    let mut rng = Rng::new(config.seed);
    let dropout_rng = shared_rng(config.seed ^ 0x5eed);
    let recompute = config
        .recompute
        .parse()
        .map_err(|e| anyhow!("--recompute: {e}"))?;
    let model = sinter_models::build_with(
        &config.model,
        &DataShape {
            input: train.input_shape(),
            classes,
        },
        &mut rng,
        &dropout_rng,
        recompute,
    )?;
    Ok(Setup {
        config,
        task,
        model,
        train,
        val,
        rng,
        dropout_rng,
    })
}

fn make_optimizer(c: &TrainConfig, params: Vec<(String, Tensor)>) -> Result<Box<dyn Optimizer>> {
    Ok(match c.optimizer.as_str() {
        "sgd" => Box::new(Sgd::new(
            params,
            c.lr,
            c.momentum,
            c.momentum > 0.0,
            c.weight_decay,
        )?),
        _ => Box::new(AdamW::new(params, c.lr, c.weight_decay)?),
    })
}

/// Loss (and correct predictions, for classifiers) of one batch.
fn batch_loss(
    model: &dyn Module,
    task: Task,
    inputs: &Tensor,
    targets: &Tensor,
) -> Result<(Tensor, Option<usize>)> {
    let logits = model.forward(inputs)?;
    match task {
        Task::Classification => {
            let loss = logits.cross_entropy(targets, -100)?;
            let correct = if sinter_core::is_grad_enabled() {
                None
            } else {
                Some(
                    logits
                        .argmax(-1, false)?
                        .eq(targets)?
                        .to_vec_i64()?
                        .iter()
                        .sum::<i64>() as usize,
                )
            };
            Ok((loss, correct))
        }
        Task::LanguageModel => {
            let v = *logits.shape().last().expect("logits have a vocab dim");
            let n = targets.numel();
            Ok((
                logits
                    .reshape(&[n, v])?
                    .cross_entropy(&targets.reshape(&[n])?, -100)?,
                None,
            ))
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct EvalResult {
    pub loss: f64,
    pub accuracy: Option<f64>,
    pub examples: usize,
}

/// Validation loss (and accuracy) over up to `max_batches` batches (0 = all), in order.
pub fn evaluate(s: &Setup, max_batches: usize) -> Result<EvalResult> {
    let device = sinter_nn::module_device(s.model.as_ref())?;
    let _g = no_grad();
    s.model.set_training(false);
    let bs = s.config.batch_size.max(1);
    let mut loader = DataLoader::new(s.val.clone(), bs, false, false, 0);
    let n = if max_batches == 0 {
        loader.batches_per_epoch() as usize
    } else {
        (loader.batches_per_epoch() as usize).min(max_batches)
    };
    let (mut total, mut correct, mut count) = (0f64, 0usize, 0usize);
    for _ in 0..n {
        let b = loader.next_batch()?;
        let rows = b.inputs.shape[0];
        let (x, y) = (
            to_tensor(b.inputs)?.to_device(device)?,
            to_tensor(b.targets)?.to_device(device)?,
        );
        let (loss, c) = {
            let _autocast =
                sinter_nn::PrecisionMode::parse(&s.config.precision).and_then(|m| m.autocast());
            batch_loss(s.model.as_ref(), s.task, &x, &y)?
        };
        total += loss.to_scalar_f32()? as f64 * rows as f64;
        correct += c.unwrap_or(0);
        count += rows;
    }
    s.model.set_training(true);
    let count_f = count.max(1) as f64;
    Ok(EvalResult {
        loss: total / count_f,
        accuracy: (s.task == Task::Classification).then(|| correct as f64 / count_f),
        examples: count,
    })
}

pub struct TrainOptions {
    pub out: Option<PathBuf>,
    pub resume: Option<PathBuf>,
    pub quiet: bool,
    /// Stop (evaluating and checkpointing) after this step, for time-boxed jobs; `--resume`
    /// continues the same run later.
    pub stop_at_step: Option<u64>,
    /// Data parallel even in a single process (it is on by itself when the launcher's
    /// environment says WORLD_SIZE > 1, and with `--zero`).
    pub dp: bool,
    /// `--dist-backend`: NCCL or the host ring for data parallel / ZeRO.
    pub dist_backend: sinter_dist::BackendChoice,
}

fn save_checkpoint(
    dir: &Path,
    s: &Setup,
    optim_state: &[(String, Tensor)],
    optimizer_steps: u64,
    step: u64,
    loader: &DataLoader,
) -> Result<()> {
    let named: Vec<(String, Tensor)> = s
        .model
        .named_tensors()
        .into_iter()
        .map(|t| (t.name, t.tensor))
        .collect();
    let meta = Meta {
        step,
        optimizer_steps,
        rng: s.rng.state(),
        dropout_rng: s
            .dropout_rng
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .state(),
        loader: loader.position().to_u64s(),
        config: s.config.clone(),
    };
    checkpoint::save(dir, &named, optim_state, &meta)
}

/// This process's place in a data-parallel job.
struct Dist {
    rank: usize,
    world: usize,
    comm: SharedComm,
    /// With NCCL: the communicator for device gradient buckets. The TCP ring stays alive
    /// beside it (rank 0's store, which NCCL's id exchange uses, lives inside it).
    nccl_grads: Option<sinter_dist::NcclCommunicator>,
    _host: Option<SharedComm>,
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
    /// The full optimizer state: a collective under ZeRO (every rank calls it).
    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        match self {
            Opt::Plain(o) => Ok(o.state()),
            Opt::Zero(z) => z
                .try_state()
                .context("gathering the sharded optimizer state for the checkpoint"),
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

/// True for errors that another rank's failure causes here (a lost connection or a
/// collective that timed out), as opposed to a failure of this rank.
fn is_peer_failure(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        let m = c.to_string();
        m.contains("connection to rank")
            || m.contains("timed out after")
            || m.contains("has shut down")
    })
}

pub fn run(config: TrainConfig, opts: &TrainOptions) -> Result<serde_json::Value> {
    let r = run_inner(config, opts);
    if let Err(e) = &r {
        if is_peer_failure(e)
            && sinter_dist::rendezvous::from_env().is_ok_and(|env| env.world_size > 1)
        {
            // Another rank failed first: give the launcher a moment to see (and name) that
            // rank before this secondary failure reaches it.
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    }
    r
}

fn run_inner(mut config: TrainConfig, opts: &TrainOptions) -> Result<serde_json::Value> {
    let (device, device_note) = crate::precision::resolve_device_noted(&config.device)?;
    let mut precision = crate::precision::parse_precision(&config.precision)?;
    config.check_parallel()?;
    let env = sinter_dist::rendezvous::from_env()
        .context("reading the distributed environment (RANK, WORLD_SIZE, …)")?;
    let mut dist = if opts.dp || config.zero > 0 || env.world_size > 1 {
        let comm = sinter_dist::init(&env, &TcpOptions::default()).with_context(|| {
            format!(
                "rank {} of {} could not join the data-parallel group",
                env.rank, env.world_size
            )
        })?;
        let host = shared(comm);
        let (comm, nccl_grads, _host) = crate::dist_cmd::pick_backend(
            &env,
            host,
            opts.dist_backend,
            device,
            env.rank == 0 && !opts.quiet,
        )?;
        Some(Dist {
            rank: env.rank,
            world: env.world_size,
            comm,
            nccl_grads,
            _host,
        })
    } else {
        None
    };
    let (rank, world) = dist.as_ref().map_or((0, 1), |d| (d.rank, d.world));
    // Only rank 0 writes files and talks.
    let writer = rank == 0;
    let quiet = opts.quiet || !writer;
    for n in [device_note, precision.activate(device)]
        .into_iter()
        .flatten()
    {
        if !quiet {
            eprintln!("{n}");
        }
    }
    let resumed = match &opts.resume {
        Some(dir) => Some(checkpoint::load(dir)?),
        None => None,
    };
    if resumed.is_some() && config.world_size != world {
        // Keep the global batch: the data order, and so the run, stays the same.
        let global = config.batch_size * config.world_size;
        if !global.is_multiple_of(world) {
            bail!("the checkpoint was trained on {} rank(s) at batch {} per rank (global batch {global}), which {world} ranks cannot split evenly; use a number of ranks that divides {global}", config.world_size, config.batch_size);
        }
        if !quiet {
            eprintln!("resharding: the checkpoint was trained on {} rank(s) at batch {} per rank; continuing on {world} rank(s) at batch {} (global batch {global} unchanged)", config.world_size, config.batch_size, global / world);
        }
        config.batch_size = global / world;
    }
    config.world_size = world;
    let mut s = setup(config)?;
    // Before the optimizer or data parallel take hold of the parameters.
    sinter_nn::move_module(s.model.as_ref(), device)
        .with_context(|| format!("moving the model to {device}"))?;
    let params = s.model.parameters();
    let accum = s.config.grad_accum;
    let bucket = bucket_bytes(s.config.bucket_mb);
    let (mut opt, mut dp) = match &mut dist {
        Some(d) if s.config.zero > 0 => {
            let zo = ZeroOptions {
                stage: s.config.zero,
                bucket_bytes: bucket,
                grad_clip: s.config.grad_clip,
            };
            (
                Opt::Zero(Box::new(ZeroOptimizer::new(
                    d.comm.clone(),
                    params.clone(),
                    s.config.lr,
                    zero_algo(&s.config),
                    zo,
                )?)),
                None,
            )
        }
        Some(d) => {
            let mut dp = DataParallel::new(d.comm.clone(), params.clone(), bucket)?;
            if let Some(n) = d.nccl_grads.take() {
                dp.use_nccl(n)?;
            }
            (
                Opt::Plain(make_optimizer(&s.config, params.clone())?),
                Some(dp),
            )
        }
        None => (Opt::Plain(make_optimizer(&s.config, params.clone())?), None),
    };
    // Float buffers (BatchNorm running statistics): each rank updates them from its own data.
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
    let mut loader = DataLoader::new(
        s.train.clone(),
        s.config.batch_size,
        true,
        true,
        s.config.seed,
    )
    .with_shard(rank, world);
    let batches = loader.batches_per_epoch();
    if batches == 0 {
        bail!("data '{}' has {} training examples, fewer than one batch of {} per rank on {world} rank(s); lower --batch-size", s.config.data, s.train.len(), s.config.batch_size);
    }
    let per_epoch = batches / accum;
    if per_epoch == 0 {
        bail!("an epoch has {batches} batches per rank, fewer than --grad-accum {accum}; lower --grad-accum or --batch-size");
    }
    if let Some(e) = s.config.epochs {
        s.config.steps = e * per_epoch;
    }
    if s.config.steps == 0 {
        bail!("nothing to train: --steps or --epochs must be at least 1");
    }
    let total = s.config.steps;
    let mut start = 0;
    if let Some(l) = &resumed {
        let named: Vec<(String, Tensor)> = s
            .model
            .named_tensors()
            .into_iter()
            .map(|t| (t.name, t.tensor))
            .collect();
        // Checkpoints load on the CPU; move them to the run's device first.
        let tensors: std::collections::HashMap<String, Tensor> = l
            .tensors
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.to_device(device)?)))
            .collect::<Result<_>>()?;
        checkpoint::restore_model(&tensors, &named)?;
        opt.get_mut().load_state(
            l.meta.optimizer_steps,
            &checkpoint::optimizer_state(&tensors),
        )?;
        s.rng = Rng::from_state(l.meta.rng);
        *s.dropout_rng.lock().unwrap_or_else(|e| e.into_inner()) =
            Rng::from_state(l.meta.dropout_rng);
        loader = loader.with_position(LoaderPosition::from_u64s(l.meta.loader));
        start = l.meta.step;
        if start >= total {
            bail!("the checkpoint is at step {start}, which is already the end of this run ({total} steps); raise --steps to train further");
        }
    }
    let end = opts.stop_at_step.map_or(total, |s| s.min(total));
    if end <= start {
        bail!("--stop-at-step {end} is not after the checkpoint's step {start}");
    }
    let schedule = LrSchedule::parse(&s.config.schedule, total).expect("validated schedule");
    let out_dir = if writer { opts.out.clone() } else { None };
    let mut log = match &out_dir {
        Some(d) => Some(MetricsLog::open(d, resumed.as_ref().map(|l| l.meta.step))?),
        None => None,
    };
    let lm = s.task == Task::LanguageModel;
    let per_sample = if lm { s.config.context } else { 1 };
    let unit = if lm { "tok/s" } else { "samples/s" };
    let global_batch = s.config.global_batch();
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg} ETA {eta}",
        )
        .expect("valid template"),
    );
    bar.set_position(start);
    if !quiet {
        let how = match (&dist, s.config.zero) {
            (None, _) => String::new(),
            (Some(_), 0) => format!(" on {world} data-parallel rank(s)"),
            (Some(_), z) => format!(" on {world} data-parallel rank(s) with ZeRO-{z}"),
        };
        let batch = if global_batch == s.config.batch_size {
            format!("batch {}", s.config.batch_size)
        } else {
            format!(
                "batch {} per rank × {world} rank(s) × {accum} micro-step(s) = {global_batch}",
                s.config.batch_size
            )
        };
        eprintln!("training {} ({} parameters) on {} ({} examples, {} steps per epoch at {batch}) for {} steps on {device}{how}", s.config.model, s.model.num_parameters(), s.config.data, s.train.len(), per_epoch, total);
    }

    let t0 = Instant::now();
    let (mut last_loss, mut window_loss, mut window_n) = (f64::NAN, 0f64, 0u64);
    let mut window_start = Instant::now();
    let mut last_eval: Option<EvalResult> = None;
    let mut rate = 0.0;
    let eval_every = if s.config.eval_interval > 0 {
        s.config.eval_interval
    } else {
        per_epoch
    };
    let ckpt_every = if s.config.checkpoint_interval > 0 {
        s.config.checkpoint_interval
    } else {
        per_epoch
    };
    let nan_stop = |lv: f64, step: u64, lr: f64| -> anyhow::Error {
        bar.abandon();
        let keep = match &opts.out {
            Some(d) if checkpoint::path_in(d).exists() => {
                format!("the last good checkpoint is kept in {}", d.display())
            }
            _ => "no checkpoint was written".to_string(),
        };
        anyhow!("the training loss became {lv} at step {step} (lr {lr:.3e}); stopping. Lower --lr or add gradient clipping; {keep}")
    };
    for step in start..end {
        opt.get_mut().set_lr(schedule.lr_at(s.config.lr, step));
        let mut loss_sum = 0f64;
        for micro in 0..accum {
            let b = loader.next_batch()?;
            let (x, y) = (
                to_tensor(b.inputs)?.to_device(device)?,
                to_tensor(b.targets)?.to_device(device)?,
            );
            let (loss, _) = {
                let _autocast = precision.enter_autocast();
                batch_loss(s.model.as_ref(), s.task, &x, &y)?
            };
            let lv = loss.to_scalar_f32()? as f64;
            // A single process stops before backward; ranks decide together below.
            if dist.is_none() && !lv.is_finite() {
                return Err(nan_stop(lv, step, opt.get().lr()));
            }
            loss_sum += lv;
            let loss = if accum > 1 {
                loss.mul_scalar(1.0 / accum as f32)?
            } else {
                loss
            };
            let loss = precision.scale_loss(&loss)?;
            // Only the last micro-step communicates.
            let sync = micro + 1 == accum;
            match (&mut opt, &mut dp) {
                (Opt::Zero(z), _) => z.backward_with(&loss, sync)?,
                (_, Some(dp)) => dp.backward_with(&loss, sync)?,
                _ => loss.backward()?,
            }
        }
        let mut lv = loss_sum / accum as f64;
        if let Some(d) = &dist {
            // The mean loss over every rank's batch (all ranks see the same value, so a
            // non-finite loss anywhere stops every rank, before the update).
            lv = d
                .comm
                .all_reduce(vec![lv as f32], ReduceOp::Avg)
                .wait()
                .context("all-reducing the loss")?[0] as f64;
            if !lv.is_finite() {
                return Err(nan_stop(lv, step, opt.get().lr()));
            }
        }
        // fp16: unscale, and skip the update (shrinking the scale) on inf/NaN gradients.
        match (&mut opt, precision.loss_scale()) {
            // ZeRO holds gradient shards: the overflow verdict is agreed over all ranks.
            (Opt::Zero(z), Some(scale)) => {
                let ok = z.unscale_and_check(scale)?;
                precision.set_should_step(ok);
            }
            _ => {
                precision.unscale_and_check(&params)?;
            }
        }
        if precision.should_step() {
            if let (Some(c), Opt::Plain(_)) = (s.config.grad_clip, &opt) {
                // ZeRO clips inside its step, where the gradient shards are.
                clip_grad_norm(&params, c)?;
            }
            opt.get_mut().step()?;
        }
        if let Some(m) = precision.end_step() {
            if !quiet {
                bar.suspend(|| eprintln!("step {}: {m}", step + 1));
            }
        }
        opt.get().zero_grad();
        last_loss = lv;
        window_loss += lv;
        window_n += 1;
        let done = step + 1;
        if done % s.config.log_interval == 0 || done == end {
            let secs = window_start.elapsed().as_secs_f64().max(1e-9);
            rate = (window_n as usize * global_batch * per_sample) as f64 / secs;
            let avg = window_loss / window_n as f64;
            bar.set_message(format!("loss {avg:.4} {rate:.0} {unit}"));
            if let Some(l) = log.as_mut() {
                let key = if lm { "tokens_per_s" } else { "samples_per_s" };
                l.log(&json!({"step": done, "epoch": step / per_epoch, "train_loss": avg, "lr": opt.get().lr(), key: rate, "elapsed_s": t0.elapsed().as_secs_f64()}))?;
            }
            window_loss = 0.0;
            window_n = 0;
            window_start = Instant::now();
        }
        bar.set_position(done);
        if let Some(d) = &dist {
            // Ranks agree on the BatchNorm statistics before they are evaluated or saved.
            let ckpt = opts.out.is_some() && done % ckpt_every == 0;
            if done % eval_every == 0 || done == end || ckpt {
                sinter_dist::data_parallel::average_tensors(&d.comm, &buffers)?;
            }
        }
        if writer && (done % eval_every == 0 || done == end) {
            let e = evaluate(&s, s.config.eval_batches)?;
            let acc = e
                .accuracy
                .map(|a| format!(", val accuracy {:.2}%", a * 100.0))
                .unwrap_or_default();
            let what = if s.config.eval_interval == 0 {
                format!("epoch {}", done / per_epoch)
            } else {
                format!("step {done}")
            };
            bar.suspend(|| {
                if !quiet {
                    eprintln!(
                        "{what}: train loss {last_loss:.4}, val loss {:.4}{acc}",
                        e.loss
                    )
                }
            });
            if let Some(l) = log.as_mut() {
                l.log(&json!({"step": done, "epoch": step / per_epoch, "val_loss": e.loss, "val_accuracy": e.accuracy}))?;
            }
            last_eval = Some(e);
        }
        if opts.out.is_some() && (done % ckpt_every == 0 || done == end) {
            // Every rank takes part in gathering ZeRO's state; rank 0 writes.
            let needs_state = writer || matches!(opt, Opt::Zero(_));
            let state = if needs_state {
                opt.state()?
            } else {
                Vec::new()
            };
            if let Some(d) = &out_dir {
                save_checkpoint(d, &s, &state, opt.get().steps(), done, &loader)?;
            }
        }
    }
    bar.finish_and_clear();
    let wall = t0.elapsed().as_secs_f64();
    if !writer {
        return Ok(json!({"rank": rank, "world_size": world, "steps": end, "wall_time_s": wall}));
    }
    let trained = (end - start) as f64;
    let throughput = trained * (global_batch * per_sample) as f64 / wall.max(1e-9);
    let e = last_eval.expect("the last step always evaluates");
    let mut summary = json!({
        "model": s.config.model, "data": s.config.data, "device": device.to_string(), "steps": end, "total_steps": total,
        "resumed_from_step": resumed.as_ref().map(|l| l.meta.step), "parameters": s.model.num_parameters(),
        "precision": s.config.precision, "peak_device_memory_bytes": crate::precision::peak_device_memory_bytes(device),
        "wall_time_s": wall, "train_loss": last_loss, "val_loss": e.loss, "val_accuracy": e.accuracy,
        "val_examples": e.examples, "batch_size": s.config.batch_size, "lr": s.config.lr, "optimizer": s.config.optimizer,
        "seed": s.config.seed, "threads": rayon::current_num_threads(), "last_logged_rate": rate,
        "world_size": world, "grad_accum": accum, "global_batch_size": global_batch, "zero": s.config.zero,
    });
    summary[if lm { "tokens_per_s" } else { "samples_per_s" }] = json!(throughput);
    if let Opt::Zero(z) = &opt {
        summary["zero_memory"] = serde_json::to_value(z.memory())?;
    }
    if let Some(dp) = &dp {
        summary["gradient_buckets"] = json!(dp.layout().buckets.len());
    }
    if let Some(d) = &out_dir {
        checkpoint::write_atomic(
            &d.join("summary.json"),
            serde_json::to_string_pretty(&summary)?.as_bytes(),
        )?;
        let l = log.take().expect("opened with out");
        plot_losses(
            l.path(),
            &d.join("loss.svg"),
            &format!("{} on {}", s.config.model, s.config.data),
        )
        .context("drawing the loss plot")?;
    }
    if !quiet {
        let acc = e
            .accuracy
            .map(|a| format!(", val accuracy {:.2}%", a * 100.0))
            .unwrap_or_default();
        eprintln!("done: step {end} of {total}; {} steps in {wall:.1} s ({throughput:.0} {unit}); val loss {:.4}{acc}", end - start, e.loss);
        if let Some(d) = &out_dir {
            eprintln!(
                "wrote {}/{{metrics.jsonl, summary.json, loss.svg, {}}}",
                d.display(),
                checkpoint::FILE_NAME
            );
        }
    }
    Ok(summary)
}

/// The model and setup of a checkpoint, with its weights loaded.
pub fn load_for_inference(dir: &Path) -> Result<(Setup, u64)> {
    let l = checkpoint::load(dir)?;
    let s = setup(l.meta.config.clone())?;
    let named: Vec<(String, Tensor)> = s
        .model
        .named_tensors()
        .into_iter()
        .map(|t| (t.name, t.tensor))
        .collect();
    checkpoint::restore_model(&l.tensors, &named)?;
    s.model.set_training(false);
    Ok((s, l.meta.step))
}

/// Samples `max_new` tokens after `prompt` with temperature and top-k; returns all tokens.
pub fn generate(
    s: &Setup,
    prompt: &[i64],
    max_new: usize,
    temperature: f64,
    top_k: usize,
    seed: u64,
) -> Result<Vec<i64>> {
    let _g = no_grad();
    let ctx = s.config.context;
    let mut rng = Rng::new(seed);
    let mut tokens = prompt.to_vec();
    for _ in 0..max_new {
        let window = &tokens[tokens.len().saturating_sub(ctx)..];
        let x = Tensor::from_slice(window, &[1, window.len()], Device::Cpu)?;
        let logits = s.model.forward(&x)?;
        let v = logits.shape()[2];
        let last = logits
            .narrow(1, window.len() - 1, 1)?
            .reshape(&[v])?
            .to_vec_f32()?;
        let next = if temperature <= 0.0 {
            last.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i)
                .unwrap_or(0)
        } else {
            let mut idx: Vec<usize> = (0..v).collect();
            idx.sort_by(|&a, &b| last[b].total_cmp(&last[a]));
            if top_k > 0 {
                idx.truncate(top_k);
            }
            let max = last[idx[0]] as f64;
            let w: Vec<f64> = idx
                .iter()
                .map(|&i| ((last[i] as f64 - max) / temperature).exp())
                .collect();
            let mut u = rng.next_f64() * w.iter().sum::<f64>();
            let mut pick = idx[idx.len() - 1];
            for (j, &wi) in w.iter().enumerate() {
                if u < wi {
                    pick = idx[j];
                    break;
                }
                u -= wi;
            }
            pick
        };
        tokens.push(next as i64);
    }
    Ok(tokens)
}
