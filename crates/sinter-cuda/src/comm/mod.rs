//! Collectives between devices, with NCCL's semantics and a driver-neutral API: real NCCL
//! (`libnccl`, loaded at run time, [`nccl`]) between GPUs, host collectives
//! ([`crate::emulated::collective`]) between emulated devices. sinter-dist's NCCL backend (unique
//! id exchange, buckets, events, timeouts) sits on this and is the same code for both.
//!
//! Every operation is queued on a [`Stream`] of the communicator's device and returns at once;
//! order it with events and poll [`Comm::async_error`] while waiting, as with NCCL. A collective
//! whose peers never arrive stays pending until [`Comm::abort`].

mod nccl;

pub use nccl::{split_nccl_version, NCCL_HINT};

use std::sync::Arc;

use crate::alloc::DevSlice;
use crate::device::CudaDevice;
use crate::driver::Stream;
use crate::dtype::DType;
use crate::emulated::collective::EmuComm;
use crate::error::{CudaError, Result};

/// Bytes of a unique id (`ncclUniqueId`).
pub const UNIQUE_ID_BYTES: usize = 128;

/// What every member of a communicator passes to [`Comm::init_rank`]; made once by
/// [`unique_id`] and handed to the others (sinter-dist sends it through its TCP store).
pub type UniqueId = [u8; UNIQUE_ID_BYTES];

/// Reduction of [`Comm::all_reduce`] and [`Comm::reduce_scatter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedOp {
    Sum,
    Avg,
}

/// Which collectives library serves this process's devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Library {
    /// NCCL, with its version.
    Nccl((u32, u32, u32)),
    /// The emulated devices' host collectives.
    Emulated,
}

impl std::fmt::Display for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Library::Nccl((a, b, c)) => write!(f, "NCCL {a}.{b}.{c}"),
            Library::Emulated => {
                f.write_str("emulated NCCL (host collectives between emulated CUDA devices)")
            }
        }
    }
}

/// What serves the collectives here, or why nothing can (with the fix). Never panics.
pub fn library() -> std::result::Result<Library, String> {
    if crate::runtime::is_emulated() {
        return crate::emulated::emulator()
            .map(|_| Library::Emulated)
            .map_err(|e| e.to_string());
    }
    nccl::version().map(Library::Nccl)
}

/// A fresh unique id for a new communicator.
pub fn unique_id() -> Result<UniqueId> {
    if crate::runtime::is_emulated() {
        crate::emulated::collective::unique_id()
    } else {
        nccl::unique_id()
    }
}

enum Imp {
    Nccl(nccl::NcclComm),
    Emulated(EmuComm),
}

/// One member (rank) of a communicator, on one device.
pub struct Comm {
    imp: Imp,
    dev: Arc<CudaDevice>,
    rank: usize,
    nranks: usize,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("device", &self.dev.ordinal())
            .field("emulated", &matches!(self.imp, Imp::Emulated(_)))
            .finish()
    }
}

