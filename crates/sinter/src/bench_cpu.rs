//! `sinter bench cpu`: the engine's CPU figures without Python, as a markdown table or as JSON
//! (`--json`). `bench/vs-torch/run` runs each case in a process of its own, interleaved with
//! PyTorch's twin of the same case, and prints the ratios.
//!
//! Cases (with no case named: every one that does not need a trained checkpoint):
//! - `gemm[:N]`: C = A·B with N×N f32 operands (default N = 256, 1024, 2048), GFLOP/s;
//! - `conv`: conv2d 64×32×16×16 ∗ 64×32×3×3, pad 1, forward and forward + backward (dx and dw
//!   from a random output gradient), GFLOP/s;
//! - `cnn-step`, `gpt-step`, `llama-step`: one training step (forward, cross-entropy, backward,
//!   gradient clipping where the model's defaults clip, AdamW, zero_grad) of the digits CNN at
//!   batch 64, of gpt-tiny and of llama-tiny at 12×64, with the hyper-parameters of `sinter
//!   train`'s defaults, on the first 32 batches of the training loader (seeded as `train` seeds
//!   it), cycled;
//! - `gpt-forward`: gpt-tiny's forward pass at 12×64 in eval mode without gradients;
//! - `cnn-infer[:B]`: the digits CNN on the first B validation images (default B = 1, 256);
//! - `generate[:T]`: greedy generation of `--tokens` tokens after "\n" with the KV cache at
//!   context T (default 64 and 256), tokens/s;
//! - `linear[:R]`: a 768→3072 Linear (GPT-2's MLP) forward on R rows (default 1 and 64), µs;
//! - `linear-int8[:R]`: the same Linear (same weights) quantized as `sinter quantize` does
//!   (int8 per-channel weights, each input row quantized at run time), µs;
//! - `train`: the whole default `sinter train` (the digits CNN, 30 epochs, an evaluation after
//!   each) in this process, seconds.
//!
//! `--save-init DIR` with `cnn-step`, `gpt-step`, `llama-step` or `train` writes the weights that case starts
//! from as a step-0 checkpoint (with the run config), so that another framework can start from
//! the same point (bench/vs-torch does).
//!
//! `--checkpoint DIR` runs `cnn-infer`, `gpt-forward` and `generate` on a trained checkpoint
//! (a random model of the same shape otherwise; speed does not depend on the weights).
//! Timings: warm-up calls, then repetitions until `--secs` have passed (at least 5, or 3 for
//! generation), with the timing loop of the cargo benches; the figure is the median.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde_json::{json, Map, Value};
use sinter_core::cpu::hot_workers::HotWorkers;
use sinter_core::{no_grad, Conv2dParams, DType, Device, Rng, Tensor};
use sinter_data::DataLoader;
use sinter_models::Task;
use sinter_nn::quant::QuantizedLinear;
use sinter_nn::{clip_grad_norm, AdamW, Module, Optimizer};

use crate::config::{ConfigFile, TrainConfig};
use crate::trainer::{self, Setup};

// The timing loop and statistics of the cargo benches (one copy in the workspace).
#[path = "../../sinter-core/benches/common/mod.rs"]
mod timing;
use timing::{time_it, Stats};

/// Every case name, for `--help` and error messages.
pub const CASES: &str =
    "gemm[:N], conv, cnn-step, gpt-step, llama-step, gpt-forward, cnn-infer[:B], generate[:T], linear[:R], linear-int8[:R], train";

#[derive(Args)]
pub struct CpuBenchArgs {
    /// Cases to run: gemm[:N], conv, cnn-step, gpt-step, llama-step, gpt-forward, cnn-infer[:B],
    /// generate[:T], linear[:R], train (default: all but train).
    pub cases: Vec<String>,
    /// Print JSON (one object: machine, threads, peak memory, results) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Seconds of timed repetitions per figure.
    #[arg(long, default_value_t = 1.0)]
    pub secs: f64,
    /// Trained checkpoint (run directory or file) for cnn-infer, gpt-forward and generate.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Tokens to generate per repetition of `generate`.
    #[arg(long, default_value_t = 200)]
    pub tokens: usize,
    /// With one of cnn-step, gpt-step or train: write the weights it starts from to this
    /// directory as a step-0 checkpoint.
    #[arg(long)]
    pub save_init: Option<PathBuf>,
}

