//! The real server on a loopback port, driven over HTTP: every endpoint, streamed and not,
//! stop sequences, seeds, every bad request, the API key, a full queue (429), clients that
//! disconnect (their slot is freed), graceful shutdown (503 on open connections), the
//! connection timeouts, and requests that are not HTTP. The model is a tiny random byte-level
//! GPT, so the text is gibberish but fully determined by the seed.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sinter_serve::{ServeOptions, Server, Timeouts, Tokenizer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;

const MODEL: &str = "tiny";

fn options() -> ServeOptions {
    ServeOptions {
        port: 0,
        model_name: MODEL.into(),
        max_batch: 4,
        max_queue: 4,
        max_tokens: 1_000_000,
        ..Default::default()
    }
}

fn start(o: ServeOptions) -> (Server, String) {
    let server = Server::start(common::tiny_gpt(1), Tokenizer::Bytes, o).unwrap();
    let url = format!("http://{}", server.addr());
    (server, url)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn post(url: &str, path: &str, body: &str) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = client()
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    let text = r.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, headers, v)
}

async fn get(url: &str, path: &str) -> (u16, String) {
    let r = client().get(format!("{url}{path}")).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn complete(url: &str, body: Value) -> Value {
    let (status, _, v) = post(url, "/v1/completions", &body.to_string()).await;
    assert_eq!(status, 200, "{v}");
    v
}

/// The data lines of a server-sent event stream, parsed (`[DONE]` as a string).
async fn stream(url: &str, path: &str, body: Value) -> Vec<Value> {
    let r = client()
        .post(format!("{url}{path}"))
        .json_body(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let text = r.text().await.unwrap();
    text.split("\n\n")
        .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| {
            if d == "[DONE]" {
                Value::String(d.into())
            } else {
                serde_json::from_str(d).unwrap()
            }
        })
        .collect()
}

trait JsonBody {
    fn json_body(self, v: &Value) -> Self;
}
impl JsonBody for reqwest::RequestBuilder {
    fn json_body(self, v: &Value) -> Self {
        self.header("content-type", "application/json")
            .body(v.to_string())
    }
}

async fn metric(url: &str, name: &str) -> u64 {
    let (_, text) = get(url, "/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
        .trim()
        .parse()
        .unwrap()
}

/// A short completion of `n` tokens still goes through.
async fn still_serves(url: &str, n: u64) {
    let v = complete(
        url,
        json!({"model": MODEL, "prompt": "next", "max_tokens": n}),
    )
    .await;
    assert_eq!(v["usage"]["completion_tokens"], n);
}

/// Polls `cond` until it holds (10 s at most).
async fn eventually(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let t0 = Instant::now();
    while !cond().await {
        assert!(t0.elapsed() < Duration::from_secs(10), "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_metrics_and_unknown_routes() {
    let (server, url) = start(options());
    let (status, body) = get(&url, "/v1/models").await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 200);
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(v["data"][0]["context_length"], 64);
    let (status, body) = get(&url, &format!("/v1/models/{MODEL}")).await;
    assert_eq!(
        (
            status,
            serde_json::from_str::<Value>(&body).unwrap()["id"].clone()
        ),
        (200, json!(MODEL))
    );
    let (status, body) = get(&url, "/v1/models/gpt-4").await;
    assert_eq!(status, 404);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["code"],
        "model_not_found"
    );
    assert_eq!(
        get(&url, "/health").await,
        (200, r#"{"status":"ok"}"#.into())
    );
    let (status, text) = get(&url, "/metrics").await;
    assert_eq!(status, 200);
    for name in [
        "sinter_requests_total",
        "sinter_generation_tokens_total",
        "sinter_queue_length",
        "sinter_time_to_first_token_seconds_bucket",
        "sinter_inter_token_latency_seconds_bucket",
    ] {
        assert!(text.contains(name), "{name} missing");
    }
    let (status, body) = get(&url, "/v2/nothing").await;
    assert_eq!(status, 404);
    assert!(body.contains("POST /v1/completions"), "{body}");
    let (status, body) = get(&url, "/v1/completions").await;
    assert_eq!(status, 405);
    assert!(serde_json::from_str::<Value>(&body).unwrap()["error"]["message"].is_string());
    server.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_streamed_and_not_agree() {
    let (server, url) = start(options());
    let body = json!({"model": MODEL, "prompt": "ROMEO:", "max_tokens": 12, "temperature": 0});
    let v = complete(&url, body.clone()).await;
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["model"], MODEL);
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["index"], 0);
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 6, "completion_tokens": 12, "total_tokens": 18})
    );
    let text = choice["text"].as_str().unwrap().to_string();
    assert!(!text.is_empty());

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let chunks = stream(&url, "/v1/completions", sbody).await;
    assert_eq!(chunks.last().unwrap(), "[DONE]");
    let usage = &chunks[chunks.len() - 2];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 12);
    let finals = &chunks[chunks.len() - 3];
    assert_eq!(finals["choices"][0]["finish_reason"], "length");
    let deltas = &chunks[..chunks.len() - 3];
    assert!(deltas.len() >= 2, "text arrives in pieces: {deltas:?}");
    let mut streamed = String::new();
    for c in deltas {
        assert_eq!(c["object"], "text_completion");
        assert_eq!(c["choices"][0]["finish_reason"], Value::Null);
        streamed.push_str(c["choices"][0]["text"].as_str().unwrap());
    }
    assert_eq!(streamed, text);
    // Every chunk of one response carries its id.
    let ids: std::collections::HashSet<_> = chunks[..chunks.len() - 1]
        .iter()
        .map(|c| c["id"].clone())
        .collect();
    assert_eq!(ids.len(), 1);
    // A token-id prompt is the same prompt.
    let mut tbody = body.clone();
    tbody["prompt"] = json!("ROMEO:".bytes().collect::<Vec<u8>>());
    assert_eq!(
        complete(&url, tbody).await["choices"][0]["text"],
        text.as_str()
    );
    server.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_streamed_and_not() {
    let (server, url) = start(options());
    let body = json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"}
        ],
        "max_tokens": 10,
        "temperature": 0,
    });
    let (status, _, v) = post(&url, "/v1/chat/completions", &body.to_string()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    let content = msg["content"].as_str().unwrap().to_string();
    // The template: "Be brief.\n\nUser: Hi\nAssistant:" is 30 bytes.
    assert_eq!(v["usage"]["prompt_tokens"], 30);
    let reason = v["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(reason == "length" || reason == "stop");

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let chunks = stream(&url, "/v1/chat/completions", sbody).await;
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks.last().unwrap(), "[DONE]");
    let n = chunks.len();
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], reason);
    assert_eq!(chunks[n - 2]["choices"][0]["delta"], json!({}));
    let streamed: String = chunks[1..n - 2]
        .iter()
        .map(|c| {
            assert_eq!(c["object"], "chat.completion.chunk");
            c["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(streamed, content);
    server.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sequences_end_the_text_before_them() {
    let (server, url) = start(options());
    let base = json!({"model": MODEL, "prompt": "abc", "max_tokens": 40, "temperature": 0});
    let full = complete(&url, base.clone()).await["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 8, "{full:?}");
    // A stop sequence taken from the text: the completion ends where it first appears.
    let stop: String = chars[4..6].iter().collect();
    let want = &full[..full.find(&stop).unwrap()];
    let mut body = base.clone();
    body["stop"] = json!(["never-there", stop]);
    let v = complete(&url, body.clone()).await;
    assert_eq!(v["choices"][0]["text"], want);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() < 40);
    body["stream"] = json!(true);
    let chunks = stream(&url, "/v1/completions", body).await;
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, want);
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        "stop"
    );
    server.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_gives_the_same_text_alone_or_in_a_batch() {
    let (server, url) = start(options());
    let body = |seed: u64| json!({"model": MODEL, "prompt": "To be", "max_tokens": 30, "temperature": 1.0, "top_p": 0.9, "seed": seed});
    let text = |v: Value| v["choices"][0]["text"].as_str().unwrap().to_string();
    let a = text(complete(&url, body(7)).await);
    let b = text(complete(&url, body(7)).await);
    let c = text(complete(&url, body(8)).await);
    assert_eq!(a, b);
    assert_ne!(a, c);
    // Four at once (decoded together): the same text as alone.
    let together = futures_util::future::join_all((0..4).map(|_| complete(&url, body(7)))).await;
    for v in together {
        assert_eq!(text(v), a);
    }
    server.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_of_different_seeds_in_one_batch_each_give_their_own_text() {
    // A batch's next tokens are drawn on several threads at once: each request must still
    // draw from its own logits with its own generator, greedy ones and sampled ones mixed.
    let (server, url) = start(options());
    let body = |seed: u64| {
        let temperature = if seed.is_multiple_of(3) { 0.0 } else { 1.0 };
        json!({"model": MODEL, "prompt": format!("To be {seed}"), "max_tokens": 24, "temperature": temperature, "seed": seed})
    };
    let text = |v: Value| v["choices"][0]["text"].as_str().unwrap().to_string();
    let mut alone = Vec::new();
    for seed in 0..6 {
        alone.push(text(complete(&url, body(seed)).await));
    }
    let together = futures_util::future::join_all((0..6).map(|s| complete(&url, body(s)))).await;
    for (seed, v) in together.into_iter().enumerate() {
        assert_eq!(text(v), alone[seed], "seed {seed}");
    }
    server.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let (server, url) = start(ServeOptions {
        max_tokens: 100,
        max_body_bytes: 4096,
        ..options()
    });
    let long_prompt = "x".repeat(65);
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        ("/v1/completions", "{\"model\": ".into(), 400, None),
        ("/v1/completions", "not json at all".into(), 400, None),
        ("/v1/completions", r#"[1, 2]"#.into(), 400, None),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "a", "max_tokens": "ten"}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": 42}).to_string(),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "a", "temperature": "hot"}).to_string(),
            400,
            Some("temperature"),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "a", "stream": "yes"}).to_string(),
            400,
            Some("stream"),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "a", "max_tokens": 0}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "a", "max_tokens": -3}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "a", "max_tokens": 101}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "a", "temperature": -0.5}).to_string(),
            400,
            Some("temperature"),
        ),
        (
            "/v1/completions",
            r#"{"model": "tiny", "prompt": "a", "temperature": NaN}"#.into(),
            400,
            None,
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "a", "top_p": 1.5}).to_string(),
            400,
            Some("top_p"),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "a", "n": 3}).to_string(),
            400,
            Some("n"),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": long_prompt}).to_string(),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": ""}).to_string(),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"model": "gpt-4", "prompt": "a"}).to_string(),
            404,
            Some("model"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a"}).to_string(),
            400,
            Some("model"),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "a", "stop": ""}).to_string(),
            400,
            Some("stop"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": []}).to_string(),
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": "hi"}).to_string(),
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}).to_string(),
            400,
            Some("messages.[0]"),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "a".repeat(5000)}).to_string(),
            413,
            None,
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "response_format": "json"}).to_string(),
            400,
            Some("response_format"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}}).to_string(),
            400,
            Some("response_format"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}}).to_string(),
            400,
            Some("response_format"),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "a", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "x+"}}}}}}).to_string(),
            400,
            Some("response_format"),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "a", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"type": "datetime"}}}}}}).to_string(),
            400,
            Some("response_format"),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "a", "max_tokens": 1, "response_format": {"type": "json_object"}}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/embeddings",
            json!({"model": MODEL, "input": "a"}).to_string(),
            400,
            Some("model"),
        ),
    ];
    for (path, body, status, param) in &cases {
        let (got, _, v) = post(&url, path, body).await;
        assert_eq!(got, *status, "{body:.80}: {v}");
        if body.contains("pattern") {
            let m = v["error"]["message"].as_str().unwrap();
            assert!(
                m.contains("'pattern'") && m.contains("/properties/a"),
                "{m}"
            );
        }
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string(), "{v}");
        if let Some(p) = param {
            assert_eq!(e["param"], *p, "{body:.80}: {v}");
        }
    }
    assert_eq!(
        metric(&url, "sinter_requests_invalid_total").await,
        cases.len() as u64
    );
    still_serves(&url, 3).await;
    server.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_guards_v1_only() {
    let (server, url) = start(ServeOptions {
        api_key: Some("s3cret".into()),
        ..options()
    });
    let body = json!({"model": MODEL, "prompt": "a", "max_tokens": 2}).to_string();
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer s3cre"),
        Some("s3cret"),
    ] {
        let mut r = client()
            .post(format!("{url}/v1/completions"))
            .body(body.clone());
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 401, "{auth:?}");
        let v: Value = r.json_text().await;
        assert_eq!(v["error"]["type"], "authentication_error");
    }
    let r = client()
        .post(format!("{url}/v1/completions"))
        .header("authorization", "Bearer s3cret")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = client()
        .get(format!("{url}/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(get(&url, "/health").await.0, 200);
    assert_eq!(get(&url, "/metrics").await.0, 200);
    server.shutdown().unwrap();
}

trait JsonText {
    async fn json_text(self) -> Value;
}
impl JsonText for reqwest::Response {
    async fn json_text(self) -> Value {
        serde_json::from_str(&self.text().await.unwrap()).unwrap()
    }
}

/// Opens a streamed completion that would run for a long time and waits for its first
/// chunk; dropping the returned response disconnects.
async fn endless_stream(url: &str) -> reqwest::Response {
    let body = json!({"model": MODEL, "prompt": "go", "max_tokens": 1_000_000, "stream": true});
    let mut r = client()
        .post(format!("{url}/v1/completions"))
        .json_body(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let first = r.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_gets_429_and_a_disconnect_frees_its_slot() {
    let (server, url) = start(ServeOptions {
        max_batch: 1,
        max_queue: 1,
        ..options()
    });
    let running = endless_stream(&url).await;
    assert_eq!(metric(&url, "sinter_active_requests").await, 1);
    // The second request waits in the queue...
    let queued = {
        let url = url.clone();
        tokio::spawn(async move {
            complete(
                &url,
                json!({"model": MODEL, "prompt": "next", "max_tokens": 3}),
            )
            .await
        })
    };
    eventually("a queued request", async || {
        metric(&url, "sinter_queue_length").await == 1
    })
    .await;
    // ... and the third is refused.
    let (status, headers, v) = post(
        &url,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "x"}).to_string(),
    )
    .await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert_eq!(metric(&url, "sinter_requests_rejected_total").await, 1);
    // The endless stream's client goes away: its slot goes to the queued request.
    drop(running);
    let v = tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .expect("the queued request never ran")
        .unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(metric(&url, "sinter_requests_cancelled_total").await, 1);
    assert_eq!(metric(&url, "sinter_requests_completed_total").await, 1);
    eventually("an idle server", async || {
        metric(&url, "sinter_active_requests").await == 0
    })
    .await;
    server.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_waiting_for_a_whole_response_frees_its_slot() {
    let (server, url) = start(ServeOptions {
        max_batch: 1,
        max_queue: 0,
        ..options()
    });
    let body = json!({"model": MODEL, "prompt": "go", "max_tokens": 1_000_000});
    let r = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap()
        .post(format!("{url}/v1/completions"))
        .json_body(&body)
        .send()
        .await;
    assert!(r.unwrap_err().is_timeout());
    eventually("the slot freed", async || {
        metric(&url, "sinter_requests_cancelled_total").await == 1
    })
    .await;
    still_serves(&url, 2).await;
    server.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_requests_in_flight_then_refuses_connections() {
    let (server, url) = start(ServeOptions {
        shutdown_timeout: Duration::from_secs(20),
        ..options()
    });
    let body = json!({"model": MODEL, "prompt": "go", "max_tokens": 400, "stream": true});
    let mut r = client()
        .post(format!("{url}/v1/completions"))
        .json_body(&body)
        .send()
        .await
        .unwrap();
    let first = r.chunk().await.unwrap().unwrap();
    let stopper = tokio::task::spawn_blocking(move || server.shutdown());
    let mut rest = first.to_vec();
    while let Some(c) = r.chunk().await.unwrap() {
        rest.extend_from_slice(&c);
    }
    let text = String::from_utf8_lossy(&rest);
    assert!(text.contains("\"finish_reason\":\"length\""), "{text:.300}");
    assert!(text.trim_end().ends_with("data: [DONE]"));
    stopper.await.unwrap().unwrap();
    assert!(client().get(format!("{url}/health")).send().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cuts_off_what_outlives_the_deadline() {
    let (server, url) = start(ServeOptions {
        shutdown_timeout: Duration::from_millis(300),
        ..options()
    });
    let mut running = endless_stream(&url).await;
    let t0 = Instant::now();
    let stopper = tokio::task::spawn_blocking(move || server.shutdown());
    let mut rest = Vec::new();
    while let Ok(Some(c)) = running.chunk().await {
        rest.extend_from_slice(&c);
    }
    let text = String::from_utf8_lossy(&rest);
    assert!(
        text.contains("shut down before this request finished"),
        "{:.300}",
        &text[text.len().saturating_sub(300)..]
    );
    stopper.await.unwrap().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

// ---- raw connections: what reqwest will not send ----------------------------------------------

async fn connect(url: &str) -> TcpStream {
    TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// One response (head and Content-Length body) read from `s` within 10 s: (status, head
/// lowercased, body as JSON).
async fn read_response(s: &mut TcpStream) -> (u16, String, Value) {
    let mut buf = Vec::new();
    let read = async {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if buf.len() >= end + 4 + len {
                    return (head, buf[end + 4..end + 4 + len].to_vec());
                }
            }
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).await.unwrap();
            assert!(
                n > 0,
                "closed mid-response: {:?}",
                String::from_utf8_lossy(&buf)
            );
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    let (head, body) = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("no response within 10 s");
    let status = head[9..12].parse().unwrap();
    let body = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{e}: {head} {}", String::from_utf8_lossy(&body)));
    (status, head, body)
}

/// Whether the server closes `s` within `limit` (whatever it sends first is read and dropped).
async fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    let eof = async {
        let mut b = [0u8; 1024];
        while let Ok(n) = s.read(&mut b).await {
            if n == 0 {
                break;
            }
        }
    };
    tokio::time::timeout(limit, eof).await.is_ok()
}

const MODELS_KEEP_ALIVE: &[u8] = b"GET /v1/models HTTP/1.1\r\nHost: test\r\n\r\n";

/// Not HTTP, and a Content-Length that is not a number: hyper refuses both, and the client
/// gets OpenAI's error JSON saying what was wrong (not an empty 400).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_are_not_http_get_openai_errors() {
    let (server, url) = start(options());
    let cases: [(&[u8], &str); 3] = [
        (b"hello there\r\n\r\n", "not valid HTTP/1.1"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "not valid HTTP/1.1"),
        (
            b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: abc\r\n\r\n{}",
            "Content-Length header 'abc'",
        ),
    ];
    for (request, says) in cases {
        let mut s = connect(&url).await;
        s.write_all(request).await.unwrap();
        let (status, head, v) = read_response(&mut s).await;
        assert_eq!(status, 400, "{head}");
        assert!(head.contains("content-type: application/json"), "{head}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
        assert!(closed_within(&mut s, Duration::from_secs(5)).await);
    }
    still_serves(&url, 2).await;
    server.shutdown().unwrap();
}

/// Header, body and idle timeouts: a connection that sends nothing, half a head, or half a
/// body is not kept open, and neither is one kept alive without requests; one that keeps
/// sending requests more often than the idle timeout stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_and_idle_connections_are_closed() {
    let timeouts = Timeouts {
        header: Duration::from_millis(400),
        body: Duration::from_millis(400),
        idle: Duration::from_millis(400),
    };
    let (server, url) = start(ServeOptions {
        timeouts,
        ..options()
    });
    let limit = Duration::from_secs(5);
    let mut silent = connect(&url).await;
    let mut half_head = connect(&url).await;
    half_head
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\n")
        .await
        .unwrap();
    let t0 = Instant::now();
    assert!(
        closed_within(&mut silent, limit).await,
        "a silent connection stays open"
    );
    assert!(
        closed_within(&mut half_head, limit).await,
        "half a head stays open"
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t0.elapsed()
    );

    // Half a body: 408 with the error JSON, then the connection closes.
    let mut half_body = connect(&url).await;
    half_body
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\": ")
        .await
        .unwrap();
    let (status, head, v) = read_response(&mut half_body).await;
    assert_eq!(status, 408, "{v}");
    assert!(head.contains("connection: close"), "{head}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--body-timeout"),
        "{v}"
    );
    assert!(closed_within(&mut half_body, limit).await);

    // Requests every 150 ms keep a connection open past the idle timeout; then it idles out.
    let mut kept = connect(&url).await;
    for _ in 0..4 {
        kept.write_all(MODELS_KEEP_ALIVE).await.unwrap();
        let (status, _, v) = read_response(&mut kept).await;
        assert_eq!(status, 200, "{v}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(
        closed_within(&mut kept, limit).await,
        "an idle connection stays open"
    );
    still_serves(&url, 2).await;
    server.shutdown().unwrap();
}

/// Once shutdown has begun, a request on a connection that was already open gets 503 (and
/// `Connection: close`) while another request is still in flight, as the README says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_requests_on_open_connections_with_503() {
    let (server, url) = start(ServeOptions {
        shutdown_timeout: Duration::from_secs(2),
        ..options()
    });
    let mut open = connect(&url).await;
    open.write_all(MODELS_KEEP_ALIVE).await.unwrap();
    assert_eq!(read_response(&mut open).await.0, 200);
    let mut running = endless_stream(&url).await;
    let stopper = tokio::task::spawn_blocking(move || server.shutdown());
    // Shutdown has begun once new connections are refused.
    eventually("the listener closed", async || {
        TcpStream::connect(url.trim_start_matches("http://"))
            .await
            .is_err()
    })
    .await;
    open.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    )
    .await
    .unwrap();
    let (status, head, v) = read_response(&mut open).await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "shutting_down", "{v}");
    assert!(head.contains("connection: close"), "{head}");
    while let Ok(Some(_)) = running.chunk().await {}
    tokio::time::timeout(Duration::from_secs(10), stopper)
        .await
        .expect("shutdown took too long")
        .unwrap()
        .unwrap();
}

