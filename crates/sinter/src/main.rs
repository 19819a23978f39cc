//! `sinter`: train, evaluate and sample neural networks from one binary.

mod bench_cpu;
mod checkpoint;
mod config;
mod dist_cmd;
mod gpu_bench;
mod gpu_model_cmd;
mod inference;
mod int8_bench;
mod int8_checkpoint;
mod llm_bench;
mod merge_cmd;
mod metrics;
mod param_groups;
mod plot;
mod precision;
mod predict_cmd;
mod quantize_cmd;
mod serve_cmd;
mod signals;
mod term;
mod tfevents;
mod tokenize_cmd;
mod train_args;
mod trainer;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use train_args::TrainArgs;

use config::{ConfigFile, TrainConfig};

/// Large blocks on 64-byte lines: whole-line vector loads of tensor data (see `LineAligned`).
#[global_allocator]
static ALLOCATOR: sinter_core::cpu::alloc::LineAligned = sinter_core::cpu::alloc::LineAligned;

#[derive(Parser)]
#[command(
    name = "sinter",
    version,
    about = "Train and run neural networks on CPUs and GPUs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Load checkpoints without checking the checksum of their tensor bytes (a damaged file
    /// then loads as it is) [default: verify].
    #[arg(long, global = true)]
    no_verify: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model (with no flags: the CNN on the bundled handwritten digits).
    Train(Box<TrainArgs>),
    /// Evaluate a checkpoint, or a pretrained model, on validation data.
    Eval(Box<EvalArgs>),
    /// Write a Llama-family checkpoint as a Hugging Face directory (config.json,
    /// model.safetensors and, for a fine-tuned pretrained model, its tokenizer) that
    /// `--model DIR` and transformers load.
    Export {
        /// Run directory (or checkpoint file) written by `train --out`.
        checkpoint: PathBuf,
        /// The directory to write (created if missing; its model files are replaced).
        #[arg(long)]
        out: PathBuf,
    },
    /// Fold a LoRA adapter (PEFT format) into its base model and write a Hugging Face model.
    Merge(merge_cmd::MergeArgs),
    /// Sample text from a GPT checkpoint, printing each token as it is made.
    Generate(serve_cmd::GenerateArgs),
    /// Classify your own PNG/JPEG images or CSV rows with a classifier checkpoint.
    Predict(predict_cmd::PredictArgs),
    /// Version, devices, threads and dtypes.
    Info,
    /// Start N ranks of a sinter command on this node: `sinter launch --nproc-per-node 4 -- train …`.
    /// The ranks share the node's cores (each gets RAYON_NUM_THREADS = its part) unless
    /// RAYON_NUM_THREADS is set, which then gives each rank that many threads.
    Launch(dist_cmd::LaunchArgs),
    /// Benchmarks: `bench cpu` (GEMM, conv, training, inference), `bench scaling` (analytic
    /// scaling model), `bench allreduce` (host all-reduce bandwidth), `bench gpu
    /// gemm|tc|linear|bandwidth|attention|all` (CUDA), `bench llm --model PATH` (prompt
    /// processing and generation speed of a pretrained model).
    Bench {
        #[command(subcommand)]
        which: dist_cmd::BenchCmd,
    },
    /// Write an int8 copy of a checkpoint for CPU inference (eval and generate load it as is),
    /// or a GGUF file re-quantized with `--model FILE.gguf --format q8_0|q4_0|q4_1|q4_k|q6_k`.
    Quantize(quantize_cmd::QuantizeArgs),
    /// Turn a text file into GPT-2 token files (<name>_train.bin, <name>_val.bin) for tokens:DIR.
    Tokenize(tokenize_cmd::TokenizeArgs),
    /// Serve a GPT checkpoint or a pretrained GGUF / Hugging Face model over an OpenAI-compatible HTTP API.
    Serve(serve_cmd::ServeArgs),
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["checkpoint", "model"])))]
struct EvalArgs {
    /// Run directory (or checkpoint file) written by `train --out`.
    #[arg(long, conflicts_with_all = ["model", "data", "context", "batch_size"])]
    checkpoint: Option<PathBuf>,
    /// A pretrained model (a .gguf file or a Hugging Face directory) or a preset, evaluated
    /// as `train --model` would start (with --data, --context and --batch-size as there).
    #[arg(long)]
    model: Option<String>,
    /// The data whose validation part (the last 10 % of a text) is evaluated, as `train
    /// --data` [default: as train].
    #[arg(long, requires = "model")]
    data: Option<String>,
    /// Context length, as `train --context` [default: as train].
    #[arg(long, requires = "model")]
    context: Option<usize>,
    /// Examples per batch, as `train --batch-size` [default: as train].
    #[arg(long, requires = "model")]
    batch_size: Option<usize>,
    /// Validation batches to evaluate; 0: all. Give the run's --eval-batches to reproduce
    /// its last validation loss [default: 0].
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    eval_batches: usize,
}

/// `sinter eval`: a checkpoint's model and data, or a model as `train --model` starts it.
fn eval(a: &EvalArgs) -> Result<()> {
    let (s, step) = match (&a.checkpoint, &a.model) {
        (Some(c), _) => inference::load_for_eval(c)?,
        (None, Some(m)) => {
            let flags = ConfigFile {
                model: Some(m.clone()),
                data: a.data.clone(),
                context: a.context,
                batch_size: a.batch_size,
                ..ConfigFile::default()
            };
            (trainer::setup(TrainConfig::resolve(&flags)?)?, 0)
        }
        (None, None) => anyhow::bail!("give --checkpoint RUN or --model PATH"),
    };
    s.model.set_training(false);
    // BatchNorm folded into the convolutions: the same outputs, fewer passes.
    sinter_nn::fold::fold_for_inference(s.model.as_ref())?;
    let e = trainer::evaluate(&s, a.eval_batches)?;
    let extra = match (e.accuracy, s.task) {
        (Some(acc), _) => format!(", accuracy {:.2}%", acc * 100.0),
        (None, sinter_models::Task::LanguageModel) => format!(", perplexity {:.3}", e.loss.exp()),
        _ => String::new(),
    };
    out!(
        "{} on {} (step {step}): validation loss {:.4}{extra} over {} examples ({})",
        s.config.model,
        s.config.data,
        e.loss,
        e.examples,
        e.coverage()
    );
    Ok(())
}

