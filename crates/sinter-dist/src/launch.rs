//! Launcher library behind `sinter launch … -- program args…`: starts this node's ranks as
//! child processes with the torchrun variables set (a line says when each started), prefixes
//! their output with `[rank N] `,
//! forwards SIGINT/SIGTERM, and if one rank fails stops the others (SIGTERM, then SIGKILL
//! after a grace period) and reports which rank failed and how.
//!
//! Each child runs in its own process group so that signals also reach whatever it spawned
//! (a `sh -c` wrapper, data-loader workers).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cluster_env::{parse_node_env, NodeSource};
use crate::error::{DistError, ExitKind, Result};
use crate::rendezvous::DEFAULT_MASTER_PORT;

/// What to launch on this node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LaunchSpec {
    /// Ranks (processes) per node, usually the number of GPUs.
    pub nproc_per_node: usize,
    /// Number of nodes of the job.
    pub nnodes: usize,
    /// Index of this node, `0..nnodes`.
    pub node_rank: usize,
    /// Host of global rank 0 (serves the rendezvous store).
    pub master_addr: String,
    pub master_port: u16,
    /// Program each rank runs, and its arguments.
    pub program: String,
    pub args: Vec<String>,
    /// CPU threads this node's ranks share: each gets RAYON_NUM_THREADS = its part
    /// ([`thread_share`]). None: the ranks inherit the launcher's environment (a
    /// RAYON_NUM_THREADS set there, else a thread per core each, which oversubscribes the
    /// cores as soon as two ranks share a machine).
    #[serde(default)]
    pub cpu_threads: Option<usize>,
}

/// Local rank `local`'s part of `threads` CPU threads shared by `ranks` ranks: an equal
/// split, the remainder to the first ranks, and at least one each.
pub fn thread_share(threads: usize, ranks: usize, local: usize) -> usize {
    let ranks = ranks.max(1);
    (threads / ranks + usize::from(local < threads % ranks)).max(1)
}

/// One rank of the layout.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RankPlan {
    pub rank: usize,
    pub local_rank: usize,
    pub node: usize,
    /// Variables set for this rank.
    pub env: Vec<(String, String)>,
}

impl LaunchSpec {
    /// Total number of ranks.
    pub fn world_size(&self) -> usize {
        self.nproc_per_node * self.nnodes
    }

    fn validate(&self) -> Result<()> {
        if self.nproc_per_node == 0 || self.nnodes == 0 {
            return Err(DistError::InvalidArgument(
                "nproc_per_node and nnodes must be at least 1".into(),
            ));
        }
        if self.node_rank >= self.nnodes {
            return Err(DistError::InvalidArgument(format!(
                "node_rank {} must be below nnodes {}",
                self.node_rank, self.nnodes
            )));
        }
        if self.program.is_empty() {
            return Err(DistError::InvalidArgument("no program to launch".into()));
        }
        Ok(())
    }

    /// The plan of every rank of node `node`.
    pub fn node_plan(&self, node: usize) -> Vec<RankPlan> {
        let world = self.world_size();
        (0..self.nproc_per_node)
            .map(|local| {
                let rank = node * self.nproc_per_node + local;
                let mut env = vec![
                    ("RANK".to_string(), rank.to_string()),
                    ("WORLD_SIZE".to_string(), world.to_string()),
                    ("LOCAL_RANK".to_string(), local.to_string()),
                    (
                        "LOCAL_WORLD_SIZE".to_string(),
                        self.nproc_per_node.to_string(),
                    ),
                    ("GROUP_RANK".to_string(), node.to_string()),
                    ("NODE_RANK".to_string(), node.to_string()),
                    ("MASTER_ADDR".to_string(), self.master_addr.clone()),
                    ("MASTER_PORT".to_string(), self.master_port.to_string()),
                ];
                if let Some(threads) = self.cpu_threads {
                    let share = thread_share(threads, self.nproc_per_node, local);
                    env.push(("RAYON_NUM_THREADS".to_string(), share.to_string()));
                }
                RankPlan {
                    rank,
                    local_rank: local,
                    node,
                    env,
                }
            })
            .collect()
    }
}

/// The layout flags of `sinter launch` (`None`: not given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFlags {
    pub nproc_per_node: Option<usize>,
    pub nnodes: Option<usize>,
    pub node_rank: Option<usize>,
    pub master_addr: Option<String>,
    pub master_port: Option<u16>,
}

/// This node's layout: each field from its flag, else from the pod's job variables
/// ([`crate::cluster_env`]), else the single-node default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLayout {
    pub nproc_per_node: usize,
    pub nnodes: usize,
    pub node_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// The job system whose variables were read, if any.
    pub source: Option<NodeSource>,
}

