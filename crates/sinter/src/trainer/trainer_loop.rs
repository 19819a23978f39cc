//! The loop every strategy shares: batches in, a step of the engine, and around it the reads
//! of the loss, logging, progress, evaluation, checkpoints, the summary and the plot.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};
use sinter_core::cpu::hot_workers::HotWorkers;
use sinter_core::Tensor;
use sinter_data::{DataLoader, LoaderPosition};
use sinter_nn::LrSchedule;

use super::batch::{batch_seed, prepare};
use super::engine::{LrPlan, Readout, StepEngine};
use super::eval::{evaluate_until, EvalResult};
use super::{Console, Setup, TrainOptions};
use crate::checkpoint::{self, Loaded};
use crate::metrics::MetricsLog;
use crate::plot::plot_losses;

/// The steps of a run: `start..end` this time, of `total`.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: u64,
    end: u64,
    total: u64,
    per_epoch: u64,
}

impl Span {
    /// The 1-based epoch 0-based step `step` belongs to (as printed and logged).
    fn epoch_of(&self, step: u64) -> u64 {
        step / self.per_epoch + 1
    }
}

/// Every how many steps the trainer logs, evaluates and checkpoints.
#[derive(Clone, Copy, Debug)]
struct Every {
    log: u64,
    eval: u64,
    ckpt: Option<u64>,
}

/// What is due after a step.
#[derive(Clone, Copy, Debug)]
struct Due {
    log: bool,
    eval: bool,
    ckpt: bool,
}

/// Loss and speed since the last log line.
struct Window {
    loss_sum: f64,
    steps: u64,
    since: Instant,
}

/// The run's numbers so far.
struct Progress {
    t0: Instant,
    window: Window,
    /// Steps since the last read (their losses sit on the device).
    pending: u64,
    last_loss: f64,
    rate: f64,
    last_eval: Option<EvalResult>,
}

/// The best validation loss so far (for `--keep-best` and `--early-stop`); saved in
/// checkpoints so a resumed run judges like an uninterrupted one.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
struct Best {
    loss: Option<f64>,
    step: u64,
    /// Evaluations since the last improvement.
    stale: u64,
}

impl Best {
    /// Takes an evaluation's loss; true when it improves on the best by more than `delta`.
    fn observe(&mut self, loss: f64, step: u64, delta: f64) -> bool {
        if self.loss.is_none_or(|b| loss < b - delta) {
            *self = Best {
                loss: Some(loss),
                step,
                stale: 0,
            };
            return true;
        }
        self.stale += 1;
        false
    }
}

pub struct Trainer<'a> {
    s: Setup,
    engine: Box<dyn StepEngine>,
    loader: DataLoader,
    console: Console,
    opts: &'a TrainOptions,
    /// Rank 0: evaluates and writes.
    writer: bool,
    /// Where this rank writes (rank 0 with `--out`).
    out: Option<PathBuf>,
    log: Option<MetricsLog>,
    rank: usize,
    span: Span,
    every: Every,
    lr: LrPlan,
    resumed_from: Option<u64>,
    progress: Progress,
    /// What the last read said (gradient norm, loss scale).
    last_readout: Option<Readout>,
    /// Why the run stopped before its end, if it did.
    stopped: Option<String>,
    best: Best,
}