/// One measured figure.
struct Figure {
    case: String,
    what: String,
    value: f64,
    unit: &'static str,
    higher_is_better: bool,
    stats: Stats,
    extra: Map<String, Value>,
}

impl Figure {
    fn new(case: &str, what: String, value: f64, unit: &'static str, stats: Stats) -> Figure {
        Figure {
            case: case.into(),
            what,
            value,
            unit,
            higher_is_better: !matches!(unit, "ms" | "µs" | "s"),
            stats,
            extra: Map::new(),
        }
    }
    fn with(mut self, key: &str, v: Value) -> Figure {
        self.extra.insert(key.into(), v);
        self
    }
    fn to_json(&self) -> Value {
        let mut o = self.extra.clone();
        o.insert("case".into(), json!(self.case));
        o.insert("what".into(), json!(self.what));
        o.insert("value".into(), json!(self.value));
        o.insert("unit".into(), json!(self.unit));
        let better = if self.higher_is_better {
            "higher"
        } else {
            "lower"
        };
        o.insert("better".into(), json!(better));
        o.insert("median_s".into(), json!(self.stats.median()));
        o.insert("best_s".into(), json!(self.stats.best()));
        o.insert("reps".into(), json!(self.stats.reps()));
        Value::Object(o)
    }
}

/// `sinter bench cpu`: runs the cases and prints their table (or JSON).
pub fn run(a: &CpuBenchArgs) -> Result<()> {
    if !(a.secs.is_finite() && a.secs > 0.0) {
        bail!(
            "--secs must be a positive number of seconds, got {}",
            a.secs
        );
    }
    if a.tokens == 0 {
        bail!("--tokens must be at least 1");
    }
    let starts = ["cnn-step", "gpt-step", "llama-step", "train"];
    if a.save_init.is_some() && (a.cases.len() != 1 || !starts.contains(&a.cases[0].as_str())) {
        bail!("--save-init goes with exactly one of the cases cnn-step, gpt-step, llama-step or train (it writes the weights that case starts from)");
    }
    let cases: Vec<String> = if a.cases.is_empty() {
        DEFAULT_CASES.map(String::from).to_vec()
    } else {
        a.cases.clone()
    };
    let mut figures = Vec::new();
    for case in &cases {
        figures.extend(run_case(case, a)?);
    }
    let threads = rayon::current_num_threads();
    if a.json {
        let report = json!({
            "engine": format!("sinter {}", env!("CARGO_PKG_VERSION")),
            "threads": threads,
            "cpu": timing::machine_line(),
            "peak_rss_bytes": peak_rss_bytes(),
            "results": figures.iter().map(Figure::to_json).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", markdown(&figures));
        if let Some(b) = peak_rss_bytes() {
            println!("\npeak resident memory: {:.1} MiB", b as f64 / 1048576.0);
        }
    }
    Ok(())
}

/// The cases run when none is named: all that need no trained checkpoint to mean something
/// and take seconds, not minutes.
const DEFAULT_CASES: [&str; 8] = [
    "gemm",
    "conv",
    "cnn-step",
    "gpt-step",
    "gpt-forward",
    "cnn-infer",
    "generate",
    "linear",
];

/// The figures of one case, `name` or `name:N`.
fn run_case(case: &str, a: &CpuBenchArgs) -> Result<Vec<Figure>> {
    let (name, param) = match case.split_once(':') {
        Some((n, p)) => {
            let v = p.parse::<usize>().ok().filter(|&v| v > 0).ok_or_else(|| {
                anyhow!("case '{case}': '{p}' is not a positive integer (e.g. gemm:1024)")
            })?;
            (n, Some(v))
        }
        None => (case, None),
    };
    let sizes = |default: &[usize]| param.map_or(default.to_vec(), |v| vec![v]);
    let (ckpt, init) = (a.checkpoint.as_deref(), a.save_init.as_deref());
    let budget = Duration::from_secs_f64(a.secs);
    Ok(match (name, param) {
        ("gemm", _) => (sizes(&[256, 1024, 2048]).into_iter())
            .map(|n| gemm(n, budget))
            .collect::<Result<_>>()?,
        ("conv", None) => conv(budget)?,
        ("cnn-step", None) => vec![train_step("cnn-step", "cnn", init, budget)?],
        ("gpt-step", None) => vec![train_step("gpt-step", "gpt-tiny", init, budget)?],
        ("llama-step", None) => vec![train_step("llama-step", "llama-tiny", init, budget)?],
        ("gpt-forward", None) => vec![gpt_forward(ckpt, budget)?],
        ("cnn-infer", _) => (sizes(&[1, 256]).into_iter())
            .map(|b| cnn_infer(ckpt, b, budget))
            .collect::<Result<_>>()?,
        // A checkpoint has one context: its own, unless the case names it.
        ("generate", None) if ckpt.is_some() => vec![generate(ckpt, None, a.tokens, budget)?],
        ("generate", _) => (sizes(&[64, 256]).into_iter())
            .map(|t| generate(ckpt, Some(t), a.tokens, budget))
            .collect::<Result<_>>()?,
        ("linear", _) => (sizes(&[1, 64]).into_iter())
            .map(|r| linear(r, false, budget))
            .collect::<Result<_>>()?,
        ("linear-int8", _) => (sizes(&[1, 64]).into_iter())
            .map(|r| linear(r, true, budget))
            .collect::<Result<_>>()?,
        ("train", None) => vec![whole_train(init)?],
        _ => bail!("unknown CPU benchmark case '{case}'; valid: {CASES}"),
    })
}

fn markdown(figures: &[Figure]) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## sinter CPU benchmarks\n\n{}\n",
        timing::machine_line()
    );
    let _ = writeln!(
        md,
        "| case | what | median | unit | median ms | best ms | reps |\n|---|---|---:|---|---:|---:|---:|"
    );
    for f in figures {
        let _ = writeln!(
            md,
            "| {} | {} | {:.4} | {} | {:.4} | {:.4} | {} |",
            f.case,
            f.what,
            f.value,
            f.unit,
            f.stats.median() * 1e3,
            f.stats.best() * 1e3,
            f.stats.reps()
        );
    }
    md
}

