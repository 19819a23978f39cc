//! OpenAI's request and response shapes for `/v1/completions` and `/v1/chat/completions`,
//! the checks that turn a request into a `GenRequest` (every bad value is a 4xx `ApiError`
//! naming the parameter), the chat template, and the JSON of responses and stream chunks.

use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};
use sinter_models::decoder::SamplingParams;

use std::sync::Arc;

use crate::constrain::Schema;
use crate::embed::{Embedder, MAX_INPUTS};
use crate::engine::{Finish, GenRequest};
use crate::error::ApiError;
use crate::text::{encode_text, Tokenizer};
use sinter_data::ChatMessage;

/// A prompt in any of the shapes OpenAI accepts (one prompt: `n` = 1 and no batches).
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenLists(Vec<Vec<i64>>),
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// Parameters shared by completions and chat. Fields OpenAI defines that this server cannot
/// honour are accepted only at their neutral values; fields it does not know are ignored.
#[derive(Deserialize, Default)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Not OpenAI's: vLLM's extension (0 or -1: off).
    pub top_k: Option<i64>,
    pub stop: Option<Stop>,
    pub seed: Option<i64>,
    pub n: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<Value>,
    pub user: Option<String>,
    pub response_format: Option<Value>,
}

#[derive(Deserialize)]
pub struct CompletionRequest {
    pub prompt: Option<Prompt>,
    pub echo: Option<bool>,
    pub best_of: Option<i64>,
    pub suffix: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Deserialize)]
pub struct Message {
    pub role: String,
    pub content: Option<Content>,
}

#[derive(Deserialize)]
pub struct ChatRequest {
    pub messages: Option<Vec<Message>>,
    pub max_completion_tokens: Option<i64>,
}

/// What the server allows and holds.
#[derive(Clone, Debug)]
pub struct Limits {
    /// The model's name in requests and `/v1/models`.
    pub model_name: String,
    /// The most tokens a prompt may have (the model's context).
    pub context: usize,
    /// The most tokens one request may generate.
    pub max_tokens: usize,
}

/// How the response is to be sent.
#[derive(Clone, Copy, Debug)]
pub struct Delivery {
    pub stream: bool,
    pub include_usage: bool,
}

/// Parses a JSON body: malformed JSON or a body that is not an object is a 400.
pub fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("the request body is not valid JSON: {e}"), None))?;
    if !v.is_object() {
        return Err(ApiError::invalid(
            "the request body must be a JSON object",
            None,
        ));
    }
    Ok(v)
}

/// Reads the fields of `T` from a parsed body; a value of the wrong type is a 400 naming the
/// parameter. (Each request is read as two structs, its own fields and the shared ones, so
/// that serde can report the path; `#[serde(flatten)]` would lose it.)
pub fn fields<T: serde::de::DeserializeOwned>(body: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body.clone()).map_err(|e| {
        let path = e.path().to_string();
        let msg = describe_type_error(&path, &e.into_inner().to_string());
        ApiError::invalid(format!("'{path}': {msg}"), Some(path))
    })
}

/// serde's message for untagged enums says nothing useful; say what is expected instead.
fn describe_type_error(path: &str, msg: &str) -> String {
    if msg.contains("did not match any variant") {
        let want = match path.split(['.', '[']).next().unwrap_or("") {
            "prompt" => "a string, an array with one string, or an array of token ids",
            "stop" => "a string or an array of strings",
            "messages" => "an array of {role, content} objects whose content is a string or an array of text parts",
            _ => "a value of another type",
        };
        return format!("expected {want}");
    }
    msg.to_string()
}

fn positive(v: Option<i64>, name: &str, limit: usize) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x <= 0 => Err(ApiError::invalid(
            format!("'{name}' must be at least 1, got {x}"),
            Some(name.into()),
        )),
        Some(x) if x as u64 > limit as u64 => Err(ApiError::invalid(
            format!("'{name}' is {x}, more than this server's limit of {limit} tokens per request (sinter serve --max-tokens)"),
            Some(name.into()),
        )),
        Some(x) => Ok(Some(x as usize)),
    }
}

