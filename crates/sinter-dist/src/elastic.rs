//! Elastic restarts for `sinter launch --max-restarts N` (torchrun's elastic agent, in
//! small): when a rank dies, every node stops its ranks and the whole group starts again in
//! a new *round*, whose command (built by the caller) resumes from the last checkpoint.
//!
//! On one node the launcher just runs the rounds. Across nodes the launchers agree on each
//! round through a store served by node 0's launcher at `MASTER_ADDR:MASTER_PORT` (the
//! ranks' own store then moves to `MASTER_PORT + 1`). Keys of round `g`:
//!
//! - `elastic/g{g}/node/{n}`: node `n` (its `--node-rank`) joined; the value is its host;
//! - `elastic/g{g}/members`: set by node 0 once `--max-nodes` nodes joined, or at least
//!   `--min-nodes` did and `last_call` passed: the node ranks of the round, sorted (a node's
//!   rank in the round is its position, so the world can shrink and survivors keep order);
//! - `elastic/g{g}/failed`: the first failure of the round; every node watching it stops
//!   its ranks and joins round `g + 1`;
//! - `elastic/g{g}/finished`: count of nodes whose ranks all exited 0.
//!
//! Every wait is bounded by the rendezvous timeout, and the error names the node, its host,
//! the address and the time waited. Node 0's launcher is the rendezvous: if it dies, the
//! job ends (as with torchrun's static master).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cluster_env::host_name;
use crate::error::{fmt_secs, DistError, Result};
use crate::launch::{run_with, LaunchOptions, LaunchReport, LaunchSpec};
use crate::store::{StoreClient, StoreServer};

/// Variable telling each rank its restart round (0 for the first start), like torchrun's
/// `TORCHELASTIC_RESTART_COUNT`.
pub const RESTART_ROUND_VAR: &str = "SINTER_RESTART_ROUND";

/// Knobs of [`run_elastic`].
#[derive(Debug, Clone)]
pub struct ElasticOptions {
    /// Restarts of the whole group allowed after failures.
    pub max_restarts: usize,
    /// Fewest nodes a round may run with.
    pub min_nodes: usize,
    /// Most nodes of a round (node ranks are `0..max_nodes`).
    pub max_nodes: usize,
    /// Longest wait for the rendezvous (connecting, a round closing, the others finishing).
    pub rdzv_timeout: Duration,
    /// Once `min_nodes` joined a round, how long node 0 waits for more.
    pub last_call: Duration,
}

/// Whether the launch needs the rendezvous of launchers (several nodes with restarts or a
/// variable node count); otherwise each node's [`run_with`] alone does, as without
/// `--max-restarts`.
pub fn needs_agent(spec: &LaunchSpec, el: &ElasticOptions) -> bool {
    let _ = spec;
    el.max_nodes > 1 && (el.max_restarts > 0 || el.min_nodes < el.max_nodes)
}

/// The launchers' rendezvous, seen from one node.
struct Agent {
    /// Served by node 0's launcher (kept alive until the job ends).
    _server: Option<StoreServer>,
    store: StoreClient,
    endpoint: String,
    node: usize,
    host: String,
}

impl Agent {
    fn connect(spec: &LaunchSpec, el: &ElasticOptions) -> Result<Agent> {
        let endpoint = endpoint(&spec.master_addr, spec.master_port);
        let host = host_name();
        let server = if spec.node_rank == 0 {
            Some(match StoreServer::bind(endpoint.as_str()) {
                Ok(s) => s,
                // MASTER_ADDR may name this host by an address it cannot bind (NAT, alias).
                Err(_) => StoreServer::bind(("0.0.0.0", spec.master_port))?,
            })
        } else {
            None
        };
        let store = StoreClient::connect(&endpoint, el.rdzv_timeout).map_err(|e| {
            DistError::Launch(format!(
                "node {} (host {host}) could not reach the launchers' rendezvous at {endpoint} (node 0's `sinter launch`) within {}: {e}",
                spec.node_rank,
                fmt_secs(el.rdzv_timeout)
            ))
        })?;
        Ok(Agent {
            _server: server,
            store,
            endpoint,
            node: spec.node_rank,
            host,
        })
    }

    fn key(round: usize, k: &str) -> String {
        format!("elastic/g{round}/{k}")
    }

