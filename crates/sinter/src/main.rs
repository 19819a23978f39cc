//! `sinter`: train, evaluate and sample neural networks from one binary.

mod bench_cpu;
mod checkpoint;
mod config;
mod dist_cmd;
mod gpu_bench;
mod metrics;
mod model_parallel;
mod precision;
mod serve_cmd;
mod tokenize_cmd;
mod train;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use config::{ConfigFile, TrainConfig};

#[derive(Parser)]
#[command(
    name = "sinter",
    version,
    about = "Train and run neural networks on CPUs and GPUs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model (with no flags: the CNN on the bundled handwritten digits).
    Train(Box<TrainArgs>),
    /// Evaluate a checkpoint on its validation data.
    Eval {
        /// Run directory (or checkpoint file) written by `train --out`.
        #[arg(long)]
        checkpoint: PathBuf,
    },
    /// Sample text from a GPT checkpoint, printing each token as it is made.
    Generate(serve_cmd::GenerateArgs),
    /// Version, devices, threads and dtypes.
    Info,
    /// Start N ranks of a sinter command on this node: `sinter launch --nproc-per-node 4 -- train …`.
    Launch(dist_cmd::LaunchArgs),
    /// Benchmarks: `bench cpu` (GEMM, conv, training, inference), `bench scaling` (analytic
    /// scaling model), `bench allreduce` (host bandwidth), `bench gpu`.
    Bench {
        #[command(subcommand)]
        which: dist_cmd::BenchCmd,
    },
    /// Turn a text file into GPT-2 token files (<name>_train.bin, <name>_val.bin) for tokens:DIR.
    Tokenize(tokenize_cmd::TokenizeArgs),
    /// Serve a GPT checkpoint over an OpenAI-compatible HTTP API (completions, chat, streaming).
    Serve(serve_cmd::ServeArgs),
}

#[derive(Args, Default)]
struct TrainArgs {
    /// Tensor-parallel ranks per GPT replica (Megatron style); run under `sinter launch`.
    #[arg(long, default_value_t = 1)]
    tp: usize,
    /// Pipeline stages per GPT replica; run under `sinter launch`.
    #[arg(long, default_value_t = 1)]
    pp: usize,
    /// Micro-batches per step for the pipeline.
    #[arg(long, default_value_t = 1)]
    micro_batches: usize,
    /// Pipeline schedule: gpipe or 1f1b (the learning-rate schedule is `--lr-schedule`).
    #[arg(
        long = "schedule",
        visible_alias = "pp-schedule",
        default_value = "1f1b"
    )]
    pp_schedule: String,
    /// mlp, cnn, resnet18, gpt-tiny or gpt2.
    #[arg(long)]
    model: Option<String>,
    /// digits, shakespeare, mnist:DIR, cifar10:DIR, text:FILE or tokens:FILE_OR_DIR.
    #[arg(long)]
    data: Option<String>,
    #[arg(long)]
    epochs: Option<u64>,
    #[arg(long)]
    steps: Option<u64>,
    #[arg(long)]
    batch_size: Option<usize>,
    #[arg(long)]
    lr: Option<f64>,
    /// adamw or sgd.
    #[arg(long)]
    optimizer: Option<String>,
    #[arg(long)]
    momentum: Option<f64>,
    #[arg(long)]
    weight_decay: Option<f64>,
    /// Learning-rate schedule: constant, cosine (with warm-up) or step.
    #[arg(long)]
    lr_schedule: Option<String>,
    /// Clip the global gradient norm to this value.
    #[arg(long)]
    grad_clip: Option<f64>,
    /// Context length for language models.
    #[arg(long)]
    context: Option<usize>,
    #[arg(long)]
    seed: Option<u64>,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long)]
    device: Option<String>,
    /// Evaluate every N steps (0: every epoch).
    #[arg(long)]
    eval_interval: Option<u64>,
    /// Validation batches per evaluation (0: all).
    #[arg(long)]
    eval_batches: Option<usize>,
    #[arg(long)]
    log_interval: Option<u64>,
    /// Checkpoint every N steps (0: every epoch).
    #[arg(long)]
    checkpoint_interval: Option<u64>,
    /// Directory for metrics.jsonl, summary.json, loss.svg and checkpoints.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run saved in this directory.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// TOML file with the same keys as the flags (flags win).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Stop after this step (checkpointing it); `--resume DIR` continues the same run.
    #[arg(long)]
    stop_at_step: Option<u64>,
    /// Data parallel (on by itself when WORLD_SIZE > 1, e.g. under `sinter launch`).
    #[arg(long)]
    dp: bool,
    /// Collective backend of a distributed run: auto (NCCL when every rank's model is on CUDA
    /// and NCCL loads), nccl, or host (TCP ring).
    #[arg(long, default_value = "auto")]
    dist_backend: String,
    /// ZeRO stage 1 (optimizer state sharded) or 2 (gradients too); implies --dp.
    #[arg(long)]
    zero: Option<u8>,
    /// Gradient bucket size in MiB for data parallel / ZeRO (default 25).
    #[arg(long)]
    bucket_mb: Option<f64>,
    /// Accumulate gradients over N micro-batches per step (only the last one communicates).
    #[arg(long)]
    grad_accum: Option<u64>,
    /// Activation checkpointing of GPT blocks: none, attn or block (recompute in backward).
    #[arg(long)]
    recompute: Option<String>,
    /// fp32, tf32, bf16 or fp16 (fp32 master weights; fp16 with dynamic loss scaling).
    #[arg(long)]
    precision: Option<String>,
    /// Capture the whole training step as a CUDA graph after warm-up steps and replay it
    /// (CUDA, one process, static shapes, no dropout; ignored on the CPU).
    #[arg(long)]
    cuda_graph: bool,
    /// No progress bar or summaries.
    #[arg(long, short)]
    quiet: bool,
}

