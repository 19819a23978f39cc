//! The caching device allocator.
//!
//! Sizes are rounded up to buckets; a freed buffer goes onto its pool's free list for that bucket
//! and the next request of the same bucket reuses it, so steady-state training (the same shapes
//! every step) does no `cuMemAlloc` / `cuMemFree` at all. Two pools are kept apart:
//! [`Pool::Permanent`] (weights, gradients, optimizer state) and [`Pool::Temporary`] (activations,
//! workspaces), so a burst of activations can never fragment the long-lived memory and
//! [`CachingAllocator::empty_cache`] / the statistics can be read per pool.
//!
//! All bookkeeping lives in [`AllocBook`], which knows nothing about CUDA and is unit-tested on
//! the CPU; the device calls go through the small [`RawAlloc`] trait.
//!
//! Stream safety: sinter issues all work of a device on one stream, so a block returned to the
//! free list can be handed out again immediately — any later use is ordered after the earlier
//! one on that stream. Code that uses a buffer on another stream must synchronise before
//! dropping it. [`CachingAllocator::empty_cache`] synchronises before it frees.
//!
//! CUDA graph capture ([`CachingAllocator::begin_capture`]): while a step is being captured no
//! device memory may be obtained or returned (`cuMemAlloc` / `cuMemFree` / a synchronise are not
//! allowed in a capture, and the pool was warmed by eager warm-up steps). Every block handed out
//! during the capture becomes the graph's: a replay writes it again, so it must never serve an
//! eager allocation while the graph lives. Blocks the capture frees go to the graph's private free
//! list (reused by later allocations of the same capture, in the same stream order a replay
//! follows) and stay there, with the graph's blocks still live, until
//! [`CachingAllocator::release_capture`] (deferred frees).

use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::dtype::DType;
use crate::error::{CudaError, Result};
pub use crate::pool::Pool;

/// Smallest bucket; also the alignment of every buffer (cuMemAlloc gives 256-byte alignment).
pub const MIN_BUCKET: usize = 512;
const MIB: usize = 1 << 20;

/// The bucket (bytes actually reserved) for a request of `bytes`:
/// - 0 stays 0 (no device memory);
/// - up to 1 MiB: the next power of two, at least 512 B;
/// - up to 64 MiB: the next quarter-octave (p, 1.25p, 1.5p, 1.75p, 2p): at most 25% slack;
/// - above: the next multiple of 2 MiB (the driver's own granularity).
pub fn bucket_size(bytes: usize) -> usize {
    if bytes == 0 {
        0
    } else if bytes <= MIB {
        bytes.next_power_of_two().max(MIN_BUCKET)
    } else if bytes <= 64 * MIB {
        let top = 1usize << (usize::BITS - 1 - bytes.leading_zeros()); // highest set bit
        let step = top / 4;
        bytes.div_ceil(step) * step
    } else {
        bytes.div_ceil(2 * MIB) * (2 * MIB)
    }
}

/// Statistics of one pool, in bytes of buckets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Held by live buffers.
    pub in_use: usize,
    /// Obtained from the driver (in use + cached).
    pub reserved: usize,
    /// Highest `in_use` since creation or the last `reset_peak`.
    pub peak_in_use: usize,
    /// Live buffers.
    pub live_buffers: usize,
    /// Calls to the driver's allocator.
    pub device_allocs: u64,
    /// Requests served from the free lists.
    pub cache_hits: u64,
}

/// Statistics of both pools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub permanent: PoolStats,
    pub temporary: PoolStats,
    /// Highest combined `in_use`.
    pub peak_in_use: usize,
}

impl MemoryStats {
    pub fn in_use(&self) -> usize {
        self.permanent.in_use + self.temporary.in_use
    }
    pub fn reserved(&self) -> usize {
        self.permanent.reserved + self.temporary.reserved
    }
    pub fn pool(&self, pool: Pool) -> &PoolStats {
        match pool {
            Pool::Permanent => &self.permanent,
            Pool::Temporary => &self.temporary,
        }
    }
}

#[derive(Debug, Default)]
struct PoolBook {
    free: BTreeMap<usize, Vec<u64>>,
    stats: PoolStats,
}

