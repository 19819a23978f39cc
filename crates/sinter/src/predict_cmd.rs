//! `sinter predict`: a classifier checkpoint's top-k classes, with probabilities, for the
//! user's own PNG/JPEG images or CSV rows of features, prepared as the training data was
//! (`input`). BatchNorm is folded into the convolutions first (`sinter_nn::fold`).
//! `--export-sample N OUT.png` writes validation example N as an image that predict reads back
//! to the very same input, for trying it out.

mod input;

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde::Serialize;
use sinter_core::{no_grad, Tensor};

use crate::checkpoint::InputSpec;
use crate::inference::{self, Inference};
use input::ImageSpec;

#[derive(Args)]
pub struct PredictArgs {
    /// Run directory (or checkpoint file) of a classifier written by `train --out`.
    #[arg(long)]
    checkpoint: PathBuf,
    /// PNG or JPEG images, or CSV files with one example's raw values per row.
    files: Vec<PathBuf>,
    /// How many of the most likely classes to print per input.
    #[arg(long, default_value_t = 3)]
    top_k: usize,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
    /// Invert image pixels (255 − p): for dark strokes on a light background, as drawn on
    /// paper; the digits and MNIST are light on dark.
    #[arg(long)]
    invert: bool,
    /// Write validation example N of the checkpoint's data as a PNG to the one FILE given,
    /// instead of predicting.
    #[arg(long, value_name = "N")]
    export_sample: Option<usize>,
}

/// A loaded classifier and what its inputs must look like.
struct Classifier {
    inf: Inference,
    spec: ImageSpec,
    class_names: Vec<String>,
}

pub fn run(a: &PredictArgs) -> Result<()> {
    let c = load_classifier(&a.checkpoint)?;
    if let Some(n) = a.export_sample {
        return export_sample(&c, n, &a.files);
    }
    if a.files.is_empty() {
        bail!("predict: give one or more PNG/JPEG images or CSV files to classify");
    }
    if a.top_k == 0 {
        bail!("--top-k must be at least 1");
    }
    let mut inputs = Vec::new();
    for f in &a.files {
        read_file(f, &c.spec, a.invert, &mut inputs)?;
    }
    let probs = classify(&c, &inputs)?;
    let k = a.top_k.min(c.class_names.len());
    let predictions: Vec<Prediction> = inputs
        .iter()
        .zip(probs.chunks(c.class_names.len()))
        .map(|(inp, p)| Prediction {
            input: inp.file.clone(),
            row: inp.row,
            top: top_k(p, k, &c.class_names),
        })
        .collect();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&predictions)?);
    } else {
        for p in &predictions {
            println!("{}", p.text());
        }
    }
    Ok(())
}

/// The checkpoint's model (BatchNorm folded, evaluation mode) and its input format, from the
/// checkpoint alone.
fn load_classifier(dir: &Path) -> Result<Classifier> {
    let inf = inference::load_model(dir)?;
    let info = &inf.info;
    if info.task != "classification" {
        bail!(
            "predict needs a classifier checkpoint; {} is a {} model (use sinter generate for language models)",
            info.model,
            info.task.replace('_', " ")
        );
    }
    let spec = match (&info.input, &info.input_shape[..]) {
        (
            InputSpec::Image {
                pixel_max,
                mean,
                std,
            },
            &[channels, height, width],
        ) if mean.len() == channels
            && std.len() == channels
            && *pixel_max > 0.0
            && std.iter().all(|s| *s > 0.0) =>
        {
            ImageSpec {
                channels,
                height,
                width,
                pixel_max: *pixel_max,
                mean: mean.clone(),
                std: std.clone(),
            }
        }
        (input, shape) => bail!(
            "predict: the checkpoint's inputs ({input:?}, shape {shape:?}) are not images with a usable normalisation"
        ),
    };
    let class_names = match &info.class_names {
        Some(n) if n.len() == info.classes => n.clone(),
        Some(n) => bail!(
            "the checkpoint names {} classes but its model has {}; the checkpoint is damaged",
            n.len(),
            info.classes
        ),
        None => (0..info.classes).map(|c| c.to_string()).collect(),
    };
    sinter_nn::fold::fold_for_inference(inf.model.as_ref())?;
    Ok(Classifier {
        inf,
        spec,
        class_names,
    })
}

/// One input: its file, its CSV line (None for an image) and its model input values.
struct Input {
    file: String,
    row: Option<usize>,
    values: Vec<f32>,
}

