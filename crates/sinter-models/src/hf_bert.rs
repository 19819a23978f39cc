//! BERT in Hugging Face's formats: `config.json` to and from [`BertConfig`], and
//! `BertForMaskedLM` or `BertModel` safetensors weights to and from [`Bert`].
//!
//! [`from_hf_pretrained`] is `BertForMaskedLM.from_pretrained` (or `BertModel`'s, for an
//! encoder without the MLM head, as sentence-embedding models ship it) for a local directory:
//! the config from `config.json` (the activation, dropout, layer-norm epsilon and padding token
//! included: a BERT built from shapes alone would silently differ), then the weights.

use std::path::Path;

use serde_json::{Map, Value};
use sinter_core::{bail, Error, Result, Rng, Tensor};
use sinter_nn::module::SharedRng;
use sinter_nn::Module;

use crate::bert::{Bert, BertConfig, HiddenAct};
use crate::hf_file;

const WHAT: &str = "BERT";

/// `config.json` as Hugging Face's `BertConfig` reads it: a key it does not list takes
/// `BertConfig`'s default (as `from_pretrained` does), a key of the wrong type or a value
/// sinter cannot honour (another model type, relative position embeddings, a decoder, an
/// activation sinter lacks) is an error naming the key. `origin` names the file in errors.
pub fn bert_config_from_hf_json(json: &str, origin: &str) -> Result<BertConfig> {
    let v: Value = serde_json::from_str(json)
        .map_err(|e| Error::Msg(format!("{origin} is not valid JSON: {e}")))?;
    let Some(obj) = v.as_object() else {
        bail!("{origin}: expected a JSON object (a Hugging Face config), got {v}");
    };
    let keys = HfKeys { obj, origin };
    if let Some(t) = keys.str("model_type")? {
        if t != "bert" {
            bail!("{origin}: model_type is \"{t}\", not \"bert\"; sinter's BERT cannot load it");
        }
    }
    if let Some(p) = keys.str("position_embedding_type")? {
        if p != "absolute" {
            bail!("{origin}: position_embedding_type \"{p}\" is not supported (sinter's BERT has absolute position embeddings)");
        }
    }
    for flag in ["is_decoder", "add_cross_attention"] {
        if keys.bool(flag)? == Some(true) {
            bail!("{origin}: {flag} is true; sinter's BERT is an encoder without cross-attention");
        }
    }
    let act = keys.str("hidden_act")?.unwrap_or("gelu");
    let Some(hidden_act) = HiddenAct::from_hf(act) else {
        bail!("{origin}: hidden_act \"{act}\" is not supported (gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, relu, silu)");
    };
    let pad_token_id = match obj.get("pad_token_id") {
        None => Some(0),
        Some(Value::Null) => None,
        Some(_) => Some(keys.count("pad_token_id", 0)?),
    };
    Ok(BertConfig {
        vocab_size: keys.count("vocab_size", 30522)?,
        hidden: keys.count("hidden_size", 768)?,
        n_layer: keys.count("num_hidden_layers", 12)?,
        n_head: keys.count("num_attention_heads", 12)?,
        intermediate: keys.count("intermediate_size", 3072)?,
        max_position: keys.count("max_position_embeddings", 512)?,
        type_vocab_size: keys.count("type_vocab_size", 2)?,
        dropout: keys.probability("hidden_dropout_prob", 0.1)?,
        attention_dropout: keys.probability("attention_probs_dropout_prob", 0.1)?,
        layer_norm_eps: keys.positive("layer_norm_eps", 1e-12)?,
        hidden_act,
        pad_token_id,
    })
}

/// [`bert_config_from_hf_json`] of a file.
pub fn bert_config_from_hf_file(path: impl AsRef<Path>) -> Result<BertConfig> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::Msg(format!(
            "cannot read the BERT config {}: {e}",
            path.display()
        ))
    })?;
    bert_config_from_hf_json(&text, &path.display().to_string())
}