/// Identifies one captured CUDA graph's reservation in the allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CaptureId(u64);

/// The blocks of one captured graph.
#[derive(Debug, Default)]
struct GraphBook {
    id: u64,
    /// Still capturing (new blocks may join).
    active: bool,
    /// Every block the graph uses (live or in `free`), with its pool and bucket.
    owned: HashMap<u64, (Pool, usize)>,
    /// Graph blocks freed by the host: reusable only by this graph's capture.
    free: BTreeMap<(usize, usize), Vec<u64>>,
}

/// Pure bookkeeping of the caching allocator: free lists per (pool, bucket) and the statistics.
#[derive(Debug, Default)]
pub struct AllocBook {
    pools: [PoolBook; 2],
    peak_total: usize,
    graphs: Vec<GraphBook>,
    next_graph: u64,
}

impl AllocBook {
    pub fn new() -> Self {
        Self::default()
    }

    fn note_use(&mut self, pool: Pool, bucket: usize) {
        let p = &mut self.pools[pool.index()].stats;
        p.in_use += bucket;
        p.live_buffers += 1;
        p.peak_in_use = p.peak_in_use.max(p.in_use);
        let total = self.pools[0].stats.in_use + self.pools[1].stats.in_use;
        self.peak_total = self.peak_total.max(total);
    }

    /// Take a cached block of exactly `bucket` bytes from `pool`, if there is one. While
    /// capturing, the capture's own freed blocks come first, and whatever is taken joins the
    /// graph.
    pub fn take(&mut self, pool: Pool, bucket: usize) -> Option<u64> {
        if let Some(g) = self.graphs.iter_mut().find(|g| g.active) {
            let key = (pool.index(), bucket);
            if let Some(list) = g.free.get_mut(&key) {
                let ptr = list.pop().expect("empty lists are removed");
                if list.is_empty() {
                    g.free.remove(&key);
                }
                self.pools[pool.index()].stats.cache_hits += 1;
                self.note_use(pool, bucket);
                return Some(ptr);
            }
            let ptr = self.take_global(pool, bucket)?;
            let g = self
                .graphs
                .iter_mut()
                .find(|g| g.active)
                .expect("still capturing");
            g.owned.insert(ptr, (pool, bucket));
            return Some(ptr);
        }
        self.take_global(pool, bucket)
    }

    fn take_global(&mut self, pool: Pool, bucket: usize) -> Option<u64> {
        let book = &mut self.pools[pool.index()];
        let list = book.free.get_mut(&bucket)?;
        let ptr = list.pop()?;
        if list.is_empty() {
            book.free.remove(&bucket);
        }
        book.stats.cache_hits += 1;
        self.note_use(pool, bucket);
        Some(ptr)
    }

    /// Record a block just obtained from the driver and handed out.
    pub fn record_new(&mut self, pool: Pool, bucket: usize) {
        let p = &mut self.pools[pool.index()].stats;
        p.reserved += bucket;
        p.device_allocs += 1;
        self.note_use(pool, bucket);
    }

    /// A live block comes back: it joins the free list of its bucket, or, for a block a
    /// captured graph uses, that graph's private free list (the free is deferred until the graph
    /// is released).
    pub fn give_back(&mut self, pool: Pool, bucket: usize, ptr: u64) {
        let book = &mut self.pools[pool.index()];
        book.stats.in_use = book.stats.in_use.saturating_sub(bucket);
        book.stats.live_buffers = book.stats.live_buffers.saturating_sub(1);
        if let Some(g) = self.graphs.iter_mut().find(|g| g.owned.contains_key(&ptr)) {
            g.free.entry((pool.index(), bucket)).or_default().push(ptr);
            return;
        }
        book.free.entry(bucket).or_default().push(ptr);
    }

    /// Starts a capture: from now on blocks are served from the cache only and join the graph.
    /// Only one capture at a time.
    pub fn begin_capture(&mut self) -> std::result::Result<CaptureId, String> {
        if self.capturing() {
            return Err("a CUDA graph capture is already in progress on this device".into());
        }
        self.next_graph += 1;
        self.graphs.push(GraphBook {
            id: self.next_graph,
            active: true,
            ..GraphBook::default()
        });
        Ok(CaptureId(self.next_graph))
    }

