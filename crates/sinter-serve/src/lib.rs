//! sinter-serve: an OpenAI-compatible HTTP server for sinter's GPT models.
//!
//! - [`server`]: start, listen, graceful shutdown on signals.
//! - [`conn`]: one connection over hyper: header, body and idle timeouts, shutdown's 503s,
//!   JSON errors for requests hyper cannot parse.
//! - [`http`]: routes (`/v1/completions`, `/v1/chat/completions`, `/v1/models`, `/health`,
//!   `/metrics`), API key, body limit, JSON responses and server-sent event streams.
//! - [`sse`]: a streamed response's body (server-sent events, coalesced per write).
//! - [`api`]: OpenAI's request and response shapes, their checks, the chat template.
//! - [`embed`]: `/v1/embeddings`: an encoder model's sentence vectors, in bounded batches.
//! - [`constrain`]: `response_format` (JSON, JSON Schema) by masking tokens that cannot
//!   continue a valid document.
//! - [`engine`]: the scheduler thread: a bounded queue and continuous batching (requests join
//!   the running batch at the next step and leave when done, each with its own KV cache).
//! - [`model`]: what the scheduler needs from a model (`ServeModel`), for the f32 GPT.
//! - [`prefix`]: shared-prompt-prefix KV reuse (an LRU of block-aligned prefixes).
//! - [`text`]: tokenizers, whole-character UTF-8 streaming, stop sequences.
//! - [`metrics`]: counters and latency histograms in Prometheus' text format.
//! - [`bench`]: the load generator behind `sinter bench serve`.
//! - [`thread_cpu`]: a load test's CPU time per role (engine, HTTP, clients), from `/proc`.

pub mod api;
pub mod bench;
pub mod conn;
pub mod constrain;
pub mod embed;
pub mod engine;
pub mod error;
pub mod http;
pub mod metrics;
pub mod model;
pub mod prefix;
pub mod server;
pub mod sse;
pub mod text;
pub mod thread_cpu;

pub use api::{chat_prompt, Limits};
pub use conn::Timeouts;
pub use embed::{BertEmbedder, EmbedModel, Embedder};
pub use engine::{Finish, GenRequest};
pub use model::{DecoderModel, ServeModel};
pub use server::{ServeOptions, Server};
pub use text::Tokenizer;
