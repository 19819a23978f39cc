//! A checkpoint as a model to run: `eval` (which reads the validation data), `generate` and
//! `serve` (which need only the checkpoint: the architecture, the tokenizer and the input
//! encoding are in its [`InferenceInfo`]).

use std::path::Path;

use anyhow::{anyhow, bail, Result};
use sinter_core::Rng;
use sinter_models::decoder::SamplingParams;
use sinter_models::{DataShape, Model, Task};
use sinter_serve::Tokenizer;

use crate::checkpoint::{self, InferenceInfo, InputSpec};
use crate::config::TrainConfig;
use crate::int8_checkpoint;
use crate::trainer::{info_of, setup, Setup};

/// A checkpoint's model with its weights, built from the checkpoint alone.
pub struct Inference {
    pub config: TrainConfig,
    pub info: InferenceInfo,
    pub model: Box<dyn Model>,
}

/// `--temperature`, `--top-k` and `--top-p`, checked (the rule is `SamplingParams::validate`'s).
pub fn check_sampling(temperature: f64, top_k: usize, top_p: f64) -> Result<SamplingParams> {
    let s = SamplingParams {
        temperature,
        top_k,
        top_p,
    };
    s.validate().map_err(|e| anyhow!("--{e}"))?;
    Ok(s)
}

/// `--temperature`: 0 (greedy) or above.
pub fn check_temperature(t: f64) -> Result<()> {
    check_sampling(t, 0, 1.0).map(|_| ())
}

/// Loads a checkpoint (a run directory or the file) as a model to run. Checkpoints written
/// before they held [`InferenceInfo`] open their data once to learn it.
pub fn load_model(path: &Path) -> Result<Inference> {
    if let Some(q) = int8_checkpoint::read_if_quantized(path)? {
        let info = match &q.inference {
            Some(i) => i.clone(),
            None => info_of(&setup(q.config.clone())?),
        };
        let model = build_model(&info)?;
        q.install(model.as_ref())?;
        return Ok(Inference {
            config: q.config,
            info,
            model,
        });
    }
    let l = checkpoint::load(path)?;
    let info = match &l.meta.inference {
        Some(i) => i.clone(),
        None => info_of(&setup(l.meta.config.clone())?),
    };
    let model = build_model(&info)?;
    match &l.meta.config.lora {
        // Only the adapters are in the checkpoint; the base is the pretrained model.
        Some(s) => {
            let gpt = crate::trainer::lora::gpt_of(model.as_ref())?;
            crate::trainer::lora::restore_merged(gpt, s, l.meta.config.seed, &l.tensors)?;
        }
        None => checkpoint::restore_model(&l.tensors, &named(model.as_ref()))?,
    }
    model.set_training(false);
    Ok(Inference {
        config: l.meta.config,
        info,
        model,
    })
}

/// The architecture `info` describes, with fresh weights, for inference (a model fine-tuned
/// from a pretrained path is that model, whose weights the checkpoint's then replace).
pub fn build_model(info: &InferenceInfo) -> Result<Box<dyn Model>> {
    if let Some(path) = crate::config::pretrained_path(&info.model) {
        return Ok(Box::new(crate::trainer::pretrained::load_architecture(
            path,
        )?));
    }
    let shape = DataShape {
        input: info.input_shape.clone(),
        classes: info.classes,
    };
    let dropout = sinter_nn::module::shared_rng(0);
    // Inference needs no training options (fused Conv+BatchNorm only changes training).
    let options = sinter_models::ModelOptions::default();
    Ok(sinter_models::build_with(
        &info.model,
        &shape,
        &mut Rng::new(0),
        &dropout,
        options,
    )?)
}

fn named(m: &dyn Model) -> Vec<(String, sinter_core::Tensor)> {
    m.named_tensors()
        .into_iter()
        .map(|t| (t.name, t.tensor))
        .collect()
}

