//! Training configuration: defaults per model, then a TOML file, then command-line flags
//! (flags win). The resolved config is saved in every checkpoint so `--resume` needs no flags.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// Every key of a config file; each is optional so a file may set just a few.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub model: Option<String>,
    pub data: Option<String>,
    pub epochs: Option<u64>,
    pub steps: Option<u64>,
    pub batch_size: Option<usize>,
    pub lr: Option<f64>,
    pub optimizer: Option<String>,
    pub momentum: Option<f64>,
    pub weight_decay: Option<f64>,
    /// Learning-rate schedule: constant, cosine or step.
    pub lr_schedule: Option<String>,
    pub grad_clip: Option<f64>,
    pub context: Option<usize>,
    pub seed: Option<u64>,
    pub device: Option<String>,
    pub eval_interval: Option<u64>,
    pub eval_batches: Option<usize>,
    pub log_interval: Option<u64>,
    pub checkpoint_interval: Option<u64>,
    pub out: Option<PathBuf>,
    /// ZeRO stage for data-parallel runs: 0 (off), 1 or 2.
    pub zero: Option<u8>,
    /// Gradient bucket size of data parallel / ZeRO, MiB.
    pub bucket_mb: Option<f64>,
    /// Micro-batches per optimizer step (gradient accumulation).
    pub grad_accum: Option<u64>,
    /// Activation checkpointing of GPT blocks: none, attn or block.
    pub recompute: Option<String>,
    /// fp32, tf32, bf16 or fp16.
    pub precision: Option<String>,
    /// Keep the last N checkpoints as checkpoint-step<N>.safetensors.
    pub keep_last: Option<u64>,
    /// Keep the checkpoint of the best validation loss as best.safetensors.
    pub keep_best: Option<bool>,
    /// Stop when the validation loss has not improved for this many evaluations (0: never).
    pub early_stop: Option<u64>,
    /// The improvement of the validation loss that counts for early stopping.
    pub early_stop_delta: Option<f64>,
    /// Train conv → BatchNorm pairs as one fused op that recomputes the convolution.
    pub fuse_conv_bn: Option<bool>,
    /// Optimizer parameter groups: `PATTERN:lr=X,weight_decay=Y` rules (see param_groups.rs).
    pub param_group: Option<Vec<String>>,
    /// LoRA: adapters of this rank on a frozen pretrained model.
    pub lora_rank: Option<usize>,
    pub lora_alpha: Option<f64>,
    pub lora_dropout: Option<f32>,
    pub lora_targets: Option<String>,
    pub lora_base: Option<String>,
    /// Where a LoRA run also writes its adapter in PEFT's format.
    pub export_adapter: Option<PathBuf>,

    // How this invocation runs (not saved in checkpoints): see `TrainArgs` for each.
    pub resume: Option<PathBuf>,
    pub overwrite: Option<bool>,
    pub stop_at_step: Option<u64>,
    pub quiet: Option<bool>,
    pub cuda_graph: Option<bool>,
    pub dp: Option<bool>,
    pub dist_backend: Option<String>,
    pub tp: Option<usize>,
    pub pp: Option<usize>,
    pub micro_batches: Option<usize>,
    /// The pipeline schedule (`--schedule`, alias `--pp-schedule`).
    #[serde(alias = "pp_schedule")]
    pub schedule: Option<String>,
}

impl ConfigFile {
    pub fn load(path: &Path) -> Result<ConfigFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| {
            format!(
                "config file {} is not valid (keys are the long flag names with '_' for '-')",
                path.display()
            )
        })
    }
    /// Values from `over` replace ours where set.
    pub fn overlay(mut self, over: &ConfigFile) -> ConfigFile {
        macro_rules! take {
            ($($f:ident),*) => { $( if over.$f.is_some() { self.$f = over.$f.clone(); } )* };
        }
        take!(
            model,
            data,
            epochs,
            steps,
            batch_size,
            lr,
            optimizer,
            momentum,
            weight_decay,
            lr_schedule,
            grad_clip,
            context,
            seed,
            device,
            eval_interval,
            eval_batches,
            log_interval,
            checkpoint_interval,
            out,
            zero,
            bucket_mb,
            grad_accum,
            recompute,
            precision,
            keep_last,
            keep_best,
            early_stop,
            early_stop_delta,
            fuse_conv_bn,
            param_group,
            lora_rank,
            lora_alpha,
            lora_dropout,
            lora_targets,
            lora_base,
            export_adapter,
            resume,
            overwrite,
            stop_at_step,
            quiet,
            cuda_graph,
            dp,
            dist_backend,
            tp,
            pp,
            micro_batches,
            schedule
        );
        self
    }

    /// Whether an on/off key is on.
    pub fn on(flag: Option<bool>) -> bool {
        flag == Some(true)
    }
}

