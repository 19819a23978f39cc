//! Int8 post-training quantization for CPU inference.
//!
//! - Weights: symmetric int8 per output channel (Linear, Conv2d) or per row (Embedding
//!   tables), w ≈ scale[j]·q[j, …]; biases, norms and everything else stay f32.
//! - Activations: u8 with a zero point. Linear layers quantize each row of their input at run
//!   time (dynamic: every token gets its own range; no calibration). Conv2d layers use one
//!   static range per layer, measured by running calibration batches through the f32 model
//!   (the running min and max of the layer's input over all batches: it never clips a value
//!   seen in calibration; the CNNs here feed post-ReLU/pool activations without the rare
//!   outliers that would argue for a percentile).
//! - Embedding tables are stored per-row int8 and serve both the lookup (rows dequantized) and,
//!   for GPT/BERT, the tied output head (an int8 GEMM). For GPT-2 124M the tied head is 38.6M of
//!   the 124M parameters and about a third of the per-token work at batch 1: left in f32 it
//!   would cap both the file's shrink (about 2× instead of 4×) and generation's speed-up.
//!   Per-row scales keep each token's vector within half a step (1/254 of its largest entry).
//!   By default a large table (GPT-2's) also gets a second int8 plane with the first's
//!   rounding error ([`residual`], [`TablePlanes`]): lookups read both, and the head rescores
//!   the outputs that could be its largest from both, so greedy decoding picks what a head ~16
//!   bits precise would, for one more byte per entry in the file and a few dot products per row.
//!
//! - Weight rounding ([`Rounding`]): to nearest, or GPTQ's error feedback from calibration
//!   inputs ([`gptq`]; same scales and file format, values chosen for the layer's output).
//! - Layers named in [`QuantizeOptions::keep_f32`] stay f32 (for GPT, the accuracy rule
//!   `wte`: README "Int8 quantization" says why).
//!
//! [`quantize`] rewrites a model in place: every Linear, Conv2d and Embedding lists a
//! [`slot::LayerHandle`] beside its weight in `Module::collect`, and its forward runs the int8
//! form installed in that slot. [`state::export`] / [`state::import`] turn a quantized model
//! into named tensors (int8 weights + f32 scales) and back. Int8 Linears and embedding tables
//! (lookups and tied heads) run through the seam's qmatmul kernel
//! (`sinter_core::kernels::qmatmul`) on the device of their input — the CPU or CUDA, the same
//! code, the weight uploaded on first use; so do int8 convolutions (the folder's `QConv2d`:
//! im2col with the static mapping, then the int8 GEMM). GGML layers run on the CPU only (a
//! CUDA input gets an error). No int8 layer carries a gradient. A model whose
//! int8 convolutions follow one another (conv → activation → max pool → conv) runs them as a
//! [`chain`], u8 activations passed from one to the next (on the CPU; on CUDA the chain's
//! stages run in turn).
//!
//! The same slot also holds a Linear whose weight stays in a GGML block format from a GGUF
//! file ([`ggml::GgmlLinear`]): one quantized-layer trait ([`slot::Int8Layer`]) for both.

pub mod chain;
pub mod conv;
pub mod ggml;
pub mod gptq;
mod host;
pub mod linear;
pub mod residual;
pub mod slot;
pub mod state;
pub mod weight;

use std::sync::Arc;

pub use conv::QuantizedConv2d;
pub use ggml::GgmlLinear;
pub use linear::QuantizedLinear;
pub use residual::ResidualPlane;
pub use sinter_cpu::ggml_quant::GgmlType;
pub use slot::{Activation, LayerHandle, LayerKind, QuantSlot, QuantState};
pub use state::{export, import, StateTensor};
pub use weight::Int8Weight;

use sinter_core::{bail, Device, Result};
pub use sinter_cpu::int8::{ActTerms, Int8Path};
use sinter_cpu::int8::{QParams, TWO_TERMS_MIN_WEIGHT};

use crate::module::Module;
use gptq::Gram;
use slot::{InputObserver, Int8Layer};

