//! `sinter generate` (tokens streamed to the terminal as they are made), `sinter serve` (the
//! OpenAI-compatible server of `sinter-serve`) and `sinter bench serve` (its load generator).
//! All three load a GPT and its tokenizer from a checkpoint alone: the vocabulary and the
//! context come from the weights' shapes and the run's config, not from the training data.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use sinter_core::{Device, Rng};
use sinter_models::decoder::{ContextPolicy, GenerateOptions};
use sinter_models::{Decoder, DecoderConfig, GgufWeights};
use sinter_nn::module::shared_rng;
use sinter_nn::Module;
use sinter_serve::bench::{self, LoadOptions, LoadReport};
use sinter_serve::text::Utf8Stream;
use sinter_serve::{
    BertEmbedder, DecoderModel, Embedder, ServeOptions, Server, Timeouts, Tokenizer,
};

use crate::inference;

/// A GPT ready for inference, with how to turn text into its tokens.
pub struct LoadedLm {
    pub gpt: Decoder,
    pub tokenizer: Tokenizer,
    /// The context it was trained with (≤ its position table).
    pub context: usize,
    /// The run directory's name (the default model name of `serve`).
    pub name: String,
}

/// Loads a GPT checkpoint onto `device` through [`inference::load_model`] (the architecture
/// and the tokenizer come from the checkpoint's `InferenceInfo`). Int8 checkpoints (from
/// `sinter quantize`) load through the same call: their layers run int8 on the CPU.
pub fn load_lm(path: &Path, device: Device) -> Result<LoadedLm> {
    let inf = inference::load_model(path)?;
    let model_name = inf.info.model.clone();
    let model: Box<dyn std::any::Any> = inf.model;
    let gpt = *model.downcast::<Decoder>().map_err(|_| {
        anyhow!(
            "{} holds a '{model_name}' model; generate and serve need a GPT checkpoint (gpt-tiny or gpt2)",
            path.display()
        )
    })?;
    let tokenizer = inference::tokenizer_of(&inf.info)?;
    if tokenizer.vocab_size() > gpt.config.vocab_size {
        bail!(
            "the checkpoint's vocabulary ({}) is smaller than its tokenizer's ({})",
            gpt.config.vocab_size,
            tokenizer.vocab_size()
        );
    }
    if device != Device::Cpu {
        sinter_nn::move_module(&gpt, device)?;
    }
    let dir = if path.is_dir() {
        path
    } else {
        path.parent().unwrap_or(path)
    };
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or(model_name);
    Ok(LoadedLm {
        context: inf.config.context.clamp(1, gpt.config.block_size),
        gpt,
        tokenizer,
        name,
    })
}

/// How a GGUF file's weights load to run: kept in their blocks on the CPU (the quantized
/// dot kernels: a fraction of f32's memory traffic per token), in f32 with `--dequantize`
/// or on a GPU (blocks kept there would be dequantized for every product, which an f32
/// weight skips; a model that only fits quantized loads with `GgufWeights::Quantized`).
pub fn gguf_weights(dequantize: bool, device: Device) -> GgufWeights {
    if dequantize || device != Device::Cpu {
        GgufWeights::F32
    } else {
        GgufWeights::Quantized
    }
}

/// A pretrained Llama-family model (a .gguf file or a Hugging Face directory) with its own
/// tokenizer and chat template, named after its file or directory.
pub fn load_pretrained_lm(path: &Path, device: Device, dequantize: bool) -> Result<LoadedLm> {
    let weights = gguf_weights(dequantize, device);
    let p = sinter_models::load_pretrained_with_tokenizer_as(path, weights)?;
    p.model.set_training(false);
    if device != Device::Cpu {
        sinter_nn::move_module(&p.model, device)?;
    }
    let name = path
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| path.display().to_string());
    Ok(LoadedLm {
        context: p.model.config.block_size,
        gpt: p.model,
        tokenizer: Tokenizer::text(p.tokenizer, p.chat_template),
        name,
    })
}

/// `--device` (auto, cpu, cuda[:N] or cuda-emu), saying on stderr what auto picked.
fn device(name: &str) -> Result<Device> {
    crate::precision::enable_emulation(name, 1)?;
    let (d, note) = crate::precision::resolve_device_noted(name)?;
    if let Some(n) = note {
        eprintln!("{n}");
    }
    Ok(d)
}