/// The process's peak resident set (VmHWM), where /proc tells it.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `time_it` for a fallible body: the first error stops the measurement and is returned.
fn time_checked(
    warmup: usize,
    budget: Duration,
    min_reps: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<Stats> {
    let mut failed = None;
    let stats = time_it(warmup, budget, min_reps, 1_000_000, || {
        if failed.is_none() {
            failed = f().err();
        }
    });
    failed.map_or(Ok(stats), Err)
}

// ---- setups ------------------------------------------------------------------------------

/// `sinter train`'s setup for `model` with its default flags, on the CPU.
fn default_setup(model: &str, context: Option<usize>) -> Result<Setup> {
    let flags = ConfigFile {
        model: Some(model.into()),
        device: Some("cpu".into()),
        context,
        ..ConfigFile::default()
    };
    trainer::setup(TrainConfig::resolve(&flags)?)
}

/// The checkpoint's setup (weights loaded), checked to be a `task` model; else the default
/// setup of `model`.
fn setup_for(
    ckpt: Option<&Path>,
    model: &str,
    task: Task,
    context: Option<usize>,
) -> Result<Setup> {
    let Some(dir) = ckpt else {
        return default_setup(model, context);
    };
    let (s, _) = crate::inference::load_for_eval(dir)
        .with_context(|| format!("loading the checkpoint {}", dir.display()))?;
    if s.task != task {
        bail!(
            "the checkpoint {} holds a {} model ({:?}); this case needs a {task:?} model such as {model}",
            dir.display(),
            s.config.model,
            s.task
        );
    }
    if let Some(t) = context.filter(|&t| t != s.config.context) {
        bail!(
            "the checkpoint {} has context {}, not {t}; name the case without ':{t}' to use its own",
            dir.display(),
            s.config.context
        );
    }
    Ok(s)
}

/// The first `count` batches of a loader over `split`, as CPU tensors.
fn batches(
    s: &Setup,
    train_split: bool,
    batch: usize,
    count: usize,
) -> Result<Vec<(Tensor, Tensor)>> {
    let (data, shuffle) = if train_split {
        (s.train.clone(), true)
    } else {
        (s.val.clone(), false)
    };
    let mut loader = DataLoader::new(data, batch, shuffle, train_split, s.config.seed);
    (0..count)
        .map(|_| {
            let b = loader.next_batch()?;
            Ok((
                trainer::to_tensor(b.inputs)?,
                trainer::to_tensor(b.targets)?,
            ))
        })
        .collect()
}

/// Mean cross-entropy of the model's logits against `y` (classes or next tokens).
fn loss(s: &Setup, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let logits = s.model.forward(x)?;
    let v = *logits
        .shape()
        .last()
        .context("logits have a class dimension")?;
    let n = logits.numel() / v;
    Ok(logits
        .reshape(&[n, v])?
        .cross_entropy(&y.reshape(&[y.numel()])?, -100)?)
}

// ---- cases -------------------------------------------------------------------------------

fn gemm(n: usize, budget: Duration) -> Result<Figure> {
    let mut rng = Rng::new(n as u64);
    let a = Tensor::randn(&[n, n], 0.0, 1.0, &mut rng, DType::F32, Device::Cpu)?;
    let b = Tensor::randn(&[n, n], 0.0, 1.0, &mut rng, DType::F32, Device::Cpu)?;
    // A fast wrong product must not pass: one row of C against f64 dot products.
    let (av, bv) = (a.to_vec_f32()?, b.to_vec_f32()?);
    let c = a.matmul(&b)?.to_vec_f32()?;
    let i = n / 3;
    for j in 0..n {
        let want: f64 = (0..n)
            .map(|p| av[i * n + p] as f64 * bv[p * n + j] as f64)
            .sum();
        if (c[i * n + j] as f64 - want).abs() > 1e-4 * (n as f64).sqrt() * (1.0 + want.abs()) {
            bail!(
                "gemm {n}³ is wrong at ({i}, {j}): {} instead of {want}",
                c[i * n + j]
            );
        }
    }
    let stats = time_checked(2, budget, 5, || {
        std::hint::black_box(a.matmul(&b)?);
        Ok(())
    })?;
    let gflops = 2.0 * (n as f64).powi(3) / stats.median() / 1e9;
    Ok(Figure::new(
        &format!("gemm:{n}"),
        format!("f32 GEMM {n}³"),
        gflops,
        "GFLOP/s",
        stats,
    ))
}

fn conv(budget: Duration) -> Result<Vec<Figure>> {
    let (x_shape, w_shape) = ([64, 32, 16, 16], [64, 32, 3, 3]);
    let p = Conv2dParams {
        padding: 1.into(),
        ..Default::default()
    };
    let mut rng = Rng::new(7);
    let x = Tensor::randn(&x_shape, 0.0, 1.0, &mut rng, DType::F32, Device::Cpu)?;
    let w = Tensor::randn(&w_shape, 0.0, 0.1, &mut rng, DType::F32, Device::Cpu)?;
    // Output 64×64×16×16, each a 32·3·3 dot product: 2 FLOPs per multiply-add.
    let pass = 2.0 * (64 * 64 * 16 * 16 * 32 * 9) as f64;
    // Ten warm-up calls: allocator and library caches settle (PyTorch's side needs them).
    let fwd = time_checked(10, budget, 5, || {
        std::hint::black_box(x.conv2d(&w, p)?);
        Ok(())
    })?;
    // The output gradient is random, as in training (a constant one could take shortcuts).
    let dy = Tensor::randn(
        &[64, 64, 16, 16],
        0.0,
        1.0,
        &mut rng,
        DType::F32,
        Device::Cpu,
    )?;
    let (xv, wv) = (x.to_var()?, w.to_var()?);
    let both = time_checked(10, budget, 5, || {
        xv.zero_grad();
        wv.zero_grad();
        xv.conv2d(&wv, p)?.backward_with_grad(&dy, |_, _| Ok(()))?;
        Ok(())
    })?;
    if xv.grad().is_none() || wv.grad().is_none() {
        bail!("conv2d backward produced no gradients");
    }
    let what = "conv2d 64×32×16×16 ∗ 64×32×3×3, pad 1";
    Ok(vec![
        Figure::new(
            "conv:forward",
            format!("{what}, forward"),
            pass / fwd.median() / 1e9,
            "GFLOP/s",
            fwd,
        ),
        // Forward, dx and dw: three passes of the same size.
        Figure::new(
            "conv:forward-backward",
            format!("{what}, forward + backward"),
            3.0 * pass / both.median() / 1e9,
            "GFLOP/s",
            both,
        ),
    ])
}

/// One training step of `model`, reported as the figure `case`.
fn train_step(
    case: &'static str,
    model: &str,
    save_init: Option<&Path>,
    budget: Duration,
) -> Result<Figure> {
    let s = default_setup(model, None)?;
    if let Some(dir) = save_init {
        save_initial_weights(dir, &s)?;
    }
    s.model.set_training(true);
    let c = &s.config;
    let params = s.model.parameters();
    // `sinter train`'s defaults pick AdamW for every model.
    let mut opt = AdamW::new(params.clone(), c.lr, c.weight_decay)?;
    let data = batches(&s, true, c.batch_size, 32)?;
    let mut i = 0usize;
    let mut step = || -> Result<f32> {
        // As `sinter train`'s steps run (trainer_loop.rs).
        let _hot = HotWorkers::engage();
        let (x, y) = &data[i % data.len()];
        i += 1;
        let l = loss(&s, x, y)?;
        l.backward()?;
        if let Some(max) = c.grad_clip {
            clip_grad_norm(&params, max)?;
        }
        opt.step()?;
        opt.zero_grad();
        Ok(l.to_scalar_f32()?)
    };
    let first = step()?;
    let stats = time_checked(2, budget, 5, || step().map(drop))?;
    let last = step()?;
    let lm = s.task.is_sequence();
    let items = c.batch_size * if lm { c.context } else { 1 };
    let items_per_s = items as f64 / stats.median();
    let fig = if lm {
        let what = format!("{model} training step, {}×{}", c.batch_size, c.context);
        Figure::new(case, what, items_per_s, "tokens/s", stats)
    } else {
        let what = format!(
            "{model} training step on {}, batch {}",
            c.data, c.batch_size
        );
        Figure::new(case, what, stats.median() * 1e3, "ms", stats)
    };
    Ok(fig
        .with("loss_first", json!(first))
        .with("loss_last", json!(last))
        .with("items_per_s", json!(items_per_s))
        .with("parameters", json!(s.model.num_parameters())))
}

fn gpt_forward(ckpt: Option<&Path>, budget: Duration) -> Result<Figure> {
    let s = setup_for(ckpt, "gpt-tiny", Task::LanguageModel, None)?;
    s.model.set_training(false);
    let (x, _) = batches(&s, true, s.config.batch_size, 1)?.remove(0);
    let _g = no_grad();
    let stats = time_checked(3, budget, 5, || {
        std::hint::black_box(s.model.forward(&x)?);
        Ok(())
    })?;
    let (b, t) = (x.shape()[0], x.shape()[1]);
    Ok(Figure::new(
        "gpt-forward",
        format!("{} forward only, {b}×{t}", s.config.model),
        stats.median() * 1e3,
        "ms",
        stats,
    ))
}

fn cnn_infer(ckpt: Option<&Path>, batch: usize, budget: Duration) -> Result<Figure> {
    let s = setup_for(ckpt, "cnn", Task::Classification, None)?;
    s.model.set_training(false);
    if batch > s.val.len() {
        bail!(
            "cnn-infer:{batch}: the validation split has only {} images",
            s.val.len()
        );
    }
    let (x, y) = batches(&s, false, batch, 1)?.remove(0);
    let _g = no_grad();
    let stats = time_checked(5, budget, 5, || {
        std::hint::black_box(s.model.forward(&x)?);
        Ok(())
    })?;
    let correct = s
        .model
        .forward(&x)?
        .argmax(-1, false)?
        .eq(&y)?
        .to_vec_i64()?;
    let accuracy = correct.iter().sum::<i64>() as f64 / batch as f64;
    let case = format!("cnn-infer:{batch}");
    let fig = if batch == 1 {
        let what = format!(
            "{} inference on {}, batch 1 (latency)",
            s.config.model, s.config.data
        );
        Figure::new(&case, what, stats.median() * 1e6, "µs", stats)
    } else {
        let what = format!(
            "{} inference on {}, batch {batch} (throughput)",
            s.config.model, s.config.data
        );
        Figure::new(
            &case,
            what,
            batch as f64 / stats.median(),
            "samples/s",
            stats,
        )
    };
    Ok(fig.with("batch_accuracy", json!(accuracy)))
}

fn generate(
    ckpt: Option<&Path>,
    context: Option<usize>,
    n: usize,
    budget: Duration,
) -> Result<Figure> {
    let s = setup_for(ckpt, "gpt-tiny", Task::LanguageModel, context)?;
    s.model.set_training(false);
    let prompt = [b'\n' as i64];
    let mut tokens = Vec::new();
    let stats = time_checked(1, budget, 3, || {
        tokens = crate::inference::generate(
            s.model.as_ref(),
            s.config.context,
            &prompt,
            &crate::inference::Sampling::greedy(n),
        )?;
        Ok(())
    })?;
    let ctx = s.config.context;
    Ok(Figure::new(
        &format!("generate:{ctx}"),
        format!(
            "{} greedy generation of {n} tokens, context {ctx}, KV cache",
            s.config.model
        ),
        n as f64 / stats.median(),
        "tokens/s",
        stats,
    )
    .with("context", json!(ctx))
    .with("tokens", json!(&tokens[prompt.len()..])))
}

/// A 768→3072 Linear on `rows` rows, f32 or (`int8`) the same weights quantized.
fn linear(rows: usize, int8: bool, budget: Duration) -> Result<Figure> {
    let mut rng = Rng::new(rows as u64);
    let layer = sinter_nn::Linear::new(768, 3072, true, &mut rng)?;
    let x = Tensor::randn(&[rows, 768], 0.0, 1.0, &mut rng, DType::F32, Device::Cpu)?;
    let _g = no_grad();
    let quantized = if int8 {
        Some(QuantizedLinear::from_f32(
            &layer.weight,
            layer.bias.as_ref(),
        )?)
    } else {
        None
    };
    let stats = time_checked(5, budget, 5, || {
        let y = match &quantized {
            Some(q) => q.forward(&x)?,
            None => layer.forward(&x)?,
        };
        std::hint::black_box(y);
        Ok(())
    })?;
    let (id, kind) = if int8 {
        ("linear-int8", "int8 dynamic")
    } else {
        ("linear", "f32")
    };
    Ok(Figure::new(
        &format!("{id}:{rows}"),
        format!("Linear 768→3072 ({kind}), {rows} row(s)"),
        stats.median() * 1e6,
        "µs",
        stats,
    ))
}

fn whole_train(save_init: Option<&Path>) -> Result<Figure> {
    let flags = ConfigFile {
        device: Some("cpu".into()),
        ..ConfigFile::default()
    };
    let config = TrainConfig::resolve(&flags)?;
    if let Some(dir) = save_init {
        // `trainer::run` builds the same model from the same seed.
        save_initial_weights(dir, &trainer::setup(config.clone())?)?;
    }
    let opts = trainer::TrainOptions {
        out: None,
        resume: None,
        overwrite: false,
        notes: Vec::new(),
        parallel: None,
        quiet: true,
        stop_at_step: None,
        dp: false,
        cuda_graph: trainer::GraphMode::Off,
        dist_backend: "auto".parse()?,
        export_adapter: None,
    };
    let summary = trainer::run(config, &opts)?;
    let field = |k: &str| summary.get(k).cloned().unwrap_or(Value::Null);
    let wall = summary["wall_time_s"]
        .as_f64()
        .context("the training summary has no wall time")?;
    let what = format!(
        "default `sinter train` ({} on {}, {} steps), in-process",
        field("model").as_str().unwrap_or("?"),
        field("data").as_str().unwrap_or("?"),
        field("steps")
    );
    Ok(
        Figure::new("train", what, wall, "s", Stats { times: vec![wall] })
            .with("val_loss", field("val_loss"))
            .with("val_accuracy", field("val_accuracy"))
            .with("train_loss", field("train_loss"))
            .with("steps", field("steps")),
    )
}

/// A freshly built setup's weights as a step-0 checkpoint, written as a run writes its
/// checkpoints (no optimizer state yet; the loader at its start).
fn save_initial_weights(dir: &Path, s: &Setup) -> Result<()> {
    let c = &s.config;
    let loader = DataLoader::new(s.train.clone(), c.batch_size, true, true, c.seed);
    let precision = crate::precision::parse_precision(&c.precision)?.state();
    trainer::save_checkpoint(dir, s, &[], 0, 0, &loader, precision)
        .with_context(|| format!("writing the initial weights to {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cases: &[&str]) -> CpuBenchArgs {
        CpuBenchArgs {
            cases: cases.iter().map(|c| c.to_string()).collect(),
            json: true,
            secs: 0.001,
            checkpoint: None,
            tokens: 3,
            save_init: None,
        }
    }

    fn err(a: &CpuBenchArgs) -> String {
        format!("{:#}", run(a).expect_err("should be refused"))
    }

    const TINY: Duration = Duration::from_millis(1);

    #[test]
    fn bad_cases_and_flags_are_refused_with_what_is_valid() {
        let e = err(&args(&["gemm:x"]));
        assert!(
            e.contains("gemm:x") && e.contains("positive integer"),
            "{e}"
        );
        let e = err(&args(&["gemm:0"]));
        assert!(e.contains("positive integer"), "{e}");
        for bad in ["nope", "conv:3", "train:2"] {
            let e = err(&args(&[bad]));
            assert!(e.contains(bad) && e.contains(CASES), "{e}");
        }
        let mut a = args(&["gemm:8"]);
        a.save_init = Some("/nonexistent".into());
        assert!(err(&a).contains("--save-init"));
        let mut a = args(&["gemm:8"]);
        a.secs = f64::NAN;
        assert!(err(&a).contains("--secs"));
    }

    #[test]
    fn gemm_reports_flops_of_its_median() {
        let f = gemm(40, TINY).unwrap();
        assert_eq!(f.case, "gemm:40");
        assert!(f.higher_is_better && f.stats.reps() >= 5);
        let want = 2.0 * 40f64.powi(3) / f.stats.median() / 1e9;
        assert!(
            (f.value - want).abs() <= 1e-9 * want,
            "{} vs {want}",
            f.value
        );
        let j = f.to_json();
        assert_eq!(j["unit"], "GFLOP/s");
        assert_eq!(j["better"], "higher");
    }

    #[test]
    fn save_init_writes_the_weights_the_training_step_starts_from() {
        let dir = tempfile::tempdir().unwrap();
        let f = train_step("cnn-step", "cnn", Some(dir.path()), TINY).unwrap();
        assert_eq!((f.case.as_str(), f.unit), ("cnn-step", "ms"));
        let first = f.extra["loss_first"].as_f64().unwrap();
        // Ten classes from random weights: about ln 10 at the first step.
        assert!((first - 10f64.ln()).abs() < 0.5, "first loss {first}");
        let saved = crate::checkpoint::load(dir.path()).unwrap();
        assert_eq!(saved.meta.step, 0);
        let fresh = default_setup("cnn", None).unwrap();
        for t in fresh.model.named_tensors() {
            let got = &saved.tensors[&format!("model.{}", t.name)];
            assert_eq!(
                got.to_vec_f32().unwrap(),
                t.tensor.to_vec_f32().unwrap(),
                "{}",
                t.name
            );
        }
        // A classifier checkpoint is no language model: generate refuses it by name.
        let e = format!(
            "{:#}",
            generate(Some(dir.path()), None, 2, TINY).err().unwrap()
        );
        assert!(
            e.contains("Classification") && e.contains("LanguageModel"),
            "{e}"
        );
    }

    #[test]
    fn llama_step_reports_tokens_per_second_from_a_byte_level_start() {
        let f = train_step("llama-step", "llama-tiny", None, TINY).unwrap();
        assert_eq!((f.case.as_str(), f.unit), ("llama-step", "tokens/s"));
        assert!(
            f.what.contains("llama-tiny") && f.what.contains("12×64"),
            "{}",
            f.what
        );
        // 256 byte classes from random weights: about ln 256 at the first step.
        let first = f.extra["loss_first"].as_f64().unwrap();
        assert!((first - 256f64.ln()).abs() < 0.5, "first loss {first}");
    }

    #[test]
    fn inference_and_generation_report_their_shapes() {
        let f = cnn_infer(None, 4, TINY).unwrap();
        assert_eq!((f.case.as_str(), f.unit), ("cnn-infer:4", "samples/s"));
        let acc = f.extra["batch_accuracy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&acc));
        let e = format!("{:#}", cnn_infer(None, 100_000, TINY).err().unwrap());
        assert!(e.contains("only 360 images"), "{e}");
        let g = generate(None, Some(16), 5, TINY).unwrap();
        assert_eq!(g.case, "generate:16");
        assert_eq!(g.extra["tokens"].as_array().unwrap().len(), 5);
    }
}