    /// Whether a capture is in progress.
    pub fn capturing(&self) -> bool {
        self.graphs.iter().any(|g| g.active)
    }

    /// Ends the capture `id`; its blocks stay reserved until [`AllocBook::release_capture`].
    pub fn end_capture(&mut self, id: CaptureId) {
        if let Some(g) = self.graphs.iter_mut().find(|g| g.id == id.0) {
            g.active = false;
        }
    }

    /// The graph `id` is gone: its freed blocks return to the ordinary free lists, and its
    /// blocks still live will when they are dropped.
    pub fn release_capture(&mut self, id: CaptureId) {
        let Some(i) = self.graphs.iter().position(|g| g.id == id.0) else {
            return;
        };
        let g = self.graphs.swap_remove(i);
        for ((pool, bucket), ptrs) in g.free {
            self.pools[pool]
                .free
                .entry(bucket)
                .or_default()
                .extend(ptrs);
        }
    }

    /// Bytes held for captured graphs (their blocks, live or freed by the host).
    pub fn graph_reserved_bytes(&self) -> usize {
        self.graphs
            .iter()
            .flat_map(|g| g.owned.values())
            .map(|(_, b)| b)
            .sum()
    }

    /// Remove every cached (free) block of `pool` from the books; the caller frees them.
    pub fn drain_free(&mut self, pool: Pool) -> Vec<(u64, usize)> {
        let book = &mut self.pools[pool.index()];
        let mut out = Vec::new();
        for (bucket, ptrs) in std::mem::take(&mut book.free) {
            for p in ptrs {
                book.stats.reserved = book.stats.reserved.saturating_sub(bucket);
                out.push((p, bucket));
            }
        }
        out
    }

    /// Bytes sitting in the free lists of `pool`.
    pub fn cached_bytes(&self, pool: Pool) -> usize {
        self.pools[pool.index()]
            .free
            .iter()
            .map(|(b, v)| b * v.len())
            .sum()
    }

    pub fn stats(&self) -> MemoryStats {
        MemoryStats {
            permanent: self.pools[0].stats,
            temporary: self.pools[1].stats,
            peak_in_use: self.peak_total,
        }
    }

    pub fn reset_peak(&mut self) {
        for p in &mut self.pools {
            p.stats.peak_in_use = p.stats.in_use;
        }
        self.peak_total = self.pools[0].stats.in_use + self.pools[1].stats.in_use;
    }
}

/// Error from a raw device allocation.
#[derive(Debug)]
pub enum RawAllocError {
    /// The device has no room (the allocator will release its cache and retry once).
    OutOfMemory,
    /// Anything else.
    Other(CudaError),
}

/// The device calls the allocator needs. Implemented for CUDA in `device.rs`; tests use a fake.
pub trait RawAlloc: Send + Sync {
    /// Allocate `bytes` (> 0) of device memory.
    fn malloc(&self, bytes: usize) -> std::result::Result<u64, RawAllocError>;
    /// Free memory from `malloc`. Called only after `synchronize`.
    fn free(&self, ptr: u64) -> Result<()>;
    /// Wait until all queued work that may use cached blocks is finished.
    fn synchronize(&self) -> Result<()>;
    /// Device ordinal (recorded in buffers).
    fn ordinal(&self) -> usize;
}

pub(crate) struct AllocInner {
    book: Mutex<AllocBook>,
    raw: Box<dyn RawAlloc>,
}

