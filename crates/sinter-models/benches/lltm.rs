//! The LLTM cell on the CPU: (a) composite tensor ops vs (b) the `lltm_cell` custom op (fused
//! loops), forward (recording the graph, as in training) and backward, at batch 16, 32 and 64
//! with 32 inputs and 128 units (PyTorch's extension tutorial uses batch 16): the whole cell
//! step (the gates' GEMM included, the same on both sides), and the pointwise part alone (what
//! the custom op replaces, from given gate pre-activations). The two sides
//! alternate, `SINTER_BENCH_ROUNDS` rounds of `SINTER_BENCH_SECS` each; medians over all
//! repetitions.
//!
//! With a CUDA device (`SINTER_CUDA_EMU=1` for the emulated one) it also runs (c), the custom
//! op's CUDA kernels, once per batch and prints how far its values and gradients are from (a):
//! correctness only — the emulated device's timings mean nothing, and none are printed.
//!
//!     cargo bench -p sinter-models --bench lltm
//!     chrt -f 1 target/release/deps/lltm-* --bench     # as bench/run-cpu --rt runs it

#[path = "../../sinter-core/benches/common/mod.rs"]
mod common;

use common::{budget, machine_line, rounds, time_it, Stats};
use sinter_core::{DType, Device, Rng, Tensor};
use sinter_models::lltm::{cell_composite, cell_fused, Lltm, LltmImpl};

const INPUT: usize = 32;
const STATE: usize = 128;

/// One problem on `dev`: the cell (parameters as variables) and x, h, c (variables too, so
/// the backward computes every gradient, as a recurrent net's step does).
struct Problem {
    cell: Lltm,
    x: Tensor,
    h: Tensor,
    c: Tensor,
    /// Gate pre-activations [batch, 3·state] for the pointwise part alone.
    gates: Tensor,
}

/// What is timed: the whole step (the gates' GEMM included), or the pointwise part the custom
/// op replaces (from given gate pre-activations).
#[derive(Clone, Copy, PartialEq)]
enum Part {
    Step,
    Pointwise,
}

impl Problem {
    fn new(batch: usize, dev: Device) -> Problem {
        let mut r = Rng::new(batch as u64);
        let mut var = |shape: &[usize]| {
            Tensor::randn(shape, 0.0, 1.0, &mut r, DType::F32, dev)
                .unwrap()
                .to_var()
                .unwrap()
        };
        let (x, h, c) = (
            var(&[batch, INPUT]),
            var(&[batch, STATE]),
            var(&[batch, STATE]),
        );
        let gates = var(&[batch, 3 * STATE]);
        Problem {
            cell: Lltm::new(INPUT, STATE, &mut Rng::new(7), dev).unwrap(),
            x,
            h,
            c,
            gates,
        }
    }
    /// The step's variables, then the pointwise part's gates.
    fn vars(&self) -> [&Tensor; 6] {
        [
            &self.x,
            &self.h,
            &self.c,
            &self.cell.weights,
            &self.cell.bias,
            &self.gates,
        ]
    }
    /// Σ (h' + c') of one step, or of its pointwise part.
    fn loss(&self, imp: LltmImpl, part: Part) -> Tensor {
        let (h2, c2) = match (part, imp) {
            (Part::Step, _) => self.cell.forward(&self.x, &self.h, &self.c, imp),
            (Part::Pointwise, LltmImpl::Composite) => cell_composite(&self.gates, &self.c),
            (Part::Pointwise, LltmImpl::CustomOp) => cell_fused(&self.gates, &self.c),
        }
        .unwrap();
        h2.add(&c2).unwrap().sum_all().unwrap()
    }
    fn backward(&self, loss: &Tensor) {
        for v in self.vars() {
            v.zero_grad();
        }
        loss.backward().unwrap();
    }
    /// The step's loss and its five gradients, for the correctness rows.
    fn values(&self, imp: LltmImpl) -> Vec<Vec<f32>> {
        let loss = self.loss(imp, Part::Step);
        self.backward(&loss);
        std::iter::once(loss.to_vec_f32().unwrap())
            .chain(
                self.vars()[..5]
                    .iter()
                    .map(|v| v.grad().unwrap().to_vec_f32().unwrap()),
            )
            .collect()
    }
}