    fn lost(&self, e: DistError) -> DistError {
        DistError::Launch(format!(
            "node {} (host {}) lost the launchers' rendezvous at {} (node 0's launcher gone?): {e}",
            self.node, self.host, self.endpoint
        ))
    }

    /// Joins round `round` and returns its members (node ranks, sorted).
    fn join(&self, round: usize, el: &ElasticOptions) -> Result<Vec<usize>> {
        let node_key = Self::key(round, &format!("node/{}", self.node));
        self.store
            .set(&node_key, self.host.as_bytes())
            .map_err(|e| self.lost(e))?;
        let members = if self.node == 0 {
            self.close_round(round, el)?
        } else {
            let v = self
                .store
                .wait(&Self::key(round, "members"), el.rdzv_timeout)
                .map_err(|e| self.lost(e))?
                .ok_or_else(|| DistError::Launch(format!(
                    "node {} (host {}): round {round} of the rendezvous at {} did not start within {}: node 0 is still waiting for nodes, or is gone",
                    self.node, self.host, self.endpoint, fmt_secs(el.rdzv_timeout)
                )))?;
            parse_members(&v)?
        };
        if !members.contains(&self.node) {
            return Err(DistError::Launch(format!(
                "node {} (host {}) joined round {round} after it started with nodes {members:?}; restart the job to add it",
                self.node, self.host
            )));
        }
        Ok(members)
    }

