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
