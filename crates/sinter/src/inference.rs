//! A checkpoint as a model to run: `eval` (which reads the validation data) and `generate`
//! (which needs only the checkpoint: the architecture, the tokenizer and the input encoding
//! are in its [`InferenceInfo`]).

use std::path::Path;

use anyhow::{anyhow, bail, Result};
use sinter_core::Rng;
use sinter_models::{DataShape, Model, Task};

use crate::checkpoint::{self, InferenceInfo, InputSpec};
use crate::config::TrainConfig;
use crate::trainer::{setup, Setup};

/// What inference needs to know about a run's data and model (saved in its checkpoints).
pub fn info_of(s: &Setup) -> InferenceInfo {
    InferenceInfo {
        model: s.config.model.clone(),
        task: task_name(s.task).into(),
        input_shape: s.train.input_shape(),
        classes: s.train.num_classes().unwrap_or(0),
        class_names: s.train.class_names(),
        input: InputSpec::from_data(&s.train.input_encoding()),
    }
}

fn task_name(t: Task) -> &'static str {
    match t {
        Task::Classification => "classification",
        Task::LanguageModel => "language_model",
        Task::MaskedLm => "masked_lm",
    }
}

/// A checkpoint's model with its weights, built from the checkpoint alone.
pub struct Inference {
    pub config: TrainConfig,
    pub info: InferenceInfo,
    pub model: Box<dyn Model>,
}

/// `--temperature`: 0 (greedy) or above.
pub fn check_temperature(t: f64) -> Result<()> {
    if !(t.is_finite() && t >= 0.0) {
        bail!(
            "--temperature must be a number of at least 0 (0 picks the most likely token), got {t}"
        );
    }
    Ok(())
}

/// Loads a checkpoint (a run directory or the file) as a model to run. Checkpoints written
/// before they held [`InferenceInfo`] open their data once to learn it.
pub fn load_model(path: &Path) -> Result<Inference> {
    if let Some(q) = crate::quantize_cmd::load_model_if_quantized(path)? {
        return Ok(q);
    }
    let l = checkpoint::load(path)?;
    let info = match &l.meta.inference {
        Some(i) => i.clone(),
        None => info_of(&setup(l.meta.config.clone())?),
    };
    let model = build_model(&info)?;
    checkpoint::restore_model(&l.tensors, &named(model.as_ref()))?;
    model.set_training(false);
    Ok(Inference {
        config: l.meta.config,
        info,
        model,
    })
}

/// The architecture `info` describes, with fresh weights, for inference.
pub fn build_model(info: &InferenceInfo) -> Result<Box<dyn Model>> {
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
    if let Some(q) = crate::quantize_cmd::load_for_eval_if_quantized(path)? {
        return Ok(q);
    }
    let l = checkpoint::load(path)?;
    let s = setup(l.meta.config.clone())?;
    checkpoint::restore_model(&l.tensors, &s.named_tensors())?;
    s.model.set_training(false);
    Ok((s, l.meta.step))
}

/// How `generate` turns text into tokens and back.
pub enum TextCodec {
    Bytes,
    Gpt2(Box<sinter_data::Gpt2Tokenizer>),
}

impl TextCodec {
    /// The codec a language-model checkpoint was trained with.
    pub fn of(inf: &Inference) -> Result<TextCodec> {
        let task = sinter_models::task_of(&inf.info.model);
        if task != Some(Task::LanguageModel) {
            bail!(
                "generate needs a language-model checkpoint; {} is a {} model",
                inf.info.model,
                inf.info.task
            );
        }
        match inf.info.input {
            InputSpec::Bytes => Ok(TextCodec::Bytes),
            InputSpec::Gpt2Tokens => Ok(TextCodec::Gpt2(Box::new(sinter_data::Gpt2Tokenizer::new()))),
            _ => bail!("this checkpoint uses a {}-token vocabulary that is neither bytes nor GPT-2 BPE; no tokenizer can turn a text prompt into its tokens", inf.info.classes),
        }
    }

    pub fn encode(&self, text: &str) -> Vec<i64> {
        match self {
            TextCodec::Bytes => text.bytes().map(i64::from).collect(),
            TextCodec::Gpt2(t) => t.encode(text).into_iter().map(i64::from).collect(),
        }
    }

    pub fn decode(&self, tokens: &[i64]) -> String {
        match self {
            TextCodec::Bytes => {
                let bytes: Vec<u8> = tokens.iter().map(|&t| t as u8).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
            TextCodec::Gpt2(t) => {
                let ids: Vec<u16> = tokens.iter().map(|&t| t as u16).collect();
                t.decode(&ids)
            }
        }
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
        .and_then(|m| m.downcast_ref::<sinter_models::Gpt>())
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
