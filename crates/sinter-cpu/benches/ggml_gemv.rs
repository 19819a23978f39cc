//! The quantized GEMV of a decode step (`QuantMatrix::matmul` with one activation row) on the
//! matrices of SmolLM2-135M (hidden 576, MLP 1536, 30 layers, vocabulary 49152): each matrix
//! alone, as weight GB/s, and a whole token's products in sequence (4 per layer and the head),
//! as products-only tokens/s, which also pays each product's fork and join across threads.
//!
//! `SINTER_BENCH_ROWS=4,16` also times a token's products on that many activation rows at
//! once (a server's decode step of that many sequences), as products-only tokens/s.
//!
//!     chrt -f 1 cargo bench -p sinter-cpu --bench ggml_gemv
//!     RAYON_NUM_THREADS=1 SINTER_BENCH_TYPES=q8_0 chrt -f 1 cargo bench -p sinter-cpu --bench ggml_gemv
//!     SINTER_BENCH_ROWS=4,16 chrt -f 1 cargo bench -p sinter-cpu --bench ggml_gemv -- rows
//!
//! Rounds (`SINTER_BENCH_ROUNDS`) interleave the types; medians over all repetitions.

mod common;

use common::{budget, machine_line, median, rounds, selected, time};
use sinter_cpu::ggml_quant::{quantize::quantize, GgmlType, QuantMatrix};

const HIDDEN: usize = 576;
const MLP: usize = 1536;
const KV: usize = 192;
const LAYERS: usize = 30;
const VOCAB: usize = 49152;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 9) as f32 / (1 << 23) as f32
                - 0.5
        })
        .collect()
}

/// A `rows` × `k` matrix of type `ty` (Q8_0 where `k` is not whole blocks of `ty`, as
/// `sinter quantize` falls back).
fn matrix(ty: GgmlType, rows: usize, k: usize, seed: u32) -> QuantMatrix {
    let ty = if k.is_multiple_of(ty.block_elems()) {
        ty
    } else {
        GgmlType::Q8_0
    };
    let bytes = quantize(ty, &values(rows * k, seed), k).expect("quantize");
    QuantMatrix::new(ty, rows, k, bytes).expect("matrix")
}

/// One layer's four products (qkv stacked, output, gate and up stacked, down).
struct Layer {
    qkv: QuantMatrix,
    out: QuantMatrix,
    gate_up: QuantMatrix,
    down: QuantMatrix,
}

fn layer(ty: GgmlType, seed: u32) -> Layer {
    Layer {
        qkv: matrix(ty, HIDDEN + 2 * KV, HIDDEN, seed),
        out: matrix(ty, HIDDEN, HIDDEN, seed + 1),
        gate_up: matrix(ty, 2 * MLP, HIDDEN, seed + 2),
        down: matrix(ty, HIDDEN, MLP, seed + 3),
    }
}

fn parse_type(s: &str) -> GgmlType {
    match s.trim().to_ascii_lowercase().as_str() {
        "q8_0" => GgmlType::Q8_0,
        "q4_0" => GgmlType::Q4_0,
        "q4_1" => GgmlType::Q4_1,
        "q4_k" => GgmlType::Q4_K,
        "q6_k" => GgmlType::Q6_K,
        other => {
            panic!("SINTER_BENCH_TYPES: unknown type '{other}' (q8_0, q4_0, q4_1, q4_k, q6_k)")
        }
    }
}