/// Reads the keys of one config object with errors that name the key and the file.
struct HfKeys<'a> {
    obj: &'a Map<String, Value>,
    origin: &'a str,
}

impl HfKeys<'_> {
    fn wrong(&self, key: &str, want: &str, v: &Value) -> Error {
        Error::Msg(format!("{}: {key} must be {want}, got {v}", self.origin))
    }
    fn str(&self, key: &str) -> Result<Option<&str>> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.wrong(key, "a string", v)),
        }
    }
    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(key, "true or false", v)),
        }
    }
    fn count(&self, key: &str, default: usize) -> Result<usize> {
        match self.obj.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| self.wrong(key, "a whole number >= 0", v)),
        }
    }
    fn number(&self, key: &str, default: f64) -> Result<f64> {
        match self.obj.get(key) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| self.wrong(key, "a number", v)),
        }
    }
    fn probability(&self, key: &str, default: f64) -> Result<f32> {
        let p = self.number(key, default)?;
        if !(0.0..1.0).contains(&p) {
            bail!("{}: {key} must be in [0, 1), got {p}", self.origin);
        }
        Ok(p as f32)
    }
    fn positive(&self, key: &str, default: f64) -> Result<f32> {
        let x = self.number(key, default)?;
        if !(x > 0.0 && (x as f32) > 0.0) {
            bail!("{}: {key} must be a positive number, got {x}", self.origin);
        }
        Ok(x as f32)
    }
}

/// A Hugging Face `config.json` for `BertForMaskedLM` with this config: beside
/// [`save_hf_bert`]'s `model.safetensors` it makes a directory `from_pretrained` loads.
pub fn hf_bert_config_json(c: &BertConfig) -> String {
    let v = serde_json::json!({
        "architectures": ["BertForMaskedLM"],
        "model_type": "bert",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden,
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "intermediate_size": c.intermediate,
        "hidden_act": c.hidden_act.hf_name(),
        "hidden_dropout_prob": c.dropout as f64,
        "attention_probs_dropout_prob": c.attention_dropout as f64,
        "max_position_embeddings": c.max_position,
        "type_vocab_size": c.type_vocab_size,
        "layer_norm_eps": c.layer_norm_eps as f64,
        "pad_token_id": c.pad_token_id,
        "position_embedding_type": "absolute",
        "initializer_range": 0.02,
    });
    let mut s = serde_json::to_string_pretty(&v).expect("a JSON value serialises");
    s.push('\n');
    s
}

/// `BertForMaskedLM.from_pretrained(path)` for local files: `path` is a directory holding
/// `config.json` and `model.safetensors`, or the safetensors file with `config.json` beside
/// it. Dropout is as the config says (call `set_training(false)` for inference).
pub fn from_hf_pretrained(path: impl AsRef<Path>, drop_rng: &SharedRng) -> Result<Bert> {
    let path = path.as_ref();
    let (dir, weights) = if path.is_dir() {
        (path.to_path_buf(), path.join("model.safetensors"))
    } else {
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        (dir.to_path_buf(), path.to_path_buf())
    };
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        bail!(
            "{} has no config.json beside the weights; BERT needs it (width, heads, activation, padding token); write one with hf_bert_config_json or Hugging Face's save_pretrained",
            dir.display()
        );
    }
    let config = bert_config_from_hf_file(&config_path)?;
    let encoder_only = match declared_encoder_only(&config_path)? {
        Some(e) => e,
        // No `architectures`: the file says whether the MLM head is there.
        None => !hf_file::parse(&hf_file::read(&weights, WHAT)?, &weights)?
            .names()
            .iter()
            .any(|n| n.starts_with("cls.predictions.")),
    };
    // The initial values are overwritten by the weights.
    let model = if encoder_only {
        Bert::encoder_only(config, &mut Rng::new(0), drop_rng)?
    } else {
        Bert::new(config, &mut Rng::new(0), drop_rng)?
    };
    load_hf_bert(&weights, &model)?;
    Ok(model)
}

