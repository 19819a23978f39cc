//! LoRA runs of a pretrained model: the adapters installed on the loaded model (its base
//! frozen), and adapters in PEFT's format — `adapter_model.safetensors` with PEFT's tensor
//! names and `adapter_config.json` — written at the end of a run and read back by
//! `generate --adapter`, `serve --adapter` and `sinter merge`.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use sinter_core::{DType, Device, Rng, Tensor};
use sinter_models::Decoder;
use sinter_nn::lora::{self, LoraConfig, Segment};

use crate::config::LoraSettings;
use sinter_nn::SharedRng;

pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";
pub const CONFIG_FILE: &str = "adapter_config.json";

/// Installs fresh adapters on `model` (A drawn from `seed`). Returns the adapted
/// projections' short names.
pub fn install_adapters(
    model: &Decoder,
    s: &LoraSettings,
    seed: u64,
    drop_rng: &SharedRng,
) -> Result<Vec<String>> {
    s.check()?;
    let re = regex::Regex::new(&s.targets)?;
    let blocks: Vec<&sinter_nn::TransformerBlock> = model.blocks.iter().map(|b| &**b).collect();
    let wanted = |n: &str| re.is_match(n);
    let mut rng = Rng::new(seed ^ 0x10_7a);
    let short = lora::install(&blocks, &wanted, &s.config(), &mut rng, drop_rng)
        .map_err(|e| anyhow!("--lora-targets '{}': {e}", s.targets))?;
    Ok(short)
}

/// [`install_adapters`], and everything else frozen (a run that trains them).
pub fn install(
    model: &Decoder,
    s: &LoraSettings,
    seed: u64,
    drop_rng: &SharedRng,
) -> Result<Vec<String>> {
    let short = install_adapters(model, s, seed, drop_rng)?;
    lora::freeze_base(model);
    Ok(short)
}

/// QLoRA: every projection of every block kept quantized as `base` says — int8 per output
/// channel (`lora::FrozenInt8`) or GGML blocks (`lora::FrozenGgml`: q8_0, q4_0, q4_1, q4_k)
/// — a frozen form that passes gradients to its input, and its f32 weight released.
/// Returns how many layers were quantized.
pub fn quantize_base(model: &mut Decoder, base: &str) -> Result<usize> {
    let ggml = match base {
        "int8" => None,
        name => Some(ggml_type_of(name)?),
    };
    let mut n = 0;
    for (i, b) in model.blocks.iter_mut().enumerate() {
        let blk = std::sync::Arc::get_mut(b)
            .context("QLoRA: the model's blocks are shared; quantize its base before using it")?;
        for (what, l) in [
            ("attn.qkv", &mut blk.attn.qkv),
            ("attn.proj", &mut blk.attn.proj),
            ("mlp.fc", &mut blk.mlp.fc),
            ("mlp.proj", &mut blk.mlp.proj),
        ] {
            let form: std::sync::Arc<dyn sinter_nn::quant::slot::Int8Layer> = match ggml {
                None => {
                    std::sync::Arc::new(lora::FrozenInt8::from_f32(&l.weight, l.bias.as_ref())?)
                }
                Some(ty) => std::sync::Arc::new(
                    lora::FrozenGgml::from_f32(&l.weight, l.bias.as_ref(), ty)
                        .with_context(|| format!("--lora-base {base}: block {i} {what}"))?,
                ),
            };
            l.quant.set(sinter_nn::quant::QuantState::Int8(form));
            l.weight = sinter_models::gguf::placeholder(l.weight.shape())?;
            n += 1;
        }
    }
    Ok(n)
}

/// `--lora-base gguf`: the blocks a GGUF file was loaded with (`GgufWeights::Quantized`)
/// become the frozen base that passes gradients. Returns how many layers hold them; none is
/// an error (the file keeps its matrices in f32/f16: nothing to save).
pub fn keep_gguf_base(model: &Decoder, path: &std::path::Path) -> Result<usize> {
    let n = sinter_nn::quant::layers(model)
        .iter()
        .filter(|(_, h)| lora::freeze_ggml_slot(&h.slot))
        .count();
    if n == 0 {
        anyhow::bail!(
            "--lora-base gguf: {} keeps no matrix in a quantized format sinter runs (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K); quantize the base at load instead (--lora-base q4_0, q4_k, ...)",
            path.display()
        );
    }
    Ok(n)
}

