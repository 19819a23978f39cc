//! Host backends: communicators over plain `f32` buffers, with threads in one process
//! ([`ThreadGroup`]) or TCP between processes/hosts ([`TcpCommunicator`]).
//!
//! Both transports only deliver tagged point-to-point messages into the receiving rank's
//! mailbox; the collective algorithms (module `ring`) are written once on top of that.

pub(crate) mod mailbox;
pub(crate) mod ring;
pub mod tcp;
pub mod thread;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::comm::{Communicator, ReduceOp};
use crate::error::{DistError, OpContext, Result};
use crate::store::{StoreClient, StoreServer};
use mailbox::{Mailbox, Msg, RecvFail};

pub use tcp::TcpOptions;
pub use thread::{run_on_threads, ThreadGroup};

/// Communicator of the thread backend.
pub type ThreadCommunicator = HostCommunicator;
/// Communicator of the TCP backend.
pub type TcpCommunicator = HostCommunicator;

pub(crate) enum SendFail {
    Timeout,
    Lost(String),
}

/// Delivers messages between the ranks of the world.
pub(crate) trait Transport: Send + Sync + 'static {
    fn world_rank(&self) -> usize;
    fn world_size(&self) -> usize;
    fn mailbox(&self) -> &Mailbox;
    /// Hands `data` (a segment of a `total`-element buffer) to rank `dst` (global), filed
    /// under (my rank, group, tag).
    fn send(
        &self,
        dst: usize,
        group: u64,
        tag: u64,
        op: u8,
        total: u64,
        data: &[f32],
    ) -> std::result::Result<(), SendFail>;
    fn name(&self) -> &'static str;
}

/// Tag bit of point-to-point messages (collectives use their sequence number as tag).
const P2P_TAG: u64 = 1 << 63;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub(crate) enum OpCode {
    AllReduce = 1,
    ReduceScatter = 2,
    AllGather = 3,
    Broadcast = 4,
    P2p = 5,
    Barrier = 6,
}

impl OpCode {
    fn name(code: u8) -> &'static str {
        match code {
            1 => "all_reduce",
            2 => "reduce_scatter",
            3 => "all_gather",
            4 => "broadcast",
            5 => "send",
            6 => "barrier",
            _ => "unknown op",
        }
    }
}

/// Things that live as long as any communicator split from the same world.
#[derive(Default)]
pub(crate) struct Shared {
    pub store: Option<StoreClient>,
    /// Rank 0's store server, kept alive for later use of the store by the other ranks.
    #[allow(dead_code)]
    pub server: Option<StoreServer>,
}

/// A communicator over host buffers, for either transport. Obtain one from
/// [`ThreadGroup::new`], [`tcp::connect`] or [`crate::init_from_env`].
pub struct HostCommunicator {
    transport: Arc<dyn Transport>,
    shared: Arc<Shared>,
    group: u64,
    /// Global ranks of the members, in group-rank order.
    members: Arc<Vec<usize>>,
    me: usize,
    seq: u64,
    p2p_send: HashMap<usize, u64>,
    p2p_recv: HashMap<usize, u64>,
    timeout: Duration,
    splits: HashMap<Vec<usize>, u64>,
    group_desc: Option<String>,
}

impl std::fmt::Debug for HostCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostCommunicator")
            .field("backend", &self.transport.name())
            .field("rank", &self.me)
            .field("world_size", &self.members.len())
            .field("global_rank", &self.transport.world_rank())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl HostCommunicator {
    pub(crate) fn new_world(
        transport: Arc<dyn Transport>,
        shared: Shared,
        timeout: Duration,
    ) -> Self {
        let n = transport.world_size();
        let me = transport.world_rank();
        HostCommunicator {
            transport,
            shared: Arc::new(shared),
            group: 0,
            members: Arc::new((0..n).collect()),
            me,
            seq: 0,
            p2p_send: HashMap::new(),
            p2p_recv: HashMap::new(),
            timeout,
            splits: HashMap::new(),
            group_desc: None,
        }
    }

    /// `"threads"` or `"tcp"`.
    pub fn backend(&self) -> &'static str {
        self.transport.name()
    }

    /// The rendezvous store (TCP backend of a multi-rank world), e.g. to exchange an NCCL
    /// unique id.
    pub fn store(&self) -> Option<&StoreClient> {
        self.shared.store.as_ref()
    }

    /// Global ranks of this group's members, in group-rank order.
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// Number of collectives issued so far on this communicator.
    pub fn collectives_issued(&self) -> u64 {
        self.seq
    }

    fn next_ctx(&mut self, op: &'static str) -> OpContext {
        self.seq += 1;
        OpContext {
            op,
            seq: self.seq,
            rank: self.transport.world_rank(),
            group: self.group_desc.clone(),
        }
    }

    fn link<'a>(&'a self, ctx: &'a OpContext, op: OpCode, tag: u64) -> CallLink<'a> {
        CallLink {
            t: &*self.transport,
            members: &self.members,
            me: self.me,
            group: self.group,
            tag,
            op,
            deadline: Instant::now() + self.timeout,
            timeout: self.timeout,
            ctx,
        }
    }

    fn check_rank(&self, r: usize, what: &str) -> Result<()> {
        if r >= self.members.len() {
            return Err(DistError::InvalidArgument(format!(
                "{what} rank {r} out of range for a group of {}",
                self.members.len()
            )));
        }
        Ok(())
    }
}

