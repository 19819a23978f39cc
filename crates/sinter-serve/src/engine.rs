//! The scheduler: one thread owns the model and runs continuous batching.
//!
//! Requests wait in a queue (bounded: at most `max_batch + max_queue` requests are in the
//! server at once; `submit` refuses the next one, which the HTTP layer answers with 429).
//! Each loop iteration (a step):
//! 1. admits queued requests while the batch has free slots (a request joins at the next
//!    step; its sequence and KV cache are made then);
//! 2. drops requests whose client went away (their event channel is closed): the slot is
//!    free for the next request at once;
//! 3. decodes every sequence with one pending token (its last) together in one batched step
//!    (`ServeModel::decode`). A new prompt (or a window re-encoded past the context) of up to
//!    `FEED_MAX` tokens rides along in these steps, one token per step, when others are
//!    decoding: for a model whose step costs one read of its weights, that is much cheaper
//!    than a separate pass per prompt. Alone, or longer, a prompt is prefilled in chunks of at
//!    most `prefill_chunk` tokens per step, so that it does not stall everyone else;
//! 5. samples each sequence's next token from its logits with its own seeded RNG, turns it
//!    into text (whole UTF-8 characters, stop sequences held back), sends it to the client,
//!    and retires sequences that hit a stop sequence, the end-of-text token or `max_tokens`.
//!
//! Model calls run under `catch_unwind`: a failure fails the requests involved and the server
//! keeps serving. After `begin_shutdown`, new requests are refused; running and queued ones
//! go on until the deadline and are then cut off.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sinter_core::Rng;
use sinter_models::decoder::SamplingParams;
use tokio::sync::mpsc;

use crate::constrain::{self, JsonState, Schema, TokenBytes};
use crate::metrics::Metrics;
use crate::model::ServeModel;
use crate::text::{StopText, TokenText, Tokenizer};

/// A validated generation request.
#[derive(Clone, Debug)]
pub struct GenRequest {
    pub prompt: Vec<i64>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub seed: u64,
    pub stop: Vec<String>,
    /// Drop leading spaces of the answer (chat in the plain template, which ends with
    /// "Assistant:").
    pub trim_start: bool,
    /// `response_format`: the answer is a JSON document of this schema (constrained
    /// sampling; it ends when the document is whole).
    pub format: Option<Arc<Schema>>,
}

/// Why a completion ended (OpenAI's `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// A stop sequence or the end-of-text token.
    Stop,
    /// `max_tokens` reached.
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// What the scheduler tells a request's HTTP task.
#[derive(Debug)]
pub enum Event {
    /// More completion text (never empty).
    Text(String),
    Done {
        finish: Finish,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
    /// The request could not be completed (model error, or cut off by shutdown).
    Failed(String),
}

/// Prompts of at most this many tokens join other sequences' decode steps (see the module
/// comment) instead of being prefilled apart.
pub const FEED_MAX: usize = 16;

#[derive(Clone, Copy, Debug)]
pub struct EngineOptions {
    /// Sequences decoded together at most.
    pub max_batch: usize,
    /// Requests that may wait for a slot beyond the running batch.
    pub max_queue: usize,
    /// Prompt tokens fed per sequence per step.
    pub prefill_chunk: usize,
}

#[derive(Debug, PartialEq, Eq)]
pub enum SubmitError {
    QueueFull,
    ShuttingDown,
}

struct Job {
    req: GenRequest,
    events: mpsc::UnboundedSender<Event>,
    arrived: Instant,
}

struct Shared {
    metrics: Arc<Metrics>,
    /// Requests queued or running.
    in_system: AtomicUsize,
    capacity: usize,
    closing: AtomicBool,
    deadline: Mutex<Option<Instant>>,
}

impl Shared {
    /// Marks a running request as over and frees its place in the server at once (it leaves
    /// the batch at the end of the step).
    fn end(&self, over: &mut bool) {
        if !std::mem::replace(over, true) {
            self.in_system.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// The HTTP side's way into the scheduler (cheap to clone).
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::UnboundedSender<Job>,
    shared: Arc<Shared>,
}

impl EngineHandle {
    /// Queues a request; its text and its end arrive on the returned channel. Dropping the
    /// receiver cancels the request (its slot is freed at the next step).
    pub fn submit(&self, req: GenRequest) -> Result<mpsc::UnboundedReceiver<Event>, SubmitError> {
        let s = &self.shared;
        if s.closing.load(Ordering::SeqCst) {
            return Err(SubmitError::ShuttingDown);
        }
        let admitted = s
            .in_system
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < s.capacity).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            return Err(SubmitError::QueueFull);
        }
        let (events, rx) = mpsc::unbounded_channel();
        Metrics::add(&s.metrics.queued, 1);
        let job = Job {
            req,
            events,
            arrived: Instant::now(),
        };
        if self.tx.send(job).is_err() {
            s.in_system.fetch_sub(1, Ordering::SeqCst);
            s.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(SubmitError::ShuttingDown);
        }
        Ok(rx)
    }