fn ggml_type_of(name: &str) -> Result<sinter_nn::quant::GgmlType> {
    use sinter_nn::quant::GgmlType;
    Ok(match name {
        "q8_0" => GgmlType::Q8_0,
        "q4_0" => GgmlType::Q4_0,
        "q4_1" => GgmlType::Q4_1,
        "q4_k" => GgmlType::Q4_K,
        other => anyhow::bail!("--lora-base {other}: not a GGML format sinter quantizes a base to"),
    })
}

/// PEFT's name of a projection's factor: `base_model.model.model.layers.N.<proj>.lora_A.weight`.
fn peft_name(module: &str, factor: &str) -> String {
    format!("base_model.model.{module}.lora_{factor}.weight")
}

/// Every installed adapter segment as (HF module name, short name, segment).
fn segments(model: &Decoder) -> Vec<(String, &'static str, Segment)> {
    let mut out = Vec::new();
    for (i, b) in model.blocks.iter().enumerate() {
        for p in lora::projections(b) {
            let Some(a) = p.layer.lora.get() else {
                continue;
            };
            if let Some(seg) = a.segments.iter().find(|s| s.name == p.short()) {
                out.push((lora::module_name(i, &p), p.short(), seg.clone()));
            }
        }
    }
    out
}

/// Writes the model's adapters to `dir` in PEFT's format; `base` is what
/// `base_model_name_or_path` records.
pub fn export_peft(model: &Decoder, s: &LoraSettings, base: &str, dir: &Path) -> Result<()> {
    let segs = segments(model);
    if segs.is_empty() {
        bail!("the model carries no LoRA adapter to export");
    }
    let mut targets: Vec<&str> = segs.iter().map(|(_, short, _)| *short).collect();
    targets.dedup();
    targets.sort();
    targets.dedup();
    let mut tensors = Vec::new();
    for (module, _, seg) in &segs {
        tensors.push((peft_name(module, "A"), seg.a.to_dtype(DType::F32)?));
        tensors.push((peft_name(module, "B"), seg.b.to_dtype(DType::F32)?));
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let bytes = serialize(&tensors)?;
    crate::checkpoint::write_atomic(&dir.join(WEIGHTS_FILE), &bytes)?;
    let config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": s.rank,
        "lora_alpha": s.alpha,
        "lora_dropout": s.dropout,
        "target_modules": targets,
        "base_model_name_or_path": base,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "modules_to_save": null,
        "init_lora_weights": true,
        "use_rslora": false,
        "use_dora": false,
    });
    crate::checkpoint::write_atomic(
        &dir.join(CONFIG_FILE),
        serde_json::to_string_pretty(&config)?.as_bytes(),
    )
}

fn serialize(tensors: &[(String, Tensor)]) -> Result<Vec<u8>> {
    let owned: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, t)| Ok((n.clone(), t.shape().to_vec(), t.to_le_bytes()?)))
        .collect::<Result<_>>()?;
    let views = owned
        .iter()
        .map(|(n, s, b)| {
            let v = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                .map_err(|e| anyhow!("tensor {n}: {e}"))?;
            Ok((n.clone(), v))
        })
        .collect::<Result<Vec<_>>>()?;
    let md = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize(views, &Some(md))
        .map_err(|e| anyhow!("cannot serialise the adapter: {e}"))
}

/// What `adapter_config.json` says, checked.
struct PeftConfig {
    rank: usize,
    alpha: f64,
    targets: Vec<String>,
}