fn fnv1a(words: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        for b in w.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

fn describe_group(members: &[usize]) -> String {
    if members.len() <= 8 {
        format!("group {members:?}")
    } else {
        let head: Vec<String> = members[..4].iter().map(|r| r.to_string()).collect();
        format!("group of {} ranks [{}, …]", members.len(), head.join(", "))
    }
}

impl Communicator for HostCommunicator {
    fn rank(&self) -> usize {
        self.me
    }

    fn world_size(&self) -> usize {
        self.members.len()
    }

    fn global_rank(&self) -> usize {
        self.transport.world_rank()
    }

    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<()> {
        let ctx = self.next_ctx("all_reduce");
        let mut link = self.link(&ctx, OpCode::AllReduce, ctx.seq);
        ring::all_reduce(&mut link, buf, op)
    }

    fn reduce_scatter(&mut self, input: &[f32], output: &mut [f32], op: ReduceOp) -> Result<()> {
        let ctx = self.next_ctx("reduce_scatter");
        let n = self.members.len();
        if input.len() != n * output.len() {
            return Err(DistError::InvalidArgument(format!(
                "{ctx}: input length {} != group size {n} × output length {}",
                input.len(),
                output.len()
            )));
        }
        let mut link = self.link(&ctx, OpCode::ReduceScatter, ctx.seq);
        ring::reduce_scatter(&mut link, input, output, op)
    }

    fn all_gather(&mut self, input: &[f32], output: &mut [f32]) -> Result<()> {
        let ctx = self.next_ctx("all_gather");
        let n = self.members.len();
        if output.len() != n * input.len() {
            return Err(DistError::InvalidArgument(format!(
                "{ctx}: output length {} != group size {n} × input length {}",
                output.len(),
                input.len()
            )));
        }
        let mut link = self.link(&ctx, OpCode::AllGather, ctx.seq);
        ring::all_gather(&mut link, input, output)
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<()> {
        let ctx = self.next_ctx("broadcast");
        self.check_rank(root, "broadcast root")?;
        let mut link = self.link(&ctx, OpCode::Broadcast, ctx.seq);
        ring::broadcast(&mut link, buf, root)
    }

    fn send(&mut self, buf: &[f32], dst: usize) -> Result<()> {
        self.check_rank(dst, "send destination")?;
        let c = self.p2p_send.entry(dst).or_insert(0);
        *c += 1;
        let seq = *c;
        let ctx = OpContext {
            op: "send",
            seq,
            rank: self.transport.world_rank(),
            group: self.group_desc.clone(),
        };
        let mut link = self.link(&ctx, OpCode::P2p, P2P_TAG | seq);
        ring::Link::send(&mut link, dst, buf)
    }

    fn recv(&mut self, buf: &mut [f32], src: usize) -> Result<()> {
        self.check_rank(src, "recv source")?;
        let c = self.p2p_recv.entry(src).or_insert(0);
        *c += 1;
        let seq = *c;
        let ctx = OpContext {
            op: "recv",
            seq,
            rank: self.transport.world_rank(),
            group: self.group_desc.clone(),
        };
        let mut link = self.link(&ctx, OpCode::P2p, P2P_TAG | seq);
        ring::Link::recv(&mut link, src, buf)
    }

    fn barrier(&mut self) -> Result<()> {
        let ctx = self.next_ctx("barrier");
        let mut link = self.link(&ctx, OpCode::Barrier, ctx.seq);
        ring::barrier(&mut link)
    }

    fn new_group(&mut self, ranks: &[usize]) -> Result<Box<dyn Communicator>> {
        Ok(Box::new(self.split(ranks)?))
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }
}

impl HostCommunicator {
    /// [`Communicator::new_group`] returning the concrete type.
    pub fn split(&mut self, ranks: &[usize]) -> Result<HostCommunicator> {
        if ranks.is_empty() {
            return Err(DistError::InvalidArgument(
                "new_group: empty rank list".into(),
            ));
        }
        let mut seen = vec![false; self.members.len()];
        for &r in ranks {
            self.check_rank(r, "new_group member")?;
            if std::mem::replace(&mut seen[r], true) {
                return Err(DistError::InvalidArgument(format!(
                    "new_group: rank {r} listed twice"
                )));
            }
        }
        let me = ranks.iter().position(|&r| r == self.me).ok_or_else(|| {
            DistError::InvalidArgument(format!(
                "new_group: rank {} is not a member of {ranks:?}",
                self.me
            ))
        })?;
        let members: Vec<usize> = ranks.iter().map(|&r| self.members[r]).collect();
        let count = self.splits.entry(members.clone()).or_insert(0);
        *count += 1;
        let mut words = vec![self.group, *count, members.len() as u64];
        words.extend(members.iter().map(|&m| m as u64));
        let group = fnv1a(&words) | 1; // never 0 (the world)
        Ok(HostCommunicator {
            transport: self.transport.clone(),
            shared: self.shared.clone(),
            group,
            group_desc: Some(describe_group(&members)),
            members: Arc::new(members),
            me,
            seq: 0,
            p2p_send: HashMap::new(),
            p2p_recv: HashMap::new(),
            timeout: self.timeout,
            splits: HashMap::new(),
        })
    }
}

/// One call's view of the transport, implementing the ring algorithms' [`ring::Link`].
struct CallLink<'a> {
    t: &'a dyn Transport,
    members: &'a [usize],
    me: usize,
    group: u64,
    tag: u64,
    op: OpCode,
    deadline: Instant,
    timeout: Duration,
    ctx: &'a OpContext,
}

/// Messages longer than this many elements travel as several segments, so that the
/// receiver can start reducing while the rest is still in flight and buffers stay small.
const SEGMENT: usize = 1 << 18;

/// The segments of a `len`-element buffer (one empty segment for an empty buffer).
fn segments(len: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let n = len.div_ceil(SEGMENT).max(1);
    (0..n).map(move |i| i * SEGMENT..((i + 1) * SEGMENT).min(len))
}

impl CallLink<'_> {
    /// Takes the next segment (`len` elements of a `total`-element buffer) from `from`.
    fn take(&self, from: usize, total: usize, len: usize) -> Result<Msg> {
        let peer = self.members[from];
        let msg = self
            .t
            .mailbox()
            .take((peer, self.group, self.tag), self.deadline)
            .map_err(|e| match e {
                RecvFail::Timeout => DistError::Timeout {
                    ctx: self.ctx.clone(),
                    peer: Some(peer),
                    after: self.timeout,
                },
                RecvFail::Lost(reason) => DistError::PeerLost {
                    ctx: self.ctx.clone(),
                    peer,
                    reason,
                },
            })?;
        if msg.op != self.op as u8 {
            return Err(DistError::Mismatch {
                ctx: self.ctx.clone(),
                peer,
                detail: format!(
                    "rank {peer} called {} where this rank called {}",
                    OpCode::name(msg.op),
                    self.ctx.op
                ),
            });
        }
        if msg.total != total as u64 || msg.data.len() != len {
            return Err(DistError::Mismatch {
                ctx: self.ctx.clone(),
                peer,
                detail: format!(
                    "received {} values, expected {total} (buffer lengths differ between ranks?)",
                    msg.total
                ),
            });
        }
        Ok(msg)
    }
}