/// The run's config: defaults, then `--config`, then flags; a resumed run starts from its
/// checkpoint's config and takes what may change from the flags (the notes say what did).
/// Also returns the layered keys, which say how this invocation runs.
fn train_config(a: &TrainArgs) -> Result<(TrainConfig, ConfigFile, Vec<String>)> {
    let file = match &a.config {
        Some(p) => ConfigFile::load(p)?,
        None => ConfigFile::default(),
    };
    let layered = file.overlay(&a.flags());
    layered.check_combination()?;
    if let Some(dir) = &layered.resume {
        // A first look at the header; the trainer reads (and checks) the whole file.
        let meta = checkpoint::load_meta(dir)?;
        let at_epoch_start = meta.loader[1] == 0;
        let (c, notes) = config::resume_config(&meta.config, &layered, at_epoch_start)?;
        return Ok((c, layered, notes));
    }
    Ok((TrainConfig::resolve(&layered)?, layered, Vec::new()))
}

/// How a run goes, from its layered keys (flags over `--config`).
fn train_options(k: &ConfigFile, notes: Vec<String>) -> Result<trainer::TrainOptions> {
    let on = ConfigFile::on;
    Ok(trainer::TrainOptions {
        out: k.out.clone().or_else(|| k.resume.clone()),
        resume: k.resume.clone(),
        overwrite: on(k.overwrite),
        notes,
        quiet: on(k.quiet),
        stop_at_step: k.stop_at_step,
        dp: on(k.dp),
        cuda_graph: trainer::GraphMode::from_key(k.cuda_graph),
        dist_backend: sinter_dist::mpi::resolve_auto(
            k.dist_backend.as_deref().unwrap_or("auto").parse()?,
            &std::env::vars().collect(),
        ),
        parallel: k.model_parallel().then(|| trainer::ModelParallel {
            tp: k.tp_or_1(),
            pp: k.pp_or_1(),
            micro_batches: k.micro_batches.unwrap_or(1),
            schedule: k.schedule.clone().unwrap_or_else(|| "1f1b".into()),
        }),
        export_adapter: k.export_adapter.clone(),
    })
}

/// Makes this (the main) thread worker 0 of rayon's global pool, beside RAYON_NUM_THREADS − 1
/// (default: one per CPU) spawned workers. A parallel op started here then runs "in worker":
/// this thread does its share and the others steal the rest. Started from outside the pool,
/// each op (hundreds per training step) was injected into the pool while this thread slept on
/// a latch and was woken again, and the idle workers' yields contended with it for the cores.
fn join_rayon_pool() {
    // Fails only when a global pool exists already (nothing builds one before this); the
    // default pool then serves as before.
    let _ = rayon::ThreadPoolBuilder::new()
        .use_current_thread()
        .build_global();
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    checkpoint::set_verify(!cli.no_verify);
    match cli.command {
        Command::Train(a) => {
            let (config, keys, notes) = train_config(&a)?;
            let opts = train_options(&keys, notes)?;
            signals::install();
            trainer::run(config, &opts)?;
        }
        Command::Eval(a) => eval(&a)?,
        Command::Merge(a) => {
            let n = merge_cmd::merge(&a)?;
            out!(
                "merged {} ({n} layers) into {} and wrote {}",
                a.adapter.display(),
                a.model.display(),
                a.out.display()
            );
        }
        Command::Export { checkpoint, out } => {
            let step = inference::export_hf(&checkpoint, &out)?;
            out!(
                "wrote {} (step {step}) as a Hugging Face model to {}",
                checkpoint.display(),
                out.display()
            );
        }
        Command::Generate(g) => serve_cmd::generate(&g)?,
        Command::Predict(a) => predict_cmd::run(&a)?,
        Command::Info => print!("{}", precision::info_report()),
        Command::Launch(a) => dist_cmd::launch(&a)?,
        Command::Bench { which } => dist_cmd::bench(&which)?,
        Command::Tokenize(a) => tokenize_cmd::run(&a)?,
        Command::Quantize(a) => quantize_cmd::run(&a)?,
        Command::Serve(a) => serve_cmd::serve(&a)?,
    }
    Ok(())
}

fn main() -> ExitCode {
    signals::die_with_launcher();
    join_rayon_pool();
    let result = run().context("sinter");
    let ok = result.is_ok();
    let code = match result {
        // A run stopped by a signal saved its state; its status still says it was stopped.
        Ok(()) => match (signals::requested(), term::output_closed()) {
            (Some(sig), _) => ExitCode::from((128 + sig) as u8),
            (None, true) => ExitCode::from(128 + libc::SIGPIPE as u8),
            (None, false) => ExitCode::SUCCESS,
        },
        Err(e) => {
            // Skip the "sinter" context line; print the cause chain.
            let mut chain = e.chain().skip(1);
            if let Some(first) = chain.next() {
                say!("error: {first}");
            }
            for c in chain {
                say!("  caused by: {c}");
            }
            ExitCode::FAILURE
        }
    };
    // With MPI started (`--dist-backend mpi`): finalise, or abort so no rank waits on this one.
    sinter_dist::mpi::finish(ok);
    code
}