fn read_config(dir: &Path) -> Result<PeftConfig> {
    let path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!("cannot read {} (a PEFT adapter directory holds {CONFIG_FILE} and {WEIGHTS_FILE}; give the directory `sinter train --lora-rank` or peft's save_pretrained wrote)", path.display())
    })?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let what = |k: &str| format!("{}: {k}", path.display());
    let peft_type = v["peft_type"].as_str().unwrap_or("");
    if peft_type != "LORA" {
        bail!(
            "{}: peft_type is '{peft_type}', not LORA; only LoRA adapters load here",
            path.display()
        );
    }
    let rank = v["r"]
        .as_u64()
        .filter(|&r| r > 0)
        .ok_or_else(|| anyhow!("{} must be a positive integer", what("r")))?
        as usize;
    let alpha = v["lora_alpha"]
        .as_f64()
        .filter(|a| *a > 0.0)
        .ok_or_else(|| anyhow!("{} must be a positive number", what("lora_alpha")))?;
    for flag in ["use_dora", "use_rslora"] {
        if v[flag].as_bool() == Some(true) {
            bail!(
                "{}: {flag} is set; only plain LoRA adapters load here",
                path.display()
            );
        }
    }
    if v["fan_in_fan_out"].as_bool() == Some(true) {
        bail!(
            "{}: fan_in_fan_out is set (GPT-2 Conv1D layout); Llama-family adapters have it off",
            path.display()
        );
    }
    let targets: Vec<String> = match &v["target_modules"] {
        Value::Array(a) => a
            .iter()
            .filter_map(|t| t.as_str().map(String::from))
            .collect(),
        Value::String(s) => vec![s.clone()],
        _ => bail!("{} must be a list of module names", what("target_modules")),
    };
    Ok(PeftConfig {
        rank,
        alpha,
        targets,
    })
}

/// Reads a PEFT LoRA adapter from `dir` and installs it on `model` (unmerged: the base
/// is untouched). Every problem is an error naming the file and tensor.
pub fn load_peft(model: &Decoder, dir: &Path) -> Result<()> {
    let cfg = read_config(dir)?;
    let path = dir.join(WEIGHTS_FILE);
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow!("{} is not a safetensors file: {e}", path.display()))?;
    let mut left: HashMap<String, ()> = st
        .names()
        .into_iter()
        .map(|n| (n.to_string(), ()))
        .collect();
    let read = |name: &str| -> Result<Option<Tensor>> {
        let Ok(v) = st.tensor(name) else {
            return Ok(None);
        };
        let dt = match v.dtype() {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::F16 => DType::F16,
            safetensors::Dtype::BF16 => DType::BF16,
            d => bail!(
                "{}: tensor {name} is {d:?}, not a float type",
                path.display()
            ),
        };
        let t =
            Tensor::from_le_bytes(v.data(), dt, v.shape(), Device::Cpu)?.to_dtype(DType::F32)?;
        Ok(Some(t))
    };
    let lcfg = LoraConfig {
        rank: cfg.rank,
        alpha: cfg.alpha,
        dropout: 0.0,
    };
    let drop_rng = sinter_nn::module::shared_rng(0);
    for (i, b) in model.blocks.iter().enumerate() {
        let mut per_layer: Vec<(&sinter_nn::Linear, Vec<Segment>)> = Vec::new();
        for p in lora::projections(b) {
            let module = lora::module_name(i, &p);
            let (an, bn) = (peft_name(&module, "A"), peft_name(&module, "B"));
            let (a, bt) = match (read(&an)?, read(&bn)?) {
                (None, None) => continue,
                (Some(a), Some(bt)) => (a, bt),
                (Some(_), None) => bail!(
                    "{}: {an} has no {bn}; the file is incomplete",
                    path.display()
                ),
                (None, Some(_)) => bail!(
                    "{}: {bn} has no {an}; the file is incomplete",
                    path.display()
                ),
            };
            left.remove(&an);
            left.remove(&bn);
            let dev = p.layer.weight.device();
            let (a, bt) = (a.to_device(dev)?, bt.to_device(dev)?);
            let inp = p.layer.in_features();
            if a.shape() != [cfg.rank, inp] || bt.shape() != [p.rows.len(), cfg.rank] {
                bail!(
                    "{}: {an} is {:?} and {bn} {:?}, but this model's {} needs [{}, {inp}] and [{}, {}] (r = {} in {CONFIG_FILE}); the adapter was trained on another base model or rank",
                    path.display(), a.shape(), bt.shape(), p.short(), cfg.rank, p.rows.len(), cfg.rank, cfg.rank
                );
            }
            if !cfg
                .targets
                .iter()
                .any(|t| t == p.short() || module.ends_with(t.as_str()))
            {
                bail!(
                    "{}: {an} adapts {}, which target_modules {:?} of {CONFIG_FILE} does not name",
                    path.display(),
                    p.short(),
                    cfg.targets
                );
            }
            let seg = Segment::new(p.short(), p.rows.clone(), a, bt)?;
            match per_layer
                .iter_mut()
                .find(|(l, _)| std::ptr::eq(*l, p.layer))
            {
                Some((_, segs)) => segs.push(seg),
                None => per_layer.push((p.layer, vec![seg])),
            }
        }
        for (layer, segs) in per_layer {
            lora::targets::attach(layer, segs, &lcfg, &drop_rng)?;
        }
    }
    if let Some(name) = left.keys().next() {
        bail!(
            "{}: tensor {name} is not a LoRA factor of this {}-layer model's projections (expected base_model.model.model.layers.N.<self_attn|mlp>.<proj>.lora_<A|B>.weight); the adapter is for another model, or targets a module not supported here",
            path.display(),
            model.blocks.len()
        );
    }
    if segments(model).is_empty() {
        bail!("{}: holds no LoRA factors", path.display());
    }
    Ok(())
}

