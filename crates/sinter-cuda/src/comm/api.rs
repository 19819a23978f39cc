//! What the communicator's two implementations share: the collectives trait that NCCL
//! ([`super::nccl`]) and the emulated collectives (`crate::emulated::collective`) implement, and
//! the values that cross it. Below both; `comm/mod.rs` picks one per communicator.

use crate::device::CudaDevice;
use crate::driver::Stream;
use crate::dtype::DType;
use crate::error::Result;

/// Bytes of a unique id (`ncclUniqueId`).
pub const UNIQUE_ID_BYTES: usize = 128;

/// What every member of a communicator passes to [`Comm::init_rank`](super::Comm::init_rank); made once by
/// [`unique_id`](super::unique_id) and handed to the others (sinter-dist sends it through its TCP store).
pub type UniqueId = [u8; UNIQUE_ID_BYTES];

/// Reduction of [`Comm::all_reduce`](super::Comm::all_reduce) and
/// [`Comm::reduce_scatter`](super::Comm::reduce_scatter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedOp {
    Sum,
    Avg,
}

/// One member (rank) of a communicator as its library serves it.
pub(crate) trait Collectives: Send + Sync {
    /// Whether `stream` can carry this member's collectives: a stream of its device `dev`.
    fn owns(&self, dev: &CudaDevice, stream: &Stream) -> bool;
    /// Queue the checked `op` on `stream` (one that [`Collectives::owns`]).
    fn call(&self, dev: &CudaDevice, op: &Op, stream: &Stream) -> Result<()>;
    /// The communicator's asynchronous error (a peer failed, the connection broke), if any.
    fn async_error(&self) -> Option<String>;
    /// Pending and future operations fail instead of waiting for peers.
    fn abort(&mut self);
    /// True for the emulated devices' collectives.
    fn is_emulated(&self) -> bool;
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
    pub(crate) fn name(self) -> &'static str {
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
