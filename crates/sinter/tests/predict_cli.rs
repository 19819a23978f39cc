//! `sinter predict` end to end: a digits CNN with BatchNorm trained with `--fuse-conv-bn`,
//! validation examples exported as PNG and classified (BatchNorm folded), the same pixels as a
//! CSV row giving the same probabilities, `--json`, and clear errors with a non-zero exit.

mod common;

use common::*;
use std::path::Path;

fn fails(args: &[&str]) -> String {
    let o = sinter(args);
    assert!(!o.status.success(), "{args:?} should fail");
    text(&o.stderr)
}

fn json(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&run_ok(args)).unwrap()
}

#[test]
fn predict_on_exported_digits() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let run_s = run.to_str().unwrap();
    run_ok(&[
        "train",
        "--quiet",
        "--model",
        "cnn-bn",
        "--fuse-conv-bn",
        "--epochs",
        "8",
        "--out",
        run_s,
    ]);
    // eval folds the BatchNorms and still scores the model.
    let e = run_ok(&["eval", "--checkpoint", run_s]);
    assert!(e.contains("accuracy"), "{e}");

    let mut correct = 0;
    for n in 0..6 {
        let png = dir.path().join(format!("digit{n}.png"));
        let png_s = png.to_str().unwrap();
        let out = run_ok(&[
            "predict",
            "--checkpoint",
            run_s,
            "--export-sample",
            &n.to_string(),
            png_s,
        ]);
        let label = out
            .trim()
            .rsplit("label ")
            .next()
            .unwrap()
            .trim_end_matches(')')
            .to_string();
        let p = json(&[
            "predict",
            "--checkpoint",
            run_s,
            "--json",
            "--top-k",
            "10",
            png_s,
        ]);
        let top = &p[0]["top"];
        assert_eq!(top.as_array().unwrap().len(), 10);
        let probs: Vec<f64> = top
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["probability"].as_f64().unwrap())
            .collect();
        assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-4, "{probs:?}");
        assert!(
            probs.windows(2).all(|w| w[0] >= w[1]),
            "most likely first: {probs:?}"
        );
        if top[0]["name"] == label.as_str() {
            correct += 1;
        }
        // The same pixels as a CSV row of raw values 0–16 give the same probabilities.
        let img = image::open(&png).unwrap().to_luma8();
        let row: Vec<String> = img
            .pixels()
            .map(|p| ((p[0] as f32 * 16.0 / 255.0).round() as u32).to_string())
            .collect();
        let csv = dir.path().join(format!("digit{n}.csv"));
        std::fs::write(&csv, format!("{}\n", row.join(","))).unwrap();
        let c = json(&[
            "predict",
            "--checkpoint",
            run_s,
            "--json",
            "--top-k",
            "10",
            csv.to_str().unwrap(),
        ]);
        assert_eq!(c[0]["row"], 1);
        assert_eq!(c[0]["top"], p[0]["top"], "CSV and PNG of sample {n} differ");
        if n == 0 {
            spreadsheet_csvs_read_the_same(run_s, dir.path(), &row, &c[0]["top"]);
        }
    }
    assert!(
        correct >= 5,
        "only {correct} of 6 exported validation digits classified as labelled"
    );

    // Text output: one line per input, top-k classes with percentages.
    let two = run_ok(&[
        "predict",
        "--checkpoint",
        run_s,
        "--top-k",
        "2",
        dir.path().join("digit0.png").to_str().unwrap(),
        dir.path().join("digit1.png").to_str().unwrap(),
    ]);
    let lines: Vec<&str> = two.lines().collect();
    assert_eq!(lines.len(), 2, "{two}");
    assert!(
        lines[0].contains("digit0.png: ") && lines[0].matches('%').count() == 2,
        "{two}"
    );

    bad_inputs(run_s, dir.path());
}

/// The CSV variants spreadsheets write (a UTF-8 byte-order mark as Excel's, a separator at
/// the end of each line, `;` separators after a header) read as the plain row does.
fn spreadsheet_csvs_read_the_same(run: &str, dir: &Path, row: &[String], top: &serde_json::Value) {
    let header: Vec<String> = (0..row.len()).map(|i| format!("px{i}")).collect();
    let variants = [
        ("bom", format!("\u{feff}{}\r\n", row.join(","))),
        ("trailing", format!("{},\n", row.join(","))),
        (
            "semicolons",
            format!("{}\n{};\n", header.join(";"), row.join(";")),
        ),
    ];
    for (name, content) in variants {
        let csv = dir.join(format!("{name}.csv"));
        std::fs::write(&csv, content).unwrap();
        let o = sinter(&[
            "predict",
            "--checkpoint",
            run,
            "--json",
            "--top-k",
            "10",
            csv.to_str().unwrap(),
        ]);
        let c: serde_json::Value = serde_json::from_str(&ok(&o)).unwrap();
        assert_eq!(&c[0]["top"], top, "{name}.csv reads differently");
    }
    // A file with only a header says so, and what a row is.
    let only = dir.join("header_only.csv");
    std::fs::write(&only, format!("{}\n", header.join(","))).unwrap();
    fails_with(
        &sinter(&["predict", "--checkpoint", run, only.to_str().unwrap()]),
        &["no rows of values", "read as a header", "64 numbers"],
    );
}

fn bad_inputs(run: &str, dir: &Path) {
    let garbage = dir.join("garbage.png");
    std::fs::write(&garbage, b"definitely not a PNG").unwrap();
    let e = fails(&["predict", "--checkpoint", run, garbage.to_str().unwrap()]);
    assert!(
        e.contains("garbage.png") && e.contains("not a PNG or JPEG"),
        "{e}"
    );

    let colour = dir.join("colour.png");
    image::RgbImage::from_fn(8, 8, |x, y| image::Rgb([x as u8 * 30, y as u8 * 30, 0]))
        .save(&colour)
        .unwrap();
    let e = fails(&["predict", "--checkpoint", run, colour.to_str().unwrap()]);
    assert!(e.contains("colour.png") && e.contains("grayscale"), "{e}");

    let wide = dir.join("wide.png");
    image::GrayImage::new(16, 8).save(&wide).unwrap();
    let e = fails(&["predict", "--checkpoint", run, wide.to_str().unwrap()]);
    assert!(e.contains("16×8") && e.contains("8×8"), "{e}");

    let e = fails(&[
        "predict",
        "--checkpoint",
        run,
        dir.join("missing.png").to_str().unwrap(),
    ]);
    assert!(e.contains("missing.png"), "{e}");
    let e = fails(&[
        "predict",
        "--checkpoint",
        run,
        "--export-sample",
        "100000",
        dir.join("x.png").to_str().unwrap(),
    ]);
    assert!(e.contains("360 examples"), "{e}");
    let e = fails(&["predict", "--checkpoint", run]);
    assert!(e.contains("images or CSV"), "{e}");
}