impl TrainArgs {
    fn flags(&self) -> ConfigFile {
        ConfigFile {
            model: self.model.clone(),
            data: self.data.clone(),
            epochs: self.epochs,
            steps: self.steps,
            batch_size: self.batch_size,
            lr: self.lr,
            optimizer: self.optimizer.clone(),
            momentum: self.momentum,
            weight_decay: self.weight_decay,
            lr_schedule: self.lr_schedule.clone(),
            grad_clip: self.grad_clip,
            context: self.context,
            seed: self.seed,
            device: self.device.clone(),
            eval_interval: self.eval_interval,
            eval_batches: self.eval_batches,
            log_interval: self.log_interval,
            checkpoint_interval: self.checkpoint_interval,
            out: self.out.clone(),
            zero: self.zero,
            bucket_mb: self.bucket_mb,
            grad_accum: self.grad_accum,
            recompute: self.recompute.clone(),
            precision: self.precision.clone(),
        }
    }
}

/// A resumed run takes its config from the checkpoint; flags given now override it.
fn train_config(a: &TrainArgs) -> Result<(TrainConfig, Option<PathBuf>)> {
    let file = match &a.config {
        Some(p) => ConfigFile::load(p)?,
        None => ConfigFile::default(),
    };
    let layered = file.overlay(&a.flags());
    let out = layered.out.clone().or_else(|| a.resume.clone());
    if let Some(dir) = &a.resume {
        let saved = checkpoint::load(dir)?.meta.config;
        let mut c = saved.clone();
        if let Some(s) = layered.steps {
            c.steps = s;
            c.epochs = None;
        }
        if let Some(e) = layered.epochs {
            c.epochs = Some(e);
        }
        // How the step is distributed may change on resume; what it computes may not.
        c.zero = layered.zero.unwrap_or(c.zero);
        c.bucket_mb = layered.bucket_mb.unwrap_or(c.bucket_mb);
        if let Some(g) = layered.grad_accum.filter(|&g| g != saved.grad_accum) {
            bail!("--grad-accum {g} differs from the checkpoint's {}; a resumed run keeps its global batch", saved.grad_accum);
        }
        c.check_parallel()?;
        for (given, what) in [
            (layered.model.as_ref(), "model"),
            (layered.data.as_ref(), "data"),
        ] {
            if let Some(v) = given {
                let saved_v = if what == "model" {
                    &saved.model
                } else {
                    &saved.data
                };
                if v != saved_v {
                    bail!("--{what} {v} differs from the checkpoint's {what} {saved_v}; a resumed run keeps its {what}");
                }
            }
        }
        return Ok((c, out));
    }
    Ok((TrainConfig::resolve(&layered)?, out))
}

/// `--schedule` names the pipeline schedule; a learning-rate schedule there is a mistake
/// worth pointing at the right flag.
fn check_pipeline_schedule(name: &str) -> Result<()> {
    if name.parse::<sinter_dist::pipeline::Schedule>().is_ok() {
        return Ok(());
    }
    if ["constant", "cosine", "step"].contains(&name) {
        bail!("--schedule picks the pipeline schedule (gpipe or 1f1b); for the learning-rate schedule use --lr-schedule {name}");
    }
    bail!("--schedule: unknown pipeline schedule '{name}'; valid: gpipe, 1f1b")
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Train(a) => {
            check_pipeline_schedule(&a.pp_schedule)?;
            let (config, out) = train_config(&a)?;
            let opts = train::TrainOptions {
                out,
                resume: a.resume.clone(),
                quiet: a.quiet,
                stop_at_step: a.stop_at_step,
                dp: a.dp,
                cuda_graph: a.cuda_graph,
                dist_backend: a.dist_backend.parse()?,
            };
            if a.tp > 1 || a.pp > 1 {
                let mp = model_parallel::ModelParallel {
                    tp: a.tp,
                    pp: a.pp,
                    micro_batches: a.micro_batches,
                    schedule: a.pp_schedule.clone(),
                };
                model_parallel::run(config, &opts, &mp)?;
            } else {
                train::run(config, &opts)?;
            }
        }
        Command::Eval { checkpoint } => {
            let (s, step) = train::load_for_inference(&checkpoint)?;
            let e = train::evaluate(&s, 0)?;
            let acc = e
                .accuracy
                .map(|a| format!(", accuracy {:.2}%", a * 100.0))
                .unwrap_or_default();
            println!(
                "{} on {} (step {step}): validation loss {:.4}{acc} over {} examples",
                s.config.model, s.config.data, e.loss, e.examples
            );
        }
        Command::Generate(g) => serve_cmd::generate(&g)?,
        Command::Info => print!("{}", precision::info_report()),
        Command::Launch(a) => dist_cmd::launch(&a)?,
        Command::Bench { which } => dist_cmd::bench(&which)?,
        Command::Tokenize(a) => tokenize_cmd::run(&a)?,
        Command::Serve(a) => serve_cmd::serve(&a)?,
    }
    Ok(())
}

fn main() -> ExitCode {
    match run().context("sinter") {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Skip the "sinter" context line; print the cause chain.
            let mut chain = e.chain().skip(1);
            if let Some(first) = chain.next() {
                eprintln!("error: {first}");
            }
            for c in chain {
                eprintln!("  caused by: {c}");
            }
            ExitCode::FAILURE
        }
    }
}