/// Whether `config.json`'s `architectures` names the encoder alone (`BertModel`: true) or the
/// MLM model (`BertForMaskedLM` / `BertForPreTraining`: false); `None` when it names none.
/// Other BERT heads (sequence classification, …) are refused by name.
fn declared_encoder_only(config_path: &Path) -> Result<Option<bool>> {
    let text = std::fs::read_to_string(config_path)
        .map_err(|e| Error::Msg(format!("cannot read {}: {e}", config_path.display())))?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| Error::Msg(format!("{} is not valid JSON: {e}", config_path.display())))?;
    let Some(list) = v.get("architectures").and_then(Value::as_array) else {
        return Ok(None);
    };
    for a in list.iter().filter_map(Value::as_str) {
        match a {
            "BertModel" => return Ok(Some(true)),
            "BertForMaskedLM" | "BertForPreTraining" => return Ok(Some(false)),
            _ => {}
        }
    }
    bail!(
        "{}: architectures {} names no BERT sinter loads (BertModel, BertForMaskedLM, BertForPreTraining)",
        config_path.display(),
        Value::Array(list.clone())
    )
}

/// The sinter name of a tensor in a Hugging Face BERT checkpoint (TF-era `LayerNorm.gamma` /
/// `.beta` become `.weight` / `.bias`), or `None` for entries the MLM model does not use:
/// the `position_ids` buffer, the pooler, the next-sentence head, and the tied decoder
/// (`cls.predictions.decoder.*`, which must then equal the word embedding / the bias).
fn from_hf_bert_name(name: &str) -> Option<String> {
    // `BertModel` files name the encoder without the `bert.` prefix.
    let prefixed;
    let name = if name.starts_with("embeddings.")
        || name.starts_with("encoder.")
        || name.starts_with("pooler.")
    {
        prefixed = format!("bert.{name}");
        &prefixed
    } else {
        name
    };
    let skip = [
        "bert.embeddings.position_ids",
        "bert.pooler.",
        "cls.seq_relationship.",
        "cls.predictions.decoder.",
    ];
    if skip.iter().any(|s| name.starts_with(s)) {
        return None;
    }
    let n = name
        .strip_suffix(".gamma")
        .map(|s| format!("{s}.weight"))
        .or_else(|| name.strip_suffix(".beta").map(|s| format!("{s}.bias")));
    Some(n.unwrap_or_else(|| name.to_string()))
}

/// An encoder layer's block tensors and their Hugging Face names (q, k and v apart).
const LAYER_NAMES: &[(&str, &str)] = &[
    ("attn.proj.", "attention.output.dense."),
    ("ln1.", "attention.output.LayerNorm."),
    ("mlp.fc.", "intermediate.dense."),
    ("mlp.proj.", "output.dense."),
    ("ln2.", "output.LayerNorm."),
];

/// The model's tensors under Hugging Face's `BertForMaskedLM` names: an encoder layer's
/// block tensors renamed, its packed query/key/value split into row views. The views share
/// the parameters' storage, so assigning to them loads the model.
pub fn hf_bert_tensors(model: &Bert) -> Result<Vec<(String, Tensor)>> {
    let h = model.config.hidden;
    let mut out = Vec::new();
    for nt in model.named_tensors() {
        let Some((layer, leaf)) = nt
            .name
            .strip_prefix("bert.encoder.layer.")
            .and_then(|rest| rest.split_once('.'))
        else {
            out.push((nt.name, nt.tensor));
            continue;
        };
        let hf = |name: &str| format!("bert.encoder.layer.{layer}.{name}");
        if let Some(kind) = leaf.strip_prefix("attn.qkv.") {
            for (i, part) in ["query", "key", "value"].into_iter().enumerate() {
                let view = nt.tensor.narrow(0, i * h, h)?;
                out.push((hf(&format!("attention.self.{part}.{kind}")), view));
            }
            continue;
        }
        let Some(renamed) = LAYER_NAMES
            .iter()
            .find_map(|(ours, theirs)| leaf.strip_prefix(ours).map(|k| format!("{theirs}{k}")))
        else {
            bail!("bert: {} has no Hugging Face name", nt.name);
        };
        out.push((hf(&renamed), nt.tensor));
    }
    Ok(out)
}

