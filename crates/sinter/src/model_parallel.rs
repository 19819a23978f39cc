//! `sinter train --tp N | --pp N` for the GPT: tensor parallel (Megatron) or pipeline
//! parallel (GPipe, 1F1B) replicas, data parallel across replicas, on the ranks that
//! `sinter launch` starts. Every rank builds the same initial model from the seed, the
//! parallel trainer shards or stages it. Checkpoints hold the gathered full weights and the
//! gathered full optimizer state in the same canonical layout as data-parallel / ZeRO /
//! single-process checkpoints, so `--resume` works on any layout (TP, PP, DP, one rank), and
//! `eval` / `generate` read them like any other. Gradient clipping uses the global norm over
//! all model-parallel ranks.

use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::json;
use sinter_core::Tensor;
use sinter_data::{DataLoader, LoaderPosition};
use sinter_dist::pipeline::{ParallelSpec, ParallelTrainer, Schedule};
use sinter_dist::TcpOptions;
use sinter_models::{GptConfig, Task};
use sinter_nn::{AdamW, LrSchedule, Optimizer, Sgd};

use crate::checkpoint::{self, Meta};
use crate::config::TrainConfig;
use crate::train::{evaluate, setup, to_tensor, TrainOptions};

/// How the GPT is split: `--tp`, `--pp`, `--micro-batches`, `--schedule`.
#[derive(Clone, Debug)]
pub struct ModelParallel {
    pub tp: usize,
    pub pp: usize,
    pub micro_batches: usize,
    pub schedule: String,
}

