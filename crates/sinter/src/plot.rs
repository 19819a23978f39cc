//! loss.svg: training and validation loss against the step. Made to be read: every
//! validation point is marked (a run with one evaluation still shows it), the step axis has
//! whole-number ticks, the legend sits beside the chart rather than on a curve, and the loss
//! axis spans the losses (not from 0): logarithmic when they span more than a factor of two
//! (a language model's 5.6 → 1.8 as a CNN's 2.3 → 0.05), with ticks at round values.

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

/// Whether the loss axis should be logarithmic: positive losses spanning more than 2×, where
/// the first steps' high losses would squeeze the rest of a linear axis.
pub fn log_axis(lo: f64, hi: f64) -> bool {
    lo > 0.0 && hi / lo > 2.0
}

/// The loss axis' range: the losses with a margin, not from 0.
pub fn loss_range(lo: f64, hi: f64) -> std::ops::Range<f64> {
    if log_axis(lo, hi) {
        lo * 0.95..hi * 1.05
    } else {
        let pad = ((hi - lo) * 0.05).max(1e-3);
        lo - pad..hi + pad
    }
}

/// Round values to tick a logarithmic axis over `range` with: the sparsest of 1-2-5, 1-2-3-5
/// and finer steps per decade that gives at least five ticks (plotters' own log ticks are
/// powers of ten only, so an axis within one decade would have none).
pub fn log_ticks(range: &std::ops::Range<f64>) -> Vec<f64> {
    const STEPS: [&[f64]; 3] = [
        &[1.0, 2.0, 5.0],
        &[1.0, 2.0, 3.0, 5.0],
        &[
            1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0,
        ],
    ];
    let (first, last) = (
        range.start.log10().floor() as i32,
        range.end.log10().ceil() as i32,
    );
    let mut ticks = Vec::new();
    for steps in STEPS {
        ticks = (first..=last)
            // Dividing by 10^-d keeps 0.05 exactly the literal 0.05.
            .flat_map(|d| {
                steps.iter().map(move |m| match d {
                    0.. => m * 10f64.powi(d),
                    _ => m / 10f64.powi(-d),
                })
            })
            .filter(|v| range.contains(v))
            .collect();
        if ticks.len() >= 5 {
            break;
        }
    }
    ticks
}

/// A tick's label: as short as its value allows (2, 0.05, 1.5).
fn tick_label(v: f64) -> String {
    if v != 0.0 && v.abs() < 1e-3 {
        return format!("{v:.1e}");
    }
    let s = format!("{v:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
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
        let y = loss_range(lo, hi);
        if log_axis(lo, hi) {
            let ticks = log_ticks(&y);
            let chart = chart_on(&chart_area, title, x, y.log_scale().with_key_points(ticks))?;
            draw_series(chart, &train, &val)?;
        } else {
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
        .y_label_formatter(&|v| tick_label(*v))
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
        // Losses whose axis has no half ticks (the check below is for the step axis).
        let svg = svg_of(&[
            serde_json::json!({"step": 1, "train_loss": 20.0}),
            serde_json::json!({"step": 2, "train_loss": 15.0}),
            serde_json::json!({"step": 3, "train_loss": 12.0}),
            serde_json::json!({"step": 3, "val_loss": 13.0}),
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
        assert!(!log_axis(1.0, 1.9));
        assert!(!log_axis(0.0, 2.5));
        let svg = svg_of(&[
            serde_json::json!({"step": 1, "train_loss": 100.0}),
            serde_json::json!({"step": 2, "train_loss": 0.05}),
        ]);
        assert!(svg.contains("<svg"));
    }

    /// A language model's loss (5.6 → 1.8 nats) fills the axis: logarithmic, from just below
    /// its lowest loss (not from 0), with round ticks inside one decade.
    #[test]
    fn a_gpt_loss_curve_gets_a_fitted_log_axis_with_round_ticks() {
        let losses = [5.6, 3.1, 2.5, 2.2, 2.0, 1.9, 1.8];
        let range = loss_range(1.8, 5.6);
        assert!(log_axis(1.8, 5.6));
        assert!(range.start > 1.6 && range.end < 6.0, "{range:?}");
        assert_eq!(log_ticks(&range), [2.0, 2.5, 3.0, 3.5, 4.0, 5.0]);
        // A CNN's loss spans decades: 1-2-5 ticks.
        assert_eq!(
            log_ticks(&loss_range(0.05, 2.3)),
            [0.05, 0.1, 0.2, 0.5, 1.0, 2.0]
        );
        // A flat curve: linear and fitted.
        let flat = loss_range(1.0, 1.2);
        assert!(!log_axis(1.0, 1.2) && flat.start > 0.9, "{flat:?}");
        let rows: Vec<_> = losses
            .iter()
            .enumerate()
            .map(|(i, l)| serde_json::json!({"step": 10 * (i + 1), "train_loss": l}))
            .collect();
        let svg = svg_of(&rows);
        for label in ["2", "2.5", "3", "4", "5"] {
            assert!(svg.contains(&format!(">\n{label}\n<")), "no {label} tick");
        }
    }
}
