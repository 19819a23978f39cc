//! conv2d throughput (im2col + GEMM), forward alone and forward + backward (dx and dw).
//!
//!     cargo bench -p sinter-core --bench conv2d
//!
//! GFLOP/s counts 2·N·O·OH·OW·(C/groups)·KH·KW per pass: one pass forward, three forward +
//! backward (the forward, dx and dw are one GEMM each). The backward is seeded with ones
//! (`y.backward()`), so no extra op runs. Budget per case: `SINTER_BENCH_SECS` (default 1)
//! × `SINTER_BENCH_ROUNDS` (default 2).

mod common;

use common::{budget, machine_line, rounds, time_it, Stats};
use sinter_core::{Conv2dParams, DType, Device, Rng, Tensor};

struct Case {
    name: &'static str,
    x: [usize; 4],
    w: [usize; 4],
    padding: usize,
}

const CASES: &[Case] = &[
    Case {
        name: "64×32×16×16, 64×32×3×3, pad 1",
        x: [64, 32, 16, 16],
        w: [64, 32, 3, 3],
        padding: 1,
    },
    Case {
        name: "digits CNN conv1: 64×1×8×8, 32×1×3×3, pad 1",
        x: [64, 1, 8, 8],
        w: [32, 1, 3, 3],
        padding: 1,
    },
    Case {
        name: "digits CNN conv2: 64×32×4×4, 64×32×3×3, pad 1",
        x: [64, 32, 4, 4],
        w: [64, 32, 3, 3],
        padding: 1,
    },
];

fn measure(f: impl FnMut()) -> Stats {
    let mut f = f;
    Stats::merge(
        &(0..rounds())
            .map(|_| time_it(3, budget(), 5, 2000, &mut f))
            .collect::<Vec<_>>(),
    )
}

fn main() {
    if !common::selected("conv2d") {
        return;
    }
    println!("## conv2d, f32, stride 1 (im2col + GEMM, batch split across cores)");
    println!();
    println!(
        "{}; {} round(s) × {:.1} s per case",
        machine_line(),
        rounds(),
        budget().as_secs_f64()
    );
    println!();
    println!(
        "| input, weight | pass | median ms | best ms | median GFLOP/s | best GFLOP/s | reps |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    for c in CASES {
        let p = Conv2dParams {
            padding: c.padding.into(),
            ..Default::default()
        };
        let [n, ch, h, w] = c.x;
        let [o, cg, kh, kw] = c.w;
        let oh = h + 2 * c.padding - kh + 1;
        let ow = w + 2 * c.padding - kw + 1;
        let pass_flops = 2.0 * (n * o * oh * ow * cg * kh * kw) as f64;
        let mut rng = Rng::new(7);
        let x = Tensor::randn(&[n, ch, h, w], 0.0, 1.0, &mut rng, DType::F32, Device::Cpu).unwrap();
        let wt = Tensor::randn(
            &[o, cg, kh, kw],
            0.0,
            0.1,
            &mut rng,
            DType::F32,
            Device::Cpu,
        )
        .unwrap();
        let fwd = measure(|| {
            std::hint::black_box(x.conv2d(&wt, p).unwrap());
        });
        let (xv, wv) = (x.to_var().unwrap(), wt.to_var().unwrap());
        let both = measure(|| {
            xv.zero_grad();
            wv.zero_grad();
            let y = xv.conv2d(&wv, p).unwrap();
            y.backward().unwrap();
            std::hint::black_box((xv.grad(), wv.grad()));
        });
        assert!(
            xv.grad().is_some() && wv.grad().is_some(),
            "conv2d backward produced no gradients"
        );
        for (pass, s, flops) in [
            ("forward", &fwd, pass_flops),
            ("forward + backward", &both, 3.0 * pass_flops),
        ] {
            println!(
                "| {} | {pass} | {:.3} | {:.3} | {:.1} | {:.1} | {} |",
                c.name,
                s.median() * 1e3,
                s.best() * 1e3,
                flops / s.median() / 1e9,
                flops / s.best() / 1e9,
                s.reps()
            );
        }
    }
    println!();
}
