//! A pretrained Llama-family model from a path, with its tokenizer and chat template: a
//! GGUF file (tokenizer from its `tokenizer.ggml.*` metadata) or a Hugging Face directory
//! (`config.json`, safetensors, `tokenizer.json` and `tokenizer_config.json`). Both go through
//! one loader (`hf_llama`): a GGUF file is first turned into its Hugging Face equivalent
//! (`gguf::to_hf`).
//!
//! A GGUF file's weights are dequantized to f32 ([`GgufWeights::F32`], what training needs),
//! or, for inference ([`GgufWeights::Quantized`]), its projection weights in a format with dot
//! kernels (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) stay in their blocks: each such Linear runs a
//! `sinter_nn::quant::GgmlLinear` installed in its quant slot and holds only a placeholder
//! f32 weight (no copy). Such a model runs without gradients, on the CPU or a CUDA device
//! (the layers' qmatmul op dequantizes the blocks there for each product).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use sinter_core::{bail, Error, Result};
use sinter_cpu::ggml_quant::{dot, QuantMatrix};
use sinter_data::tokenizer::{ChatTemplate, GgufVocab, TextTokenizer};
use sinter_nn::quant::{self, GgmlLinear, LayerHandle, LayerKind, QuantState};

use crate::gguf::{self, GgufFile};
use crate::hf_llama::{gpt_from_hf_tensors, llama_config_from_hf_json, load_hf_llama, name_map};
use crate::{Decoder, DecoderConfig};

/// A model ready to generate: weights, tokenizer, and the chat template if it has one.
pub struct Pretrained {
    pub model: Decoder,
    pub tokenizer: TextTokenizer,
    pub chat_template: Option<ChatTemplate>,
}

fn is_gguf(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// How a GGUF file's quantized weights are loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GgufWeights {
    /// Everything dequantized to f32 (trainable; runs on any device).
    #[default]
    F32,
    /// Projection weights with dot kernels kept in their blocks (inference only).
    Quantized,
}

/// The model at `path`: a `.gguf` file or a Hugging Face directory (GGUF weights in f32).
pub fn load_pretrained(path: impl AsRef<Path>) -> Result<Decoder> {
    load_pretrained_as(path, GgufWeights::F32)
}

