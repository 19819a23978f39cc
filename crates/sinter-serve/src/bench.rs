//! The load generator behind `sinter bench serve`: N concurrent clients stream completions
//! from a server on this machine until a fixed number of requests is done (or a time limit
//! passes), measuring time to first token and the gaps between streamed chunks as a client
//! sees them, and checking that every request finished exactly once (unique response ids,
//! `[DONE]` received, and the server's completed-request counter moved by the same count).

use std::borrow::Cow;
use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::thread_cpu::{CpuSplit, Role, Snapshot};

#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// `http://127.0.0.1:PORT` (loopback only).
    pub base_url: String,
    pub model: String,
    pub api_key: Option<String>,
    pub concurrency: usize,
    pub requests: usize,
    pub prompt: String,
    pub max_tokens: usize,
    pub temperature: f64,
    /// The whole run stops after this long (the requests not done count as errors).
    pub time_limit: Duration,
    /// Threads of the clients' runtime (`run_load_blocking`).
    pub client_threads: usize,
}

/// What one run at one concurrency measured.
#[derive(Clone, Debug, Default)]
pub struct LoadReport {
    pub concurrency: usize,
    pub requests: usize,
    pub ok: usize,
    pub errors: usize,
    /// The first few error messages.
    pub error_samples: Vec<String>,
    pub wall_s: f64,
    pub completion_tokens: u64,
    /// Seconds from sending a request to its first text.
    pub ttft: Vec<f64>,
    /// Seconds between consecutive text chunks of a request.
    pub itl: Vec<f64>,
    /// Responses whose id was seen before (must be 0).
    pub duplicate_ids: usize,
    /// How much the server's `sinter_requests_completed_total` moved (None: not readable).
    pub server_completed: Option<u64>,
    /// CPU time of this process's threads over the run, by role (None: not Linux). The
    /// engine and HTTP roles are empty when the server runs in another process.
    pub cpu: Option<CpuSplit>,
}

/// The p-quantile (0..=1) of `v` by nearest rank; NaN when empty.
pub fn quantile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

impl LoadReport {
    pub fn requests_per_s(&self) -> f64 {
        self.ok as f64 / self.wall_s
    }
    pub fn tokens_per_s(&self) -> f64 {
        self.completion_tokens as f64 / self.wall_s
    }
    /// Every request finished once and the server agrees.
    pub fn is_clean(&self) -> bool {
        self.errors == 0
            && self.ok == self.requests
            && self.duplicate_ids == 0
            && self.server_completed.is_none_or(|n| n == self.ok as u64)
    }
    pub fn table_header() -> &'static str {
        "| concurrency | requests | errors | wall s | requests/s | tokens/s | TTFT p50 ms | TTFT p99 ms | inter-token p50 ms | inter-token p99 ms | server completed | CPU µs per token: engine / HTTP / clients / other | cores busy |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    }

    /// CPU microseconds per completion token spent by `role`'s threads.
    pub fn cpu_us_per_token(&self, role: Role) -> Option<f64> {
        let cpu = self.cpu?;
        (self.completion_tokens > 0)
            .then(|| cpu.get(role).as_secs_f64() * 1e6 / self.completion_tokens as f64)
    }

    /// This process's CPU time over the run ÷ wall time: how many cores it kept busy.
    pub fn cores_busy(&self) -> Option<f64> {
        let cpu = self.cpu?;
        (self.wall_s > 0.0).then(|| cpu.total().as_secs_f64() / self.wall_s)
    }

    fn cpu_cells(&self) -> (String, String) {
        let per_token: Option<Vec<String>> = Role::ALL
            .iter()
            .map(|&r| self.cpu_us_per_token(r).map(|us| format!("{us:.1}")))
            .collect();
        (
            per_token.map_or("?".into(), |v| v.join(" / ")),
            self.cores_busy().map_or("?".into(), |c| format!("{c:.2}")),
        )
    }
    pub fn table_row(&self) -> String {
        let (per_token, busy) = self.cpu_cells();
        format!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.0} | {:.1} | {:.1} | {:.2} | {:.2} | {} | {per_token} | {busy} |",
            self.concurrency,
            self.ok,
            self.errors,
            self.wall_s,
            self.requests_per_s(),
            self.tokens_per_s(),
            quantile(&self.ttft, 0.5) * 1e3,
            quantile(&self.ttft, 0.99) * 1e3,
            quantile(&self.itl, 0.5) * 1e3,
            quantile(&self.itl, 0.99) * 1e3,
            self.server_completed
                .map_or("?".to_string(), |n| n.to_string())
        )
    }
}