/// What [`quantize`] did.
#[derive(Clone, Debug, Default)]
pub struct QuantizeReport {
    /// Layers now int8, by name, with their kind ("linear", "conv2d", "embedding").
    pub int8: Vec<(String, &'static str)>,
    /// Layers left in f32, with the reason.
    pub kept_f32: Vec<(String, String)>,
    /// Layers with a second int8 plane (embedding tables by default, Linears asked for).
    pub two_planes: Vec<String>,
    /// Layers whose int8 values were rounded with error feedback from calibration inputs
    /// ([`Rounding::ErrorFeedback`]); the other int8 layers were rounded to nearest.
    pub error_feedback: Vec<String>,
    /// Bytes of the f32 weights that got int8 forms, and of those forms.
    pub f32_bytes: usize,
    pub int8_bytes: usize,
}

/// A quantizable layer of a model: its name (the weight's name without `.weight`) and handle.
pub fn layers(model: &dyn Module) -> Vec<(String, LayerHandle)> {
    model
        .named_tensors()
        .into_iter()
        .filter_map(|t| {
            let name = t
                .name
                .strip_suffix(".weight")
                .unwrap_or(&t.name)
                .to_string();
            t.layer.map(|h| (name, h))
        })
        .collect()
}

/// Rewrites every Linear, Conv2d and Embedding of `model` to int8, in place (all or nothing),
/// rounding weights to nearest. `calibrate` is called once, with the model in f32, when there
/// are Conv2d layers: it should run representative batches through `model.forward` (under
/// `no_grad`); each conv records the range of its input. A model quantized before is
/// re-quantized from its f32 weights.
pub fn quantize(
    model: &dyn Module,
    calibrate: &mut dyn FnMut(&dyn Module) -> Result<()>,
) -> Result<QuantizeReport> {
    quantize_keeping(model, &[], calibrate)
}

/// How the int8 values of Linear and Embedding weights are chosen (their per-channel scales
/// are max|w|/127 either way; Conv2d weights are always rounded to nearest).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Rounding {
    /// Each weight to its nearest int8 value.
    #[default]
    Nearest,
    /// GPTQ's error feedback ([`gptq`]) from the Gram matrix of each layer's inputs over the
    /// calibration batches: the output error on those inputs is minimised, not each weight's.
    /// A layer no calibration batch reached (an embedding used only for lookups) is rounded
    /// to nearest.
    ErrorFeedback,
}

/// What [`quantize_with`] does besides rewriting every layer to int8.
#[derive(Clone, Debug, Default)]
pub struct QuantizeOptions {
    /// Layers to leave in f32: a layer's name (`wte`, `blocks.0.mlp.fc`) or a prefix of names
    /// ending at a dot (`blocks.0`: every layer of block 0).
    pub keep_f32: Vec<String>,
    pub rounding: Rounding,
    pub table_planes: TablePlanes,
    /// Linear layers (names or prefixes, as `keep_f32`) whose weights get a second int8 plane
    /// with the first's rounding error ([`residual`]): ~16-bit weights for a second GEMM.
    pub two_planes: Vec<String>,
}

/// Int8 planes per embedding table ([`residual`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TablePlanes {
    /// One: the smallest file (each entry within 1/254 of its row's largest).
    One,
    /// Two: the second carries the first's rounding error; the tied head rescores its top.
    Two,
    /// Two for a table of at least [`TWO_TERMS_MIN_WEIGHT`] int8 values, one for a smaller
    /// one: the rule of [`ActTerms::Auto`], for the same reason. A large table's head is
    /// bound by reading its weights, so a few dot products per row and a byte more per entry
    /// cost little (GPT-2's 50k-row head); a small one's runs in cache, where the rescoring
    /// and its bound cost gpt-tiny's int8 generation ~5-10 % (1.52× → 1.42× of f32).
    #[default]
    Auto,
}

impl TablePlanes {
    /// Whether a table of `values` int8 values gets a second plane.
    pub fn two_for(self, values: usize) -> bool {
        match self {
            TablePlanes::One => false,
            TablePlanes::Two => true,
            TablePlanes::Auto => values >= TWO_TERMS_MIN_WEIGHT,
        }
    }
}

/// [`quantize`], leaving in f32 every layer that `keep_f32` names (see [`QuantizeOptions`]).
pub fn quantize_keeping(
    model: &dyn Module,
    keep_f32: &[String],
    calibrate: &mut dyn FnMut(&dyn Module) -> Result<()>,
) -> Result<QuantizeReport> {
    let options = QuantizeOptions {
        keep_f32: keep_f32.to_vec(),
        rounding: Rounding::Nearest,
        table_planes: TablePlanes::default(),
        two_planes: Vec::new(),
    };
    quantize_with(model, &options, calibrate)
}