/// The model and validation data of a checkpoint, with its weights loaded; and its step.
pub fn load_for_eval(path: &Path) -> Result<(Setup, u64)> {
    if let Some(q) = int8_checkpoint::read_if_quantized(path)? {
        let s = setup(q.config.clone())?;
        q.install(s.model.as_ref())?;
        return Ok((s, q.step));
    }
    let l = checkpoint::load(path)?;
    let s = setup(l.meta.config.clone())?;
    checkpoint::restore_model(&l.tensors, &s.named_tensors())?;
    s.model.set_training(false);
    Ok((s, l.meta.step))
}

/// The tokenizer a language-model checkpoint was trained with (`generate` and `serve`).
pub fn tokenizer_of(info: &InferenceInfo) -> Result<Tokenizer> {
    if crate::config::pretrained_path(&info.model).is_some() {
        bail!("this checkpoint was fine-tuned from {}, whose tokenizer generate and serve do not read from a checkpoint; write it as a Hugging Face directory with `sinter export RUN --out DIR` and use `generate --model DIR`", info.model);
    }
    if sinter_models::task_of(&info.model) != Some(Task::LanguageModel) {
        bail!(
            "text generation needs a language-model checkpoint; {} is a {} model",
            info.model,
            info.task
        );
    }
    match info.input {
        InputSpec::Bytes => Ok(Tokenizer::Bytes),
        InputSpec::Gpt2Tokens => Ok(Tokenizer::gpt2()),
        _ => bail!("this checkpoint uses a {}-token vocabulary that is neither bytes nor GPT-2 BPE; no tokenizer can turn a text prompt into its tokens", info.classes),
    }
}

/// How `generate` samples.
#[derive(Clone, Copy, Debug)]
pub struct Sampling {
    pub max_new: usize,
    /// 0 picks the most likely token.
    pub temperature: f64,
    /// Sample from the k most likely tokens (0: all).
    pub top_k: usize,
    pub seed: u64,
    /// The KV cache (one position per new token) or recomputing the whole window.
    pub use_cache: bool,
}

impl Sampling {
    /// `max_new` most likely tokens, with the KV cache.
    pub fn greedy(max_new: usize) -> Sampling {
        Sampling {
            max_new,
            temperature: 0.0,
            top_k: 0,
            seed: 0,
            use_cache: true,
        }
    }
}

/// Samples tokens after `prompt` from a GPT `model` with a `context`-token window; returns
/// all tokens (prompt included).
pub fn generate(
    model: &dyn Model,
    context: usize,
    prompt: &[i64],
    how: &Sampling,
) -> Result<Vec<i64>> {
    check_temperature(how.temperature)?;
    let gpt = model
        .as_any()
        .and_then(|m| m.downcast_ref::<sinter_models::Decoder>())
        .ok_or_else(|| {
            anyhow!("generate needs a GPT checkpoint; this model cannot generate text")
        })?;
    let mut rng = Rng::new(how.seed);
    Ok(gpt.generate_with(
        prompt,
        how.max_new,
        how.temperature,
        how.top_k,
        context,
        how.use_cache,
        &mut rng,
    )?)
}

/// `sinter export RUN --out DIR`: a Llama-family checkpoint as a Hugging Face directory
/// (`config.json`, `model.safetensors`, and the tokenizer of the pretrained model it was
/// fine-tuned from), which `--model DIR` and transformers load. Returns the checkpoint's step.
pub fn export_hf(checkpoint: &Path, out: &Path) -> Result<u64> {
    let step = checkpoint::load_meta(checkpoint)?.step;
    let inf = load_model(checkpoint)?;
    let gpt = inf
        .model
        .as_any()
        .and_then(|m| m.downcast_ref::<sinter_models::Decoder>())
        .ok_or_else(|| {
            anyhow!(
                "{} holds a '{}' model; export writes Llama-family GPT checkpoints (llama-tiny or one fine-tuned from a pretrained model), not int8 or other models",
                checkpoint.display(),
                inf.info.model
            )
        })?;
    sinter_models::hf_llama::save_hf_llama(gpt, out).map_err(|e| {
        anyhow!(
            "export of {} to {}: {e}",
            checkpoint.display(),
            out.display()
        )
    })?;
    if let Some(src) = crate::config::pretrained_path(&inf.config.model) {
        sinter_models::load_tokenizer(src)?.save_hf(out)?;
    }
    Ok(step)
}
