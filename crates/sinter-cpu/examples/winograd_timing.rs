//! Times the Winograd convolution's three passes on one shape against the GEMM an im2col
//! convolution's forward pass would run (its lower bound), for tuning the block size.
//!
//! `cargo run --release -p sinter-cpu --example winograd_timing -- N C O H W [PAD] [SECS]`
//! (default: the conv bench's 64 32 64 16 16 1, 1 second per figure).

use std::time::{Duration, Instant};

use sinter_cpu::gemm::{Gemm, MatMut, MatRef};
use sinter_cpu::winograd::{backward_data, backward_filter, forward, Conv3x3};
use sinter_cpu::Isa;

/// The median milliseconds of `f` over about `secs` seconds.
fn time(secs: f64, mut f: impl FnMut()) -> f64 {
    f();
    let mut runs = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs_f64(secs) || runs.len() < 3 {
        let t = Instant::now();
        f();
        runs.push(t.elapsed().as_secs_f64() * 1e3);
    }
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a number"))
        .collect();
    let arg = |i: usize, d: usize| args.get(i).copied().unwrap_or(d);
    let g = Conv3x3 {
        n: arg(0, 64),
        c: arg(1, 32),
        o: arg(2, 64),
        h: arg(3, 16),
        w: arg(4, 16),
        padding: (arg(5, 1), arg(5, 1)),
    };
    let secs = arg(6, 1) as f64;
    let isa = Isa::get();
    let x: Vec<f32> = (0..g.input_len()).map(|i| (i % 7) as f32 - 3.0).collect();
    let w: Vec<f32> = (0..g.weight_len()).map(|i| (i % 5) as f32 - 2.0).collect();
    let dy: Vec<f32> = (0..g.output_len()).map(|i| (i % 3) as f32 - 1.0).collect();
    let (mut y, mut dx, mut dw) = (
        vec![0f32; g.output_len()],
        vec![0f32; g.input_len()],
        vec![0f32; g.weight_len()],
    );
    let flops = 2.0 * (g.n * g.o * g.c * 9 * g.oh() * g.ow()) as f64;
    let report = |what: &str, ms: f64| {
        println!(
            "{what:>10}: {ms:8.3} ms  {:6.1} GFLOP/s (direct-equivalent)",
            flops / ms / 1e6
        )
    };
    report(
        "forward",
        time(secs, || {
            forward(isa, &g, &x, &w, None, false, &mut y).unwrap()
        }),
    );
    report(
        "dx",
        time(secs, || backward_data(isa, &g, &w, &dy, &mut dx).unwrap()),
    );
    report(
        "dw",
        time(secs, || backward_filter(isa, &g, &x, &dy, &mut dw).unwrap()),
    );
    // The im2col forward's product: W (o × 9c) · col (9c × n·oh·ow).
    let cols = g.n * g.oh() * g.ow();
    let col = vec![1f32; 9 * g.c * cols];
    let mut out = vec![0f32; g.o * cols];
    report(
        "gemm-only",
        time(secs, || {
            Gemm::new(g.o, cols, 9 * g.c)
                .run(
                    MatRef::row_major(&w, 9 * g.c),
                    MatRef::row_major(&col, cols),
                    MatMut::row_major(&mut out, cols),
                )
                .unwrap()
        }),
    );
}