fn neutral<T: PartialEq + std::fmt::Debug>(
    v: &Option<T>,
    ok: &[T],
    name: &str,
) -> Result<(), ApiError> {
    match v {
        Some(x) if !ok.contains(x) => Err(ApiError::invalid(
            format!("'{name}' = {x:?} is not supported by this server"),
            Some(name.into()),
        )),
        _ => Ok(()),
    }
}

impl Common {
    /// Checks the shared parameters; returns the sampling, stop sequences and delivery.
    fn check(&self, limits: &Limits) -> Result<Checked, ApiError> {
        match &self.model {
            None => {
                return Err(ApiError::invalid(
                    "'model' is required; GET /v1/models lists the model this server runs",
                    Some("model".into()),
                ))
            }
            Some(m) if *m != limits.model_name => {
                return Err(ApiError::model_not_found(m, &limits.model_name))
            }
            Some(_) => {}
        }
        neutral(&self.n, &[1], "n")?;
        neutral(&self.presence_penalty, &[0.0], "presence_penalty")?;
        neutral(&self.frequency_penalty, &[0.0], "frequency_penalty")?;
        if self.logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
            return Err(ApiError::invalid(
                "'logit_bias' is not supported by this server",
                Some("logit_bias".into()),
            ));
        }
        for (v, name) in [
            (&self.logprobs, "logprobs"),
            (&self.top_logprobs, "top_logprobs"),
        ] {
            if !matches!(v, None | Some(Value::Null) | Some(Value::Bool(false))) {
                return Err(ApiError::invalid(
                    format!("'{name}' is not supported by this server"),
                    Some(name.into()),
                ));
            }
        }
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid(
                format!("'temperature' must be between 0 and 2 (0 is greedy), got {temperature}"),
                Some("temperature".into()),
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid(
                format!("'top_p' must be in (0, 1], got {top_p}"),
                Some("top_p".into()),
            ));
        }
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => k as usize,
            Some(k) => {
                return Err(ApiError::invalid(
                    format!("'top_k' must be ≥ 1 (0 or -1: off), got {k}"),
                    Some("top_k".into()),
                ))
            }
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > 4 {
            return Err(ApiError::invalid(
                format!("'stop' may hold up to 4 sequences, got {}", stop.len()),
                Some("stop".into()),
            ));
        }
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid(
                "'stop' sequences must not be empty",
                Some("stop".into()),
            ));
        }
        // No seed: a fresh one per request (the output then varies, as with OpenAI).
        let seed = match self.seed {
            Some(s) => s as u64,
            None => fresh_seed(),
        };
        let stream = self.stream.unwrap_or(false);
        let include_usage = self
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        if self.stream_options.is_some() && !stream {
            return Err(ApiError::invalid(
                "'stream_options' is only allowed with 'stream': true",
                Some("stream_options".into()),
            ));
        }
        let sampling = SamplingParams {
            temperature,
            top_k,
            top_p,
        };
        let format = match &self.response_format {
            None | Some(Value::Null) => None,
            Some(v) => response_format(v)?,
        };
        Ok(Checked {
            format,
            sampling,
            stop,
            seed,
            delivery: Delivery {
                stream,
                include_usage,
            },
            max_tokens: self.max_tokens,
        })
    }
}

/// `response_format`: `{"type": "text"}` (no constraint), `{"type": "json_object"}` (any
/// object) or `{"type": "json_schema", "json_schema": {"schema": {...}}}`.
fn response_format(v: &Value) -> Result<Option<Arc<Schema>>, ApiError> {
    let param = || Some("response_format".to_string());
    let bad = |msg: String| ApiError::invalid(format!("'response_format': {msg}"), param());
    let kind = v.get("type").and_then(Value::as_str);
    match kind {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Arc::new(Schema::any_object()))),
        Some("json_schema") => {
            let Some(js) = v.get("json_schema").filter(|j| j.is_object()) else {
                return Err(bad("type json_schema needs 'json_schema': {\"name\": ..., \"schema\": {...}}".into()));
            };
            let Some(schema) = js.get("schema") else {
                return Err(bad("'json_schema' needs 'schema', the JSON Schema of the answer".into()));
            };
            let s = Schema::compile(schema).map_err(|e| bad(format!("json_schema.schema: {e}")))?;
            Ok(Some(Arc::new(s)))
        }
        _ => Err(bad(format!(
            "expected an object whose 'type' is \"text\", \"json_object\" or \"json_schema\", got {v}"
        ))),
    }
}

