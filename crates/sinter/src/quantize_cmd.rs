//! `sinter quantize`: a trained checkpoint → an int8 inference checkpoint, and the loader that
//! lets `eval`, `generate`, `predict` and the server open one like any checkpoint (through
//! `inference::load_model` / `load_for_eval`).
//!
//! The file is safetensors with metadata `format = "sinter-quantized-1"` (the marker the loader
//! looks for; `-2` when a layer has a second int8 plane, so that binaries from before planes
//! refuse the file rather than read half of it), the training `config`, `inference` (the `InferenceInfo` that rebuilds the model
//! from the checkpoint alone), `step`, `source` and a `quantization` summary. Tensors are named as in a training checkpoint
//! (`model.<name>`), except that the weight of each int8 layer becomes `model.<layer>.weight.q`
//! (i8, the weight's shape) and `model.<layer>.weight.scale` (f32 [out]), plus, for a Conv2d,
//! its calibrated input mapping `model.<layer>.input.scale` (f32 [1]) and
//! `model.<layer>.input.zero_point` (i32 [1]), and, for a weight with a second plane (an
//! embedding table, a Linear under `--two-planes`), `model.<layer>.weight.q2` and
//! `model.<layer>.weight.scale2` — see
//! `sinter_nn::quant::state`. There is no
//! optimizer state: the file is for inference only.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use safetensors::tensor::{Dtype, SafeTensors};
use sinter_core::{no_grad, Tensor};
use sinter_data::DataLoader;
use sinter_nn::quant::{self, QuantizeOptions, QuantizeReport, Rounding, StateTensor, TablePlanes};
use sinter_nn::Module;

use crate::checkpoint::InferenceInfo;
use crate::checkpoint::{self, our_dtype, st_dtype};
use crate::config::TrainConfig;
use crate::inference::{self, Inference};
use crate::trainer::{self, setup, Setup};

/// The format marker of an int8 checkpoint whose weights have one int8 plane each.
pub const FORMAT: &str = "sinter-quantized-1";
/// The marker of one with second planes (`.q2`, `.scale2`). A binary from before second
/// planes looks for `FORMAT` only, so it refuses such a file instead of silently reading
/// its first planes alone. This binary reads both.
pub const FORMAT_PLANES: &str = "sinter-quantized-2";
const FORMAT_FAMILY: &str = "sinter-quantized-";

#[derive(Args)]
pub struct QuantizeArgs {
    /// Run directory (or checkpoint file) of the trained f32 model.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Directory for the int8 checkpoint (written as checkpoint.safetensors); never the
    /// --checkpoint's own directory (the f32 run could no longer resume).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace a checkpoint already in --out [default: refuse].
    #[arg(long)]
    pub overwrite: bool,
    /// Training batches run through the f32 model to calibrate each convolution's input range
    /// and, with `--rounding gptq`, the Gram matrix of each Linear's inputs.
    #[arg(long, default_value_t = 16)]
    pub calibration_batches: usize,
    #[command(flatten)]
    pub choices: QuantizeChoices,
}

/// How layers are quantized: the options `sinter quantize` and `sinter bench int8` share.
#[derive(Args, Clone)]
pub struct QuantizeChoices {
    /// How Linear and embedding weights get their int8 values: `gptq` (error feedback from
    /// the calibration batches' inputs, minimising each layer's output error) or `nearest`.
    #[arg(long, value_enum, default_value_t = WeightRounding::Gptq)]
    pub rounding: WeightRounding,
    /// Layers to leave in f32, comma-separated: a layer's name (`wte`: for GPT the tied
    /// embedding and output head) or a prefix ending at a dot (`blocks.0`: all of block 0).
    #[arg(long, value_delimiter = ',')]
    pub keep_f32: Vec<String>,
    /// Int8 planes per embedding table: `2` (a second plane with the first's rounding error;
    /// a tied output head rescores its top outputs from both), `1` (the smallest file), or
    /// `auto` (two for tables of at least 256 Ki entries, such as GPT-2's; one for smaller).
    #[arg(long, value_enum, default_value_t = Planes::Auto)]
    pub table_planes: Planes,
    /// Linear layers to give a second int8 plane with the first's rounding error (names or
    /// prefixes, as --keep-f32): ~16-bit weights for a second int8 GEMM, half of f32's bytes.
    #[arg(long, value_delimiter = ',')]
    pub two_planes: Vec<String>,
}

/// `--table-planes`: `sinter_nn::quant::TablePlanes` on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Planes {
    #[value(name = "1")]
    One,
    #[value(name = "2")]
    Two,
    Auto,
}

/// `--rounding`: `sinter_nn::quant::Rounding` on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightRounding {
    Nearest,
    Gptq,
}

