//! A pretrained Llama-family model from a path, with its tokenizer and chat template: a
//! GGUF file (weights dequantized to f32, tokenizer from its `tokenizer.ggml.*` metadata)
//! or a Hugging Face directory (`config.json`, safetensors, `tokenizer.json` and
//! `tokenizer_config.json`). Both go through one loader (`hf_llama`): a GGUF file is first
//! turned into its Hugging Face equivalent (`gguf::to_hf`).

use std::path::Path;

use sinter_core::{Error, Result};
use sinter_data::tokenizer::{ChatTemplate, GgufVocab, TextTokenizer};

use crate::gguf::{self, GgufFile};
use crate::hf_llama::{gpt_from_hf_tensors, llama_config_from_hf_json, load_hf_llama};
use crate::Gpt;

/// A model ready to generate: weights, tokenizer, and the chat template if it has one.
pub struct Pretrained {
    pub model: Gpt,
    pub tokenizer: TextTokenizer,
    pub chat_template: Option<ChatTemplate>,
}

fn is_gguf(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// The model at `path`: a `.gguf` file or a Hugging Face directory.
pub fn load_pretrained(path: impl AsRef<Path>) -> Result<Gpt> {
    let path = path.as_ref();
    if is_gguf(path) {
        let file = GgufFile::open(path)?;
        return model_of_gguf(&file);
    }
    if path.is_dir() {
        return load_hf_llama(path);
    }
    if path.exists() {
        return Err(Error::Msg(format!(
            "{}: not a .gguf file or a Hugging Face model directory (config.json + safetensors)",
            path.display()
        )));
    }
    Err(Error::Msg(format!(
        "{}: no such file or directory",
        path.display()
    )))
}

fn model_of_gguf(file: &GgufFile) -> Result<Gpt> {
    let src = file.path().display().to_string();
    let (config, tensors) = gguf::to_hf(file)?;
    let config = llama_config_from_hf_json(&config, &src)?;
    gpt_from_hf_tensors(config, tensors, &src)
}

/// The `tokenizer.ggml.*` metadata of a GGUF file.
pub fn gguf_vocab(file: &GgufFile) -> Result<GgufVocab> {
    let key = |k: &str| format!("tokenizer.ggml.{k}");
    let opt_u32 = |k: &str| -> Result<Option<u32>> {
        let k = key(k);
        if file.get(&k).is_none() {
            return Ok(None);
        }
        file.get_u32(&k).map(Some)
    };
    let opt_bool = |k: &str| -> Result<Option<bool>> {
        let k = key(k);
        if file.get(&k).is_none() {
            return Ok(None);
        }
        file.get_bool(&k).map(Some)
    };
    let strings = |k: &str| -> Result<Vec<String>> {
        let k = key(k);
        if file.get(&k).is_none() {
            return Ok(Vec::new());
        }
        Ok(file
            .get_str_array(&k)?
            .into_iter()
            .map(String::from)
            .collect())
    };
    let model = file.get_str(&key("model")).map_err(|_| {
        Error::Msg(format!(
            "{}: no tokenizer.ggml.model in the metadata: this GGUF file carries no tokenizer",
            file.path().display()
        ))
    })?;
    let pre = match file.get(&key("pre")) {
        None => None,
        Some(_) => Some(file.get_str(&key("pre"))?.to_string()),
    };
    let chat_template = match file.get("tokenizer.chat_template") {
        None => None,
        Some(_) => Some(file.get_str("tokenizer.chat_template")?.to_string()),
    };
    Ok(GgufVocab {
        model: model.to_string(),
        pre,
        tokens: strings("tokens")?,
        scores: match file.get(&key("scores")) {
            None => Vec::new(),
            Some(_) => file.get_f32_array(&key("scores"))?,
        },
        token_type: match file.get(&key("token_type")) {
            None => Vec::new(),
            Some(_) => file.get_i32_array(&key("token_type"))?,
        },
        merges: strings("merges")?,
        bos_token_id: opt_u32("bos_token_id")?,
        eos_token_id: opt_u32("eos_token_id")?,
        unknown_token_id: opt_u32("unknown_token_id")?,
        padding_token_id: opt_u32("padding_token_id")?,
        eot_token_id: opt_u32("eot_token_id")?,
        add_bos_token: opt_bool("add_bos_token")?,
        add_eos_token: opt_bool("add_eos_token")?,
        add_space_prefix: opt_bool("add_space_prefix")?,
        chat_template,
    })
}

fn data_err(path: &Path, e: sinter_data::DataError) -> Error {
    Error::Msg(format!("{}: {e}", path.display()))
}

fn tokenizer_of_gguf(file: &GgufFile) -> Result<TextTokenizer> {
    let vocab = gguf_vocab(file)?;
    TextTokenizer::from_gguf_vocab(&vocab).map_err(|e| data_err(file.path(), e))
}

/// The tokenizer of the model at `path` (a `.gguf` file's vocabulary, or a Hugging Face
/// directory's `tokenizer.json`), without loading its weights.
pub fn load_tokenizer(path: impl AsRef<Path>) -> Result<TextTokenizer> {
    let path = path.as_ref();
    if is_gguf(path) {
        return tokenizer_of_gguf(&GgufFile::open(path)?);
    }
    let json = path.join("tokenizer.json");
    if !json.is_file() {
        return Err(Error::Msg(format!(
            "{}: no tokenizer.json beside the model; text needs the model's tokenizer (give the model's tokenizer.json, or token ids as tokens:FILE)",
            path.display()
        )));
    }
    TextTokenizer::from_file(&json).map_err(|e| data_err(path, e))
}

/// The model at `path` with its tokenizer and chat template.
pub fn load_pretrained_with_tokenizer(path: impl AsRef<Path>) -> Result<Pretrained> {
    let path = path.as_ref();
    let (model, tokenizer) = if is_gguf(path) {
        let file = GgufFile::open(path)?;
        (model_of_gguf(&file)?, tokenizer_of_gguf(&file)?)
    } else {
        // The model first: a directory that holds none is named as such.
        let model = load_pretrained(path)?;
        (model, load_tokenizer(path)?)
    };
    if tokenizer.vocab_size() > model.config.vocab_size {
        return Err(Error::Msg(format!(
            "{}: the tokenizer has {} tokens but the model only {} rows of embeddings",
            path.display(),
            tokenizer.vocab_size(),
            model.config.vocab_size
        )));
    }
    let chat_template = tokenizer.chat_template().map_err(|e| data_err(path, e))?;
    Ok(Pretrained {
        model,
        tokenizer,
        chat_template,
    })
}
