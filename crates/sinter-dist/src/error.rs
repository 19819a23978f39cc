//! Error type of the distributed layer.
//!
//! Every failure of a collective names the operation, the calling rank, the collective's
//! sequence number and, where known, the peer it was waiting for, e.g.
//! `all_reduce #17 on rank 2 timed out after 30 s waiting for rank 1`.

use std::fmt;
use std::time::Duration;

/// Shorthand for results of this crate.
pub type Result<T, E = DistError> = std::result::Result<T, E>;

/// Which call failed: operation name, sequence number within its group, calling rank (global),
/// and a short description of the group when it is not the world group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpContext {
    /// `all_reduce`, `reduce_scatter`, `all_gather`, `broadcast`, `send`, `recv`, `barrier`,
    /// `rendezvous`, …
    pub op: &'static str,
    /// 1-based sequence number of the call within its communicator (collectives share one
    /// counter; point-to-point calls count per peer and direction).
    pub seq: u64,
    /// Global rank of the caller.
    pub rank: usize,
    /// `None` for the world group, else e.g. `group [0, 2, 4, 6]`.
    pub group: Option<String>,
}

impl fmt::Display for OpContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} #{} on rank {}", self.op, self.seq, self.rank)?;
        if let Some(g) = &self.group {
            write!(f, " ({g})")?;
        }
        Ok(())
    }
}

/// How a child process ended (launcher).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ExitKind {
    /// Normal exit with this code.
    Code(i32),
    /// Killed by this signal number.
    Signal(i32),
}

impl ExitKind {
    /// True for a clean `exit(0)`.
    pub fn success(&self) -> bool {
        matches!(self, ExitKind::Code(0))
    }
}

impl fmt::Display for ExitKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitKind::Code(c) => write!(f, "exit code {c}"),
            ExitKind::Signal(s) => write!(f, "signal {s} ({})", signal_name(*s)),
        }
    }
}

/// Conventional name of a POSIX signal number.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        _ => "signal",
    }
}

/// Formats a duration in seconds without noise: `30 s`, `0.25 s`.
pub fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if (s - s.round()).abs() < 1e-9 {
        format!("{} s", s.round() as u64)
    } else {
        let t = format!("{s:.3}");
        let t = t.trim_end_matches('0').trim_end_matches('.');
        format!("{t} s")
    }
}

/// Errors of the distributed layer.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// A collective, point-to-point call or rendezvous step did not complete in time.
    #[error("{ctx} timed out after {} waiting for {}", fmt_secs(*.after), peer_desc(*.peer))]
    Timeout {
        ctx: OpContext,
        /// Global rank waited for, if known.
        peer: Option<usize>,
        after: Duration,
    },
    /// The connection to a peer closed (the peer died or dropped its communicator).
    #[error("{ctx} failed: connection to rank {peer} lost ({reason})")]
    PeerLost {
        ctx: OpContext,
        peer: usize,
        reason: String,
    },
    /// The peer's message does not fit this call (different op, different buffer length).
    #[error("{ctx}: mismatch with rank {peer}: {detail}")]
    Mismatch {
        ctx: OpContext,
        peer: usize,
        detail: String,
    },
    /// A bad argument (buffer lengths, rank out of range, …).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Environment variables could not be understood.
    #[error("distributed environment: {0}")]
    Env(String),
    /// The key-value store failed.
    #[error("store: {0}")]
    Store(String),
    /// An I/O error with context.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A launched rank exited non-zero or was killed.
    #[error("rank {rank} (local rank {local_rank} on node {node}) failed with {status}")]
    RankFailed {
        rank: usize,
        local_rank: usize,
        node: usize,
        status: ExitKind,
    },
    /// The launcher received a signal, forwarded it and stopped the ranks.
    #[error("launcher interrupted by {} ({}); ranks were stopped", signal_name(*.signal), .signal)]
    Interrupted { signal: i32 },
    /// The launcher stopped its ranks on request (another node's rank failed: the group
    /// restarts).
    #[error("ranks stopped: {0}")]
    Stopped(String),
    /// The launcher could not start a rank.
    #[error("launch: {0}")]
    Launch(String),
    /// The device backend (CUDA / NCCL) failed or is unavailable.
    #[error("{0}")]
    Backend(String),
    /// The background thread of an [`crate::AsyncCommunicator`] is gone.
    #[error("asynchronous communicator has shut down")]
    Shutdown,
}

fn peer_desc(p: Option<usize>) -> String {
    match p {
        Some(r) => format!("rank {r}"),
        None => "peers".to_string(),
    }
}

impl DistError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        DistError::Io {
            context: context.into(),
            source,
        }
    }

    /// The operation context, for errors raised by a collective or point-to-point call.
    pub fn context(&self) -> Option<&OpContext> {
        match self {
            DistError::Timeout { ctx, .. }
            | DistError::PeerLost { ctx, .. }
            | DistError::Mismatch { ctx, .. } => Some(ctx),
            _ => None,
        }
    }

    /// True for a timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self, DistError::Timeout { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages() {
        assert_eq!(fmt_secs(Duration::from_secs(30)), "30 s");
        assert_eq!(fmt_secs(Duration::from_millis(250)), "0.25 s");
        let ctx = OpContext {
            op: "all_reduce",
            seq: 17,
            rank: 2,
            group: None,
        };
        let e = DistError::Timeout {
            ctx: ctx.clone(),
            peer: Some(1),
            after: Duration::from_secs(30),
        };
        assert_eq!(
            e.to_string(),
            "all_reduce #17 on rank 2 timed out after 30 s waiting for rank 1"
        );
        let g = OpContext {
            group: Some("group [0, 2]".into()),
            ..ctx
        };
        let e = DistError::Timeout {
            ctx: g,
            peer: None,
            after: Duration::from_secs(1),
        };
        assert_eq!(
            e.to_string(),
            "all_reduce #17 on rank 2 (group [0, 2]) timed out after 1 s waiting for peers"
        );
        assert_eq!(ExitKind::Signal(15).to_string(), "signal 15 (SIGTERM)");
    }
}
