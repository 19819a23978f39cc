//! Each Winograd F(2×2, 3×3) pass alone (forward, input gradient, weight gradient) on the
//! `sinter bench cpu conv` shape: 64×32×16×16 ∗ 64×32×3×3, padding 1, on the rayon pool.
//! Prints ms per call (median of the pooled rounds, passes interleaved) and the GFLOP/s of
//! the direct convolution's 2·n·o·oh·ow·c·9 flops (the figure the conv bench reports).
//!
//!     flock /tmp/bench.lock chrt -f 1 cargo bench -p sinter-cpu --bench winograd [-- forward|data|filter]
//!
//! `SINTER_BENCH_ROUNDS` rounds (default 3) of `SINTER_BENCH_SECS` per pass (default 0.5);
//! the machine is noisy, so compare two builds by alternating their binaries.

mod common;

use common::{budget, machine_line, median, rounds, selected, time};
use sinter_cpu::winograd::{backward_data, backward_filter, forward, Conv3x3};
use sinter_cpu::Isa;

fn main() {
    let g = Conv3x3 {
        n: 64,
        c: 32,
        o: 64,
        h: 16,
        w: 16,
        padding: (1, 1),
    };
    println!("## Winograd conv passes, {g:?}");
    println!();
    println!("{}", machine_line());
    println!();
    let isa = Isa::get();
    let fill = |len: usize, seed: usize| -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7919 + seed) % 2000) as f32 / 1000.0 - 1.0)
            .collect()
    };
    let (x, w, dy) = (
        fill(g.input_len(), 1),
        fill(g.weight_len(), 2),
        fill(g.output_len(), 3),
    );
    let (mut y, mut dx, mut dw) = (
        vec![0f32; g.output_len()],
        vec![0f32; g.input_len()],
        vec![0f32; g.weight_len()],
    );
    let flops = 2.0 * (g.n * g.o * g.oh() * g.ow() * g.c * 9) as f64;
    let mut t: [Vec<f64>; 3] = Default::default();
    for _ in 0..rounds() {
        if selected("forward") {
            t[0].extend(time(budget(), || {
                forward(isa, &g, &x, &w, None, false, &mut y).unwrap()
            }));
        }
        if selected("data") {
            t[1].extend(time(budget(), || {
                backward_data(isa, &g, &w, &dy, &mut dx).unwrap()
            }));
        }
        if selected("filter") {
            t[2].extend(time(budget(), || {
                backward_filter(isa, &g, &x, &dy, &mut dw).unwrap()
            }));
        }
    }
    for (name, t) in ["forward", "data (dx)", "filter (dw)"].iter().zip(&t) {
        if t.is_empty() {
            continue;
        }
        let m = median(t);
        let mut s = t.clone();
        s.sort_by(f64::total_cmp);
        let (lo, hi) = (s[s.len() / 10], s[s.len() * 9 / 10]);
        println!(
            "{name:12} {:7.3} ms  (p10 {:.3}, p90 {:.3})  {:6.1} GFLOP/s",
            m * 1e3,
            lo * 1e3,
            hi * 1e3,
            flops / m / 1e9
        );
    }
}
