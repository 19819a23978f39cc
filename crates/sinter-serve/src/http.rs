//! The HTTP layer: routes, the API key check, the request body's size and time limits, 503s
//! once shutdown has begun, and how a request's events from the scheduler become a JSON
//! response or a server-sent event stream.
//!
//! Cancellation: a request's event channel lives exactly as long as the client does. When a
//! streaming client disconnects, hyper drops the response stream and with it the receiver;
//! for a non-streamed request, hyper drops the handler. Either way the scheduler sees the
//! closed channel at its next step and frees the slot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::{json, Value};
use subtle::ConstantTimeEq;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::api::{self, Limits, ResponseMeta};
use crate::embed::Embedder;
use crate::engine::{EngineHandle, Event, SubmitError};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::sse;
use crate::text::Tokenizer;

/// What every handler sees.
#[derive(Clone)]
pub struct App {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub limits: Arc<Limits>,
    pub api_key: Option<Arc<[u8]>>,
    /// When the server started (Unix seconds): the model's `created`.
    pub started: u64,
    pub next_id: Arc<AtomicU64>,
    /// The largest request body accepted (413 past it).
    pub max_body_bytes: usize,
    /// How long a request's body may take to arrive once its head has (408 past it).
    pub body_timeout: Duration,
    /// Whether the engine runs a generation model (an embeddings-only server does not).
    pub generates: bool,
    /// The model behind `/v1/embeddings`, if any.
    pub embedder: Option<Arc<Embedder>>,
}

impl App {
    fn metrics(&self) -> &Metrics {
        self.engine.metrics()
    }
    fn response_meta(&self, chat: bool) -> ResponseMeta {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        ResponseMeta {
            id: format!(
                "{}-{:x}{n:06x}",
                if chat { "chatcmpl" } else { "cmpl" },
                self.started
            ),
            created: unix_now(),
            model: self.limits.model_name.clone(),
            chat,
        }
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The routes: the OpenAI API under `/v1` (behind the API key when one is set), and
/// `/health` and `/metrics` (open, for probes and scrapers); once shutdown has begun, 503 for
/// every new request but `/health` (which says so itself).
pub fn router(app: App) -> Router {
    let v1 = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route_layer(middleware::from_fn_with_state(app.clone(), check_api_key));
    Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(app.clone(), shutdown_gate))
        .with_state(app)
}

/// After shutdown begins: 503 for a new request (README: open connections get 503, not a
/// closed connection), and every response closes its connection, so that clients go
/// elsewhere instead of reusing it.
async fn shutdown_gate(State(app): State<App>, req: Request, next: Next) -> Response {
    let closing = app.engine.is_closing();
    let mut res = if closing && req.uri().path() != "/health" {
        ApiError::shutting_down().into_response()
    } else {
        next.run(req).await
    };
    if closing || app.engine.is_closing() {
        res.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    res
}

/// Whether `given` is the key, in time that does not depend on where they differ.
fn key_matches(given: &[u8], key: &[u8]) -> bool {
    // Compare over the key's length whatever was given (padded or cut), and the lengths
    // separately, so neither a prefix nor a wrong length ends the comparison early.
    let padded: Vec<u8> = (0..key.len())
        .map(|i| given.get(i).copied().unwrap_or(0))
        .collect();
    let same = padded.ct_eq(key) & (given.len() as u64).ct_eq(&(key.len() as u64));
    same.into()
}

async fn check_api_key(State(app): State<App>, req: Request, next: Next) -> Response {
    if let Some(key) = &app.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !key_matches(given.trim().as_bytes(), key) {
            Metrics::add(&app.metrics().requests_invalid_total, 1);
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

async fn completions(State(app): State<App>, body: Body) -> Response {
    generate(app, body, false).await
}

async fn chat_completions(State(app): State<App>, body: Body) -> Response {
    generate(app, body, true).await
}

async fn generate(app: App, body: Body, chat: bool) -> Response {
    let m = app.metrics();
    Metrics::add(&m.requests_total, 1);
    let body = read_body(body, app.max_body_bytes, app.body_timeout).await;
    if body.is_ok() && !app.generates {
        Metrics::add(&m.requests_invalid_total, 1);
        let name = app.embedder.as_ref().map_or("", |e| e.name.as_str());
        return ApiError::invalid(
            format!("'{name}' is an embedding model: this server answers POST /v1/embeddings only, not {}; serve a generation model (sinter serve --model GGUF_OR_LLAMA_DIR) for completions", if chat { "/v1/chat/completions" } else { "/v1/completions" }),
            Some("model".into()),
        )
        .into_response();
    }
    let parsed = body.and_then(|b| {
        if chat {
            api::chat_request(&b, &app.tokenizer, &app.limits)
        } else {
            api::completion_request(&b, &app.tokenizer, &app.limits)
        }
    });
    let (req, delivery) = match parsed {
        Ok(x) => x,
        Err(e) => {
            Metrics::add(&m.requests_invalid_total, 1);
            return e.into_response();
        }
    };
    let rx = match app.engine.submit(req) {
        Ok(rx) => rx,
        Err(SubmitError::QueueFull) => {
            Metrics::add(&m.requests_rejected_total, 1);
            return ApiError::queue_full().into_response();
        }
        Err(SubmitError::ShuttingDown) => return ApiError::shutting_down().into_response(),
    };
    let meta = app.response_meta(chat);
    if delivery.stream {
        sse::response(rx, meta, delivery)
    } else {
        full_response(rx, meta).await
    }
}

/// `/v1/embeddings`: the inputs run on a blocking thread (one batch at a time, see
/// `embed.rs`), off the HTTP workers.
async fn embeddings(State(app): State<App>, body: Body) -> Response {
    let m = app.metrics();
    Metrics::add(&m.embedding_requests_total, 1);
    let body = match read_body(body, app.max_body_bytes, app.body_timeout).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let Some(emb) = app.embedder.clone() else {
        Metrics::add(&m.requests_invalid_total, 1);
        return ApiError::invalid(
            format!("'{}' is a generation model and this server has no embedding model: serve one for POST /v1/embeddings (sinter serve --model MINILM_DIR, or --embedding-model DIR beside a generation model)", app.limits.model_name),
            Some("model".into()),
        )
        .into_response();
    };
    let job = match api::embedding_request(&body, &emb) {
        Ok(j) => j,
        Err(e) => {
            Metrics::add(&m.requests_invalid_total, 1);
            return e.into_response();
        }
    };
    let Some(admission) = emb.admit() else {
        Metrics::add(&m.requests_rejected_total, 1);
        return ApiError::queue_full().into_response();
    };
    let tokens: usize = job.inputs.iter().map(Vec::len).sum();
    // The admission moves with the work: a client that goes away does not free its place
    // before the model is done with its inputs.
    let run = tokio::task::spawn_blocking(move || {
        let out = emb.embed_all(&job.inputs);
        drop(admission);
        (out, emb, job.base64)
    })
    .await;
    match run {
        Ok((Ok(vectors), emb, base64)) => {
            Metrics::add(&m.embedding_tokens_total, tokens as u64);
            let body = api::embedding_response(&emb.name, &vectors, base64, tokens);
            json_response(StatusCode::OK, &body)
        }
        Ok((Err(e), _, _)) => ApiError::internal(format!("{e:#}")).into_response(),
        Err(e) => ApiError::internal(format!("the embedding model failed: {e}")).into_response(),
    }
}

/// The whole request body, at most `limit` bytes (else 413) and within `timeout` (else 408:
/// a client that stalls mid-body must not hold its connection and slot open). Either error
/// closes the connection, since the rest of the body may still be on its way.
async fn read_body(body: Body, limit: usize, timeout: Duration) -> Result<Bytes, ApiError> {
    let collected = tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await;
    let (status, message) = match collected {
        Ok(Ok(c)) => return Ok(c.to_bytes()),
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s of its head (sinter serve --body-timeout)",
                timeout.as_secs_f64()
            ),
        ),
        Ok(Err(e)) if e.is::<LengthLimitError>() => (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than this server accepts ({limit} bytes, sinter serve --max-body-bytes)"),
        ),
        Ok(Err(e)) => (
            StatusCode::BAD_REQUEST,
            format!("cannot read the request body: {e}"),
        ),
    };
    Err(ApiError {
        close: true,
        ..ApiError::new(status, "invalid_request_error", message, None, None)
    })
}

async fn full_response(mut rx: UnboundedReceiver<Event>, meta: ResponseMeta) -> Response {
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Done {
                finish,
                prompt_tokens,
                completion_tokens,
            } => {
                let body = meta.full(&text, finish, prompt_tokens, completion_tokens);
                return json_response(StatusCode::OK, &body);
            }
            Event::Failed(msg) => return ApiError::internal(msg).into_response(),
        }
    }
    ApiError::internal("the scheduler stopped before the request finished").into_response()
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn model_card(app: &App) -> Value {
    json!({
        "id": app.limits.model_name,
        "object": "model",
        "created": app.started,
        "owned_by": "sinter",
        "context_length": app.limits.context,
        "tokenizer": app.tokenizer.name(),
    })
}

fn embedder_card(app: &App, e: &Embedder) -> Value {
    json!({
        "id": e.name,
        "object": "model",
        "created": app.started,
        "owned_by": "sinter",
        "context_length": e.max_tokens(),
        "tokenizer": e.tokenizer.name(),
    })
}

/// The models this server runs: the generation model, the embedding model, or both.
fn cards(app: &App) -> Vec<Value> {
    let mut out = Vec::new();
    if app.generates {
        out.push(model_card(app));
    }
    if let Some(e) = &app.embedder {
        out.push(embedder_card(app, e));
    }
    out
}

async fn models(State(app): State<App>) -> Response {
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": cards(&app)}),
    )
}

