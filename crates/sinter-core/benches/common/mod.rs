//! A small timing loop for the `harness = false` benches (no criterion: it would double the
//! bench build time on a 2-core machine). Shared by this crate's bench files.

#![allow(dead_code)]

use std::time::{Duration, Instant};

/// Timings of one measured function, in seconds per call.
#[derive(Clone, Debug)]
pub struct Stats {
    pub times: Vec<f64>,
}

impl Stats {
    pub fn median(&self) -> f64 {
        let mut t = self.times.clone();
        t.sort_by(f64::total_cmp);
        let n = t.len();
        if n % 2 == 1 {
            t[n / 2]
        } else {
            0.5 * (t[n / 2 - 1] + t[n / 2])
        }
    }
    pub fn best(&self) -> f64 {
        self.times.iter().copied().fold(f64::INFINITY, f64::min)
    }
    pub fn reps(&self) -> usize {
        self.times.len()
    }
    /// Pools the repetitions of several measurements of the same thing.
    pub fn merge(parts: &[Stats]) -> Stats {
        Stats {
            times: parts.iter().flat_map(|s| s.times.iter().copied()).collect(),
        }
    }
}

/// Runs `f` `warmup` times untimed, then times it until `budget` has passed and at least
/// `min_reps` calls were made, or `max_reps` calls were made.
pub fn time_it(
    warmup: usize,
    budget: Duration,
    min_reps: usize,
    max_reps: usize,
    mut f: impl FnMut(),
) -> Stats {
    for _ in 0..warmup {
        f();
    }
    let start = Instant::now();
    let mut times = Vec::new();
    while times.len() < max_reps && (times.len() < min_reps || start.elapsed() < budget) {
        let t0 = Instant::now();
        f();
        times.push(t0.elapsed().as_secs_f64());
    }
    Stats { times }
}

/// The measurement budget per case: `SINTER_BENCH_SECS` seconds (default 1).
pub fn budget() -> Duration {
    let secs = std::env::var("SINTER_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(1.0);
    Duration::from_secs_f64(secs.max(0.01))
}

/// How many times each case is measured, alternating with its reference when it has one:
/// `SINTER_BENCH_ROUNDS` (default 2). The shared dev machine's speed drifts by tens of percent
/// over seconds, so alternating rounds keeps a comparison fair.
pub fn rounds() -> usize {
    std::env::var("SINTER_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(2)
        .max(1)
}

/// The command-line filter `cargo bench -- NAME` passes (flags such as `--bench` skipped).
pub fn filter() -> Option<String> {
    std::env::args().skip(1).find(|a| !a.starts_with('-'))
}

pub fn selected(name: &str) -> bool {
    filter().is_none_or(|f| name.contains(&f))
}

/// The CPU count, CPU model and rayon pool size, for the table header.
pub fn machine_line() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!(
        "{cpus} CPUs ({model}), rayon pool {} threads",
        rayon_threads()
    )
}

fn rayon_threads() -> usize {
    rayon::current_num_threads()
}
