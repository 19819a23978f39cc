//! loss.svg: training and validation loss against the step. Made to be read: every
//! validation point is marked (a run with one evaluation still shows it), the step axis has
//! whole-number ticks, the legend sits beside the chart rather than on a curve, and the loss
//! axis is logarithmic when the loss spans more than a decade.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::metrics::read_lines;

/// The points of one series (step, loss) from metrics.jsonl rows.
fn series(rows: &[serde_json::Value], key: &str) -> Vec<(u64, f64)> {
    rows.iter()
        .filter_map(|v| Some((v.get("step")?.as_u64()?, v.get(key)?.as_f64()?)))
        .filter(|(_, y)| y.is_finite())
        .collect()
}

/// Whether the loss axis should be logarithmic: positive losses spanning more than 10×.
pub fn log_axis(lo: f64, hi: f64) -> bool {
    lo > 0.0 && hi / lo > 10.0
}

/// Draws training and validation loss from metrics.jsonl into `out`.
pub fn plot_losses(metrics: &Path, out: &Path, title: &str) -> Result<()> {
    let rows = read_lines(metrics)?;
    let (train, val) = (series(&rows, "train_loss"), series(&rows, "val_loss"));
    if train.is_empty() && val.is_empty() {
        return Ok(());
    }
    let all = || train.iter().chain(&val);
    let max_x = all().map(|p| p.0).max().unwrap_or(1).max(1);
    let lo = all().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let hi = all().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let root = SVGBackend::new(out, (960, 540)).into_drawing_area();
    let draw = || -> std::result::Result<(), Box<dyn std::error::Error>> {
        root.fill(&WHITE)?;
        let (chart_area, legend_area) = root.split_horizontally(780);
        let x = 0..max_x + max_x.div_ceil(20);
        if log_axis(lo, hi) {
            let y = (lo * 0.9..hi * 1.1).log_scale();
            let chart = chart_on(&chart_area, title, x, y)?;
            draw_series(chart, &train, &val)?;
        } else {
            let pad = ((hi - lo) * 0.05).max(1e-3);
            let y = (lo - pad).min(0.0)..hi + pad;
            let chart = chart_on(&chart_area, title, x, y)?;
            draw_series(chart, &train, &val)?;
        }
        legend(&legend_area, !val.is_empty())?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow!("cannot draw {}: {e}", out.display()))
}

type Chart<'a, Y> =
    ChartContext<'a, SVGBackend<'a>, Cartesian2d<plotters::coord::types::RangedCoordu64, Y>>;

fn chart_on<'a, R>(
    area: &DrawingArea<SVGBackend<'a>, Shift>,
    title: &str,
    x: std::ops::Range<u64>,
    y: R,
) -> std::result::Result<Chart<'a, R::CoordDescType>, Box<dyn std::error::Error + 'a>>
where
    R: AsRangedCoord<Value = f64>,
    R::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        // Steps are whole numbers: no fractional ticks on a short run.
        .x_labels(10)
        .x_label_formatter(&|s| s.to_string())
        .draw()?;
    Ok(chart)
}

fn draw_series<Y: Ranged<ValueType = f64> + ValueFormatter<f64>>(
    mut chart: Chart<'_, Y>,
    train: &[(u64, f64)],
    val: &[(u64, f64)],
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    chart.draw_series(LineSeries::new(train.to_vec(), &BLUE))?;
    chart.draw_series(LineSeries::new(val.to_vec(), RED.stroke_width(2)))?;
    // Every validation point is marked, so one evaluation is visible too.
    chart.draw_series(val.iter().map(|&p| Circle::new(p, 4, RED.filled())))?;
    Ok(())
}

/// The legend, in its own strip to the right of the chart.
fn legend(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    with_val: bool,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let style = ("sans-serif", 16).into_font();
    let mut entries = vec![("train loss", BLUE)];
    if with_val {
        entries.push(("validation loss", RED));
    }
    for (i, (label, color)) in entries.into_iter().enumerate() {
        let y = 70 + 28 * i as i32;
        area.draw(&PathElement::new(
            vec![(4, y), (28, y)],
            color.stroke_width(2),
        ))?;
        area.draw(&Text::new(label, (34, y - 8), style.clone()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svg_of(lines: &[serde_json::Value]) -> String {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().join("metrics.jsonl");
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(&m, text).unwrap();
        let out = dir.path().join("loss.svg");
        plot_losses(&m, &out, "t").unwrap();
        std::fs::read_to_string(out).unwrap()
    }

    #[test]
    fn one_validation_point_is_drawn_and_the_legend_is_beside_the_chart() {
        let svg = svg_of(&[
            serde_json::json!({"step": 1, "train_loss": 2.0}),
            serde_json::json!({"step": 2, "train_loss": 1.5}),
            serde_json::json!({"step": 3, "train_loss": 1.2}),
            serde_json::json!({"step": 3, "val_loss": 1.3}),
        ]);
        assert_eq!(svg.matches("<circle").count(), 1, "{svg}");
        // The legend's text starts right of the chart's 780-pixel area.
        let at = svg.find("validation loss").expect("legend");
        let tag = &svg[svg[..at].rfind("<text").unwrap()..at];
        let x: f64 = tag
            .split("x=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(x > 780.0, "{tag}");
        // Whole-number step ticks only: no "1.5" on a three-step run.
        for half in ["0.5", "1.5", "2.5"] {
            assert!(!svg.contains(&format!(">\n{half}\n<")), "{half} tick");
        }
    }

    #[test]
    fn the_loss_axis_is_logarithmic_when_the_loss_spans_decades() {
        assert!(log_axis(0.01, 2.5));
        assert!(!log_axis(1.0, 2.5));
        assert!(!log_axis(0.0, 2.5));
        let svg = svg_of(&[
            serde_json::json!({"step": 1, "train_loss": 100.0}),
            serde_json::json!({"step": 2, "train_loss": 0.05}),
        ]);
        assert!(svg.contains("<svg"));
    }
}