/// The fully resolved settings of one run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TrainConfig {
    pub model: String,
    pub data: String,
    /// Total optimizer steps (derived from epochs when given as epochs).
    pub steps: u64,
    pub epochs: Option<u64>,
    pub batch_size: usize,
    pub lr: f64,
    pub optimizer: String,
    pub momentum: f64,
    pub weight_decay: f64,
    /// Learning-rate schedule (`schedule` in checkpoints written before it was renamed).
    #[serde(alias = "schedule")]
    pub lr_schedule: String,
    pub grad_clip: Option<f64>,
    pub context: usize,
    pub seed: u64,
    pub device: String,
    pub eval_interval: u64,
    pub eval_batches: usize,
    pub log_interval: u64,
    pub checkpoint_interval: u64,
    /// ZeRO stage (0: plain data parallel or a single process).
    #[serde(default)]
    pub zero: u8,
    /// Gradient bucket size, MiB.
    #[serde(default = "default_bucket_mb")]
    pub bucket_mb: f64,
    /// Micro-batches per optimizer step; `batch_size` is per micro-batch and per rank.
    #[serde(default = "one")]
    pub grad_accum: u64,
    /// Data-parallel ranks this run was trained with (checkpoints record it, so a run
    /// resumed on another world size keeps the global batch).
    #[serde(default = "one_rank")]
    pub world_size: usize,
    /// Activation checkpointing of GPT blocks: none, attn or block.
    #[serde(default = "no_recompute")]
    pub recompute: String,
    /// fp32, tf32, bf16 or fp16.
    #[serde(default = "fp32")]
    pub precision: String,
    /// Checkpoints kept besides the latest (checkpoint-step<N>.safetensors); 0: none.
    #[serde(default)]
    pub keep_last: u64,
    /// Keep the best validation loss's checkpoint as best.safetensors.
    #[serde(default)]
    pub keep_best: bool,
    /// Evaluations without improvement before the run stops; 0: never.
    #[serde(default)]
    pub early_stop: u64,
    /// The decrease of the validation loss that counts as an improvement.
    #[serde(default)]
    pub early_stop_delta: f64,
    /// Conv → BatchNorm pairs trained as one fused op (`--fuse-conv-bn`).
    #[serde(default)]
    pub fuse_conv_bn: bool,
    /// Optimizer parameter group rules (`--param-group`), in order.
    #[serde(default)]
    pub param_groups: Vec<String>,
    /// LoRA adapters on a frozen pretrained model (`--lora-rank`); None: full fine-tuning.
    #[serde(default)]
    pub lora: Option<LoraSettings>,
}

/// A run's LoRA settings (saved in its checkpoints, so a resumed run rebuilds its adapters).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraSettings {
    pub rank: usize,
    pub alpha: f64,
    pub dropout: f32,
    /// A regular expression searched in each projection's Hugging Face module name
    /// (`model.layers.3.self_attn.q_proj`).
    pub targets: String,
    /// How the frozen base is kept (`LORA_BASES`): f32, int8 per output channel, GGML blocks
    /// quantized at load, or a GGUF file's own blocks (QLoRA).
    #[serde(default = "f32_base")]
    pub base: String,
}

fn f32_base() -> String {
    "f32".into()
}

/// How `--lora-base` keeps the frozen base: f32; int8 per output channel; GGML blocks
/// quantized at load (q8_0, q4_0, q4_1, q4_k); or `gguf`, a GGUF file's own blocks as stored
/// (never dequantized: the 4-bit QLoRA of a Q4 file in the least memory).
pub const LORA_BASES: [&str; 7] = ["f32", "int8", "q8_0", "q4_0", "q4_1", "q4_k", "gguf"];

