//! `sinter quantize`: a trained checkpoint → an int8 inference checkpoint (the file format and
//! its reader are in `int8_checkpoint`, so that `eval`, `generate`, `predict` and the server
//! open one like any checkpoint through `inference::load_model` / `load_for_eval`); or, with
//! `--format`, a GGUF file re-quantized to one GGML block format (`gguf::quantize_gguf`).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use clap::Args;
use safetensors::tensor::Dtype;
use sinter_core::no_grad;
use sinter_data::DataLoader;
use sinter_models::gguf::{self, GgmlType, GgufFile};
use sinter_nn::quant::{self, QuantizeOptions, QuantizeReport, Rounding, StateTensor, TablePlanes};
use sinter_nn::Module;

use crate::checkpoint::{self, st_dtype};
use crate::inference;
use crate::int8_checkpoint::{is_quantized, FORMAT, FORMAT_PLANES};
use crate::trainer::{self, Setup};

#[derive(Args)]
pub struct QuantizeArgs {
    /// Run directory (or checkpoint file) of the trained f32 model.
    #[arg(long, required_unless_present = "model", conflicts_with = "model")]
    pub checkpoint: Option<PathBuf>,
    /// A GGUF file to write again with its matrices in --format (llama.cpp and the `gguf`
    /// Python package read the result; generate, serve and bench llm run it kept quantized).
    #[arg(long, requires = "format")]
    pub model: Option<PathBuf>,
    /// The GGML format of --model's matrices in the written GGUF. Norms, and matrices whose
    /// rows are not whole blocks (256 values for q4_k and q6_k, 32 for the others), stay in
    /// their float type (F32 when they were quantized); the command lists them.
    #[arg(long, value_enum, requires = "model")]
    pub format: Option<GgufFormat>,
    /// Directory for the int8 checkpoint (written as checkpoint.safetensors); never the
    /// --checkpoint's own directory (the f32 run could no longer resume). With --format: the
    /// GGUF file to write.
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

/// `--format`: the GGML block formats `sinter quantize` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GgufFormat {
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_0")]
    Q4_0,
    #[value(name = "q4_1")]
    Q4_1,
    #[value(name = "q4_k")]
    Q4K,
    #[value(name = "q6_k")]
    Q6K,
}

impl GgufFormat {
    fn ggml_type(self) -> GgmlType {
        match self {
            GgufFormat::Q8_0 => GgmlType::Q8_0,
            GgufFormat::Q4_0 => GgmlType::Q4_0,
            GgufFormat::Q4_1 => GgmlType::Q4_1,
            GgufFormat::Q4K => GgmlType::Q4_K,
            GgufFormat::Q6K => GgmlType::Q6_K,
        }
    }
}

/// `sinter quantize --model FILE.gguf --format F --out OUT.gguf`.
fn run_gguf(model: &Path, format: GgufFormat, a: &QuantizeArgs) -> Result<()> {
    let ext = |p: &Path| {
        p.extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    };
    if model.is_dir() {
        bail!("--model {} is a directory: sinter quantize --format re-quantizes a GGUF file. Convert the Hugging Face model to GGUF first (llama.cpp's convert_hf_to_gguf.py), then quantize that file", model.display());
    }
    if !ext(model) {
        bail!(
            "--model {} is not a .gguf file; sinter quantize --format re-quantizes a GGUF file",
            model.display()
        );
    }
    if !ext(&a.out) {
        bail!(
            "--out {} must be a .gguf file name (the GGUF file to write)",
            a.out.display()
        );
    }
    if let (Ok(x), Ok(y)) = (model.canonicalize(), a.out.canonicalize()) {
        if x == y {
            bail!(
                "--out {} is --model itself; write the quantized file elsewhere",
                a.out.display()
            );
        }
    }
    if a.out.exists() && !a.overwrite {
        bail!(
            "--out {} already exists; add --overwrite to replace it, or choose another --out",
            a.out.display()
        );
    }
    let src = GgufFile::open(model)?;
    let ty = format.ggml_type();
    // Written beside --out and renamed: a failed run leaves no half-written GGUF there.
    let tmp = a.out.with_extension("gguf.partial");
    let report = gguf::quantize_gguf(&src, ty, &tmp);
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
    };
    std::fs::rename(&tmp, &a.out)
        .map_err(|e| anyhow!("cannot move {} to {}: {e}", tmp.display(), a.out.display()))?;
    println!(
        "{}: {} tensors {ty}, {} in a fallback format, {} kept ({:.1} MiB of tensors)",
        a.out.display(),
        report.quantized.len(),
        report.fallback.len(),
        report.kept.len(),
        report.bytes_written as f64 / (1 << 20) as f64
    );
    for (name, kept_ty, why) in report.fallback.iter().chain(&report.kept) {
        println!("  {name}: {kept_ty} ({why})");
    }
    Ok(())
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
fn check_out(a: &QuantizeArgs, checkpoint: &Path) -> Result<()> {
    let target = checkpoint::path_in(&a.out);
    let source = checkpoint::file_of(checkpoint);
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
    let checkpoint = match (&a.model, a.format) {
        (Some(model), Some(format)) => return run_gguf(model, format, a),
        _ => a.checkpoint.as_ref().ok_or_else(|| {
            anyhow!("give --checkpoint RUN (an int8 checkpoint) or --model FILE.gguf --format F (a GGUF file)")
        })?,
    };
    if is_quantized(&checkpoint::file_of(checkpoint))? {
        bail!(
            "{} is already an int8 checkpoint; quantize the f32 checkpoint it came from",
            checkpoint.display()
        );
    }
    let (s, step) = inference::load_for_eval(checkpoint)?;
    // Before the slow part, so that a refused --out costs no quantizing.
    check_out(a, checkpoint)?;
    let options = a.choices.options();
    let Quantized {
        report,
        folded,
        calibration_batches,
    } = quantize_setup(&s, a.calibration_batches, &options)?;
    let path = save(&a.out, &s, step, &report, checkpoint)?;
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
        serde_json::to_string(&trainer::info_of(s))?,
    );
    // checkpoint's writer: sorted keys and a fixed tensor order, so quantizing the same
    // checkpoint twice gives the same bytes.
    let bytes = checkpoint::serialize(owned, &md)
        .map_err(|e| anyhow!("cannot serialise the int8 checkpoint: {e}"))?;
    let path = checkpoint::path_in(dir);
    checkpoint::write_atomic(&path, &bytes)?;
    Ok(path)
}
