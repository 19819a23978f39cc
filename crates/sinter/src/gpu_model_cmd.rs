//! `sinter bench gpu-model`: a training step's predicted time on a named GPU, without a GPU.
//!
//! The emulated CUDA device runs in trace-only mode: the
//! trainer's own step engine runs (forward, backward, clipping, AdamW, autocast), every kernel
//! launch and library call is recorded with its bytes and FLOPs and none is executed, and the
//! GPU model (`sinter_core::cuda::runtime::gpu_model`) turns the record into a time. The loss the
//! step computes is meaningless (nothing ran). `--budget FILE` holds the record to the launch
//! and byte budget in FILE (bench/gpu/budget.toml), naming every kernel that grew.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use sinter_core::cuda::runtime::gpu_model::{
    cost, enable_trace, predict, Call, Efficiency, GpuSpec, Prediction, Row,
};
use sinter_core::Device;
use sinter_data::DataLoader;
use sinter_nn::LrSchedule;

use crate::config::{ConfigFile, TrainConfig};
use crate::trainer::engine::local::LocalEngine;
use crate::trainer::engine::{LrPlan, StepEngine};
use crate::trainer::GraphMode;
use crate::trainer::{self, Console};

#[derive(Args, Clone, Debug)]
pub struct GpuModelArgs {
    /// A language model preset: gpt2, gpt-tiny, llama-tiny.
    #[arg(long, default_value = "gpt2")]
    pub model: String,
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    #[arg(long, default_value_t = 1024)]
    pub context: usize,
    /// fp32, tf32, bf16 or fp16.
    #[arg(long, default_value = "bf16")]
    pub precision: String,
    /// h100 or h200.
    #[arg(long, default_value = "h100")]
    pub gpu: String,
    /// Trace the step replayed from a captured CUDA graph, as `train` runs it on a GPU
    /// [default: on; the flag is kept for scripts that name it]
    #[arg(long, conflicts_with = "no_cuda_graph")]
    pub cuda_graph: bool,
    /// Trace eager steps instead, as `train --no-cuda-graph` runs them
    #[arg(long)]
    pub no_cuda_graph: bool,
    /// Table rows to print (the rest are summed in one row).
    #[arg(long, default_value_t = 30)]
    pub rows: usize,
    /// Also write the whole table here (markdown) and `<out>.json`.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Fail when the step's launches or bytes exceed this budget file's entry for the config.
    #[arg(long)]
    pub budget: Option<PathBuf>,
    /// Write (or replace) this config's entry in the budget file from this trace.
    #[arg(long)]
    pub write_budget: Option<PathBuf>,
}

impl GpuModelArgs {
    /// Whether the traced step is a graph replay (the default, as in `train`).
    fn graphed(&self) -> bool {
        !self.no_cuda_graph
    }
}

/// Eager steps before the traced one: the allocator's cache and every one-time upload warm up
/// (and with `--cuda-graph`, the capture happens and the traced step is a replay).
fn warmup_steps(graph: bool) -> u64 {
    if graph {
        crate::trainer::engine::graph::GRAPH_WARMUP_STEPS + 1
    } else {
        2
    }
}

pub fn run(a: &GpuModelArgs) -> Result<()> {
    if !["gpt2", "gpt-tiny", "llama-tiny"].contains(&a.model.as_str()) {
        bail!(
            "--model {}: gpu-model traces the language-model presets gpt2, gpt-tiny and llama-tiny",
            a.model
        );
    }
    let gpu = GpuSpec::named(&a.gpu)
        .ok_or_else(|| anyhow!("--gpu {}: valid GPUs: {}", a.gpu, GpuSpec::NAMES))?;
    enable_trace(gpu.clone()).map_err(|e| anyhow!("starting the trace-only device: {e}"))?;
    let traced = trace_step(a)?;
    let p = predict(&traced.calls, &gpu, &Efficiency::default());
    let text = report(a, &traced, &p);
    print!("{text}");
    if let Some(out) = &a.out {
        write_out(out, a, &traced, &p, &text)?;
    }
    let key = budget_key(a);
    if let Some(path) = &a.write_budget {
        write_budget(path, &key, &p)?;
        println!("wrote the budget [{key}] to {}", path.display());
    }
    if let Some(path) = &a.budget {
        check_budget(path, &key, &p)?;
        println!("within the budget [{key}] of {}", path.display());
    }
    Ok(())
}