    /// Node 0: waits for the nodes of `round`, then publishes its members.
    fn close_round(&self, round: usize, el: &ElasticOptions) -> Result<Vec<usize>> {
        let start = Instant::now();
        let mut enough_since: Option<Instant> = None;
        loop {
            let mut joined = Vec::new();
            for n in 0..el.max_nodes {
                if self
                    .store
                    .get(&Self::key(round, &format!("node/{n}")))
                    .map_err(|e| self.lost(e))?
                    .is_some()
                {
                    joined.push(n);
                }
            }
            let now = Instant::now();
            if joined.len() >= el.min_nodes {
                let since = *enough_since.get_or_insert(now);
                if joined.len() == el.max_nodes || now - since >= el.last_call {
                    let v: Vec<String> = joined.iter().map(usize::to_string).collect();
                    self.store
                        .set(&Self::key(round, "members"), v.join(",").as_bytes())
                        .map_err(|e| self.lost(e))?;
                    return Ok(joined);
                }
            }
            if now - start >= el.rdzv_timeout {
                let missing: Vec<usize> =
                    (0..el.max_nodes).filter(|n| !joined.contains(n)).collect();
                return Err(DistError::Launch(format!(
                    "round {round} of the rendezvous at {}: only {} of the {} node(s) needed (--min-nodes) joined within {}; node rank(s) {missing:?} never reached it (down, or cannot reach {})",
                    self.endpoint,
                    joined.len(),
                    el.min_nodes,
                    fmt_secs(el.rdzv_timeout),
                    self.endpoint
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Records the round's first failure (the others stop and restart).
    fn fail(&self, round: usize, why: &str) {
        let key = Self::key(round, "failed");
        if matches!(self.store.get(&key), Ok(None)) {
            let _ = self.store.set(&key, why.as_bytes());
        }
    }

    /// Node 0 after its ranks succeeded: keeps the rendezvous up until every member is done
    /// (or a failure, or the timeout), so that no node loses it mid-round.
    fn wait_finished(&self, round: usize, members: usize, el: &ElasticOptions) {
        let deadline = Instant::now() + el.rdzv_timeout;
        while Instant::now() < deadline {
            let done = self
                .store
                .add(&Self::key(round, "finished"), 0)
                .unwrap_or(0);
            let failed = matches!(self.store.get(&Self::key(round, "failed")), Ok(Some(_)));
            if done as usize >= members || failed {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn endpoint(addr: &str, port: u16) -> String {
    if addr.contains(':') && !addr.starts_with('[') {
        format!("[{addr}]:{port}")
    } else {
        format!("{addr}:{port}")
    }
}

fn parse_members(v: &[u8]) -> Result<Vec<usize>> {
    let s = String::from_utf8_lossy(v);
    s.split(',')
        .map(|x| x.parse::<usize>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| DistError::Store(format!("bad member list `{s}` in the rendezvous")))
}

/// Watches a round's `failed` key on its own connection and raises `cancel` when it
/// appears (or when the rendezvous is lost).
fn watch(
    endpoint: String,
    round: usize,
    timeout: Duration,
    cancel: Arc<Mutex<Option<String>>>,
    done: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let set = |why: String| *cancel.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
        let store = match StoreClient::connect(&endpoint, timeout) {
            Ok(s) => s,
            Err(e) => return set(format!("lost the rendezvous at {endpoint}: {e}")),
        };
        let key = Agent::key(round, "failed");
        while !done.load(Ordering::SeqCst) {
            match store.get(&key) {
                Ok(Some(v)) => return set(String::from_utf8_lossy(&v).into_owned()),
                Ok(None) => {}
                Err(e) => return set(format!("lost the rendezvous at {endpoint}: {e}")),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

/// Runs `spec` with restarts: round `g` runs `args_for_round(g)` (round 0 the original
/// command; later rounds should resume from the last checkpoint). Ends `Ok` when a round's
/// ranks all exit 0; a failed round is followed by another until `max_restarts` are used,
/// then the last failure is returned, saying so. A signal to the launcher ends it at once.
pub fn run_elastic(
    spec: &LaunchSpec,
    opts: &LaunchOptions,
    el: &ElasticOptions,
    args_for_round: &dyn Fn(usize) -> Vec<String>,
) -> Result<LaunchReport> {
    if el.min_nodes == 0 || el.min_nodes > el.max_nodes || spec.node_rank >= el.max_nodes {
        return Err(DistError::InvalidArgument(format!(
            "need 1 <= min nodes ({}) <= max nodes ({}) and node rank {} below max nodes",
            el.min_nodes, el.max_nodes, spec.node_rank
        )));
    }
    let agent = if needs_agent(spec, el) {
        if spec.master_port == u16::MAX {
            return Err(DistError::InvalidArgument(
                "the elastic launcher needs MASTER_PORT and MASTER_PORT + 1; pick a port below 65535".into(),
            ));
        }
        Some(Agent::connect(spec, el)?)
    } else {
        None
    };
    let mut round = 0;
    loop {
        let mut s = spec.clone();
        s.args = args_for_round(round);
        let members = match &agent {
            Some(a) => {
                let m = a.join(round, el)?;
                s.nnodes = m.len();
                s.node_rank = m.iter().position(|&n| n == a.node).unwrap_or(0);
                s.master_port = spec.master_port + 1;
                m.len()
            }
            None => 1,
        };
        let mut o = opts.clone();
        o.extra_env
            .push((RESTART_ROUND_VAR.to_string(), round.to_string()));
        let cancel = Arc::new(Mutex::new(None));
        let done = Arc::new(AtomicBool::new(false));
        let watcher = agent.as_ref().map(|a| {
            o.cancel = Some(cancel.clone());
            watch(
                a.endpoint.clone(),
                round,
                el.rdzv_timeout,
                cancel.clone(),
                done.clone(),
            )
        });
        let r = run_with(&s, &o);
        done.store(true, Ordering::SeqCst);
        if let Some(w) = watcher {
            let _ = w.join();
        }
        let err = match r {
            Ok(rep) => {
                if let Some(a) = &agent {
                    let _ = a.store.add(&Agent::key(round, "finished"), 1);
                    if a.node == 0 {
                        a.wait_finished(round, members, el);
                    }
                }
                return Ok(rep);
            }
            Err(e @ (DistError::RankFailed { .. } | DistError::Stopped(_))) => e,
            Err(e) => {
                if let Some(a) = &agent {
                    a.fail(round, &format!("node {}: {e}", a.node));
                }
                return Err(e);
            }
        };
        if let Some(a) = &agent {
            if let DistError::RankFailed { .. } = err {
                a.fail(round, &format!("node {} (host {}): {err}", a.node, a.host));
            }
        }
        if round >= el.max_restarts {
            return Err(DistError::Launch(format!(
                "{err}; no restarts left (--max-restarts {} used)",
                el.max_restarts
            )));
        }
        round += 1;
        crate::launch::note(
            &opts.output,
            format!(
                "launch: {err}; restarting the group from the last checkpoint (restart {round} of {})",
                el.max_restarts
            ),
        );
    }
}
