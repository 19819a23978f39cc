//! GPT-2 weights in Hugging Face's safetensors layout, to and from [`Decoder`].
//!
//! Hugging Face names (optionally prefixed `transformer.`, as `GPT2LMHeadModel` saves them):
//!
//! | Hugging Face | sinter | note |
//! | --- | --- | --- |
//! | `wte.weight` [V, C], `wpe.weight` [T, C] | `wte.weight`, `wpe.weight` | |
//! | `h.{i}.ln_1`, `h.{i}.ln_2`, `ln_f` (`.weight`, `.bias`) | `blocks.{i}.ln1`, `blocks.{i}.ln2`, `ln_f` | |
//! | `h.{i}.attn.c_attn.weight` [C, 3C] | `blocks.{i}.attn.qkv.weight` [3C, C] | Conv1D: transposed |
//! | `h.{i}.attn.c_proj.weight` [C, C] | `blocks.{i}.attn.proj.weight` | transposed |
//! | `h.{i}.mlp.c_fc.weight` [C, 4C] | `blocks.{i}.mlp.fc.weight` [4C, C] | transposed |
//! | `h.{i}.mlp.c_proj.weight` [4C, C] | `blocks.{i}.mlp.proj.weight` [C, 4C] | transposed |
//! | the biases of those four | the same, `.bias` | |
//!
//! `h.{i}.attn.bias` / `h.{i}.attn.masked_bias` (causal-mask buffers of older checkpoints) are
//! skipped; `lm_head.weight`, if present, must equal `wte.weight` (GPT-2 ties them).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::{SafeTensors, TensorView};
use sinter_core::{bail, Error, Result, Tensor};
use sinter_nn::{Module, TensorKind};

use crate::decoder::{Decoder, DecoderConfig};
use crate::hf_file;

const PREFIX: &str = "transformer.";

/// The Hugging Face name of one of [`Decoder`]'s tensors, and whether it is a Conv1D weight
/// (stored transposed, `[in, out]`). `None` for a name GPT-2 does not have.
pub fn hf_gpt2_name(ours: &str) -> Option<(String, bool)> {
    match ours {
        "wte.weight" | "wpe.weight" | "ln_f.weight" | "ln_f.bias" => {
            return Some((ours.to_string(), false))
        }
        _ => {}
    }
    let rest = ours.strip_prefix("blocks.")?;
    let (i, rest) = rest.split_once('.')?;
    i.parse::<usize>().ok()?;
    let (module, param) = rest.rsplit_once('.')?;
    let hf_module = match module {
        "ln1" => "ln_1",
        "ln2" => "ln_2",
        "attn.qkv" => "attn.c_attn",
        "attn.proj" => "attn.c_proj",
        "mlp.fc" => "mlp.c_fc",
        "mlp.proj" => "mlp.c_proj",
        _ => return None,
    };
    if param != "weight" && param != "bias" {
        return None;
    }
    let conv1d = param == "weight" && !module.starts_with("ln");
    Some((format!("h.{i}.{hf_module}.{param}"), conv1d))
}

const WHAT: &str = "GPT-2";

fn view_tensor(v: &TensorView, name: &str) -> Result<Tensor> {
    hf_file::view_tensor(v, name, WHAT)
}

fn is_skipped_buffer(name: &str) -> bool {
    name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")
}

/// The file's tensors by name with any `transformer.` prefix removed.
fn by_hf_name<'a>(st: &'a SafeTensors<'a>) -> Result<BTreeMap<String, TensorView<'a>>> {
    let mut map = BTreeMap::new();
    for (name, view) in st.tensors() {
        let short = name.strip_prefix(PREFIX).unwrap_or(&name).to_string();
        if map.insert(short.clone(), view).is_some() {
            bail!("the file holds {short} both with and without the '{PREFIX}' prefix");
        }
    }
    Ok(map)
}

/// Loads GPT-2 weights saved by Hugging Face (`model.safetensors` of `GPT2LMHeadModel` or
/// `GPT2Model`) into `model`, transposing the Conv1D weights. Every tensor is checked first —
/// names, shapes (the error names the tensor and both shapes), nothing missing, nothing
/// unexpected — and the model is changed only if all of them fit.
pub fn load_hf_gpt2(path: impl AsRef<Path>, model: &Decoder) -> Result<()> {
    let path = path.as_ref();
    let bytes = hf_file::read(path, WHAT)?;
    load_hf_gpt2_bytes(&bytes, model)
        .map_err(|e| Error::Msg(format!("loading {}: {e}", path.display())))
}

