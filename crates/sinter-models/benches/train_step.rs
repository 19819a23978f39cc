//! One training step — forward, cross-entropy, backward, AdamW step, zero_grad — on real
//! batches from sinter-data:
//!
//! * `cnn` (LeNet) on the bundled 8×8 digits, batch 64 → ms/step and samples/s;
//! * `gpt-tiny` on the bundled Shakespeare bytes, batch 12 × context 64 → ms/step and tokens/s.
//!
//!     cargo bench -p sinter-models --bench train_step
//!
//! The batches are read once from a `DataLoader` (shuffled) and cycled, so the loader thread
//! is not timed. Budget per case: `SINTER_BENCH_SECS` (default 1) × `SINTER_BENCH_ROUNDS`
//! (default 2), after a few warm-up steps.

// The timing loop is sinter-core's (one copy for every bench in the workspace).
#[path = "../../sinter-core/benches/common/mod.rs"]
mod common;

use std::sync::Arc;

use common::{budget, machine_line, rounds, time_it, Stats};
use sinter_core::{no_grad, Device, Rng, Tensor};
use sinter_data::{digits, shakespeare, Batch, DataLoader, Dataset, HostData, Split};
use sinter_models::{build, DataShape};
use sinter_nn::module::shared_rng;
use sinter_nn::{AdamW, Optimizer};

fn tensor(a: &sinter_data::HostArray) -> Tensor {
    match &a.data {
        HostData::F32(v) => Tensor::from_vec(v.clone(), &a.shape, Device::Cpu).unwrap(),
        HostData::I64(v) => Tensor::from_vec(v.clone(), &a.shape, Device::Cpu).unwrap(),
    }
}

fn batches(ds: Arc<dyn Dataset>, batch: usize, count: usize) -> Vec<(Tensor, Tensor)> {
    let mut loader = DataLoader::new(ds, batch, true, true, 0);
    (0..count)
        .map(|_| {
            let b: Batch = loader.next_batch().unwrap();
            (tensor(&b.inputs), tensor(&b.targets))
        })
        .collect()
}

struct Result {
    step: Stats,
    forward: Stats,
    first_loss: f32,
    last_loss: f32,
    params: usize,
}

fn run(model: &str, shape: DataShape, data: &[(Tensor, Tensor)]) -> Result {
    let m = build(model, &shape, &mut Rng::new(0), &shared_rng(0)).unwrap();
    m.set_training(true);
    let params = m.num_parameters();
    let mut opt = AdamW::new(m.parameters(), 1e-3, 0.01).unwrap();
    let mut i = 0usize;
    let mut losses = Vec::new();
    let mut step = || {
        let (x, y) = &data[i % data.len()];
        i += 1;
        let logits = m.forward(x).unwrap();
        let loss = logits.cross_entropy(y, -100).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        opt.zero_grad();
        losses.push(loss.to_scalar_f32().unwrap());
    };
    let step_stats = Stats::merge(
        &(0..rounds())
            .map(|_| time_it(3, budget(), 5, 100_000, &mut step))
            .collect::<Vec<_>>(),
    );
    let (first_loss, last_loss) = (losses[0], *losses.last().unwrap());
    let mut j = 0usize;
    let forward = time_it(3, budget(), 5, 100_000, || {
        let _g = no_grad();
        let (x, _) = &data[j % data.len()];
        j += 1;
        std::hint::black_box(m.forward(x).unwrap());
    });
    Result {
        step: step_stats,
        forward,
        first_loss,
        last_loss,
        params,
    }
}

fn main() {
    if !common::selected("train_step") {
        return;
    }
    println!("## Training step (forward, cross-entropy, backward, AdamW, zero_grad), f32");
    println!();
    println!(
        "{}; {} round(s) × {:.1} s per model",
        machine_line(),
        rounds(),
        budget().as_secs_f64()
    );
    println!();
    println!("| model | data, batch | params | step median ms | step best ms | throughput (median) | throughput (best) | steps | forward-only median ms | loss first → last step |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---|");

    let digits_train: Arc<dyn Dataset> = Arc::new(digits(Split::Train).unwrap());
    let data = batches(digits_train, 64, 22);
    let r = run(
        "cnn",
        DataShape {
            input: vec![1, 8, 8],
            classes: 10,
        },
        &data,
    );
    println!(
        "| cnn (LeNet) | digits 1×8×8, 64 | {} | {:.3} | {:.3} | {:.0} samples/s | {:.0} samples/s | {} | {:.3} | {:.3} → {:.3} |",
        r.params,
        r.step.median() * 1e3,
        r.step.best() * 1e3,
        64.0 / r.step.median(),
        64.0 / r.step.best(),
        r.step.reps(),
        r.forward.median() * 1e3,
        r.first_loss,
        r.last_loss
    );

    let (b, t) = (12usize, 64usize);
    let text: Arc<dyn Dataset> = Arc::new(shakespeare(Split::Train, t).unwrap());
    let vocab = text.num_classes().unwrap();
    let data = batches(text, b, 32);
    let r = run(
        "gpt-tiny",
        DataShape {
            input: vec![t],
            classes: vocab,
        },
        &data,
    );
    println!(
        "| gpt-tiny | shakespeare bytes, {b}×{t} | {} | {:.3} | {:.3} | {:.0} tokens/s | {:.0} tokens/s | {} | {:.3} | {:.3} → {:.3} |",
        r.params,
        r.step.median() * 1e3,
        r.step.best() * 1e3,
        (b * t) as f64 / r.step.median(),
        (b * t) as f64 / r.step.best(),
        r.step.reps(),
        r.forward.median() * 1e3,
        r.first_loss,
        r.last_loss
    );
    println!();
}