/// Loads a Hugging Face `BertForMaskedLM` / `BertForPreTraining` safetensors file into
/// `model`. Names are those of [`hf_bert_tensors`]; every tensor's shape is checked (errors name the tensor
/// and both shapes), nothing may be missing, a decoder weight must equal the word embedding
/// (the head is tied), and the model changes only if everything fits.
pub fn load_hf_bert(path: impl AsRef<std::path::Path>, model: &Bert) -> Result<()> {
    let path = path.as_ref();
    let bytes = hf_file::read(path, WHAT)?;
    let st = hf_file::parse(&bytes, path)?;
    let read = |name: &str| -> Result<Tensor> {
        let v = st
            .tensor(name)
            .map_err(|e| Error::Msg(format!("{name}: {e}")))?;
        hf_file::view_tensor(&v, name, WHAT)
    };
    let mut file = std::collections::BTreeMap::new();
    for name in st.names() {
        if let Some(ours) = from_hf_bert_name(name) {
            file.insert(ours, name.clone());
        }
    }
    let mut problems = Vec::new();
    let mut plan = Vec::new();
    for (name, tensor) in hf_bert_tensors(model)? {
        let Some(hf) = file.remove(&name) else {
            problems.push(format!("{name} is missing"));
            continue;
        };
        let shape = st
            .tensor(&hf)
            .map(|v| v.shape().to_vec())
            .unwrap_or_default();
        if shape != tensor.shape() {
            problems.push(format!(
                "{hf} has shape {shape:?} in the file but the model needs {:?}",
                tensor.shape()
            ));
            continue;
        }
        plan.push((tensor, read(&hf)?));
    }
    if st
        .names()
        .iter()
        .any(|n| n.as_str() == "cls.predictions.decoder.weight")
    {
        let dec = read("cls.predictions.decoder.weight")?;
        let word = &model.embeddings.word_embeddings.weight;
        let same = match plan.iter().find(|(dst, _)| dst.shares_storage_with(word)) {
            Some((_, src)) => {
                src.shape() == dec.shape() && src.to_vec_f32()? == dec.to_vec_f32()?
            }
            None => true, // already reported missing
        };
        if !same {
            problems.push("cls.predictions.decoder.weight differs from the word embedding; sinter's BERT ties them".into());
        }
    }
    if !file.is_empty() {
        problems.push(format!(
            "unexpected tensors {} (does the config match? model: {} layers)",
            file.values()
                .take(8)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            model.config.n_layer
        ));
    }
    if !problems.is_empty() {
        bail!(
            "loading {}: the BERT weights do not fit the model: {}",
            path.display(),
            problems.join("; ")
        );
    }
    for (dst, src) in plan {
        dst.assign(&src)?;
    }
    Ok(())
}

/// Saves `model` under Hugging Face's `BertForMaskedLM` names (the tied decoder omitted, as
/// `save_pretrained` does), or `BertModel`'s (no `bert.` prefix) for an encoder-only model,
/// with the metadata `format = pt`, atomically.
pub fn save_hf_bert(model: &Bert, path: impl AsRef<std::path::Path>) -> Result<()> {
    let mut tensors = hf_bert_tensors(model)?;
    if model.head.is_none() {
        for (name, _) in &mut tensors {
            if let Some(rest) = name.strip_prefix("bert.") {
                *name = rest.to_string();
            }
        }
    }
    let md = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    hf_file::write_atomic(path.as_ref(), &hf_file::serialize(&tensors, md, WHAT)?)
}