impl QuantizeChoices {
    pub fn options(&self) -> QuantizeOptions {
        QuantizeOptions {
            keep_f32: self.keep_f32.clone(),
            rounding: match self.rounding {
                WeightRounding::Nearest => Rounding::Nearest,
                WeightRounding::Gptq => Rounding::ErrorFeedback,
            },
            table_planes: match self.table_planes {
                Planes::One => TablePlanes::One,
                Planes::Two => TablePlanes::Two,
                Planes::Auto => TablePlanes::Auto,
            },
            two_planes: self.two_planes.clone(),
        }
    }
}

/// Refuses an `--out` whose checkpoint would be lost: the source's own file (always), or
/// another checkpoint unless `--overwrite`.
fn check_out(a: &QuantizeArgs) -> Result<()> {
    let target = checkpoint::path_in(&a.out);
    let source = checkpoint::file_of(&a.checkpoint);
    let same = |x: &Path, y: &Path| match (x.canonicalize(), y.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    };
    if same(&target, &source) {
        bail!("--out {} is where the checkpoint being quantized lives: the int8 file would replace the f32 training checkpoint, and the run could no longer resume. Give another directory, e.g. --out {}-int8", a.out.display(), a.out.display().to_string().trim_end_matches('/'));
    }
    if target.exists() && !a.overwrite {
        bail!("--out {} already holds a checkpoint ({}); quantizing would replace it. Add --overwrite to replace it, or choose another --out", a.out.display(), target.display());
    }
    Ok(())
}

