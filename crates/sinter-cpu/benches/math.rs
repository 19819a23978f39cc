//! Throughput of the vectorised math (elements per ns, one thread) beside scalar libm loops
//! (what sinter-core's elementwise kernels run today), on gpt-tiny's MLP activation
//! (768 × 512 values), plus the fused bias + GELU forward and backward, and one decode row
//! of cached attention (`attend_row`, gpt-tiny's head width 32) in ns per call.
//!
//!     chrt -f 1 cargo bench -p sinter-cpu --bench math
//!
//! Each case runs `SINTER_BENCH_ROUNDS` rounds with the engines interleaved; medians.

mod common;

use common::{budget, machine_line, median, rounds, selected, time};
use sinter_cpu::math::activation::Activation;
use sinter_cpu::math::bias_act::{bias_act_backward_rows, bias_act_rows};
use sinter_cpu::math::cached_attention::{attend_row, CachedHead};
use sinter_cpu::math::{unary_backward_isa, unary_isa, Unary};
use sinter_cpu::Isa;

const ROWS: usize = 768;
const N: usize = 512;

fn gelu_tanh_libm(x: f32) -> f32 {
    0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044715 * x * x * x)).tanh())
}

fn gelu_tanh_grad_libm(u: f32) -> f32 {
    const C: f32 = 0.797_884_6;
    let u2 = u * u;
    let t = (C * (u + 0.044715 * u2 * u)).tanh();
    0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * C * (1.0 + 3.0 * 0.044715 * u2)
}

/// The scalar libm form of each function, where std has one.
fn libm(f: Unary) -> Option<fn(f32) -> f32> {
    Some(match f {
        Unary::Exp => f32::exp,
        Unary::Ln => f32::ln,
        Unary::Tanh => f32::tanh,
        Unary::Sigmoid => |x| 1.0 / (1.0 + (-x).exp()),
        Unary::Silu => |x| x / (1.0 + (-x).exp()),
        Unary::Relu => |x| x.max(0.0),
        Unary::GeluTanh => gelu_tanh_libm,
        Unary::Erf | Unary::GeluErf => return None,
    })
}