/// What one traced step recorded.
struct Traced {
    calls: Vec<Call>,
    params: usize,
    layers: usize,
    width: usize,
}

/// The trainer's setup and step engine on the trace-only device, `warmup_steps` steps, then
/// one recorded step.
fn trace_step(a: &GpuModelArgs) -> Result<Traced> {
    let flags = ConfigFile {
        model: Some(a.model.clone()),
        data: Some("shakespeare".into()),
        batch_size: Some(a.batch_size),
        context: Some(a.context),
        precision: Some(a.precision.clone()),
        device: Some("cuda".into()),
        steps: Some(warmup_steps(a.graphed()) + 1),
        ..ConfigFile::default()
    };
    let config = TrainConfig::resolve(&flags)?;
    let precision = crate::precision::parse_precision(&config.precision)?;
    let device = Device::Cuda(0);
    let _ = precision.activate(device);
    let (layers, width) = gpt_dims(&a.model)?;
    let s = trainer::setup(config)?;
    let params = s.model.parameters().iter().map(|(_, t)| t.numel()).sum();
    let console = Console::new(true);
    let graph = match (a.cuda_graph, a.no_cuda_graph) {
        (true, _) => GraphMode::On,
        (_, true) => GraphMode::Off,
        // The presets' steps are all capturable, so `train`'s default captures them.
        _ => GraphMode::Auto,
    };
    let mut engine = LocalEngine::new(&s, device, precision, None, graph, console)?;
    let total = warmup_steps(a.graphed()) + 1;
    let lr = LrPlan {
        schedule: LrSchedule::Constant,
        base: s.config.lr,
    };
    engine.begin(&s, 0, total, lr)?;
    let mut loader = DataLoader::new(s.train.clone(), a.batch_size, true, true, s.config.seed);
    let mut batch = || -> Result<Vec<_>> {
        let b = loader.next_batch()?;
        Ok(vec![(
            trainer::to_tensor(b.inputs)?,
            trainer::to_tensor(b.targets)?,
        )])
    };
    for step in 0..total {
        let b = batch()?;
        if step + 1 == total {
            cost::start_recording();
        }
        engine
            .step(&s, step, &b)
            .with_context(|| format!("tracing step {step}"))?;
    }
    let calls = cost::stop_recording(0);
    engine.end();
    Ok(Traced {
        calls,
        params,
        layers,
        width,
    })
}

fn gpt_dims(model: &str) -> Result<(usize, usize)> {
    let c = sinter_models::DecoderConfig::preset(model)
        .ok_or_else(|| anyhow!("no GPT preset named {model}"))?;
    Ok((c.n_layer, c.n_embd))
}

/// llm.c's FLOPs per token: 6N + 6·L·C·T.
fn flops_per_token(t: &Traced, context: usize) -> f64 {
    6.0 * t.params as f64 + 6.0 * (t.layers * t.width * context) as f64
}

fn human(v: f64) -> String {
    match v {
        v if v >= 1e12 => format!("{:.2} T", v / 1e12),
        v if v >= 1e9 => format!("{:.2} G", v / 1e9),
        v if v >= 1e6 => format!("{:.2} M", v / 1e6),
        v if v >= 1e3 => format!("{:.1} k", v / 1e3),
        v => format!("{v:.0}"),
    }
}