impl ring::Link for CallLink<'_> {
    fn size(&self) -> usize {
        self.members.len()
    }

    fn me(&self) -> usize {
        self.me
    }

    fn send(&mut self, to: usize, data: &[f32]) -> Result<()> {
        let peer = self.members[to];
        let total = data.len() as u64;
        for seg in segments(data.len()) {
            self.t
                .send(peer, self.group, self.tag, self.op as u8, total, &data[seg])
                .map_err(|e| match e {
                    SendFail::Timeout => DistError::Timeout {
                        ctx: self.ctx.clone(),
                        peer: Some(peer),
                        after: self.timeout,
                    },
                    SendFail::Lost(reason) => DistError::PeerLost {
                        ctx: self.ctx.clone(),
                        peer,
                        reason,
                    },
                })?;
        }
        Ok(())
    }

    fn recv(&mut self, from: usize, out: &mut [f32]) -> Result<()> {
        let total = out.len();
        for seg in segments(total) {
            let msg = self.take(from, total, seg.len())?;
            out[seg].copy_from_slice(&msg.data);
        }
        Ok(())
    }

    fn recv_add(&mut self, from: usize, acc: &mut [f32]) -> Result<()> {
        let total = acc.len();
        for seg in segments(total) {
            let msg = self.take(from, total, seg.len())?;
            for (a, x) in acc[seg].iter_mut().zip(&msg.data) {
                *a += *x;
            }
        }
        Ok(())
    }
}