impl<'a> Trainer<'a> {
    pub fn new(
        mut s: Setup,
        mut engine: Box<dyn StepEngine>,
        resumed: Option<&Loaded>,
        opts: &'a TrainOptions,
        writer: bool,
        console: Console,
    ) -> Result<Trainer<'a>> {
        let shard = engine.loader_shard(&s);
        let mut loader =
            DataLoader::new(s.train.clone(), shard.batch_size, true, true, s.config.seed)
                .with_shard(shard.rank, shard.ranks);
        if let Some(l) = resumed {
            loader = loader.with_position(LoaderPosition::from_u64s(l.meta.loader));
        }
        let span = span(&mut s, &loader, engine.as_ref(), resumed, opts)?;
        let lr = LrPlan {
            schedule: LrSchedule::parse(&s.config.lr_schedule, span.total)
                .ok_or_else(|| anyhow!("unknown lr-schedule '{}'", s.config.lr_schedule))?,
            base: s.config.lr,
        };
        engine.begin(&s, span.start, span.total, lr.clone())?;
        let out = opts.out.clone().filter(|_| writer);
        let log = match &out {
            Some(d) => Some(MetricsLog::open(d, resumed.map(|l| l.meta.step))?),
            None => None,
        };
        let every = Every {
            log: s.config.log_interval.max(1),
            eval: match s.config.eval_interval {
                0 => span.per_epoch,
                n => n,
            },
            ckpt: opts
                .out
                .as_ref()
                .map(|_| match s.config.checkpoint_interval {
                    0 => span.per_epoch,
                    n => n,
                }),
        };
        Ok(Trainer {
            s,
            engine,
            loader,
            console,
            opts,
            writer,
            out,
            log,
            rank: shard.rank,
            span,
            every,
            lr,
            resumed_from: resumed.map(|l| l.meta.step),
            progress: Progress {
                t0: Instant::now(),
                window: Window {
                    loss_sum: 0.0,
                    steps: 0,
                    since: Instant::now(),
                },
                pending: 0,
                last_loss: f64::NAN,
                rate: 0.0,
                last_eval: None,
            },
            last_readout: None,
            stopped: None,
            best: resumed
                .and_then(|l| l.meta.trainer.as_deref())
                .and_then(|j| serde_json::from_str(j).ok())
                .unwrap_or_default(),
        })
    }

    pub fn run(mut self) -> Result<Value> {
        self.announce();
        self.console.start_bar(self.span.start, self.span.total);
        self.progress.t0 = Instant::now();
        self.progress.window.since = Instant::now();
        let mut step = self.span.start;
        while step < self.span.end {
            self.train_step(step)?;
            step += 1;
            injected_fault(self.rank, step);
        }
        self.engine.end();
        self.finish()
    }

    /// The line that starts a run.
    fn announce(&self) {
        let (s, span) = (&self.s, &self.span);
        let global = self.engine.global_batch(s);
        let batch = if global == s.config.batch_size {
            format!("batch {}", s.config.batch_size)
        } else {
            format!(
                "batch {} per rank × {} rank(s) × {} micro-step(s) = {global}",
                s.config.batch_size,
                global / (s.config.batch_size * s.config.grad_accum as usize).max(1),
                s.config.grad_accum
            )
        };
        self.console.note(format!(
            "training {} ({} parameters) on {} ({} examples, {} steps per epoch at {batch}) for {} steps on {}{}",
            s.config.model,
            s.model.num_parameters(),
            s.config.data,
            s.train.len(),
            span.per_epoch,
            span.total,
            self.engine.device(),
            self.engine.describe()
        ));
        if let Some(from) = self.resumed_from {
            self.console.note(format!("resuming at step {from}"));
        }
        self.check_early_stop();
    }

    /// `--early-stop N` needs N evaluations after the first: say so when the run makes fewer.
    fn check_early_stop(&self) {
        let (n, total, every) = (self.s.config.early_stop, self.span.total, self.every.eval);
        // Every `every` steps, and at the last step.
        let evals = total / every + u64::from(!total.is_multiple_of(every));
        if n > 0 && evals <= n {
            let when = match self.s.config.eval_interval {
                0 => format!("once per epoch of {every} steps"),
                _ => format!("every {every} steps"),
            };
            self.console.note(format!("--early-stop {n} cannot stop this run: it evaluates {evals} time(s) in {total} steps ({when}, and at the end), and stopping needs {} evaluations; lower --eval-interval", n + 1));
        }
    }

    /// This step's micro-batches, prepared by the model on the host.
    fn next_batches(&mut self, step: u64) -> Result<Vec<(Tensor, Tensor)>> {
        let n = self.engine.batches_per_step(&self.s);
        (0..n)
            .map(|micro| {
                let b = self.loader.next_batch()?;
                prepare(
                    &self.s,
                    b,
                    batch_seed(self.s.config.seed, step, micro, self.rank),
                )
            })
            .collect()
    }

    fn due(&self, done: u64) -> Due {
        let last = done == self.span.end;
        Due {
            log: done.is_multiple_of(self.every.log) || last,
            eval: done.is_multiple_of(self.every.eval) || last,
            ckpt: self
                .every
                .ckpt
                .is_some_and(|c| done.is_multiple_of(c) || last),
        }
    }

    fn train_step(&mut self, step: u64) -> Result<()> {
        let batches = self.next_batches(step)?;
        {
            // The step's parallel ops find the other workers awake (cpu/hot_workers.rs); not
            // with other ranks, which may share this machine's cores.
            let _hot = (self.engine.world_size() == 1).then(HotWorkers::engage);
            self.engine.step(&self.s, step, &batches)?;
        }
        self.progress.pending += 1;
        self.progress.window.steps += 1;
        let done = step + 1;
        let mut due = self.due(done);
        // Every rank reads at the same steps (the read is a collective); a single process
        // asked to stop reads (and so stops) at once.
        let alone = self.engine.world_size() == 1;
        if due.log || due.eval || due.ckpt || (alone && stop_requested()) {
            let stopping = self.read(step)?;
            if stopping && done < self.span.end {
                let why = stop_reason();
                self.console.note(format!("stopping at step {done}: {why}"));
                self.stopped = Some(why);
                self.span.end = done;
                due = self.due(done);
            }
        }
        if due.log {
            self.log_step(step)?;
        }
        self.console.set_position(done);
        if due.eval || due.ckpt {
            self.engine.sync_model(&self.s)?;
        }
        let mut best = false;
        if due.eval {
            let fresh = self.evaluate(step)?;
            let (improved, stop) = self.judge(done, fresh)?;
            best = improved && self.s.config.keep_best;
            if stop && done < self.span.end {
                let b = self.best;
                let why = format!("the validation loss has not improved for {} evaluations (best {:.4} at step {})", b.stale, b.loss.unwrap_or(f64::NAN), b.step);
                self.console
                    .note(format!("stopping early at step {done}: {why}"));
                self.stopped = Some(why);
                self.span.end = done;
                if !due.log {
                    self.log_step(step)?;
                }
                due = self.due(done);
            }
        }
        if due.ckpt || best {
            self.checkpoint(done, due.ckpt, best)?;
        }
        Ok(())
    }

    /// Reads the loss since the last read (stopping the run on NaN/inf); returns whether the
    /// run should stop here.
    fn read(&mut self, step: u64) -> Result<bool> {
        let r: Readout = self.engine.read(&self.s, step, stop_requested())?;
        let done = step + 1;
        if !(r.loss_sum.is_finite() && r.last_loss.is_finite()) {
            let bad = if r.last_loss.is_finite() {
                r.loss_sum
            } else {
                r.last_loss
            };
            return Err(self.diverged(bad, done + 1 - self.progress.pending, done));
        }
        if r.newly_skipped > 0 {
            self.console.note(format!("step {done}: {} step(s) skipped since the last report (fp16 gradients overflowed); loss scale now {}", r.newly_skipped, r.loss_scale.unwrap_or(1.0)));
        }
        self.progress.window.loss_sum += r.loss_sum;
        self.progress.last_loss = r.last_loss;
        self.progress.pending = 0;
        self.last_readout = Some(r);
        Ok(r.stop)
    }

    /// The error that ends a run whose loss became NaN or infinite in steps `first..=last`.
    fn diverged(&self, value: f64, first: u64, last: u64) -> anyhow::Error {
        self.console.abandon();
        let keep = match &self.opts.out {
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
        anyhow!("the training loss became {value} {when} (lr {:.3e} at step {last}); stopping. Lower --lr or add gradient clipping; {keep}", self.lr.at(last - 1))
    }

    fn throughput_key(&self) -> &'static str {
        if self.s.task.is_sequence() {
            "tokens_per_s"
        } else {
            "samples_per_s"
        }
    }

    /// Examples (or tokens) per step over all ranks.
    fn per_step_units(&self) -> f64 {
        let per_sample = if self.s.task.is_sequence() {
            self.s.config.context
        } else {
            1
        };
        (self.engine.global_batch(&self.s) * per_sample) as f64
    }

    fn log_step(&mut self, step: u64) -> Result<()> {
        let units = self.per_step_units();
        let key = self.throughput_key();
        let w = &mut self.progress.window;
        let secs = w.since.elapsed().as_secs_f64().max(1e-9);
        let steps = w.steps.max(1);
        let avg = w.loss_sum / steps as f64;
        let rate = steps as f64 * units / secs;
        *w = Window {
            loss_sum: 0.0,
            steps: 0,
            since: Instant::now(),
        };
        self.progress.rate = rate;
        let unit = if self.s.task.is_sequence() {
            "tok/s"
        } else {
            "samples/s"
        };
        self.console
            .set_message(format!("loss {avg:.4} {rate:.0} {unit}"));
        let Some(log) = self.log.as_mut() else {
            return Ok(());
        };
        let mut rec = json!({"step": step + 1, "epoch": self.span.epoch_of(step), "train_loss": avg, "lr": self.lr.at(step), "elapsed_s": self.progress.t0.elapsed().as_secs_f64()});
        rec[key] = json!(rate);
        if let Some(r) = &self.last_readout {
            if let Some(n) = r.grad_norm {
                rec["grad_norm"] = json!(n);
            }
            if let Some(sc) = r.loss_scale {
                rec["loss_scale"] = json!(sc);
                rec["skipped_steps"] = json!(r.skipped_steps);
            }
        }
        log.log(&rec)
    }

    /// Evaluates (rank 0) and returns the result, or `None` on the other ranks and when a stop
    /// was asked during the pass (the run then checkpoints at once; see `evaluate_until`).
    fn evaluate(&mut self, step: u64) -> Result<Option<EvalResult>> {
        if !self.writer {
            return Ok(None);
        }
        let done = step + 1;
        let what = if self.s.config.eval_interval == 0 {
            format!("epoch {}", self.span.epoch_of(step))
        } else {
            format!("step {done}")
        };
        let Some(e) = evaluate_until(&self.s, self.s.config.eval_batches, stop_requested)? else {
            self.console
                .note(format!("{what}: evaluation skipped: {}", stop_reason()));
            return Ok(None);
        };
        self.console.note(format!(
            "{what}: train loss {:.4}, val loss {:.4}{} ({})",
            self.progress.last_loss,
            e.loss,
            e.accuracy_text(),
            e.coverage()
        ));
        if let Some(l) = self.log.as_mut() {
            l.log(&json!({"step": done, "epoch": self.span.epoch_of(step), "val_loss": e.loss, "val_accuracy": e.accuracy}))?;
        }
        self.progress.last_eval = Some(e);
        Ok(Some(e))
    }

    /// Whether this evaluation improved the best validation loss, and whether the run should
    /// stop early; rank 0 judges `fresh` (none: a skipped evaluation, which changes nothing),
    /// every rank follows (collective where it matters).
    fn judge(&mut self, done: u64, fresh: Option<EvalResult>) -> Result<(bool, bool)> {
        let c = &self.s.config;
        let (mut improved, mut stop) = (false, false);
        if let (true, Some(e)) = (self.writer, fresh) {
            improved = self.best.observe(e.loss, done, c.early_stop_delta);
            stop = c.early_stop > 0 && self.best.stale >= c.early_stop;
        }
        if c.keep_best {
            improved = self.engine.agree(improved)?;
        }
        if c.early_stop > 0 {
            stop = self.engine.agree(stop)?;
        }
        Ok((improved, stop))
    }

    /// Writes the checkpoint of step `done`: the latest (with `--keep-last` copies) and/or
    /// the best.
    fn checkpoint(&mut self, done: u64, latest: bool, best: bool) -> Result<()> {
        let (optimizer_steps, state) = self.engine.checkpoint_state(self.writer)?;
        let Some(dir) = &self.out else {
            return Ok(());
        };
        let meta = super::checkpoint_meta(
            &self.s,
            done,
            optimizer_steps,
            &self.loader,
            self.engine.precision_state(),
            Some(serde_json::to_string(&self.best)?),
        );
        let bytes = checkpoint::to_bytes(&self.s.named_tensors(), &state, &meta)?;
        if latest {
            checkpoint::write_atomic(&checkpoint::path_in(dir), &bytes)?;
            checkpoint::keep_last(dir, done, self.s.config.keep_last)?;
        }
        if best {
            checkpoint::write_atomic(&dir.join(checkpoint::BEST_FILE), &bytes)?;
        }
        Ok(())
    }

    fn finish(self) -> Result<Value> {
        self.console.finish();
        let wall = self.progress.t0.elapsed().as_secs_f64();
        if !self.writer {
            return Ok(
                json!({"rank": self.rank, "world_size": self.engine.world_size(), "steps": self.span.end, "wall_time_s": wall}),
            );
        }
        let summary = self.summary(wall)?;
        if let Some(d) = &self.out {
            write_outputs(d, &summary, self.log.as_ref(), &self.s)?;
        }
        for dir in super::lora::export_dirs(
            &self.s,
            self.out.as_deref(),
            self.opts.export_adapter.as_deref(),
        ) {
            super::lora::export_run(&self.s, &dir)?;
            self.console.note(format!(
                "adapter written to {} (PEFT format)",
                dir.display()
            ));
        }
        self.final_line(&summary, wall);
        Ok(summary)
    }

    fn summary(&self, wall: f64) -> Result<Value> {
        let (s, span) = (&self.s, &self.span);
        // A run stopped from outside before its first evaluation has none to report.
        let e = self.progress.last_eval;
        if e.is_none() && self.stopped.is_none() {
            bail!("the run ended without an evaluation");
        }
        let trained = (span.end - span.start) as f64;
        let mut summary = json!({
            "model": s.config.model, "data": s.config.data, "device": self.engine.device().to_string(), "steps": span.end, "total_steps": span.total,
            "resumed_from_step": self.resumed_from, "parameters": s.model.num_parameters(),
            "precision": s.config.precision,
            "wall_time_s": wall, "train_loss": self.progress.last_loss, "val_loss": e.map(|e| e.loss), "val_accuracy": e.and_then(|e| e.accuracy),
            "val_examples": e.map(|e| e.examples), "val_batches": e.map(|e| e.batches), "val_batches_total": e.map(|e| e.total_batches),
            "batch_size": s.config.batch_size, "lr": s.config.lr, "optimizer": s.config.optimizer,
            "seed": s.config.seed, "threads": rayon::current_num_threads(), "last_logged_rate": self.progress.rate,
            "world_size": self.engine.world_size(), "grad_accum": s.config.grad_accum, "global_batch_size": self.engine.global_batch(s),
        });
        summary[self.throughput_key()] = json!(trained * self.per_step_units() / wall.max(1e-9));
        summary["stopped_early"] = json!(self.stopped);
        self.engine.summarize(&mut summary);
        Ok(summary)
    }

    fn final_line(&self, summary: &Value, wall: f64) {
        let val = match &self.progress.last_eval {
            Some(e) => format!(
                "val loss {:.4}{} over {}",
                e.loss,
                e.accuracy_text(),
                e.coverage()
            ),
            None => "not evaluated".into(),
        };
        let unit = if self.s.task.is_sequence() {
            "tok/s"
        } else {
            "samples/s"
        };
        let rate = summary[self.throughput_key()].as_f64().unwrap_or(0.0);
        self.console.note(format!(
            "done: step {} of {}; {} steps in {wall:.1} s ({rate:.0} {unit}); {val}",
            self.span.end,
            self.span.total,
            self.span.end - self.span.start,
        ));
        if let Some(d) = &self.out {
            self.console.note(format!(
                "wrote {}/{{{}}}",
                d.display(),
                written(d).join(", ")
            ));
            if self.stopped.is_some() {
                self.console.note(format!(
                    "continue with: sinter train --resume {}",
                    d.display()
                ));
            }
        }
    }
}