/// A connection stalled mid-head does not hold up shutdown when nothing is in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_connection_does_not_hold_up_shutdown() {
    let (server, url) = start(ServeOptions {
        shutdown_timeout: Duration::from_secs(20),
        ..options()
    });
    let mut stalled = connect(&url).await;
    stalled
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: te")
        .await
        .unwrap();
    let mut idle = connect(&url).await;
    idle.write_all(MODELS_KEEP_ALIVE).await.unwrap();
    assert_eq!(read_response(&mut idle).await.0, 200);
    let t0 = Instant::now();
    let stopper = tokio::task::spawn_blocking(move || server.shutdown());
    tokio::time::timeout(Duration::from_secs(5), stopper)
        .await
        .expect("a stalled connection held up shutdown")
        .unwrap()
        .unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(closed_within(&mut stalled, Duration::from_secs(1)).await);
    assert!(closed_within(&mut idle, Duration::from_secs(1)).await);
}

/// Limits that would refuse every request are refused at start, in the CLI's words.
#[test]
fn limits_that_refuse_everything_are_refused_at_start() {
    let zero_timeout = Timeouts {
        idle: Duration::ZERO,
        ..Timeouts::default()
    };
    let cases = [
        (
            ServeOptions {
                max_tokens: 0,
                ..options()
            },
            "--max-tokens must be at least 1",
        ),
        (
            ServeOptions {
                max_body_bytes: 0,
                ..options()
            },
            "--max-body-bytes must be at least 1",
        ),
        (
            ServeOptions {
                timeouts: zero_timeout,
                ..options()
            },
            "--idle-timeout must be more than 0",
        ),
    ];
    for (o, says) in cases {
        let e = Server::start(common::tiny_gpt(1), Tokenizer::Bytes, o)
            .err()
            .expect("started");
        assert!(e.to_string().contains(says), "{e}");
    }
}