async fn model(State(app): State<App>, Path(id): Path<String>) -> Response {
    match cards(&app).into_iter().find(|c| c["id"] == id.as_str()) {
        Some(card) => json_response(StatusCode::OK, &card),
        None => ApiError::model_not_found(&id, &app.limits.model_name).into_response(),
    }
}

async fn health(State(app): State<App>) -> Response {
    if app.engine.is_closing() {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "shutting_down"}),
        );
    }
    json_response(StatusCode::OK, &json!({"status": "ok"}))
}

async fn metrics(State(app): State<App>) -> Response {
    let mut text = app.metrics().render();
    if let Some(e) = &app.embedder {
        let name = "sinter_embedding_requests_in_flight";
        text.push_str(&format!(
            "# HELP {name} Embedding requests admitted and not yet answered (running or waiting for the model).\n# TYPE {name} gauge\n{name} {}\n",
            e.in_flight()
        ));
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn not_found(req: Request) -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!(
            "no route {} {}; this server has POST /v1/completions, POST /v1/chat/completions, POST /v1/embeddings, GET /v1/models, GET /health, GET /metrics",
            req.method(),
            req.uri().path()
        ),
        None,
        None,
    )
    .into_response()
}

async fn method_not_allowed(req: Request) -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
        None,
        None,
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::key_matches;

    #[test]
    fn api_keys_match_exactly() {
        assert!(key_matches(b"secret", b"secret"));
        for wrong in [&b"secre"[..], b"secret!", b"Secret", b"", b"secrex"] {
            assert!(!key_matches(wrong, b"secret"), "{wrong:?}");
        }
    }
}