impl AllocInner {
    fn book(&self) -> MutexGuard<'_, AllocBook> {
        // A panic while holding the lock cannot leave the books half-updated in a way that
        // matters more than losing the allocator, so recover from poisoning.
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn release_cached(&self, pool: Option<Pool>) -> Result<()> {
        let blocks: Vec<(u64, usize)> = {
            let mut b = self.book();
            if b.capturing() {
                return Err(CudaError::invalid(
                    "empty_cache",
                    "device memory cannot be freed while a CUDA graph is being captured",
                ));
            }
            match pool {
                Some(p) => b.drain_free(p),
                None => {
                    let mut v = b.drain_free(Pool::Permanent);
                    v.extend(b.drain_free(Pool::Temporary));
                    v
                }
            }
        };
        if blocks.is_empty() {
            return Ok(());
        }
        self.raw.synchronize()?;
        let mut first_err = None;
        for (p, _) in blocks {
            if let Err(e) = self.raw.free(p) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for AllocInner {
    fn drop(&mut self) {
        // Every buffer holds an Arc to us, so all blocks are in the free lists now.
        let _ = self.release_cached(None);
    }
}

/// A per-device caching allocator; cheap to clone (shared state).
#[derive(Clone)]
pub struct CachingAllocator {
    inner: Arc<AllocInner>,
}

impl std::fmt::Debug for CachingAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("stats", &self.stats())
            .finish()
    }
}

impl CachingAllocator {
    pub fn new(raw: Box<dyn RawAlloc>) -> Self {
        CachingAllocator {
            inner: Arc::new(AllocInner {
                book: Mutex::new(AllocBook::new()),
                raw,
            }),
        }
    }

    /// A buffer of `len` elements of `dtype` in `pool`. Contents are uninitialised.
    pub fn alloc(&self, len: usize, dtype: DType, pool: Pool) -> Result<DeviceBuffer> {
        let bytes = len
            .checked_mul(dtype.size())
            .ok_or_else(|| CudaError::invalid("alloc", format!("{len} x {dtype} overflows")))?;
        let bucket = bucket_size(bytes);
        let ordinal = self.inner.raw.ordinal();
        if bucket == 0 {
            return Ok(DeviceBuffer {
                ptr: 0,
                len,
                dtype,
                pool,
                bucket,
                ordinal,
                owner: Some(self.inner.clone()),
            });
        }
        {
            let mut book = self.inner.book();
            if let Some(ptr) = book.take(pool, bucket) {
                return Ok(DeviceBuffer {
                    ptr,
                    len,
                    dtype,
                    pool,
                    bucket,
                    ordinal,
                    owner: Some(self.inner.clone()),
                });
            }
            if book.capturing() {
                return Err(CudaError::invalid(
                    "alloc",
                    format!(
                        "CUDA graph capture needs {bytes} bytes ({bucket}-byte block) in the {pool:?} pool that the warm-up steps did not leave cached; device memory cannot be allocated while capturing (did the step's shapes change after warm-up?)"
                    ),
                ));
            }
        }
        let ptr = match self.inner.raw.malloc(bucket) {
            Ok(p) => p,
            Err(RawAllocError::OutOfMemory) => {
                // Give the driver back everything cached (both pools) and try once more.
                self.inner.release_cached(None)?;
                match self.inner.raw.malloc(bucket) {
                    Ok(p) => p,
                    Err(RawAllocError::OutOfMemory) => {
                        let s = self.stats();
                        return Err(CudaError::OutOfMemory {
                            requested: bytes,
                            pool,
                            in_use: s.in_use(),
                            reserved: s.reserved(),
                        });
                    }
                    Err(RawAllocError::Other(e)) => return Err(e),
                }
            }
            Err(RawAllocError::Other(e)) => return Err(e),
        };
        self.inner.book().record_new(pool, bucket);
        Ok(DeviceBuffer {
            ptr,
            len,
            dtype,
            pool,
            bucket,
            ordinal,
            owner: Some(self.inner.clone()),
        })
    }

    pub fn stats(&self) -> MemoryStats {
        self.inner.book().stats()
    }

    /// Bytes cached (free, reusable) in `pool`.
    pub fn cached_bytes(&self, pool: Pool) -> usize {
        self.inner.book().cached_bytes(pool)
    }

    /// Return every cached block of both pools to the driver (synchronises first).
    pub fn empty_cache(&self) -> Result<()> {
        self.inner.release_cached(None)
    }

    /// Return the cached blocks of one pool to the driver.
    pub fn empty_pool(&self, pool: Pool) -> Result<()> {
        self.inner.release_cached(Some(pool))
    }

    pub fn reset_peak(&self) {
        self.inner.book().reset_peak()
    }

    /// Enter capture mode (see the module docs). Pair with [`CachingAllocator::end_capture`]
    /// and, when the graph is dropped, [`CachingAllocator::release_capture`].
    pub fn begin_capture(&self) -> Result<CaptureId> {
        self.inner
            .book()
            .begin_capture()
            .map_err(|m| CudaError::invalid("begin_capture", m))
    }

