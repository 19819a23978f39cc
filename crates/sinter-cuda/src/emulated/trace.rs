//! Trace-only mode: the emulated device records every launch, library call, memset and copy
//! ([`super::cost`]) and runs none of them, so a step far too large for this machine (GPT-2
//! 124M at batch 16, T 1024) is recorded in seconds. Everything above the driver (allocator,
//! plans, autograd, the trainer's step, autocast) runs unchanged, so the record is the real
//! launch sequence.
//!
//! Device memory is a virtual address range ([`VirtualMemory`]) with the named GPU's capacity:
//! allocations are only bookkeeping, never touched. Uploads are recorded and dropped; downloads
//! read zeros. **Every value read back (a loss, a norm) is meaningless.** Collectives are not
//! traced (refused).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use super::gpu_model::GpuSpec;
use crate::alloc::{RawAlloc, RawAllocError};
use crate::error::{CudaError, Result};

static TRACE: OnceLock<GpuSpec> = OnceLock::new();

/// Trace for `gpu` from now on (see [`super::enable_trace`]); an error when this process
/// already traces for another GPU.
pub(crate) fn set_gpu(gpu: GpuSpec) -> Result<()> {
    let name = gpu.name;
    let _ = TRACE.set(gpu);
    match TRACE.get() {
        Some(g) if g.name == name => {}
        Some(g) => {
            return Err(CudaError::invalid(
                "enable_trace",
                format!(
                    "this process already traces for {}; it cannot trace for {name} too",
                    g.name
                ),
            ))
        }
        None => unreachable!("set above"),
    }
    Ok(())
}

/// The GPU the emulated devices trace for, when trace-only mode is on.
pub fn trace_gpu() -> Option<&'static GpuSpec> {
    TRACE.get()
}

/// First address handed out: far from host memory, so a stray host dereference faults loudly.
const BASE: u64 = 0x7e00_0000_0000;
/// Alignment of every allocation, as `cuMemAlloc`'s.
const ALIGN: u64 = 256;

#[derive(Default)]
struct Book {
    next: u64,
    used: usize,
    live: HashMap<u64, usize>,
}

/// Device memory of a trace-only device: addresses from a never-reused range, a capacity
/// check, and nothing behind them.
pub(crate) struct VirtualMemory {
    ordinal: usize,
    capacity: usize,
    book: Mutex<Book>,
}

impl VirtualMemory {
    pub(crate) fn new(ordinal: usize, capacity: usize) -> Self {
        VirtualMemory {
            ordinal,
            capacity,
            book: Mutex::new(Book {
                next: BASE + ((ordinal as u64) << 44),
                ..Book::default()
            }),
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl RawAlloc for VirtualMemory {
    fn malloc(&self, bytes: usize) -> std::result::Result<u64, RawAllocError> {
        let mut b = self.book();
        if bytes > self.capacity.saturating_sub(b.used) {
            return Err(RawAllocError::OutOfMemory);
        }
        let p = b.next;
        b.next += (bytes.max(1) as u64).div_ceil(ALIGN) * ALIGN;
        b.used += bytes;
        b.live.insert(p, bytes);
        Ok(p)
    }

    fn free(&self, ptr: u64) -> Result<()> {
        let mut b = self.book();
        let bytes = b.live.remove(&ptr).ok_or_else(|| {
            CudaError::invalid(
                "cuMemFree",
                format!(
                    "{ptr:#x} is not an allocation of traced device {}",
                    self.ordinal
                ),
            )
        })?;
        b.used -= bytes;
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn ordinal(&self) -> usize {
        self.ordinal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_memory_is_bounded_aligned_and_reuses_capacity() {
        let m = VirtualMemory::new(0, 80 << 30);
        // More than this machine has, never touched.
        let a = m.malloc(60 << 30).unwrap();
        let b = m.malloc(1000).unwrap();
        assert_eq!((a % ALIGN, b % ALIGN), (0, 0));
        assert!(b >= a + (60 << 30));
        assert!(matches!(
            m.malloc(30 << 30),
            Err(RawAllocError::OutOfMemory)
        ));
        m.free(a).unwrap();
        assert!(m.free(a).is_err(), "double free is an error");
        m.malloc(30 << 30).unwrap();
    }
}