impl Comm {
    /// Join the communicator `id` as `rank` of `nranks`, on `dev`. Blocks until every member
    /// has joined (as `ncclCommInitRank` does).
    pub fn init_rank(
        dev: &Arc<CudaDevice>,
        id: &UniqueId,
        nranks: usize,
        rank: usize,
    ) -> Result<Comm> {
        if nranks == 0 || rank >= nranks {
            return Err(CudaError::invalid(
                "comm init",
                format!("rank {rank} of {nranks}"),
            ));
        }
        let imp = if dev.is_emulated() {
            Imp::Emulated(EmuComm::init_rank(dev.ordinal(), id, nranks, rank)?)
        } else {
            Imp::Nccl(nccl::NcclComm::init_rank(dev, id, nranks, rank)?)
        };
        Ok(Comm {
            imp,
            dev: dev.clone(),
            rank,
            nranks,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn nranks(&self) -> usize {
        self.nranks
    }
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    /// `recv = op over ranks of send` (in place when they are the same buffer).
    pub fn all_reduce(
        &self,
        send: DevSlice<'_>,
        recv: DevSlice<'_>,
        op: RedOp,
        stream: &Stream,
    ) -> Result<()> {
        let n = send.len();
        self.submit(Call::AllReduce(op), send, recv, (n, n), stream)
    }

    /// `recv` (count elements) = this rank's block of the elementwise reduction of every rank's
    /// `send` (nranks × count).
    pub fn reduce_scatter(
        &self,
        send: DevSlice<'_>,
        recv: DevSlice<'_>,
        op: RedOp,
        stream: &Stream,
    ) -> Result<()> {
        let n = recv.len();
        self.submit(
            Call::ReduceScatter(op),
            send,
            recv,
            (n * self.nranks, n),
            stream,
        )
    }

    /// `recv` (nranks × count) = every rank's `send` (count), in rank order.
    pub fn all_gather(
        &self,
        send: DevSlice<'_>,
        recv: DevSlice<'_>,
        stream: &Stream,
    ) -> Result<()> {
        let n = send.len();
        self.submit(Call::AllGather, send, recv, (n, n * self.nranks), stream)
    }

    /// `recv` = `root`'s `send` on every rank.
    pub fn broadcast(
        &self,
        send: DevSlice<'_>,
        recv: DevSlice<'_>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let n = send.len();
        self.submit(Call::Broadcast(root), send, recv, (n, n), stream)
    }

    /// Send `buf` to `peer` (completes once the peer has received it).
    pub fn send(&self, buf: DevSlice<'_>, peer: usize, stream: &Stream) -> Result<()> {
        let n = buf.len();
        self.submit(Call::Send(peer), buf, buf, (n, n), stream)
    }

    /// Receive `buf` from `peer`.
    pub fn recv(&self, buf: DevSlice<'_>, peer: usize, stream: &Stream) -> Result<()> {
        let n = buf.len();
        self.submit(Call::Recv(peer), buf, buf, (n, n), stream)
    }

    /// Check `call` (peer or root, dtypes, the buffers' lengths, the stream's device) and
    /// queue it on `stream`.
    fn submit(
        &self,
        call: Call,
        send: DevSlice<'_>,
        recv: DevSlice<'_>,
        (send_len, recv_len): (usize, usize),
        stream: &Stream,
    ) -> Result<()> {
        let name = call.name();
        let bad = |msg: String| Err(CudaError::invalid(name, msg));
        match call {
            Call::Broadcast(root) if root >= self.nranks => {
                return bad(format!("root {root} of {} ranks", self.nranks));
            }
            Call::Send(peer) | Call::Recv(peer) if peer >= self.nranks || peer == self.rank => {
                return bad(format!(
                    "peer {peer} is not another rank of {}",
                    self.nranks
                ));
            }
            _ => {}
        }
        let dtype = send.dtype();
        if !dtype.is_float() {
            return bad(format!("f32, f16 or bf16 buffers, got {dtype}"));
        }
        for (what, s, len) in [("send", &send, send_len), ("recv", &recv, recv_len)] {
            if s.dtype() != dtype || s.len() != len {
                return bad(format!(
                    "the {what} buffer must hold {len} x {dtype}, got {} x {}",
                    s.len(),
                    s.dtype()
                ));
            }
        }
        let own_stream = match &self.imp {
            Imp::Nccl(_) => stream.real().is_some(),
            Imp::Emulated(_) => stream
                .emulated()
                .is_some_and(|s| s.ordinal() == self.dev.ordinal()),
        };
        if !own_stream {
            return bad("the stream must belong to the communicator's device".into());
        }
        let op = Op {
            call,
            dtype,
            send: send.ptr(),
            recv: recv.ptr(),
            count: send_len,
            recv_count: recv_len,
        };
        match &self.imp {
            Imp::Nccl(n) => n.call(&self.dev, &op, stream),
            Imp::Emulated(e) => e.call(op, stream.emulated().expect("checked above")),
        }
    }

    /// The communicator's asynchronous error (a peer failed, the connection broke), if any.
    pub fn async_error(&self) -> Option<String> {
        match &self.imp {
            Imp::Nccl(n) => n.async_error(),
            Imp::Emulated(e) => e.async_error(),
        }
    }

    /// Abort: pending and future operations fail instead of waiting for peers.
    pub fn abort(&mut self) {
        match &mut self.imp {
            Imp::Nccl(n) => n.abort(),
            Imp::Emulated(e) => e.abort(),
        }
    }
}

/// Which collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    AllReduce(RedOp),
    ReduceScatter(RedOp),
    AllGather,
    Broadcast(usize),
    Send(usize),
    Recv(usize),
}

impl Call {
    fn name(self) -> &'static str {
        match self {
            Call::AllReduce(_) => "all_reduce",
            Call::ReduceScatter(_) => "reduce_scatter",
            Call::AllGather => "all_gather",
            Call::Broadcast(_) => "broadcast",
            Call::Send(_) => "send",
            Call::Recv(_) => "recv",
        }
    }
}

/// A validated collective: device addresses and element counts (`count` of the send buffer).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Op {
    pub call: Call,
    pub dtype: DType,
    pub send: u64,
    pub recv: u64,
    pub count: usize,
    pub recv_count: usize,
}