/// A schema of every supported kind; the answers below must match it.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "score": {"type": "number"},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "color": {"enum": ["red", "green", 7]},
            "none": {"type": "null"}
        },
        "required": ["name", "age", "color"]
    })
}

fn matches_person(v: &Value) -> bool {
    let o = v.as_object().unwrap();
    let known = ["name", "age", "score", "ok", "tags", "color", "none"];
    o.keys().all(|k| known.contains(&k.as_str()))
        && v["name"].is_string()
        && v["age"].is_i64()
        && (v["score"].is_null() || v["score"].is_number())
        && (v["ok"].is_null() || v["ok"].is_boolean())
        && (v["tags"].is_null() || v["tags"].as_array().unwrap().iter().all(Value::is_string))
        && [json!("red"), json!("green"), json!(7)].contains(&v["color"])
        && (!o.contains_key("none") || v["none"].is_null())
}

/// `response_format` on the random byte model: whatever its logits, every answer parses as
/// JSON and matches the schema (json_object: is an object), ends with finish_reason "stop"
/// once the document is whole, streamed or not, greedy or sampled, even with a budget just
/// above the shortest document. Without the mask the gibberish would not parse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_format_answers_are_json_of_the_schema() {
    let (server, url) = start(options());
    let schema = json!({"type": "json_schema", "json_schema": {"name": "person", "schema": person_schema()}});
    for seed in 0..6 {
        for (format, max_tokens) in [
            (&schema, 200),
            (&schema, 40),
            (&json!({"type": "json_object"}), 60),
        ] {
            let body = json!({
                "model": MODEL,
                "messages": [{"role": "user", "content": "Give me a person as JSON"}],
                "max_tokens": max_tokens,
                "temperature": if seed % 2 == 0 { 1.0 } else { 0.0 },
                "seed": seed,
                "response_format": format,
            });
            let (status, _, v) = post(&url, "/v1/chat/completions", &body.to_string()).await;
            assert_eq!(status, 200, "{v}");
            let text = v["choices"][0]["message"]["content"].as_str().unwrap();
            assert_eq!(v["choices"][0]["finish_reason"], "stop", "{text}");
            let doc: Value = serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("seed {seed}: not JSON ({e}): {text:?}"));
            assert!(doc.is_object(), "{text}");
            if format == &schema {
                assert!(matches_person(&doc), "seed {seed}: {text}");
            }
            // Streamed: the same text.
            let mut sbody = body.clone();
            sbody["stream"] = json!(true);
            let events = stream(&url, "/v1/chat/completions", sbody).await;
            let streamed: String = events
                .iter()
                .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
                .collect();
            assert_eq!(streamed, text, "seed {seed}");
        }
    }
    // A completion (not chat) is constrained too.
    let v = complete(
        &url,
        json!({"model": MODEL, "prompt": "{", "max_tokens": 50, "seed": 3, "response_format": {"type": "json_object"}}),
    )
    .await;
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(
        serde_json::from_str::<Value>(text).unwrap().is_object(),
        "{text}"
    );
    server.shutdown().unwrap();
}