fn main() {
    println!("## Vectorised math, elements/ns on one thread ({ROWS}×{N} f32 values)");
    println!();
    println!("{}", machine_line());
    println!();
    let n = ROWS * N;
    let x: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 20_000) as f32 / 2000.0 - 5.0)
        .collect();
    let pos: Vec<f32> = x.iter().map(|v| v.abs() + 1e-3).collect();
    let g: Vec<f32> = x.iter().map(|v| v * 0.1).collect();
    let bias: Vec<f32> = (0..N).map(|j| j as f32 * 1e-3).collect();
    let isa = Isa::get();
    println!(
        "| case | {} | scalar path | libm loop | {} / libm |",
        isa.name(),
        isa.name()
    );
    println!("|---|---:|---:|---:|---:|");
    let mut y = vec![0f32; n];
    let mut dx = vec![0f32; n];
    let mut db = vec![0f32; N];
    let rate = |t: &[f64]| n as f64 / median(t) / 1e9;
    for f in Unary::ALL {
        let name = format!("{f:?}");
        if !selected(&name) {
            continue;
        }
        let input = if f == Unary::Ln { &pos } else { &x };
        let (mut ours, mut scalar, mut base) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds() {
            ours.extend(time(budget(), || unary_isa(isa, f, input, &mut y)));
            scalar.extend(time(budget(), || unary_isa(Isa::Scalar, f, input, &mut y)));
            if let Some(l) = libm(f) {
                base.extend(time(budget(), || {
                    y.iter_mut().zip(input).for_each(|(o, &v)| *o = l(v));
                    std::hint::black_box(&y);
                }));
            }
        }
        let b = if base.is_empty() {
            "n/a (no f32 erf in std)".to_string()
        } else {
            format!("{:.3}", rate(&base))
        };
        let ratio = if base.is_empty() {
            "–".to_string()
        } else {
            format!("{:.1}×", rate(&ours) / rate(&base))
        };
        println!(
            "| {name} | {:.3} | {:.3} | {b} | {ratio} |",
            rate(&ours),
            rate(&scalar)
        );
    }
    // Derivatives and the fused bias + GELU (forward, then backward with the bias gradient).
    type Ours<'a> = Box<dyn Fn(&mut [f32], &mut [f32], &mut [f32], Isa) + 'a>;
    type Libm<'a> = Box<dyn Fn(&mut [f32]) + 'a>;
    let cases: [(&str, Ours, Libm); 3] = [
        (
            "GeluTanh backward (g·gelu'(x))",
            Box::new(|_y, dx, _db, isa| unary_backward_isa(isa, Unary::GeluTanh, &x, &g, dx)),
            Box::new(|dx| {
                dx.iter_mut()
                    .zip(x.iter().zip(&g))
                    .for_each(|(o, (&v, &gv))| *o = gv * gelu_tanh_grad_libm(v))
            }),
        ),
        (
            "bias + GeluTanh forward, rows of 512",
            Box::new(|y, _dx, _db, isa| bias_act_rows(isa, &x, &bias, Activation::GeluTanh, y)),
            Box::new(|y| {
                for (yr, xr) in y.chunks_mut(N).zip(x.chunks(N)) {
                    yr.iter_mut()
                        .zip(xr.iter().zip(&bias))
                        .for_each(|(o, (&v, &b))| *o = gelu_tanh_libm(v + b));
                }
            }),
        ),
        (
            "bias + GeluTanh backward (dx and dbias)",
            Box::new(|_y, dx, db, isa| {
                bias_act_backward_rows(isa, &x, &bias, Activation::GeluTanh, &g, dx, db)
            }),
            Box::new(|dx| {
                let mut db = vec![0f32; N];
                for ((dr, xr), gr) in dx.chunks_mut(N).zip(x.chunks(N)).zip(g.chunks(N)) {
                    for j in 0..N {
                        dr[j] = gr[j] * gelu_tanh_grad_libm(xr[j] + bias[j]);
                        db[j] += dr[j];
                    }
                }
                std::hint::black_box(&db);
            }),
        ),
    ];
    for (name, ours_f, libm_f) in &cases {
        if !selected(name) {
            continue;
        }
        let (mut ours, mut scalar, mut base) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds() {
            ours.extend(time(budget(), || ours_f(&mut y, &mut dx, &mut db, isa)));
            scalar.extend(time(budget(), || {
                ours_f(&mut y, &mut dx, &mut db, Isa::Scalar)
            }));
            base.extend(time(budget(), || libm_f(&mut dx)));
        }
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} | {:.1}× |",
            rate(&ours),
            rate(&scalar),
            rate(&base),
            rate(&ours) / rate(&base)
        );
    }
    println!();
    println!(
        "({} round(s) × {:.2} s per engine and case; time per {ROWS}×{N} pass = {n} / rate ns)",
        rounds(),
        budget().as_secs_f64()
    );
    if selected("attention") {
        attention(isa);
    }
}

/// One query row of one head of width 32 against n cached positions (a decode step calls
/// this heads × layers times per sequence): ns per call.
fn attention(isa: Isa) {
    const D: usize = 32;
    println!();
    println!("## Cached attention, one row of one head (d = {D}), ns per call");
    println!();
    println!("| cached positions | {} | scalar path |", isa.name());
    println!("|---:|---:|---:|");
    let cap = 64;
    let k: Vec<f32> = (0..cap * D)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let v: Vec<f32> = (0..cap * D)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
        .collect();
    let q: Vec<f32> = (0..D).map(|i| (i as f32 - 16.0) / 16.0).collect();
    let (mut p, mut o) = (vec![0f32; cap], vec![0f32; D]);
    const CALLS: usize = 1000;
    for n in [8, 36, 64] {
        let cache = CachedHead {
            k: &k,
            v: &v,
            n,
            stride: D,
        };
        let mut run = |isa: Isa| {
            time(budget(), || {
                for _ in 0..CALLS {
                    attend_row(isa, &q, cache, 0.17, &mut p, &mut o);
                }
                std::hint::black_box(&o);
            })
        };
        let (mut ours, mut scalar) = (Vec::new(), Vec::new());
        for _ in 0..rounds() {
            ours.extend(run(isa));
            scalar.extend(run(Isa::Scalar));
        }
        let ns = |t: &[f64]| median(t) * 1e9 / CALLS as f64;
        println!("| {n} | {:.1} | {:.1} |", ns(&ours), ns(&scalar));
    }
}