/// Resolves [`NodeLayout`] from the flags and an environment map (a pure function).
pub fn resolve_layout(flags: &NodeFlags, vars: &HashMap<String, String>) -> Result<NodeLayout> {
    let env = parse_node_env(vars)?;
    let from_env = |f: fn(&crate::cluster_env::NodeEnv) -> Option<usize>| env.as_ref().and_then(f);
    let nproc = flags
        .nproc_per_node
        .or_else(|| from_env(|e| e.nproc_per_node))
        .ok_or_else(|| {
            DistError::InvalidArgument(match &env {
                Some(e) => format!(
                    "{} gives no ranks per node: pass --nproc-per-node",
                    e.source.describe()
                ),
                None => {
                    "--nproc-per-node is required (no PET_NPROC_PER_NODE in the environment)".into()
                }
            })
        })?;
    let nnodes = match flags.nnodes.or_else(|| from_env(|e| e.nnodes)) {
        Some(n) => n,
        None if env.is_some() => {
            return Err(DistError::InvalidArgument(format!(
                "{} gives no node count: pass --nnodes",
                env.as_ref().map_or("", |e| e.source.describe())
            )))
        }
        None => 1,
    };
    Ok(NodeLayout {
        nproc_per_node: nproc,
        nnodes,
        node_rank: flags
            .node_rank
            .or_else(|| from_env(|e| Some(e.node_rank)))
            .unwrap_or(0),
        master_addr: flags
            .master_addr
            .clone()
            .or_else(|| env.as_ref().and_then(|e| e.master_addr.clone()))
            .unwrap_or_else(|| "127.0.0.1".into()),
        master_port: flags
            .master_port
            .or_else(|| env.as_ref().and_then(|e| e.master_port))
            .unwrap_or(DEFAULT_MASTER_PORT),
        source: env.map(|e| e.source),
    })
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The rank layout of the whole job (this node's ranks marked) and the environment each of
/// this node's ranks gets, without starting anything.
pub fn dry_run(spec: &LaunchSpec) -> String {
    let mut out = String::new();
    if let Err(e) = spec.validate() {
        return format!("invalid launch spec: {e}\n");
    }
    let cmd: Vec<String> = std::iter::once(spec.program.as_str())
        .chain(spec.args.iter().map(String::as_str))
        .map(shell_quote)
        .collect();
    out.push_str(&format!(
        "world size {} = {} node(s) × {} rank(s); this is node {}; master {}:{}\ncommand: {}\n\n",
        spec.world_size(),
        spec.nnodes,
        spec.nproc_per_node,
        spec.node_rank,
        spec.master_addr,
        spec.master_port,
        cmd.join(" ")
    ));
    out.push_str("  rank  local  node\n");
    for node in 0..spec.nnodes {
        for p in spec.node_plan(node) {
            out.push_str(&format!(
                "  {:>4}  {:>5}  {:>4}{}\n",
                p.rank,
                p.local_rank,
                p.node,
                if node == spec.node_rank {
                    "  (this node)"
                } else {
                    ""
                }
            ));
        }
    }
    out.push_str("\nenvironment of this node's ranks:\n");
    for p in spec.node_plan(spec.node_rank) {
        let vars: Vec<String> = p
            .env
            .iter()
            .map(|(k, v)| format!("{k}={}", shell_quote(v)))
            .collect();
        out.push_str(&format!("  [rank {}] {}\n", p.rank, vars.join(" ")));
    }
    out
}

/// Where the children's prefixed output goes.
#[derive(Clone, Debug, Default)]
pub enum Output {
    /// To this process's stdout/stderr (each line `[rank N] …`).
    #[default]
    Inherit,
    /// Into a shared vector of prefixed lines (tests, embedding).
    Capture(Arc<Mutex<Vec<String>>>),
}

/// Knobs of [`run_with`].
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    /// Time between SIGTERM and SIGKILL when stopping ranks (default 10 s).
    pub grace_period: Duration,
    /// Catch SIGINT/SIGTERM while running and forward them to the ranks (default true).
    pub forward_signals: bool,
    pub output: Output,
    /// Extra variables for every rank.
    pub extra_env: Vec<(String, String)>,
    /// When it turns true (with its reason), the ranks are stopped like after a failure
    /// and [`run_with`] returns [`DistError::Stopped`] (elastic restarts: another node
    /// failed).
    pub cancel: Option<Arc<Mutex<Option<String>>>>,
}

impl Default for LaunchOptions {
    fn default() -> Self {
        LaunchOptions {
            grace_period: Duration::from_secs(10),
            forward_signals: true,
            output: Output::Inherit,
            extra_env: Vec::new(),
            cancel: None,
        }
    }
}

/// How one rank ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RankExit {
    pub rank: usize,
    pub local_rank: usize,
    pub status: ExitKind,
}

