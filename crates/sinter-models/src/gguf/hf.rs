//! A Llama-family GGUF as its Hugging Face checkpoint: the `config.json` transformers would
//! write and the tensors under their transformers names, so one loader serves both sources.
//!
//! llama.cpp's converter (`convert_hf_to_gguf.py`) renames the tensors and, for the `llama`
//! architecture only, permutes the rows of the Q and K projections: within each head it
//! interleaves the two rotary halves (row i of the first half and row i of the second become
//! rows 2i and 2i + 1), the pairing its rotary kernel reads. [`to_hf`] undoes that, as
//! transformers' GGUF loader does (`reverse_permute_weights`), so the tensors equal the
//! original checkpoint's. Qwen2 and Qwen3 are converted without the permutation (their GGUF
//! rotary mode is NEOX, the half-split layout of transformers), so their tensors only get
//! new names.

use std::collections::HashSet;

use serde_json::{json, Map, Value};
use sinter_core::{bail, Device, Error, Result, Tensor};

use super::GgufFile;

/// The architectures `to_hf` converts: GGUF `general.architecture`, transformers class and
/// `model_type`.
const ARCHITECTURES: &[(&str, &str, &str)] = &[
    // Mistral is converted by llama.cpp as `llama`.
    ("llama", "LlamaForCausalLM", "llama"),
    ("qwen2", "Qwen2ForCausalLM", "qwen2"),
    ("qwen3", "Qwen3ForCausalLM", "qwen3"),
];

/// GGUF names of a block's tensors and their transformers names under `model.layers.N.`.
const BLOCK_TENSORS: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// The Hugging Face config (as `config.json`) and the tensors (transformers names, f32 on the
/// CPU, in file order) of a Llama-family GGUF: `general.architecture` llama (Llama,
/// Mistral), qwen2 or qwen3. Other architectures, and tensors that a dense Llama-family
/// model does not have, are refused by name.
pub fn to_hf(file: &GgufFile) -> Result<(Value, Vec<(String, Tensor)>)> {
    to_hf_keeping(file, &HashSet::new())
}

