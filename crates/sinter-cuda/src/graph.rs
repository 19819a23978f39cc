//! CUDA graphs: record a device's queued work once (stream capture) and replay it with one
//! launch, so a training step of hundreds of small kernels costs one host call. The same code
//! serves an emulated device, whose driver records the work and replays it on the host.
//!
//! ```text
//! let cap = graph::begin_capture(&dev)?;   // stream capture + allocator capture mode
//! ... enqueue the step (kernels, device copies; no host reads, no cuMemAlloc) ...
//! let g = cap.finish()?;                   // cuStreamEndCapture + cuGraphInstantiate
//! g.replay()?;                             // runs the captured step (capturing does not run it)
//! ```
//!
//! While capturing, the allocator serves blocks from its cache only and keeps every block the
//! capture used reserved for the graph (see `alloc`), and `CudaDevice`'s host synchronisations
//! (`synchronize`, `dtoh`, `copy_htod`) fail with a clear error instead of breaking the capture.
//! A [`Capture`] dropped without `finish` (an error in the captured code) ends the capture and
//! releases the reservation, so the caller can run the step eagerly instead.

use std::sync::Arc;

use crate::alloc::CaptureId;
use crate::device::CudaDevice;
use crate::driver::GraphExec;
use crate::error::{CudaError, Result};

/// A capture in progress on a device's stream.
pub struct Capture {
    dev: Arc<CudaDevice>,
    id: CaptureId,
    done: bool,
}

/// Starts capturing everything enqueued on `dev`'s stream (on a real GPU, calls that are unsafe
/// during capture fail on this thread, the one that enqueues the step).
pub fn begin_capture(dev: &Arc<CudaDevice>) -> Result<Capture> {
    let id = dev.allocator().begin_capture()?;
    if let Err(e) = dev.driver().begin_capture() {
        dev.allocator().end_capture(id);
        dev.allocator().release_capture(id);
        return Err(e);
    }
    Ok(Capture {
        dev: dev.clone(),
        id,
        done: false,
    })
}

impl Capture {
    /// Ends the capture and instantiates the graph.
    pub fn finish(mut self) -> Result<Graph> {
        self.done = true;
        let r = self.dev.driver().end_capture();
        self.dev.allocator().end_capture(self.id);
        match r {
            Ok(Some(graph)) => Ok(Graph {
                graph: Some(graph),
                dev: self.dev.clone(),
                id: self.id,
            }),
            Ok(None) => {
                self.dev.allocator().release_capture(self.id);
                Err(CudaError::invalid(
                    "end_capture",
                    "the capture recorded no work (an empty step)",
                ))
            }
            Err(e) => {
                self.dev.allocator().release_capture(self.id);
                Err(e)
            }
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Abandoned (the captured code failed): end the stream capture, dropping whatever it
        // recorded, so the stream is usable again; nothing captured has run.
        let _ = self.dev.driver().end_capture();
        self.dev.allocator().end_capture(self.id);
        self.dev.allocator().release_capture(self.id);
    }
}

/// An instantiated graph; replays on the device's stream. Its memory stays reserved in the
/// allocator until it is dropped.
pub struct Graph {
    graph: Option<GraphExec>,
    dev: Arc<CudaDevice>,
    id: CaptureId,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("device", &self.dev.ordinal())
            .field("capture", &self.id)
            .finish()
    }
}

impl Graph {
    /// Enqueue one run of the captured work on the device's stream (asynchronous).
    pub fn replay(&self) -> Result<()> {
        self.graph.as_ref().expect("present until drop").launch()
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // Let queued replays finish before their memory can serve other allocations.
        let _ = self.dev.synchronize();
        drop(self.graph.take());
        self.dev.allocator().release_capture(self.id);
    }
}