impl LoraSettings {
    pub fn config(&self) -> sinter_nn::lora::LoraConfig {
        sinter_nn::lora::LoraConfig {
            rank: self.rank,
            alpha: self.alpha,
            dropout: self.dropout,
        }
    }
    pub fn check(&self) -> Result<()> {
        self.config()
            .check()
            .map_err(|e| anyhow::anyhow!("--lora-rank/--lora-alpha/--lora-dropout: {e}"))?;
        if !LORA_BASES.contains(&self.base.as_str()) {
            bail!(
                "--lora-base must be one of {}, got '{}'",
                LORA_BASES.join(", "),
                self.base
            );
        }
        regex::Regex::new(&self.targets).map_err(|e| {
            anyhow::anyhow!(
                "--lora-targets '{}' is not a regular expression: {e}",
                self.targets
            )
        })?;
        Ok(())
    }
}

/// The LoRA settings of a layered config: on when `lora_rank` is given.
fn lora_settings(c: &ConfigFile) -> Result<Option<LoraSettings>> {
    let Some(rank) = c.lora_rank else {
        for (set, flag) in [
            (c.lora_alpha.is_some(), "--lora-alpha"),
            (c.lora_dropout.is_some(), "--lora-dropout"),
            (c.lora_targets.is_some(), "--lora-targets"),
            (c.lora_base.is_some(), "--lora-base"),
            (c.export_adapter.is_some(), "--export-adapter"),
        ] {
            if set {
                bail!("{flag} configures LoRA adapters, but there are none; add --lora-rank R");
            }
        }
        return Ok(None);
    };
    Ok(Some(LoraSettings {
        rank,
        // α = r: the adapter's product at scale 1.
        alpha: c.lora_alpha.unwrap_or(rank as f64),
        dropout: c.lora_dropout.unwrap_or(0.0),
        targets: c
            .lora_targets
            .clone()
            .unwrap_or_else(|| sinter_nn::lora::DEFAULT_TARGETS.into()),
        base: c.lora_base.clone().unwrap_or_else(f32_base),
    }))
}

fn fp32() -> String {
    "fp32".into()
}

fn no_recompute() -> String {
    "none".into()
}

fn default_bucket_mb() -> f64 {
    sinter_dist::DEFAULT_BUCKET_MB
}
fn one() -> u64 {
    1
}
fn one_rank() -> usize {
    1
}

impl TrainConfig {
    /// Checks the distributed settings (also for configs read back from checkpoints).
    pub fn check_parallel(&self) -> Result<()> {
        if self.zero > 2 {
            bail!("--zero must be 0, 1 or 2, got {}", self.zero);
        }
        if self.grad_accum == 0 {
            bail!("--grad-accum must be at least 1");
        }
        if !(self.bucket_mb.is_finite() && self.bucket_mb > 0.0) {
            bail!(
                "--bucket-mb must be a positive number of MiB, got {}",
                self.bucket_mb
            );
        }
        if self.world_size == 0 {
            bail!("world_size must be at least 1");
        }
        Ok(())
    }

    /// Checks every setting: the flags of a new run and the config a checkpoint holds go
    /// through this same test, so neither can start a run the other would refuse.
    pub fn validate(&self) -> Result<()> {
        check_model(&self.model)?;
        check_name("optimizer", &self.optimizer, OPTIMIZERS)?;
        check_name("lr-schedule", &self.lr_schedule, SCHEDULES)?;
        check_name("recompute mode", &self.recompute, RECOMPUTE)?;
        crate::precision::parse_precision(&self.precision)?;
        sinter_data::DataSpec::parse(&self.data)?;
        check_device_name(&self.device)?;
        if self.batch_size == 0 {
            bail!("--batch-size must be at least 1");
        }
        if self.context == 0 {
            bail!("--context must be at least 1");
        }
        if self.log_interval == 0 {
            bail!("--log-interval must be at least 1");
        }
        if self.epochs.is_none() && self.steps == 0 || self.epochs == Some(0) {
            bail!("nothing to train: --steps or --epochs must be at least 1");
        }
        positive("--lr", self.lr)?;
        non_negative("--weight-decay", self.weight_decay)?;
        non_negative("--momentum", self.momentum)?;
        if let Some(c) = self.grad_clip {
            positive("--grad-clip", c)?;
        }
        non_negative("--early-stop-delta", self.early_stop_delta)?;
        crate::param_groups::check(&self.param_groups)?;
        if let Some(l) = &self.lora {
            l.check()?;
            if pretrained_path(&self.model).is_none() {
                bail!("--lora-rank trains adapters on a pretrained model; give --model PATH (a .gguf file or a Hugging Face directory), not {}", self.model);
            }
        }
        self.check_parallel()
    }
}