pub fn run(a: &QuantizeArgs) -> Result<()> {
    if is_quantized(&checkpoint::file_of(&a.checkpoint))? {
        bail!(
            "{} is already an int8 checkpoint; quantize the f32 checkpoint it came from",
            a.checkpoint.display()
        );
    }
    let (s, step) = inference::load_for_eval(&a.checkpoint)?;
    // Before the slow part, so that a refused --out costs no quantizing.
    check_out(a)?;
    let options = a.choices.options();
    let Quantized {
        report,
        folded,
        calibration_batches,
    } = quantize_setup(&s, a.calibration_batches, &options)?;
    let path = save(&a.out, &s, step, &report, &a.checkpoint)?;
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "{}: {} layers int8 ({} linear, {} conv2d, {} embedding{}{}){}{}",
        s.config.model,
        report.int8.len(),
        count(&report, "linear"),
        count(&report, "conv2d"),
        count(&report, "embedding"),
        if folded > 0 {
            format!("; {folded} BatchNorm to fold into their int8 convolutions at load")
        } else {
            String::new()
        },
        if report.error_feedback.is_empty() {
            String::new()
        } else {
            format!(
                "; {} rounded with GPTQ from {calibration_batches} calibration batches",
                report.error_feedback.len(),
            )
        },
        if report.kept_f32.is_empty() {
            String::new()
        } else {
            format!(
                "; kept in f32: {}",
                report
                    .kept_f32
                    .iter()
                    .map(|(n, why)| format!("{n} ({why})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
        if report.two_planes.is_empty() {
            String::new()
        } else {
            format!("; two int8 planes: {}", report.two_planes.join(", "))
        }
    );
    if calibration_batches > 0 && calibration_batches < a.calibration_batches {
        println!("calibrated on all {calibration_batches} training batches of {} (--calibration-batches {} asked for more than there are)", s.config.data, a.calibration_batches);
    }
    let f32_weights = weight_bytes(s.model.as_ref());
    println!(
        "wrote {} ({:.2} MB; the f32 weights are {:.2} MB: {:.2}× smaller)",
        path.display(),
        size as f64 / 1e6,
        f32_weights as f64 / 1e6,
        f32_weights as f64 / size.max(1) as f64
    );
    Ok(())
}

fn count(r: &QuantizeReport, kind: &str) -> usize {
    r.int8.iter().filter(|(_, k)| *k == kind).count()
}

/// Bytes of a model's tensors in f32 (what a weights-only f32 file would hold).
pub fn weight_bytes(model: &dyn Module) -> usize {
    model
        .named_tensors()
        .iter()
        .map(|t| 4 * t.tensor.numel())
        .sum()
}

/// What [`quantize_setup`] did.
pub struct Quantized {
    pub report: QuantizeReport,
    /// BatchNorm layers folded into their int8 convolutions.
    pub folded: usize,
    /// Calibration batches run (at most the training data's; 0 when none was needed).
    pub calibration_batches: usize,
}

/// Quantizes the setup's model in place; convolutions (and, for GPTQ rounding, Linear and
/// embedding layers) are calibrated on the first `batches` training batches (in order, so the
/// result is reproducible; all of them when there are fewer). Then folds each BatchNorm into
/// the int8 convolution before it, as `eval` and `predict` do after loading.
pub fn quantize_setup(s: &Setup, batches: usize, options: &QuantizeOptions) -> Result<Quantized> {
    let mut used = 0;
    let mut calibrate = |model: &dyn Module| -> sinter_core::Result<()> {
        if batches == 0 {
            return Err(sinter_core::Error::Msg(
                "the model has convolutions or is rounded with GPTQ: --calibration-batches must be at least 1 (or use --rounding nearest for a model without convolutions)".into(),
            ));
        }
        let _g = no_grad();
        model.set_training(false);
        let mut loader =
            DataLoader::new(s.train.clone(), s.config.batch_size.max(1), false, false, 0);
        let n = batches.min(loader.batches_per_epoch() as usize).max(1);
        used = n;
        for _ in 0..n {
            let b = loader
                .next_batch()
                .map_err(|e| sinter_core::Error::Msg(format!("calibration data: {e}")))?;
            let x =
                trainer::to_tensor(b.inputs).map_err(|e| sinter_core::Error::Msg(e.to_string()))?;
            model.forward(&x)?;
        }
        Ok(())
    };
    let report = quant::quantize_with(s.model.as_ref(), options, &mut calibrate)?;
    let folded = sinter_nn::fold::fold_for_inference(s.model.as_ref())?;
    Ok(Quantized {
        report,
        folded,
        calibration_batches: used,
    })
}

/// Writes the quantized model of `s` to `dir`/checkpoint.safetensors, atomically.
pub fn save(
    dir: &Path,
    s: &Setup,
    step: u64,
    report: &QuantizeReport,
    source: &Path,
) -> Result<PathBuf> {
    let state = quant::export(s.model.as_ref())?;
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::with_capacity(state.len());
    for (name, t) in state {
        let name = format!("model.{name}");
        owned.push(match t {
            StateTensor::Float(t) => (
                name,
                st_dtype(t.dtype()),
                t.shape().to_vec(),
                t.to_le_bytes()?,
            ),
            StateTensor::I8 { values, shape } => (
                name,
                Dtype::I8,
                shape,
                values.iter().map(|&v| v as u8).collect(),
            ),
            StateTensor::I32 { values, shape } => (
                name,
                Dtype::I32,
                shape,
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
        });
    }
    let summary = serde_json::json!({
        "weights": "int8, symmetric, one scale per output channel (per row for embedding tables); the layers under two_planes add a second int8 plane with the first's rounding error",
        "rounding": {
            "error_feedback": report.error_feedback,
            "method": "GPTQ error feedback from calibration inputs for the layers listed, to nearest for the others",
        },
        "activations": {
            "linear": "u8, dynamic, one scale and zero point per row (at run time, in two terms: the second carries the first's rounding error)",
            "conv2d": "u8, static, one scale and zero point per layer from calibration (min/max)",
        },
        "layers": report.int8.iter().map(|(n, k)| (n.clone(), *k)).collect::<BTreeMap<_, _>>(),
        "kept_f32": report.kept_f32.iter().cloned().collect::<BTreeMap<_, _>>(),
        "two_planes": report.two_planes,
    });
    let planes = owned.iter().any(|(name, ..)| name.ends_with(".q2"));
    let mut md = BTreeMap::new();
    let format = if planes { FORMAT_PLANES } else { FORMAT };
    md.insert("format".to_string(), format.to_string());
    md.insert("config".into(), serde_json::to_string(&s.config)?);
    md.insert("step".into(), step.to_string());
    md.insert("source".into(), source.display().to_string());
    md.insert("quantization".into(), summary.to_string());
    md.insert(
        "inference".into(),
        serde_json::to_string(&inference::info_of(s))?,
    );
    // checkpoint's writer: sorted keys and a fixed tensor order, so quantizing the same
    // checkpoint twice gives the same bytes.
    let bytes = checkpoint::serialize(owned, &md)
        .map_err(|e| anyhow!("cannot serialise the int8 checkpoint: {e}"))?;
    let path = checkpoint::path_in(dir);
    checkpoint::write_atomic(&path, &bytes)?;
    Ok(path)
}

/// Whether the safetensors file at `path` carries the int8 format marker (reads its header
/// only). A file that cannot be read is "not quantized": the regular loader reports it.
fn is_quantized(path: &Path) -> Result<bool> {
    let Ok(mut f) = std::fs::File::open(path) else {
        return Ok(false);
    };
    let mut len = [0u8; 8];
    if f.read_exact(&mut len).is_err() {
        return Ok(false);
    }
    let n = u64::from_le_bytes(len);
    if n > 100_000_000 {
        return Ok(false);
    }
    let mut header = vec![0u8; n as usize];
    if f.read_exact(&mut header).is_err() {
        return Ok(false);
    }
    let Ok(h) = serde_json::from_slice::<serde_json::Value>(&header) else {
        return Ok(false);
    };
    match h["__metadata__"]["format"].as_str() {
        Some(FORMAT | FORMAT_PLANES) => Ok(true),
        Some(f) if f.starts_with(FORMAT_FAMILY) => bail!(
            "{} is an int8 checkpoint of format '{f}', newer than this sinter reads ({FORMAT}, {FORMAT_PLANES}): run it with a newer sinter, or quantize the f32 checkpoint again with this one",
            path.display()
        ),
        _ => Ok(false),
    }
}

/// An int8 checkpoint read back: its config, step, inference information (None in files
/// written before it was saved) and tensors by name (without the `model.` prefix).
struct QuantizedFile {
    path: PathBuf,
    config: TrainConfig,
    step: u64,
    inference: Option<InferenceInfo>,
    tensors: HashMap<String, StateTensor>,
}

impl QuantizedFile {
    /// Installs the file's tensors (int8 forms included) into a freshly built `model`.
    fn install(&self, model: &dyn Module) -> Result<()> {
        quant::import(model, &self.tensors)
            .with_context(|| format!("loading the int8 checkpoint {}", self.path.display()))?;
        model.set_training(false);
        Ok(())
    }
}

/// `inference::load_model`'s hook: Some when `path` holds an int8 checkpoint, the model
/// rebuilt from the checkpoint alone with its int8 layers installed.
pub fn load_model_if_quantized(path: &Path) -> Result<Option<Inference>> {
    let Some(q) = read_if_quantized(path)? else {
        return Ok(None);
    };
    let info = match &q.inference {
        Some(i) => i.clone(),
        None => inference::info_of(&setup(q.config.clone())?),
    };
    let model = inference::build_model(&info)?;
    q.install(model.as_ref())?;
    Ok(Some(Inference {
        config: q.config,
        info,
        model,
    }))
}

/// `inference::load_for_eval`'s hook: Some(setup with its data, step) for an int8 checkpoint.
pub fn load_for_eval_if_quantized(path: &Path) -> Result<Option<(Setup, u64)>> {
    let Some(q) = read_if_quantized(path)? else {
        return Ok(None);
    };
    let s = setup(q.config.clone())?;
    q.install(s.model.as_ref())?;
    Ok(Some((s, q.step)))
}

/// Reads `path` (a run directory or the file) if it is an int8 checkpoint. Every error names
/// the file.
fn read_if_quantized(dir: &Path) -> Result<Option<QuantizedFile>> {
    let path = checkpoint::file_of(dir);
    if !is_quantized(&path)? {
        return Ok(None);
    }
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    parse(&bytes)
        .with_context(|| format!("int8 checkpoint {}", path.display()))
        .map(|(config, step, inference, tensors)| {
            Some(QuantizedFile {
                path,
                config,
                step,
                inference,
                tensors,
            })
        })
}

type Parsed = (
    TrainConfig,
    u64,
    Option<InferenceInfo>,
    HashMap<String, StateTensor>,
);

fn parse(bytes: &[u8]) -> Result<Parsed> {
    let corrupt = |e: safetensors::SafeTensorError| anyhow!("is corrupt or truncated: {e}");
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(corrupt)?;
    let st = SafeTensors::deserialize(bytes).map_err(corrupt)?;
    let md = header.metadata().clone().unwrap_or_default();
    checkpoint::verify_checksum(bytes, &md)?;
    let (step, config, inference) = checkpoint::parse_model_meta(&md)?;
    let mut tensors = HashMap::new();
    for (name, view) in st.tensors() {
        let Some(bare) = name.strip_prefix("model.") else {
            continue;
        };
        let shape = view.shape().to_vec();
        let t = match view.dtype() {
            Dtype::I8 => StateTensor::I8 {
                values: view.data().iter().map(|&b| b as i8).collect(),
                shape,
            },
            Dtype::I32 => StateTensor::I32 {
                values: view
                    .data()
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                shape,
            },
            d => {
                let t = Tensor::from_le_bytes(
                    view.data(),
                    our_dtype(d, &name)?,
                    &shape,
                    sinter_core::Device::Cpu,
                )
                .with_context(|| format!("tensor {name} is corrupt"))?;
                checkpoint::check_finite(&name, &t)?;
                StateTensor::Float(t)
            }
        };
        tensors.insert(bare.to_string(), t);
    }
    Ok((config, step, inference, tensors))
}