/// A constrained answer must be able to end as a whole document within `max_tokens` (a token
/// per byte at worst).
fn check_room(format: &Option<Arc<Schema>>, max_tokens: usize) -> Result<(), ApiError> {
    match format {
        Some(s) if s.min_doc_len() > max_tokens => Err(ApiError::invalid(
            format!("'max_tokens' is {max_tokens}, but the shortest JSON document of 'response_format' takes {} tokens; allow more", s.min_doc_len()),
            Some("max_tokens".into()),
        )),
        _ => Ok(()),
    }
}

/// The shared parameters, checked.
struct Checked {
    format: Option<Arc<Schema>>,
    sampling: SamplingParams,
    stop: Vec<String>,
    seed: u64,
    delivery: Delivery,
    max_tokens: Option<i64>,
}

/// A body's own fields (`T`) and its shared parameters, checked.
fn read<T: serde::de::DeserializeOwned>(
    body: &[u8],
    limits: &Limits,
) -> Result<(T, Checked), ApiError> {
    let body = parse_body(body)?;
    let common: Common = fields(&body)?;
    Ok((fields(&body)?, common.check(limits)?))
}

fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Checks the prompt's tokens against the model and the tokenizer.
fn check_prompt(tokens: Vec<i64>, tok: &Tokenizer, limits: &Limits) -> Result<Vec<i64>, ApiError> {
    if tokens.is_empty() {
        return Err(ApiError::invalid(
            "the prompt is empty",
            Some("prompt".into()),
        ));
    }
    if tokens.len() > limits.context {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!(
                "this model's maximum context length is {} tokens, but the prompt has {} tokens; shorten the prompt",
                limits.context,
                tokens.len()
            ),
            Some("prompt".into()),
            Some("context_length_exceeded"),
        ));
    }
    let v = tok.vocab_size() as i64;
    if let Some(t) = tokens.iter().find(|&&t| !(0..v).contains(&t)) {
        return Err(ApiError::invalid(
            format!("prompt token {t} is outside the model's vocabulary of {v}"),
            Some("prompt".into()),
        ));
    }
    Ok(tokens)
}

/// `text`'s ids; a tokenizer that fails on it is a 400 naming `param`.
fn encode_prompt(tok: &Tokenizer, text: &str, param: &str) -> Result<Vec<i64>, ApiError> {
    tok.encode(text)
        .map_err(|e| ApiError::invalid(format!("{e:#}"), Some(param.into())))
}

pub fn completion_request(
    body: &[u8],
    tok: &Tokenizer,
    limits: &Limits,
) -> Result<(GenRequest, Delivery), ApiError> {
    let (r, c): (CompletionRequest, _) = read(body, limits)?;
    if r.echo == Some(true) {
        return Err(ApiError::invalid(
            "'echo' is not supported by this server",
            Some("echo".into()),
        ));
    }
    neutral(&r.best_of, &[1], "best_of")?;
    if r.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid(
            "'suffix' is not supported by this server",
            Some("suffix".into()),
        ));
    }
    let one = || {
        ApiError::invalid(
            "this server takes one prompt per request ('n' = 1, no batches of prompts)",
            Some("prompt".into()),
        )
    };
    let tokens = match r.prompt {
        None => {
            return Err(ApiError::invalid(
                "'prompt' is required",
                Some("prompt".into()),
            ))
        }
        Some(Prompt::Text(s)) => encode_prompt(tok, &s, "prompt")?,
        Some(Prompt::Texts(v)) if v.len() == 1 => encode_prompt(tok, &v[0], "prompt")?,
        Some(Prompt::Tokens(t)) => t,
        Some(Prompt::TokenLists(mut v)) if v.len() == 1 => v.remove(0),
        Some(_) => return Err(one()),
    };
    let prompt = check_prompt(tokens, tok, limits)?;
    // OpenAI's default for completions.
    let max_tokens = positive(c.max_tokens, "max_tokens", limits.max_tokens)?.unwrap_or(16);
    let max_tokens = max_tokens.min(limits.max_tokens);
    check_room(&c.format, max_tokens)?;
    Ok((
        GenRequest {
            prompt,
            max_tokens,
            sampling: c.sampling,
            seed: c.seed,
            stop: c.stop,
            trim_start: false,
            format: c.format,
        },
        c.delivery,
    ))
}

