//! Llama-family decoders (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, SmolLM2) in Hugging Face's
//! layout: `config.json` → `DecoderConfig`, safetensors (one file or sharded with
//! `model.safetensors.index.json`; f32, bf16, f16) → a `Decoder` with the Llama block, and back
//! (`save_hf_llama`, what `save_pretrained` writes).
//!
//! | Hugging Face | sinter |
//! |---|---|
//! | `model.embed_tokens.weight` | `wte.weight` |
//! | `model.layers.{i}.input_layernorm.weight` | `blocks.{i}.ln1.weight` |
//! | `self_attn.{q,k,v}_proj.{weight,bias}` (rows stacked) | `blocks.{i}.attn.qkv.*` |
//! | `self_attn.{q,k}_norm.weight` (Qwen3) | `blocks.{i}.attn.{q,k}_norm.weight` |
//! | `self_attn.o_proj.*` | `blocks.{i}.attn.proj.*` |
//! | `post_attention_layernorm.weight` | `blocks.{i}.ln2.weight` |
//! | `mlp.{gate,up}_proj.*` (rows stacked) | `blocks.{i}.mlp.fc.*` |
//! | `mlp.down_proj.*` | `blocks.{i}.mlp.proj.*` |
//! | `model.norm.weight` | `ln_f.weight` |
//! | `lm_head.weight` (untied models) | `lm_head.weight` |

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use sinter_core::{bail, no_grad, DType, Error, Result, Tensor};
use sinter_nn::module::shared_rng;
use sinter_nn::{MlpKind, Module, NormKind, RopeConfig, RopeScaling};

use crate::decoder::{Decoder, DecoderArch, DecoderConfig};
use crate::gguf;
use crate::hf_file;

const WHAT: &str = "Llama-family";

/// The families this loader knows: (architectures entry, model_type).
const FAMILIES: &[(&str, &str)] = &[
    ("LlamaForCausalLM", "llama"),
    ("MistralForCausalLM", "mistral"),
    ("Qwen2ForCausalLM", "qwen2"),
    ("Qwen3ForCausalLM", "qwen3"),
];

/// config.json fields that describe nothing the forward pass depends on (bookkeeping,
/// training-time and generation settings).
const BENIGN_FIELDS: &[&str] = &[
    "_name_or_path",
    "architectures",
    "model_type",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "use_cache",
    "initializer_range",
    "attention_dropout",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "pretraining_tp",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "tokenizer_class",
    "is_decoder",
    "_attn_implementation_autoset",
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
];

/// config.json fields this loader reads.
const USED_FIELDS: &[&str] = &[
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "max_position_embeddings",
    "vocab_size",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "hidden_act",
];

fn field<'a>(cfg: &'a Value, key: &str) -> Option<&'a Value> {
    cfg.get(key).filter(|v| !v.is_null())
}

fn usize_field(cfg: &Value, key: &str, src: &str) -> Result<Option<usize>> {
    match field(cfg, key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 => Ok(Some(n as usize)),
            _ => bail!("{src}: {key} must be a positive integer, got {v}"),
        },
    }
}

fn need_usize(cfg: &Value, key: &str, src: &str) -> Result<usize> {
    usize_field(cfg, key, src)?
        .ok_or_else(|| Error::Msg(format!("{src}: the required field {key} is missing")))
}

fn f64_field(cfg: &Value, key: &str, src: &str) -> Result<Option<f64>> {
    match field(cfg, key) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| Error::Msg(format!("{src}: {key} must be a number, got {v}"))),
    }
}

fn bool_field(cfg: &Value, key: &str, default: bool, src: &str) -> Result<bool> {
    match field(cfg, key) {
        None => Ok(default),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| Error::Msg(format!("{src}: {key} must be true or false, got {v}"))),
    }
}

