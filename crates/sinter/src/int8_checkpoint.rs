//! The int8 inference checkpoint that `sinter quantize` writes, and its reader, below
//! `inference::load_model` / `load_for_eval` (which open one like any checkpoint).
//!
//! The file is safetensors with metadata `format = "sinter-quantized-1"` (the marker the loader
//! looks for; `-2` when a layer has a second int8 plane, so that binaries from before planes
//! refuse the file rather than read half of it), the training `config`, `inference` (the
//! `InferenceInfo` that rebuilds the model from the checkpoint alone), `step`, `source` and a
//! `quantization` summary. Tensors are named as in a training checkpoint (`model.<name>`),
//! except that the weight of each int8 layer becomes `model.<layer>.weight.q` (i8, the
//! weight's shape) and `model.<layer>.weight.scale` (f32 [out]), plus, for a Conv2d, its
//! calibrated input mapping `model.<layer>.input.scale` (f32 [1]) and
//! `model.<layer>.input.zero_point` (i32 [1]), and, for a weight with a second plane (an
//! embedding table, a Linear under `--two-planes`), `model.<layer>.weight.q2` and
//! `model.<layer>.weight.scale2` — see `sinter_nn::quant::state`. There is no optimizer state:
//! the file is for inference only.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use safetensors::tensor::{Dtype, SafeTensors};
use sinter_core::Tensor;
use sinter_nn::quant::{self, StateTensor};
use sinter_nn::Module;

use crate::checkpoint::{self, our_dtype, InferenceInfo};
use crate::config::TrainConfig;

/// The format marker of an int8 checkpoint whose weights have one int8 plane each.
pub const FORMAT: &str = "sinter-quantized-1";
/// The marker of one with second planes (`.q2`, `.scale2`). A binary from before second
/// planes looks for `FORMAT` only, so it refuses such a file instead of silently reading
/// its first planes alone. This binary reads both.
pub const FORMAT_PLANES: &str = "sinter-quantized-2";
const FORMAT_FAMILY: &str = "sinter-quantized-";

/// Whether the safetensors file at `path` carries the int8 format marker (reads its header
/// only). A file that cannot be read is "not quantized": the regular loader reports it.
pub fn is_quantized(path: &Path) -> Result<bool> {
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
pub struct QuantizedFile {
    path: PathBuf,
    pub config: TrainConfig,
    pub step: u64,
    pub inference: Option<InferenceInfo>,
    tensors: HashMap<String, StateTensor>,
}

impl QuantizedFile {
    /// Installs the file's tensors (int8 forms included) into a freshly built `model`.
    pub fn install(&self, model: &dyn Module) -> Result<()> {
        quant::import(model, &self.tensors)
            .with_context(|| format!("loading the int8 checkpoint {}", self.path.display()))?;
        model.set_training(false);
        Ok(())
    }
}

/// Reads `path` (a run directory or the file) if it is an int8 checkpoint. Every error names
/// the file.
pub fn read_if_quantized(dir: &Path) -> Result<Option<QuantizedFile>> {
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