fn main() {
    let types: Vec<GgmlType> = std::env::var("SINTER_BENCH_TYPES")
        .map(|s| s.split(',').map(parse_type).collect())
        .unwrap_or_else(|_| vec![GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q4_K]);
    println!("{}", machine_line());
    let batch: Vec<usize> = std::env::var("SINTER_BENCH_ROWS")
        .map(|s| {
            (s.split(',').map(|r| {
                (r.trim().parse().ok())
                    .filter(|&r: &usize| r > 0)
                    .unwrap_or_else(|| panic!("SINTER_BENCH_ROWS: '{r}' is not a row count ≥ 1"))
            }))
            .collect()
        })
        .unwrap_or_default();
    let most = batch.iter().copied().max().unwrap_or(1);
    let x_h = values(HIDDEN * most, 7);
    let x_m = values(MLP * most, 8);
    let models: Vec<(GgmlType, Vec<Layer>, QuantMatrix)> = types
        .iter()
        .map(|&ty| {
            let layers = (0..LAYERS as u32).map(|l| layer(ty, 10 * l)).collect();
            (ty, layers, matrix(ty, VOCAB, HIDDEN, 999))
        })
        .collect();

    // name -> [(matrix bytes, seconds)] pooled over rounds
    let mut single: Vec<(String, usize, Vec<f64>)> = Vec::new();
    let mut token: Vec<(String, usize, usize, Vec<f64>)> = Vec::new();
    for _ in 0..rounds() {
        for (ty, layers, head) in &models {
            let l = &layers[0];
            for (what, m, x) in [
                ("qkv", &l.qkv, &x_h[..HIDDEN]),
                ("gate_up", &l.gate_up, &x_h[..HIDDEN]),
                ("down", &l.down, &x_m[..MLP]),
                ("head", head, &x_h[..HIDDEN]),
            ] {
                let name = format!("{} {what} {}x{}", ty.name(), m.n(), m.k());
                if !selected(&name) {
                    continue;
                }
                let mut y = vec![0f32; m.n()];
                let t = time(budget(), || m.matmul(x, 1, &mut y).expect("matmul"));
                match single.iter_mut().find(|s| s.0 == name) {
                    Some(s) => s.2.extend(t),
                    None => single.push((name, m.bytes(), t)),
                }
            }
            let name = format!("{} token (121 products)", ty.name());
            let bytes = head.bytes()
                + layers
                    .iter()
                    .map(|l| l.qkv.bytes() + l.out.bytes() + l.gate_up.bytes() + l.down.bytes())
                    .sum::<usize>();
            let mut y = vec![0f32; VOCAB.max(2 * MLP) * most];
            let mut step_rows = |m: usize| {
                let (xh, xm) = (&x_h[..m * HIDDEN], &x_m[..m * MLP]);
                for l in layers {
                    let qkv = m * l.qkv.n();
                    l.qkv.matmul(xh, m, &mut y[..qkv]).expect("qkv");
                    l.out.matmul(xh, m, &mut y[..m * HIDDEN]).expect("out");
                    let gu = m * 2 * MLP;
                    l.gate_up.matmul(xh, m, &mut y[..gu]).expect("gate_up");
                    l.down.matmul(xm, m, &mut y[..m * HIDDEN]).expect("down");
                }
                head.matmul(xh, m, &mut y[..m * VOCAB]).expect("head");
            };
            if selected(&name) {
                let t = time(budget(), || step_rows(1));
                match token.iter_mut().find(|s| s.0 == name) {
                    Some(s) => s.3.extend(t),
                    None => token.push((name, bytes, 1, t)),
                }
                // The same from inside the pool (the caller a rayon worker, as `sinter
                // generate` runs its steps): each product's parallel part is then a local
                // fork, not a job injected from outside that the caller sleeps on.
                let name = format!("{} token, in the pool", ty.name());
                let t = rayon::join(|| time(budget(), || step_rows(1)), || ()).0;
                match token.iter_mut().find(|s| s.0 == name) {
                    Some(s) => s.3.extend(t),
                    None => token.push((name, bytes, 1, t)),
                }
            }
            for &m in &batch {
                let name = format!("{} {m} rows, in the pool", ty.name());
                if !selected(&name) {
                    continue;
                }
                let t = rayon::join(|| time(budget(), || step_rows(m)), || ()).0;
                match token.iter_mut().find(|s| s.0 == name) {
                    Some(s) => s.3.extend(t),
                    None => token.push((name, bytes, m, t)),
                }
            }
        }
    }
    println!("\n| matrix | weight bytes | µs | GB/s |\n|---|---:|---:|---:|");
    for (name, bytes, t) in &single {
        let s = median(t);
        println!(
            "| {name} | {bytes} | {:.1} | {:.2} |",
            s * 1e6,
            *bytes as f64 / s / 1e9
        );
    }
    println!(
        "\n| token | weight bytes | ms | products-only tok/s | GB/s |\n|---|---:|---:|---:|---:|"
    );
    for (name, bytes, rows, t) in &token {
        let s = median(t);
        println!(
            "| {name} | {bytes} | {:.2} | {:.1} | {:.2} |",
            s * 1e3,
            *rows as f64 / s,
            *bytes as f64 / s / 1e9
        );
    }
}