/// Result of a launch in which every rank exited 0.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LaunchReport {
    pub ranks: Vec<RankExit>,
}

/// [`run_with`] with default options.
pub fn run(spec: &LaunchSpec) -> Result<LaunchReport> {
    run_with(spec, &LaunchOptions::default())
}

// ----- signals ------------------------------------------------------------------------------

static SIGNAL_COUNT: AtomicUsize = AtomicUsize::new(0);
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);
static HANDLER_USERS: Mutex<(usize, Option<(libc::sigaction, libc::sigaction)>)> =
    Mutex::new((0, None));

extern "C" fn on_signal(sig: libc::c_int) {
    // Only async-signal-safe work: two atomic stores.
    LAST_SIGNAL.store(sig, Ordering::SeqCst);
    SIGNAL_COUNT.fetch_add(1, Ordering::SeqCst);
}

struct SignalGuard;

impl SignalGuard {
    fn install() -> SignalGuard {
        let mut g = HANDLER_USERS.lock().unwrap_or_else(|e| e.into_inner());
        if g.0 == 0 {
            // SAFETY: plain sigaction calls with a zeroed struct and a handler that only
            // touches atomics.
            unsafe {
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                act.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut act.sa_mask);
                let mut old_int: libc::sigaction = std::mem::zeroed();
                let mut old_term: libc::sigaction = std::mem::zeroed();
                libc::sigaction(libc::SIGINT, &act, &mut old_int);
                libc::sigaction(libc::SIGTERM, &act, &mut old_term);
                g.1 = Some((old_int, old_term));
            }
        }
        g.0 += 1;
        SignalGuard
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        let mut g = HANDLER_USERS.lock().unwrap_or_else(|e| e.into_inner());
        g.0 -= 1;
        if g.0 == 0 {
            if let Some((old_int, old_term)) = g.1.take() {
                // SAFETY: restores the actions saved by `install`.
                unsafe {
                    libc::sigaction(libc::SIGINT, &old_int, std::ptr::null_mut());
                    libc::sigaction(libc::SIGTERM, &old_term, std::ptr::null_mut());
                }
            }
        }
    }
}

fn signal_group(pid: u32, sig: i32) {
    // SAFETY: kill(2) on the child's process group (negative pid).
    unsafe {
        libc::kill(-(pid as libc::pid_t), sig);
    }
}

fn exit_kind(st: std::process::ExitStatus) -> ExitKind {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => ExitKind::Code(c),
        (None, Some(s)) => ExitKind::Signal(s),
        (None, None) => ExitKind::Code(-1),
    }
}

// ----- output -------------------------------------------------------------------------------

fn pump(reader: impl Read, prefix: String, is_err: bool, output: Output, done: mpsc::Sender<()>) {
    let mut r = BufReader::new(reader);
    let mut line = Vec::new();
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                while line.last().is_some_and(|&c| c == b'\n' || c == b'\r') {
                    line.pop();
                }
                let text = format!("{prefix}{}", String::from_utf8_lossy(&line));
                emit(&output, is_err, text);
            }
        }
    }
    let _ = done.send(());
}

/// A launcher line (stderr) to `output`.
pub(crate) fn note(output: &Output, text: String) {
    emit(output, true, text);
}

/// One line to `output`: stderr or stdout, or the captured lines.
fn emit(output: &Output, is_err: bool, text: String) {
    match output {
        Output::Inherit => {
            if is_err {
                let mut e = std::io::stderr().lock();
                let _ = writeln!(e, "{text}");
            } else {
                let mut o = std::io::stdout().lock();
                let _ = writeln!(o, "{text}");
                let _ = o.flush();
            }
        }
        Output::Capture(v) => v.lock().unwrap_or_else(|e| e.into_inner()).push(text),
    }
}

// ----- run ----------------------------------------------------------------------------------

struct Running {
    plan: RankPlan,
    child: Child,
    exit: Option<ExitKind>,
}

