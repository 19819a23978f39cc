//! sinter-models: the model zoo, built only from sinter-nn — an MLP, a LeNet-style CNN (with
//! or without BatchNorm), ResNet-18 (CIFAR variant) and GPT with presets — and a registry that
//! builds them by name.

pub mod bert;
pub mod cnn;
pub mod decoder;
pub mod gguf;
pub mod hf_bert;
mod hf_file;
pub mod hf_gpt2;
pub mod hf_llama;
pub mod lltm;
pub mod mlp;
pub mod model;
pub mod pretrained;
pub mod resnet;

pub use bert::{mask_batch, mask_tokens, Bert, BertConfig, HiddenAct, MlmMasking};
pub use cnn::LeNet;
pub use decoder::{Decoder, DecoderArch, DecoderConfig};
pub use hf_bert::{
    bert_config_from_hf_file, bert_config_from_hf_json, from_hf_pretrained, hf_bert_config_json,
    hf_bert_tensors, load_hf_bert, save_hf_bert,
};
pub use hf_gpt2::{hf_gpt2_config, load_hf_gpt2, save_hf_gpt2};
pub use hf_llama::{llama_config_from_hf_json, load_hf_llama, save_hf_llama};
pub use mlp::Mlp;
pub use model::{classifier_loss, sequence_loss, BatchLoss, Model, Task};
pub use pretrained::{
    load_pretrained, load_pretrained_as, load_pretrained_with_tokenizer,
    load_pretrained_with_tokenizer_as, load_tokenizer, GgufWeights, Pretrained,
};
pub use resnet::ResNet18;

use sinter_core::{bail, Result, Rng};
use sinter_nn::SharedRng;

pub const MODEL_NAMES: &[&str] = &[
    "mlp",
    "cnn",
    "cnn-bn",
    "resnet18",
    "gpt-tiny",
    "gpt2",
    "llama-tiny",
    "bert-tiny",
    "bert-base",
];

pub fn task_of(name: &str) -> Option<Task> {
    match name {
        "mlp" | "cnn" | "cnn-bn" | "resnet18" => Some(Task::Classification),
        "gpt-tiny" | "gpt2" | "llama-tiny" => Some(Task::LanguageModel),
        "bert-tiny" | "bert-base" => Some(Task::MaskedLm),
        _ => None,
    }
}

/// What a model needs to know about its data.
#[derive(Clone, Debug)]
pub struct DataShape {
    /// Input shape of one example ([c, h, w] for images, [t] for tokens).
    pub input: Vec<usize>,
    /// Number of classes, or vocabulary size.
    pub classes: usize,
}

/// How a model is built beyond its name and data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelOptions {
    /// Activation checkpointing of GPT blocks (ignored by the other models).
    pub recompute: sinter_nn::recompute::Recompute,
    /// Train each conv → BatchNorm pair as one fused op that recomputes the convolution in
    /// backward (`cnn-bn`, `resnet18`; an error for models without BatchNorm).
    pub fuse_conv_bn: bool,
}

/// Builds a model by name. The names are those in `MODEL_NAMES`.
pub fn build(
    name: &str,
    data: &DataShape,
    rng: &mut Rng,
    dropout_rng: &SharedRng,
) -> Result<Box<dyn Model>> {
    build_with(name, data, rng, dropout_rng, ModelOptions::default())
}

/// `build`, with the options.
pub fn build_with(
    name: &str,
    data: &DataShape,
    rng: &mut Rng,
    dropout_rng: &SharedRng,
    options: ModelOptions,
) -> Result<Box<dyn Model>> {
    if options.fuse_conv_bn && !["cnn-bn", "resnet18"].contains(&name) {
        bail!("--fuse-conv-bn fuses a convolution with the BatchNorm after it, and model {name} has none; use --model cnn-bn or resnet18");
    }
    let image = |what: &str| -> Result<(usize, usize, usize)> {
        match data.input.as_slice() {
            [c, h, w] => Ok((*c, *h, *w)),
            s => {
                bail!("model {name} needs image inputs [c, h, w] but the data gives {s:?}; {what}")
            }
        }
    };
    Ok(match name {
        "mlp" => Box::new(Mlp::new(
            data.input.iter().product(),
            &[256, 128],
            data.classes,
            rng,
        )?),
        "cnn" | "cnn-bn" => {
            let (c, h, w) = image("use an image dataset such as digits or mnist:PATH")?;
            let bn = name == "cnn-bn";
            Box::new(LeNet::with_options(
                c,
                h,
                w,
                data.classes,
                bn,
                options.fuse_conv_bn,
                rng,
            )?)
        }
        "resnet18" => {
            let (c, _, _) = image("use an image dataset such as cifar10:PATH")?;
            Box::new(ResNet18::with_options(
                c,
                data.classes,
                options.fuse_conv_bn,
                rng,
            )?)
        }
        "gpt-tiny" | "gpt2" | "llama-tiny" => {
            let mut cfg = DecoderConfig::preset(name).expect("listed preset");
            if data.classes > cfg.vocab_size {
                cfg.vocab_size = data.classes;
            }
            // The context comes from the data (`--context`): grow the position table to fit it.
            if let [t] = data.input.as_slice() {
                cfg.block_size = cfg.block_size.max(*t);
            }
            let mut gpt = Decoder::new(cfg, rng, dropout_rng)?;
            gpt.set_recompute(options.recompute);
            Box::new(gpt)
        }
        "bert-tiny" | "bert-base" => {
            let mut cfg = BertConfig::preset(name).expect("listed preset");
            // One id past the data's tokens is the mask token (`mlm_masking`).
            cfg.vocab_size = data.classes + 1;
            if let [t] = data.input.as_slice() {
                cfg.max_position = cfg.max_position.max(*t);
            }
            Box::new(Bert::new(cfg, rng, dropout_rng)?)
        }
        other => bail!(
            "unknown model '{other}'; valid models: {}",
            MODEL_NAMES.join(", ")
        ),
    })
}
