//! Keeps freed tensor memory in the process instead of handing it back to the kernel after
//! every op (glibc's malloc, tuned once when the first CPU storage is made).
//!
//! Why: by default glibc serves every allocation above 128 KiB (rising dynamically) with a
//! fresh `mmap` and returns it with `munmap`, and trims the heap top above 128 KiB. A training
//! step makes and drops the same activations and gradients every time, so each op paid for
//! new zero pages: a page fault per 4 KiB on first touch, a copy-on-write fault and a TLB
//! shootdown across the threads when a zero page read first is then written. On the digits
//! CNN step that was about a sixth of the CPU time; with the thresholds below it measured
//! 2.12 → 1.42 ms (`GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.
//! trim_threshold=134217728 sinter bench cpu cnn-step`, 3 interleaved runs, 2026-11-24, Zen 5).
//!
//! What it costs: freed memory up to [`TRIM_THRESHOLD`] stays resident for the next op (the
//! peak resident set is unchanged: the freed blocks are the ones a step needs again), and
//! buffers above [`MMAP_THRESHOLD`] still come from `mmap`. `SINTER_CPU_MALLOC_TUNE=0`
//! leaves glibc's defaults (to measure the difference); settings made through
//! `GLIBC_TUNABLES` or another allocator are not overridden there either way.

/// Allocations at least this large still get their own mapping (glibc's largest accepted
/// value on 64-bit: half its per-thread heap size).
pub const MMAP_THRESHOLD: i32 = 32 << 20;
/// Free memory at the top of a heap is returned to the kernel only above this.
pub const TRIM_THRESHOLD: i32 = 128 << 20;

/// Tunes the allocator once per process (cheap to call on every storage creation).
#[inline]
pub fn tune_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(tune);
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune() {
    extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
    }
    const M_TRIM_THRESHOLD: i32 = -1;
    const M_MMAP_THRESHOLD: i32 = -3;
    if std::env::var("SINTER_CPU_MALLOC_TUNE").is_ok_and(|v| v.trim() == "0") {
        return;
    }
    if std::env::var_os("GLIBC_TUNABLES").is_some_and(|v| v.to_string_lossy().contains("malloc")) {
        return;
    }
    // SAFETY: mallopt only changes glibc's malloc parameters; it is thread-safe (it takes the
    // arena locks) and a refused value leaves the old one.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune() {}

/// The system allocator with every block of at least [`LINE_ALIGNED_FROM`] bytes starting on
/// a 64-byte cache line, for a program to install with `#[global_allocator]` (the `sinter`
/// binary does; a library cannot choose for its users).
///
/// Why: glibc places blocks 16 bytes apart, so a tensor's data starts anywhere within a
/// line, and then every 64-byte AVX-512 load of it spans two lines and costs two (a 32-byte
/// AVX2 load, every other one). The dot form of x·Wᵀ at 64 × 3072 × 768 ran 82 vs 113
/// GFLOP/s on one thread with W 16 bytes past a line vs on one (Xeon model 207,
/// 2026-11-30). PyTorch's CPU allocator aligns its tensors to 64 bytes too. Small blocks
/// keep glibc's alignment: their loads are few and their headers would waste more.
pub struct LineAligned;

/// Blocks from this size up start on a 64-byte line under [`LineAligned`].
pub const LINE_ALIGNED_FROM: usize = 1024;

/// The layout [`LineAligned`] asks the system for: 64-byte aligned from
/// [`LINE_ALIGNED_FROM`] bytes, as asked below. A function of the size and alignment only,
/// so that the same block is freed with the layout it was made with.
fn line_layout(l: std::alloc::Layout) -> std::alloc::Layout {
    if l.size() >= LINE_ALIGNED_FROM && l.align() < 64 {
        // A valid size stays valid at a larger power-of-two alignment below isize::MAX - 63.
        std::alloc::Layout::from_size_align(l.size(), 64).unwrap_or(l)
    } else {
        l
    }
}

// SAFETY: every block is made and freed by `System` with the layout `line_layout` gives for
// the caller's layout, which is the same at allocation and at deallocation; `realloc` moves a
// block whose alignment rule changes with its size.
unsafe impl std::alloc::GlobalAlloc for LineAligned {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        std::alloc::System.alloc(line_layout(l))
    }
    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        std::alloc::System.alloc_zeroed(line_layout(l))
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        std::alloc::System.dealloc(p, line_layout(l))
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new_size: usize) -> *mut u8 {
        let old = line_layout(l);
        let Ok(asked) = std::alloc::Layout::from_size_align(new_size, l.align()) else {
            return std::ptr::null_mut();
        };
        let new = line_layout(asked);
        if new.align() == old.align() {
            return std::alloc::System.realloc(p, old, new_size);
        }
        let q = std::alloc::System.alloc(new);
        if !q.is_null() {
            std::ptr::copy_nonoverlapping(p, q, l.size().min(new_size));
            std::alloc::System.dealloc(p, old);
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{GlobalAlloc, Layout};

    #[test]
    fn large_blocks_start_on_a_line_and_keep_their_bytes_through_realloc() {
        let a = LineAligned;
        // SAFETY: each block is used within its size and freed with the layout it has.
        unsafe {
            for size in [LINE_ALIGNED_FROM, 4096 + 4, 1 << 20] {
                let l = Layout::from_size_align(size, 4).unwrap();
                let p = a.alloc(l);
                assert!(!p.is_null());
                assert_eq!(p as usize % 64, 0, "{size} bytes");
                a.dealloc(p, l);
            }
            // Grows across the threshold and shrinks below it, the bytes kept each way.
            let small = Layout::from_size_align(100, 4).unwrap();
            let p = a.alloc(small);
            for i in 0..100 {
                *p.add(i) = i as u8;
            }
            let p = a.realloc(p, small, 5000);
            assert_eq!(p as usize % 64, 0);
            assert!((0..100).all(|i| *p.add(i) == i as u8));
            let big = Layout::from_size_align(5000, 4).unwrap();
            let p = a.realloc(p, big, 50);
            assert!((0..50).all(|i| *p.add(i) == i as u8));
            a.dealloc(p, Layout::from_size_align(50, 4).unwrap());
            let z = a.alloc_zeroed(big);
            assert_eq!(z as usize % 64, 0);
            assert!((0..5000).all(|i| *z.add(i) == 0));
            a.dealloc(z, big);
        }
    }
}
