//! Server metrics in Prometheus' text format: counters, gauges and latency histograms
//! (time to first token, inter-token latency, request duration), updated lock-free by the
//! HTTP tasks and the scheduler thread and rendered on `GET /metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// A cumulative histogram with fixed upper bounds (seconds).
pub struct Histogram {
    bounds: &'static [f64],
    /// counts[i]: observations ≤ bounds[i] and > bounds[i - 1]; the last slot is +Inf.
    counts: Vec<AtomicU64>,
    /// Sum of observations in nanoseconds.
    sum_ns: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }
    pub fn observe(&self, seconds: f64) {
        let i = self.bounds.partition_point(|&b| b < seconds);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add((seconds.max(0.0) * 1e9) as u64, Ordering::Relaxed);
    }
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut acc = 0;
        for (i, c) in self.counts.iter().enumerate() {
            acc += c.load(Ordering::Relaxed);
            let le = self
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {acc}");
        }
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 * 1e-9;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {acc}");
    }
}

/// From 1 ms to 60 s: the first token waits for the queue and the prompt.
const TTFT_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// From 0.1 ms to 5 s: one decode step of the batch.
const ITL_BOUNDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];
const DURATION_BOUNDS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

macro_rules! counters {
    ($($name:ident: $help:literal),* $(,)?) => {
        /// Everything `/metrics` reports.
        pub struct Metrics {
            $(#[doc = $help] pub $name: AtomicU64,)*
            /// Requests waiting for a batch slot.
            pub queued: AtomicU64,
            /// Requests in the running batch.
            pub active: AtomicU64,
            pub time_to_first_token: Histogram,
            pub inter_token_latency: Histogram,
            pub request_duration: Histogram,
            /// Sequences per decode step.
            pub batch_size: Histogram,
        }
        impl Default for Metrics {
            fn default() -> Self {
                Metrics {
                    $($name: AtomicU64::new(0),)*
                    queued: AtomicU64::new(0),
                    active: AtomicU64::new(0),
                    time_to_first_token: Histogram::new(TTFT_BOUNDS),
                    inter_token_latency: Histogram::new(ITL_BOUNDS),
                    request_duration: Histogram::new(DURATION_BOUNDS),
                    batch_size: Histogram::new(BATCH_BOUNDS),
                }
            }
        }
        impl Metrics {
            fn render_counters(&self, out: &mut String) {
                $(
                    let name = concat!("sinter_", stringify!($name));
                    let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} counter\n{name} {}",
                        $help, self.$name.load(Ordering::Relaxed));
                )*
            }
        }
    };
}

const BATCH_BOUNDS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

counters! {
    requests_total: "Generation requests received (completions and chat).",
    requests_rejected_total: "Requests refused with 429 because the queue was full.",
    requests_invalid_total: "Requests refused with a 4xx error (bad JSON, bad values, auth).",
    requests_completed_total: "Requests that finished (stop sequence, end of text or length).",
    requests_cancelled_total: "Requests whose client went away, or cut off by shutdown.",
    requests_failed_total: "Requests that failed inside the model.",
    prompt_tokens_total: "Prompt tokens of admitted requests.",
    generation_tokens_total: "Tokens generated.",
    decode_steps_total: "Batched decode steps run.",
    prefill_steps_total: "Prompt prefill calls (chunks of a prompt computed apart from the decode steps).",
    prefix_reused_tokens_total: "Prompt tokens whose keys and values were copied from a cached shared prefix instead of computed.",
    embedding_requests_total: "Requests to /v1/embeddings.",
    embedding_tokens_total: "Tokens of the inputs embedded.",
}

impl Metrics {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_counters(&mut out);
        for (name, help, v) in [
            (
                "sinter_queue_length",
                "Requests waiting for a batch slot.",
                &self.queued,
            ),
            (
                "sinter_active_requests",
                "Requests in the running batch.",
                &self.active,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        self.time_to_first_token.render(
            &mut out,
            "sinter_time_to_first_token_seconds",
            "From a request's arrival to its first generated token.",
        );
        self.inter_token_latency.render(
            &mut out,
            "sinter_inter_token_latency_seconds",
            "Between consecutive tokens of one request.",
        );
        self.request_duration.render(
            &mut out,
            "sinter_request_duration_seconds",
            "From a request's arrival to its last token.",
        );
        self.batch_size.render(
            &mut out,
            "sinter_decode_batch_size",
            "Sequences decoded together per step.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_with_sum_and_count() {
        let m = Metrics::default();
        for s in [0.0005, 0.003, 0.003, 100.0] {
            m.time_to_first_token.observe(s);
        }
        Metrics::add(&m.requests_total, 3);
        let text = m.render();
        assert!(text.contains("sinter_requests_total 3"), "{text}");
        assert!(text.contains("sinter_time_to_first_token_seconds_bucket{le=\"0.001\"} 1"));
        assert!(text.contains("sinter_time_to_first_token_seconds_bucket{le=\"0.005\"} 3"));
        assert!(text.contains("sinter_time_to_first_token_seconds_bucket{le=\"60\"} 3"));
        assert!(text.contains("sinter_time_to_first_token_seconds_bucket{le=\"+Inf\"} 4"));
        assert!(text.contains("sinter_time_to_first_token_seconds_count 4"));
        assert!(text.contains("# TYPE sinter_queue_length gauge"));
        assert_eq!(m.time_to_first_token.count(), 4);
    }
}