/// [`load_hf_gpt2`] from the bytes of a safetensors file.
pub fn load_hf_gpt2_bytes(bytes: &[u8], model: &Decoder) -> Result<()> {
    let st = hf_file::parse(bytes, Path::new("the data"))?;
    let mut file = by_hf_name(&st)?;
    let mut problems = Vec::new();
    let mut plan: Vec<(Tensor, Tensor)> = Vec::new();
    let mut wte = None;
    for nt in model.named_tensors() {
        let Some((hf, conv1d)) = hf_gpt2_name(&nt.name) else {
            if nt.kind == TensorKind::Buffer {
                continue; // state GPT-2 files do not carry
            }
            bail!(
                "model tensor {} has no GPT-2 counterpart; this loader does not know it",
                nt.name
            );
        };
        let Some(view) = file.remove(&hf) else {
            problems.push(format!("{hf} (for {}) is missing", nt.name));
            continue;
        };
        let ours = nt.tensor.shape().to_vec();
        let want: Vec<usize> = if conv1d {
            ours.iter().rev().copied().collect()
        } else {
            ours.clone()
        };
        if view.shape() != want.as_slice() {
            let layout = if conv1d {
                format!(" (Conv1D layout [in, out] of {} {ours:?})", nt.name)
            } else {
                String::new()
            };
            problems.push(format!(
                "{hf} has shape {:?} in the file but the model needs {want:?}{layout}",
                view.shape()
            ));
            continue;
        }
        let t = view_tensor(&view, &hf)?;
        let t = if conv1d { t.t()?.contiguous()? } else { t };
        if nt.name == "wte.weight" {
            wte = Some(t.clone());
        }
        plan.push((nt.tensor.clone(), t));
    }
    if let Some(head) = file.remove("lm_head.weight") {
        if let Some(wte) = &wte {
            if head.shape() != wte.shape() {
                problems.push(format!("lm_head.weight has shape {:?} but wte.weight {:?}; GPT-2's head is tied to wte", head.shape(), wte.shape()));
            } else if view_tensor(&head, "lm_head.weight")?.to_vec_f32()? != wte.to_vec_f32()? {
                problems.push("lm_head.weight differs from wte.weight; sinter's GPT ties the head to the token embedding, so an untied head cannot be loaded".into());
            }
        }
    }
    let unexpected: Vec<String> = file
        .keys()
        .filter(|n| !is_skipped_buffer(n))
        .cloned()
        .collect();
    if !unexpected.is_empty() {
        let shown = unexpected
            .iter()
            .take(8)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        let more = if unexpected.len() > 8 {
            format!(" and {} more", unexpected.len() - 8)
        } else {
            String::new()
        };
        problems.push(format!(
            "unexpected tensors {shown}{more} (does the config match the file? model: {} layers)",
            model.config.n_layer
        ));
    }
    if !problems.is_empty() {
        bail!(
            "the GPT-2 weights do not fit the model ({} problem{}): {}",
            problems.len(),
            if problems.len() == 1 { "" } else { "s" },
            problems.join("; ")
        );
    }
    for (dst, src) in plan {
        dst.assign(&src)?;
    }
    Ok(())
}

/// The safetensors bytes of `model` in Hugging Face's GPT-2 layout (`transformer.`-prefixed,
/// Conv1D weights transposed, no `lm_head.weight` since it is tied), with the metadata
/// `format = pt` that `transformers` requires, and `n_head`.
pub fn hf_gpt2_bytes(model: &Decoder) -> Result<Vec<u8>> {
    let mut tensors = Vec::new();
    for nt in model.named_tensors() {
        let Some((hf, conv1d)) = hf_gpt2_name(&nt.name) else {
            if nt.kind == TensorKind::Buffer {
                continue;
            }
            bail!("model tensor {} has no GPT-2 counterpart", nt.name);
        };
        let t = if conv1d {
            nt.tensor.t()?.contiguous()?
        } else {
            nt.tensor.clone()
        };
        tensors.push((format!("{PREFIX}{hf}"), t));
    }
    let mut md = HashMap::new();
    md.insert("format".to_string(), "pt".to_string());
    md.insert("n_head".to_string(), model.config.n_head.to_string());
    hf_file::serialize(&tensors, md, WHAT)
}