fn forward_stats(p: &Problem, imp: LltmImpl, part: Part) -> Stats {
    time_it(3, budget(), 5, 1_000_000, || {
        std::hint::black_box(p.loss(imp, part));
    })
}

fn backward_stats(p: &Problem, imp: LltmImpl, part: Part) -> Stats {
    let loss = p.loss(imp, part);
    time_it(3, budget(), 5, 1_000_000, || p.backward(&loss))
}

type StatsFn = fn(&Problem, LltmImpl, Part) -> Stats;

fn cpu_table() {
    println!("## LLTM cell on the CPU: composite ops vs the custom op (fused loops), f32");
    println!();
    println!(
        "{}; input {INPUT}, state {STATE}; {} round(s) × {:.1} s per side and pass, alternating",
        machine_line(),
        rounds(),
        budget().as_secs_f64()
    );
    println!();
    println!("| batch | what | pass | (a) composite median µs | (b) custom op median µs | (a)/(b) | (a) best µs | (b) best µs |");
    println!("|---:|---|---|---:|---:|---:|---:|---:|");
    for batch in [16usize, 32, 64] {
        let p = Problem::new(batch, Device::Cpu);
        for (what, part, pass, stats) in [
            ("cell step", Part::Step, "forward", forward_stats as StatsFn),
            ("cell step", Part::Step, "backward", backward_stats),
            ("pointwise part", Part::Pointwise, "forward", forward_stats),
            (
                "pointwise part",
                Part::Pointwise,
                "backward",
                backward_stats,
            ),
        ] {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for _ in 0..rounds() {
                a.push(stats(&p, LltmImpl::Composite, part));
                b.push(stats(&p, LltmImpl::CustomOp, part));
            }
            let (a, b) = (Stats::merge(&a), Stats::merge(&b));
            println!(
                "| {batch} | {what} | {pass} | {:.1} | {:.1} | {:.2}× | {:.1} | {:.1} |",
                a.median() * 1e6,
                b.median() * 1e6,
                a.median() / b.median(),
                a.best() * 1e6,
                b.best() * 1e6
            );
        }
    }
    println!();
}

/// Largest |x − y| over all tensors, relative to the largest |y| of each.
fn max_rel_diff(x: &[Vec<f32>], y: &[Vec<f32>]) -> f64 {
    x.iter()
        .zip(y)
        .map(|(a, b)| {
            let scale = b.iter().fold(1e-12f64, |m, v| m.max(v.abs() as f64));
            a.iter()
                .zip(b)
                .fold(0.0f64, |m, (p, q)| m.max((p - q).abs() as f64 / scale))
        })
        .fold(0.0, f64::max)
}

fn cuda_rows() {
    if !sinter_cuda::is_available() {
        println!("(c) CUDA custom op: no CUDA device here (SINTER_CUDA_EMU=1 runs the emulated one); not run.");
        return;
    }
    let emulated = sinter_cuda::is_emulated();
    println!(
        "## LLTM (c): the custom op's CUDA kernels on {} — correctness only, no timings",
        if emulated {
            "the emulated CUDA device (CPU kernel emulator; not a GPU)"
        } else {
            "a GPU (time it with a GPU benchmark, not here)"
        }
    );
    println!();
    println!("| batch | max relative difference of the loss and all 5 gradients, (c) vs (a) on the CPU |");
    println!("|---:|---:|");
    for batch in [16usize, 32, 64] {
        let want = Problem::new(batch, Device::Cpu).values(LltmImpl::Composite);
        let got = Problem::new(batch, Device::Cuda(0)).values(LltmImpl::CustomOp);
        println!("| {batch} | {:.1e} |", max_rel_diff(&got, &want));
    }
    println!();
}

fn main() {
    if !common::selected("lltm") {
        return;
    }
    cpu_table();
    cuda_rows();
}