/// The run's files in `dir` (best.safetensors and the kept copies only when there are some).
fn written(dir: &std::path::Path) -> Vec<String> {
    let mut files: Vec<String> = super::RUN_FILES
        .iter()
        .filter(|f| dir.join(f).exists())
        .map(|f| f.to_string())
        .collect();
    let mut kept: Vec<u64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| checkpoint::kept_step(&e.file_name().to_string_lossy()))
        .collect();
    kept.sort_unstable();
    files.extend(
        kept.iter()
            .map(|s| format!("checkpoint-step{s}.safetensors")),
    );
    files
}

/// summary.json and loss.svg.
fn write_outputs(dir: &Path, summary: &Value, log: Option<&MetricsLog>, s: &Setup) -> Result<()> {
    checkpoint::write_atomic(
        &dir.join("summary.json"),
        serde_json::to_string_pretty(summary)?.as_bytes(),
    )?;
    if let Some(l) = log {
        plot_losses(
            l.path(),
            &dir.join("loss.svg"),
            &format!("{} on {}", s.config.model, s.config.data),
        )
        .map_err(|e| e.context("drawing the loss plot"))?;
    }
    Ok(())
}

/// Whether this process was asked to stop (a signal, or its output went away).
fn stop_requested() -> bool {
    crate::signals::requested().is_some() || crate::term::output_closed()
}