/// The family of a config: its model_type, checked against `architectures`.
fn family(cfg: &Value, src: &str) -> Result<&'static str> {
    let mt = field(cfg, "model_type").and_then(Value::as_str);
    let arch = field(cfg, "architectures")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str);
    let known = || {
        FAMILIES
            .iter()
            .map(|(a, m)| format!("{a} ({m})"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let by_arch = arch.and_then(|a| FAMILIES.iter().find(|(x, _)| *x == a));
    let by_type = mt.and_then(|m| FAMILIES.iter().find(|(_, x)| *x == m));
    match (by_arch, by_type, arch, mt) {
        (Some(a), Some(t), _, _) if a != t => bail!(
            "{src}: architectures says {} but model_type says {}",
            a.0,
            t.1
        ),
        (Some(f), _, _, _) | (None, Some(f), None, _) => Ok(f.1),
        (None, _, Some(a), _) => bail!(
            "{src}: architecture {a} is not supported; known: {}",
            known()
        ),
        (None, None, None, Some(m)) => {
            bail!("{src}: model_type {m} is not supported; known: {}", known())
        }
        (None, None, None, None) => {
            bail!("{src}: neither architectures nor model_type says what model this is")
        }
    }
}

/// The rotation of a config: `rope_theta` (top level) or transformers 5's `rope_parameters`,
/// with `rope_scaling` of type default, linear or llama3.
fn rope_of(cfg: &Value, src: &str) -> Result<RopeConfig> {
    let params = field(cfg, "rope_parameters");
    let theta = match params
        .map(|p| f64_field(p, "rope_theta", src))
        .transpose()?
        .flatten()
    {
        Some(t) => t,
        None => f64_field(cfg, "rope_theta", src)?.unwrap_or(10_000.0),
    };
    let scaling = params.or_else(|| field(cfg, "rope_scaling"));
    let scaling = match scaling {
        None => RopeScaling::None,
        Some(s) => {
            let kind = field(s, "rope_type")
                .or_else(|| field(s, "type"))
                .and_then(Value::as_str)
                .unwrap_or("default");
            let num = |k: &str| -> Result<f64> {
                f64_field(s, k, src)?
                    .ok_or_else(|| Error::Msg(format!("{src}: rope scaling {kind} needs {k}")))
            };
            match kind {
                "default" => RopeScaling::None,
                "linear" => RopeScaling::Linear { factor: num("factor")? },
                "llama3" => RopeScaling::Llama3 {
                    factor: num("factor")?,
                    low_freq_factor: num("low_freq_factor")?,
                    high_freq_factor: num("high_freq_factor")?,
                    original_max_position: num("original_max_position_embeddings")?,
                },
                other => bail!("{src}: rope scaling type {other} is not supported (known: default, linear, llama3)"),
            }
        }
    };
    let rope = RopeConfig { theta, scaling };
    rope.check()
        .map_err(|e| Error::Msg(format!("{src}: {e}")))?;
    Ok(rope)
}

/// The `DecoderConfig` (Llama block) of a Hugging Face `config.json`. `src` names the file in
/// messages. Fields that would change the computation and that this loader does not know
/// are refused by name rather than ignored.
pub fn llama_config_from_hf_json(cfg: &Value, src: &str) -> Result<DecoderConfig> {
    let fam = family(cfg, src)?;
    let Some(obj) = cfg.as_object() else {
        bail!("{src}: expected a JSON object");
    };
    let unknown: Vec<&str> = obj
        .keys()
        .map(String::as_str)
        .filter(|k| !BENIGN_FIELDS.contains(k) && !USED_FIELDS.contains(k))
        .filter(|k| !(fam == "qwen3" && *k == "qk_norm"))
        .collect();
    if !unknown.is_empty() {
        bail!("{src}: field{} {} not known to sinter's {fam} loader; they may change the model, so it is refused rather than run differently", if unknown.len() == 1 { " is" } else { "s are" }, unknown.join(", "));
    }
    // The gated MLP: act(gate(x)) · up(x).
    let mlp = match field(cfg, "hidden_act").and_then(Value::as_str) {
        None | Some("silu") => MlpKind::SwiGlu,
        Some("gelu_pytorch_tanh" | "gelu_new") => MlpKind::GeGlu,
        Some(act) => bail!(
            "{src}: hidden_act {act} is not supported (sinter's gated MLPs: silu, gelu_pytorch_tanh)"
        ),
    };
    let width = need_usize(cfg, "hidden_size", src)?;
    let heads = need_usize(cfg, "num_attention_heads", src)?;
    let kv = usize_field(cfg, "num_key_value_heads", src)?.unwrap_or(heads);
    let head_dim = usize_field(cfg, "head_dim", src)?.unwrap_or(width / heads);
    let context = usize_field(cfg, "max_position_embeddings", src)?.unwrap_or(2048);
    let n_layer = need_usize(cfg, "num_hidden_layers", src)?;
    let window = usize_field(cfg, "sliding_window", src)?;
    let (mut sliding_window, mut full_attention_layers) = (None, 0);
    if fam == "mistral" {
        // Mistral windows every layer.
        sliding_window = window.filter(|&w| w < context);
    } else if let (true, Some(w)) = (bool_field(cfg, "use_sliding_window", false, src)?, window) {
        // Qwen windows the layers from max_window_layers on; the first ones attend fully.
        let full = qwen_full_attention_layers(cfg, n_layer, src)?;
        if w < context && full < n_layer {
            (sliding_window, full_attention_layers) = (Some(w), full);
        }
    }
    let attention_bias = bool_field(cfg, "attention_bias", false, src)?;
    let config = DecoderConfig {
        n_layer,
        n_head: heads,
        n_embd: width,
        block_size: context,
        vocab_size: need_usize(cfg, "vocab_size", src)?,
        dropout: 0.0,
        arch: DecoderArch {
            n_kv_head: Some(kv),
            head_dim: Some(head_dim),
            mlp_hidden: Some(need_usize(cfg, "intermediate_size", src)?),
            mlp,
            norm: NormKind::RmsNorm,
            norm_eps: f64_field(cfg, "rms_norm_eps", src)?.unwrap_or(1e-6) as f32,
            // Qwen2 always biases q, k and v (and never o); Llama's attention_bias covers all four.
            qkv_bias: fam == "qwen2" || attention_bias,
            out_bias: fam != "qwen2" && attention_bias,
            mlp_bias: bool_field(cfg, "mlp_bias", false, src)?,
            qk_norm: fam == "qwen3",
            rope: Some(rope_of(cfg, src)?),
            tie_head: bool_field(cfg, "tie_word_embeddings", false, src)?,
            sliding_window,
            full_attention_layers,
        },
    };
    config
        .check()
        .map_err(|e| Error::Msg(format!("{src}: {e}")))?;
    Ok(config)
}

/// How many leading layers of a Qwen model with `use_sliding_window` attend fully: from
/// `layer_types` (full_attention layers, then sliding_attention ones) when given, else
/// `max_window_layers` (transformers' default 28), at most every layer.
fn qwen_full_attention_layers(cfg: &Value, n_layer: usize, src: &str) -> Result<usize> {
    let Some(types) = field(cfg, "layer_types") else {
        return Ok(usize_field(cfg, "max_window_layers", src)?
            .unwrap_or(28)
            .min(n_layer));
    };
    let types: Vec<&str> = types
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if types.len() != n_layer {
        bail!("{src}: layer_types must list \"full_attention\" or \"sliding_attention\" for each of the {n_layer} layers");
    }
    let full = types.iter().take_while(|t| **t == "full_attention").count();
    if let Some((i, t)) = types
        .iter()
        .enumerate()
        .skip(full)
        .find(|(_, t)| **t != "sliding_attention")
    {
        bail!("{src}: layer_types[{i}] is \"{t}\"; sinter runs full-attention layers first, then sliding-window ones (transformers' max_window_layers)");
    }
    Ok(full)
}

/// The family name a config is written back under.
fn family_of(c: &DecoderConfig) -> (&'static str, &'static str) {
    match (c.arch.qk_norm, c.arch.qkv_bias && !c.arch.out_bias) {
        (true, _) => FAMILIES[3],
        (false, true) => FAMILIES[2],
        _ if c.arch.sliding_window.is_some() => FAMILIES[1],
        _ => FAMILIES[0],
    }
}

/// `config.json` for `c` as transformers writes it.
pub fn hf_llama_config_json(c: &DecoderConfig) -> Result<Value> {
    let act = match c.arch.mlp {
        MlpKind::SwiGlu => "silu",
        MlpKind::GeGlu => "gelu_pytorch_tanh",
        _ => bail!(
            "only Llama-family models (RMSNorm, SwiGLU or GeGLU) are written as Llama configs"
        ),
    };
    if c.arch.norm != NormKind::RmsNorm {
        bail!("only Llama-family models (RMSNorm, SwiGLU or GeGLU) are written as Llama configs");
    }
    let qwen = c.arch.qk_norm || (c.arch.qkv_bias && !c.arch.out_bias);
    if c.arch.sliding_window.is_some() && !qwen && c.arch.qkv_bias {
        bail!("a sliding window is written only for Mistral-style (no attention bias) and Qwen models");
    }
    if c.arch.full_attention_layers > 0 && !qwen {
        bail!("layers without the sliding window (max_window_layers) are written only for Qwen models");
    }
    let Some(rope) = &c.arch.rope else {
        bail!("only rotary models are written as Llama configs");
    };
    let (arch, model_type) = family_of(c);
    let mut v = json!({
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": c.n_embd,
        "intermediate_size": c.arch.mlp_hidden.unwrap_or(4 * c.n_embd),
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_kv_head(),
        "head_dim": c.head_dim(),
        "hidden_act": act,
        "rms_norm_eps": c.arch.norm_eps,
        "max_position_embeddings": c.block_size,
        "vocab_size": c.vocab_size,
        "tie_word_embeddings": c.arch.tie_head,
        "rope_theta": rope.theta,
        "torch_dtype": "float32",
    });
    if let Some(w) = c.arch.sliding_window {
        v["sliding_window"] = json!(w);
        if qwen {
            v["use_sliding_window"] = json!(true);
            v["max_window_layers"] = json!(c.arch.full_attention_layers);
        }
    }
    if model_type == "llama" {
        v["attention_bias"] = json!(c.arch.qkv_bias);
        v["mlp_bias"] = json!(c.arch.mlp_bias);
    }
    match rope.scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => {
            v["rope_scaling"] = json!({"rope_type": "linear", "factor": factor})
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position,
        } => {
            v["rope_scaling"] = json!({"rope_type": "llama3", "factor": factor,
                "low_freq_factor": low_freq_factor, "high_freq_factor": high_freq_factor,
                "original_max_position_embeddings": original_max_position})
        }
    }
    Ok(v)
}

/// For each of the model's tensors, the Hugging Face tensors stacked (by rows) to make it.
pub(crate) fn name_map(c: &DecoderConfig) -> Vec<(String, Vec<String>)> {
    let a = &c.arch;
    let mut m: Vec<(String, Vec<String>)> = vec![(
        "wte.weight".into(),
        vec!["model.embed_tokens.weight".into()],
    )];
    for i in 0..c.n_layer {
        let (o, h) = (format!("blocks.{i}"), format!("model.layers.{i}"));
        let mut add = |ours: &str, hf: &[&str]| {
            m.push((
                format!("{o}.{ours}"),
                hf.iter().map(|n| format!("{h}.{n}")).collect(),
            ));
        };
        add("ln1.weight", &["input_layernorm.weight"]);
        add(
            "attn.qkv.weight",
            &[
                "self_attn.q_proj.weight",
                "self_attn.k_proj.weight",
                "self_attn.v_proj.weight",
            ],
        );
        if a.qkv_bias {
            add(
                "attn.qkv.bias",
                &[
                    "self_attn.q_proj.bias",
                    "self_attn.k_proj.bias",
                    "self_attn.v_proj.bias",
                ],
            );
        }
        if a.qk_norm {
            add("attn.q_norm.weight", &["self_attn.q_norm.weight"]);
            add("attn.k_norm.weight", &["self_attn.k_norm.weight"]);
        }
        add("attn.proj.weight", &["self_attn.o_proj.weight"]);
        if a.out_bias {
            add("attn.proj.bias", &["self_attn.o_proj.bias"]);
        }
        add("ln2.weight", &["post_attention_layernorm.weight"]);
        add(
            "mlp.fc.weight",
            &["mlp.gate_proj.weight", "mlp.up_proj.weight"],
        );
        if a.mlp_bias {
            add("mlp.fc.bias", &["mlp.gate_proj.bias", "mlp.up_proj.bias"]);
        }
        add("mlp.proj.weight", &["mlp.down_proj.weight"]);
        if a.mlp_bias {
            add("mlp.proj.bias", &["mlp.down_proj.bias"]);
        }
    }
    m.push(("ln_f.weight".into(), vec!["model.norm.weight".into()]));
    if !a.tie_head {
        m.push(("lm_head.weight".into(), vec!["lm_head.weight".into()]));
    }
    m
}

/// Puts Hugging Face-named tensors (any float dtype, on the CPU) into a new model of `config`.
/// Every tensor the model needs must be there with its shape; a tensor left over is an error
/// (a tied model's `lm_head.weight` must equal the embedding).
pub fn gpt_from_hf_tensors(
    config: DecoderConfig,
    tensors: Vec<(String, Tensor)>,
    src: &str,
) -> Result<Decoder> {
    let _g = no_grad();
    let mut file: HashMap<String, Tensor> = tensors.into_iter().collect();
    let shapes: HashMap<String, Vec<usize>> = config.param_specs().into_iter().collect();
    let mut ours: HashMap<String, Tensor> = HashMap::new();
    let mut problems = Vec::new();
    for (name, parts) in name_map(&config) {
        let mut got = Vec::new();
        for p in &parts {
            match file.remove(p) {
                Some(t) => got.push(t.to_dtype(DType::F32)?),
                None => problems.push(format!("{p} is missing")),
            }
        }
        if got.len() != parts.len() {
            continue;
        }
        let t = if got.len() == 1 {
            got.remove(0)
        } else if got.iter().all(gguf::is_placeholder) {
            // Parts kept quantized (`gguf::to_hf_keeping`) stay placeholders when fused.
            let rows = got.iter().map(|t| t.shape()[0]).sum::<usize>();
            gguf::placeholder(&[rows, got[0].shape()[1]])?
        } else {
            Tensor::cat(&got, 0)?
        };
        let Some(want) = shapes.get(&name) else {
            bail!("{src}: the model has no {name} (an inconsistent name table)");
        };
        if t.shape() != want.as_slice() {
            problems.push(format!(
                "{} give shape {:?}, the config needs {want:?} for {name}",
                parts.join(" + "),
                t.shape(),
            ));
            continue;
        }
        ours.insert(name, t);
    }
    if config.arch.tie_head {
        if let (Some(head), Some(wte)) = (file.remove("lm_head.weight"), ours.get("wte.weight")) {
            if head.shape() != wte.shape()
                || head.to_dtype(DType::F32)?.to_vec_f32()? != wte.to_vec_f32()?
            {
                problems.push(
                    "lm_head.weight differs from the embedding but tie_word_embeddings is true"
                        .into(),
                );
            }
        }
    }
    // Rotary tables some older checkpoints store: recomputed here.
    file.retain(|n, _| !n.ends_with("rotary_emb.inv_freq"));
    if !file.is_empty() {
        let mut left: Vec<&String> = file.keys().collect();
        left.sort();
        let more = if left.len() > 6 {
            format!(" and {} more", left.len() - 6)
        } else {
            String::new()
        };
        let shown: Vec<&str> = left.iter().take(6).map(|s| s.as_str()).collect();
        problems.push(format!(
            "unexpected tensors {}{more} (does config.json match the weights?)",
            shown.join(", ")
        ));
    }
    if !problems.is_empty() {
        bail!(
            "{src}: the {WHAT} weights do not fit the config ({} problem{}): {}",
            problems.len(),
            if problems.len() == 1 { "" } else { "s" },
            problems.join("; ")
        );
    }
    let mut get = |name: &str| -> Result<Tensor> {
        // A parameter taken twice would be shared: each is taken once, by its own name.
        let t = ours.remove(name);
        let t = t.ok_or_else(|| Error::Msg(format!("{src}: no weight for {name}")))?;
        if gguf::is_placeholder(&t) {
            return Ok(t); // its layer gets a quantized form after the build
        }
        t.to_var()
    };
    Decoder::from_named(config, &mut get, &shared_rng(0))
}

/// The safetensors files of a Hugging Face directory: `model.safetensors`, or the shards
/// listed in `model.safetensors.index.json`.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.is_file() {
        bail!(
            "{}: neither model.safetensors nor model.safetensors.index.json is there",
            dir.display()
        );
    }
    let text = std::fs::read_to_string(&index)
        .map_err(|e| Error::Msg(format!("cannot read {}: {e}", index.display())))?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| Error::Msg(format!("{} is not valid JSON: {e}", index.display())))?;
    let Some(map) = v.get("weight_map").and_then(Value::as_object) else {
        bail!("{}: no weight_map object", index.display());
    };
    let mut files: Vec<String> = Vec::new();
    for (tensor, f) in map {
        let Some(f) = f.as_str().filter(|f| !f.contains('/') && !f.contains("..")) else {
            bail!(
                "{}: tensor {tensor} maps to {f}, not a file name in the directory",
                index.display()
            );
        };
        if !files.iter().any(|x| x == f) {
            files.push(f.to_string());
        }
    }
    files.sort();
    Ok(files.into_iter().map(|f| dir.join(f)).collect())
}

