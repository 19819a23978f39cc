//! Inference with BatchNorm folded into the convolutions vs the separate layers, in evaluation
//! mode under `no_grad`: the digits CNN with BatchNorm (`cnn-bn`, 1×8×8) and ResNet-18
//! (3×32×32), batch 1 and 256. The two sides alternate, `SINTER_BENCH_ROUNDS` rounds of
//! `SINTER_BENCH_SECS` each; medians over all repetitions.
//!
//!     cargo bench -p sinter-models --bench bn_fold
//!     chrt -f 1 target/release/deps/bn_fold-* --bench     # as bench/run-cpu --rt runs it

#[path = "../../sinter-core/benches/common/mod.rs"]
mod common;

use common::{budget, machine_line, rounds, time_it, Stats};
use sinter_core::{no_grad, DType, Device, Rng, Tensor};
use sinter_models::{build, DataShape};
use sinter_nn::fold::fold_for_inference;
use sinter_nn::module::shared_rng;
use sinter_nn::Module;

fn forward_stats(m: &dyn Module, x: &Tensor) -> Stats {
    let _g = no_grad();
    time_it(2, budget(), 5, 100_000, || {
        std::hint::black_box(m.forward(x).unwrap());
    })
}

fn main() {
    if !common::selected("bn_fold") {
        return;
    }
    println!("## BatchNorm folding: inference forward, eval mode, f32");
    println!();
    println!(
        "{}; {} round(s) × {:.1} s per side, alternating",
        machine_line(),
        rounds(),
        budget().as_secs_f64()
    );
    println!();
    println!("| model | input, batch | BatchNorms folded | unfused median ms | folded median ms | speed-up (median) | unfused best ms | folded best ms |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for (name, c, hw) in [("cnn-bn", 1, 8), ("resnet18", 3, 32)] {
        let shape = DataShape {
            input: vec![c, hw, hw],
            classes: 10,
        };
        let m = build(name, &shape, &mut Rng::new(0), &shared_rng(0)).unwrap();
        for batch in [1usize, 256] {
            let x = Tensor::randn(
                &[batch, c, hw, hw],
                0.0,
                1.0,
                &mut Rng::new(1),
                DType::F32,
                Device::Cpu,
            )
            .unwrap();
            let (mut unfused, mut folded, mut folds) = (Vec::new(), Vec::new(), 0);
            for _ in 0..rounds() {
                // set_training(true) drops the fold; back in eval mode the layers are separate.
                m.set_training(true);
                m.set_training(false);
                unfused.push(forward_stats(m.as_ref(), &x));
                folds = fold_for_inference(m.as_ref()).unwrap();
                folded.push(forward_stats(m.as_ref(), &x));
            }
            let (u, f) = (Stats::merge(&unfused), Stats::merge(&folded));
            println!(
                "| {name} | {c}×{hw}×{hw}, {batch} | {folds} | {:.3} | {:.3} | {:.2}× | {:.3} | {:.3} |",
                u.median() * 1e3,
                f.median() * 1e3,
                u.median() / f.median(),
                u.best() * 1e3,
                f.best() * 1e3
            );
        }
    }
    println!();
}