/// The inputs of `/v1/embeddings` (any of OpenAI's shapes).
#[derive(Deserialize)]
#[serde(untagged)]
pub enum EmbedInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenLists(Vec<Vec<i64>>),
}

#[derive(Deserialize)]
pub struct EmbeddingRequest {
    pub input: Option<EmbedInput>,
    pub model: Option<String>,
    pub encoding_format: Option<String>,
    pub dimensions: Option<i64>,
    pub user: Option<String>,
}

/// A checked `/v1/embeddings` request: each input's token ids, and whether the vectors go
/// out as base64.
pub struct EmbedJob {
    pub inputs: Vec<Vec<i64>>,
    pub base64: bool,
}

/// Checks a `/v1/embeddings` body against the embedding model: every input non-empty, within
/// the model's positions and vocabulary; at most `MAX_INPUTS` of them.
pub fn embedding_request(body: &[u8], emb: &Embedder) -> Result<EmbedJob, ApiError> {
    let body = parse_body(body)?;
    let r: EmbeddingRequest = fields(&body).map_err(|mut e| {
        if e.param.as_deref() == Some("input") {
            e.message = "'input': expected a string, an array of strings, an array of token ids or an array of such arrays".into();
        }
        e
    })?;
    match &r.model {
        None => {
            return Err(ApiError::invalid(
                "'model' is required; GET /v1/models lists the models this server runs",
                Some("model".into()),
            ))
        }
        Some(m) if *m != emb.name => return Err(ApiError::model_not_found(m, &emb.name)),
        Some(_) => {}
    }
    let base64 = match r.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                format!("'encoding_format' must be \"float\" or \"base64\", got {other:?}"),
                Some("encoding_format".into()),
            ))
        }
    };
    if let Some(d) = r.dimensions {
        return Err(ApiError::invalid(
            format!("'dimensions' = {d} is not supported: this model's vectors have a fixed size; leave it out"),
            Some("dimensions".into()),
        ));
    }
    let param = Some("input".to_string());
    let inputs = match r.input {
        None => return Err(ApiError::invalid("'input' is required", param)),
        Some(EmbedInput::Text(s)) => vec![encode_input(emb, &s, 0)?],
        Some(EmbedInput::Texts(v)) => {
            check_count(v.len())?;
            let mut out = Vec::with_capacity(v.len());
            for (i, s) in v.iter().enumerate() {
                out.push(encode_input(emb, s, i)?);
            }
            out
        }
        Some(EmbedInput::Tokens(t)) => vec![t],
        Some(EmbedInput::TokenLists(v)) => {
            check_count(v.len())?;
            v
        }
    };
    let (max, vocab) = (emb.max_tokens(), emb.vocab_size() as i64);
    for (i, ids) in inputs.iter().enumerate() {
        if ids.is_empty() {
            return Err(empty_input(i));
        }
        if ids.len() > max {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!("input[{i}] has {} tokens, more than the {max} this model takes; shorten it or split it", ids.len()),
                param,
                Some("context_length_exceeded"),
            ));
        }
        if let Some(t) = ids.iter().find(|&&t| !(0..vocab).contains(&t)) {
            return Err(ApiError::invalid(
                format!("input[{i}]: token {t} is outside the model's vocabulary of {vocab}"),
                param,
            ));
        }
    }
    Ok(EmbedJob { inputs, base64 })
}

fn empty_input(i: usize) -> ApiError {
    ApiError::invalid(
        format!("input[{i}] is empty; every input needs some text or tokens"),
        Some("input".into()),
    )
}

/// Input `i`'s ids. An empty text is refused before tokenizing: a tokenizer that adds
/// [CLS] and [SEP] would make it two tokens.
fn encode_input(emb: &Embedder, text: &str, i: usize) -> Result<Vec<i64>, ApiError> {
    if text.is_empty() {
        return Err(empty_input(i));
    }
    encode_prompt(&emb.tokenizer, text, "input")
}

fn check_count(n: usize) -> Result<(), ApiError> {
    if n == 0 {
        return Err(ApiError::invalid(
            "'input' is an empty array; send at least one input",
            Some("input".into()),
        ));
    }
    if n > MAX_INPUTS {
        return Err(ApiError::invalid(
            format!("'input' holds {n} inputs, more than the {MAX_INPUTS} one request may have; split the request"),
            Some("input".into()),
        ));
    }
    Ok(())
}