/// Refuses any target but this machine: the load generator never sends traffic elsewhere.
pub fn check_loopback(base_url: &str) -> Result<()> {
    let rest = base_url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("--url must start with http:// (got {base_url})"))?;
    let authority = rest.split('/').next().unwrap_or("");
    let host = if let Some(h) = authority.strip_prefix('[') {
        h.split(']').next().unwrap_or("")
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    let loopback = host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        bail!("the load generator only targets this machine (127.0.0.0/8, ::1, localhost); got host '{host}'");
    }
    Ok(())
}

/// Reads `sinter_requests_completed_total` from the server's `/metrics`.
async fn completed_count(client: &reqwest::Client, base: &str) -> Option<u64> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("sinter_requests_completed_total "))
        .and_then(|v| v.trim().parse().ok())
}

/// What the load generator reads from a stream chunk (the other fields are skipped; the
/// strings are borrowed from the event unless they hold escapes).
#[derive(Deserialize)]
struct ChunkView<'a> {
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    choices: Vec<ChoiceView<'a>>,
    usage: Option<UsageView>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct ChoiceView<'a> {
    #[serde(default, borrow)]
    text: Cow<'a, str>,
}

#[derive(Deserialize)]
struct UsageView {
    completion_tokens: u64,
}

/// Splits a byte stream into server-sent events (each ends with a blank line) in place:
/// `push` appends what arrived, `next_event` hands out each complete event once, in order.
#[derive(Default)]
pub struct SseBuffer {
    buf: Vec<u8>,
    /// Where the next event begins.
    start: usize,
    /// Where the search for its end goes on (the bytes before hold no "\n\n").
    scanned: usize,
}

impl SseBuffer {
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.scanned -= self.start;
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete event, without its closing blank line.
    pub fn next_event(&mut self) -> Option<&[u8]> {
        match self.buf[self.scanned..]
            .windows(2)
            .position(|w| w == b"\n\n")
        {
            Some(i) => {
                let (begin, end) = (self.start, self.scanned + i);
                self.start = end + 2;
                self.scanned = self.start;
                Some(&self.buf[begin..end])
            }
            None => {
                // The last byte may be the first half of the separator.
                self.scanned = self.buf.len().saturating_sub(1).max(self.start);
                None
            }
        }
    }
}

/// The data of an event (its `data: ` line; comments and other fields have none).
pub fn sse_data(event: &[u8]) -> Option<&[u8]> {
    event
        .split(|&b| b == b'\n')
        .find_map(|line| line.strip_prefix(b"data: "))
}

/// One streamed request's measurements.
struct Streamed {
    id: String,
    tokens: u64,
    ttft: Option<f64>,
    gaps: Vec<f64>,
}