    /// Refuses new requests from now on; those in the server may run until `deadline`.
    /// Called again, an earlier deadline wins.
    pub fn begin_shutdown(&self, deadline: Instant) {
        self.shared.closing.store(true, Ordering::SeqCst);
        let mut d = self
            .shared
            .deadline
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *d = Some(d.map_or(deadline, |old| old.min(deadline)));
    }

    /// Whether `begin_shutdown` was called.
    pub fn is_closing(&self) -> bool {
        self.shared.closing.load(Ordering::SeqCst)
    }

    /// Requests queued or running.
    pub fn in_flight(&self) -> usize {
        self.shared.in_system.load(Ordering::SeqCst)
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }
}

/// Starts the scheduler thread. It ends once every handle is dropped and no request is left.
pub fn start<M: ServeModel>(
    model: M,
    tokenizer: Tokenizer,
    opts: EngineOptions,
    metrics: Arc<Metrics>,
) -> std::io::Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        metrics,
        in_system: AtomicUsize::new(0),
        capacity: opts.max_batch.max(1) + opts.max_queue,
        closing: AtomicBool::new(false),
        deadline: Mutex::new(None),
    });
    let sched = Scheduler {
        model,
        tokenizer,
        opts,
        shared: shared.clone(),
        rx,
        running: Vec::new(),
        token_bytes: None,
    };
    let thread = std::thread::Builder::new()
        .name("sinter-scheduler".into())
        .spawn(move || {
            // The loop runs on a worker of the model's thread pool (sized like rayon's global
            // one), so that a step split in two hands its second part to the other worker
            // directly; from outside the pool, both parts would be injected and this thread
            // put to sleep until they are done, two more hand-offs per step.
            let pool = rayon::ThreadPoolBuilder::new()
                .thread_name(|i| format!("sinter-model-{i}"))
                .build();
            match pool {
                Ok(pool) => pool.install(|| sched.run()),
                Err(_) => sched.run(),
            }
        })?;
    Ok((EngineHandle { tx, shared }, thread))
}

/// One request in the running batch.
struct Running<S> {
    job: Job,
    seq: S,
    rng: Rng,
    detok: TokenText,
    text: StopText,
    generated: usize,
    last_token: Instant,
    /// Set when the request has left (finished, failed or cancelled).
    over: bool,
    /// The JSON document so far (`response_format`).
    json: Option<JsonState>,
}

struct Scheduler<M: ServeModel> {
    model: M,
    tokenizer: Tokenizer,
    opts: EngineOptions,
    shared: Arc<Shared>,
    rx: mpsc::UnboundedReceiver<Job>,
    running: Vec<Running<M::Seq>>,
    /// Each token's text for constrained sampling, made at the first request that needs it.
    token_bytes: Option<Arc<TokenBytes>>,
}

impl<M: ServeModel> Scheduler<M> {
    fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    fn run(mut self) {
        loop {
            if !self.admit() {
                return;
            }
            if self.past_deadline() {
                self.cut_off();
                continue;
            }
            self.drop_cancelled();
            self.step();
            self.retire();
        }
    }