/// The `/v1/embeddings` response.
pub fn embedding_response(model: &str, vectors: &[Vec<f32>], base64: bool, tokens: usize) -> Value {
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::from(crate::embed::base64(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })
}

/// The stop sequence that ends an answer in the chat template.
pub const CHAT_TURN_STOP: &str = "\nUser:";

/// The plain chat template for base models: system (and developer) messages as leading
/// paragraphs, then one line per turn, "User: …" or "Assistant: …", and a last
/// "Assistant:" for the model to continue:
///
/// ```text
/// You are terse.
///
/// User: Hello
/// Assistant: Hi.
/// User: Who are you?
/// Assistant:
/// ```
///
/// Generation stops at "\nUser:" (the model starting the next turn) besides any `stop`.
pub fn chat_prompt(messages: &[(String, String)]) -> String {
    let mut out = String::new();
    for (role, text) in messages {
        match role.as_str() {
            "system" | "developer" => {
                out.push_str(text.trim());
                out.push_str("\n\n");
            }
            "user" => out.push_str(&format!("User: {}\n", text.trim())),
            _ => out.push_str(&format!("Assistant: {}\n", text.trim())),
        }
    }
    out.push_str("Assistant:");
    out
}

/// The prompt ids of a conversation: through the model's own chat template (with the
/// assistant's turn begun) for a pretrained tokenizer, else through the plain one [`chat_prompt`]
/// (true in the result).
fn chat_tokens(turns: &[(String, String)], tok: &Tokenizer) -> Result<(Vec<i64>, bool), ApiError> {
    let Tokenizer::Text(t) = tok else {
        return Ok((encode_prompt(tok, &chat_prompt(turns), "messages")?, true));
    };
    let Some(template) = &t.chat_template else {
        return Err(ApiError::invalid(
            "this model has no chat template (no tokenizer.chat_template in its GGUF, no chat_template in its tokenizer_config.json); send the text to /v1/completions instead",
            Some("messages".into()),
        ));
    };
    // Templates know "system"; "developer" is OpenAI's newer name for it.
    let messages: Vec<ChatMessage> = turns
        .iter()
        .map(|(role, text)| {
            let role = if role == "developer" { "system" } else { role };
            ChatMessage::new(role, text.as_str())
        })
        .collect();
    // A template refuses conversations it cannot render (roles out of order and the like).
    let text = template.render(&messages, true).map_err(|e| {
        ApiError::invalid(
            format!("the model's chat template cannot render these messages: {e}"),
            Some("messages".into()),
        )
    })?;
    // The template writes the special tokens it wants (BOS included): none are added.
    let ids = encode_text(&t.tokenizer, &text, false)
        .map_err(|e| ApiError::invalid(format!("{e:#}"), Some("messages".into())))?;
    Ok((ids, false))
}

