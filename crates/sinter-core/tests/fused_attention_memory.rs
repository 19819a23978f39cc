//! The memory property of flash attention, measured with a counting global allocator: neither
//! the forward nor the backward pass allocates anything of size t², and what the graph keeps
//! alive after the forward pass is O(b·h·t·d) (the output and one log-sum-exp per row), while
//! the composite keeps the [t, t] probabilities. One test per binary: the counters are global.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use sinter_core::fused;
use sinter_core::{DType, Device, Rng, Tensor};

struct Counting;
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = System.alloc(l);
        if !p.is_null() {
            let now = CURRENT.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l);
        CURRENT.fetch_sub(l.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = System.realloc(p, l, new);
        if !q.is_null() {
            if new > l.size() {
                let now = CURRENT.fetch_add(new - l.size(), Ordering::Relaxed) + new - l.size();
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                CURRENT.fetch_sub(l.size() - new, Ordering::Relaxed);
            }
        }
        q
    }
}

#[global_allocator]
static A: Counting = Counting;

fn live() -> usize {
    CURRENT.load(Ordering::Relaxed)
}
fn reset_peak() -> usize {
    let now = live();
    PEAK.store(now, Ordering::Relaxed);
    now
}
fn peak_since(base: usize) -> usize {
    PEAK.load(Ordering::Relaxed).saturating_sub(base)
}

#[test]
fn flash_attention_never_allocates_t_squared() {
    let (b, h, t, d) = (1, 2, 2048, 32);
    let t2_bytes = b * h * t * t * 4; // one [b, h, t, t] f32 matrix: 32 MiB
    let btd_bytes = b * h * t * d * 4; // one [b, h, t, d] f32 tensor: 512 KiB
    let mut rng = Rng::new(0);
    let mk = |rng: &mut Rng| {
        Tensor::randn(&[b, h, t, d], 0.0, 1.0, rng, DType::F32, Device::Cpu)
            .unwrap()
            .to_var()
            .unwrap()
    };
    let (q, k, v) = (mk(&mut rng), mk(&mut rng), mk(&mut rng));
    let scale = 1.0 / (d as f32).sqrt();
    // Warm up the thread pool and allocator.
    drop(fused::attention(&q, &k, &v, true, scale).unwrap());

    for causal in [true, false] {
        let base = reset_peak();
        let out = fused::attention(&q, &k, &v, causal, scale).unwrap();
        let fwd_peak = peak_since(base);
        let kept = live() - base;
        // The output plus b·h·t log-sum-exp values (plus small bookkeeping).
        assert!(
            kept <= btd_bytes + b * h * t * 4 + 4096,
            "forward keeps {kept} bytes"
        );
        assert!(
            fwd_peak < btd_bytes * 3,
            "forward peaked at {fwd_peak} bytes (t² would be {t2_bytes})"
        );

        let loss = out.sum_all().unwrap();
        let base = reset_peak();
        loss.backward().unwrap();
        let bwd_peak = peak_since(base);
        // dq, dk, dv, the incoming gradient and the output as f32 copies, tile scratch, and
        // the three accumulated gradients: a small multiple of b·h·t·d, never t².
        assert!(
            bwd_peak < btd_bytes * 10,
            "backward peaked at {bwd_peak} bytes (t² would be {t2_bytes})"
        );
        assert!(bwd_peak < t2_bytes / 4);
        eprintln!("flash attention causal={causal}: forward keeps {kept} B, forward peak {fwd_peak} B, backward peak {bwd_peak} B; one t×t matrix = {t2_bytes} B");
        for x in [&q, &k, &v] {
            x.zero_grad();
        }
    }

    // The composite keeps the probabilities (and scores) alive for backward: ≥ t².
    let base = reset_peak();
    let out = fused::attention_reference(&q, &k, &v, true, scale).unwrap();
    let kept = live() - base;
    eprintln!(
        "composite attention: forward keeps {kept} B, peak {} B",
        peak_since(base)
    );
    assert!(kept >= t2_bytes, "composite keeps {kept} bytes");
    drop(out);
}
