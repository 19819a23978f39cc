//! f32 GEMM throughput of `Tensor::matmul` beside numpy's matmul (OpenBLAS) on the same
//! machine, in the same run.
//!
//!     cargo bench -p sinter-core --bench gemm            # 256³, 1024³, 2048³
//!     SINTER_GEMM_SIZES=512,4096 cargo bench -p sinter-core --bench gemm
//!
//! Each size is measured in `SINTER_BENCH_ROUNDS` rounds (default 2) of `SINTER_BENCH_SECS`
//! seconds (default 1), alternating sinter and numpy (`bench/numpy_gemm.py`), and the
//! repetitions of all rounds are pooled: the dev machine's speed drifts over seconds, and
//! alternating keeps the comparison fair. GFLOP/s = 2·n³ / time. Without python3 or numpy
//! the numpy columns say so (and how to install it) instead of failing.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{budget, machine_line, rounds, time_it, Stats};
use sinter_core::{DType, Device, Rng, Tensor};

fn numpy_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../bench/numpy_gemm.py")
}

fn python() -> String {
    std::env::var("SINTER_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// numpy's timings for an n×n×n product, or why there are none.
fn numpy_gemm(n: usize) -> Result<(Stats, String), String> {
    let script = numpy_script();
    let out = Command::new(python())
        .arg(&script)
        .arg("--times")
        .arg(format!("--secs={}", budget().as_secs_f64()))
        .arg(n.to_string())
        .output()
        .map_err(|e| {
            format!(
                "cannot run {}: {e}; install Python 3 and then `python3 -m pip install numpy`",
                python()
            )
        })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rfind(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim()
            .to_string();
        return Err(if out.status.code() == Some(2) {
            "numpy is not installed: install it with `python3 -m pip install numpy` (or run bench/run-cpu)".to_string()
        } else {
            format!("{} failed ({}): {last}", script.display(), out.status)
        });
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("numpy_gemm "))
        .ok_or_else(|| format!("no result line from {}", script.display()))?;
    let times: Vec<f64> = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("times_s="))
        .ok_or("no times_s= field")?
        .split(',')
        .map(|t| t.parse::<f64>().map_err(|e| format!("bad time {t:?}: {e}")))
        .collect::<Result<_, _>>()?;
    let blas = line
        .split("blas=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap_or("?")
        .to_string();
    Ok((Stats { times }, blas))
}

/// Checks a few entries of a·b against a float64 dot product, so a fast wrong kernel cannot pass.
fn check(a: &[f32], b: &[f32], c: &[f32], n: usize) {
    for &(i, j) in &[(0, 0), (n - 1, n - 1), (n / 3, 2 * n / 3), (n / 2, 1)] {
        let want: f64 = (0..n)
            .map(|p| a[i * n + p] as f64 * b[p * n + j] as f64)
            .sum();
        let got = c[i * n + j] as f64;
        assert!(
            (got - want).abs() <= 1e-3 * (1.0 + want.abs()) + 1e-4 * n as f64,
            "matmul wrong at ({i}, {j}): {got} vs {want}"
        );
    }
}

fn gflops(n: usize, secs: f64) -> f64 {
    2.0 * (n as f64).powi(3) / secs / 1e9
}

fn main() {
    let sizes: Vec<usize> = std::env::var("SINTER_GEMM_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![256, 1024, 2048]);
    if !common::selected("gemm") {
        return;
    }
    println!("## f32 GEMM, C = A·B, all operands n×n row-major");
    println!();
    println!(
        "{}; {} round(s) × {:.1} s per side and size, alternating sinter and numpy",
        machine_line(),
        rounds(),
        budget().as_secs_f64()
    );
    println!();
    let mut blas_seen = None;
    let mut notes = Vec::new();
    let mut rows = Vec::new();
    for &n in &sizes {
        let mut rng = Rng::new(n as u64);
        let a = Tensor::randn(&[n, n], 0.0, 1.0, &mut rng, DType::F32, Device::Cpu).unwrap();
        let b = Tensor::randn(&[n, n], 0.0, 1.0, &mut rng, DType::F32, Device::Cpu).unwrap();
        check(
            &a.to_vec_f32().unwrap(),
            &b.to_vec_f32().unwrap(),
            &a.matmul(&b).unwrap().to_vec_f32().unwrap(),
            n,
        );
        let (mut ours, mut theirs, mut numpy_err) = (Vec::new(), Vec::new(), None);
        for _ in 0..rounds() {
            ours.push(time_it(2, budget(), 3, 200, || {
                std::hint::black_box(a.matmul(&b).unwrap());
            }));
            if numpy_err.is_none() {
                match numpy_gemm(n) {
                    Ok((s, blas)) => {
                        theirs.push(s);
                        blas_seen = Some(blas);
                    }
                    Err(e) => numpy_err = Some(e),
                }
            }
        }
        let ours = Stats::merge(&ours);
        let (s_med, s_best) = (gflops(n, ours.median()), gflops(n, ours.best()));
        let row = match (&numpy_err, theirs.is_empty()) {
            (None, false) => {
                let t = Stats::merge(&theirs);
                let (t_med, t_best) = (gflops(n, t.median()), gflops(n, t.best()));
                format!(
                    "| {n}³ | {s_med:.1} | {s_best:.1} | {} | {t_med:.1} | {t_best:.1} | {} | **{:.2}×** | {:.2}× |",
                    ours.reps(),
                    t.reps(),
                    s_med / t_med,
                    s_best / t_best
                )
            }
            _ => {
                let why = numpy_err
                    .clone()
                    .unwrap_or_else(|| "no numpy timings".into());
                if !notes.contains(&why) {
                    notes.push(why);
                }
                format!(
                    "| {n}³ | {s_med:.1} | {s_best:.1} | {} | n/a | n/a | – | n/a | n/a |",
                    ours.reps()
                )
            }
        };
        rows.push(row);
    }
    println!("| size | sinter median GFLOP/s | sinter best | reps | numpy median GFLOP/s | numpy best | reps | ratio (median) | ratio (best) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!("{r}");
    }
    println!();
    if let Some(blas) = blas_seen {
        println!("numpy: {blas}");
    }
    for n in notes {
        println!("numpy: n/a — {n}");
    }
    println!();
}
