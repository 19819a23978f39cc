//! `sinter merge --model PATH --adapter DIR --out DIR`: a PEFT LoRA adapter folded into its
//! base model (W += α/r · B·A), written as a Hugging Face directory (config.json,
//! model.safetensors and the base's tokenizer) that `--model DIR` and transformers load.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::trainer::lora;

#[derive(Args)]
pub struct MergeArgs {
    /// The base model the adapter was trained on: a .gguf file (dequantized) or a Hugging
    /// Face directory.
    #[arg(long)]
    pub model: PathBuf,
    /// The adapter: a directory with adapter_config.json and adapter_model.safetensors
    /// (`train --lora-rank` writes OUT/adapter; PEFT's save_pretrained writes the same).
    #[arg(long)]
    pub adapter: PathBuf,
    /// The directory to write (created if missing; its model files are replaced).
    #[arg(long)]
    pub out: PathBuf,
}

/// Merges and writes; returns how many layers took an adapter.
pub fn merge(a: &MergeArgs) -> Result<usize> {
    let model = sinter_models::load_pretrained(&a.model)
        .with_context(|| format!("loading the base model {}", a.model.display()))?;
    lora::load_peft(&model, &a.adapter)
        .with_context(|| format!("loading the adapter {}", a.adapter.display()))?;
    let n = lora::merge(&model)?;
    sinter_models::save_hf_llama(&model, &a.out)
        .with_context(|| format!("writing the merged model to {}", a.out.display()))?;
    // The tokenizer travels with the weights when the base has one.
    if let Ok(t) = sinter_models::load_tokenizer(&a.model) {
        t.save_hf(&a.out)?;
    }
    Ok(n)
}