/// Folds every installed adapter into its layer's weight (W += scale·B·A) and removes it, so
/// the model runs (and exports) as a plain model. Returns how many layers were merged.
pub fn merge(model: &Decoder) -> Result<usize> {
    let mut n = 0;
    for b in &model.blocks {
        for l in [&b.attn.qkv, &b.attn.proj, &b.mlp.fc, &b.mlp.proj] {
            // A quantized layer keeps its adapter on top (its f32 weight is not there).
            if l.quant.int8().is_some() {
                continue;
            }
            if let Some(a) = l.lora.get() {
                l.weight.assign(&a.merged(&l.weight)?)?;
                l.lora.set(None);
                n += 1;
            }
        }
    }
    Ok(n)
}

/// A LoRA run's checkpoint as a plain model: adapters installed on `model` (its pretrained
/// base) as the run installed them, their values read from the checkpoint's `loaded`
/// tensors, then folded into the base weights (`export` writes what a user runs; a QLoRA
/// run's adapters go onto the f32 base, as PEFT merges them).
pub fn restore_merged(
    model: &Decoder,
    s: &LoraSettings,
    seed: u64,
    loaded: &HashMap<String, Tensor>,
) -> Result<usize> {
    // Not frozen: the base stays a parameter, which is what the HF writer saves.
    install_adapters(model, s, seed, &sinter_nn::module::shared_rng(0))?;
    let adapters: Vec<(String, Tensor)> = sinter_nn::Module::named_tensors(model)
        .into_iter()
        .filter(|t| lora::is_adapter_name(&t.name))
        .map(|t| (t.name, t.tensor))
        .collect();
    crate::checkpoint::restore_model(loaded, &adapters)?;
    merge(model)
}

/// `--adapter DIR` of generate and serve: the adapter (if given) read and merged into
/// `model` (wherever its weights live; a quantized layer keeps it unmerged).
pub fn apply_adapter_opt(model: &Decoder, dir: Option<&Path>) -> Result<()> {
    let Some(dir) = dir else { return Ok(()) };
    load_peft(model, dir).with_context(|| format!("loading the adapter {}", dir.display()))?;
    merge(model)?;
    Ok(())
}

/// Where a finished run writes its adapters: OUT/adapter, and `--export-adapter DIR`
/// (nothing for a run without LoRA).
pub fn export_dirs(
    s: &super::Setup,
    out: Option<&Path>,
    extra: Option<&Path>,
) -> Vec<std::path::PathBuf> {
    if s.config.lora.is_none() {
        return Vec::new();
    }
    out.map(|d| d.join("adapter"))
        .into_iter()
        .chain(extra.map(Path::to_path_buf))
        .collect()
}

/// Writes the run's adapters to `dir` in PEFT's format.
pub fn export_run(s: &super::Setup, dir: &Path) -> Result<()> {
    let l = s.config.lora.as_ref().context("not a LoRA run")?;
    let model = gpt_of(s.model.as_ref())?;
    export_peft(model, l, &s.config.model, dir)
        .with_context(|| format!("writing the adapter to {}", dir.display()))
}

/// The GPT inside a run's model (LoRA runs are pretrained Llama-family models).
pub fn gpt_of(m: &dyn sinter_models::Model) -> Result<&Decoder> {
    m.as_any()
        .and_then(|a| a.downcast_ref::<Decoder>())
        .context("LoRA adapters are for GPT-style (Llama-family) models")
}