pub fn chat_request(
    body: &[u8],
    tok: &Tokenizer,
    limits: &Limits,
) -> Result<(GenRequest, Delivery), ApiError> {
    let (r, mut c): (ChatRequest, _) = read(body, limits)?;
    let messages = match r.messages {
        None => {
            return Err(ApiError::invalid(
                "'messages' is required",
                Some("messages".into()),
            ))
        }
        Some(m) if m.is_empty() => {
            return Err(ApiError::invalid(
                "'messages' must hold at least one message",
                Some("messages".into()),
            ))
        }
        Some(m) => m,
    };
    let mut turns = Vec::with_capacity(messages.len());
    for (i, m) in messages.into_iter().enumerate() {
        let param = || Some(format!("messages.[{i}]"));
        if !["system", "developer", "user", "assistant"].contains(&m.role.as_str()) {
            return Err(ApiError::invalid(
                format!("messages[{i}]: role '{}' is not supported (system, developer, user, assistant)", m.role),
                param(),
            ));
        }
        let text = match m.content {
            None => String::new(),
            Some(Content::Text(s)) => s,
            Some(Content::Parts(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => s.push_str(&t),
                        (kind, _) => {
                            return Err(ApiError::invalid(
                                format!("messages[{i}]: content parts of type '{kind}' are not supported (text only)"),
                                param(),
                            ))
                        }
                    }
                }
                s
            }
        };
        turns.push((m.role, text));
    }
    let (tokens, plain) = chat_tokens(&turns, tok)?;
    let prompt = check_prompt(tokens, tok, limits)?;
    let given = match (r.max_completion_tokens, c.max_tokens) {
        (Some(m), _) => positive(Some(m), "max_completion_tokens", limits.max_tokens)?,
        (None, m) => positive(m, "max_tokens", limits.max_tokens)?,
    };
    // No limit given: what is left of the context after the prompt (at least 16 tokens).
    let max_tokens = given
        .unwrap_or_else(|| (limits.context - prompt.len()).max(16))
        .min(limits.max_tokens);
    // The plain template's turns end where the model starts the next; a model's own
    // template ends them with its end-of-turn token (the tokenizer's stop ids).
    if plain {
        c.stop.push(CHAT_TURN_STOP.to_string());
    }
    check_room(&c.format, max_tokens)?;
    Ok((
        GenRequest {
            prompt,
            max_tokens,
            sampling: c.sampling,
            seed: c.seed,
            stop: c.stop,
            trim_start: plain,
            format: c.format,
        },
        c.delivery,
    ))
}

/// One response's text chunk as a server-sent event, split around its text: the event for
/// a piece of text is `prefix`, the text as a JSON string, `suffix`. Made once per response
/// from [`ResponseMeta::delta`] (the one place that shapes a chunk), it writes each token's
/// event without building a JSON value.
#[derive(Clone, Debug)]
pub struct DeltaTemplate {
    prefix: Vec<u8>,
    suffix: Vec<u8>,
}

impl DeltaTemplate {
    /// Appends the event that carries `text` to `out`.
    pub fn write(&self, text: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.prefix);
        serde_json::to_writer(&mut *out, text).expect("writing JSON to a Vec cannot fail");
        out.extend_from_slice(&self.suffix);
    }
}

/// Appends one server-sent event whose data is `v` (compact JSON: one line).
pub fn write_event(v: &Value, out: &mut Vec<u8>) {
    out.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut *out, v).expect("writing JSON to a Vec cannot fail");
    out.extend_from_slice(b"\n\n");
}

/// Identity of one response: id, creation time, model.
#[derive(Clone, Debug)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub chat: bool,
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