    /// Takes queued requests into free slots (waiting for one when idle). false: the server
    /// is gone and nothing is left to do.
    fn admit(&mut self) -> bool {
        while self.running.len() < self.opts.max_batch.max(1) {
            let job = if self.running.is_empty() {
                match self.rx.blocking_recv() {
                    Some(j) => j,
                    None => return false,
                }
            } else {
                match self.rx.try_recv() {
                    Ok(j) => j,
                    Err(_) => break,
                }
            };
            self.metrics().queued.fetch_sub(1, Ordering::Relaxed);
            if job.events.is_closed() {
                self.leave(Outcome::Cancelled);
                continue;
            }
            let started = catch_unwind(AssertUnwindSafe(|| {
                self.model.start(&job.req.prompt, job.req.max_tokens)
            }));
            match started {
                Ok(Ok(seq)) => {
                    Metrics::add(&self.metrics().active, 1);
                    Metrics::add(
                        &self.metrics().prefix_reused_tokens_total,
                        self.model.reused(&seq) as u64,
                    );
                    Metrics::add(
                        &self.metrics().prompt_tokens_total,
                        job.req.prompt.len() as u64,
                    );
                    self.running.push(Running {
                        rng: Rng::new(job.req.seed),
                        text: StopText::new(job.req.stop.clone(), job.req.trim_start),
                        detok: TokenText::default(),
                        generated: 0,
                        last_token: job.arrived,
                        over: false,
                        json: job.req.format.clone().map(JsonState::new),
                        seq,
                        job,
                    });
                }
                Ok(Err(e)) => self.fail(&job, &format!("{e:#}")),
                Err(p) => self.fail(&job, &panic_text(&p)),
            }
        }
        true
    }

    fn past_deadline(&self) -> bool {
        let d = *self
            .shared
            .deadline
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        d.is_some_and(|d| Instant::now() >= d)
    }

    /// Shutdown's deadline has passed: every running and queued request is cut off.
    fn cut_off(&mut self) {
        for mut r in std::mem::take(&mut self.running) {
            self.metrics().active.fetch_sub(1, Ordering::Relaxed);
            if r.over {
                continue;
            }
            let _ = r.job.events.send(Event::Failed(
                "the server shut down before this request finished".into(),
            ));
            self.shared.end(&mut r.over);
            Metrics::add(&self.shared.metrics.requests_cancelled_total, 1);
        }
        while let Ok(job) = self.rx.try_recv() {
            self.metrics().queued.fetch_sub(1, Ordering::Relaxed);
            let _ = job.events.send(Event::Failed(
                "the server shut down before this request started".into(),
            ));
            self.leave(Outcome::Cancelled);
        }
    }

    fn drop_cancelled(&mut self) {
        for r in &mut self.running {
            if r.job.events.is_closed() {
                self.shared.end(&mut r.over);
                Metrics::add(&self.shared.metrics.requests_cancelled_total, 1);
            }
        }
        self.retire();
    }

    /// Splits the running requests into this step's batch and the prefills, runs both.
    fn step(&mut self) {
        let m = &self.model;
        let live = |r: &Running<M::Seq>| !r.over;
        let decoding = |r: &Running<M::Seq>| m.can_feed(&r.seq) && m.pending(&r.seq) == 1;
        let others = self.running.iter().any(|r| live(r) && decoding(r));
        let mut batch = Vec::new();
        let mut prefill = Vec::new();
        for (i, r) in self.running.iter().enumerate().filter(|(_, r)| live(r)) {
            let rides = others && m.can_feed(&r.seq) && m.pending(&r.seq) <= FEED_MAX;
            if decoding(r) || rides {
                batch.push(i);
            } else {
                prefill.push(i);
            }
        }
        for i in prefill {
            self.prefill(i);
        }
        self.decode(&batch);
    }

    fn prefill(&mut self, i: usize) {
        Metrics::add(&self.metrics().prefill_steps_total, 1);
        let chunk = self.opts.prefill_chunk.max(1);
        let r = &mut self.running[i];
        let out = catch_unwind(AssertUnwindSafe(|| self.model.prefill(&mut r.seq, chunk)));
        match out {
            Ok(Ok(Some(logits))) => self.next_token(i, &logits),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => self.fail_running(i, &format!("{e:#}")),
            Err(p) => self.fail_running(i, &panic_text(&p)),
        }
    }

