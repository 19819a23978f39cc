//! The training loop, written once for every strategy (in the spirit of Lightning's Trainer
//! and burn-train's Learner). [`run`] sets a run up — data, model, resume, and a step engine
//! for the strategy ([`engine`]: one process, data parallel, ZeRO, tensor/pipeline parallel,
//! CUDA graphs) — and [`Trainer`] owns the rest: the data loader, when to read the loss,
//! logging, progress, evaluation, checkpoints, the summary and the plot. Only rank 0 evaluates
//! and writes files; checkpoints hold full tensors, so a run resumes on any layout.

mod batch;
mod console;
pub mod engine;
mod eval;
pub mod lora;
mod options;
pub mod pretrained;
mod run_dir;
mod setup;
mod trainer_loop;

use anyhow::{bail, Result};
use sinter_core::{Device, Rng};
use sinter_dist::DistEnv;

pub use batch::to_tensor;
pub use console::Console;
pub use engine::graph::GraphMode;
pub use engine::parallel::ModelParallel;
pub use eval::evaluate;
pub use options::TrainOptions;
pub use run_dir::{checkpoint_meta, save_checkpoint, RUN_FILES};
pub use setup::{info_of, Setup};

use crate::checkpoint::{self, Loaded};
use crate::config::TrainConfig;
use engine::local::{Dist, LocalEngine};
use engine::parallel::{self, ParallelEngine};
use engine::StepEngine;
use trainer_loop::Trainer;

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

/// Trains the run `config` describes; returns its summary.
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
        Device::Cuda(0)
            if ["auto", "cuda", crate::precision::EMULATED].contains(&requested) && gpus > 1 =>
        {
            Device::Cuda(local_rank % gpus)
        }
        d => d,
    }
}

fn run_inner(config: TrainConfig, opts: &TrainOptions) -> Result<serde_json::Value> {
    let env = engine::backend::job_env(opts.dist_backend)?;
    // Only rank 0 writes files and talks.
    let console = Console::new(opts.quiet || env.rank != 0);
    if env.rank == 0 {
        run_dir::prepare_out_dir(opts, &console)?;
    }
    for n in &opts.notes {
        console.note(format!("resume: {n}"));
    }
    let (s, mut engine, resumed) = match &opts.parallel {
        Some(mp) => start_parallel(config, opts, &env, mp, &console)?,
        None => start_local(config, opts, &env, &console)?,
    };
    if let Some(l) = &resumed {
        engine.load_state(
            l.meta.optimizer_steps,
            &checkpoint::optimizer_state(&l.tensors),
            l.meta.precision.as_deref(),
        )?;
    }
    Trainer::new(s, engine, resumed.as_ref(), opts, env.rank == 0, console)?.run()
}

type Started = (Setup, Box<dyn StepEngine>, Option<Loaded>);

/// One process, data parallel or ZeRO.
fn start_local(
    config: TrainConfig,
    opts: &TrainOptions,
    env: &DistEnv,
    console: &Console,
) -> Result<Started> {
    crate::precision::enable_emulation(&config.device, env.local_world_size)?;
    let (device, device_note) = crate::precision::resolve_device_noted(&config.device)?;
    let precision = crate::precision::parse_precision(&config.precision)?;
    config.check_parallel()?;
    let device = if device.is_cuda() && env.world_size > 1 {
        let gpus = sinter_core::cuda::runtime::visible_devices().unwrap_or(1);
        rank_device(&config.device, device, env.local_rank, gpus)
    } else {
        device
    };
    let dist = if opts.dp || config.zero > 0 || env.world_size > 1 {
        let talk = env.rank == 0 && !opts.quiet;
        Some(Dist::join(env, opts.dist_backend, device, talk)?)
    } else {
        None
    };
    for n in [device_note, precision.activate(device)]
        .into_iter()
        .flatten()
    {
        console.note(n);
    }
    let world = dist.as_ref().map_or(1, Dist::world);
    let resumed = load_resume(opts)?;
    let config = keep_global_batch(config, resumed.as_ref(), world, console)?;
    let mut s = setup(config)?;
    restore(&mut s, resumed.as_ref())?;
    let engine = LocalEngine::new(
        &s,
        device,
        precision,
        dist,
        opts.cuda_graph,
        console.clone(),
    )?;
    Ok((s, Box::new(engine), resumed))
}

/// Tensor or pipeline parallel GPT replicas.
fn start_parallel(
    config: TrainConfig,
    opts: &TrainOptions,
    env: &DistEnv,
    mp: &ModelParallel,
    console: &Console,
) -> Result<Started> {
    parallel::check(&config, opts.cuda_graph == GraphMode::On)?;
    let (spec, world) = parallel::join(env, mp, opts.dist_backend)?;
    let resumed = load_resume(opts)?;
    let config = keep_global_batch(config, resumed.as_ref(), spec.dp, console)?;
    let mut s = setup(config)?;
    // Every rank reads the checkpoint (the full weights and state) and keeps its part.
    restore(&mut s, resumed.as_ref())?;
    let engine = ParallelEngine::new(&s, spec, world)?;
    Ok((s, Box::new(engine), resumed))
}

fn load_resume(opts: &TrainOptions) -> Result<Option<Loaded>> {
    opts.resume.as_deref().map(checkpoint::load).transpose()
}

/// A run resumed on another number of data-parallel ranks keeps its global batch, so the data
/// order, and so the run, stays the same.
fn keep_global_batch(
    mut config: TrainConfig,
    resumed: Option<&Loaded>,
    ranks: usize,
    console: &Console,
) -> Result<TrainConfig> {
    if resumed.is_some() && config.world_size != ranks {
        let global = config.batch_size * config.world_size;
        if !global.is_multiple_of(ranks) {
            bail!("the checkpoint was trained on {} data-parallel rank(s) at batch {} per rank (global batch {global}), which {ranks} data-parallel ranks cannot split evenly; use a number of ranks that divides {global}", config.world_size, config.batch_size);
        }
        console.note(format!("resharding: the checkpoint was trained on {} data-parallel rank(s) at batch {} per rank; continuing on {ranks} at batch {} (global batch {global} unchanged)", config.world_size, config.batch_size, global / ranks));
        config.batch_size = global / ranks;
    }
    config.world_size = ranks;
    Ok(config)
}

/// Loads a checkpoint's weights and generators into a freshly built setup.
fn restore(s: &mut Setup, resumed: Option<&Loaded>) -> Result<()> {
    let Some(l) = resumed else { return Ok(()) };
    checkpoint::restore_model(&l.tensors, &s.named_tensors())?;
    s.rng = Rng::from_state(l.meta.rng);
    s.set_dropout_state(l.meta.dropout_rng);
    Ok(())
}

/// The model and data of `config`: a preset built from its seed, or a pretrained model loaded
/// from its path. Every strategy (one process, data parallel, ZeRO, tensor and pipeline
/// parallel), `eval` and `--resume` build their model here.
pub fn setup(config: TrainConfig) -> Result<Setup> {
    match crate::config::pretrained_path(&config.model) {
        Some(path) => {
            let path = path.to_path_buf();
            pretrained::setup_pretrained(config, &path)
        }
        None => setup::setup_preset(config),
    }
}