impl ResponseMeta {
    /// The whole (non-streamed) response.
    pub fn full(&self, text: &str, finish: Finish, prompt: usize, completion: usize) -> Value {
        let choice = if self.chat {
            json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish.as_str(),
            })
        } else {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish.as_str()})
        };
        json!({
            "id": self.id,
            "object": if self.chat { "chat.completion" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage(prompt, completion),
        })
    }

    fn chunk(&self, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": if self.chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// A stream chunk: `text` as a delta, or (with `finish`) the closing chunk.
    pub fn delta(&self, text: Option<&str>, finish: Option<Finish>) -> Value {
        let reason = finish.map(Finish::as_str);
        let choice = if self.chat {
            let delta = match text {
                Some(t) => json!({"content": t}),
                None => json!({}),
            };
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": reason})
        } else {
            json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": reason})
        };
        self.chunk(json!([choice]))
    }

    /// The template of this response's text chunks (see [`DeltaTemplate`]).
    pub fn delta_template(&self) -> DeltaTemplate {
        // A string no text chunk is built from: its JSON form marks where the text goes.
        // `choices` is the first key serialized, so a model name holding the mark cannot
        // move the split.
        const MARK: &str = "\u{1}sinter-delta-text\u{1}";
        let whole = self.delta(Some(MARK), None).to_string();
        let quoted = Value::from(MARK).to_string();
        let (prefix, suffix) = whole
            .split_once(&quoted)
            .expect("a text chunk holds its text");
        DeltaTemplate {
            prefix: format!("data: {prefix}").into_bytes(),
            suffix: format!("{suffix}\n\n").into_bytes(),
        }
    }

    /// The first chat chunk, which names the role.
    pub fn role_chunk(&self) -> Value {
        self.chunk(json!([{
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": null,
            "finish_reason": null,
        }]))
    }

    /// The chunk with `usage` and no choices (`stream_options.include_usage`).
    pub fn usage_chunk(&self, prompt: usize, completion: usize) -> Value {
        let mut c = self.chunk(json!([]));
        c["usage"] = usage(prompt, completion);
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            model_name: "m".into(),
            context: 64,
            max_tokens: 100,
        }
    }

    fn err(body: &str) -> ApiError {
        completion_request(body.as_bytes(), &Tokenizer::Bytes, &limits()).unwrap_err()
    }

    #[test]
    fn completion_requests_are_checked() {
        let (r, d) = completion_request(
            br#"{"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"stop":"x","seed":7,"stream":true,"user":"u","extra":1}"#,
            &Tokenizer::Bytes,
            &limits(),
        )
        .unwrap();
        assert_eq!((r.prompt, r.max_tokens, r.seed), (vec![104, 105], 5, 7));
        assert_eq!(r.stop, vec!["x".to_string()]);
        assert!(d.stream && !d.include_usage);
        for (body, param) in [
            (
                r#"{"model":"m","prompt":"hi","max_tokens":0}"#,
                "max_tokens",
            ),
            (
                r#"{"model":"m","prompt":"hi","max_tokens":101}"#,
                "max_tokens",
            ),
            (
                r#"{"model":"m","prompt":"hi","max_tokens":"5"}"#,
                "max_tokens",
            ),
            (
                r#"{"model":"m","prompt":"hi","temperature":-1}"#,
                "temperature",
            ),
            (r#"{"model":"m","prompt":"hi","top_p":0}"#, "top_p"),
            (r#"{"model":"m","prompt":"hi","n":2}"#, "n"),
            (r#"{"model":"m","prompt":["a","b"]}"#, "prompt"),
            (r#"{"model":"m","prompt":""}"#, "prompt"),
            (r#"{"model":"m","prompt":[300]}"#, "prompt"),
            (r#"{"model":"m","prompt":{"a":1}}"#, "prompt"),
            (
                r#"{"model":"m","prompt":"hi","stop":["a","b","c","d","e"]}"#,
                "stop",
            ),
            (r#"{"prompt":"hi"}"#, "model"),
        ] {
            let e = err(body);
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
        let long = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(65));
        assert_eq!(err(&long).code, Some("context_length_exceeded"));
        assert_eq!(
            err(r#"{"model":"other","prompt":"hi"}"#).status,
            StatusCode::NOT_FOUND
        );
        assert!(err("{not json").message.contains("not valid JSON"));
        assert!(err("[1]").message.contains("JSON object"));
    }

    #[test]
    fn text_chunks_from_the_template_are_the_chunks_as_json() {
        for chat in [false, true] {
            let meta = ResponseMeta {
                id: "cmpl-1".into(),
                created: 7,
                model: "m \"q\" \u{1}sinter-delta-text\u{1}".into(),
                chat,
            };
            let template = meta.delta_template();
            for text in [
                "a",
                " ",
                "\"",
                "\\n",
                "\n\r\t",
                "\u{1}\u{7f}",
                "é€😀",
                "</script>",
            ] {
                let mut out = Vec::new();
                template.write(text, &mut out);
                let want = format!("data: {}\n\n", meta.delta(Some(text), None));
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    want,
                    "chat {chat}: {text:?}"
                );
            }
        }
    }

    #[test]
    fn chat_uses_the_template_and_stops_at_the_next_turn() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"}]}]}"#;
        let (r, _) = chat_request(body, &Tokenizer::Bytes, &limits()).unwrap();
        let text = String::from_utf8(r.prompt.iter().map(|&t| t as u8).collect()).unwrap();
        assert_eq!(text, "Be brief.\n\nUser: Hi\nAssistant:");
        assert_eq!(r.stop, vec![CHAT_TURN_STOP.to_string()]);
        assert_eq!(r.max_tokens, 64 - text.len());
        assert!(r.trim_start);
        for body in [
            r#"{"model":"m","messages":[]}"#,
            r#"{"model":"m"}"#,
            r#"{"model":"m","messages":[{"role":"tool","content":"x"}]}"#,
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
            r#"{"model":"m","messages":"hi"}"#,
        ] {
            let e = chat_request(body.as_bytes(), &Tokenizer::Bytes, &limits()).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
        }
    }
}
