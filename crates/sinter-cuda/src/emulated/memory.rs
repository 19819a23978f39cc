//! Device memory of an emulated device: host allocations, 256-byte aligned like `cuMemAlloc`'s,
//! so the vectorised kernels and the WMMA alignment checks see what they would on a GPU. A
//! device pointer is the host address. Fresh memory is filled with 0xFF bytes (NaN in every
//! float type, -1 in the integer ones), so a kernel that reads what nobody wrote shows it
//! instead of reading lucky zeros. The device has a fixed capacity, so running out takes the
//! caching allocator's out-of-memory path (release the cache, retry, then a clear error).

use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::queue::Queue;
use crate::alloc::{RawAlloc, RawAllocError};
use crate::error::{CudaError, Result};

/// Alignment of every allocation (what `cuMemAlloc` guarantees).
pub const ALIGN: usize = 256;

/// The byte fresh memory is filled with.
pub const POISON: u8 = 0xFF;

/// The host side of an emulated device's memory; implements the allocator's [`RawAlloc`].
pub(crate) struct HostMemory {
    ordinal: usize,
    capacity: usize,
    live: Mutex<HashMap<u64, usize>>,
    queue: Arc<Queue>,
}

impl HostMemory {
    pub(crate) fn new(ordinal: usize, capacity: usize, queue: Arc<Queue>) -> Self {
        HostMemory {
            ordinal,
            capacity,
            live: Mutex::default(),
            queue,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, usize>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl RawAlloc for HostMemory {
    fn malloc(&self, bytes: usize) -> std::result::Result<u64, RawAllocError> {
        let mut live = self.lock();
        let used: usize = live.values().sum();
        if bytes > self.capacity.saturating_sub(used) {
            return Err(RawAllocError::OutOfMemory);
        }
        let layout = Layout::from_size_align(bytes.max(1), ALIGN).map_err(|e| {
            RawAllocError::Other(CudaError::invalid(
                "cuMemAlloc",
                format!("{bytes} bytes: {e}"),
            ))
        })?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(RawAllocError::OutOfMemory);
        }
        // SAFETY: `p` addresses `bytes` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(p, POISON, bytes) };
        live.insert(p as u64, bytes);
        Ok(p as u64)
    }

    fn free(&self, ptr: u64) -> Result<()> {
        let bytes = self.lock().remove(&ptr).ok_or_else(|| {
            CudaError::invalid(
                "cuMemFree",
                format!(
                    "{ptr:#x} is not an allocation of emulated device {}",
                    self.ordinal
                ),
            )
        })?;
        let layout = Layout::from_size_align(bytes.max(1), ALIGN).expect("checked at malloc");
        // SAFETY: allocated by `malloc` with this layout, freed once (removed from `live`).
        unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        self.queue.synchronize()
    }

    fn ordinal(&self) -> usize {
        self.ordinal
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // The allocator frees its blocks before dropping us; anything left is freed here.
        let _ = self.queue.synchronize();
        let ptrs: Vec<u64> = self.lock().keys().copied().collect();
        for p in ptrs {
            let _ = self.free(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_poisoned_and_bounded() {
        let q = Queue::start(0).unwrap();
        let m = HostMemory::new(0, 4096, q.clone());
        let a = m.malloc(1000).unwrap();
        let b = m.malloc(24).unwrap();
        assert_eq!(a % ALIGN as u64, 0);
        assert_eq!(b % ALIGN as u64, 0);
        // SAFETY: 1000 bytes just allocated at `a`.
        let bytes = unsafe { std::slice::from_raw_parts(a as *const u8, 1000) };
        assert!(bytes.iter().all(|&x| x == POISON));
        assert!(f32::from_ne_bytes([POISON; 4]).is_nan());
        assert!(matches!(m.malloc(4000), Err(RawAllocError::OutOfMemory)));
        m.free(a).unwrap();
        assert!(m.free(a).is_err(), "double free is an error");
        let c = m.malloc(4000).unwrap();
        m.free(c).unwrap();
        m.free(b).unwrap();
        q.close();
    }
}
