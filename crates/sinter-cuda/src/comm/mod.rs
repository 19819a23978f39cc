//! Collectives between devices, with NCCL's semantics and a driver-neutral API: real NCCL
//! (`libnccl`, loaded at run time, [`nccl`]) between GPUs, host collectives
//! ([`crate::emulated::collective`]) between emulated devices. sinter-dist's NCCL backend (unique
//! id exchange, buckets, events, timeouts) sits on this and is the same code for both.
//!
//! Every operation is queued on a [`Stream`] of the communicator's device and returns at once;
//! order it with events and poll [`Comm::async_error`] while waiting, as with NCCL. A collective
//! whose peers never arrive stays pending until [`Comm::abort`].

pub(crate) mod api;
mod nccl;

pub use api::{RedOp, UniqueId, UNIQUE_ID_BYTES};
pub use nccl::{split_nccl_version, NCCL_HINT};

use std::sync::Arc;

use crate::alloc::DevSlice;
use crate::device::CudaDevice;
use crate::driver::Stream;
use crate::emulated::collective::EmuComm;
use crate::error::{CudaError, Result};
use api::{Call, Collectives, Op};

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

/// One member (rank) of a communicator, on one device.
pub struct Comm {
    /// NCCL or the emulated collectives, picked by the device (the one place that chooses).
    imp: Box<dyn Collectives>,
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
            .field("emulated", &self.imp.is_emulated())
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
        let imp: Box<dyn Collectives> = if dev.is_emulated() {
            Box::new(EmuComm::init_rank(dev.ordinal(), id, nranks, rank)?)
        } else {
            Box::new(nccl::NcclComm::init_rank(dev, id, nranks, rank)?)
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
        if !self.imp.owns(&self.dev, stream) {
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
        self.imp.call(&self.dev, &op, stream)
    }

    /// The communicator's asynchronous error (a peer failed, the connection broke), if any.
    pub fn async_error(&self) -> Option<String> {
        self.imp.async_error()
    }

    /// Abort: pending and future operations fail instead of waiting for peers.
    pub fn abort(&mut self) {
        self.imp.abort()
    }
}
