//! A run whose `--model` is a pretrained model's path (a .gguf file or a Hugging Face
//! directory): the loaded weights fine-tuned on text encoded with the model's own tokenizer,
//! or on token files checked against its vocabulary.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use sinter_core::Rng;
use sinter_data::{DataSpec, Dataset, OpenOptions, Split, TextTokenizer, Windows};
use sinter_models::{Decoder, GgufWeights, Task};
use sinter_nn::module::shared_rng;

use super::Setup;
use crate::config::TrainConfig;

/// The model at `path` with its tokenizer, and the run's data encoded with it.
pub fn setup_pretrained(config: TrainConfig, path: &Path) -> Result<Setup> {
    let spec = DataSpec::parse(&config.data)?;
    let what = || format!("loading the pretrained model {}", path.display());
    let base = config.lora.as_ref().map_or("f32", |l| l.base.as_str());
    let weights = if base == "gguf" {
        let is_gguf = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
        if !is_gguf {
            bail!("--lora-base gguf keeps a GGUF file's own blocks, but --model {} is not a .gguf file; quantize the base at load instead (--lora-base q4_0, q4_k, int8, ...)", path.display());
        }
        GgufWeights::Quantized
    } else {
        GgufWeights::F32
    };
    // Token files are already the model's ids: no tokenizer needed.
    let (mut model, tokenizer) = if matches!(spec, DataSpec::Tokens(_)) {
        (
            sinter_models::load_pretrained_as(path, weights).with_context(what)?,
            None,
        )
    } else {
        let p =
            sinter_models::load_pretrained_with_tokenizer_as(path, weights).with_context(what)?;
        (p.model, Some(p.tokenizer))
    };
    check_context(&config, &model, path)?;
    let dropout_rng = shared_rng(config.seed ^ 0x5eed);
    if let Some(l) = &config.lora {
        super::lora::install(&model, l, config.seed, &dropout_rng)?;
        match l.base.as_str() {
            "f32" => {}
            "gguf" => {
                super::lora::keep_gguf_base(&model, path)?;
            }
            quantized => {
                super::lora::quantize_base(&mut model, quantized)?;
            }
        }
    }
    let recompute = config
        .recompute
        .parse()
        .map_err(|e| anyhow::anyhow!("--recompute: {e}"))?;
    model.set_recompute(recompute);
    let (train, val) = open_data(&config, &spec, tokenizer.as_ref(), model.config.vocab_size)?;
    crate::param_groups::check_matches(
        &config.param_groups,
        &sinter_nn::Module::parameters(&model),
    )?;
    Ok(Setup {
        task: Task::LanguageModel,
        model: Box::new(model),
        train,
        val,
        // Nothing is initialised at random; the generators still seed data order and dropout.
        rng: Rng::new(config.seed),
        dropout_rng,
        config,
    })
}

/// The model at `path` without its tokenizer (a checkpoint's weights replace its own).
pub fn load_architecture(path: &Path) -> Result<Decoder> {
    sinter_models::load_pretrained(path).with_context(|| {
        format!(
            "loading {}, the pretrained model this checkpoint was trained from (it must still be there)",
            path.display()
        )
    })
}

fn check_context(config: &TrainConfig, model: &Decoder, path: &Path) -> Result<()> {
    if config.context > model.config.block_size {
        bail!(
            "--context {} is longer than the {} tokens {} was trained for; give --context {} or less",
            config.context,
            model.config.block_size,
            path.display(),
            model.config.block_size
        );
    }
    Ok(())
}

/// Training and validation windows of `config.data` in the model's tokens: text (a file or
/// the bundled Shakespeare) through `tokenizer`, or token files whose ids must be below
/// `vocab`. `tokenizer` is there for text data.
fn open_data(
    config: &TrainConfig,
    spec: &DataSpec,
    tokenizer: Option<&TextTokenizer>,
    vocab: usize,
) -> Result<(Arc<dyn Dataset>, Arc<dyn Dataset>)> {
    let t = config.context;
    let (text, source) = match spec {
        DataSpec::Tokens(_) => {
            let mut o = OpenOptions::new(t);
            o.vocab_size = Some(vocab);
            let train = spec.open_with(Split::Train, &o)?;
            o.windows = Windows::Strided;
            return Ok((train, spec.open_with(Split::Validation, &o)?));
        }
        DataSpec::Text(p) => (read_text(p)?, p.clone()),
        DataSpec::Shakespeare => (bundled_shakespeare()?, "<bundled>/shakespeare".into()),
        _ => bail!(
            "data '{}' is not text; a pretrained language model trains on text:FILE, tokens:FILE_OR_DIR (its own token ids) or shakespeare",
            config.data
        ),
    };
    let tokenizer = tokenizer.context("text data needs the model's tokenizer")?;
    let tokens = encode(tokenizer, &text, &source)?;
    let split = |s: Split, w: Windows| -> Result<Arc<dyn Dataset>> {
        let d = sinter_data::split_dataset(tokens.clone(), s, t, vocab, &source)?;
        Ok(Arc::new(d.with_windows(w)))
    };
    Ok((
        split(Split::Train, Windows::Sliding)?,
        split(Split::Validation, Windows::Strided)?,
    ))
}

fn read_text(path: &Path) -> Result<String> {
    let bytes =
        std::fs::read(path).with_context(|| format!("cannot read text file {}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{} is not UTF-8 text (invalid byte at offset {}); a pretrained model's tokenizer reads UTF-8: convert the file, or give its token ids as tokens:FILE",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

/// The bundled text, from the byte-level reader's two splits.
fn bundled_shakespeare() -> Result<String> {
    let mut bytes: Vec<u8> = Vec::new();
    for split in [Split::Train, Split::Validation] {
        let d = sinter_data::shakespeare(split, 1)?;
        bytes.extend(d.tokens().iter().map(|&b| b as u8));
    }
    Ok(String::from_utf8(bytes)?)
}

/// The file as one document, as transformers' tokenizer encodes it (with the BOS it adds,
/// if it adds one), ended by the end-of-sequence token when the tokenizer has one.
fn encode(tokenizer: &TextTokenizer, text: &str, source: &Path) -> Result<Vec<u32>> {
    let mut ids = tokenizer
        .encode(text, true)
        .with_context(|| format!("encoding {}", source.display()))?;
    if let Some(eos) = tokenizer.eos_id() {
        if ids.last() != Some(&eos) {
            ids.push(eos);
        }
    }
    Ok(ids)
}