/// Saves `model` as a Hugging Face GPT-2 `model.safetensors` (see [`hf_gpt2_bytes`]),
/// atomically: a temporary file in the same directory, fsynced, then renamed over `path`.
pub fn save_hf_gpt2(model: &Decoder, path: impl AsRef<Path>) -> Result<()> {
    hf_file::write_atomic(path.as_ref(), &hf_gpt2_bytes(model)?)
}

/// The [`DecoderConfig`] of a Hugging Face GPT-2 safetensors file, from its shapes: layers
/// (`h.{i}`), width and vocabulary (`wte`), context (`wpe`). The head count is not in the
/// shapes: it comes from the file's `n_head` metadata if present, else `n_head`, else the
/// `"n_head"` of a `config.json` beside the file (as `save_pretrained` writes), else
/// width / 64 (every published GPT-2 size has 64-wide heads).
pub fn hf_gpt2_config(path: impl AsRef<Path>, n_head: Option<usize>) -> Result<DecoderConfig> {
    let path = path.as_ref();
    let bytes = hf_file::read(path, WHAT)?;
    let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| {
        Error::Msg(format!(
            "{} is not a valid safetensors file: {e}",
            path.display()
        ))
    })?;
    let st = hf_file::parse(&bytes, path)?;
    let file = by_hf_name(&st)?;
    let shape = |n: &str| -> Result<Vec<usize>> {
        match file.get(n) {
            Some(v) if v.shape().len() == 2 => Ok(v.shape().to_vec()),
            Some(v) => bail!(
                "{n} in {} has shape {:?}, not a matrix",
                path.display(),
                v.shape()
            ),
            None => bail!("{} has no {n}; is it a GPT-2 file?", path.display()),
        }
    };
    let (wte, wpe) = (shape("wte.weight")?, shape("wpe.weight")?);
    let n_layer = file
        .keys()
        .filter_map(|n| {
            n.strip_prefix("h.")?
                .split_once('.')?
                .0
                .parse::<usize>()
                .ok()
        })
        .max()
        .map_or(0, |m| m + 1);
    let from_meta = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("n_head"))
        .and_then(|s| s.parse().ok());
    let from_json = || {
        let json = std::fs::read_to_string(path.with_file_name("config.json")).ok()?;
        let rest = &json[json.find("\"n_head\"")? + "\"n_head\"".len()..];
        let rest = rest.trim_start().strip_prefix(':')?.trim_start();
        rest[..rest.find(|c: char| !c.is_ascii_digit())?]
            .parse::<usize>()
            .ok()
    };
    let n_head = from_meta
        .or(n_head)
        .or_else(from_json)
        .unwrap_or((wte[1] / 64).max(1));
    Ok(DecoderConfig {
        n_layer,
        n_head,
        n_embd: wte[1],
        block_size: wpe[0],
        vocab_size: wte[0],
        ..DecoderConfig::preset("gpt2").expect("preset")
    })
}

/// A Hugging Face `config.json` for `GPT2LMHeadModel` with this config, so a directory with
/// it and [`save_hf_gpt2`]'s `model.safetensors` loads with `from_pretrained`.
pub fn hf_gpt2_config_json(c: &DecoderConfig) -> String {
    format!(
        r#"{{
  "architectures": ["GPT2LMHeadModel"],
  "model_type": "gpt2",
  "activation_function": "gelu_new",
  "n_layer": {},
  "n_head": {},
  "n_embd": {},
  "n_positions": {},
  "n_ctx": {},
  "vocab_size": {},
  "layer_norm_epsilon": 1e-05,
  "resid_pdrop": {d},
  "embd_pdrop": {d},
  "attn_pdrop": {d},
  "tie_word_embeddings": true,
  "bos_token_id": 50256,
  "eos_token_id": 50256
}}
"#,
        c.n_layer,
        c.n_head,
        c.n_embd,
        c.block_size,
        c.block_size,
        c.vocab_size,
        d = c.dropout
    )
}
