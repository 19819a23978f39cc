//! `sinter train --tp N | --pp N` for the GPT: tensor parallel (Megatron) or pipeline
//! parallel (GPipe, 1F1B) replicas, data parallel across replicas, on the ranks that
//! `sinter launch` starts. Every rank builds the same initial model from the seed, the
//! parallel trainer shards or stages it, and at the end the full weights are gathered into an
//! ordinary checkpoint (standard names), which `eval` and `generate` read like any other.

use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::json;
use sinter_core::Tensor;
use sinter_data::DataLoader;
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
    if opts.resume.is_some() {
        bail!("--resume is not supported with --tp/--pp yet: their checkpoints hold the gathered weights but not the sharded optimizer state; evaluate or sample them with `sinter eval` / `sinter generate`");
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

    let s = setup(config)?;
    let mut gcfg = GptConfig::preset(&s.config.model).expect("GPT preset");
    gcfg.vocab_size = gcfg.vocab_size.max(s.train.num_classes().unwrap_or(0));
    gcfg.block_size = gcfg.block_size.max(s.config.context);
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
    // Every rank reads the same global batch; the trainer gives each replica its slice.
    let global_batch = s.config.batch_size * spec.dp;
    let mut loader = DataLoader::new(s.train.clone(), global_batch, true, true, s.config.seed);
    let total = s
        .config
        .steps
        .max(s.config.epochs.unwrap_or(0) * loader.batches_per_epoch());
    if total == 0 {
        bail!("nothing to train: --steps must be at least 1");
    }
    let end = opts.stop_at_step.map_or(total, |x| x.min(total));
    let schedule_lr = LrSchedule::parse(&s.config.lr_schedule, total).expect("validated schedule");
    if !quiet {
        eprintln!("training {} with dp {} × tp {} × pp {} ({} micro-batches, {:?}) on {} ranks for {end} steps", s.config.model, spec.dp, spec.tp, spec.pp, spec.micro_batches, spec.schedule, env.world_size);
        if s.config.grad_clip.is_some() {
            eprintln!("note: gradient clipping is not applied with --tp/--pp");
        }
    }
    let mut log = match (&opts.out, writer) {
        (Some(d), true) => Some(crate::metrics::MetricsLog::open(d, None)?),
        _ => None,
    };
    let t0 = Instant::now();
    let mut last = f64::NAN;
    for step in 0..end {
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
    }
    let wall = t0.elapsed().as_secs_f64();
    // Collective: every rank takes part, rank 0 keeps the full weights.
    let full = trainer.gather_weights()?;
    let bubble = trainer
        .pipeline_stats()
        .map(|p| (p.theoretical_bubble, p.measured_bubble));
    if !writer {
        return Ok(json!({}));
    }
    let named = s.model.parameters();
    let by_name: std::collections::HashMap<String, Tensor> = full.into_iter().collect();
    for (n, t) in &named {
        let src = by_name
            .get(n)
            .ok_or_else(|| anyhow!("gathered weights lack {n}"))?;
        t.assign(src)
            .with_context(|| format!("loading gathered {n}"))?;
    }
    let e = evaluate(&s, s.config.eval_batches)?;
    let tokens = (end as usize * global_batch * s.config.context) as f64;
    let summary = json!({
        "model": s.config.model, "data": s.config.data, "device": "cpu", "steps": end, "total_steps": total,
        "world_size": env.world_size, "dp": spec.dp, "tp": spec.tp, "pp": spec.pp, "micro_batches": spec.micro_batches,
        "schedule": mp.schedule, "pipeline_bubble_theoretical": bubble.map(|b| b.0), "pipeline_bubble_measured": bubble.map(|b| b.1),
        "wall_time_s": wall, "train_loss": last, "val_loss": e.loss, "tokens_per_s": tokens / wall.max(1e-9),
        "global_batch_size": global_batch, "seed": s.config.seed,
    });
    if let Some(d) = &opts.out {
        let tensors: Vec<(String, Tensor)> = s
            .model
            .named_tensors()
            .into_iter()
            .map(|t| (t.name, t.tensor))
            .collect();
        let meta = Meta {
            step: end,
            optimizer_steps: end,
            rng: s.rng.state(),
            dropout_rng: s
                .dropout_rng
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .state(),
            loader: loader.position().to_u64s(),
            config: s.config.clone(),
            precision: None,
        };
        checkpoint::save(d, &tensors, &[], &meta)?;
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