/// An embedding's JSON array of numbers as f32s.
fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// The largest |a − b| over the pairs.
fn worst_difference(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// `/v1/embeddings` on a tiny random BERT: each input's vector equals `Bert::embed` of its
/// ids alone (padding in the server's batches masked out), in input order, float or base64;
/// usage counts the tokens; bad inputs are 400s naming `input`; completions are refused
/// with 400 on an embeddings-only server, which keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_equal_bert_embed_of_each_input_alone() {
    use sinter_core::{Device, Tensor};
    let server = Server::start_embeddings(
        common::tiny_embedder(4, "tiny-embed"),
        ServeOptions {
            port: 0,
            ..Default::default()
        },
    )
    .unwrap();
    let url = format!("http://{}", server.addr());
    let bert = common::tiny_bert(4);
    let alone = |ids: &[i64]| -> Vec<f32> {
        let t = Tensor::from_vec(ids.to_vec(), &[1, ids.len()], Device::Cpu).unwrap();
        bert.embed(&t, None, true).unwrap().to_vec_f32().unwrap()
    };
    let texts = ["a long input: 16", "hi", "middle one", "x"];
    let (status, _, v) = post(
        &url,
        "/v1/embeddings",
        &json!({"model": "tiny-embed", "input": texts}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "list");
    let tokens: usize = texts.iter().map(|t| t.len()).sum();
    assert_eq!(v["usage"]["prompt_tokens"], tokens);
    for (i, t) in texts.iter().enumerate() {
        let d = &v["data"][i];
        assert_eq!(
            (d["index"].as_u64(), d["object"].as_str()),
            (Some(i as u64), Some("embedding"))
        );
        let got = floats(&d["embedding"]);
        let want = alone(&t.bytes().map(i64::from).collect::<Vec<_>>());
        assert_eq!(got.len(), 32);
        let worst = worst_difference(&got, &want);
        assert!(worst <= 1e-5, "input {i}: worst difference {worst:e}");
    }
    // Token ids, and base64: exactly the little-endian bytes of the vector the float format
    // returns for the same input. Against `alone` only within 1e-5: the server runs its batch
    // with an attention mask and `alone` without one, and on an AVX-512 Xeon the two differed
    // in the last bit of a few values.
    let request = |format: &str| {
        json!({"model": "tiny-embed", "input": [104, 105], "encoding_format": format}).to_string()
    };
    let (status, _, f) = post(&url, "/v1/embeddings", &request("float")).await;
    assert_eq!(status, 200, "{f}");
    let got = floats(&f["data"][0]["embedding"]);
    let want = alone(&[104, 105]);
    assert_eq!(got.len(), want.len());
    let worst = worst_difference(&got, &want);
    assert!(worst <= 1e-5, "token ids: worst difference {worst:e}");
    let (status, _, b) = post(&url, "/v1/embeddings", &request("base64")).await;
    assert_eq!(status, 200, "{b}");
    let bytes: Vec<u8> = got.iter().flat_map(|x| x.to_le_bytes()).collect();
    assert_eq!(
        b["data"][0]["embedding"],
        sinter_serve::embed::base64(&bytes)
    );
    for (body, status, param) in [
        (json!({"model": "tiny-embed", "input": ""}), 400, "input"),
        (
            json!({"model": "tiny-embed", "input": ["ok", ""]}),
            400,
            "input",
        ),
        (json!({"model": "tiny-embed", "input": []}), 400, "input"),
        (json!({"model": "tiny-embed", "input": [[]]}), 400, "input"),
        (
            json!({"model": "tiny-embed", "input": "seventeen bytes!!"}),
            400,
            "input",
        ),
        (json!({"model": "tiny-embed", "input": [300]}), 400, "input"),
        (
            json!({"model": "tiny-embed", "input": {"a": 1}}),
            400,
            "input",
        ),
        (
            json!({"model": "tiny-embed", "input": "a", "encoding_format": "hex"}),
            400,
            "encoding_format",
        ),
        (
            json!({"model": "tiny-embed", "input": "a", "dimensions": 8}),
            400,
            "dimensions",
        ),
        (json!({"model": "other", "input": "a"}), 404, "model"),
        (json!({"input": "a"}), 400, "model"),
    ] {
        let (got, _, v) = post(&url, "/v1/embeddings", &body.to_string()).await;
        assert_eq!(
            (got, v["error"]["param"].as_str()),
            (status, Some(param)),
            "{body}: {v}"
        );
    }
    let (got, _, v) = post(
        &url,
        "/v1/embeddings",
        &json!({"model": "tiny-embed", "input": "a".repeat(17)}).to_string(),
    )
    .await;
    assert_eq!(
        (got, v["error"]["code"].as_str()),
        (400, Some("context_length_exceeded")),
        "{v}"
    );
    let (got, _, v) = post(
        &url,
        "/v1/completions",
        &json!({"model": "tiny-embed", "prompt": "a"}).to_string(),
    )
    .await;
    assert_eq!(got, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("embedding model"),
        "{v}"
    );
    let (_, models) = get(&url, "/v1/models").await;
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"].as_array().unwrap().len(), 1);
    assert_eq!(models["data"][0]["id"], "tiny-embed");
    assert_eq!(
        metric(&url, "sinter_embedding_tokens_total").await,
        // The texts, then [104, 105] twice (float and base64).
        (tokens + 4) as u64
    );
    server.shutdown().unwrap();
}

/// An embedding model that holds each batch until the test opens its gate: requests stay
/// in flight as long as the test needs.
struct GatedEmbedder {
    inner: sinter_serve::BertEmbedder,
    open: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
}

impl sinter_serve::EmbedModel for GatedEmbedder {
    fn max_tokens(&self) -> usize {
        self.inner.max_tokens()
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn embed(&self, batch: &[Vec<i64>]) -> anyhow::Result<Vec<Vec<f32>>> {
        let (lock, cv) = &*self.open;
        let mut open = lock.lock().unwrap();
        while !*open {
            open = cv.wait(open).unwrap();
        }
        drop(open);
        self.inner.embed(batch)
    }
}

fn open_gate(gate: &(std::sync::Mutex<bool>, std::sync::Condvar)) {
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
}

/// `/v1/embeddings` has a bounded queue: with `max_queue` 1, one request runs, one waits and
/// the third gets 429 (counted as rejected); the gauge counts the admitted ones, both answer
/// once the model is free, and shutdown waits for an embedding in flight (new requests get
/// 503 meanwhile) instead of cutting it off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_past_the_queue_get_429_and_shutdown_waits_for_them() {
    let gate = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let embedder = || {
        sinter_serve::Embedder::new(
            GatedEmbedder {
                inner: sinter_serve::BertEmbedder::new(common::tiny_bert(4)),
                open: gate.clone(),
            },
            Tokenizer::Bytes,
            "gated",
        )
    };
    let o = ServeOptions {
        port: 0,
        max_queue: 1,
        shutdown_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    let server = Server::start_embeddings(embedder(), o.clone()).unwrap();
    let url = format!("http://{}", server.addr());
    let body = json!({"model": "gated", "input": ["abc", "de"]}).to_string();
    let send = |body: String| {
        let url = url.clone();
        tokio::spawn(async move { post(&url, "/v1/embeddings", &body).await })
    };
    let first = send(body.clone());
    let second = send(body.clone());
    eventually("two embedding requests admitted", async || {
        metric(&url, "sinter_embedding_requests_in_flight").await == 2
    })
    .await;
    let (status, headers, v) = post(&url, "/v1/embeddings", &body).await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(v["error"]["code"], "queue_full");
    assert_eq!(metric(&url, "sinter_requests_rejected_total").await, 1);
    open_gate(&gate);
    for r in [first, second] {
        let (status, _, v) = r.await.unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["data"].as_array().unwrap().len(), 2);
    }
    assert_eq!(metric(&url, "sinter_embedding_requests_in_flight").await, 0);
    server.shutdown().unwrap();

    // Shutdown with one embedding in flight: it is answered, a new request meanwhile is not.
    *gate.0.lock().unwrap() = false;
    let server = Server::start_embeddings(embedder(), o).unwrap();
    let url = format!("http://{}", server.addr());
    let held = {
        let (url, body) = (url.clone(), body.clone());
        tokio::spawn(async move { post(&url, "/v1/embeddings", &body).await })
    };
    // A second connection, open before shutdown begins, for the request shutdown refuses.
    let mut other = connect(&url).await;
    eventually("the embedding request admitted", async || {
        metric(&url, "sinter_embedding_requests_in_flight").await == 1
    })
    .await;
    let stopper = tokio::task::spawn_blocking(move || server.shutdown());
    // The listener closes right after shutdown begins.
    eventually("shutdown begun", async || {
        TcpStream::connect(url.trim_start_matches("http://"))
            .await
            .is_err()
    })
    .await;
    let raw = format!(
        "POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    other.write_all(raw.as_bytes()).await.unwrap();
    let (status, _, _) = read_response(&mut other).await;
    assert_eq!(status, 503);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !stopper.is_finished(),
        "shutdown did not wait for the embedding in flight"
    );
    open_gate(&gate);
    let (status, _, v) = held.await.unwrap();
    assert_eq!(status, 200, "{v}");
    stopper.await.unwrap().unwrap();
}

/// Shared-prefix KV reuse: two prompts that share a 40-byte "system prompt" give the same
/// text (greedy and seeded) from a server with the prefix cache as from one without; with
/// it, the second prompt's first 32 tokens (two 16-token blocks) are copied, not computed:
/// `sinter_prefix_reused_tokens_total` counts them and its prefill steps drop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_prompt_prefix_is_reused_with_the_same_output() {
    let serve = |cache: bool| {
        let model = common::tiny_gpt(1);
        let model = if cache {
            model
        } else {
            model.with_prefix_cache(0)
        };
        let o = ServeOptions {
            prefill_chunk: 4,
            ..options()
        };
        let server = Server::start(model, Tokenizer::Bytes, o).unwrap();
        let url = format!("http://{}", server.addr());
        (server, url)
    };
    let system = "You are a terse assistant. Answer in JSON";
    assert_eq!(system.len(), 41);
    // Both 49 bytes, the same first 45.
    let prompts = [format!("{system}\nQ: one?"), format!("{system}\nQ: two!")];
    let mut texts = Vec::new();
    let mut steps = Vec::new();
    for cache in [false, true] {
        let (server, url) = serve(cache);
        let mut out = Vec::new();
        let mut per_request = Vec::new();
        for p in &prompts {
            for (temperature, seed) in [(0.0, 0), (1.0, 9)] {
                let before = metric(&url, "sinter_prefill_steps_total").await;
                let v = complete(
                    &url,
                    json!({"model": MODEL, "prompt": p, "max_tokens": 12, "temperature": temperature, "seed": seed}),
                )
                .await;
                out.push(v["choices"][0]["text"].as_str().unwrap().to_string());
                per_request.push(metric(&url, "sinter_prefill_steps_total").await - before);
            }
        }
        let reused = metric(&url, "sinter_prefix_reused_tokens_total").await;
        if cache {
            // First prompt: computed, then kept (its 48 aligned tokens); the same prompt
            // again reuses 48; the second shares 45 bytes with it: 32 aligned, then is
            // kept itself and reused whole (48) when it comes again.
            assert_eq!(reused, 48 + 32 + 48, "{per_request:?}");
        } else {
            assert_eq!(reused, 0);
        }
        texts.push(out);
        steps.push(per_request);
        server.shutdown().unwrap();
    }
    assert_eq!(texts[0], texts[1], "the prefix cache changed the output");
    // 49-byte prompts in chunks of 4: 12 prefill steps, and the last byte rides in a decode
    // step; from 48 cached: no prefill; from 32: 4.
    assert_eq!(steps[0], vec![12, 12, 12, 12]);
    assert_eq!(steps[1], vec![12, 0, 4, 0]);
}
