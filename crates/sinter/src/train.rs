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
use sinter_core::{no_grad, DType, Device, Rng, Tensor};
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
use sinter_nn::{AdamW, LrSchedule, Module, Optimizer, Sgd, SharedRng, StepControl, TensorKind};

use crate::checkpoint::{self, Meta};
use crate::config::TrainConfig;
use crate::metrics::{plot_losses, MetricsLog};
use crate::precision::Precision;

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
    // Token data serves both next-token (GPT) and masked-token (BERT) training.
    if task.is_sequence() != data_task.is_sequence() {
        bail!("model {} is a {:?} model but data '{}' is {:?} data; pick a matching --model or --data", config.model, task, config.data, data_task);
    }
    let (train, val) = match task {
        Task::Classification => (
            spec.open(Split::Train, 0)?,
            spec.open(Split::Validation, 0)?,
        ),
        Task::LanguageModel | Task::MaskedLm => {
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

/// A batch as host tensors. For masked-LM training the inputs are corrupted with BERT's
/// recipe, from an RNG seeded by `mask_seed` (so a resumed run masks its batches exactly as
/// the uninterrupted one did), and the targets become the original tokens at the selected
/// positions and -100 (ignored) elsewhere.
fn host_batch(s: &Setup, b: sinter_data::Batch, mask_seed: u64) -> Result<(Tensor, Tensor)> {
    if s.task != Task::MaskedLm {
        return Ok((to_tensor(b.inputs)?, to_tensor(b.targets)?));
    }
    let HostData::I64(ids) = &b.inputs.data else {
        bail!(
            "masked-LM training needs token ids, but data '{}' gives floats",
            s.config.data
        );
    };
    let vocab = s.train.num_classes().unwrap_or(0);
    let masking = sinter_models::MlmMasking::for_vocab(vocab);
    let (inputs, labels) = sinter_models::mask_tokens(ids, &masking, &mut Rng::new(mask_seed));
    let shape = &b.inputs.shape;
    Ok((
        Tensor::from_vec(inputs, shape, Device::Cpu)?,
        Tensor::from_vec(labels, shape, Device::Cpu)?,
    ))
}

/// A host batch on `device`. Masked-LM labels stay on the host: the loss picks the masked
/// rows from them without reading the device.
fn upload(s: &Setup, (x, y): &(Tensor, Tensor), device: Device) -> Result<(Tensor, Tensor)> {
    let y = if s.task == Task::MaskedLm {
        y.clone()
    } else {
        y.to_device(device)?
    };
    Ok((x.to_device(device)?, y))
}

/// The masking seed of one batch: distinct per run seed, step, micro-step and rank.
fn mask_seed(seed: u64, step: u64, micro: u64, rank: usize) -> u64 {
    let mut h = seed ^ 0x6d61_736b_6c6d_0001;
    for x in [step, micro, rank as u64] {
        h = (h ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    }
    h
}

/// Loss (and correct predictions, for classifiers) of one batch.
fn batch_loss(
    model: &dyn Module,
    task: Task,
    inputs: &Tensor,
    targets: &Tensor,
) -> Result<(Tensor, Option<usize>)> {
    if task == Task::MaskedLm {
        // BERT runs its MLM head on the masked rows only (about 15% of the positions).
        if let Some(bert) = model
            .as_any()
            .and_then(|m| m.downcast_ref::<sinter_models::Bert>())
        {
            return Ok((bert.mlm_loss(inputs, targets, None, None)?, None));
        }
    }
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
        // Masked-LM targets are -100 except at the masked positions (`host_batch`).
        Task::LanguageModel | Task::MaskedLm => {
            let v = *logits.shape().last().expect("logits have a vocab dim");
            let n = targets.numel();
            let targets = targets.reshape(&[n])?.to_device(logits.device())?;
            Ok((
                logits.reshape(&[n, v])?.cross_entropy(&targets, -100)?,
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
    for i in 0..n {
        let b = loader.next_batch()?;
        let rows = b.inputs.shape[0];
        // Validation masks are the same at every evaluation, so losses compare over time.
        let host = host_batch(s, b, mask_seed(s.config.seed, u64::MAX, i as u64, 0))?;
        let (x, y) = upload(s, &host, device)?;
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
    /// `--cuda-graph`: capture the whole training step as a CUDA graph after warm-up steps and
    /// replay it (CUDA, single process, no dropout; ignored on the CPU).
    pub cuda_graph: bool,
    /// `--dist-backend`: NCCL or the host ring for data parallel / ZeRO.
    pub dist_backend: sinter_dist::BackendChoice,
}

pub fn save_checkpoint(
    dir: &Path,
    s: &Setup,
    optim_state: &[(String, Tensor)],
    optimizer_steps: u64,
    step: u64,
    loader: &DataLoader,
    precision: String,
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
        precision: Some(precision),
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

/// One training step's device work, reading nothing back to the host: forward and backward of
/// every micro-batch (the loss accumulated on the device), then, with a step control block,
/// clip / fp16 unscale-and-skip / update / loss-scale and schedule update as kernels (ZeRO:
/// its own step), and the gradients cleared.
#[allow(clippy::too_many_arguments)]
fn device_step(
    s: &Setup,
    precision: &mut Precision,
    control: Option<&StepControl>,
    opt: &mut Opt,
    dp: &mut Option<DataParallel>,
    inputs: &[(Tensor, Tensor)],
    params: &[(String, Tensor)],
    step_loss: &Tensor,
    loss_acc: &Tensor,
) -> Result<()> {
    let accum = inputs.len();
    for (micro, (x, y)) in inputs.iter().enumerate() {
        let (loss, _) = {
            let _autocast = precision.enter_autocast();
            batch_loss(s.model.as_ref(), s.task, x, y)?
        };
        let loss = if accum > 1 {
            loss.mul_scalar(1.0 / accum as f32)?
        } else {
            loss
        };
        {
            let _g = no_grad();
            let l = loss.detach().to_dtype(DType::F32)?.reshape(&[1])?;
            if micro == 0 {
                step_loss.assign(&l)?;
            } else {
                step_loss.assign(&step_loss.add(&l)?)?;
            }
        }
        let loss = match control {
            Some(c) => c.scale_loss(&loss)?,
            None => precision.scale_loss(&loss)?,
        };
        // Only the last micro-step communicates.
        let sync = micro + 1 == accum;
        match (&mut *opt, dp.as_mut()) {
            (Opt::Zero(z), _) => z.backward_with(&loss, sync)?,
            (_, Some(dp)) => dp.backward_with(&loss, sync)?,
            _ => loss.backward()?,
        }
    }
    {
        let _g = no_grad();
        loss_acc.assign(&loss_acc.add(step_loss)?)?;
    }
    match (&mut *opt, control) {
        (Opt::Plain(o), Some(c)) => {
            c.prepare(params)?;
            o.step_ctl(c.tensor())?;
            c.finish()?;
        }
        // ZeRO holds gradient shards: under fp16 the overflow verdict is agreed over all ranks
        // (the one host read of such a step; its collectives go through the host anyway), and
        // every rank skips or steps together. ZeRO clips inside its step.
        (Opt::Zero(z), _) => {
            let ok = match precision.loss_scale() {
                Some(scale) => z.unscale_and_check(scale)?,
                None => true,
            };
            precision.set_should_step(ok);
            if ok {
                z.step()?;
            }
            precision.end_step();
        }
        (o, _) => o.get_mut().step()?,
    }
    opt.get().zero_grad();
    Ok(())
}

/// What `--cuda-graph` does for a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GraphDecision {
    /// Not asked for.
    Off,
    /// Asked for on the CPU: ignored, with a note.
    IgnoredOnCpu,
    /// Capture after `warmup` eager steps (they warm the allocator's cache and load the
    /// kernels), then replay.
    Capture { warmup: u64 },
}

/// Eager steps before the capture.
pub const GRAPH_WARMUP_STEPS: u64 = 3;

/// Decides `--cuda-graph` from the run's setup: Err (a message for the user) when the step
/// cannot be captured whole. Data-parallel steps all-reduce their gradients through the host
/// between backward kernels, so they are refused. Dropout is checked after the first step
/// ([`dropout_refusal`]); a batch of another shape runs eagerly.
pub fn cuda_graph_decision(
    requested: bool,
    device: Device,
    task: Task,
    data_parallel: bool,
    grad_accum: u64,
) -> std::result::Result<GraphDecision, String> {
    if !requested {
        return Ok(GraphDecision::Off);
    }
    if !device.is_cuda() {
        return Ok(GraphDecision::IgnoredOnCpu);
    }
    if task == Task::MaskedLm {
        return Err("--cuda-graph cannot capture a masked-LM step: each batch masks a different number of tokens, so the MLM head's shapes change every step; drop --cuda-graph".into());
    }
    if data_parallel {
        return Err("--cuda-graph cannot capture a data-parallel or ZeRO step: its gradient all-reduce runs on the host between backward kernels; run a single process or drop --cuda-graph".into());
    }
    if grad_accum == 0 {
        return Err("--cuda-graph needs --grad-accum of at least 1".into());
    }
    Ok(GraphDecision::Capture {
        warmup: GRAPH_WARMUP_STEPS,
    })
}

/// With `--cuda-graph`, a step that drew from the dropout generator means the model uses
/// dropout: its masks are seeded on the host at each forward, so a replayed graph would repeat
/// one mask forever. Returns the message refusing the run.
pub fn dropout_refusal(before: [u64; 4], after: [u64; 4]) -> Option<String> {
    (before != after).then(|| {
        "--cuda-graph cannot be used with this model: it applies dropout (p > 0), whose random masks are drawn on the host at every forward pass, so a replayed CUDA graph would reuse one mask; train without --cuda-graph".to_string()
    })
}

/// Shapes of a step's (inputs, targets) per micro-batch: a replay needs the captured ones.
fn batch_shapes(b: &[(Tensor, Tensor)]) -> Vec<(Vec<usize>, Vec<usize>)> {
    b.iter()
        .map(|(x, y)| (x.shape().to_vec(), y.shape().to_vec()))
        .collect()
}

/// The captured step: the graph and the fixed device buffers its inputs are copied into.
struct Captured {
    graph: sinter_cuda::graph::Graph,
    inputs: Vec<(Tensor, Tensor)>,
    shapes: Vec<(Vec<usize>, Vec<usize>)>,
}

/// `--cuda-graph` over a run: eager warm-up steps, one capture of the whole step (forward,
/// backward, optimizer, loss accumulation, scaler and schedule updates), then replays.
struct GraphRun {
    capture_at: u64,
    captured: Option<Captured>,
    /// Capture failed: the rest of the run is eager.
    off: bool,
}

impl GraphRun {
    fn new(capture_at: u64) -> GraphRun {
        GraphRun {
            capture_at,
            captured: None,
            off: false,
        }
    }

    /// Runs `step` through the graph when it can (capturing it first at the capture step);
    /// false: run it eagerly (warm-up, capture failed, or a batch of another shape).
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        step: u64,
        batches: &[(Tensor, Tensor)],
        device: Device,
        params: &[(String, Tensor)],
        quiet: bool,
        bar: &ProgressBar,
        body: impl FnOnce(&[(Tensor, Tensor)]) -> Result<()>,
    ) -> Result<bool> {
        if self.off || step < self.capture_at {
            return Ok(false);
        }
        if let Some(c) = &self.captured {
            if batch_shapes(batches) != c.shapes {
                return Ok(false);
            }
            // Inputs go into the buffers the graph reads; the graph does the rest.
            for ((fx, fy), (x, y)) in c.inputs.iter().zip(batches) {
                fx.assign(&x.to_device(device)?)?;
                fy.assign(&y.to_device(device)?)?;
            }
            c.graph
                .replay()
                .context("replaying the captured training step")?;
            return Ok(true);
        }
        let Device::Cuda(ordinal) = device else {
            return Ok(false);
        };
        // Fixed input buffers, allocated before the capture (they outlive it).
        let inputs = batches
            .iter()
            .map(|(x, y)| Ok((x.to_device(device)?, y.to_device(device)?)))
            .collect::<Result<Vec<_>>>()?;
        let dev = sinter_cuda::CudaDevice::get(ordinal)?;
        let captured = sinter_cuda::graph::begin_capture(&dev)
            .map_err(anyhow::Error::from)
            .and_then(|cap| {
                body(&inputs)?;
                Ok(cap.finish()?)
            });
        match captured {
            Ok(graph) => {
                // Capturing records the step without running it: run it now.
                graph
                    .replay()
                    .context("running the captured training step")?;
                if !quiet {
                    bar.suspend(|| eprintln!("--cuda-graph: captured the training step at step {}; replaying it from now on", step + 1));
                }
                self.captured = Some(Captured {
                    graph,
                    shapes: batch_shapes(batches),
                    inputs,
                });
                Ok(true)
            }
            Err(e) => {
                // Nothing of the failed capture ran; its gradients were never written.
                for (_, p) in params {
                    p.zero_grad();
                }
                self.off = true;
                if !quiet {
                    bar.suspend(|| eprintln!("--cuda-graph: the training step could not be captured ({e:#}); continuing without CUDA graphs"));
                }
                Ok(false)
            }
        }
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

/// The GPU of one rank: `--device auto` or a bare `cuda` means "this node's GPU number
/// LOCAL_RANK" (wrapping when ranks outnumber GPUs, which then share one), as torchrun users
/// expect; an explicit `cuda:N` is kept.
pub fn rank_device(requested: &str, resolved: Device, local_rank: usize, gpus: usize) -> Device {
    match resolved {
        Device::Cuda(0) if (requested == "auto" || requested == "cuda") && gpus > 1 => {
            Device::Cuda(local_rank % gpus)
        }
        d => d,
    }
}

fn run_inner(mut config: TrainConfig, opts: &TrainOptions) -> Result<serde_json::Value> {
    let (device, device_note) = crate::precision::resolve_device_noted(&config.device)?;
    let mut precision = crate::precision::parse_precision(&config.precision)?;
    config.check_parallel()?;
    let env = sinter_dist::rendezvous::from_env()
        .context("reading the distributed environment (RANK, WORLD_SIZE, …)")?;
    let device = if device.is_cuda() && env.world_size > 1 {
        let gpus = sinter_cuda::runtime::device_count().unwrap_or(1);
        rank_device(&config.device, device, env.local_rank, gpus)
    } else {
        device
    };
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
        if let Some(p) = &l.meta.precision {
            precision.load_state(p)?;
        }
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
    let schedule = LrSchedule::parse(&s.config.lr_schedule, total).expect("validated schedule");
    let out_dir = if writer { opts.out.clone() } else { None };
    let mut log = match &out_dir {
        Some(d) => Some(MetricsLog::open(d, resumed.as_ref().map(|l| l.meta.step))?),
        None => None,
    };
    let lm = s.task.is_sequence();
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

    // The step's decisions live on the device (clip factor, fp16 loss scale and skip flag,
    // learning rate, step count) and the loss accumulates there: a step reads nothing back;
    // the host reads at log / eval / checkpoint boundaries only. ZeRO keeps its own host-side
    // step (it clips inside, over the shards).
    let control = match &opt {
        Opt::Plain(_) => {
            let lrs: Vec<f64> = (0..total).map(|i| schedule.lr_at(s.config.lr, i)).collect();
            let optimizer_steps = resumed.as_ref().map_or(0, |l| l.meta.optimizer_steps);
            Some(
                StepControl::new(
                    device,
                    &lrs,
                    start,
                    optimizer_steps,
                    s.config.grad_clip,
                    precision.scaler(),
                )
                .context("setting up the training step on the device")?,
            )
        }
        Opt::Zero(_) => None,
    };
    opt.get_mut().set_lr(schedule.lr_at(s.config.lr, start));
    let mut graph = match cuda_graph_decision(
        opts.cuda_graph,
        device,
        s.task,
        dist.is_some(),
        accum,
    ) {
        Ok(GraphDecision::Off) => None,
        Ok(GraphDecision::IgnoredOnCpu) => {
            if !quiet {
                eprintln!("--cuda-graph ignored on the CPU: CUDA graphs need a CUDA device (training runs as usual)");
            }
            None
        }
        Ok(GraphDecision::Capture { warmup }) => Some(GraphRun::new(start + warmup)),
        Err(why) => bail!("{why}"),
    };
    // Per-step loss (for `train_loss`) and the running sum since the last read, on the device.
    let loss_acc = Tensor::zeros(&[1], DType::F32, device)?;
    let step_loss = Tensor::zeros(&[1], DType::F32, device)?;
    let mut skipped_seen = 0u64;

    let t0 = Instant::now();
    let (mut last_loss, mut window_loss, mut window_n) = (f64::NAN, 0f64, 0u64);
    let mut pending = 0u64; // steps accumulated in loss_acc since the last read
    let mut window_start = Instant::now();
    let mut last_eval: Option<EvalResult> = None;
    let mut last_grad_norm: Option<f64> = None;
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
    let nan_stop = |lv: f64, first: u64, last: u64| -> anyhow::Error {
        bar.abandon();
        let keep = match &opts.out {
            Some(d) if checkpoint::path_in(d).exists() => {
                format!("the last good checkpoint is kept in {}", d.display())
            }
            _ => "no checkpoint was written".to_string(),
        };
        let when = if first == last {
            format!("at step {last}")
        } else {
            format!("in steps {first}..={last}")
        };
        anyhow!("the training loss became {lv} {when} (lr {:.3e} at step {last}); stopping. Lower --lr or add gradient clipping; {keep}", schedule.lr_at(s.config.lr, last - 1))
    };
    for step in start..end {
        if control.is_none() {
            opt.get_mut().set_lr(schedule.lr_at(s.config.lr, step));
        }
        let mut batches = Vec::with_capacity(accum as usize);
        for micro in 0..accum {
            let b = loader.next_batch()?;
            batches.push(host_batch(
                &s,
                b,
                mask_seed(s.config.seed, step, micro, rank),
            )?);
        }
        let rng_before = s
            .dropout_rng
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .state();
        let mut ran = false;
        if let Some(g) = graph.as_mut() {
            ran = g.run(step, &batches, device, &params, quiet, &bar, |inputs| {
                device_step(
                    &s,
                    &mut precision,
                    control.as_ref(),
                    &mut opt,
                    &mut dp,
                    inputs,
                    &params,
                    &step_loss,
                    &loss_acc,
                )
            })?;
        }
        if !ran {
            let inputs = batches
                .iter()
                .map(|b| upload(&s, b, device))
                .collect::<Result<Vec<_>>>()?;
            device_step(
                &s,
                &mut precision,
                control.as_ref(),
                &mut opt,
                &mut dp,
                &inputs,
                &params,
                &step_loss,
                &loss_acc,
            )?;
        }
        if graph.is_some() {
            let after = s
                .dropout_rng
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .state();
            if let Some(why) = dropout_refusal(rng_before, after) {
                bar.abandon();
                bail!("{why}");
            }
        }
        pending += 1;
        window_n += 1;
        let done = step + 1;
        let log_now = done % s.config.log_interval == 0 || done == end;
        let eval_now = done % eval_every == 0 || done == end;
        let ckpt_now = opts.out.is_some() && (done % ckpt_every == 0 || done == end);
        // Every rank reads at the same steps (the all-reduce below is a collective).
        if log_now || eval_now || ckpt_now {
            let acc = loss_acc.to_vec_f32()?[0] as f64;
            let last = step_loss.to_vec_f32()?[0] as f64;
            let (acc, last) = match &dist {
                Some(d) => {
                    let v = d
                        .comm
                        .all_reduce(vec![acc as f32, last as f32], ReduceOp::Avg)
                        .wait()
                        .context("all-reducing the loss")?;
                    (v[0] as f64, v[1] as f64)
                }
                None => (acc, last),
            };
            if !acc.is_finite() || !last.is_finite() {
                let bad = if last.is_finite() { acc } else { last };
                return Err(nan_stop(bad, done + 1 - pending, done));
            }
            loss_acc.assign(&Tensor::zeros(&[1], DType::F32, device)?)?;
            window_loss += acc;
            last_loss = last;
            pending = 0;
            if let Some(c) = &control {
                let st = c.read()?;
                last_grad_norm = Some(st.grad_norm);
                opt.get_mut().set_steps(st.optimizer_steps);
                opt.get_mut().set_lr(schedule.lr_at(s.config.lr, step));
                precision.set_scaler_state(st.loss_scale, st.good_steps)?;
                if st.skipped_steps > skipped_seen && !quiet {
                    let n = st.skipped_steps - skipped_seen;
                    bar.suspend(|| eprintln!("step {done}: {n} step(s) skipped since the last report (fp16 gradients overflowed); loss scale now {}", st.loss_scale));
                }
                skipped_seen = st.skipped_steps;
            }
        }
        if log_now {
            let secs = window_start.elapsed().as_secs_f64().max(1e-9);
            rate = (window_n as usize * global_batch * per_sample) as f64 / secs;
            let avg = window_loss / window_n as f64;
            bar.set_message(format!("loss {avg:.4} {rate:.0} {unit}"));
            if let Some(l) = log.as_mut() {
                let key = if lm { "tokens_per_s" } else { "samples_per_s" };
                let mut rec = json!({"step": done, "epoch": step / per_epoch, "train_loss": avg, "lr": schedule.lr_at(s.config.lr, step), key: rate, "elapsed_s": t0.elapsed().as_secs_f64()});
                if let Some(n) = last_grad_norm {
                    rec["grad_norm"] = json!(n);
                }
                if let Some(sc) = precision.loss_scale() {
                    rec["loss_scale"] = json!(sc);
                    rec["skipped_steps"] = json!(skipped_seen);
                }
                l.log(&rec)?;
            }
            window_loss = 0.0;
            window_n = 0;
            window_start = Instant::now();
        }
        bar.set_position(done);
        if let Some(d) = &dist {
            // Ranks agree on the BatchNorm statistics before they are evaluated or saved.
            let ckpt = opts.out.is_some() && done % ckpt_every == 0;
            if eval_now || ckpt {
                sinter_dist::data_parallel::average_tensors(&d.comm, &buffers)?;
            }
        }
        if writer && eval_now {
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
        if ckpt_now {
            // Every rank takes part in gathering ZeRO's state; rank 0 writes.
            let needs_state = writer || matches!(opt, Opt::Zero(_));
            let state = if needs_state {
                opt.state()?
            } else {
                Vec::new()
            };
            if let Some(d) = &out_dir {
                save_checkpoint(
                    d,
                    &s,
                    &state,
                    opt.get().steps(),
                    done,
                    &loader,
                    precision.state(),
                )?;
            }
        }
    }
    // The captured graph's memory goes back to the allocator before the summary.
    drop(graph);
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
/// GPT checkpoints generate with the KV cache (each new token runs one position through the
/// blocks) unless `use_cache` is false, which recomputes the whole window per token.
pub fn generate(
    s: &Setup,
    prompt: &[i64],
    max_new: usize,
    temperature: f64,
    top_k: usize,
    seed: u64,
    use_cache: bool,
) -> Result<Vec<i64>> {
    let gpt = s
        .model
        .as_any()
        .and_then(|m| m.downcast_ref::<sinter_models::Gpt>())
        .ok_or_else(|| {
            anyhow!(
                "generate needs a GPT checkpoint; {} cannot generate text",
                s.config.model
            )
        })?;
    let mut rng = Rng::new(seed);
    Ok(gpt.generate_with(
        prompt,
        max_new,
        temperature,
        top_k,
        s.config.context,
        use_cache,
        &mut rng,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_take_their_local_gpu_unless_one_is_named() {
        let c0 = Device::Cuda(0);
        assert_eq!(rank_device("auto", c0, 3, 8), Device::Cuda(3));
        assert_eq!(rank_device("cuda", c0, 5, 8), Device::Cuda(5));
        // More ranks than GPUs: they share, round robin.
        assert_eq!(rank_device("cuda", c0, 9, 8), Device::Cuda(1));
        // One GPU: everyone on it.
        assert_eq!(rank_device("auto", c0, 3, 1), c0);
        // Named devices and the CPU stay.
        assert_eq!(rank_device("cuda:0", c0, 3, 8), c0);
        assert_eq!(
            rank_device("cuda:2", Device::Cuda(2), 3, 8),
            Device::Cuda(2)
        );
        assert_eq!(rank_device("auto", Device::Cpu, 3, 8), Device::Cpu);
    }

    #[test]
    fn cuda_graph_decisions() {
        let cuda = Device::Cuda(0);
        assert_eq!(
            cuda_graph_decision(false, cuda, Task::Classification, true, 1),
            Ok(GraphDecision::Off)
        );
        assert_eq!(
            cuda_graph_decision(true, Device::Cpu, Task::Classification, false, 1),
            Ok(GraphDecision::IgnoredOnCpu)
        );
        // The CPU note wins over what would be refused on CUDA: nothing is captured there.
        assert_eq!(
            cuda_graph_decision(true, Device::Cpu, Task::Classification, true, 1),
            Ok(GraphDecision::IgnoredOnCpu)
        );
        let e = cuda_graph_decision(true, cuda, Task::MaskedLm, false, 1).unwrap_err();
        assert!(e.contains("masked-LM"), "{e}");
        let e = cuda_graph_decision(true, cuda, Task::Classification, true, 1).unwrap_err();
        assert!(
            e.contains("--cuda-graph") && e.contains("data-parallel"),
            "{e}"
        );
        assert_eq!(
            cuda_graph_decision(true, cuda, Task::Classification, false, 4),
            Ok(GraphDecision::Capture {
                warmup: GRAPH_WARMUP_STEPS
            })
        );
        const {
            assert!(
                GRAPH_WARMUP_STEPS >= 1,
                "the pool must be warmed before capturing"
            )
        };
    }

    #[test]
    fn dropout_is_refused_and_shapes_must_match() {
        let a = Rng::new(1).state();
        let mut r = Rng::new(1);
        assert_eq!(dropout_refusal(a, r.state()), None);
        r.next_u64();
        let e = dropout_refusal(a, r.state()).unwrap();
        assert!(e.contains("dropout") && e.contains("--cuda-graph"), "{e}");
        let t = |s: &[usize]| Tensor::zeros(s, DType::F32, Device::Cpu).unwrap();
        let full = vec![(t(&[8, 4]), t(&[8]))];
        let partial = vec![(t(&[3, 4]), t(&[3]))];
        assert_eq!(batch_shapes(&full), batch_shapes(&full.clone()));
        assert_ne!(batch_shapes(&full), batch_shapes(&partial));
    }

    #[test]
    fn graph_run_waits_for_warm_up_and_stays_eager_on_the_cpu() {
        let mut g = GraphRun::new(3);
        let t = |s: &[usize]| Tensor::zeros(s, DType::F32, Device::Cpu).unwrap();
        let b = vec![(t(&[2, 2]), t(&[2]))];
        let bar = ProgressBar::hidden();
        let mut calls = 0;
        for step in 0..5 {
            let ran = g
                .run(step, &b, Device::Cpu, &[], true, &bar, |_| {
                    calls += 1;
                    Ok(())
                })
                .unwrap();
            assert!(!ran, "step {step}: nothing is captured on the CPU");
        }
        assert_eq!(calls, 0, "the step body runs only under a capture");
    }
}