/// Every tensor of a Hugging Face directory's safetensors files (f32/bf16/f16, on the CPU).
pub fn read_hf_tensors(dir: &Path) -> Result<Vec<(String, Tensor)>> {
    let mut out = Vec::new();
    for path in weight_files(dir)? {
        let bytes = hf_file::read(&path, WHAT)?;
        let st = hf_file::parse(&bytes, &path)?;
        for (name, view) in st.tensors() {
            let t = hf_file::view_tensor(&view, &name, WHAT)
                .map_err(|e| Error::Msg(format!("{}: {e}", path.display())))?;
            out.push((name, t));
        }
    }
    Ok(out)
}

/// A Llama-family model from a Hugging Face directory (`config.json` + safetensors).
pub fn load_hf_llama(dir: impl AsRef<Path>) -> Result<Decoder> {
    let dir = dir.as_ref();
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path)
        .map_err(|e| Error::Msg(format!("cannot read {}: {e}", cfg_path.display())))?;
    let json: Value = serde_json::from_str(&text)
        .map_err(|e| Error::Msg(format!("{} is not valid JSON: {e}", cfg_path.display())))?;
    let src = cfg_path.display().to_string();
    let config = llama_config_from_hf_json(&json, &src)?;
    gpt_from_hf_tensors(config, read_hf_tensors(dir)?, &dir.display().to_string())
}