/// [`load_pretrained`], with a GGUF file's weights loaded as `weights` says (a Hugging
/// Face directory is f32 either way).
pub fn load_pretrained_as(path: impl AsRef<Path>, weights: GgufWeights) -> Result<Decoder> {
    let path = path.as_ref();
    if is_gguf(path) {
        let file = GgufFile::open(path)?;
        return model_of_gguf(&file, weights);
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

fn model_of_gguf(file: &GgufFile, weights: GgufWeights) -> Result<Decoder> {
    let src = file.path().display().to_string();
    if weights == GgufWeights::F32 {
        let (config, tensors) = gguf::to_hf(file)?;
        let config = llama_config_from_hf_json(&config, &src)?;
        return gpt_from_hf_tensors(config, tensors, &src);
    }
    // The config first (no tensor is read for it), to know which weights fuse into which
    // Linear; then every Linear whose parts all have dot kernels is left out of the f32
    // conversion and gets its quantized form.
    let (config, _) = gguf::to_hf_keeping(file, &all_tensor_names(file))?;
    let config = llama_config_from_hf_json(&config, &src)?;
    let plan = quantized_linears(file, &config)?;
    let keep: HashSet<String> = plan.iter().flat_map(|(_, parts)| parts.clone()).collect();
    let (_, tensors) = gguf::to_hf_keeping(file, &keep)?;
    let model = gpt_from_hf_tensors(config, tensors, &src)?;
    install_quantized(file, &model, plan)?;
    Ok(model)
}

fn all_tensor_names(file: &GgufFile) -> HashSet<String> {
    file.tensor_infos().iter().map(|t| t.name.clone()).collect()
}

/// The weights (our names) to keep quantized, each with its GGUF parts in fusing order:
/// Linear weights and the token table (lookups dequantize its rows; as the tied head it is
/// a Linear), every part 2-D of a dot-kernel type. A tied table whose file also holds an
/// `output.weight` stays f32: the loader checks the two are equal.
fn quantized_linears(
    file: &GgufFile,
    config: &DecoderConfig,
) -> Result<Vec<(String, Vec<String>)>> {
    let gguf_of: HashMap<String, String> = file
        .tensor_infos()
        .iter()
        .filter_map(|t| gguf::hf::hf_tensor_name(&t.name).map(|hf| (hf, t.name.clone())))
        .collect();
    let mut plan = Vec::new();
    for (ours, hf_parts) in name_map(config) {
        let checked_head = config.arch.tie_head && file.has_tensor("output.weight");
        if !ours.ends_with(".weight") || (ours == "wte.weight" && checked_head) {
            continue;
        }
        let parts: Option<Vec<String>> = hf_parts.iter().map(|p| gguf_of.get(p).cloned()).collect();
        let Some(parts) = parts else { continue };
        let quantizable = parts.iter().all(|p| {
            file.tensor_info(p)
                .is_ok_and(|i| i.shape.len() == 2 && dot::has_dot(i.ggml_type))
        });
        if quantizable {
            plan.push((ours, parts));
        }
    }
    Ok(plan)
}

/// Gives each planned Linear of `model` its quantized weight (Q and K rows unpermuted as
/// `gguf::to_hf` does for the llama architecture).
fn install_quantized(
    file: &GgufFile,
    model: &Decoder,
    plan: Vec<(String, Vec<String>)>,
) -> Result<()> {
    let src = file.path().display();
    let arch = file.get_str("general.architecture")?;
    let (heads, kv_heads) = (model.config.n_head, model.config.n_kv_head());
    let handles: HashMap<String, LayerHandle> = quant::layers(model).into_iter().collect();
    for (ours, parts) in plan {
        let layer = ours.strip_suffix(".weight").unwrap_or(&ours);
        let kinds = [LayerKind::Linear, LayerKind::Embedding];
        let Some(h) = handles.get(layer).filter(|h| kinds.contains(&h.kind)) else {
            bail!("{src}: {ours} was kept quantized but is not the weight of a Linear or Embedding of the model");
        };
        let mut mats = Vec::with_capacity(parts.len());
        for p in &parts {
            let raw = file.raw(p)?;
            let (rows, k) = (raw.shape[0], raw.shape[1]);
            let mut bytes = raw.bytes.to_vec();
            let rope_heads = match p.rsplit('.').nth(1) {
                Some("attn_q") if arch == "llama" => Some(heads),
                Some("attn_k") if arch == "llama" => Some(kv_heads),
                _ => None,
            };
            if let Some(hd) = rope_heads {
                if hd == 0 || !rows.is_multiple_of(2 * hd) {
                    bail!("{src}: tensor {p} has {rows} rows, which do not split into {hd} heads of an even size; the head counts in the metadata do not fit the tensor");
                }
                bytes = gguf::hf::unpermute_rows(&bytes, rows, bytes.len() / rows, hd);
            }
            let m = QuantMatrix::new(raw.ggml_type, rows, k, bytes)
                .map_err(|e| Error::Msg(format!("{src}: tensor {p}: {e}")))?;
            mats.push(m);
        }
        let w = QuantMatrix::stack(mats).map_err(|e| Error::Msg(format!("{src}: {ours}: {e}")))?;
        if [w.n(), w.k()] != h.weight.shape() {
            bail!(
                "{src}: {} give a [{}, {}] weight, the model needs {:?} for {ours}",
                parts.join(" + "),
                w.n(),
                w.k(),
                h.weight.shape()
            );
        }
        let form = GgmlLinear::new(w, h.bias.as_ref())?;
        h.slot.set(QuantState::Int8(Arc::new(form)));
    }
    Ok(())
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

/// The model at `path` with its tokenizer and chat template (GGUF weights in f32).
pub fn load_pretrained_with_tokenizer(path: impl AsRef<Path>) -> Result<Pretrained> {
    load_pretrained_with_tokenizer_as(path, GgufWeights::F32)
}

/// [`load_pretrained_with_tokenizer`] with a GGUF file's weights loaded as `weights` says.
pub fn load_pretrained_with_tokenizer_as(
    path: impl AsRef<Path>,
    weights: GgufWeights,
) -> Result<Pretrained> {
    let path = path.as_ref();
    let (model, tokenizer) = if is_gguf(path) {
        let file = GgufFile::open(path)?;
        (model_of_gguf(&file, weights)?, tokenizer_of_gguf(&file)?)
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
