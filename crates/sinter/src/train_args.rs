//! `sinter train`'s flags, their help (each with its default, per model where it varies),
//! and the checks between flags that no single flag can make.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use crate::config::ConfigFile;

const RUN: &str = "Run";
const OPTIM: &str = "Optimization";
const OUTPUT: &str = "Evaluation, logging and checkpoints";
const DEVICE: &str = "Device and precision";
const LORA: &str = "LoRA (adapters on a frozen pretrained model)";
const PARALLEL: &str = "Parallel training (run under `sinter launch`)";

#[derive(Args, Default)]
pub struct TrainArgs {
    /// Model: mlp, cnn, cnn-bn, resnet18, gpt-tiny, gpt2, llama-tiny, bert-tiny or bert-base;
    /// or a pretrained Llama-family model to fine-tune, a .gguf file or a Hugging Face
    /// directory, whose tokenizer encodes text: data [default: cnn].
    #[arg(long, help_heading = RUN)]
    pub model: Option<String>,
    /// Data: digits, shakespeare, mnist:DIR, cifar10:DIR, text:FILE or tokens:FILE_OR_DIR
    /// [default: digits for mlp/cnn/resnet18, shakespeare for GPT and BERT].
    #[arg(long, help_heading = RUN)]
    pub data: Option<String>,
    /// Passes over the training data [default: 30 for mlp/cnn, 5 for resnet18; GPT and BERT
    /// count --steps].
    #[arg(long, help_heading = RUN)]
    pub epochs: Option<u64>,
    /// Optimizer steps [default: 2000 for GPT and BERT; the others count --epochs].
    #[arg(long, help_heading = RUN)]
    pub steps: Option<u64>,
    /// Directory for metrics.jsonl/.csv, the TensorBoard event log, summary.json, loss.svg and
    /// checkpoints [default: none: nothing is written].
    #[arg(long, help_heading = RUN)]
    pub out: Option<PathBuf>,
    /// Continue the run saved in this directory; flags given now change what may change (the
    /// learning rate, schedule, steps, intervals, …) with a note, and refuse the rest
    /// [default: a new run].
    #[arg(long, help_heading = RUN)]
    pub resume: Option<PathBuf>,
    /// Start a new run in an --out directory that already holds one, replacing it
    /// [default: refuse].
    #[arg(long, help_heading = RUN)]
    pub overwrite: bool,
    /// TOML file whose keys are these flags' long names with '_' for '-' (`batch_size = 64`,
    /// `quiet = true`, `param_group = ["bias$:lr=0"]`): every flag but --config; flags win
    /// [default: none].
    #[arg(long, help_heading = RUN)]
    pub config: Option<PathBuf>,
    /// Stop after this step (checkpointing it); `--resume DIR` continues the same run
    /// [default: run to the end].
    #[arg(long, help_heading = RUN)]
    pub stop_at_step: Option<u64>,
    /// No progress bar or notes [default: off].
    #[arg(long, short, help_heading = RUN)]
    pub quiet: bool,

    /// Examples per batch (per rank and micro-step) [default: 64; 12 for GPT and BERT].
    #[arg(long, help_heading = OPTIM)]
    pub batch_size: Option<usize>,
    /// Peak learning rate [default: 2e-3; 1e-3 for BERT, 1e-4 for a pretrained model].
    #[arg(long, help_heading = OPTIM)]
    pub lr: Option<f64>,
    /// Optimizer: adamw or sgd [default: adamw].
    #[arg(long, help_heading = OPTIM)]
    pub optimizer: Option<String>,
    /// SGD momentum, at least 0 (Nesterov when above 0) [default: 0.9].
    #[arg(long, help_heading = OPTIM)]
    pub momentum: Option<f64>,
    /// Decoupled weight decay, at least 0; applied to matrices and embeddings, not to biases
    /// and norm gains [default: 1e-4; 0.1 for GPT and BERT].
    #[arg(long, help_heading = OPTIM)]
    pub weight_decay: Option<f64>,
    /// An optimizer parameter group, PATTERN:lr=X,weight_decay=Y (either or both; repeat the
    /// flag for more groups): the parameters whose name matches the regular expression
    /// PATTERN (e.g. 'bias$', '^wte', 'ln_|norm'; the first matching group wins) take that
    /// learning rate (0 freezes them; the schedule scales it like --lr) and weight decay
    /// [default: none: every parameter at --lr, with --weight-decay on matrices and
    /// embeddings only].
    #[arg(long, value_name = "PATTERN:SETTINGS", help_heading = OPTIM)]
    pub param_group: Vec<String>,
    /// Learning-rate schedule: constant, cosine (5 % linear warm-up, at most 500 steps, then
    /// cosine to 10 %) or step (×0.1 every third of the run) [default: cosine].
    #[arg(long, help_heading = OPTIM)]
    pub lr_schedule: Option<String>,
    /// Clip the global gradient norm to this value [default: none; 1.0 for GPT and BERT].
    #[arg(long, help_heading = OPTIM)]
    pub grad_clip: Option<f64>,
    /// Accumulate gradients over N micro-batches per step (only the last one communicates)
    /// [default: 1].
    #[arg(long, help_heading = OPTIM)]
    pub grad_accum: Option<u64>,
    /// Context length of language models, in tokens [default: 64; 1024 for gpt2, 128 for
    /// bert-base, 256 for a pretrained model (at most its own)].
    #[arg(long, help_heading = OPTIM)]
    pub context: Option<usize>,
    /// Seed of the initial weights, data order, dropout and masks [default: 1337].
    #[arg(long, help_heading = OPTIM)]
    pub seed: Option<u64>,