/// [`quantize`] with options. A name in `keep_f32` that matches no layer is an error that
/// lists the layers. `calibrate` is called when there are Conv2d layers or when the rounding
/// is [`Rounding::ErrorFeedback`].
pub fn quantize_with(
    model: &dyn Module,
    options: &QuantizeOptions,
    calibrate: &mut dyn FnMut(&dyn Module) -> Result<()>,
) -> Result<QuantizeReport> {
    let keep_f32 = &options.keep_f32;
    // BatchNorm folded before now made f32 copies of the convolutions that would shadow their
    // int8 forms: unfold (fold again after quantizing, `fold::fold_for_inference`).
    model.set_training(true);
    model.set_training(false);
    let all = layers(model);
    let kept = |name: &str| keep_f32.iter().any(|k| names_layer(k, name));
    let two_planes = |name: &str| options.two_planes.iter().any(|k| names_layer(k, name));
    for (what, list) in [
        ("keep in f32", keep_f32),
        ("two planes", &options.two_planes),
    ] {
        if let Some(k) = list
            .iter()
            .find(|k| !all.iter().any(|(n, _)| names_layer(k, n)))
        {
            let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
            bail!(
                "quantize: {what}: '{k}' names no layer of this model; its layers are {}",
                names.join(", ")
            );
        }
    }
    for (name, h) in &all {
        if h.weight.device() != Device::Cpu {
            bail!(
                "quantize: {name} is on {}; int8 layers run on the CPU, move the model there first",
                h.weight.device()
            );
        }
        h.slot.set(QuantState::F32);
    }
    let mut report = QuantizeReport::default();
    let mut todo = Vec::new();
    for (name, h) in all {
        match h.kind {
            _ if kept(&name) => report.kept_f32.push((name, "asked to keep f32".into())),
            slot::LayerKind::Conv2d(p) if p.groups != 1 => report
                .kept_f32
                .push((name, format!("grouped convolution ({} groups)", p.groups))),
            _ => todo.push((name, h)),
        }
    }
    let feedback = options.rounding == Rounding::ErrorFeedback;
    let mut seen = calibrate_inputs(model, &todo, feedback, calibrate)?;
    let mut forms: Vec<(usize, Arc<dyn Int8Layer>, usize)> = Vec::new();
    for (i, (name, h)) in todo.iter().enumerate() {
        let bias = h.bias.as_ref();
        let (form, bytes): (Arc<dyn Int8Layer>, usize) = match h.kind {
            LayerKind::Linear | LayerKind::Embedding => {
                let weight = match seen[i].take().and_then(|s| s.gram) {
                    Some(g) => {
                        report.error_feedback.push(name.clone());
                        Int8Weight::from_f32_with_feedback(&h.weight, &g)
                    }
                    None => Int8Weight::from_f32(&h.weight),
                };
                let mut weight = weight.map_err(|e| at(name, e))?;
                let table = h.kind == LayerKind::Embedding;
                if (table && options.table_planes.two_for(h.weight.numel())) || two_planes(name) {
                    report.two_planes.push(name.clone());
                    weight = weight
                        .with_residual_of(&h.weight)
                        .map_err(|e| at(name, e))?;
                }
                let q = if table {
                    QuantizedLinear::table(weight)
                } else {
                    QuantizedLinear::new(weight, bias)
                }
                .map_err(|e| at(name, e))?;
                let b = q.weight().bytes();
                (Arc::new(q), b)
            }
            LayerKind::Conv2d(_) if two_planes(name) => bail!(
                "quantize: two planes: {name} is a Conv2d; only Linear layers (and embedding tables) take a second int8 plane"
            ),
            LayerKind::Conv2d(p) => {
                let (lo, hi) = seen[i]
                    .as_ref()
                    .and_then(|s| s.range)
                    .expect("every conv was calibrated");
                let input =
                    QParams::from_range(lo, hi).map_err(|e| at(name, host::int8_err(e)))?;
                let q = QuantizedConv2d::from_f32(&h.weight, bias, p, input)
                    .map_err(|e| at(name, e))?;
                let b = q.weight().bytes();
                (Arc::new(q), b)
            }
        };
        forms.push((i, form, bytes));
    }
    for (i, form, bytes) in forms {
        let (name, h) = &todo[i];
        report.f32_bytes += 4 * h.weight.numel();
        report.int8_bytes += bytes;
        let kind = match h.kind {
            LayerKind::Linear => "linear",
            LayerKind::Conv2d(_) => "conv2d",
            LayerKind::Embedding => "embedding",
        };
        report.int8.push((name.clone(), kind));
        h.slot.set(QuantState::Int8(form));
    }
    Ok(report)
}