#[derive(Args)]
pub struct GenerateArgs {
    /// Run directory (or checkpoint file) of a GPT run.
    #[arg(long, required_unless_present = "model", conflicts_with = "model")]
    checkpoint: Option<PathBuf>,
    /// A pretrained Llama-family model: a .gguf file or a Hugging Face directory
    /// (config.json, safetensors, tokenizer.json), run with its own tokenizer.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Dequantize a GGUF file's weights to f32 (on the CPU its Q8_0/Q4_0/Q4_1/Q4_K/Q6_K
    /// matrices otherwise stay in their blocks and run on the quantized dot kernels).
    #[arg(long, requires = "model")]
    dequantize: bool,
    /// A LoRA adapter in PEFT's format (adapter_config.json, adapter_model.safetensors) to
    /// apply to --model (merged into its f32 weights).
    #[arg(long, requires = "model")]
    adapter: Option<PathBuf>,
    /// Send the prompt as a user message through the model's chat template (--model only).
    #[arg(long, requires = "model")]
    chat: bool,
    #[arg(long, default_value = "\n")]
    prompt: String,
    #[arg(long, default_value_t = 200)]
    max_new_tokens: usize,
    /// 0 picks the most likely token each time.
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    /// Sample from the k most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Sample from the smallest set of tokens whose probability reaches this (1: all).
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Past the context: shift (drop the older half of the window and re-encode the rest once)
    /// or slide (re-encode the last `context` tokens for every token: exact, slower).
    #[arg(long, default_value = "shift")]
    context_policy: String,
    /// Recompute the whole window for every token instead of using the KV cache (slower;
    /// the same tokens).
    #[arg(long)]
    no_kv_cache: bool,
    /// auto, cpu, cuda, cuda:N or cuda-emu.
    #[arg(long, default_value = "auto")]
    device: String,
}

/// `sinter generate`: prints the prompt, then each token's text as soon as it is picked
/// (whole UTF-8 characters only), flushed so that a terminal or a pipe sees it at once.
pub fn generate(g: &GenerateArgs) -> Result<()> {
    let policy: ContextPolicy = g
        .context_policy
        .parse()
        .map_err(|e| anyhow!("--context-policy: {e}"))?;
    let sampling = inference::check_sampling(g.temperature, g.top_k, g.top_p)?;
    let device = device(&g.device)?;
    let checkpoint = match (&g.checkpoint, &g.model) {
        (_, Some(model)) => return generate_pretrained(g, model, policy, sampling, device),
        (Some(c), None) => c,
        (None, None) => bail!("give --checkpoint RUN or --model PATH"),
    };
    let lm = load_lm(checkpoint, device)?;
    // Packed once for the CPU decode step (nothing happens on other devices).
    lm.gpt.pack_weights()?;
    let prompt = lm.tokenizer.encode(&g.prompt)?;
    if prompt.is_empty() {
        bail!("--prompt must not be empty");
    }
    let mut out = std::io::stdout().lock();
    let mut utf8 = Utf8Stream::default();
    let mut bytes = Vec::new();
    // A closed pipe (`| head`) ends generation quietly; other write errors are reported.
    let mut write_err: Option<std::io::Error> = None;
    let mut emit = |out: &mut std::io::StdoutLock, text: &str| -> bool {
        let r = out.write_all(text.as_bytes()).and_then(|_| out.flush());
        match r {
            Ok(()) => true,
            Err(e) => {
                if e.kind() != std::io::ErrorKind::BrokenPipe {
                    write_err = Some(e);
                }
                false
            }
        }
    };
    if !emit(&mut out, &g.prompt) {
        return finish(write_err);
    }
    let o = GenerateOptions {
        max_new: g.max_new_tokens,
        sampling,
        context: lm.context,
        policy,
        use_cache: !g.no_kv_cache,
    };
    let mut open = true;
    lm.gpt
        .generate_streaming(&prompt, &o, &mut Rng::new(g.seed), |t| {
            bytes.clear();
            lm.tokenizer.token_bytes(t, &mut bytes);
            let text = utf8.push(&bytes);
            open = text.is_empty() || emit(&mut out, &text);
            open
        })?;
    if open {
        let tail = utf8.finish() + "\n";
        emit(&mut out, &tail);
    }
    finish(write_err)
}