    /// Evaluate every N steps; 0: every epoch [default: 0; 250 for GPT and BERT].
    #[arg(long, help_heading = OUTPUT)]
    pub eval_interval: Option<u64>,
    /// Validation batches per evaluation; 0: all [default: 0; 40 for GPT and BERT].
    #[arg(long, help_heading = OUTPUT)]
    pub eval_batches: Option<usize>,
    /// Log the training loss every N steps [default: 5; 10 for GPT and BERT].
    #[arg(long, help_heading = OUTPUT)]
    pub log_interval: Option<u64>,
    /// Checkpoint every N steps; 0: every epoch; needs --out [default: 0; 500 for GPT and
    /// BERT].
    #[arg(long, help_heading = OUTPUT)]
    pub checkpoint_interval: Option<u64>,
    /// Also keep the last N checkpoints, as checkpoint-step<STEP>.safetensors; needs --out
    /// [default: 0: only the latest, checkpoint.safetensors].
    #[arg(long, help_heading = OUTPUT)]
    pub keep_last: Option<u64>,
    /// Keep the checkpoint of the best validation loss so far as best.safetensors; needs
    /// --out [default: off].
    #[arg(long, help_heading = OUTPUT)]
    pub keep_best: bool,
    /// Stop early when the validation loss has not improved for N evaluations in a row
    /// (checkpointing that step) [default: 0: never].
    #[arg(long, help_heading = OUTPUT)]
    pub early_stop: Option<u64>,
    /// The decrease of the validation loss that counts as an improvement for --early-stop
    /// [default: 0].
    #[arg(long, help_heading = OUTPUT)]
    pub early_stop_delta: Option<f64>,

    /// Device: auto (the first GPU if CUDA works here, else the CPU), cpu, cuda, cuda:N, or
    /// cuda-emu (the emulated CUDA device: the CUDA code path run on the CPU, for checking)
    /// [default: auto].
    #[arg(long, help_heading = DEVICE)]
    pub device: Option<String>,
    /// fp32, tf32, bf16 or fp16 (f32 master weights; fp16 with dynamic loss scaling)
    /// [default: fp32].
    #[arg(long, help_heading = DEVICE)]
    pub precision: Option<String>,
    /// Train LoRA adapters of this rank on the frozen pretrained --model instead of all its
    /// weights; checkpoints hold only the adapters, and the run ends by writing them in
    /// PEFT's format to OUT/adapter [default: off: full fine-tuning].
    #[arg(long, help_heading = LORA)]
    pub lora_rank: Option<usize>,
    /// LoRA's alpha: the adapters' product is scaled by alpha / rank [default: the rank].
    #[arg(long, help_heading = LORA)]
    pub lora_alpha: Option<f64>,
    /// Dropout on the adapters' inputs while training [default: 0].
    #[arg(long, help_heading = LORA)]
    pub lora_dropout: Option<f32>,
    /// Regular expression over the Hugging Face module names of the projections to adapt
    /// (model.layers.N.self_attn.q_proj, k_proj, v_proj, o_proj, mlp.gate_proj, up_proj,
    /// down_proj) [default: q_proj|v_proj, PEFT's for Llama].
    #[arg(long, help_heading = LORA)]
    pub lora_targets: Option<String>,
    /// How the frozen base is kept: f32; int8 (QLoRA: each projection int8 per output
    /// channel); q8_0, q4_0, q4_1 or q4_k (QLoRA in GGML blocks, quantized at load); or gguf
    /// (a .gguf --model's own blocks as stored, never dequantized). The quantized forms
    /// release the f32 weights; gradients reach the input through dequantized rows
    /// [default: f32].
    #[arg(long, help_heading = LORA)]
    pub lora_base: Option<String>,
    /// Also write the adapters in PEFT's format to this directory at the end [default: only
    /// OUT/adapter].
    #[arg(long, help_heading = LORA)]
    pub export_adapter: Option<PathBuf>,
    /// Activation checkpointing of GPT blocks: none, attn or block (recompute in backward)
    /// [default: none].
    #[arg(long, help_heading = DEVICE)]
    pub recompute: Option<String>,
    /// Train each conv → BatchNorm pair (cnn-bn, resnet18) as one op that recomputes the
    /// convolution in backward: the same values with less activation memory [default: off].
    #[arg(long, help_heading = DEVICE)]
    pub fuse_conv_bn: bool,
    /// Capture the whole training step as a CUDA graph after warm-up steps and replay it, and
    /// refuse a run whose step cannot be captured (data parallel, masked LM, dropout) [default:
    /// captured wherever it can be: CUDA, one process, static shapes, no dropout].
    #[arg(long, help_heading = DEVICE, conflicts_with = "no_cuda_graph")]
    pub cuda_graph: bool,
    /// Run every step eagerly, without capturing a CUDA graph [default: off].
    #[arg(long, help_heading = DEVICE)]
    pub no_cuda_graph: bool,

