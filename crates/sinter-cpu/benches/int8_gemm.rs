//! int8 GEMM throughput per path beside sinter-cpu's f32 GEMM (B read in place, as the f32
//! Linear does, and prepacked), at GPT-2 124M's Linear shapes.
//!
//!     cargo bench -p sinter-cpu --bench int8_gemm
//!     chrt -f 1 target/release/deps/int8_gemm-* --bench     # steadier on a shared machine
//!
//! Each int8 row is the whole quantized Linear on f32 input: dynamic per-row quantization of
//! the activations, the GEMM, and the fused dequantize + bias epilogue to f32. GOP/s counts
//! 2·m·n·k per call for both. Budget per case: `SINTER_BENCH_SECS` (default 0.5) ×
//! `SINTER_BENCH_ROUNDS` (default 3), f32 and the int8 paths interleaved in each round.

mod common;

use common::{budget, machine_line, median, rounds, time};
use sinter_cpu::gemm::{Gemm, MatMut, MatRef, PackedB};
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

/// y = x·wᵀ + bias with sinter-cpu's f32 GEMM, bias fused: w [n, k] read transposed in place,
/// as the f32 Linear does, or prepacked once (the best f32 inference can do).
struct F32Linear<'a> {
    w: &'a [f32],
    packed: Option<&'a PackedB>,
    bias: &'a [f32],
}

impl F32Linear<'_> {
    fn forward(&self, x: &[f32], m: usize, y: &mut [f32]) {
        let (n, k) = (self.bias.len(), self.w.len() / self.bias.len());
        let g = Gemm::new(m, n, k).bias(self.bias);
        let (a, c) = (MatRef::row_major(x, k), MatMut::row_major(y, n));
        match self.packed {
            Some(b) => g.run_packed(a, b, c, None),
            None => g.run(a, MatRef::row_major(self.w, k).t(), c),
        }
        .unwrap();
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
    let mut header = "| shape | rows | f32 GOP/s | f32 prepacked GOP/s |".to_string();
    let mut rule = "| --- | ---: | ---: | ---: |".to_string();
    for p in &paths {
        header += &format!(" {} GOP/s (× f32 in place) |", p.name());
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
        let wp = PackedB::new(MatRef::row_major(&w, k).t(), k, n).unwrap();
        let plain = F32Linear {
            w: &w,
            packed: None,
            bias: &bias,
        };
        let prepacked = F32Linear {
            w: &w,
            packed: Some(&wp),
            bias: &bias,
        };
        let lin = Int8Linear {
            packed: PackedWeights::pack(&q, n, k).unwrap(),
            scales,
            bias: bias.clone(),
        };
        for &m in ROWS {
            let x: Vec<f32> = (0..m * k).map(|_| rand()).collect();
            let mut y = vec![0f32; m * n];
            let mut buf = Vec::new();
            let (mut f32_t, mut f32p_t) = (Vec::new(), Vec::new());
            let mut int8_t: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
            for _ in 0..rounds() {
                f32_t.extend(time(budget(), || plain.forward(&x, m, &mut y)));
                f32p_t.extend(time(budget(), || prepacked.forward(&x, m, &mut y)));
                for (i, &p) in paths.iter().enumerate() {
                    int8_t[i].extend(time(budget(), || lin.forward(p, &x, m, &mut y, &mut buf)));
                }
            }
            let ops = 2.0 * (m * n * k) as f64;
            let (t32, t32p) = (median(&f32_t), median(&f32p_t));
            let mut line = format!(
                "| {name} | {m} | {:.1} | {:.1} |",
                ops / t32 / 1e9,
                ops / t32p / 1e9
            );
            for t in &int8_t {
                let t8 = median(t);
                line += &format!(" {:.1} ({:.2}×) |", ops / t8 / 1e9, t32 / t8);
            }
            println!("{line}");
        }
    }
}
