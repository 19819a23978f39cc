//! Thread backend: the ranks are threads of one process and a send files a copy of the chunk
//! straight into the receiver's mailbox.

use std::sync::Arc;
use std::time::Duration;

use super::mailbox::{Mailbox, Msg};
use super::{HostCommunicator, SendFail, Shared, Transport};
use crate::comm::default_timeout;

struct ThreadTransport {
    rank: usize,
    boxes: Arc<Vec<Mailbox>>,
}

impl Transport for ThreadTransport {
    fn world_rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.boxes.len()
    }
    fn mailbox(&self) -> &Mailbox {
        &self.boxes[self.rank]
    }
    fn send(
        &self,
        dst: usize,
        group: u64,
        tag: u64,
        op: u8,
        total: u64,
        data: &[f32],
    ) -> Result<(), SendFail> {
        if let Some(reason) = self.mailbox().lost_reason(dst) {
            return Err(SendFail::Lost(reason));
        }
        self.boxes[dst].push(
            (self.rank, group, tag),
            Msg {
                op,
                total,
                data: data.to_vec(),
            },
        );
        Ok(())
    }
    fn name(&self) -> &'static str {
        "threads"
    }
}

impl Drop for ThreadTransport {
    fn drop(&mut self) {
        // Peers waiting on this rank fail at once instead of waiting for the timeout.
        let reason = format!("rank {} dropped its communicator", self.rank);
        for (i, b) in self.boxes.iter().enumerate() {
            if i != self.rank {
                b.mark_lost(self.rank, reason.clone());
            }
        }
    }
}

/// Creates the communicators of `n` ranks that live in one process; hand one to each thread.
pub struct ThreadGroup;

impl ThreadGroup {
    /// `n` connected communicators (rank `i` at index `i`) with the default timeout
    /// ([`crate::default_timeout`]).
    #[allow(clippy::new_ret_no_self)]
    pub fn new(n: usize) -> Vec<HostCommunicator> {
        Self::with_timeout(n, default_timeout())
    }

    /// `n` connected communicators with the given per-call timeout.
    pub fn with_timeout(n: usize, timeout: Duration) -> Vec<HostCommunicator> {
        assert!(n > 0, "a thread group needs at least one rank");
        let boxes: Arc<Vec<Mailbox>> = Arc::new((0..n).map(|_| Mailbox::default()).collect());
        (0..n)
            .map(|rank| {
                let t = ThreadTransport {
                    rank,
                    boxes: boxes.clone(),
                };
                HostCommunicator::new_world(Arc::new(t), Shared::default(), timeout)
            })
            .collect()
    }
}

/// Runs `f(comm)` on `n` scoped threads, one per rank, and returns the results in rank order.
/// A panicking rank is re-raised after all threads finished.
pub fn run_on_threads<R, F>(n: usize, timeout: Duration, f: F) -> Vec<R>
where
    R: Send,
    F: Fn(HostCommunicator) -> R + Sync,
{
    let comms = ThreadGroup::with_timeout(n, timeout);
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(move || f(c))).collect();
        let results: Vec<std::thread::Result<R>> = hs.into_iter().map(|h| h.join()).collect();
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}
