//! The lowest layer of a [`CudaDevice`](crate::CudaDevice): what a device's driver does —
//! streams, events, copies, launches, stream capture and graphs — as traits, implemented by a
//! real GPU (the CUDA driver through cudarc, [`real`]) and by the emulated device
//! ([`crate::emulated`]). This module names neither: the device picks one when it opens
//! ([`crate::device`]), and everything above — the device's public API, the allocator, launch
//! plans, GEMM descriptors, graphs, communicators and all of sinter-core — is the same code for
//! both. The calls that only one of them has (cuBLASLt, cuDNN, NCCL; the emulator's host
//! libraries) reach it by downcasting: `RealDriver::of`, `EmuDriver::of`.
//!
//! [`Stream`] and [`Event`] are the driver-neutral handles callers outside this crate use for
//! ordering (the NCCL backend's own stream and its events).

pub(crate) mod real;

use std::any::Any;
use std::sync::Arc;

use crate::error::{CudaError, Result};
use crate::launch::Launch;

/// What a stream does, on a GPU or emulated.
pub(crate) trait StreamOps: Send + Sync {
    /// An event completed once everything queued on this stream so far has run.
    fn record_event(&self) -> Result<Event>;
    /// Work queued from now on runs after `event` (of the same kind of driver) completed.
    fn wait(&self, event: &Event) -> Result<()>;
    /// Wait on the host until everything queued has run.
    fn synchronize(&self) -> Result<()>;
    /// What the stream is, for `Debug`.
    fn describe(&self) -> String;
    /// The implementation, for the calls only it has.
    fn as_any(&self) -> &dyn Any;
}

/// A device's work queue: its compute stream, or another stream of the same device (each NCCL
/// communicator has one). Work on one stream runs in order; across streams, order with events.
#[derive(Clone)]
pub struct Stream(pub(crate) Arc<dyn StreamOps>);

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({})", self.0.describe())
    }
}

impl Stream {
    /// An event completed once everything queued on this stream so far has run.
    pub fn record_event(&self) -> Result<Event> {
        self.0.record_event()
    }

    /// Work queued on this stream from now on runs after `event` completed.
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.0.wait(event)
    }

    /// Wait on the host until everything queued on this stream has run.
    pub fn synchronize(&self) -> Result<()> {
        self.0.synchronize()
    }
}

/// What an event does, on a GPU or emulated.
pub(crate) trait EventOps: Send + Sync {
    /// Whether the work before the event has finished (never blocks).
    fn query(&self) -> Result<bool>;
    /// What the event is, for `Debug`.
    fn describe(&self) -> &'static str;
    /// The implementation, for the stream of the same driver that waits on it.
    fn as_any(&self) -> &dyn Any;
}

/// A point in a stream's work ([`Stream::record_event`]).
pub struct Event(pub(crate) Box<dyn EventOps>);

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event({})", self.0.describe())
    }
}

impl Event {
    /// Whether the work before the event has finished (never blocks). An error means the
    /// device failed (a faulting kernel), not that the work is still running.
    pub fn query(&self) -> Result<bool> {
        self.0.query()
    }
}

/// The error of a stream asked to wait on an event of the other kind of driver.
pub(crate) fn foreign_event() -> CudaError {
    CudaError::invalid(
        "stream wait",
        "an event of an emulated device cannot order a real GPU's stream, or the reverse",
    )
}

/// What an instantiated graph does.
pub(crate) trait GraphOps {
    /// Queue one run of the graph on the stream it was captured from.
    fn launch(&self) -> Result<()>;
}

/// An instantiated CUDA graph.
pub(crate) struct GraphExec(pub(crate) Box<dyn GraphOps>);

impl GraphExec {
    /// Queue one run of the graph on the stream it was captured from.
    pub(crate) fn launch(&self) -> Result<()> {
        self.0.launch()
    }
}

/// What serves a device — the CUDA driver, or the emulator: its streams, copies, launches and
/// stream capture. All work goes to the compute stream unless a call says otherwise.
pub(crate) trait DriverOps: Send + Sync {
    /// The device's compute stream.
    fn stream(&self) -> &Stream;

    /// A new stream on this device.
    fn new_stream(&self) -> Result<Stream>;

    /// Zero `bytes` bytes at `ptr` (stream-ordered).
    fn memset_zero(&self, ptr: u64, bytes: usize) -> Result<()>;

    /// Device-to-device copy (stream-ordered).
    fn copy_dtod(&self, src: u64, dst: u64, bytes: usize) -> Result<()>;

    /// Host-to-device copy; `src` may be reused when this returns.
    fn copy_htod(&self, src: &[u8], dst: u64) -> Result<()>;

    /// Device-to-host copy after the queued work (waits).
    fn copy_dtoh(&self, src: u64, dst: &mut [u8]) -> Result<()>;

    /// Queue one kernel launch.
    fn launch(&self, l: &Launch) -> Result<()>;

    /// Compile or load every kernel file now.
    fn preload_kernels(&self) -> Result<()>;

    /// Start recording the compute stream's work into a graph instead of running it.
    fn begin_capture(&self) -> Result<()>;

    /// End the capture: the graph, or None when nothing was recorded.
    fn end_capture(&self) -> Result<Option<GraphExec>>;

    /// The implementation, for the calls only it has.
    fn as_any(&self) -> &dyn Any;

    /// Wait for all queued work.
    fn synchronize(&self) -> Result<()> {
        self.stream().synchronize()
    }
}

/// A device's driver (one of the [`DriverOps`] implementations, picked when the device opens).
pub(crate) struct Driver(Box<dyn DriverOps>);

impl Driver {
    pub(crate) fn new(d: impl DriverOps + 'static) -> Driver {
        Driver(Box::new(d))
    }
}

impl std::ops::Deref for Driver {
    type Target = dyn DriverOps;

    fn deref(&self) -> &(dyn DriverOps + 'static) {
        &*self.0
    }
}