fn read_file(path: &Path, spec: &ImageSpec, invert: bool, out: &mut Vec<Input>) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let file = path.display().to_string();
    let is_csv = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"));
    if is_csv {
        let text = std::str::from_utf8(&bytes)
            .map_err(|_| anyhow!("{file} is not a text CSV file (not UTF-8)"))?;
        let rows = input::csv_rows(text, spec).map_err(|e| anyhow!("{file}: {e}"))?;
        out.extend(rows.into_iter().map(|r| Input {
            file: file.clone(),
            row: Some(r.line),
            values: r.values,
        }));
    } else {
        let values = input::image_input(&bytes, spec, invert).map_err(|e| anyhow!("{file} {e}"))?;
        out.push(Input {
            file,
            row: None,
            values,
        });
    }
    Ok(())
}

/// Class probabilities, one row of `classes` per input, in batches of 256.
fn classify(c: &Classifier, inputs: &[Input]) -> Result<Vec<f32>> {
    let model = c.inf.model.as_ref();
    let device = sinter_nn::module_device(model)?;
    let _g = no_grad();
    let s = &c.spec;
    let mut probs = Vec::new();
    for chunk in inputs.chunks(256) {
        let flat: Vec<f32> = chunk
            .iter()
            .flat_map(|i| i.values.iter().copied())
            .collect();
        let shape = [chunk.len(), s.channels, s.height, s.width];
        let x = Tensor::from_vec(flat, &shape, sinter_core::Device::Cpu)?.to_device(device)?;
        let logits = model.forward(&x)?;
        if logits.shape() != [chunk.len(), c.class_names.len()] {
            bail!(
                "the model gave outputs of shape {:?} for {} inputs of {} classes",
                logits.shape(),
                chunk.len(),
                c.class_names.len()
            );
        }
        probs.extend(logits.softmax(-1)?.to_vec_f32()?);
    }
    Ok(probs)
}

#[derive(Serialize)]
struct Prediction {
    input: String,
    /// The CSV line, for rows of a CSV file.
    row: Option<usize>,
    top: Vec<ClassProbability>,
}

#[derive(Serialize)]
struct ClassProbability {
    class: usize,
    name: String,
    probability: f32,
}

impl Prediction {
    fn text(&self) -> String {
        let place = match self.row {
            Some(r) => format!("{}:{r}", self.input),
            None => self.input.clone(),
        };
        let top: Vec<String> = self
            .top
            .iter()
            .map(|t| format!("{} {:.2}%", t.name, 100.0 * t.probability))
            .collect();
        format!("{place}: {}", top.join(", "))
    }
}

/// The `k` most likely classes, most likely first (ties: lower class first).
fn top_k(probs: &[f32], k: usize, names: &[String]) -> Vec<ClassProbability> {
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    order
        .into_iter()
        .take(k)
        .map(|c| ClassProbability {
            class: c,
            name: names[c].clone(),
            probability: probs[c],
        })
        .collect()
}

fn export_sample(c: &Classifier, n: usize, files: &[PathBuf]) -> Result<()> {
    let [out] = files else {
        bail!(
            "--export-sample N takes exactly one output file (OUT.png), got {}",
            files.len()
        );
    };
    let data = &c.inf.config.data;
    let val = sinter_data::DataSpec::parse(data)?.open(sinter_data::Split::Validation, 0)?;
    if n >= val.len() {
        bail!(
            "--export-sample {n}: the validation split of {data} has {} examples (0–{})",
            val.len(),
            val.len().saturating_sub(1)
        );
    }
    let (x, y) = val.get(n);
    let values = match &x.data {
        sinter_data::HostData::F32(v) if v.len() == c.spec.numel() => v,
        _ => bail!("--export-sample: the inputs of {data} are not the model's images"),
    };
    let png = input::png_bytes(&input::to_image(values, &c.spec)).map_err(|e| anyhow!(e))?;
    crate::checkpoint::write_atomic(out, &png)?;
    let label = match &y.data {
        sinter_data::HostData::I64(v) => v
            .first()
            .and_then(|&l| c.class_names.get(l as usize).cloned()),
        sinter_data::HostData::F32(_) => None,
    };
    println!(
        "wrote {}: validation example {n} of {} ({}×{}, label {})",
        out.display(),
        data,
        c.spec.width,
        c.spec.height,
        label.unwrap_or_else(|| "?".into())
    );
    Ok(())
}