/// `sinter generate --model PATH`: a pretrained model with its own tokenizer (and chat
/// template with `--chat`); stops at the tokenizer's end-of-turn/end-of-text tokens.
fn generate_pretrained(
    g: &GenerateArgs,
    path: &Path,
    policy: ContextPolicy,
    sampling: sinter_models::decoder::SamplingParams,
    device: Device,
) -> Result<()> {
    let weights = gguf_weights(g.dequantize, device);
    let p = sinter_models::load_pretrained_with_tokenizer_as(path, weights)?;
    p.model.set_training(false);
    crate::trainer::lora::apply_adapter_opt(&p.model, g.adapter.as_deref())?;
    if device != Device::Cpu {
        sinter_nn::move_module(&p.model, device)?;
    }
    let text = if g.chat {
        let Some(t) = &p.chat_template else {
            bail!(
                "{} has no chat template; drop --chat to continue the prompt as text",
                path.display()
            );
        };
        t.render(
            &[sinter_data::ChatMessage::new("user", g.prompt.as_str())],
            true,
        )?
    } else {
        g.prompt.clone()
    };
    // A chat template writes its own BOS; plain text gets the tokenizer's (as serve does).
    let prompt: Vec<i64> = p
        .tokenizer
        .encode(&text, !g.chat)?
        .into_iter()
        .map(i64::from)
        .collect();
    if prompt.is_empty() {
        bail!("--prompt must not be empty");
    }
    let mut out = std::io::stdout().lock();
    let mut write_err: Option<std::io::Error> = None;
    let mut emit = |out: &mut std::io::StdoutLock, text: &str| -> bool {
        match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
            Ok(()) => true,
            Err(e) => {
                if e.kind() != std::io::ErrorKind::BrokenPipe {
                    write_err = Some(e);
                }
                false
            }
        }
    };
    if !g.chat && !emit(&mut out, &g.prompt) {
        return finish(write_err);
    }
    let o = GenerateOptions {
        max_new: g.max_new_tokens,
        sampling,
        context: p.model.config.block_size,
        policy,
        use_cache: !g.no_kv_cache,
    };
    let stops = p.tokenizer.stop_ids().to_vec();
    let mut stream = p.tokenizer.decode_stream(true);
    let mut decode_err = None;
    p.model
        .generate_streaming(&prompt, &o, &mut Rng::new(g.seed), |t| {
            if stops.contains(&(t as u32)) {
                return false;
            }
            match stream.step(t as u32) {
                Ok(Some(text)) => emit(&mut out, &text),
                Ok(None) => true,
                Err(e) => {
                    decode_err = Some(e);
                    false
                }
            }
        })?;
    if let Some(e) = decode_err {
        bail!("cannot decode the generated tokens: {e}");
    }
    emit(&mut out, "\n");
    finish(write_err)
}

fn finish(err: Option<std::io::Error>) -> Result<()> {
    match err {
        Some(e) => Err(e).context("cannot write the generated text to stdout"),
        None => Ok(()),
    }
}

