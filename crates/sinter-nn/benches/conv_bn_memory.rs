//! Memory of one training step of the network in PyTorch's tutorial "Fusing Convolution and
//! Batch Norm using Custom Function" (MNIST-shaped batch of 2048, two conv → BatchNorm pairs
//! 1→32→64, 3×3, no bias), with the pairs unfused and fused, measured on the CPU by a counting
//! global allocator, beside the tutorial's GPU figures (`torch.cuda.max_memory_allocated`).
//!
//!     cargo bench -p sinter-nn --bench conv_bn_memory
//!     SINTER_CONVBN_BATCH=512 cargo bench -p sinter-nn --bench conv_bn_memory
//!
//! The input is random (the memory does not depend on the pixel values).

#[path = "../tests/common/mod.rs"]
mod common;

use common::conv_bn_net::{measure, mnist_batch, TutorialNet};
use common::counting_alloc::mib;

fn main() {
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && !"conv_bn_memory".contains(&a))
    {
        return;
    }
    let batch: usize = std::env::var("SINTER_CONVBN_BATCH")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2048);
    let (x, y) = mnist_batch(batch);
    println!("## Fused Conv+BatchNorm training memory (PyTorch tutorial network, batch {batch})");
    println!();
    println!("| layers | kept after forward MiB | forward peak MiB | step peak MiB | heap before the step MiB | step peak, whole heap MiB | loss |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for fused in [false, true] {
        let net = TutorialNet::new(fused);
        let m = measure(&net, &x, &y);
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.4} |",
            if fused {
                "fused (ConvBn, recompute)"
            } else {
                "unfused (Conv2d, BatchNorm2d)"
            },
            mib(m.after_forward),
            mib(m.forward_peak),
            mib(m.step_peak),
            mib(m.base),
            mib(m.base + m.step_peak),
            m.loss
        );
    }
    println!();
    println!("Step peak: highest heap use during forward and backward above the bytes alive before the step (parameters, gradients, batch). The tutorial reports peak GPU memory over its training run: 1.56 GB fused vs 2.68 GB unfused (a later version of its source: 1.72 GB vs 2.84 GB), with the whole allocator counted.");
}
