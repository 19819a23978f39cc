//! The lowest layer of a [`CudaDevice`](crate::CudaDevice): the one place where a real GPU (the
//! CUDA driver through cudarc, [`real`]) and an emulated device ([`crate::emulated`]) differ.
//! Everything above — the device's public API, the allocator, launch plans, GEMM descriptors,
//! graphs, communicators and all of sinter-core — is the same code for both.
//!
//! [`Stream`] and [`Event`] are the driver-neutral handles callers outside this crate use for
//! ordering (the NCCL backend's own stream and its events).

pub(crate) mod real;

use std::sync::Arc;

use crate::emulated::{EmuDriver, EmuEvent, EmuGraph, EmuStream};
use crate::error::{DriverResultExt, Result};
use crate::launch::Launch;

/// A device's work queue: its compute stream, or another stream of the same device (each NCCL
/// communicator has one). Work on one stream runs in order; across streams, order with events.
#[derive(Clone)]
pub struct Stream(pub(crate) StreamImpl);

#[derive(Clone)]
pub(crate) enum StreamImpl {
    Real(Arc<cudarc::driver::CudaStream>),
    Emulated(EmuStream),
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            StreamImpl::Real(_) => f.write_str("Stream(CUDA)"),
            StreamImpl::Emulated(s) => write!(f, "Stream(emulated device {})", s.ordinal()),
        }
    }
}

impl Stream {
    /// An event completed once everything queued on this stream so far has run.
    pub fn record_event(&self) -> Result<Event> {
        match &self.0 {
            StreamImpl::Real(s) => s
                .record_event(None)
                .map(|e| Event(EventImpl::Real(e)))
                .ctx("cuEventRecord"),
            StreamImpl::Emulated(s) => s.record_event().map(|e| Event(EventImpl::Emulated(e))),
        }
    }

    /// Work queued on this stream from now on runs after `event` completed.
    pub fn wait(&self, event: &Event) -> Result<()> {
        match (&self.0, &event.0) {
            (StreamImpl::Real(s), EventImpl::Real(e)) => s.wait(e).ctx("cuStreamWaitEvent"),
            (StreamImpl::Emulated(s), EventImpl::Emulated(e)) => s.wait(e),
            _ => Err(crate::CudaError::invalid(
                "stream wait",
                "an event of an emulated device cannot order a real GPU's stream, or the reverse",
            )),
        }
    }

    /// Wait on the host until everything queued on this stream has run.
    pub fn synchronize(&self) -> Result<()> {
        match &self.0 {
            StreamImpl::Real(s) => s.synchronize().ctx("cuStreamSynchronize"),
            StreamImpl::Emulated(s) => s.synchronize(),
        }
    }

    /// The cudarc stream of a real GPU (None when emulated).
    pub(crate) fn real(&self) -> Option<&Arc<cudarc::driver::CudaStream>> {
        match &self.0 {
            StreamImpl::Real(s) => Some(s),
            StreamImpl::Emulated(_) => None,
        }
    }

    /// The emulated stream (None on a real GPU).
    pub(crate) fn emulated(&self) -> Option<&EmuStream> {
        match &self.0 {
            StreamImpl::Real(_) => None,
            StreamImpl::Emulated(s) => Some(s),
        }
    }
}

/// A point in a stream's work ([`Stream::record_event`]).
pub struct Event(EventImpl);

enum EventImpl {
    Real(cudarc::driver::CudaEvent),
    Emulated(EmuEvent),
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            EventImpl::Real(_) => "Event(CUDA)",
            EventImpl::Emulated(_) => "Event(emulated)",
        })
    }
}

impl Event {
    /// Whether the work before the event has finished (never blocks). An error means the
    /// device failed (a faulting kernel), not that the work is still running.
    pub fn query(&self) -> Result<bool> {
        match &self.0 {
            EventImpl::Real(e) => e.try_is_complete().ctx("cuEventQuery"),
            EventImpl::Emulated(e) => e.query(),
        }
    }
}

/// An instantiated CUDA graph.
pub(crate) enum GraphExec {
    Real(cudarc::driver::CudaGraph),
    Emulated(EmuGraph),
}

impl GraphExec {
    /// Queue one run of the graph on the stream it was captured from.
    pub(crate) fn launch(&self) -> Result<()> {
        match self {
            GraphExec::Real(g) => g.launch().ctx("cuGraphLaunch"),
            GraphExec::Emulated(g) => g.launch(),
        }
    }
}

/// What serves a device: the CUDA driver, or the emulator.
pub(crate) enum Driver {
    Real(real::RealDriver),
    Emulated(EmuDriver),
}

impl Driver {
    /// The device's compute stream.
    pub(crate) fn stream(&self) -> &Stream {
        match self {
            Driver::Real(r) => r.stream(),
            Driver::Emulated(e) => e.stream(),
        }
    }

    /// A new stream on this device.
    pub(crate) fn new_stream(&self) -> Result<Stream> {
        match self {
            Driver::Real(r) => r.new_stream(),
            Driver::Emulated(e) => Ok(e.new_stream()),
        }
    }

    /// Zero `bytes` bytes at `ptr` (stream-ordered).
    pub(crate) fn memset_zero(&self, ptr: u64, bytes: usize) -> Result<()> {
        match self {
            Driver::Real(r) => r.memset_zero(ptr, bytes),
            Driver::Emulated(e) => e.memset_zero(ptr, bytes),
        }
    }

    /// Device-to-device copy (stream-ordered).
    pub(crate) fn copy_dtod(&self, src: u64, dst: u64, bytes: usize) -> Result<()> {
        match self {
            Driver::Real(r) => r.copy_dtod(src, dst, bytes),
            Driver::Emulated(e) => e.copy_dtod(src, dst, bytes),
        }
    }

    /// Host-to-device copy; `src` may be reused when this returns.
    pub(crate) fn copy_htod(&self, src: &[u8], dst: u64) -> Result<()> {
        match self {
            Driver::Real(r) => r.copy_htod(src, dst),
            Driver::Emulated(e) => e.copy_htod(src, dst),
        }
    }

    /// Device-to-host copy after the queued work (waits).
    pub(crate) fn copy_dtoh(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        match self {
            Driver::Real(r) => r.copy_dtoh(src, dst),
            Driver::Emulated(e) => e.copy_dtoh(src, dst),
        }
    }

    /// Wait for all queued work.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.stream().synchronize()
    }

    /// Queue one kernel launch.
    pub(crate) fn launch(&self, l: &Launch) -> Result<()> {
        match self {
            Driver::Real(r) => r.launch(l),
            Driver::Emulated(e) => e.launch(l),
        }
    }

    /// Compile or load every kernel file now.
    pub(crate) fn preload_kernels(&self) -> Result<()> {
        match self {
            Driver::Real(r) => r.preload_kernels(),
            Driver::Emulated(e) => e.preload_kernels(),
        }
    }

    /// Start recording the compute stream's work into a graph instead of running it.
    pub(crate) fn begin_capture(&self) -> Result<()> {
        match self {
            Driver::Real(r) => r.begin_capture(),
            Driver::Emulated(e) => e.begin_capture(),
        }
    }

    /// End the capture: the graph, or None when nothing was recorded.
    pub(crate) fn end_capture(&self) -> Result<Option<GraphExec>> {
        match self {
            Driver::Real(r) => r.end_capture().map(|g| g.map(GraphExec::Real)),
            Driver::Emulated(e) => Ok(e.end_capture().map(GraphExec::Emulated)),
        }
    }
}
