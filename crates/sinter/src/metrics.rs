//! Run outputs: metrics.jsonl (one JSON object per logged step or evaluation), summary.json,
//! and loss.svg (training and validation loss against step).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::prelude::*;
use serde_json::Value;

pub struct MetricsLog {
    path: PathBuf,
    file: BufWriter<File>,
}

impl MetricsLog {
    /// Opens DIR/metrics.jsonl. A resumed run keeps the lines up to its step and appends.
    pub fn open(dir: &Path, resume_from_step: Option<u64>) -> Result<MetricsLog> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create output directory {}", dir.display()))?;
        let path = dir.join("metrics.jsonl");
        let kept: Vec<String> = match resume_from_step {
            Some(step) => read_lines(&path)?
                .into_iter()
                .filter(|v| {
                    v.get("step")
                        .and_then(Value::as_u64)
                        .is_some_and(|s| s <= step)
                })
                .map(|v| v.to_string())
                .collect(),
            None => Vec::new(),
        };
        let mut file = BufWriter::new(
            OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(&path)
                .with_context(|| format!("cannot write {}", path.display()))?,
        );
        for l in kept {
            writeln!(file, "{l}")?;
        }
        Ok(MetricsLog { path, file })
    }
    pub fn log(&mut self, v: &Value) -> Result<()> {
        writeln!(self.file, "{v}")
            .with_context(|| format!("cannot write {}", self.path.display()))?;
        self.file.flush()?;
        Ok(())
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
}

pub fn read_lines(path: &Path) -> Result<Vec<Value>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// Draws training and validation loss from metrics.jsonl into DIR/loss.svg.
pub fn plot_losses(metrics: &Path, out: &Path, title: &str) -> Result<()> {
    let rows = read_lines(metrics)?;
    let series = |key: &str| -> Vec<(f64, f64)> {
        rows.iter()
            .filter_map(|v| Some((v.get("step")?.as_f64()?, v.get(key)?.as_f64()?)))
            .filter(|(_, y)| y.is_finite())
            .collect()
    };
    let (train, val) = (series("train_loss"), series("val_loss"));
    if train.is_empty() {
        return Ok(());
    }
    let max_x = train.iter().chain(&val).map(|p| p.0).fold(1.0, f64::max);
    let max_y = train.iter().chain(&val).map(|p| p.1).fold(0.0, f64::max) * 1.05;
    let min_y = train
        .iter()
        .chain(&val)
        .map(|p| p.1)
        .fold(f64::INFINITY, f64::min)
        .min(0.0);
    let root = SVGBackend::new(out, (900, 540)).into_drawing_area();
    let draw = || -> std::result::Result<(), Box<dyn std::error::Error>> {
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..max_x, min_y..max_y.max(1e-6))?;
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc("loss")
            .draw()?;
        chart
            .draw_series(LineSeries::new(train.clone(), &BLUE))?
            .label("train loss")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLUE));
        if !val.is_empty() {
            chart
                .draw_series(LineSeries::new(val.clone(), RED.stroke_width(2)))?
                .label("validation loss")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RED));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", out.display()))
}
