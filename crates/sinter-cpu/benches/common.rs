//! Timing helpers for the `harness = false` benches: interleaved rounds, medians, and the
//! machine line.

#![allow(dead_code)]

use std::time::{Duration, Instant};

/// Seconds per call of `f`: `warmup` untimed calls, then calls until `budget` has passed
/// (at least 3).
pub fn time(budget: Duration, mut f: impl FnMut()) -> Vec<f64> {
    f();
    let start = Instant::now();
    let mut t = Vec::new();
    while t.len() < 3 || (start.elapsed() < budget && t.len() < 10_000) {
        let t0 = Instant::now();
        f();
        t.push(t0.elapsed().as_secs_f64());
    }
    t
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        0.5 * (s[n / 2 - 1] + s[n / 2])
    }
}

/// `SINTER_BENCH_SECS` per case and round (default 0.5).
pub fn budget() -> Duration {
    Duration::from_secs_f64(
        std::env::var("SINTER_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0.5f64)
            .max(0.01),
    )
}

/// `SINTER_BENCH_ROUNDS` (default 3): each case is measured that many times, interleaved
/// with its competitors, and the repetitions are pooled.
pub fn rounds() -> usize {
    std::env::var("SINTER_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3usize)
        .max(1)
}

/// The `cargo bench -- FILTER` argument.
pub fn selected(name: &str) -> bool {
    std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .is_none_or(|f| name.contains(&f))
}

pub fn machine_line() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |k: &str| {
        info.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "?".into())
    };
    let flags = field("flags");
    let simd: Vec<&str> = flags
        .split_whitespace()
        .filter(|f| f.starts_with("avx") || *f == "fma")
        .collect();
    format!(
        "{} CPUs ({}), rayon pool {}, ISA used: {}; SIMD flags: {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        field("model name"),
        rayon::current_num_threads(),
        sinter_cpu::Isa::get().name(),
        simd.join(" ")
    )
}
