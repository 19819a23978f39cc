//! Starting and stopping the server: bind, the scheduler thread, the HTTP runtime with its
//! accept loop (each connection served by `conn.rs`), and the graceful shutdown (on
//! `Server::shutdown`, on drop, or on SIGINT/SIGTERM): stop accepting, answer new requests
//! on the open connections with 503, let the requests in flight finish until the deadline,
//! cut off the rest, close the connections, return. A second signal cuts off at once.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;

use crate::api::Limits;
use crate::conn::{self, Timeouts};
use crate::embed::Embedder;
use crate::engine::{self, EngineOptions};
use crate::http::{self, unix_now, App};
use crate::metrics::Metrics;
use crate::model::{NoGeneration, ServeModel};
use crate::text::Tokenizer;

#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Address to bind (127.0.0.1: this machine only).
    pub host: String,
    /// 0 picks a free port (`Server::addr` tells which).
    pub port: u16,
    /// The model's name in requests and `/v1/models`.
    pub model_name: String,
    pub max_batch: usize,
    pub max_queue: usize,
    /// The most tokens one request may generate.
    pub max_tokens: usize,
    pub max_body_bytes: usize,
    /// Requests to `/v1/*` must carry `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// How long requests in flight may run after shutdown begins.
    pub shutdown_timeout: Duration,
    /// Header, body and idle timeouts of a connection.
    pub timeouts: Timeouts,
    /// Prompt tokens fed per sequence per scheduler step.
    pub prefill_chunk: usize,
    /// Threads of the HTTP runtime (the model's step runs on threads of its own).
    pub http_threads: usize,
    /// Shut down on SIGINT/SIGTERM (the CLI); tests stop the server themselves.
    pub handle_signals: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            host: "127.0.0.1".into(),
            port: 8080,
            model_name: "sinter".into(),
            max_batch: 16,
            max_queue: 64,
            max_tokens: 4096,
            max_body_bytes: 1 << 20,
            api_key: None,
            shutdown_timeout: Duration::from_secs(10),
            timeouts: Timeouts::default(),
            prefill_chunk: 256,
            http_threads: 2,
            handle_signals: false,
        }
    }
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    /// Not the engine handle: the scheduler ends only when every handle is gone.
    metrics: Arc<Metrics>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Server {
    /// Binds `host:port` (the error says when the address is taken) and serves `model` from
    /// background threads until `shutdown`, drop, or (with `handle_signals`) a signal.
    pub fn start<M: ServeModel>(model: M, tokenizer: Tokenizer, o: ServeOptions) -> Result<Server> {
        Server::start_with(model, tokenizer, None, o)
    }

    /// An embeddings-only server: `/v1/embeddings` answers, the completion routes say 400
    /// (the model is named by `embedder.name`).
    pub fn start_embeddings(embedder: Embedder, o: ServeOptions) -> Result<Server> {
        let o = ServeOptions {
            model_name: embedder.name.clone(),
            ..o
        };
        Server::start_inner(NoGeneration, Tokenizer::Bytes, Some(embedder), false, o)
    }

    /// `start`, with `embedder` (if any) behind `/v1/embeddings` beside the generation model.
    pub fn start_with<M: ServeModel>(
        model: M,
        tokenizer: Tokenizer,
        embedder: Option<Embedder>,
        o: ServeOptions,
    ) -> Result<Server> {
        if let Some(e) = &embedder {
            if e.name == o.model_name {
                bail!("the embedding model and the generation model are both named '{}'; give them different names", e.name);
            }
        }
        Server::start_inner(model, tokenizer, embedder, true, o)
    }

    fn start_inner<M: ServeModel>(
        model: M,
        tokenizer: Tokenizer,
        embedder: Option<Embedder>,
        generates: bool,
        o: ServeOptions,
    ) -> Result<Server> {
        if tokenizer.vocab_size() > model.vocab_size() {
            bail!(
                "the {} tokenizer makes ids up to {}, but the model's vocabulary has {} tokens",
                tokenizer.name(),
                tokenizer.vocab_size() - 1,
                model.vocab_size()
            );
        }
        o.check()?;
        let addr = (o.host.as_str(), o.port)
            .to_socket_addrs()
            .with_context(|| format!("cannot resolve host '{}'", o.host))?
            .next()
            .ok_or_else(|| anyhow!("host '{}' resolves to no address", o.host))?;
        let listener = std::net::TcpListener::bind(addr).with_context(|| {
            format!("cannot listen on {addr} (is another server using the port? pick another with --port)")
        })?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let limits = Limits {
            model_name: o.model_name.clone(),
            context: model.context(),
            max_tokens: o.max_tokens,
        };
        let (engine, scheduler) = engine::start(
            model,
            tokenizer.clone(),
            EngineOptions {
                max_batch: o.max_batch,
                max_queue: o.max_queue,
                prefill_chunk: o.prefill_chunk,
            },
            Arc::new(Metrics::default()),
        )?;
        let app = App {
            engine: engine.clone(),
            tokenizer: Arc::new(tokenizer),
            limits: Arc::new(limits),
            api_key: o.api_key.as_ref().map(|k| Arc::from(k.as_bytes())),
            started: unix_now(),
            next_id: Arc::new(AtomicU64::new(0)),
            max_body_bytes: o.max_body_bytes,
            body_timeout: o.timeouts.body,
            generates,
            embedder: embedder.map(|mut e| {
                e.max_waiting = o.max_queue;
                Arc::new(e)
            }),
        };
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("sinter-http".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(o.http_threads.max(1))
                    .thread_name("sinter-http-worker")
                    .enable_all()
                    .build()
                    .context("cannot start the async runtime")?;
                let served = rt.block_on(serve(listener, app, stopped, &o));
                // The HTTP side is gone: the scheduler ends once its queue is empty.
                drop(rt);
                let _ = scheduler.join();
                served
            })?;
        Ok(Server {
            addr,
            metrics: engine.metrics().clone(),
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The scheduler's metrics (what `/metrics` shows).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Shuts down gracefully (see the module comment) and waits until it is done.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop.take().map(|s| s.send(()));
        self.join()
    }

    /// Waits until the server stops (after a signal, with `handle_signals`).
    pub fn wait(mut self) -> Result<()> {
        self.join()
    }

    fn join(&mut self) -> Result<()> {
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => bail!("the server thread panicked"),
            None => Ok(()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.take().map(|s| s.send(()));
        let _ = self.join();
    }
}

impl ServeOptions {
    /// Refuses options that would make a server that refuses everything, in the words of
    /// the CLI's flags (`Server::start` checks them too).
    pub fn check(&self) -> Result<()> {
        if self.max_batch == 0 {
            bail!("--max-batch must be at least 1");
        }
        if self.max_tokens == 0 {
            bail!(
                "--max-tokens must be at least 1 (it is the most tokens one request may generate)"
            );
        }
        if self.max_body_bytes == 0 {
            bail!(
                "--max-body-bytes must be at least 1 (0 would refuse every request; the default is {})",
                ServeOptions::default().max_body_bytes
            );
        }
        let t = &self.timeouts;
        for (flag, d) in [
            ("--header-timeout", t.header),
            ("--body-timeout", t.body),
            ("--idle-timeout", t.idle),
        ] {
            if d.is_zero() {
                bail!(
                    "{flag} must be more than 0 seconds (0 would close every connection at once)"
                );
            }
        }
        Ok(())
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// What the cut-off requests get past the shutdown deadline to send their error event.
const CUT_OFF_GRACE: Duration = Duration::from_secs(1);

/// Accepts connections until shutdown is asked for (`stopped`, or a signal with
/// `handle_signals`), then shuts down gracefully (see the module comment).
async fn serve(
    listener: std::net::TcpListener,
    app: App,
    stopped: oneshot::Receiver<()>,
    o: &ServeOptions,
) -> Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let engine = app.engine.clone();
    // Generation requests queued or running, and embedding requests admitted.
    let in_flight = {
        let (engine, embedder) = (engine.clone(), app.embedder.clone());
        move || engine.in_flight() + embedder.as_ref().map_or(0, |e| e.in_flight())
    };
    let router = http::router(app);
    let (close, closing) = watch::channel(false);
    let mut conns = JoinSet::new();
    let signals = o.handle_signals;
    let asked = async move {
        if signals {
            tokio::select! {
                _ = stopped => {}
                _ = signal() => {}
            }
        } else {
            let _ = stopped.await;
        }
    };
    tokio::pin!(asked);
    loop {
        tokio::select! {
            _ = &mut asked => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    // Each token is a small write: without TCP_NODELAY, Nagle's algorithm
                    // would hold it until the client's delayed ACK (tens of milliseconds).
                    let _ = tcp.set_nodelay(true);
                    conns.spawn(conn::serve_connection(tcp, router.clone(), o.timeouts, closing.clone()));
                }
                // Out of file descriptors or the like: the open connections keep being
                // served, and accepting resumes in a moment.
                Err(e) => {
                    eprintln!("sinter serve: cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    // Closing first, then no more connections: whoever finds the port closed gets 503s on
    // the connections already open.
    let deadline = Instant::now() + o.shutdown_timeout;
    engine.begin_shutdown(deadline);
    drop(listener);
    eprintln!(
        "sinter serve: shutting down: {} request(s) in flight get up to {:.1} s to finish",
        in_flight(),
        o.shutdown_timeout.as_secs_f64()
    );
    if signals {
        let engine = engine.clone();
        tokio::spawn(async move {
            signal().await;
            eprintln!("sinter serve: second signal: cutting off the requests in flight");
            engine.begin_shutdown(Instant::now());
        });
    }
    // The connections stay open (new requests get 503) while requests are in flight; the
    // engine cuts those off at the deadline.
    let hard_stop = deadline + CUT_OFF_GRACE;
    while in_flight() > 0 && Instant::now() < hard_stop {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = close.send(true);
    let all_closed = async { while conns.join_next().await.is_some() {} };
    tokio::select! {
        _ = all_closed => {}
        _ = tokio::time::sleep_until(hard_stop.into()) => {
            eprintln!("sinter serve: closing the connections still open");
            conns.abort_all();
        }
    }
    Ok(())
}