    /// Data parallel (on by itself when WORLD_SIZE > 1, e.g. under `sinter launch`)
    /// [default: off].
    #[arg(long, help_heading = PARALLEL)]
    pub dp: bool,
    /// ZeRO stage: 0 (off), 1 (optimizer state sharded) or 2 (gradients too); above 0 implies
    /// --dp [default: 0].
    #[arg(long, help_heading = PARALLEL)]
    pub zero: Option<u8>,
    /// Gradient bucket size in MiB for data parallel / ZeRO [default: 25].
    #[arg(long, help_heading = PARALLEL)]
    pub bucket_mb: Option<f64>,
    /// Collective backend of a distributed run: auto (NCCL when every rank's model is on CUDA
    /// and NCCL loads), nccl, or host (TCP ring) [default: auto].
    #[arg(long, help_heading = PARALLEL)]
    pub dist_backend: Option<String>,
    /// Tensor-parallel ranks per GPT replica (Megatron style) [default: 1].
    #[arg(long, help_heading = PARALLEL)]
    pub tp: Option<usize>,
    /// Pipeline stages per GPT replica [default: 1].
    #[arg(long, help_heading = PARALLEL)]
    pub pp: Option<usize>,
    /// Micro-batches per step for the pipeline (--pp) [default: 1].
    #[arg(long, help_heading = PARALLEL)]
    pub micro_batches: Option<usize>,
    /// Pipeline schedule for --pp: gpipe or 1f1b (the learning-rate schedule is
    /// --lr-schedule) [default: 1f1b].
    #[arg(long = "schedule", visible_alias = "pp-schedule", help_heading = PARALLEL)]
    pub pp_schedule: Option<String>,
}

impl TrainArgs {
    /// The flags given, as config keys (unset ones stay unset, so defaults and config files
    /// fill them). Every flag but --config has its key: one table for both.
    pub fn flags(&self) -> ConfigFile {
        let on = |b: bool| b.then_some(true);
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
            keep_last: self.keep_last,
            keep_best: on(self.keep_best),
            early_stop: self.early_stop,
            early_stop_delta: self.early_stop_delta,
            fuse_conv_bn: on(self.fuse_conv_bn),
            param_group: (!self.param_group.is_empty()).then(|| self.param_group.clone()),
            lora_rank: self.lora_rank,
            lora_alpha: self.lora_alpha,
            lora_dropout: self.lora_dropout,
            lora_targets: self.lora_targets.clone(),
            lora_base: self.lora_base.clone(),
            export_adapter: self.export_adapter.clone(),
            resume: self.resume.clone(),
            overwrite: on(self.overwrite),
            stop_at_step: self.stop_at_step,
            quiet: on(self.quiet),
            cuda_graph: match (self.cuda_graph, self.no_cuda_graph) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
            dp: on(self.dp),
            dist_backend: self.dist_backend.clone(),
            tp: self.tp,
            pp: self.pp,
            micro_batches: self.micro_batches,
            schedule: self.pp_schedule.clone(),
        }
    }
}

/// The run options of a layered config (flags over `--config`): how this invocation runs.
impl ConfigFile {
    pub fn tp_or_1(&self) -> usize {
        self.tp.unwrap_or(1)
    }

    pub fn pp_or_1(&self) -> usize {
        self.pp.unwrap_or(1)
    }

    pub fn model_parallel(&self) -> bool {
        self.tp_or_1() > 1 || self.pp_or_1() > 1
    }