/// A finite number above 0.
fn positive(flag: &str, v: f64) -> Result<()> {
    if !(v.is_finite() && v > 0.0) {
        bail!("{flag} must be a positive number, got {v}");
    }
    Ok(())
}

/// A finite number of at least 0.
fn non_negative(flag: &str, v: f64) -> Result<()> {
    if !(v.is_finite() && v >= 0.0) {
        bail!("{flag} must be a number of at least 0, got {v}");
    }
    Ok(())
}

/// `auto`, `cpu`, `cuda` or `cuda:N` (whether the device exists is checked when the run
/// starts).
fn check_device_name(name: &str) -> Result<()> {
    let known = ["auto", crate::precision::EMULATED].contains(&name);
    if !known && sinter_core::Device::parse(name).is_none() {
        bail!("unknown device '{name}'; valid devices: auto, cpu, cuda, cuda:N, cuda-emu");
    }
    Ok(())
}

pub const OPTIMIZERS: &[&str] = &["adamw", "sgd"];
pub const SCHEDULES: &[&str] = &["constant", "cosine", "step"];
pub const RECOMPUTE: &[&str] = &["none", "attn", "block"];

/// The path of a pretrained model (a .gguf file or a Hugging Face directory) when `model`
/// names one: every `--model` that is not a preset is a path.
pub fn pretrained_path(model: &str) -> Option<&Path> {
    (!sinter_models::MODEL_NAMES.contains(&model)).then(|| Path::new(model))
}

/// What a `--model` trains for: a preset's task; a pretrained model is a language model.
pub fn task_of_model(model: &str) -> Option<sinter_models::Task> {
    match pretrained_path(model) {
        Some(_) => Some(sinter_models::Task::LanguageModel),
        None => sinter_models::task_of(model),
    }
}

/// A preset name, or a pretrained model's path that exists.
fn check_model(model: &str) -> Result<()> {
    let Some(path) = pretrained_path(model) else {
        return Ok(());
    };
    if !path.exists() {
        bail!(
            "unknown model '{model}': not a preset ({}) and no file or directory of that name exists; give a preset, or the path of a .gguf file or a Hugging Face model directory (config.json + safetensors + tokenizer.json)",
            sinter_models::MODEL_NAMES.join(", ")
        );
    }
    Ok(())
}

/// `--model` as a run records it: a preset's name, or a pretrained model's absolute path (so
/// that `--resume` and `eval` find it again from any directory).
pub fn model_source(model: &str) -> Result<String> {
    check_model(model)?;
    let Some(path) = pretrained_path(model) else {
        return Ok(model.to_string());
    };
    let abs = std::fs::canonicalize(path)
        .with_context(|| format!("--model {model}: cannot resolve the path"))?;
    abs.to_str().map(String::from).with_context(|| {
        format!("--model {model}: the path is not valid UTF-8; move the model to a UTF-8 path")
    })
}