/// The model's tensors under Hugging Face's names (f32, stacked tensors split again).
pub fn hf_llama_tensors(model: &Decoder) -> Result<Vec<(String, Tensor)>> {
    let ours: BTreeMap<String, Tensor> = model.parameters().into_iter().collect();
    let mut out = Vec::new();
    for (name, parts) in name_map(&model.config) {
        let t = ours
            .get(&name)
            .ok_or_else(|| Error::Msg(format!("model has no {name}")))?;
        let t = t.to_dtype(DType::F32)?;
        if parts.len() == 1 {
            out.push((parts[0].clone(), t));
            continue;
        }
        let c = &model.config;
        let sizes: Vec<usize> =
            if name.ends_with("attn.qkv.weight") || name.ends_with("attn.qkv.bias") {
                let (q, kv) = (c.n_head * c.head_dim(), c.n_kv_head() * c.head_dim());
                vec![q, kv, kv]
            } else {
                let h = t.shape()[0] / 2;
                vec![h, h]
            };
        for (p, piece) in parts.iter().zip(t.split(&sizes, 0)?) {
            out.push((p.clone(), piece.contiguous()?));
        }
    }
    Ok(out)
}

/// Writes `model` as a Hugging Face directory (`config.json`, `model.safetensors`) that
/// transformers' `from_pretrained` loads. Files are written atomically; an existing
/// directory's files are replaced only by complete new ones.
pub fn save_hf_llama(model: &Decoder, dir: impl AsRef<Path>) -> Result<()> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::Msg(format!("cannot create {}: {e}", dir.display())))?;
    let config = hf_llama_config_json(&model.config)?;
    let mut md = HashMap::new();
    md.insert("format".to_string(), "pt".to_string());
    let bytes = hf_file::serialize(&hf_llama_tensors(model)?, md, WHAT)?;
    hf_file::write_atomic(&dir.join("model.safetensors"), &bytes)?;
    let text = serde_json::to_string_pretty(&config).map_err(|e| Error::Msg(e.to_string()))?;
    hf_file::write_atomic(&dir.join("config.json"), text.as_bytes())
}
