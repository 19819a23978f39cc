//! The fused Conv+BatchNorm training op keeps less memory, measured with a counting
//! allocator on the tutorial's network (see `common/conv_bn_net.rs`) at a small batch: after
//! the forward pass the graph no longer holds each convolution's output, nor the BatchNorm's
//! intermediate tensors. The full-size table (batch 2048, beside the tutorial's GPU figures)
//! is `cargo bench -p sinter-nn --bench conv_bn_memory`. One test: the counters are global.

mod common;

use common::conv_bn_net::{measure, mnist_batch, TutorialNet};
use common::counting_alloc::mib;

#[test]
fn fused_conv_bn_keeps_less_after_forward() {
    let n = 32;
    let (x, y) = mnist_batch(n);
    let unfused = measure(&TutorialNet::new(false), &x, &y);
    let fused = measure(&TutorialNet::new(true), &x, &y);
    for (name, m) in [("unfused", &unfused), ("fused", &fused)] {
        eprintln!(
            "{name:8} batch {n}: after forward {:7.2} MiB, forward peak {:7.2} MiB, step peak {:7.2} MiB",
            mib(m.after_forward),
            mib(m.forward_peak),
            mib(m.step_peak)
        );
    }
    assert!((fused.loss - unfused.loss).abs() <= 1e-5 * unfused.loss.abs());
    // At least each convolution's output (f32) is no longer kept.
    let conv_outputs = 4 * n * (32 * 26 * 26 + 64 * 24 * 24);
    assert!(
        fused.after_forward + conv_outputs <= unfused.after_forward,
        "fused keeps {} bytes, unfused {}: the difference is below the conv outputs' {conv_outputs}",
        fused.after_forward,
        unfused.after_forward
    );
}