/// Starts this node's ranks and waits for them. `Ok` when all exit 0; otherwise the error
/// names the first rank that failed and its exit code or signal
/// ([`DistError::RankFailed`]), or the signal the launcher received
/// ([`DistError::Interrupted`]). All ranks have exited when this returns.
pub fn run_with(spec: &LaunchSpec, opts: &LaunchOptions) -> Result<LaunchReport> {
    spec.validate()?;
    let _signals = opts.forward_signals.then(SignalGuard::install);
    let signals_at_start = SIGNAL_COUNT.load(Ordering::SeqCst);
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut pumps = 0usize;
    let mut ranks: Vec<Running> = Vec::new();

    for plan in spec.node_plan(spec.node_rank) {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .envs(plan.env.iter().map(|(k, v)| (k, v)))
            .envs(opts.extra_env.iter().map(|(k, v)| (k, v)))
            .stdin(if plan.rank == 0 {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                for r in &mut ranks {
                    signal_group(r.child.id(), libc::SIGKILL);
                    let _ = r.child.wait();
                }
                return Err(DistError::Launch(format!(
                    "cannot start `{}` for rank {}: {e}",
                    spec.program, plan.rank
                )));
            }
        };
        // A line per started rank: a launch of many ranks, or of ranks slow to print their
        // first line, is never silent.
        emit(
            &opts.output,
            true,
            format!(
                "launch: started rank {} of {} (pid {})",
                plan.rank,
                spec.world_size(),
                child.id()
            ),
        );
        let prefix = format!("[rank {}] ", plan.rank);
        if let Some(o) = child.stdout.take() {
            let (p, out, tx) = (prefix.clone(), opts.output.clone(), done_tx.clone());
            std::thread::spawn(move || pump(o, p, false, out, tx));
            pumps += 1;
        }
        if let Some(e) = child.stderr.take() {
            let (p, out, tx) = (prefix.clone(), opts.output.clone(), done_tx.clone());
            std::thread::spawn(move || pump(e, p, true, out, tx));
            pumps += 1;
        }
        ranks.push(Running {
            plan,
            child,
            exit: None,
        });
    }
    drop(done_tx);

    let mut failure: Option<(usize, usize, ExitKind)> = None;
    let mut interrupted: Option<i32> = None;
    let mut signals_seen = signals_at_start;
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    let mut stopped: Option<String> = None;
    loop {
        if stopped.is_none() && kill_at.is_none() {
            stopped = opts
                .cancel
                .as_ref()
                .and_then(|c| c.lock().unwrap_or_else(|e| e.into_inner()).clone());
            if stopped.is_some() {
                for r in ranks.iter().filter(|r| r.exit.is_none()) {
                    signal_group(r.child.id(), libc::SIGTERM);
                }
                kill_at = Some(Instant::now() + opts.grace_period);
            }
        }
        // Forward signals the launcher received.
        if opts.forward_signals {
            let c = SIGNAL_COUNT.load(Ordering::SeqCst);
            if c != signals_seen {
                signals_seen = c;
                let sig = LAST_SIGNAL.load(Ordering::SeqCst);
                for r in ranks.iter().filter(|r| r.exit.is_none()) {
                    signal_group(r.child.id(), sig);
                }
                if interrupted.is_none() {
                    interrupted = Some(sig);
                }
                kill_at.get_or_insert(Instant::now() + opts.grace_period);
            }
        }
        // Reap.
        for r in ranks.iter_mut().filter(|r| r.exit.is_none()) {
            if let Ok(Some(st)) = r.child.try_wait() {
                let k = exit_kind(st);
                r.exit = Some(k);
                if !k.success() && failure.is_none() && interrupted.is_none() && kill_at.is_none() {
                    failure = Some((r.plan.rank, r.plan.local_rank, k));
                }
            }
        }
        if ranks.iter().all(|r| r.exit.is_some()) {
            break;
        }
        // First failure: stop the others.
        if failure.is_some() && kill_at.is_none() {
            for r in ranks.iter().filter(|r| r.exit.is_none()) {
                signal_group(r.child.id(), libc::SIGTERM);
            }
            kill_at = Some(Instant::now() + opts.grace_period);
        }
        if let Some(t) = kill_at {
            if !killed && Instant::now() >= t {
                for r in ranks.iter().filter(|r| r.exit.is_none()) {
                    signal_group(r.child.id(), libc::SIGKILL);
                }
                killed = true;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // Leftovers of failed ranks' groups (e.g. a shell's children) would keep pipes open.
    if failure.is_some() || interrupted.is_some() || stopped.is_some() {
        for r in &ranks {
            signal_group(r.child.id(), libc::SIGKILL);
        }
    }
    // Drain output, but do not hang on a grandchild that escaped its group.
    let drain_deadline = Instant::now() + Duration::from_secs(2);
    for _ in 0..pumps {
        let left = drain_deadline.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            break;
        }
    }

    if let Some((rank, local_rank, status)) = failure {
        return Err(DistError::RankFailed {
            rank,
            local_rank,
            node: spec.node_rank,
            status,
        });
    }
    if let Some(signal) = interrupted {
        return Err(DistError::Interrupted { signal });
    }
    if let Some(reason) = stopped {
        return Err(DistError::Stopped(reason));
    }
    Ok(LaunchReport {
        ranks: ranks
            .iter()
            .map(|r| RankExit {
                rank: r.plan.rank,
                local_rank: r.plan.local_rank,
                status: r.exit.unwrap_or(ExitKind::Code(0)),
            })
            .collect(),
    })
}