async fn one_request(client: &reqwest::Client, o: &LoadOptions, seed: usize) -> Result<Streamed> {
    let body = json!({
        "model": o.model,
        "prompt": o.prompt,
        "max_tokens": o.max_tokens,
        "temperature": o.temperature,
        "seed": seed,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let mut req = client
        .post(format!("{}/v1/completions", o.base_url))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(k) = &o.api_key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let sent = Instant::now();
    let resp = req.send().await.context("request failed")?;
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        bail!("HTTP {status}: {text}");
    }
    let mut out = Streamed {
        id: String::new(),
        tokens: 0,
        ttft: None,
        gaps: Vec::new(),
    };
    let mut last = sent;
    let mut events = SseBuffer::default();
    let mut body = resp.bytes_stream();
    let mut done = false;
    let mut text_events = 0u64;
    let mut usage = None;
    while let Some(chunk) = body.next().await {
        events.push(&chunk.context("stream broken")?);
        while let Some(event) = events.next_event() {
            let Some(data) = sse_data(event) else {
                continue;
            };
            if data == b"[DONE]" {
                done = true;
                continue;
            }
            let c: ChunkView = serde_json::from_slice(data).context("a chunk is not JSON")?;
            if let Some(e) = c.error {
                bail!("error event: {e}");
            }
            match c.id {
                Some(id) if out.id.is_empty() => out.id = id.into_owned(),
                Some(id) if id != out.id => bail!("the chunks' id changed from {} to {id}", out.id),
                _ => {}
            }
            if let Some(u) = c.usage {
                usage = Some(u.completion_tokens);
            }
            if c.choices.first().is_some_and(|c| !c.text.is_empty()) {
                text_events += 1;
                let now = Instant::now();
                match out.ttft {
                    None => out.ttft = Some((now - sent).as_secs_f64()),
                    Some(_) => out.gaps.push((now - last).as_secs_f64()),
                }
                last = now;
            }
        }
    }
    if !done {
        bail!("the stream ended without [DONE]");
    }
    // Every token makes at most one text event (a character split across tokens waits for
    // its last byte; the end-of-text token makes none).
    out.tokens = usage.ok_or_else(|| anyhow!("the stream had no usage chunk"))?;
    if text_events > out.tokens {
        bail!(
            "{text_events} text events for {} completion tokens",
            out.tokens
        );
    }
    Ok(out)
}

/// Runs `o.requests` streamed completions over `o.concurrency` clients.
pub async fn run_load(o: &LoadOptions) -> Result<LoadReport> {
    check_loopback(&o.base_url)?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(o.concurrency.max(1))
        .no_proxy()
        .build()?;
    let before = completed_count(&client, &o.base_url).await;
    let next = Arc::new(AtomicUsize::new(0));
    let report = Arc::new(Mutex::new(LoadReport {
        concurrency: o.concurrency,
        requests: o.requests,
        ..Default::default()
    }));
    let ids = Arc::new(Mutex::new(HashSet::new()));
    let cpu_before = Snapshot::take();
    let start = Instant::now();
    let deadline = start + o.time_limit;
    let workers: Vec<_> = (0..o.concurrency.max(1))
        .map(|_| {
            let (client, o, next, report, ids) = (
                client.clone(),
                o.clone(),
                next.clone(),
                report.clone(),
                ids.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= o.requests {
                        break;
                    }
                    let left = deadline.saturating_duration_since(Instant::now());
                    let r = tokio::time::timeout(left, one_request(&client, &o, i))
                        .await
                        .unwrap_or_else(|_| Err(anyhow!("time limit reached")));
                    let mut rep = report.lock().unwrap();
                    match r {
                        Ok(s) => {
                            rep.ok += 1;
                            rep.completion_tokens += s.tokens;
                            rep.ttft.extend(s.ttft);
                            rep.itl.extend(s.gaps);
                            if !ids.lock().unwrap().insert(s.id) {
                                rep.duplicate_ids += 1;
                            }
                        }
                        Err(e) => {
                            rep.errors += 1;
                            if rep.error_samples.len() < 5 {
                                rep.error_samples.push(format!("{e:#}"));
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await?;
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_before.zip(Snapshot::take()).map(|(b, a)| a.since(&b));
    let after = completed_count(&client, &o.base_url).await;
    let mut rep = report.lock().unwrap().clone();
    rep.wall_s = wall;
    rep.cpu = cpu;
    rep.server_completed = before.zip(after).map(|(b, a)| a - b);
    Ok(rep)
}

/// `run_load` on a runtime of its own (for callers without one, like the CLI).
pub fn run_load_blocking(o: &LoadOptions) -> Result<LoadReport> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(o.client_threads.max(1))
        .thread_name("sinter-bench-client")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(run_load(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_targets() {
        for ok in [
            "http://127.0.0.1:8080",
            "http://127.9.9.9:1/x",
            "http://localhost:80",
            "http://[::1]:8080",
        ] {
            check_loopback(ok).unwrap();
        }
        for bad in [
            "http://10.0.0.1:8080",
            "http://example.com",
            "https://127.0.0.1:1",
            "http://0.0.0.0:1",
        ] {
            assert!(check_loopback(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
        assert!(quantile(&[], 0.5).is_nan());
    }
}
