//! A run's model and data, built from its config.

use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use sinter_core::{Rng, Tensor};
use sinter_data::{DataKind, DataSpec, Dataset, OpenOptions, Split, Windows};
use sinter_models::{DataShape, Model, Task};
use sinter_nn::module::shared_rng;
use sinter_nn::SharedRng;

use crate::checkpoint::{InferenceInfo, InputSpec};
use crate::config::TrainConfig;

/// Model, data and random generators of one run.
pub struct Setup {
    pub config: TrainConfig,
    pub task: Task,
    pub model: Box<dyn Model>,
    pub train: Arc<dyn Dataset>,
    pub val: Arc<dyn Dataset>,
    /// The generator the weights were initialised from (saved in checkpoints).
    pub rng: Rng,
    /// The generator dropout draws from (saved in checkpoints).
    pub dropout_rng: SharedRng,
}

impl Setup {
    /// The model's tensors (parameters and buffers) by checkpoint name; a LoRA run's frozen
    /// base is not among them (its checkpoints hold the adapters, the base is its --model).
    pub fn named_tensors(&self) -> Vec<(String, Tensor)> {
        self.model
            .named_tensors()
            .into_iter()
            .filter(|t| t.kind != sinter_nn::TensorKind::Frozen)
            .map(|t| (t.name, t.tensor))
            .collect()
    }

    /// The dropout generator's state.
    pub fn dropout_state(&self) -> [u64; 4] {
        self.dropout_rng
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .state()
    }

    pub fn set_dropout_state(&self, state: [u64; 4]) {
        *self.dropout_rng.lock().unwrap_or_else(|e| e.into_inner()) = Rng::from_state(state);
    }
}

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

/// Opens the training and validation data of `config` (sequence data as sliding windows for
/// training and strided windows for validation).
fn open_data(config: &TrainConfig, task: Task) -> Result<(Arc<dyn Dataset>, Arc<dyn Dataset>)> {
    let spec = DataSpec::parse(&config.data)?;
    let data_task = match spec.kind() {
        DataKind::Classification => Task::Classification,
        DataKind::LanguageModel => Task::LanguageModel,
    };
    // Token data serves both next-token (GPT) and masked-token (BERT) training.
    if task.is_sequence() != data_task.is_sequence() {
        bail!("model {} is a {:?} model but data '{}' is {:?} data; pick a matching --model or --data", config.model, task, config.data, data_task);
    }
    Ok(if task.is_sequence() {
        let mut o = OpenOptions::new(config.context);
        let train = spec.open_with(Split::Train, &o)?;
        o.windows = Windows::Strided;
        (train, spec.open_with(Split::Validation, &o)?)
    } else {
        (
            spec.open(Split::Train, 0)?,
            spec.open(Split::Validation, 0)?,
        )
    })
}

/// The model of `config` for data of `shape`, initialised from the config's seed; returns it
/// with the initialising generator and the dropout generator.
pub fn build_model(
    config: &TrainConfig,
    shape: &DataShape,
) -> Result<(Box<dyn Model>, Rng, SharedRng)> {
    let mut rng = Rng::new(config.seed);
    let dropout_rng = shared_rng(config.seed ^ 0x5eed);
    let recompute = config
        .recompute
        .parse()
        .map_err(|e| anyhow!("--recompute: {e}"))?;
    let options = sinter_models::ModelOptions {
        recompute,
        fuse_conv_bn: config.fuse_conv_bn,
    };
    let model = sinter_models::build_with(&config.model, shape, &mut rng, &dropout_rng, options)?;
    Ok((model, rng, dropout_rng))
}

/// The model and data of a preset `config`, built from its seed (see [`super::setup`]).
pub fn setup_preset(config: TrainConfig) -> Result<Setup> {
    let task = sinter_models::task_of(&config.model)
        .ok_or_else(|| anyhow!("unknown model '{}'", config.model))?;
    let (train, val) = open_data(&config, task)?;
    let classes = train.num_classes().ok_or_else(|| {
        anyhow!(
            "data '{}' does not say how many classes it has",
            config.data
        )
    })?;
    let shape = DataShape {
        input: train.input_shape(),
        classes,
    };
    let (model, rng, dropout_rng) = build_model(&config, &shape)?;
    crate::param_groups::check_matches(&config.param_groups, &model.parameters())?;
    Ok(Setup {
        config,
        task,
        model,
        train,
        val,
        rng,
        dropout_rng,
    })
}