/// Defaults chosen so that the model learns its default data on a 2-core CPU.
pub fn defaults_for(model: &str) -> ConfigFile {
    // A pretrained model fine-tunes: GPT's defaults with a small learning rate and a longer
    // context (its tokenizer packs more text into a token than bytes do).
    let pretrained = pretrained_path(model).is_some();
    // Sequence models (GPT, Llama, BERT) share their defaults; BERT-base trains at length 128.
    let gpt = ["gpt", "llama", "bert"]
        .iter()
        .any(|p| model.starts_with(p))
        || pretrained;
    ConfigFile {
        model: Some(model.into()),
        data: Some(if gpt { "shakespeare" } else { "digits" }.into()),
        epochs: if gpt {
            None
        } else {
            Some(if model == "resnet18" { 5 } else { 30 })
        },
        steps: if gpt { Some(2000) } else { None },
        batch_size: Some(if gpt { 12 } else { 64 }),
        // Post-LayerNorm BERT diverges at GPT's 2e-3.
        lr: Some(if pretrained {
            1e-4
        } else if model.starts_with("bert") {
            1e-3
        } else {
            2e-3
        }),
        optimizer: Some("adamw".into()),
        momentum: Some(0.9),
        weight_decay: Some(if gpt { 0.1 } else { 1e-4 }),
        lr_schedule: Some("cosine".into()),
        grad_clip: if gpt { Some(1.0) } else { None },
        context: Some(match model {
            "gpt2" => 1024,
            "bert-base" => 128,
            _ if pretrained => 256,
            _ => 64,
        }),
        seed: Some(1337),
        device: Some("auto".into()),
        eval_interval: Some(if gpt { 250 } else { 0 }),
        eval_batches: Some(if gpt { 40 } else { 0 }),
        log_interval: Some(if gpt { 10 } else { 5 }),
        checkpoint_interval: Some(if gpt { 500 } else { 0 }),
        out: None,
        zero: Some(0),
        bucket_mb: Some(sinter_dist::DEFAULT_BUCKET_MB),
        grad_accum: Some(1),
        recompute: None,
        precision: None,
        keep_last: Some(0),
        keep_best: Some(false),
        early_stop: Some(0),
        early_stop_delta: Some(0.0),
        fuse_conv_bn: None,
        param_group: None,
        ..ConfigFile::default()
    }
}

fn check_name(kind: &str, name: &str, valid: &[&str]) -> Result<()> {
    if !valid.contains(&name) {
        bail!(
            "unknown {kind} '{name}'; valid {kind}s: {}",
            valid.join(", ")
        );
    }
    Ok(())
}

impl TrainConfig {
    /// Resolves a layered config. `batches_per_epoch` turns epochs into steps once the data
    /// is open, so it is applied later by `set_epochs`.
    pub fn resolve(layers: &ConfigFile) -> Result<TrainConfig> {
        let model = model_source(layers.model.as_deref().unwrap_or("cnn"))?;
        let c = defaults_for(&model).overlay(layers);
        // An explicit --steps wins over the model's default epochs, and vice versa.
        let (steps, epochs) = match (layers.steps, layers.epochs) {
            (Some(_), Some(_)) => bail!("give --epochs or --steps, not both"),
            (Some(s), None) => (s, None),
            (None, Some(e)) => (0, Some(e)),
            (None, None) => (c.steps.unwrap_or(0), c.epochs),
        };
        let c = TrainConfig {
            model,
            data: c.data.clone().expect("default"),
            steps,
            epochs,
            batch_size: c.batch_size.expect("default"),
            lr: c.lr.expect("default"),
            optimizer: c.optimizer.clone().expect("default"),
            momentum: c.momentum.expect("default"),
            weight_decay: c.weight_decay.expect("default"),
            lr_schedule: c.lr_schedule.clone().expect("default"),
            grad_clip: c.grad_clip,
            context: c.context.expect("default"),
            seed: c.seed.expect("default"),
            device: c.device.clone().expect("default"),
            eval_interval: c.eval_interval.expect("default"),
            eval_batches: c.eval_batches.expect("default"),
            log_interval: c.log_interval.expect("default"),
            checkpoint_interval: c.checkpoint_interval.expect("default"),
            zero: c.zero.expect("default"),
            bucket_mb: c.bucket_mb.expect("default"),
            grad_accum: c.grad_accum.expect("default"),
            recompute: layers.recompute.clone().unwrap_or_else(no_recompute),
            precision: layers.precision.clone().unwrap_or_else(fp32),
            world_size: 1,
            keep_last: c.keep_last.expect("default"),
            keep_best: c.keep_best.expect("default"),
            early_stop: c.early_stop.expect("default"),
            early_stop_delta: c.early_stop_delta.expect("default"),
            fuse_conv_bn: c.fuse_conv_bn.unwrap_or(false),
            param_groups: c.param_group.clone().unwrap_or_default(),
            lora: lora_settings(layers)?,
        };
        c.validate()?;
        Ok(c)
    }
}