    fn decode(&mut self, batch: &[usize]) {
        if batch.is_empty() {
            return;
        }
        let model = &self.model;
        let mut seqs: Vec<&mut M::Seq> = self
            .running
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| batch.contains(i))
            .map(|(_, r)| &mut r.seq)
            .collect();
        let out = catch_unwind(AssertUnwindSafe(|| model.decode(&mut seqs)));
        drop(seqs);
        Metrics::add(&self.metrics().decode_steps_total, 1);
        self.metrics().batch_size.observe(batch.len() as f64);
        let v = self.model.vocab_size();
        match out {
            Ok(Ok(logits)) => {
                let rows: Vec<(usize, &[f32])> = (batch.iter().enumerate())
                    // A prompt still being fed: its row is not a prediction yet.
                    .filter(|&(_, &i)| self.model.pending(&self.running[i].seq) == 0)
                    .map(|(k, &i)| (i, &logits[k * v..(k + 1) * v]))
                    .collect();
                let sampled = self.sample_rows(&rows);
                for ((i, row), token) in rows.into_iter().zip(sampled) {
                    let token = match token {
                        Some(t) => Some(t),
                        None => self.pick(i, row),
                    };
                    if let Some(token) = token {
                        self.next_token_is(i, token);
                    }
                }
            }
            Ok(Err(e)) => {
                let msg = format!("{e:#}");
                batch.iter().for_each(|&i| self.fail_running(i, &msg));
            }
            Err(p) => {
                let msg = panic_text(&p);
                batch.iter().for_each(|&i| self.fail_running(i, &msg));
            }
        }
    }

    /// The next token of running request i: sampled, or under its `response_format`. None:
    /// the request has failed.
    fn pick(&mut self, i: usize, logits: &[f32]) -> Option<i64> {
        if self.running[i].json.is_none() {
            let r = &mut self.running[i];
            return Some(r.job.req.sampling.sample(logits, &mut r.rng) as i64);
        }
        let table = self
            .token_bytes
            .get_or_insert_with(|| Arc::new(TokenBytes::new(&self.tokenizer, logits.len())))
            .clone();
        let r = &mut self.running[i];
        let left = r.job.req.max_tokens.saturating_sub(r.generated + 1);
        let json = r.json.as_mut().expect("checked above");
        let picked = constrain::pick(json, logits, &table, left, &r.job.req.sampling, &mut r.rng);
        if picked.is_none() {
            self.fail_running(
                i,
                "no token of the vocabulary continues the JSON document of 'response_format' here",
            );
        }
        picked
    }

    /// The next tokens of the listed running requests without a `response_format` (None for
    /// those with one, which `pick` samples), drawn on the model's threads at once: over a
    /// vocabulary of 49k, one draw is ~0.1 ms, which a batch of 16 spent on this thread
    /// alone while the other cores waited for the next step (~10 % of a step of SmolLM2).
    /// Each request draws from its own generator, so the tokens are those of drawing them
    /// one by one.
    fn sample_rows(&mut self, rows: &[(usize, &[f32])]) -> Vec<Option<i64>> {
        use rayon::prelude::*;
        let mut row_of: Vec<Option<usize>> = vec![None; self.running.len()];
        for (k, &(i, _)) in rows.iter().enumerate() {
            row_of[i] = Some(k);
        }
        let mut free: Vec<(usize, &mut Running<M::Seq>)> = (self.running.iter_mut().enumerate())
            .filter_map(|(i, r)| Some((row_of[i]?, r)))
            .filter(|(_, r)| r.json.is_none())
            .collect();
        let draw = |(k, r): &mut (usize, &mut Running<M::Seq>)| {
            (*k, r.job.req.sampling.sample(rows[*k].1, &mut r.rng) as i64)
        };
        let drawn: Vec<(usize, i64)> = if free.len() > 1 {
            free.par_iter_mut().map(draw).collect()
        } else {
            free.iter_mut().map(draw).collect()
        };
        let mut picks = vec![None; rows.len()];
        for (k, token) in drawn {
            picks[k] = Some(token);
        }
        picks
    }

    /// Samples running request i's next token, streams its text and finishes it when done.
    fn next_token(&mut self, i: usize, logits: &[f32]) {
        if let Some(token) = self.pick(i, logits) {
            self.next_token_is(i, token);
        }
    }

    /// Streams running request i's next token `token` and finishes it when done.
    fn next_token_is(&mut self, i: usize, token: i64) {
        let now = Instant::now();
        let tok = &self.tokenizer;
        let r = &mut self.running[i];
        if r.generated == 0 {
            // The prompt is all in the cache now (and not yet moved past by a shift).
            self.model.prompt_done(&r.seq);
        }
        self.model.push(&mut r.seq, token);
        r.generated += 1;
        let m = &self.shared.metrics;
        Metrics::add(&m.generation_tokens_total, 1);
        if r.generated == 1 {
            m.time_to_first_token
                .observe((now - r.job.arrived).as_secs_f64());
        } else {
            m.inter_token_latency
                .observe((now - r.last_token).as_secs_f64());
        }
        r.last_token = now;
        let mut out = String::new();
        let mut finish = None;
        if tok.is_stop(token) {
            finish = Some(Finish::Stop);
        } else {
            out = r.text.push(&r.detok.push(tok, token));
            let whole = r.json.as_ref().is_some_and(JsonState::is_complete);
            if r.text.stopped() || whole {
                finish = Some(Finish::Stop);
            }
        }
        if finish.is_none() && r.generated >= r.job.req.max_tokens {
            finish = Some(Finish::Length);
        }
        // Ended by a stop token or the length: what is still held goes out (a stop sequence
        // already cut the text, and `text` then gives nothing more).
        if finish.is_some() {
            out.push_str(&r.text.push(&r.detok.finish(tok)));
            out.push_str(&r.text.finish());
        }
        let gone = !out.is_empty() && r.job.events.send(Event::Text(out)).is_err();
        if let Some(finish) = finish {
            self.shared.end(&mut r.over);
            // Counted before the client hears of it, so that /metrics never lags a response.
            if gone || r.job.events.is_closed() {
                Metrics::add(&m.requests_cancelled_total, 1);
            } else {
                Metrics::add(&m.requests_completed_total, 1);
                m.request_duration
                    .observe((now - r.job.arrived).as_secs_f64());
            }
            let _ = r.job.events.send(Event::Done {
                finish,
                prompt_tokens: r.job.req.prompt.len(),
                completion_tokens: r.generated,
            });
        } else if gone {
            self.shared.end(&mut r.over);
            Metrics::add(&m.requests_cancelled_total, 1);
        }
    }

    fn fail_running(&mut self, i: usize, msg: &str) {
        let r = &mut self.running[i];
        if r.over {
            return;
        }
        self.shared.end(&mut r.over);
        let _ = r.job.events.send(Event::Failed(msg.to_string()));
        Metrics::add(&self.shared.metrics.requests_failed_total, 1);
    }

    fn fail(&self, job: &Job, msg: &str) {
        let _ = job.events.send(Event::Failed(msg.to_string()));
        self.leave(Outcome::Failed);
    }

    /// Removes the requests that are over from the batch (their sequences go back to the
    /// model for reuse).
    fn retire(&mut self) {
        if !self.running.iter().any(|r| r.over) {
            return;
        }
        // In order: the batch's row order stays that of arrival.
        let (over, running): (Vec<_>, Vec<_>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|r| r.over);
        self.running = running;
        self.metrics()
            .active
            .fetch_sub(over.len() as u64, Ordering::Relaxed);
        for r in over {
            self.model.recycle(r.seq);
        }
    }

    /// A request that leaves without having run (or after `cut_off`).
    fn leave(&self, outcome: Outcome) {
        let m = &self.shared.metrics;
        match outcome {
            Outcome::Cancelled => Metrics::add(&m.requests_cancelled_total, 1),
            Outcome::Failed => Metrics::add(&m.requests_failed_total, 1),
        }
        self.shared.in_system.fetch_sub(1, Ordering::SeqCst);
    }
}

enum Outcome {
    Cancelled,
    Failed,
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    let what = p
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into());
    format!("internal error in the model: {what}")
}