fn stop_reason() -> String {
    match crate::signals::requested() {
        Some(sig) => format!(
            "{} received (send it again to exit at once)",
            crate::signals::name(sig)
        ),
        None if crate::term::output_closed() => "the output was closed".into(),
        None => "another rank was asked to stop".into(),
    }
}

/// The steps of the run: the total from `--steps` or `--epochs`, where a resumed run starts,
/// and where this invocation stops.
fn span(
    s: &mut Setup,
    loader: &DataLoader,
    engine: &dyn StepEngine,
    resumed: Option<&Loaded>,
    opts: &TrainOptions,
) -> Result<Span> {
    let batches = loader.batches_per_epoch();
    let shard = engine.loader_shard(s);
    if batches == 0 {
        bail!("data '{}' has {} training examples, fewer than one batch of {} per rank on {} rank(s); lower --batch-size", s.config.data, s.train.len(), shard.batch_size, shard.ranks);
    }
    let accum = engine.batches_per_step(s);
    let per_epoch = batches / accum;
    if per_epoch == 0 {
        bail!("an epoch has {batches} batches per rank, fewer than --grad-accum {accum}; lower --grad-accum or --batch-size");
    }
    if let Some(e) = s.config.epochs {
        s.config.steps = e.checked_mul(per_epoch).ok_or_else(|| anyhow!("--epochs {e} × {per_epoch} steps per epoch is more steps than can be counted (2^64); lower --epochs"))?;
    }
    let total = s.config.steps;
    if total == 0 {
        bail!("nothing to train: --steps or --epochs must be at least 1");
    }
    let start = resumed.map_or(0, |l| l.meta.step);
    if start >= total {
        bail!("the checkpoint is at step {start}, which is already the end of this run ({total} steps); raise --steps to train further");
    }
    let end = opts.stop_at_step.map_or(total, |x| x.min(total));
    if end <= start {
        bail!("--stop-at-step {end} is not after the checkpoint's step {start}");
    }
    Ok(Span {
        start,
        end,
        total,
        per_epoch,
    })
}

/// Test-only fault for `sinter launch --max-restarts`: with
/// `SINTER_TEST_EXIT_AFTER_STEP=<rank>:<step>`, that rank exits with code 17 once it has
/// finished the step, in the first start only (`SINTER_RESTART_ROUND` unset or 0), so the
/// restarted group runs through.
fn injected_fault(rank: usize, done_steps: u64) {
    let Ok(spec) = std::env::var("SINTER_TEST_EXIT_AFTER_STEP") else {
        return;
    };
    let first_start =
        std::env::var(sinter_dist::elastic::RESTART_ROUND_VAR).map_or(true, |r| r.trim() == "0");
    if first_start && spec.trim() == format!("{rank}:{done_steps}") {
        eprintln!("SINTER_TEST_EXIT_AFTER_STEP: rank {rank} exits after step {done_steps}");
        std::process::exit(17);
    }
}
