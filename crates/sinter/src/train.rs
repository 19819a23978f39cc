//! The training loop: data → model → loss → backward → clip → optimizer, with evaluation,
//! metrics, checkpoints and exact resume.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use sinter_core::{no_grad, Device, Rng, Tensor};
use sinter_data::{DataKind, DataLoader, DataSpec, Dataset, HostArray, HostData, LoaderPosition, OpenOptions, Split, Windows};
use sinter_models::{DataShape, Task};
use sinter_nn::module::shared_rng;
use sinter_nn::{clip_grad_norm, AdamW, LrSchedule, Module, Optimizer, SharedRng, Sgd};

use crate::checkpoint::{self, Meta};
use crate::config::TrainConfig;
use crate::metrics::{plot_losses, MetricsLog};

/// `auto` → the CPU until the CUDA backend is wired into tensors; `cuda` is a clear error.
pub fn resolve_device(name: &str) -> Result<Device> {
    match name {
        "auto" => Ok(Device::Cpu),
        other => {
            let d = Device::parse(other).ok_or_else(|| anyhow!("unknown device '{other}'; valid devices: auto, cpu, cuda, cuda:N"))?;
            if let Device::Cuda(_) = d {
                bail!("device {d} is not available: this build's tensors run on the CPU only (the CUDA backend is not wired into tensor storage yet); use --device cpu or auto");
            }
            Ok(d)
        }
    }
}

