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