    /// The pipeline schedule's name (checked: a learning-rate schedule there is a mistake
    /// worth pointing at the right flag).
    pub fn pipeline_schedule(&self) -> Result<String> {
        let name = self.schedule.clone().unwrap_or_else(|| "1f1b".into());
        if name.parse::<sinter_dist::pipeline::Schedule>().is_ok() {
            return Ok(name);
        }
        if ["constant", "cosine", "step"].contains(&name.as_str()) {
            bail!("--schedule picks the pipeline schedule (gpipe or 1f1b); for the learning-rate schedule use --lr-schedule {name}");
        }
        bail!("--schedule: unknown pipeline schedule '{name}'; valid: gpipe, 1f1b")
    }

    /// Flags that mean nothing in this combination are errors, not silently ignored.
    pub fn check_combination(&self) -> Result<()> {
        self.pipeline_schedule()?;
        if self.stop_at_step == Some(0) {
            bail!("--stop-at-step 0 would stop before the first step, so nothing would be trained; give the step to stop after (at least 1)");
        }
        let (tp, pp) = (self.tp_or_1(), self.pp_or_1());
        if tp == 0 || pp == 0 {
            bail!("--tp and --pp must be at least 1");
        }
        if pp <= 1 {
            if let Some(m) = self.micro_batches {
                bail!("--micro-batches {m} splits a pipeline step, but there is no pipeline; add --pp N (N ≥ 2) or drop --micro-batches");
            }
            if let Some(s) = &self.schedule {
                bail!("--schedule {s} orders a pipeline's micro-batches, but there is no pipeline; add --pp N (N ≥ 2) or drop --schedule (the learning-rate schedule is --lr-schedule)");
            }
        }
        if self.micro_batches == Some(0) {
            bail!("--micro-batches must be at least 1");
        }
        if self.model_parallel() {
            if let Some(z) = self.zero.filter(|&z| z > 0) {
                bail!("--zero {z} shards a data-parallel optimizer, which --tp/--pp do not use (each rank steps its own shard or stage); drop --zero");
            }
            if let Some(g) = self.grad_accum.filter(|&g| g > 1) {
                bail!("--grad-accum {g} is not supported with --tp/--pp; use --micro-batches to split a pipeline step, or a larger --batch-size");
            }
        }
        if self.out.is_none() && self.resume.is_none() {
            for (set, flag) in [
                (self.checkpoint_interval.is_some(), "--checkpoint-interval"),
                (self.keep_last.is_some_and(|n| n > 0), "--keep-last"),
                (self.keep_best == Some(true), "--keep-best"),
            ] {
                if set {
                    bail!("{flag} says which checkpoints to write, but without --out DIR nothing is written; add --out DIR");
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{ArgAction, CommandFactory, Parser};

    #[derive(Parser)]
    struct Train {
        #[command(flatten)]
        args: TrainArgs,
    }

    /// The command line and the TOML line that set the flag `long` to a sample value.
    fn samples(arg: &clap::Arg, long: &str) -> (Vec<String>, Vec<String>) {
        let flag = format!("--{long}");
        let key = long.replace('-', "_");
        match arg.get_action() {
            // `--no-X` is the key X set to false.
            ArgAction::SetTrue if key.starts_with("no_") => {
                (vec![flag], vec![format!("{} = false", &key[3..])])
            }
            ArgAction::SetTrue => (vec![flag], vec![format!("{key} = true")]),
            ArgAction::Append => (vec![flag, "1".into()], vec![format!("{key} = [\"1\"]")]),
            // "1" reads as a number or a name; TOML spells the two differently.
            _ => (
                vec![flag, "1".into()],
                vec![format!("{key} = 1"), format!("{key} = \"1\"")],
            ),
        }
    }

    #[test]
    fn every_long_flag_of_train_is_a_config_key_with_the_same_meaning() {
        let command = Train::command();
        let mut checked = 0;
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if ["config", "help"].contains(&long) {
                continue;
            }
            let (cli, tomls) = samples(arg, long);
            let parsed = Train::try_parse_from(std::iter::once("train".to_string()).chain(cli))
                .unwrap_or_else(|e| panic!("--{long}: {e}"));
            let from_flag = parsed.args.flags();
            assert_ne!(
                from_flag,
                ConfigFile::default(),
                "--{long} sets no config key"
            );
            let from_file: Vec<ConfigFile> = tomls
                .iter()
                .filter_map(|t| toml::from_str(t).ok())
                .collect();
            assert!(
                from_file.contains(&from_flag),
                "--{long}: the config file line {tomls:?} is refused or means something else"
            );
            checked += 1;
        }
        assert!(checked >= 40, "only {checked} flags seen");
    }
}
