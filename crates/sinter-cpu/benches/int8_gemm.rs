//! int8 GEMM throughput per path beside the f32 GEMM sinter's Linear runs today (the `gemm`
//! crate, with sinter-core's threading policy), at GPT-2 124M's Linear shapes.
//!
//!     cargo bench -p sinter-cpu --bench int8_gemm
//!     chrt -f 1 target/release/deps/int8_gemm-* --bench     # steadier on a shared machine
//!
//! Each int8 row is the whole quantized Linear on f32 input: dynamic per-row quantization of
//! the activations, the GEMM, and the fused dequantize + bias epilogue to f32. GOP/s counts
//! 2·m·n·k per call for both. Budget per case: `SINTER_BENCH_SECS` (default 1) ×
//! `SINTER_BENCH_ROUNDS` (default 2), f32 and the int8 paths interleaved in each round.

#[path = "../../sinter-core/benches/common/mod.rs"]
mod common;

use common::{budget, machine_line, rounds, time_it, Stats};
use sinter_cpu::int8::{
    gemm as int8_gemm, quantize_rows_dynamic, quantize_weights, ActQuant, Activation, Activations,
    Epilogue, Int8Path, Output, PackedWeights,
};

/// (k, n): attention qkv, MLP fc, MLP proj of GPT-2 124M.
const SHAPES: &[(usize, usize, &str)] = &[
    (768, 2304, "qkv 768→2304"),
    (768, 3072, "fc 768→3072"),
    (3072, 768, "proj 3072→768"),
];
const ROWS: &[usize] = &[1, 8, 64];

fn f32_linear(x: &[f32], w: &[f32], bias: &[f32], m: usize, n: usize, k: usize, y: &mut [f32]) {
    let threads = rayon::current_num_threads();
    let par = if 2 * m * n * k >= 1 << 21 && threads > 1 {
        ::gemm::Parallelism::Rayon(threads)
    } else {
        ::gemm::Parallelism::None
    };
    // y = x · wᵀ (w is [n, k], read transposed in place), then the bias, as Linear does.
    unsafe {
        ::gemm::gemm(
            m,
            n,
            k,
            y.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    };
    for row in y.chunks_exact_mut(n) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

struct Int8Linear {
    packed: PackedWeights,
    scales: Vec<f32>,
    bias: Vec<f32>,
}

impl Int8Linear {
    fn forward(&self, path: Int8Path, x: &[f32], m: usize, y: &mut [f32], buf: &mut Vec<u8>) {
        let (k, kp, n) = (self.packed.k(), self.packed.k_padded(), self.packed.n());
        buf.resize(m * kp, 0);
        let rows = quantize_rows_dynamic(x, m, k, k, buf, kp).unwrap();
        int8_gemm(
            path,
            &Activations {
                data: buf,
                rows: m,
                stride: kp,
                quant: ActQuant::PerRow(&rows),
            },
            &self.packed,
            &Epilogue {
                weight_scales: &self.scales,
                bias: Some(&self.bias),
                activation: Activation::None,
            },
            Output::F32 { data: y, stride: n },
        );
    }
}

fn main() {
    if !common::selected("int8") {
        return;
    }
    let paths = Int8Path::available();
    println!("## int8 Linear (dynamic u8 × i8 → f32) vs f32 GEMM, GPT-2 124M shapes");
    println!();
    println!(
        "{}; int8 paths {:?}; {} round(s) × {:.1} s per case",
        machine_line(),
        paths.iter().map(|p| p.name()).collect::<Vec<_>>(),
        rounds(),
        budget().as_secs_f64()
    );
    println!();
    let mut header = "| shape | rows | f32 GOP/s |".to_string();
    let mut rule = "| --- | ---: | ---: |".to_string();
    for p in &paths {
        header += &format!(" {} GOP/s (× f32) |", p.name());
        rule += " ---: |";
    }
    println!("{header}\n{rule}");
    let mut seed = 0x1234_5678u64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    for &(k, n, name) in SHAPES {
        let w: Vec<f32> = (0..n * k).map(|_| rand() * 0.1).collect();
        let bias: Vec<f32> = (0..n).map(|_| rand()).collect();
        let (q, scales) = quantize_weights(&w, n, k).unwrap();
        let lin = Int8Linear {
            packed: PackedWeights::pack(&q, n, k).unwrap(),
            scales,
            bias: bias.clone(),
        };
        for &m in ROWS {
            let x: Vec<f32> = (0..m * k).map(|_| rand()).collect();
            let mut y = vec![0f32; m * n];
            let mut buf = Vec::new();
            let mut f32_t = Vec::new();
            let mut int8_t: Vec<Vec<Stats>> = vec![Vec::new(); paths.len()];
            for _ in 0..rounds() {
                f32_t.push(time_it(3, budget(), 5, 100_000, || {
                    f32_linear(&x, &w, &bias, m, n, k, &mut y)
                }));
                for (i, &p) in paths.iter().enumerate() {
                    int8_t[i].push(time_it(3, budget(), 5, 100_000, || {
                        lin.forward(p, &x, m, &mut y, &mut buf)
                    }));
                }
            }
            let ops = 2.0 * (m * n * k) as f64;
            let t32 = Stats::merge(&f32_t).median();
            let mut line = format!("| {name} | {m} | {:.1} |", ops / t32 / 1e9);
            for t in &int8_t {
                let t8 = Stats::merge(t).median();
                line += &format!(" {:.1} ({:.2}×) |", ops / t8 / 1e9, t32 / t8);
            }
            println!("{line}");
        }
    }
}