#[derive(Args)]
pub struct ServeArgs {
    /// Run directory (or checkpoint file) of a GPT run.
    #[arg(long, required_unless_present = "model", conflicts_with = "model")]
    checkpoint: Option<PathBuf>,
    /// A pretrained Llama-family model: a .gguf file or a Hugging Face directory
    /// (config.json, safetensors, tokenizer.json), served with its own tokenizer and chat
    /// template; its name is the file's or directory's.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Dequantize a GGUF file's weights to f32 (on the CPU its Q8_0/Q4_0/Q4_1/Q4_K/Q6_K
    /// matrices otherwise stay in their blocks and run on the quantized dot kernels).
    #[arg(long, requires = "model")]
    dequantize: bool,
    /// A LoRA adapter in PEFT's format (adapter_config.json, adapter_model.safetensors) to
    /// apply to --model (merged into its f32 weights).
    #[arg(long, requires = "model")]
    adapter: Option<PathBuf>,
    /// Address to listen on; 127.0.0.1 keeps the server to this machine.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// auto, cpu, cuda, cuda:N or cuda-emu.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Requests decoded together at most (continuous batching).
    #[arg(long, default_value_t = 16)]
    max_batch: usize,
    /// Requests that may wait for a slot; past that, 429 with Retry-After.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// The model's name in requests and /v1/models (default: the run directory's name, or
    /// the --model file's or directory's).
    #[arg(long)]
    model_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on /v1/* (also read from SINTER_API_KEY).
    #[arg(long)]
    api_key: Option<String>,
    /// The most tokens one request may generate.
    #[arg(long, default_value_t = 4096)]
    max_tokens: usize,
    /// The largest request body accepted, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// Seconds that requests in flight get to finish after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 10.0)]
    shutdown_timeout: f64,
    /// Seconds a connection may take to send a request's head (from connecting, or from its
    /// first byte after idling); then it is closed.
    #[arg(long, default_value_t = 10.0)]
    header_timeout: f64,
    /// Seconds a request's body may take to arrive after its head; then 408.
    #[arg(long, default_value_t = 30.0)]
    body_timeout: f64,
    /// Seconds a kept-alive connection may stay open without a request.
    #[arg(long, default_value_t = 60.0)]
    idle_timeout: f64,
    /// Past the context: shift or slide (see `generate --help`).
    #[arg(long, default_value = "shift")]
    context_policy: String,
    /// Prompt tokens fed per request per scheduler step (long prompts are fed in chunks
    /// between the other requests' decode steps).
    #[arg(long, default_value_t = 256)]
    prefill_chunk: usize,
    /// Threads that run the HTTP side (the model's step has threads of its own:
    /// RAYON_NUM_THREADS, default one per core).
    #[arg(long, default_value_t = 2)]
    http_threads: usize,
    /// A BERT sentence-embedding model directory (config.json, model.safetensors,
    /// tokenizer.json; e.g. all-MiniLM-L6-v2) served on /v1/embeddings beside the generation
    /// model, named after its directory. (`--model DIR` of such a model serves it alone.)
    #[arg(long)]
    embedding_model: Option<PathBuf>,
    /// MiB of shared prompt prefixes' keys and values kept for reuse by later prompts that
    /// start with them (chat system prompts); 0 turns reuse off.
    #[arg(long, default_value_t = 64)]
    prefix_cache_mb: usize,
}

/// Whether `path` is a Hugging Face BERT directory (config.json's model_type "bert"): an
/// encoder served for embeddings.
fn is_bert_dir(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path.join("config.json")) else {
        return false;
    };
    serde_json::from_str::<serde_json::Value>(&text)
        .is_ok_and(|v| v.get("model_type").and_then(|t| t.as_str()) == Some("bert"))
}

/// A BERT directory as an embedding model with its tokenizer.json, named `name` or after the
/// directory.
fn load_embedder(path: &Path, name: Option<String>, device: Device) -> Result<Embedder> {
    let bert = sinter_models::from_hf_pretrained(path, &shared_rng(0))
        .with_context(|| format!("cannot load the embedding model {}", path.display()))?;
    bert.set_training(false);
    if device != Device::Cpu {
        sinter_nn::move_module(&bert, device)?;
    }
    let tok_path = path.join("tokenizer.json");
    let tok = sinter_data::TextTokenizer::from_file(&tok_path)
        .with_context(|| format!("the embedding model needs {}", tok_path.display()))?;
    let name = name.unwrap_or_else(|| {
        path.canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| path.display().to_string())
    });
    Ok(Embedder::new(
        BertEmbedder::new(bert),
        Tokenizer::text(tok, None),
        name,
    ))
}

/// A timeout flag's seconds: more than 0 and finite.
fn seconds(flag: &str, s: f64) -> Result<Duration> {
    if !(s.is_finite() && s > 0.0) {
        bail!("{flag} must be a number of seconds > 0, got {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

/// The URL to give clients: for a wildcard address (0.0.0.0, ::), which is no address to
/// connect to, also the loopback one that reaches it from this machine.
fn listen_url(addr: std::net::SocketAddr) -> String {
    if !addr.ip().is_unspecified() {
        return format!("http://{addr}");
    }
    let local = if addr.is_ipv4() { "127.0.0.1" } else { "[::1]" };
    format!(
        "http://{addr} (every interface; from this machine http://{local}:{})",
        addr.port()
    )
}

fn gpt_model(lm: LoadedLm, policy: &str) -> Result<(DecoderModel, Tokenizer)> {
    let mut model = DecoderModel::new(lm.gpt, lm.context)?;
    model.policy = policy
        .parse()
        .map_err(|e| anyhow!("--context-policy: {e}"))?;
    Ok((model, lm.tokenizer))
}

/// `sinter serve`: runs until SIGINT/SIGTERM, then shuts down gracefully and exits 0.
pub fn serve(a: &ServeArgs) -> Result<()> {
    if !(a.shutdown_timeout.is_finite() && a.shutdown_timeout >= 0.0) {
        bail!("--shutdown-timeout must be a number of seconds ≥ 0");
    }
    let timeouts = Timeouts {
        header: seconds("--header-timeout", a.header_timeout)?,
        body: seconds("--body-timeout", a.body_timeout)?,
        idle: seconds("--idle-timeout", a.idle_timeout)?,
    };
    let api_key = a
        .api_key
        .clone()
        .or_else(|| std::env::var("SINTER_API_KEY").ok())
        .filter(|k| !k.is_empty());
    let mut opts = ServeOptions {
        host: a.host.clone(),
        port: a.port,
        max_batch: a.max_batch,
        max_queue: a.max_queue,
        max_tokens: a.max_tokens,
        max_body_bytes: a.max_body_bytes,
        api_key: api_key.clone(),
        shutdown_timeout: Duration::from_secs_f64(a.shutdown_timeout),
        timeouts,
        prefill_chunk: a.prefill_chunk,
        http_threads: a.http_threads,
        handle_signals: true,
        ..Default::default()
    };
    // Before the (slow) model load: a bad flag is reported at once.
    opts.check()?;
    let device = device(&a.device)?;
    if let Some(dir) = a.model.as_ref().filter(|m| is_bert_dir(m)) {
        if a.embedding_model.is_some() {
            bail!(
                "--model {} is already an embedding model; drop --embedding-model",
                dir.display()
            );
        }
        let emb = load_embedder(dir, a.model_name.clone(), device)?;
        let (name, max) = (emb.name.clone(), emb.max_tokens());
        let server = Server::start_embeddings(emb, opts)?;
        eprintln!(
            "sinter serve: embedding model '{name}' (up to {max} tokens per input) on {device:?}"
        );
        println!("listening on {} (POST /v1/embeddings, GET /v1/models, /health, /metrics); Ctrl-C stops", listen_url(server.addr()));
        let _ = std::io::stdout().flush();
        server.wait()?;
        eprintln!("sinter serve: stopped");
        return Ok(());
    }
    let embedder = match &a.embedding_model {
        Some(dir) if is_bert_dir(dir) => Some(load_embedder(dir, None, device)?),
        Some(dir) => bail!("--embedding-model {}: not a BERT directory (its config.json must say \"model_type\": \"bert\")", dir.display()),
        None => None,
    };
    let lm = match (&a.checkpoint, &a.model) {
        (_, Some(model)) => load_pretrained_lm(model, device, a.dequantize)?,
        (Some(c), None) => load_lm(c, device)?,
        (None, None) => bail!("give --checkpoint RUN or --model PATH"),
    };
    crate::trainer::lora::apply_adapter_opt(&lm.gpt, a.adapter.as_deref())?;
    let name = a.model_name.clone().unwrap_or_else(|| lm.name.clone());
    opts.model_name = name.clone();
    let (context, tok_name) = (lm.context, lm.tokenizer.name());
    let (model, tokenizer) = gpt_model(lm, &a.context_policy)?;
    let model = model.with_prefix_cache(a.prefix_cache_mb << 20);
    let server = Server::start_with(model, tokenizer, embedder, opts)?;
    let addr = server.addr();
    if !addr.ip().is_loopback() {
        eprintln!(
            "warning: listening on {addr}: any machine that can reach this one can use the model{}",
            if api_key.is_none() {
                ", and no --api-key is set"
            } else {
                ""
            }
        );
    }
    eprintln!(
        "sinter serve: model '{name}' ({tok_name} tokens, context {context}) on {device:?}; max batch {}, queue {}",
        a.max_batch, a.max_queue
    );
    println!("listening on {} (POST /v1/completions, POST /v1/chat/completions, POST /v1/embeddings, GET /v1/models, /health, /metrics); Ctrl-C stops", listen_url(addr));
    let _ = std::io::stdout().flush();
    server.wait()?;
    eprintln!("sinter serve: stopped");
    Ok(())
}

#[derive(Args)]
pub struct BenchServeArgs {
    /// Serve this checkpoint (default: a randomly initialised --model).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// gpt-tiny (bytes) or gpt2 (124M, GPT-2 BPE), random weights, when no --checkpoint.
    #[arg(long, default_value = "gpt-tiny")]
    model: String,
    /// Load an already running server instead (loopback only), e.g. http://127.0.0.1:8080.
    #[arg(long)]
    url: Option<String>,
    /// The model name to request from --url.
    #[arg(long)]
    model_name: Option<String>,
    /// Concurrent streaming clients, one run per value.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    concurrency: Vec<usize>,
    /// Requests per run (default: 4 × concurrency, at least 16).
    #[arg(long)]
    requests: Option<usize>,
    /// Tokens each request generates.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    #[arg(long, default_value = "ROMEO:")]
    prompt: String,
    /// Sampling temperature of the requests.
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    /// Seconds each run may take at most.
    #[arg(long, default_value_t = 600.0)]
    time_limit: f64,
    /// Context of the random model (default: the preset's, capped at 256).
    #[arg(long)]
    context: Option<usize>,
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Threads of the server's HTTP side (see `serve --http-threads`).
    #[arg(long, default_value_t = 2)]
    http_threads: usize,
    /// Threads of the load generator's clients.
    #[arg(long, default_value_t = 2)]
    client_threads: usize,
}

/// A random GPT of a preset, for load tests without a checkpoint.
fn random_lm(preset: &str, context: Option<usize>) -> Result<LoadedLm> {
    let cfg = DecoderConfig::preset(preset)
        .ok_or_else(|| anyhow!("--model: '{preset}' is not a GPT preset (gpt-tiny, gpt2)"))?;
    let block = context.unwrap_or(cfg.block_size.min(256));
    let cfg = DecoderConfig {
        block_size: block,
        ..cfg
    };
    let tokenizer = if cfg.vocab_size == 256 {
        Tokenizer::Bytes
    } else {
        Tokenizer::gpt2()
    };
    let gpt = Decoder::new(cfg, &mut Rng::new(0), &shared_rng(0))?;
    gpt.set_training(false);
    Ok(LoadedLm {
        gpt,
        tokenizer,
        context: block,
        name: preset.to_string(),
    })
}

/// What the CPU columns say: this process's CPU time per token, and the tokens/s that it
/// allows at most when every core of the machine is busy (server, kernel TCP work and
/// clients share them). Against `--url` the server's CPU is another process's: not counted.
fn print_cpu_bounds(reports: &[LoadReport], server_here: bool) {
    if !server_here {
        println!("(the server runs in another process: the CPU columns count the clients only)");
        println!();
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for r in reports {
        let Some(cpu) = r.cpu else { continue };
        if r.completion_tokens == 0 {
            continue;
        }
        let per_token = cpu.total().as_secs_f64() / r.completion_tokens as f64;
        let bound = cores as f64 / per_token;
        println!(
            "concurrency {}: {:.1} µs of CPU per token in this process; {cores} cores allow at most {bound:.0} tokens/s at these costs (measured {:.0}, {:.0} % of it)",
            r.concurrency,
            per_token * 1e6,
            r.tokens_per_s(),
            100.0 * r.tokens_per_s() / bound
        );
    }
    println!();
}

/// `sinter bench serve`: the load generator at each concurrency, as a markdown table.
pub fn bench_serve(a: &BenchServeArgs) -> Result<()> {
    let max_c = a.concurrency.iter().copied().max().unwrap_or(1).max(1);
    let requests = |c: usize| a.requests.unwrap_or((4 * c).max(16));
    let (server, base_url, name) = match &a.url {
        Some(url) => {
            let name = a
                .model_name
                .clone()
                .ok_or_else(|| anyhow!("--url needs --model-name"))?;
            (None, url.trim_end_matches('/').to_string(), name)
        }
        None => {
            let device = device(&a.device)?;
            let lm = match &a.checkpoint {
                Some(p) => load_lm(p, device)?,
                None => random_lm(&a.model, a.context)?,
            };
            let name = lm.name.clone();
            let (model, tokenizer) = gpt_model(lm, "shift")?;
            let max_requests = a
                .concurrency
                .iter()
                .map(|&c| requests(c))
                .max()
                .unwrap_or(16);
            let server = Server::start(
                model,
                tokenizer,
                ServeOptions {
                    port: 0,
                    model_name: name.clone(),
                    max_batch: max_c,
                    max_queue: max_requests,
                    shutdown_timeout: Duration::from_secs(5),
                    http_threads: a.http_threads,
                    ..Default::default()
                },
            )?;
            let url = format!("http://{}", server.addr());
            (Some(server), url, name)
        }
    };
    println!(
        "## sinter bench serve: {name}, {} new tokens per request, prompt {:?}, streamed completions",
        a.max_tokens, a.prompt
    );
    println!();
    println!("{}", LoadReport::table_header());
    let mut reports = Vec::new();
    for &c in &a.concurrency {
        let o = LoadOptions {
            base_url: base_url.clone(),
            model: name.clone(),
            api_key: std::env::var("SINTER_API_KEY").ok(),
            concurrency: c.max(1),
            requests: requests(c),
            prompt: a.prompt.clone(),
            max_tokens: a.max_tokens,
            temperature: a.temperature,
            time_limit: Duration::from_secs_f64(a.time_limit.max(1.0)),
            client_threads: a.client_threads,
        };
        // One untimed request first (pages, caches, connections).
        if reports.is_empty() {
            bench::run_load_blocking(&LoadOptions {
                concurrency: 1,
                requests: 1,
                ..o.clone()
            })?;
        }
        let r = bench::run_load_blocking(&o)?;
        println!("{}", r.table_row());
        reports.push(r);
    }
    println!();
    print_cpu_bounds(&reports, server.is_some());
    if let (Some(one), Some(sixteen)) = (
        reports.iter().find(|r| r.concurrency == 1),
        reports.iter().find(|r| r.concurrency == 16),
    ) {
        println!(
            "tokens/s at concurrency 16 / concurrency 1: {:.2}×",
            sixteen.tokens_per_s() / one.tokens_per_s()
        );
    }
    if let Some(s) = server {
        s.shutdown()?;
    }
    let bad: Vec<String> = reports
        .iter()
        .filter(|r| !r.is_clean())
        .map(|r| {
            format!(
                "concurrency {}: {} of {} requests ok, {} errors, {} duplicate ids, server completed {:?}; {}",
                r.concurrency,
                r.ok,
                r.requests,
                r.errors,
                r.duplicate_ids,
                r.server_completed,
                r.error_samples.join("; ")
            )
        })
        .collect();
    if !bad.is_empty() {
        bail!(
            "requests were lost, duplicated or failed:\n{}",
            bad.join("\n")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{listen_url, seconds};

    #[test]
    fn the_url_printed_is_one_to_connect_to() {
        assert_eq!(
            listen_url("127.0.0.1:8080".parse().unwrap()),
            "http://127.0.0.1:8080"
        );
        let any = listen_url("0.0.0.0:9000".parse().unwrap());
        assert!(any.contains("http://127.0.0.1:9000"), "{any}");
        let any6 = listen_url("[::]:9000".parse().unwrap());
        assert!(any6.contains("http://[::1]:9000"), "{any6}");
    }

    #[test]
    fn timeouts_must_be_positive_seconds() {
        assert_eq!(seconds("--idle-timeout", 1.5).unwrap().as_millis(), 1500);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = seconds("--idle-timeout", bad).unwrap_err().to_string();
            assert!(
                e.contains("--idle-timeout must be a number of seconds > 0"),
                "{e}"
            );
        }
    }
}
