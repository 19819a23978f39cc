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
    /// Train conv → BatchNorm pairs as one fused op that recomputes the convolution.
    pub fuse_conv_bn: Option<bool>,
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
            fuse_conv_bn
        );
        self
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
    /// Conv → BatchNorm pairs trained as one fused op (`--fuse-conv-bn`).
    #[serde(default)]
    pub fuse_conv_bn: bool,
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
        Ok(())
    }

    /// Samples per optimizer step over all ranks.
    pub fn global_batch(&self) -> usize {
        self.batch_size * self.world_size * self.grad_accum as usize
    }
}

pub const OPTIMIZERS: &[&str] = &["adamw", "sgd"];
pub const SCHEDULES: &[&str] = &["constant", "cosine", "step"];

/// Defaults chosen so that the model learns its default data on a 2-core CPU.
pub fn defaults_for(model: &str) -> ConfigFile {
    // Sequence models (GPT, BERT) share their defaults; BERT-base trains at length 128.
    let gpt = model.starts_with("gpt") || model.starts_with("bert");
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
        lr: Some(if model.starts_with("bert") {
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
        fuse_conv_bn: None,
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
        let model = layers.model.clone().unwrap_or_else(|| "cnn".into());
        check_name("model", &model, sinter_models::MODEL_NAMES)?;
        let c = defaults_for(&model).overlay(layers);
        let optimizer = c.optimizer.clone().expect("default");
        check_name("optimizer", &optimizer, OPTIMIZERS)?;
        let lr_schedule = c.lr_schedule.clone().expect("default");
        check_name("lr-schedule", &lr_schedule, SCHEDULES)?;
        let batch_size = c.batch_size.expect("default");
        if batch_size == 0 {
            bail!("--batch-size must be at least 1");
        }
        let lr = c.lr.expect("default");
        if !(lr.is_finite() && lr > 0.0) {
            bail!("--lr must be a positive number, got {lr}");
        }
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
            batch_size,
            lr,
            optimizer,
            momentum: c.momentum.expect("default"),
            weight_decay: c.weight_decay.expect("default"),
            lr_schedule,
            grad_clip: c.grad_clip,
            context: c.context.expect("default"),
            seed: c.seed.expect("default"),
            device: c.device.clone().expect("default"),
            eval_interval: c.eval_interval.expect("default"),
            eval_batches: c.eval_batches.expect("default"),
            log_interval: c.log_interval.expect("default").max(1),
            checkpoint_interval: c.checkpoint_interval.expect("default"),
            zero: c.zero.expect("default"),
            bucket_mb: c.bucket_mb.expect("default"),
            grad_accum: c.grad_accum.expect("default"),
            recompute: {
                let r = layers.recompute.clone().unwrap_or_else(no_recompute);
                check_name("recompute mode", &r, &["none", "attn", "block"])?;
                r
            },
            precision: {
                let p = layers.precision.clone().unwrap_or_else(fp32);
                crate::precision::parse_precision(&p)?;
                p
            },
            world_size: 1,
            fuse_conv_bn: c.fuse_conv_bn.unwrap_or(false),
        };
        c.check_parallel()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