pub fn run(
    config: TrainConfig,
    opts: &TrainOptions,
    mp: &ModelParallel,
) -> Result<serde_json::Value> {
    if sinter_models::task_of(&config.model) != Some(Task::LanguageModel) {
        bail!(
            "--tp/--pp split a GPT; model {} is not one (use --dp for other models)",
            config.model
        );
    }
    if config.device.starts_with("cuda") {
        bail!("--tp/--pp run on the CPU in this build (their stages talk over the host communicator); drop --device {} or use --dp for GPUs", config.device);
    }
    if config.precision != "fp32" || opts.cuda_graph {
        bail!("--tp/--pp train in fp32 on the CPU ranks of the host communicator; drop --precision {} / --cuda-graph (mixed precision and CUDA graphs run with --dp or a single process)", config.precision);
    }
    let schedule: Schedule = mp
        .schedule
        .parse()
        .map_err(|e| anyhow!("--schedule: {e}"))?;
    let env = sinter_dist::rendezvous::from_env()
        .context("reading the distributed environment (RANK, WORLD_SIZE, …)")?;
    let inner = mp.tp * mp.pp;
    if inner == 0 || env.world_size % inner != 0 {
        bail!("--tp {} × --pp {} = {inner} ranks per replica does not divide the {} ranks started; launch a multiple of {inner} with `sinter launch --nproc-per-node N -- train …`", mp.tp, mp.pp, env.world_size);
    }
    let spec = ParallelSpec {
        dp: env.world_size / inner,
        tp: mp.tp,
        pp: mp.pp,
        micro_batches: mp.micro_batches,
        schedule,
    };
    let mut comm = sinter_dist::init(&env, &TcpOptions::default()).with_context(|| {
        format!(
            "rank {} of {} could not join the group",
            env.rank, env.world_size
        )
    })?;
    let writer = env.rank == 0;
    let quiet = opts.quiet || !writer;

    let resumed = match &opts.resume {
        Some(dir) => Some(checkpoint::load(dir)?),
        None => None,
    };
    let mut config = config;
    if resumed.is_some() && config.world_size != spec.dp {
        // Keep the global batch (and so the data order) of the run being resumed.
        let global = config.batch_size * config.world_size;
        if !global.is_multiple_of(spec.dp) {
            bail!("the checkpoint was trained with a global batch of {global}, which {} data-parallel replicas cannot split evenly; choose --tp/--pp so that the replicas divide {global}", spec.dp);
        }
        config.batch_size = global / spec.dp;
    }
    // The data-parallel width: what a resumed run (of any layout) needs to keep the global batch.
    config.world_size = spec.dp;
    let s = setup(config)?;
    let mut gcfg = GptConfig::preset(&s.config.model).expect("GPT preset");
    gcfg.vocab_size = gcfg.vocab_size.max(s.train.num_classes().unwrap_or(0));
    gcfg.block_size = gcfg.block_size.max(s.config.context);
    let named_model: Vec<(String, Tensor)> = s
        .model
        .named_tensors()
        .into_iter()
        .map(|t| (t.name, t.tensor))
        .collect();
    let mut start = 0;
    let mut loader_pos = None;
    let mut optim = None;
    if let Some(l) = &resumed {
        // Every rank reads the checkpoint (the full weights and state) and keeps its part.
        checkpoint::restore_model(&l.tensors, &named_model)?;
        start = l.meta.step;
        loader_pos = Some(LoaderPosition::from_u64s(l.meta.loader));
        optim = Some((
            l.meta.optimizer_steps,
            checkpoint::optimizer_state(&l.tensors),
        ));
    }
    let init = s.model.parameters();
    let c = s.config.clone();
    let make = move |params: Vec<(String, Tensor)>| -> sinter_core::Result<Box<dyn Optimizer>> {
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
    };
    let mut trainer = ParallelTrainer::new(&gcfg, &init, &spec, &mut comm, &make)?;
    if let Some((steps, state)) = &optim {
        trainer
            .load_optimizer_state(*steps, state)
            .context("loading the optimizer state of the checkpoint")?;
    }
    trainer.set_grad_clip(s.config.grad_clip);
    // Every rank reads the same global batch; the trainer gives each replica its slice.
    let global_batch = s.config.batch_size * spec.dp;
    let mut loader = DataLoader::new(s.train.clone(), global_batch, true, true, s.config.seed);
    if let Some(p) = loader_pos {
        loader = loader.with_position(p);
    }
    let total = s
        .config
        .steps
        .max(s.config.epochs.unwrap_or(0) * loader.batches_per_epoch());
    if total == 0 {
        bail!("nothing to train: --steps must be at least 1");
    }
    if start >= total {
        bail!("the checkpoint is at step {start}, which is already the end of this run ({total} steps); raise --steps to train further");
    }
    let end = opts.stop_at_step.map_or(total, |x| x.min(total));
    if end <= start {
        bail!("--stop-at-step {end} is not after the checkpoint's step {start}");
    }
    let schedule_lr = LrSchedule::parse(&s.config.lr_schedule, total).expect("validated schedule");
    if !quiet {
        eprintln!("training {} with dp {} × tp {} × pp {} ({} micro-batches, {:?}) on {} ranks for {end} steps", s.config.model, spec.dp, spec.tp, spec.pp, spec.micro_batches, spec.schedule, env.world_size);
        if start > 0 {
            eprintln!("resuming at step {start}");
        }
    }
    let mut log = match (&opts.out, writer) {
        (Some(d), true) => Some(crate::metrics::MetricsLog::open(
            d,
            resumed.as_ref().map(|l| l.meta.step),
        )?),
        _ => None,
    };
    let ckpt_every = if s.config.checkpoint_interval > 0 {
        s.config.checkpoint_interval
    } else {
        u64::MAX
    };
    let t0 = Instant::now();
    let mut last = f64::NAN;
    for step in start..end {
        trainer
            .optimizer_mut()
            .set_lr(schedule_lr.lr_at(s.config.lr, step));
        let b = loader.next_batch()?;
        let loss = trainer.step(&to_tensor(b.inputs)?, &to_tensor(b.targets)?)? as f64;
        if !loss.is_finite() {
            bail!("the training loss became {loss} at step {step}; stopping (lower --lr)");
        }
        last = loss;
        let done = step + 1;
        if let Some(l) = log.as_mut() {
            if done % s.config.log_interval == 0 || done == end {
                l.log(&json!({"step": done, "train_loss": loss, "lr": trainer.optimizer_mut().lr(), "elapsed_s": t0.elapsed().as_secs_f64()}))?;
            }
        }
        if !quiet && (done % s.config.log_interval == 0 || done == end) {
            eprintln!("step {done}/{end}: train loss {loss:.4}");
        }
        if opts.out.is_some() && done % ckpt_every == 0 && done != end {
            save(&mut trainer, &s, &named_model, done, &loader, opts, writer)?;
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    // Collective: every rank takes part; the full weights land in `s.model` on every rank.
    let state = gather_into_model(&mut trainer, &s)?;
    let bubble = trainer
        .pipeline_stats()
        .map(|p| (p.theoretical_bubble, p.measured_bubble));
    if !writer {
        return Ok(json!({}));
    }
    let e = evaluate(&s, s.config.eval_batches)?;
    let tokens = ((end - start) as usize * global_batch * s.config.context) as f64;
    let summary = json!({
        "model": s.config.model, "data": s.config.data, "device": "cpu", "steps": end, "total_steps": total,
        "world_size": env.world_size, "dp": spec.dp, "tp": spec.tp, "pp": spec.pp, "micro_batches": spec.micro_batches,
        "schedule": mp.schedule, "pipeline_bubble_theoretical": bubble.map(|b| b.0), "pipeline_bubble_measured": bubble.map(|b| b.1),
        "wall_time_s": wall, "train_loss": last, "val_loss": e.loss, "tokens_per_s": tokens / wall.max(1e-9),
        "global_batch_size": global_batch, "seed": s.config.seed, "resumed_from_step": resumed.as_ref().map(|l| l.meta.step),
    });
    if let Some(d) = &opts.out {
        write(
            d,
            &s,
            &named_model,
            &state,
            trainer.optimizer_mut().steps(),
            end,
            &loader,
        )?;
        checkpoint::write_atomic(
            &d.join("summary.json"),
            serde_json::to_string_pretty(&summary)?.as_bytes(),
        )?;
    }
    if !quiet {
        eprintln!(
            "done: {end} steps in {wall:.1} s; train loss {last:.4}, val loss {:.4}",
            e.loss
        );
    }
    Ok(summary)
}

/// Gathers the full weights into `s.model` and returns the full optimizer state (canonical
/// layout). Collective: every rank calls it.
fn gather_into_model(
    trainer: &mut ParallelTrainer,
    s: &crate::train::Setup,
) -> Result<Vec<(String, Tensor)>> {
    let full = trainer.gather_weights()?;
    let state = trainer
        .gather_optimizer_state()
        .context("gathering the optimizer state")?;
    let by_name: std::collections::HashMap<String, Tensor> = full.into_iter().collect();
    for (n, t) in &s.model.parameters() {
        let src = by_name
            .get(n)
            .ok_or_else(|| anyhow!("gathered weights lack {n}"))?;
        t.assign(src)
            .with_context(|| format!("loading gathered {n}"))?;
    }
    Ok(state)
}

/// A checkpoint of step `done` (collective gather; rank 0 writes).
fn save(
    trainer: &mut ParallelTrainer,
    s: &crate::train::Setup,
    named: &[(String, Tensor)],
    done: u64,
    loader: &DataLoader,
    opts: &TrainOptions,
    writer: bool,
) -> Result<()> {
    let state = gather_into_model(trainer, s)?;
    if let (Some(d), true) = (&opts.out, writer) {
        let steps = trainer.optimizer_mut().steps();
        write(d, s, named, &state, steps, done, loader)?;
    }
    Ok(())
}

fn write(
    dir: &std::path::Path,
    s: &crate::train::Setup,
    named: &[(String, Tensor)],
    state: &[(String, Tensor)],
    optimizer_steps: u64,
    step: u64,
    loader: &DataLoader,
) -> Result<()> {
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
        // The TP/PP path trains in fp32 (no loss scaler to save).
        precision: None,
    };
    checkpoint::save(dir, named, state, &meta)
}