/// A resumed run's config: the checkpoint's, with what the flags (and `--config`) given now
/// may change applied — each change noted in the returned lines — and a clear refusal for
/// what a resumed run cannot change. `at_epoch_start`: the checkpoint sits at the start of
/// an epoch (the batch size may change there).
pub fn resume_config(
    saved: &TrainConfig,
    given: &ConfigFile,
    at_epoch_start: bool,
) -> Result<(TrainConfig, Vec<String>)> {
    let mut c = saved.clone();
    let mut notes = Vec::new();
    // A model path given again names the checkpoint's model however it is spelled.
    let mut given = given.clone();
    if let Some(m) = &given.model {
        given.model = Some(model_source(m)?);
    }
    let given = &given;
    // Fixed for the whole run: (flag, given, saved, why).
    macro_rules! fixed {
        ($($f:ident, $flag:literal, $why:expr);* $(;)?) => { $(
            if let Some(v) = &given.$f {
                if *v != saved.$f {
                    bail!("{} {} differs from the checkpoint's {}; a resumed run keeps it ({}). Drop {} or start a new run", $flag, v, saved.$f, $why, $flag);
                }
            }
        )* };
    }
    fixed!(
        model, "--model", format!("the checkpoint's weights are a {}", saved.model);
        data, "--data", "the checkpoint's data position is a place in that data";
        context, "--context", "the model and the data windows are built for it";
        seed, "--seed", "the data order, dropout and masks follow it";
        optimizer, "--optimizer", format!("the checkpoint holds {}'s state", saved.optimizer);
        grad_accum, "--grad-accum", "a resumed run keeps its global batch";
    );
    let lora_given = given.lora_rank.is_some()
        || given.lora_alpha.is_some()
        || given.lora_dropout.is_some()
        || given.lora_targets.is_some()
        || given.lora_base.is_some();
    if lora_given && lora_settings(given)? != saved.lora {
        bail!("the --lora-* flags differ from the checkpoint's LoRA settings ({:?}); a resumed run keeps its adapters. Drop them or start a new run", saved.lora);
    }
    if let Some(b) = given.batch_size.filter(|&b| b != saved.batch_size) {
        if !at_epoch_start {
            bail!("--batch-size {b} differs from the checkpoint's {} (per rank); a resumed run keeps its batch size within an epoch, since the checkpoint's data position counts batches of that size. Drop --batch-size (another number of ranks reshards the batch by itself), or resume from a checkpoint at the start of an epoch", saved.batch_size);
        }
        notes.push(format!(
            "--batch-size {b} (the checkpoint had {}; it is at the start of an epoch)",
            saved.batch_size
        ));
        c.batch_size = b;
    }
    // May change: (field, flag).
    macro_rules! changeable {
        ($($f:ident, $flag:literal);* $(;)?) => { $(
            if let Some(v) = &given.$f {
                if *v != saved.$f {
                    notes.push(format!("{} {} (the checkpoint had {})", $flag, v, saved.$f));
                    c.$f = v.clone();
                }
            }
        )* };
    }
    changeable!(
        lr, "--lr"; lr_schedule, "--lr-schedule"; weight_decay, "--weight-decay";
        eval_interval, "--eval-interval"; eval_batches, "--eval-batches";
        log_interval, "--log-interval"; checkpoint_interval, "--checkpoint-interval";
        zero, "--zero"; bucket_mb, "--bucket-mb"; device, "--device";
        precision, "--precision"; recompute, "--recompute"; keep_last, "--keep-last";
        keep_best, "--keep-best"; early_stop, "--early-stop";
        early_stop_delta, "--early-stop-delta";
    );
    if let Some(m) = given.momentum.filter(|&m| m != saved.momentum) {
        if saved.optimizer == "sgd" && (m > 0.0) != (saved.momentum > 0.0) {
            bail!("--momentum {m} differs from the checkpoint's {} in whether SGD keeps a momentum buffer; a resumed run keeps that. Drop --momentum or give another non-zero value", saved.momentum);
        }
        notes.push(format!(
            "--momentum {m} (the checkpoint had {})",
            saved.momentum
        ));
        c.momentum = m;
    }
    if let Some(g) = given
        .param_group
        .as_ref()
        .filter(|&g| *g != saved.param_groups)
    {
        notes.push(format!(
            "--param-group {} (the checkpoint had {})",
            g.join(" "),
            if saved.param_groups.is_empty() {
                "none".into()
            } else {
                saved.param_groups.join(" ")
            }
        ));
        c.param_groups = g.clone();
    }
    if let Some(g) = given.grad_clip.filter(|&g| Some(g) != saved.grad_clip) {
        notes.push(format!(
            "--grad-clip {g} (the checkpoint had {:?})",
            saved.grad_clip
        ));
        c.grad_clip = Some(g);
    }
    match (given.steps, given.epochs) {
        (Some(_), Some(_)) => bail!("give --epochs or --steps, not both"),
        (Some(s), None) if s != saved.steps || saved.epochs.is_some() => {
            notes.push(format!(
                "--steps {s} (the checkpoint's run had {} steps)",
                saved.steps
            ));
            c.steps = s;
            c.epochs = None;
        }
        (None, Some(e)) if Some(e) != saved.epochs => {
            notes.push(format!(
                "--epochs {e} (the checkpoint's run had {})",
                saved.epochs.map_or_else(
                    || format!("{} steps", saved.steps),
                    |e| format!("{e} epochs")
                )
            ));
            c.epochs = Some(e);
        }
        _ => {}
    }
    c.validate()?;
    Ok((c, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama-tiny is a language model: it trains on text by steps, as gpt-tiny does, not
    /// on digits by epochs.
    #[test]
    fn decoders_get_the_language_model_defaults() {
        for m in ["gpt-tiny", "llama-tiny"] {
            let d = defaults_for(m);
            assert_eq!(d.data.as_deref(), Some("shakespeare"), "{m}");
            assert_eq!(
                (d.steps, d.epochs, d.batch_size),
                (Some(2000), None, Some(12)),
                "{m}"
            );
        }
        assert_eq!(defaults_for("cnn").data.as_deref(), Some("digits"));
    }

    #[test]
    fn flags_win_over_file_and_file_over_defaults() {
        let file = ConfigFile {
            lr: Some(0.5),
            batch_size: Some(7),
            ..Default::default()
        };
        let flags = ConfigFile {
            lr: Some(0.25),
            ..Default::default()
        };
        let c = TrainConfig::resolve(&file.overlay(&flags)).unwrap();
        assert_eq!(
            (c.lr, c.batch_size, c.model.as_str(), c.data.as_str()),
            (0.25, 7, "cnn", "digits")
        );
        let e = TrainConfig::resolve(&ConfigFile {
            model: Some("vgg".into()),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("gpt-tiny"), "{e}");
        let t = TrainConfig::resolve(&ConfigFile {
            model: Some("gpt-tiny".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!((t.steps, t.data.as_str()), (2000, "shakespeare"));
        assert!(toml::from_str::<ConfigFile>("lr = 1.0\nbogus = 2").is_err());
        let d = TrainConfig::resolve(
            &toml::from_str::<ConfigFile>("zero = 2\ngrad_accum = 4\nbucket_mb = 1.5").unwrap(),
        )
        .unwrap();
        assert_eq!(
            (d.zero, d.grad_accum, d.bucket_mb, d.world_size),
            (2, 4, 1.5, 1)
        );
        assert!(TrainConfig::resolve(&ConfigFile {
            zero: Some(3),
            ..Default::default()
        })
        .is_err());
        assert!(TrainConfig::resolve(&ConfigFile {
            grad_accum: Some(0),
            ..Default::default()
        })
        .is_err());
        // Checkpoints written before these keys existed still read back.
        let mut old = serde_json::to_value(&t).unwrap();
        for k in ["zero", "bucket_mb", "grad_accum", "world_size"] {
            old.as_object_mut().unwrap().remove(k);
        }
        let back: TrainConfig = serde_json::from_value(old).unwrap();
        assert_eq!((back.zero, back.grad_accum, back.world_size), (0, 1, 1));
    }
}