    /// Leave capture mode; the graph's blocks stay reserved.
    pub fn end_capture(&self, id: CaptureId) {
        self.inner.book().end_capture(id)
    }

    /// Release the blocks of a graph that will not run again.
    pub fn release_capture(&self, id: CaptureId) {
        self.inner.book().release_capture(id)
    }

    /// Whether a capture is in progress (host synchronisation is an error then).
    pub fn is_capturing(&self) -> bool {
        self.inner.book().capturing()
    }

    /// Bytes reserved for captured graphs.
    pub fn graph_reserved_bytes(&self) -> usize {
        self.inner.book().graph_reserved_bytes()
    }
}

/// An owned device allocation: device pointer + element count + dtype + pool. Returns to its
/// pool's free list on drop. `Send + Sync`; the tensor crate keeps it in an `Arc`.
pub struct DeviceBuffer {
    ptr: u64,
    len: usize,
    dtype: DType,
    pool: Pool,
    bucket: usize,
    ordinal: usize,
    owner: Option<Arc<AllocInner>>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("dtype", &self.dtype)
            .field("pool", &self.pool)
            .field("device", &self.ordinal)
            .finish()
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            if self.bucket > 0 {
                owner.book().give_back(self.pool, self.bucket, self.ptr);
            }
        }
    }
}

impl DeviceBuffer {
    /// Device address (0 for an empty buffer).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn pool(&self) -> Pool {
        self.pool
    }
    /// Device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
    /// Bytes of the elements (not of the bucket).
    pub fn num_bytes(&self) -> usize {
        self.len * self.dtype.size()
    }
    /// Bytes actually reserved for this buffer.
    pub fn capacity_bytes(&self) -> usize {
        self.bucket
    }
    /// The whole buffer as a slice for kernel arguments.
    pub fn as_slice(&self) -> DevSlice<'_> {
        DevSlice {
            ptr: self.ptr,
            len: self.len,
            dtype: self.dtype,
            _life: PhantomData,
        }
    }
    /// Elements `offset .. offset + len`.
    pub fn slice(&self, offset: usize, len: usize) -> Result<DevSlice<'_>> {
        self.as_slice().slice(offset, len)
    }
}

/// A borrowed view of device memory (pointer, element count, dtype): what kernels take. It can
/// only be made from a live [`DeviceBuffer`] (or unsafely from raw parts), and cannot outlive it on
/// the host side; stream ordering covers the device side (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevSlice<'a> {
    ptr: u64,
    len: usize,
    dtype: DType,
    _life: PhantomData<&'a ()>,
}