fn report(a: &GpuModelArgs, t: &Traced, p: &Prediction) -> String {
    let tokens = (a.batch_size * a.context) as f64;
    let tok_s = tokens / p.seconds;
    let mfu = flops_per_token(t, a.context) * tok_s / p.gpu.tensor_flops;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# PREDICTED (cost model, no GPU): {} training step on {}\n\n{} batch {} × T {}, {}{}; one step traced after {} warm-up steps; efficiencies calibrated on one H100 (bench/RESULTS.md)\n",
        a.model,
        p.gpu.name,
        a.model,
        a.batch_size,
        a.context,
        a.precision,
        if a.graphed() { ", CUDA graph" } else { ", eager" },
        warmup_steps(a.graphed())
    );
    let _ = writeln!(
        s,
        "| kernel / call | class | calls | bytes | FLOPs (tensor) | FLOPs (CUDA cores) | predicted µs | share |\n|---|---|---:|---:|---:|---:|---:|---:|"
    );
    let row = |s: &mut String,
               key: &str,
               class: &str,
               calls: u64,
               bytes: u64,
               tf: u64,
               f: u64,
               sec: f64| {
        let _ = writeln!(
            s,
            "| {key} | {class} | {calls} | {}B | {} | {} | {:.1} | {:.1} % |",
            human(bytes as f64),
            human(tf as f64),
            human(f as f64),
            sec * 1e6,
            100.0 * sec / p.seconds
        );
    };
    for r in p.rows.iter().take(a.rows) {
        let class = r.class.map_or("", |c| c.name());
        let key = if r.declared {
            r.key.clone()
        } else {
            format!("{} (estimated)", r.key)
        };
        row(
            &mut s,
            &key,
            class,
            r.calls,
            r.bytes,
            r.tensor_flops,
            r.flops,
            r.seconds,
        );
    }
    let rest = &p.rows[p.rows.len().min(a.rows)..];
    if !rest.is_empty() {
        let sum = |f: fn(&Row) -> u64| rest.iter().map(f).sum();
        row(
            &mut s,
            &format!("{} others", rest.len()),
            "",
            sum(|r| r.calls),
            sum(|r| r.bytes),
            sum(|r| r.tensor_flops),
            sum(|r| r.flops),
            rest.iter().map(|r| r.seconds).sum(),
        );
    }
    let _ = writeln!(
        s,
        "\n| class | calls | predicted ms | share |\n|---|---:|---:|---:|"
    );
    let mut by_class: BTreeMap<&str, (u64, f64)> = BTreeMap::new();
    for r in &p.rows {
        let e = by_class
            .entry(r.class.map_or("", |c| c.name()))
            .or_default();
        e.0 += r.calls;
        e.1 += r.seconds;
    }
    for (c, (n, sec)) in by_class {
        let _ = writeln!(
            s,
            "| {c} | {n} | {:.2} | {:.1} % |",
            sec * 1e3,
            100.0 * sec / p.seconds
        );
    }
    let estimated = p.rows.iter().filter(|r| !r.declared).count();
    let _ = writeln!(
        s,
        "\nlaunches per step: {} (kernels, library calls, memsets, device copies)\nbytes per step: {}B\nparameters: {}\npredicted step time: {:.2} ms\npredicted tokens/s: {:.0}\npredicted MFU (llm.c's count, 6N + 6·L·C·T per token at {:.0} TFLOP/s): {:.1} %\nrows whose traffic is estimated (their plan declares none): {estimated}\nPREDICTED, not measured: the loss of a traced step is meaningless (nothing ran).",
        p.launches,
        human(p.bytes as f64),
        t.params,
        p.seconds * 1e3,
        tok_s,
        p.gpu.tensor_flops / 1e12,
        100.0 * mfu
    );
    s
}

fn write_out(out: &Path, a: &GpuModelArgs, t: &Traced, p: &Prediction, text: &str) -> Result<()> {
    std::fs::write(out, text).with_context(|| format!("cannot write {}", out.display()))?;
    let tokens = (a.batch_size * a.context) as f64;
    let rows: Vec<serde_json::Value> = p
        .rows
        .iter()
        .map(|r| {
            serde_json::json!({"key": r.key, "class": r.class.map(|c| c.name()), "calls": r.calls,
                "bytes": r.bytes, "tensor_flops": r.tensor_flops, "flops": r.flops,
                "seconds": r.seconds, "declared": r.declared})
        })
        .collect();
    let j = serde_json::json!({
        "predicted": true, "gpu": p.gpu.name, "model": a.model, "batch_size": a.batch_size,
        "context": a.context, "precision": a.precision, "cuda_graph": a.graphed(),
        "launches": p.launches, "bytes": p.bytes, "step_seconds": p.seconds,
        "tokens_per_second": tokens / p.seconds,
        "mfu": flops_per_token(t, a.context) * tokens / p.seconds / p.gpu.tensor_flops,
        "rows": rows,
    });
    let js = PathBuf::from(format!("{}.json", out.display()));
    std::fs::write(&js, serde_json::to_string_pretty(&j)?)
        .with_context(|| format!("cannot write {}", js.display()))
}

// ---- budget --------------------------------------------------------------------------------

/// One config's budget: launches and bytes per step, and per kernel / call.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
struct Budget {
    launches: u64,
    bytes: u64,
    /// Key → [calls, bytes].
    kernels: BTreeMap<String, [u64; 2]>,
}

/// The budget file's section for a config (the GPU does not matter: traffic is the GPU's
/// SM count aside the same on both).
fn budget_key(a: &GpuModelArgs) -> String {
    format!(
        "{}-b{}-t{}-{}{}",
        a.model,
        a.batch_size,
        a.context,
        a.precision,
        if a.graphed() { "" } else { "-eager" }
    )
}

