//! What the kernel folders' tests share: the devices to run on and deterministic inputs.

use crate::Device;

/// The CPU, and the CUDA device when present (the real GPU, else the emulated one).
pub(crate) fn devices() -> Vec<Device> {
    let mut v = vec![Device::Cpu];
    v.extend(sinter_cuda::testing::gpu_tests(1).map(|_| Device::Cuda(0)));
    v
}

/// Deterministic values in [lo, hi).
pub(crate) fn values(seed: u64, len: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

/// Whether NVRTC and the CUDA headers are here for the folders' compile tests: false (with a
/// note) when they are not, unless SINTER_REQUIRE_NVRTC=1 (CI), where that fails the test.
pub(crate) fn nvrtc_available() -> bool {
    use sinter_cuda::nvrtc;
    if nvrtc::nvrtc_present() && nvrtc::find_cuda_include().is_ok() {
        return true;
    }
    let required = std::env::var("SINTER_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "SINTER_REQUIRE_NVRTC=1 but NVRTC or the CUDA headers are missing"
    );
    eprintln!("skipped: NVRTC not found (run .ci/nvrtc-setup)");
    false
}