/// Sets how many u8 terms carry each activation row of every int8 Linear (and tied head) of
/// `model` (`ActTerms::Auto` is what quantizing installs); returns how many layers it set.
pub fn set_act_terms(model: &dyn Module, terms: ActTerms) -> usize {
    let mut set = 0;
    for (_, h) in layers(model) {
        let Some(form) = h.slot.int8() else { continue };
        if let Some(q) = form.as_any().downcast_ref::<QuantizedLinear>() {
            h.slot
                .set(QuantState::Int8(Arc::new(q.clone().with_act_terms(terms))));
            set += 1;
        }
    }
    set
}

/// Whether `pattern` names the layer `name`: the name itself, or a prefix ending at a dot.
fn names_layer(pattern: &str, name: &str) -> bool {
    let p = pattern.trim_end_matches('.');
    name == p || (name.starts_with(p) && name.as_bytes().get(p.len()) == Some(&b'.'))
}

/// What calibration saw of one layer's inputs.
struct Seen {
    range: Option<(f32, f32)>,
    gram: Option<Gram>,
}

/// From one `calibrate` run: the input range of each conv in `todo`, and with `gram` the
/// inputs' Gram matrix of each Linear and Embedding (None for a layer not observed). No run
/// when nothing needs observing.
fn calibrate_inputs(
    model: &dyn Module,
    todo: &[(String, LayerHandle)],
    gram: bool,
    calibrate: &mut dyn FnMut(&dyn Module) -> Result<()>,
) -> Result<Vec<Option<Seen>>> {
    let observers: Vec<Option<Arc<InputObserver>>> = todo
        .iter()
        .map(|(_, h)| match h.kind {
            LayerKind::Conv2d(_) => Some(Default::default()),
            LayerKind::Linear | LayerKind::Embedding if gram => {
                Some(Arc::new(InputObserver::with_gram()))
            }
            _ => None,
        })
        .collect();
    if observers.iter().all(Option::is_none) {
        return Ok(todo.iter().map(|_| None).collect());
    }
    for ((_, h), o) in todo.iter().zip(&observers) {
        if let Some(o) = o {
            h.slot.set(QuantState::Calibrating(o.clone()));
        }
    }
    let run = calibrate(model);
    for (_, h) in todo {
        h.slot.set(QuantState::F32);
    }
    run.map_err(|e| sinter_core::Error::Msg(format!("calibration: {e}")))?;
    let mut seen = Vec::with_capacity(todo.len());
    for ((name, h), o) in todo.iter().zip(&observers) {
        seen.push(match o {
            None => None,
            Some(o) => {
                let range = o.range();
                if range.is_none() && matches!(h.kind, LayerKind::Conv2d(_)) {
                    bail!("calibration: no batch reached {name}; give calibration batches that run the whole model");
                }
                Some(Seen {
                    range,
                    gram: o.take_gram(),
                })
            }
        });
    }
    Ok(seen)
}

/// BatchNorm folding of an int8 convolution: when `conv` runs an int8 form, installs in
/// `folded` (the f32 fold of `conv` and a BatchNorm, `fold::fold_conv_bn`) that form with each
/// output channel scaled by `scale` and `folded`'s bias, so the folded layer stays int8.
pub fn fold_int8_conv(
    conv: &crate::layers::Conv2d,
    folded: &crate::layers::Conv2d,
    scale: &[f64],
) -> Result<()> {
    let Some(form) = conv.quant.int8() else {
        return Ok(());
    };
    let Some(q) = form.as_any().downcast_ref::<QuantizedConv2d>() else {
        bail!("fold: the convolution holds an int8 form that is not a QuantizedConv2d");
    };
    let bias = folded.bias.as_ref().ok_or_else(|| {
        sinter_core::Error::Msg("fold: the folded convolution has no bias".into())
    })?;
    folded
        .quant
        .set(QuantState::Int8(Arc::new(q.folded(scale, bias)?)));
    Ok(())
}

fn at(name: &str, e: sinter_core::Error) -> sinter_core::Error {
    sinter_core::Error::Msg(format!("quantizing {name}: {e}"))
}