pub fn to_tensor(a: &HostArray) -> Result<Tensor> {
    Ok(match &a.data {
        HostData::F32(v) => Tensor::from_slice(v, &a.shape, Device::Cpu)?,
        HostData::I64(v) => Tensor::from_slice(v, &a.shape, Device::Cpu)?,
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
        Task::Classification => (spec.open(Split::Train, 0)?, spec.open(Split::Validation, 0)?),
        Task::LanguageModel => {
            let mut o = OpenOptions::new(config.context);
            let train = spec.open_with(Split::Train, &o)?;
            o.windows = Windows::Strided;
            (train, spec.open_with(Split::Validation, &o)?)
        }
    };
    let classes = train.num_classes().ok_or_else(|| anyhow!("data '{}' does not say how many classes it has", config.data))?;
    let mut rng = Rng::new(config.seed);
    let dropout_rng = shared_rng(config.seed ^ 0x5eed);
    let model = sinter_models::build(&config.model, &DataShape { input: train.input_shape(), classes }, &mut rng, &dropout_rng)?;
    Ok(Setup { config, task, model, train, val, rng, dropout_rng })
}

fn make_optimizer(c: &TrainConfig, params: Vec<(String, Tensor)>) -> Result<Box<dyn Optimizer>> {
    Ok(match c.optimizer.as_str() {
        "sgd" => Box::new(Sgd::new(params, c.lr, c.momentum, c.momentum > 0.0, c.weight_decay)?),
        _ => Box::new(AdamW::new(params, c.lr, c.weight_decay)?),
    })
}

/// Loss (and correct predictions, for classifiers) of one batch.
fn batch_loss(model: &dyn Module, task: Task, inputs: &Tensor, targets: &Tensor) -> Result<(Tensor, Option<usize>)> {
    let logits = model.forward(inputs)?;
    match task {
        Task::Classification => {
            let loss = logits.cross_entropy(targets, -100)?;
            let correct = if sinter_core::is_grad_enabled() { None } else { Some(logits.argmax(-1, false)?.eq(targets)?.to_vec_i64()?.iter().sum::<i64>() as usize) };
            Ok((loss, correct))
        }
        Task::LanguageModel => {
            let v = *logits.shape().last().expect("logits have a vocab dim");
            let n = targets.numel();
            Ok((logits.reshape(&[n, v])?.cross_entropy(&targets.reshape(&[n])?, -100)?, None))
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
    let _g = no_grad();
    s.model.set_training(false);
    let bs = s.config.batch_size.max(1);
    let mut loader = DataLoader::new(s.val.clone(), bs, false, false, 0);
    let n = if max_batches == 0 { loader.batches_per_epoch() as usize } else { (loader.batches_per_epoch() as usize).min(max_batches) };
    let (mut total, mut correct, mut count) = (0f64, 0usize, 0usize);
    for _ in 0..n {
        let b = loader.next_batch()?;
        let (x, y) = (to_tensor(&b.inputs)?, to_tensor(&b.targets)?);
        let (loss, c) = batch_loss(s.model.as_ref(), s.task, &x, &y)?;
        let rows = b.inputs.shape[0];
        total += loss.to_scalar_f32()? as f64 * rows as f64;
        correct += c.unwrap_or(0);
        count += rows;
    }
    s.model.set_training(true);
    let count_f = count.max(1) as f64;
    Ok(EvalResult { loss: total / count_f, accuracy: (s.task == Task::Classification).then(|| correct as f64 / count_f), examples: count })
}

pub struct TrainOptions {
    pub out: Option<PathBuf>,
    pub resume: Option<PathBuf>,
    pub quiet: bool,
    /// Stop (evaluating and checkpointing) after this step, for time-boxed jobs; `--resume`
    /// continues the same run later.
    pub stop_at_step: Option<u64>,
}


fn save_checkpoint(dir: &Path, s: &Setup, opt: &dyn Optimizer, step: u64, loader: &DataLoader) -> Result<()> {
    let named: Vec<(String, Tensor)> = s.model.named_tensors().into_iter().map(|t| (t.name, t.tensor)).collect();
    let meta = Meta {
        step,
        optimizer_steps: opt.steps(),
        rng: s.rng.state(),
        dropout_rng: s.dropout_rng.lock().unwrap_or_else(|e| e.into_inner()).state(),
        loader: loader.position().to_u64s(),
        config: s.config.clone(),
    };
    checkpoint::save(dir, &named, &opt.state(), &meta)
}

pub fn run(config: TrainConfig, opts: &TrainOptions) -> Result<serde_json::Value> {
    let device = resolve_device(&config.device)?;
    if config.device == "auto" && !opts.quiet {
        eprintln!("device auto: using the CPU ({} threads); no CUDA backend in tensor storage yet", rayon::current_num_threads());
    }
    let resumed = match &opts.resume {
        Some(dir) => Some(checkpoint::load(dir)?),
        None => None,
    };
    let mut s = setup(config)?;
    let params = s.model.parameters();
    let mut opt = make_optimizer(&s.config, params.clone())?;
    let mut loader = DataLoader::new(s.train.clone(), s.config.batch_size, true, true, s.config.seed);
    let per_epoch = loader.batches_per_epoch();
    if per_epoch == 0 {
        bail!("data '{}' has {} training examples, fewer than one batch of {}; lower --batch-size", s.config.data, s.train.len(), s.config.batch_size);
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
        let named: Vec<(String, Tensor)> = s.model.named_tensors().into_iter().map(|t| (t.name, t.tensor)).collect();
        checkpoint::restore_model(&l.tensors, &named)?;
        opt.load_state(l.meta.optimizer_steps, &checkpoint::optimizer_state(&l.tensors))?;
        s.rng = Rng::from_state(l.meta.rng);
        *s.dropout_rng.lock().unwrap_or_else(|e| e.into_inner()) = Rng::from_state(l.meta.dropout_rng);
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
    let mut log = match &opts.out {
        Some(d) => Some(MetricsLog::open(d, resumed.as_ref().map(|l| l.meta.step))?),
        None => None,
    };
    let lm = s.task == Task::LanguageModel;
    let per_sample = if lm { s.config.context } else { 1 };
    let unit = if lm { "tok/s" } else { "samples/s" };
    let bar = if opts.quiet { ProgressBar::hidden() } else { ProgressBar::new(total) };
    bar.set_style(ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg} ETA {eta}").expect("valid template"));
    bar.set_position(start);
    if !opts.quiet {
        eprintln!("training {} ({} parameters) on {} ({} examples, {} per epoch at batch {}) for {} steps on {device}", s.config.model, s.model.num_parameters(), s.config.data, s.train.len(), per_epoch, s.config.batch_size, total);
    }

    let t0 = Instant::now();
    let (mut last_loss, mut window_loss, mut window_n) = (f64::NAN, 0f64, 0u64);
    let mut window_start = Instant::now();
    let mut last_eval: Option<EvalResult> = None;
    let mut rate = 0.0;
    let eval_every = if s.config.eval_interval > 0 { s.config.eval_interval } else { per_epoch };
    let ckpt_every = if s.config.checkpoint_interval > 0 { s.config.checkpoint_interval } else { per_epoch };
    for step in start..end {
        opt.set_lr(schedule.lr_at(s.config.lr, step));
        let b = loader.next_batch()?;
        let (x, y) = (to_tensor(&b.inputs)?.to_device(device)?, to_tensor(&b.targets)?.to_device(device)?);
        let (loss, _) = batch_loss(s.model.as_ref(), s.task, &x, &y)?;
        let lv = loss.to_scalar_f32()? as f64;
        if !lv.is_finite() {
            bar.abandon();
            let keep = match &opts.out {
                Some(d) if checkpoint::path_in(d).exists() => format!("the last good checkpoint is kept in {}", d.display()),
                _ => "no checkpoint was written".to_string(),
            };
            bail!("the training loss became {lv} at step {step} (lr {:.3e}); stopping. Lower --lr or add gradient clipping; {keep}", opt.lr());
        }
        loss.backward()?;
        if let Some(c) = s.config.grad_clip {
            clip_grad_norm(&params, c)?;
        }
        opt.step()?;
        opt.zero_grad();
        last_loss = lv;
        window_loss += lv;
        window_n += 1;
        let done = step + 1;
        if done % s.config.log_interval == 0 || done == end {
            let secs = window_start.elapsed().as_secs_f64().max(1e-9);
            rate = (window_n as usize * s.config.batch_size * per_sample) as f64 / secs;
            let avg = window_loss / window_n as f64;
            bar.set_message(format!("loss {avg:.4} {rate:.0} {unit}"));
            if let Some(l) = log.as_mut() {
                let key = if lm { "tokens_per_s" } else { "samples_per_s" };
                l.log(&json!({"step": done, "epoch": step / per_epoch, "train_loss": avg, "lr": opt.lr(), key: rate, "elapsed_s": t0.elapsed().as_secs_f64()}))?;
            }
            window_loss = 0.0;
            window_n = 0;
            window_start = Instant::now();
        }
        bar.set_position(done);
        if done % eval_every == 0 || done == end {
            let e = evaluate(&s, s.config.eval_batches)?;
            let acc = e.accuracy.map(|a| format!(", val accuracy {:.2}%", a * 100.0)).unwrap_or_default();
            let what = if s.config.eval_interval == 0 { format!("epoch {}", done / per_epoch) } else { format!("step {done}") };
            bar.suspend(|| if !opts.quiet { eprintln!("{what}: train loss {last_loss:.4}, val loss {:.4}{acc}", e.loss) });
            if let Some(l) = log.as_mut() {
                l.log(&json!({"step": done, "epoch": step / per_epoch, "val_loss": e.loss, "val_accuracy": e.accuracy}))?;
            }
            last_eval = Some(e);
        }
        if let Some(d) = &opts.out {
            if done % ckpt_every == 0 || done == end {
                save_checkpoint(d, &s, opt.as_ref(), done, &loader)?;
            }
        }
    }
    bar.finish_and_clear();
    let wall = t0.elapsed().as_secs_f64();
    let trained = (end - start) as f64;
    let throughput = trained * (s.config.batch_size * per_sample) as f64 / wall.max(1e-9);
    let e = last_eval.expect("the last step always evaluates");
    let mut summary = json!({
        "model": s.config.model, "data": s.config.data, "device": device.to_string(), "steps": end, "total_steps": total,
        "resumed_from_step": resumed.as_ref().map(|l| l.meta.step), "parameters": s.model.num_parameters(),
        "wall_time_s": wall, "train_loss": last_loss, "val_loss": e.loss, "val_accuracy": e.accuracy,
        "val_examples": e.examples, "batch_size": s.config.batch_size, "lr": s.config.lr, "optimizer": s.config.optimizer,
        "seed": s.config.seed, "threads": rayon::current_num_threads(), "last_logged_rate": rate,
    });
    summary[if lm { "tokens_per_s" } else { "samples_per_s" }] = json!(throughput);
    if let Some(d) = &opts.out {
        checkpoint::write_atomic(&d.join("summary.json"), serde_json::to_string_pretty(&summary)?.as_bytes())?;
        let l = log.take().expect("opened with out");
        plot_losses(l.path(), &d.join("loss.svg"), &format!("{} on {}", s.config.model, s.config.data)).context("drawing the loss plot")?;
    }
    if !opts.quiet {
        let acc = e.accuracy.map(|a| format!(", val accuracy {:.2}%", a * 100.0)).unwrap_or_default();
        eprintln!("done: step {end} of {total}; {} steps in {wall:.1} s ({throughput:.0} {unit}); val loss {:.4}{acc}", end - start, e.loss);
        if let Some(d) = &opts.out {
            eprintln!("wrote {}/{{metrics.jsonl, summary.json, loss.svg, {}}}", d.display(), checkpoint::FILE_NAME);
        }
    }
    Ok(summary)
}

/// The model and setup of a checkpoint, with its weights loaded.
pub fn load_for_inference(dir: &Path) -> Result<(Setup, u64)> {
    let l = checkpoint::load(dir)?;
    let s = setup(l.meta.config.clone())?;
    let named: Vec<(String, Tensor)> = s.model.named_tensors().into_iter().map(|t| (t.name, t.tensor)).collect();
    checkpoint::restore_model(&l.tensors, &named)?;
    s.model.set_training(false);
    Ok((s, l.meta.step))
}

/// Samples `max_new` tokens after `prompt` with temperature and top-k; returns all tokens.
pub fn generate(s: &Setup, prompt: &[i64], max_new: usize, temperature: f64, top_k: usize, seed: u64) -> Result<Vec<i64>> {
    let _g = no_grad();
    let ctx = s.config.context;
    let mut rng = Rng::new(seed);
    let mut tokens = prompt.to_vec();
    for _ in 0..max_new {
        let window = &tokens[tokens.len().saturating_sub(ctx)..];
        let x = Tensor::from_slice(window, &[1, window.len()], Device::Cpu)?;
        let logits = s.model.forward(&x)?;
        let v = logits.shape()[2];
        let last = logits.narrow(1, window.len() - 1, 1)?.reshape(&[v])?.to_vec_f32()?;
        let next = if temperature <= 0.0 {
            last.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i).unwrap_or(0)
        } else {
            let mut idx: Vec<usize> = (0..v).collect();
            idx.sort_by(|&a, &b| last[b].total_cmp(&last[a]));
            if top_k > 0 {
                idx.truncate(top_k);
            }
            let max = last[idx[0]] as f64;
            let w: Vec<f64> = idx.iter().map(|&i| ((last[i] as f64 - max) / temperature).exp()).collect();
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