/// [`to_hf`] with the GGUF tensors named in `keep` left out of the conversion: each comes as
/// a [`super::placeholder`] of its shape (no data read), for a layer that will run the
/// file's quantized blocks instead.
pub fn to_hf_keeping(
    file: &GgufFile,
    keep: &HashSet<String>,
) -> Result<(Value, Vec<(String, Tensor)>)> {
    let arch = file.get_str("general.architecture")?;
    let Some(&(_, class, model_type)) = ARCHITECTURES.iter().find(|(a, _, _)| *a == arch) else {
        bail!(
            "{}: architecture {arch} has no Hugging Face conversion in sinter (it converts {})",
            file.path().display(),
            ARCHITECTURES
                .iter()
                .map(|(a, _, _)| *a)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let config = hf_config(file, arch, class, model_type)?;
    let heads = file.get_u32(&format!("{arch}.attention.head_count"))? as usize;
    let kv_heads = config["num_key_value_heads"]
        .as_u64()
        .expect("hf_config sets num_key_value_heads") as usize;
    let mut tensors = Vec::with_capacity(file.tensor_infos().len());
    for info in file.tensor_infos() {
        let Some(hf_name) = hf_tensor_name(&info.name) else {
            if info.name == "rope_freqs.weight" {
                // Llama 3's rotary frequency factors, which the HF config carries instead.
                continue;
            }
            bail!(
                "{}: tensor {} has no place in a dense {arch} model's Hugging Face checkpoint (a mixture of experts, or another architecture, is not converted)",
                file.path().display(),
                info.name
            )
        };
        if keep.contains(&info.name) {
            tensors.push((hf_name, super::placeholder(&info.shape)?));
            continue;
        }
        let mut tensor = file.tensor(&info.name)?;
        if arch == "llama" {
            if hf_name.ends_with("self_attn.q_proj.weight")
                || hf_name.ends_with("self_attn.q_proj.bias")
            {
                tensor = unpermute_rotary_rows(&tensor, heads, &info.name, file)?;
            } else if hf_name.ends_with("self_attn.k_proj.weight")
                || hf_name.ends_with("self_attn.k_proj.bias")
            {
                tensor = unpermute_rotary_rows(&tensor, kv_heads, &info.name, file)?;
            }
        }
        tensors.push((hf_name, tensor));
    }
    Ok((config, tensors))
}

/// The transformers name of GGUF tensor `name`, if it is one of a dense Llama-family model.
pub fn hf_tensor_name(name: &str) -> Option<String> {
    match name {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (stem, suffix) = rest.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let (_, hf) = BLOCK_TENSORS.iter().find(|(g, _)| *g == stem)?;
    Some(format!("model.layers.{layer}.{hf}.{suffix}"))
}

/// Undoes llama.cpp's rotary row permutation of a Q or K projection (weight [rows, cols] or
/// bias [rows]) with `heads` heads: GGUF row `2i + p` of a head is HF row `p·(d/2) + i`,
/// for head size d, i < d/2 and p ∈ {0, 1}.
pub fn unpermute_rotary_rows(
    tensor: &Tensor,
    heads: usize,
    name: &str,
    file: &GgufFile,
) -> Result<Tensor> {
    let shape = tensor.shape().to_vec();
    let rows = shape.first().copied().unwrap_or(0);
    if heads == 0 || !rows.is_multiple_of(2 * heads) {
        bail!(
            "{}: tensor {name} has {rows} rows, which do not split into {heads} heads of an even size; the head counts in the metadata do not fit the tensor",
            file.path().display()
        );
    }
    let row_len = shape.iter().skip(1).product::<usize>();
    let hf = unpermute_rows(&tensor.to_vec_f32()?, rows, row_len, heads);
    Tensor::from_vec(hf, &shape, Device::Cpu)
}

/// `unpermute_rotary_rows` over `rows` rows of `row_len` items (f32 values, or the bytes of
/// quantized rows): GGUF row `2i + p` of each head goes to HF row `p·(d/2) + i`. The caller
/// has checked that `rows` splits into `heads` heads of an even size.
pub fn unpermute_rows<T: Copy + Default>(
    gguf: &[T],
    rows: usize,
    row_len: usize,
    heads: usize,
) -> Vec<T> {
    let half = rows / heads / 2;
    let mut hf = vec![T::default(); gguf.len()];
    for h in 0..heads {
        for i in 0..half {
            for p in 0..2 {
                let from = (h * 2 * half + 2 * i + p) * row_len;
                let to = (h * 2 * half + p * half + i) * row_len;
                hf[to..to + row_len].copy_from_slice(&gguf[from..from + row_len]);
            }
        }
    }
    hf
}

/// An f32 from the file as the decimal it was written from (1e-5, not 9.99999974738e-6).
fn json_f32(f: f32) -> Value {
    let shortest: f64 = f.to_string().parse().expect("an f32 prints as a number");
    json!(shortest)
}

fn hf_config(file: &GgufFile, arch: &str, class: &str, model_type: &str) -> Result<Value> {
    let key = |k: &str| format!("{arch}.{k}");
    let u = |k: &str| file.get_u32(&key(k));
    let heads = u("attention.head_count")?;
    let kv_heads = match file.get(&key("attention.head_count_kv")) {
        Some(_) => u("attention.head_count_kv")?,
        None => heads,
    };
    let embed = file.tensor_info("token_embd.weight")?;
    let mut c = Map::new();
    c.insert("architectures".into(), json!([class]));
    c.insert("model_type".into(), json!(model_type));
    c.insert("hidden_size".into(), json!(u("embedding_length")?));
    c.insert("intermediate_size".into(), json!(u("feed_forward_length")?));
    c.insert("num_hidden_layers".into(), json!(u("block_count")?));
    c.insert("num_attention_heads".into(), json!(heads));
    c.insert("num_key_value_heads".into(), json!(kv_heads));
    if file.get(&key("attention.key_length")).is_some() {
        c.insert("head_dim".into(), json!(u("attention.key_length")?));
    }
    c.insert("hidden_act".into(), json!("silu"));
    c.insert(
        "rms_norm_eps".into(),
        json_f32(file.get_f32(&key("attention.layer_norm_rms_epsilon"))?),
    );
    // llama.cpp's default base when the converter wrote none (transformers' too).
    let theta = match file.get(&key("rope.freq_base")) {
        Some(_) => file.get_f32(&key("rope.freq_base"))?,
        None => 10000.0,
    };
    c.insert("rope_theta".into(), json_f32(theta));
    c.insert("rope_scaling".into(), rope_scaling(file, arch)?);
    c.insert(
        "max_position_embeddings".into(),
        json!(u("context_length")?),
    );
    // The embedding's rows: what the checkpoint's tensors have, whatever the tokenizer lists.
    c.insert("vocab_size".into(), json!(embed.shape[0]));
    c.insert(
        "tie_word_embeddings".into(),
        json!(!file.has_tensor("output.weight")),
    );
    for (gguf_key, hf_key) in [
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
    ] {
        if file.get(gguf_key).is_some() {
            c.insert(hf_key.into(), json!(file.get_u32(gguf_key)?));
        }
    }
    // Qwen2 always has Q/K/V biases; for the others the tensors tell.
    let bias = arch == "qwen2" || file.has_tensor("blk.0.attn_q.bias");
    c.insert("attention_bias".into(), json!(bias));
    c.insert("torch_dtype".into(), json!("float32"));
    Ok(Value::Object(c))
}

/// `rope_scaling` as transformers writes it, from `{arch}.rope.scaling.*`; null when none.
fn rope_scaling(file: &GgufFile, arch: &str) -> Result<Value> {
    let key = |k: &str| format!("{arch}.rope.scaling.{k}");
    let kind = match file.get(&key("type")) {
        Some(_) => file.get_str(&key("type"))?,
        None if file.has_tensor("rope_freqs.weight") => return llama3_rope_scaling(file, arch),
        None => return Ok(Value::Null),
    };
    let factor = || file.get_f32(&key("factor")).map(json_f32);
    Ok(match kind {
        "none" => Value::Null,
        "linear" => json!({"rope_type": "linear", "type": "linear", "factor": factor()?}),
        "yarn" => json!({
            "rope_type": "yarn",
            "type": "yarn",
            "factor": factor()?,
            "original_max_position_embeddings": file.get_u32(&key("original_context_length"))?,
        }),
        other => bail!(
            "{}: metadata {} is {other:?}; sinter converts rope scaling none, linear and yarn",
            file.path().display(),
            key("type")
        ),
    })
}

/// Llama 3.1's `rope_scaling` recovered from the `rope_freqs.weight` tensor llama.cpp writes
/// instead of it: one divisor per rotary frequency, 1 for short wavelengths (below
/// original / high_freq_factor), `factor` for long ones (above original / low_freq_factor) and
/// 1 / ((1 − s)/factor + s) between, with s linear in 1/wavelength. The band's divisors give
/// that line, hence low and high_freq_factor for a chosen `original_max_position_embeddings`
/// (any choice gives the same frequencies: the rule only depends on their ratios; this takes
/// `rope.scaling.original_context_length` if written, else the one that makes
/// low_freq_factor 1, as in every Llama 3 release). The result is checked to reproduce every
/// divisor.
fn llama3_rope_scaling(file: &GgufFile, arch: &str) -> Result<Value> {
    let fail = |why: String| {
        Error::Msg(format!(
            "{}: rope_freqs.weight {why}, so it cannot be read as a Llama 3 rope_scaling",
            file.path().display()
        ))
    };
    let divisors: Vec<f64> = file
        .tensor("rope_freqs.weight")?
        .to_vec_f32()?
        .into_iter()
        .map(f64::from)
        .collect();
    let factor = divisors.iter().copied().fold(f64::NAN, f64::max);
    let valid = |r: &f64| r.is_finite() && *r >= 1.0 - 1e-6;
    if divisors.is_empty() || !divisors.iter().all(valid) {
        return Err(fail(format!(
            "holds divisors that are not all finite and at least 1 (largest {factor})"
        )));
    }
    if factor <= 1.0 + 1e-6 {
        return Ok(Value::Null);
    }
    let theta = match file.get(&format!("{arch}.rope.freq_base")) {
        Some(_) => file.get_f32(&format!("{arch}.rope.freq_base"))? as f64,
        None => 10000.0,
    };
    let n = divisors.len() as f64;
    let inv_wavelength = |i: usize| theta.powf(-(i as f64) / n) / (2.0 * std::f64::consts::PI);
    // In the band: s = A·(1/wavelength) + B, from divisor r as s = (factor/r − 1)/(factor − 1).
    let band: Vec<(f64, f64)> = divisors
        .iter()
        .enumerate()
        .filter(|(_, r)| **r > 1.0 + 1e-4 && **r < factor * (1.0 - 1e-4))
        .map(|(i, r)| (inv_wavelength(i), (factor / r - 1.0) / (factor - 1.0)))
        .collect();
    if band.len() < 2 {
        return Err(fail(format!(
            "has {} divisors between 1 and its largest, {factor}; at least 2 fix the smooth band",
            band.len()
        )));
    }
    let (a, b) = least_squares_line(&band);
    // s = original/(wavelength·(high − low)) − low/(high − low), so low = 1 (every Llama 3
    // release's low_freq_factor) means original = −a/b.
    let original = match file.get(&format!("{arch}.rope.scaling.original_context_length")) {
        Some(_) => file.get_u32(&format!("{arch}.rope.scaling.original_context_length"))? as f64,
        None => (-a / b).round(),
    };
    if !original.is_finite() || original < 1.0 {
        return Err(fail(format!(
            "gives no positive original context length (fitted line {a}·x + {b})"
        )));
    }
    let round = |x: f64| (x * 1e3).round() / 1e3;
    let low = round(-b * original / a);
    let high = round(low + original / a);
    let factor = round(factor);
    for (i, r) in divisors.iter().enumerate() {
        let ratio = original * inv_wavelength(i);
        let expected = if ratio > high {
            1.0
        } else if ratio < low {
            factor
        } else {
            let s = (ratio - low) / (high - low);
            1.0 / ((1.0 - s) / factor + s)
        };
        if (expected - r).abs() > 1e-3 * r {
            return Err(fail(format!(
                "divisor {i} is {r}, where the Llama 3 rule fitted to the others (factor {factor}, low_freq_factor {low}, high_freq_factor {high}) gives {expected}"
            )));
        }
    }
    Ok(json!({
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": original as u64,
    }))
}

/// The line y = a·x + b closest to `points` (x, y) in least squares.
fn least_squares_line(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (mx, my) = (sx / n, sy / n);
    let (sxy, sxx) = points.iter().fold((0.0, 0.0), |(sxy, sxx), (x, y)| {
        (sxy + (x - mx) * (y - my), sxx + (x - mx) * (x - mx))
    });
    let a = sxy / sxx;
    (a, my - a * mx)
}