fn read_budgets(path: &Path) -> Result<BTreeMap<String, Budget>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the budget file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("{} is not a budget file", path.display()))
}

fn budget_of(p: &Prediction) -> Budget {
    Budget {
        launches: p.launches,
        bytes: p.bytes,
        kernels: p
            .rows
            .iter()
            .filter(|r| r.class != Some(cost::OpClass::HostCopy))
            .map(|r| (r.key.clone(), [r.calls, r.bytes]))
            .collect(),
    }
}

fn write_budget(path: &Path, key: &str, p: &Prediction) -> Result<()> {
    let mut all = if path.exists() {
        read_budgets(path)?
    } else {
        BTreeMap::new()
    };
    all.insert(key.to_string(), budget_of(p));
    let head = "# Launches and bytes per training step that `sinter bench gpu-model` may record for\n# each config (a trace, no GPU; see crates/sinter/src/gpu_model_cmd.rs). The CI test\n# (crates/sinter/tests/emulated_cli.rs) fails when a step exceeds them. Raise on purpose with\n# `sinter bench gpu-model ... --write-budget bench/gpu/budget.toml`.\n\n";
    let body = toml::to_string(&all)?;
    std::fs::write(path, format!("{head}{body}"))
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Err naming every kernel that grew when `p` exceeds the budget's launches or bytes.
fn check_budget(path: &Path, key: &str, p: &Prediction) -> Result<()> {
    let all = read_budgets(path)?;
    let b = all.get(key).ok_or_else(|| {
        anyhow!(
            "{} has no budget for [{key}] (it has: {}); add one with --write-budget",
            path.display(),
            all.keys().cloned().collect::<Vec<_>>().join(", ")
        )
    })?;
    let now = budget_of(p);
    if now.launches <= b.launches && now.bytes <= b.bytes {
        return Ok(());
    }
    let mut grew = Vec::new();
    for (k, [calls, bytes]) in &now.kernels {
        match b.kernels.get(k) {
            None => grew.push(format!("{k}: new ({calls} calls, {bytes} bytes)")),
            Some([c0, b0]) if calls > c0 || bytes > b0 => {
                grew.push(format!("{k}: {c0} → {calls} calls, {b0} → {bytes} bytes"))
            }
            _ => {}
        }
    }
    bail!(
        "the traced step exceeds the budget [{key}] of {}: launches {} (budget {}), bytes {} (budget {}); grew: {}. If that is intended, raise the budget with --write-budget.",
        path.display(),
        now.launches,
        b.launches,
        now.bytes,
        b.bytes,
        if grew.is_empty() { "no single kernel (the total did)".to_string() } else { grew.join("; ") }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pred(rows: &[(&str, u64, u64)]) -> Prediction {
        let rows: Vec<Row> = rows
            .iter()
            .map(|&(k, calls, bytes)| Row {
                key: k.into(),
                class: Some(cost::OpClass::Elementwise),
                calls,
                bytes,
                declared: true,
                ..Row::default()
            })
            .collect();
        Prediction {
            gpu: GpuSpec::h100(),
            launches: rows.iter().map(|r| r.calls).sum(),
            bytes: rows.iter().map(|r| r.bytes).sum(),
            seconds: 1.0,
            rows,
        }
    }

    #[test]
    fn the_budget_check_names_the_kernel_that_grew() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("budget.toml");
        write_budget(
            &f,
            "gpt2-b1-t8-bf16",
            &pred(&[("add_bf16", 3, 300), ("gelu_bf16", 1, 50)]),
        )
        .unwrap();
        check_budget(&f, "gpt2-b1-t8-bf16", &pred(&[("add_bf16", 3, 300)])).unwrap();
        let e = check_budget(
            &f,
            "gpt2-b1-t8-bf16",
            &pred(&[("add_bf16", 3, 300), ("gelu_bf16", 2, 100)]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("gelu_bf16: 1 → 2 calls") && !e.contains("add_bf16:"),
            "{e}"
        );
        let e = check_budget(
            &f,
            "gpt2-b1-t8-bf16",
            &pred(&[("add_bf16", 3, 300), ("copy", 1, 60)]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("copy: new"), "{e}");
        let e = check_budget(&f, "other", &pred(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no budget for [other]") && e.contains("gpt2-b1-t8-bf16"),
            "{e}"
        );
    }
}
