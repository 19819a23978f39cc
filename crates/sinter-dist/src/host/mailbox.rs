//! Per-rank inbox shared by both host transports: messages are filed under
//! (source rank, group id, tag) and taken out in arrival order.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// A message as delivered to the receiver.
pub(crate) struct Msg {
    pub op: u8,
    /// Length of the whole buffer this message is a segment of.
    pub total: u64,
    pub data: Vec<f32>,
}

/// (source global rank, group id, tag)
pub(crate) type Key = (usize, u64, u64);

pub(crate) enum RecvFail {
    Timeout,
    Lost(String),
}

#[derive(Default)]
struct Inner {
    msgs: HashMap<Key, VecDeque<Msg>>,
    lost: HashMap<usize, String>,
}

#[derive(Default)]
pub(crate) struct Mailbox {
    inner: Mutex<Inner>,
    cv: Condvar,
}

impl Mailbox {
    pub fn push(&self, key: Key, msg: Msg) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.msgs.entry(key).or_default().push_back(msg);
        drop(g);
        self.cv.notify_all();
    }

    /// Records that no more messages will come from `peer`. Messages already delivered stay
    /// receivable.
    pub fn mark_lost(&self, peer: usize, reason: String) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.lost.entry(peer).or_insert(reason);
        drop(g);
        self.cv.notify_all();
    }

    pub fn lost_reason(&self, peer: usize) -> Option<String> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.lost.get(&peer).cloned()
    }

    /// Takes the oldest message filed under `key`, waiting until `deadline`.
    pub fn take(&self, key: Key, deadline: Instant) -> Result<Msg, RecvFail> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(q) = g.msgs.get_mut(&key) {
                if let Some(m) = q.pop_front() {
                    if q.is_empty() {
                        g.msgs.remove(&key);
                    }
                    return Ok(m);
                }
            }
            if let Some(r) = g.lost.get(&key.0) {
                return Err(RecvFail::Lost(r.clone()));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(RecvFail::Timeout);
            }
            g = self
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}