impl<'a> DevSlice<'a> {
    /// # Safety
    /// `ptr` must address at least `len` elements of `dtype` of device memory that stays valid
    /// (and is not freed) while any work using this slice may run.
    pub unsafe fn from_raw(ptr: u64, len: usize, dtype: DType) -> DevSlice<'static> {
        DevSlice {
            ptr,
            len,
            dtype,
            _life: PhantomData,
        }
    }
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn num_bytes(&self) -> usize {
        self.len * self.dtype.size()
    }
    /// Elements `offset .. offset + len` of this slice.
    pub fn slice(&self, offset: usize, len: usize) -> Result<DevSlice<'a>> {
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(CudaError::invalid(
                "slice",
                format!(
                    "{offset}..{offset}+{len} out of bounds for {} elements",
                    self.len
                ),
            ));
        }
        Ok(DevSlice {
            ptr: self.ptr + (offset * self.dtype.size()) as u64,
            len,
            dtype: self.dtype,
            _life: PhantomData,
        })
    }
    /// The same bytes seen as another dtype (length rescaled; must divide evenly).
    pub fn reinterpret(&self, dtype: DType) -> Result<DevSlice<'a>> {
        let bytes = self.num_bytes();
        if !bytes.is_multiple_of(dtype.size()) || !self.ptr.is_multiple_of(dtype.size() as u64) {
            return Err(CudaError::invalid(
                "reinterpret",
                format!("{} bytes at {:#x} as {dtype}", bytes, self.ptr),
            ));
        }
        Ok(DevSlice {
            ptr: self.ptr,
            len: bytes / dtype.size(),
            dtype,
            _life: PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    #[test]
    fn buckets() {
        assert_eq!(bucket_size(0), 0);
        assert_eq!(bucket_size(1), 512);
        assert_eq!(bucket_size(512), 512);
        assert_eq!(bucket_size(513), 1024);
        assert_eq!(bucket_size(MIB), MIB);
        assert_eq!(bucket_size(MIB + 1), MIB + MIB / 4);
        assert_eq!(bucket_size(3 * MIB), 3 * MIB);
        assert_eq!(bucket_size(3 * MIB + 1), 3 * MIB + MIB / 2);
        assert_eq!(bucket_size(64 * MIB), 64 * MIB);
        assert_eq!(bucket_size(64 * MIB + 1), 66 * MIB);
        for b in [
            1usize,
            100,
            4097,
            MIB - 1,
            MIB + 7,
            5 * MIB + 3,
            40 * MIB + 1,
            100 * MIB + 5,
            1 << 33,
        ] {
            let s = bucket_size(b);
            assert!(s >= b);
            assert!(s.is_multiple_of(256), "alignment kept");
            if b > MIB {
                assert!(
                    (s - b) as f64 <= 0.25 * b as f64 + 1.0,
                    "slack <= 25% for {b}"
                );
            }
            assert_eq!(bucket_size(s), s, "buckets are fixed points");
        }
    }

    #[test]
    fn book_accounting() {
        let mut b = AllocBook::new();
        assert_eq!(b.take(Pool::Temporary, 1024), None);
        b.record_new(Pool::Temporary, 1024);
        b.record_new(Pool::Permanent, 4096);
        let s = b.stats();
        assert_eq!(
            (
                s.temporary.in_use,
                s.temporary.reserved,
                s.temporary.device_allocs
            ),
            (1024, 1024, 1)
        );
        assert_eq!((s.permanent.in_use, s.permanent.reserved), (4096, 4096));
        assert_eq!(s.peak_in_use, 5120);
        b.give_back(Pool::Temporary, 1024, 0xA00);
        assert_eq!(b.stats().temporary.in_use, 0);
        assert_eq!(b.stats().temporary.reserved, 1024);
        assert_eq!(b.cached_bytes(Pool::Temporary), 1024);
        // Pools are kept apart: a permanent request does not see the temporary block.
        assert_eq!(b.take(Pool::Permanent, 1024), None);
        assert_eq!(b.take(Pool::Temporary, 2048), None, "exact bucket only");
        assert_eq!(b.take(Pool::Temporary, 1024), Some(0xA00));
        assert_eq!(b.stats().temporary.cache_hits, 1);
        b.give_back(Pool::Temporary, 1024, 0xA00);
        let drained = b.drain_free(Pool::Temporary);
        assert_eq!(drained, vec![(0xA00, 1024)]);
        assert_eq!(b.stats().temporary.reserved, 0);
        assert_eq!(b.stats().peak_in_use, 5120);
        b.reset_peak();
        assert_eq!(b.stats().peak_in_use, 4096);
    }

    /// A fake device: hands out increasing addresses, counts calls, can be made to run out.
    struct FakeRaw {
        next: AtomicU64,
        mallocs: Arc<AtomicUsize>,
        frees: Arc<AtomicUsize>,
        syncs: Arc<AtomicUsize>,
        live: Arc<AtomicUsize>,
        sizes: Mutex<std::collections::HashMap<u64, usize>>,
        limit: usize,
    }
    impl RawAlloc for FakeRaw {
        fn malloc(&self, bytes: usize) -> std::result::Result<u64, RawAllocError> {
            if self.live.load(Ordering::SeqCst) + bytes > self.limit {
                return Err(RawAllocError::OutOfMemory);
            }
            self.live.fetch_add(bytes, Ordering::SeqCst);
            self.mallocs.fetch_add(1, Ordering::SeqCst);
            let p = self.next.fetch_add(bytes as u64, Ordering::SeqCst);
            self.sizes.lock().unwrap().insert(p, bytes);
            Ok(p)
        }
        fn free(&self, ptr: u64) -> Result<()> {
            let bytes = self
                .sizes
                .lock()
                .unwrap()
                .remove(&ptr)
                .expect("double free");
            self.live.fetch_sub(bytes, Ordering::SeqCst);
            self.frees.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn synchronize(&self) -> Result<()> {
            self.syncs.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn ordinal(&self) -> usize {
            3
        }
    }

    struct Counters {
        mallocs: Arc<AtomicUsize>,
        frees: Arc<AtomicUsize>,
        syncs: Arc<AtomicUsize>,
        live: Arc<AtomicUsize>,
    }

    fn fake(limit: usize) -> (CachingAllocator, Counters) {
        let c = Counters {
            mallocs: Arc::default(),
            frees: Arc::default(),
            syncs: Arc::default(),
            live: Arc::default(),
        };
        let raw = FakeRaw {
            next: AtomicU64::new(0x1000_0000),
            mallocs: c.mallocs.clone(),
            frees: c.frees.clone(),
            syncs: c.syncs.clone(),
            live: c.live.clone(),
            sizes: Mutex::default(),
            limit,
        };
        (CachingAllocator::new(Box::new(raw)), c)
    }

    #[test]
    fn steady_state_does_no_device_allocs() {
        let (a, c) = fake(usize::MAX);
        for _step in 0..10 {
            let x = a.alloc(1000, DType::F32, Pool::Temporary).unwrap();
            let y = a.alloc(1000, DType::F32, Pool::Temporary).unwrap();
            let z = a.alloc(3, DType::BF16, Pool::Temporary).unwrap();
            assert_eq!(x.ordinal(), 3);
            assert_ne!(x.ptr(), y.ptr());
            drop((x, y, z));
        }
        assert_eq!(
            c.mallocs.load(Ordering::SeqCst),
            3,
            "only the first step reaches the driver"
        );
        let s = a.stats();
        assert_eq!(s.temporary.in_use, 0);
        assert_eq!(s.temporary.reserved, 4096 + 4096 + 512);
        assert_eq!(s.temporary.peak_in_use, 4096 + 4096 + 512);
        assert_eq!(s.temporary.cache_hits, 27);
        assert_eq!(s.temporary.live_buffers, 0);
    }

    #[test]
    fn capture_serves_from_the_cache_and_keeps_graph_blocks_reserved() {
        let (a, c) = fake(usize::MAX);
        // Warm-up: one eager step leaves two 4 KiB blocks and one 512 B block cached.
        let keep = a.alloc(10, DType::F32, Pool::Permanent).unwrap();
        drop((
            a.alloc(1000, DType::F32, Pool::Temporary).unwrap(),
            a.alloc(1000, DType::F32, Pool::Temporary).unwrap(),
            a.alloc(3, DType::F32, Pool::Temporary).unwrap(),
        ));
        let mallocs = c.mallocs.load(Ordering::SeqCst);
        let id = a.begin_capture().unwrap();
        assert!(a.is_capturing());
        assert!(a.begin_capture().is_err(), "one capture at a time");
        let x = a.alloc(1000, DType::F32, Pool::Temporary).unwrap();
        let xp = x.ptr();
        drop(x); // freed inside the capture: reusable by the capture only
        let y = a.alloc(1000, DType::F32, Pool::Temporary).unwrap();
        assert_eq!(y.ptr(), xp, "the capture reuses its own freed block first");
        let z = a.alloc(900, DType::F32, Pool::Temporary).unwrap(); // the other cached 4 KiB
        assert_ne!(z.ptr(), xp);
        // Nothing left in that bucket: no cuMemAlloc while capturing, a clear error instead.
        let e = a
            .alloc(1000, DType::F32, Pool::Temporary)
            .unwrap_err()
            .to_string();
        assert!(e.contains("capture") && e.contains("warm-up"), "{e}");
        assert!(a.empty_cache().is_err(), "no cuMemFree while capturing");
        assert_eq!(c.mallocs.load(Ordering::SeqCst), mallocs);
        assert_eq!(c.syncs.load(Ordering::SeqCst), 0);
        a.end_capture(id);
        assert!(!a.is_capturing());
        assert_eq!(a.graph_reserved_bytes(), 2 * 4096);
        // After the capture the graph's blocks, freed or live, never serve eager allocations.
        let (yp, zp) = (y.ptr(), z.ptr());
        drop(y);
        assert_eq!(a.cached_bytes(Pool::Temporary), 512);
        let w = a.alloc(1000, DType::F32, Pool::Temporary).unwrap();
        assert!(w.ptr() != yp && w.ptr() != zp);
        assert_eq!(c.mallocs.load(Ordering::SeqCst), mallocs + 1);
        // Releasing the graph returns its freed blocks; its live one returns when dropped.
        a.release_capture(id);
        assert_eq!(a.graph_reserved_bytes(), 0);
        assert_eq!(a.cached_bytes(Pool::Temporary), 512 + 4096);
        drop(z);
        assert_eq!(a.cached_bytes(Pool::Temporary), 512 + 2 * 4096);
        drop((w, keep));
        assert_eq!(a.stats().in_use(), 0);
    }

    #[test]
    fn pools_and_empty_cache() {
        let (a, c) = fake(usize::MAX);
        let w = a.alloc(1 << 20, DType::F32, Pool::Permanent).unwrap();
        let t = a.alloc(1 << 20, DType::F32, Pool::Temporary).unwrap();
        assert_eq!(w.pool(), Pool::Permanent);
        assert_eq!(a.stats().permanent.in_use, 4 << 20);
        drop(t);
        assert_eq!(a.cached_bytes(Pool::Temporary), 4 << 20);
        a.empty_cache().unwrap();
        assert_eq!(c.frees.load(Ordering::SeqCst), 1);
        assert!(
            c.syncs.load(Ordering::SeqCst) >= 1,
            "synchronises before freeing"
        );
        assert_eq!(a.stats().temporary.reserved, 0);
        assert_eq!(
            a.stats().permanent.reserved,
            4 << 20,
            "live buffers are untouched"
        );
        drop(w);
        drop(a);
        assert_eq!(
            c.frees.load(Ordering::SeqCst),
            2,
            "dropping the allocator frees the rest"
        );
    }

    #[test]
    fn out_of_memory_releases_cache_then_errors() {
        let (a, c) = fake(8 << 20);
        let x = a.alloc(1 << 20, DType::F32, Pool::Temporary).unwrap(); // 4 MiB
        drop(x); // cached
        let y = a.alloc(3 << 20, DType::U8, Pool::Permanent).unwrap(); // 3 MiB: fits
                                                                       // 4 MiB more does not fit next to 4 (cached) + 3 (live); the cache is released, then it fits.
        let z = a.alloc(1 << 20, DType::F32, Pool::Permanent).unwrap();
        assert_eq!(a.stats().temporary.reserved, 0);
        assert_eq!(c.frees.load(Ordering::SeqCst), 1);
        // Now truly full.
        let e = a.alloc(4 << 20, DType::F32, Pool::Temporary).unwrap_err();
        assert!(matches!(e, CudaError::OutOfMemory { .. }), "{e}");
        drop((y, z));
    }

    #[test]
    fn zero_len_and_slices() {
        let (a, c) = fake(usize::MAX);
        let e = a.alloc(0, DType::F32, Pool::Temporary).unwrap();
        assert_eq!(e.ptr(), 0);
        assert!(e.is_empty());
        drop(e);
        assert_eq!(c.mallocs.load(Ordering::SeqCst), 0);
        let b = a.alloc(100, DType::F32, Pool::Temporary).unwrap();
        let s = b.slice(10, 20).unwrap();
        assert_eq!(s.ptr(), b.ptr() + 40);
        assert_eq!(s.len(), 20);
        assert!(b.slice(90, 11).is_err());
        assert!(s.slice(5, 16).is_err());
        let r = b.as_slice().reinterpret(DType::BF16).unwrap();
        assert_eq!(r.len(), 200);
        assert!(b.slice(1, 3).unwrap().reinterpret(DType::I64).is_err());
        assert!(a
            .alloc(usize::MAX, DType::F32, Pool::Temporary)
            .unwrap_err()
            .to_string()
            .contains("overflows"));
    }

    #[test]
    fn buffers_are_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<DeviceBuffer>();
        check::<Arc<DeviceBuffer>>();
        check::<CachingAllocator>();
    }
}
