//! `sinter bench gpu <which>`: GPU benchmarks, on a machine with a CUDA device only.
//!
//! - `linear`: forward + backward (dX, dW, db) of a Linear layer at batch 4096 for the layer
//!   shapes of GPT-2 small / large and a 7B model, on the CPU backend (all cores) and on the GPU
//!   (fp32, and bf16 under autocast), with speed-ups;
//! - `tc`: tensor cores against CUDA cores: fp32, tf32, bf16 and fp16 GEMM TFLOP/s at 8192³;
//! - `gemm`: bf16 GEMM at 4096³ and 8192³ (compare with PyTorch: bench/gpu/sinter_gpu_bench.sh);
//! - `bandwidth`: add, GELU, softmax and layer norm over 2^28 f32 elements, in GB/s against a
//!   measured device-to-device copy;
//! - `attention`: fused (flash) attention forward, backward and both, causal bf16, T = 1024 and
//!   4096, head dims 64 and 128, with batch·T = 16384 and heads·head_dim = 2048 — the shapes of
//!   bench/gpu/torch_sdpa.py, which times PyTorch's `scaled_dot_product_attention` on them;
//! - `all`: everything.
//!
//! Every timing waits for the device (`synchronize`) before starting and stopping the clock,
//! after warm-up runs (which also compile the kernels and fill the allocator's cache).
//! [`run`] returns a markdown report; with `out` it also writes it there, and the raw numbers as
//! JSON beside it (same name, `.json`).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use sinter_core::{amp, no_grad, DType, Device, Rng, Tensor};

/// The benchmarks `run` accepts.
pub const WHICH: &str = "gemm, tc, linear, bandwidth, attention, all";

const ORDINAL: usize = 0;
const GPU: Device = Device::Cuda(ORDINAL);

/// Runs the benchmarks named by `which` on CUDA device 0; returns a markdown report (also
/// written to `out`, with the numbers as JSON in `out` with extension `.json`).
pub fn run(which: &str, out: Option<&Path>) -> Result<String> {
    let parts: Vec<&str> = match which {
        "all" => vec!["tc", "gemm", "linear", "bandwidth", "attention"],
        "gemm" | "tc" | "linear" | "bandwidth" | "attention" => vec![which],
        other => bail!("unknown GPU benchmark '{other}'; valid: {WHICH}"),
    };
    crate::precision::check_cuda(ORDINAL).context("the GPU benchmarks need a CUDA device")?;
    let info = sinter_core::cuda::runtime::device_info(ORDINAL).context("querying cuda:0")?;
    let mut md = String::new();
    let _ = writeln!(md, "# sinter GPU benchmarks\n");
    let _ = writeln!(
        md,
        "{} ({}, {} SMs, {:.0} GiB); driver CUDA {}, cuBLASLt {}; CPU: {} threads.\n",
        info.name,
        info.arch(),
        info.multiprocessors,
        info.total_memory as f64 / (1u64 << 30) as f64,
        info.driver_version
            .map_or("?".into(), |(a, b)| format!("{a}.{b}")),
        info.cublas_version
            .map_or("?".into(), |(a, b, c)| format!("{a}.{b}.{c}")),
        rayon::current_num_threads()
    );
    let mut results = Map::new();
    results.insert("device".into(), json!(info.name));
    let tf32_before = sinter_core::cuda::allow_tf32();
    let outcome = (|| -> Result<()> {
        for p in parts {
            let (section, v) = match p {
                "tc" => tensor_cores()?,
                "gemm" => gemm_bf16()?,
                "linear" => linear()?,
                "bandwidth" => bandwidth()?,
                "attention" => attention()?,
                _ => unreachable!("checked above"),
            };
            md.push_str(&section);
            md.push('\n');
            results.insert(p.into(), v);
        }
        Ok(())
    })();
    sinter_core::cuda::set_allow_tf32(tf32_before);
    outcome?;
    if let Some(path) = out {
        std::fs::write(path, &md).with_context(|| format!("cannot write {}", path.display()))?;
        let jp = path.with_extension("json");
        let text = serde_json::to_string_pretty(&Value::Object(results))?;
        std::fs::write(&jp, text).with_context(|| format!("cannot write {}", jp.display()))?;
    }
    Ok(md)
}

// ---- timing ---------------------------------------------------------------------------------------

fn sync() -> Result<()> {
    sinter_core::cuda::synchronize(ORDINAL).context("synchronising cuda:0")
}

/// Seconds per call of `f` on the GPU: `warmup` untimed calls, then enough timed calls to fill
/// about `budget_s` (at least 3), between two synchronisations.
fn time_gpu(warmup: usize, budget_s: f64, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..warmup {
        f()?;
    }
    sync()?;
    let t = Instant::now();
    f()?;
    sync()?;
    let one = t.elapsed().as_secs_f64().max(1e-7);
    let iters = ((budget_s / one) as usize).clamp(3, 1000);
    let t = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    sync()?;
    Ok(t.elapsed().as_secs_f64() / iters as f64)
}

/// Seconds per call of `f` on the CPU: one warm-up call, then at least 2 calls filling about
/// `budget_s`.
fn time_cpu(budget_s: f64, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let t = Instant::now();
    f()?;
    let one = t.elapsed().as_secs_f64().max(1e-7);
    let iters = ((budget_s / one) as usize).clamp(1, 50);
    let t = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    Ok((t.elapsed().as_secs_f64() + one) / (iters + 1) as f64)
}

fn rand(shape: &[usize], seed: u64, device: Device) -> Result<Tensor> {
    let mut rng = Rng::new(seed);
    Ok(Tensor::rand_uniform(
        shape,
        -1.0,
        1.0,
        &mut rng,
        DType::F32,
        device,
    )?)
}

// ---- GEMM -------------------------------------------------------------------------------------------

/// TFLOP/s of an n³ product in `dtype` (tf32: f32 with TF32 allowed).
fn gemm_tflops(n: usize, dtype: DType, tf32: bool) -> Result<f64> {
    let _g = no_grad();
    sinter_core::cuda::set_allow_tf32(tf32);
    let a = rand(&[n, n], 1, GPU)?.to_dtype(dtype)?;
    let b = rand(&[n, n], 2, GPU)?.to_dtype(dtype)?;
    let s = time_gpu(3, 1.0, || {
        a.matmul(&b)?;
        Ok(())
    })?;
    sinter_core::cuda::set_allow_tf32(false);
    Ok(2.0 * (n as f64).powi(3) / s / 1e12)
}

fn tensor_cores() -> Result<(String, Value)> {
    let n = 8192;
    let rows = [
        ("fp32 (CUDA cores)", DType::F32, false),
        ("tf32 (tensor cores)", DType::F32, true),
        ("bf16 (tensor cores)", DType::BF16, false),
        ("fp16 (tensor cores)", DType::F16, false),
    ];
    let mut md = format!("## Tensor cores vs CUDA cores: GEMM {n}×{n}×{n}\n\n| math | TFLOP/s | × fp32 |\n|---|---:|---:|\n");
    let mut v = Map::new();
    let mut fp32 = f64::NAN;
    for (name, dt, tf32) in rows {
        let t = gemm_tflops(n, dt, tf32)?;
        if name.starts_with("fp32") {
            fp32 = t;
        }
        let _ = writeln!(md, "| {name} | {t:.1} | {:.1} |", t / fp32);
        v.insert(name.split(' ').next().unwrap_or(name).into(), json!(t));
    }
    Ok((md, Value::Object(v)))
}

fn gemm_bf16() -> Result<(String, Value)> {
    let mut md =
        String::from("## bf16 GEMM (f32 accumulation)\n\n| size | TFLOP/s |\n|---|---:|\n");
    let mut v = Map::new();
    for n in [4096usize, 8192] {
        let t = gemm_tflops(n, DType::BF16, false)?;
        let _ = writeln!(md, "| {n}³ | {t:.1} |");
        v.insert(format!("bf16_{n}"), json!(t));
    }
    Ok((md, Value::Object(v)))
}

// ---- Linear: CPU vs GPU -------------------------------------------------------------------------

/// Forward + backward of y = x·Wᵀ + b with gradients for x, W and b.
struct LinearCase {
    x: Tensor,
    w: Tensor,
    b: Tensor,
    g: Tensor,
}

impl LinearCase {
    fn new(batch: usize, inp: usize, out: usize, device: Device) -> Result<LinearCase> {
        let scale = 1.0 / (inp as f32).sqrt();
        Ok(LinearCase {
            x: rand(&[batch, inp], 3, device)?.to_var()?,
            w: rand(&[out, inp], 4, device)?.mul_scalar(scale)?.to_var()?,
            b: rand(&[out], 5, device)?.to_var()?,
            g: rand(&[batch, out], 6, device)?,
        })
    }
    fn step(&self, autocast: Option<DType>) -> Result<()> {
        for t in [&self.x, &self.w, &self.b] {
            t.zero_grad();
        }
        let y = {
            let _ac = autocast.map(amp::autocast);
            self.x.matmul(&self.w.t()?)?.add(&self.b)?
        };
        y.backward_with_grad(&self.g, |_, _| Ok(()))?;
        Ok(())
    }
}

fn linear() -> Result<(String, Value)> {
    let batch = 4096;
    let shapes = [
        (576usize, 1024usize),
        (1024, 4096),
        (2304, 16000),
        (4096, 11008),
    ];
    let mut md = format!(
        "## Linear forward + backward, batch {batch} (CPU: {} threads)\n\n| in × out | GFLOP | CPU ms | GPU fp32 ms | speed-up | GPU bf16 ms | speed-up |\n|---|---:|---:|---:|---:|---:|---:|\n",
        rayon::current_num_threads()
    );
    let mut v = Vec::new();
    for (inp, out) in shapes {
        let gflop = 3.0 * 2.0 * (batch * inp * out) as f64 / 1e9;
        let cpu = {
            let c = LinearCase::new(batch, inp, out, Device::Cpu)?;
            time_cpu(2.0, || c.step(None))?
        };
        sinter_core::cuda::set_allow_tf32(false);
        let (gpu32, gpu16) = {
            let c = LinearCase::new(batch, inp, out, GPU)?;
            (
                time_gpu(3, 0.5, || c.step(None))?,
                time_gpu(3, 0.5, || c.step(Some(DType::BF16)))?,
            )
        };
        let _ = writeln!(
            md,
            "| {inp} × {out} | {gflop:.0} | {:.1} | {:.2} | {:.0}× | {:.2} | {:.0}× |",
            cpu * 1e3,
            gpu32 * 1e3,
            cpu / gpu32,
            gpu16 * 1e3,
            cpu / gpu16
        );
        v.push(json!({"in": inp, "out": out, "batch": batch, "cpu_s": cpu, "gpu_fp32_s": gpu32, "gpu_bf16_s": gpu16}));
    }
    Ok((md, Value::Array(v)))
}

// ---- bandwidth-bound kernels ------------------------------------------------------------------------

/// GB/s of a device-to-device copy of `n` f32 (read + write), the practical ceiling.
fn copy_gbs(n: usize) -> Result<f64> {
    let a = Tensor::zeros(&[n], DType::F32, GPU).context("allocating")?;
    let b = Tensor::zeros(&[n], DType::F32, GPU).context("allocating")?;
    let s = time_gpu(3, 0.5, || {
        sinter_core::cuda::runtime::driver_copy(&b, &a).context("copy")
    })?;
    Ok(2.0 * 4.0 * n as f64 / s / 1e9)
}

fn bandwidth() -> Result<(String, Value)> {
    let _g = no_grad();
    let n = 1usize << 28;
    let cols = 4096;
    let shape = [n / cols, cols];
    let ceiling = copy_gbs(n)?;
    let x = rand(&shape, 7, GPU)?;
    let y = x.affine(0.5, 1.0)?;
    let gamma = rand(&[cols], 8, GPU)?;
    let beta = rand(&[cols], 9, GPU)?;
    let bytes = |tensors: f64| tensors * 4.0 * n as f64;
    type Case<'a> = (&'a str, f64, Box<dyn Fn() -> Result<()> + 'a>);
    let cases: Vec<Case> = vec![
        (
            "add (x + y)",
            bytes(3.0),
            Box::new(|| x.add(&y).map(drop).map_err(Into::into)),
        ),
        (
            "GELU",
            bytes(2.0),
            Box::new(|| x.gelu().map(drop).map_err(Into::into)),
        ),
        (
            "softmax (rows of 4096)",
            bytes(2.0),
            Box::new(|| x.softmax(-1).map(drop).map_err(Into::into)),
        ),
        (
            "layer norm (rows of 4096)",
            bytes(2.0),
            Box::new(|| {
                x.layer_norm(&gamma, &beta, 1e-5)
                    .map(drop)
                    .map_err(Into::into)
            }),
        ),
    ];
    let mut md = format!(
        "## Bandwidth-bound kernels, 2^28 f32 elements\n\nCeiling: device-to-device copy {ceiling:.0} GB/s (bytes read + written).\n\n| kernel | GB moved | ms | GB/s | % of copy |\n|---|---:|---:|---:|---:|\n"
    );
    let mut v = Map::new();
    v.insert("copy_gbs".into(), json!(ceiling));
    for (name, b, f) in &cases {
        let s = time_gpu(2, 0.5, f)?;
        let gbs = b / s / 1e9;
        let _ = writeln!(
            md,
            "| {name} | {:.2} | {:.2} | {gbs:.0} | {:.0}% |",
            b / 1e9,
            s * 1e3,
            100.0 * gbs / ceiling
        );
        v.insert((*name).into(), json!(gbs));
    }
    Ok((md, Value::Object(v)))
}

// ---- attention -------------------------------------------------------------------------------------

/// Forward, backward and forward+backward TFLOP/s of causal bf16 attention, counted as
/// FlashAttention counts: forward 4·B·H·T²·D halved by the causal mask, backward 2.5× that.
fn attention() -> Result<(String, Value)> {
    let mut md = String::from(
        "## Fused attention, causal bf16 (batch·T = 16384, heads·head_dim = 2048)\n\n| T | head dim | batch × heads | fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s | fwd+bwd TFLOP/s |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut v = Map::new();
    for t in [1024usize, 4096] {
        for d in [64usize, 128] {
            let (b, h) = (16384 / t, 2048 / d);
            let shape = [b, h, t, d];
            let var = |seed| -> Result<Tensor> {
                Ok(rand(&shape, seed, GPU)?.to_dtype(DType::BF16)?.to_var()?)
            };
            let (q, k, vv) = (var(11)?, var(12)?, var(13)?);
            let dout = rand(&shape, 14, GPU)?.to_dtype(DType::BF16)?;
            let scale = 1.0 / (d as f32).sqrt();
            let fwd = || -> Result<Tensor> {
                Ok(sinter_core::fused::attention(&q, &k, &vv, true, scale)?)
            };
            let fwd_s = time_gpu(2, 0.5, || fwd().map(drop))?;
            let both_s = time_gpu(2, 0.5, || {
                fwd()?.backward_with_grad(&dout, |_, _| Ok(()))?;
                for x in [&q, &k, &vv] {
                    x.zero_grad();
                }
                Ok(())
            })?;
            let bwd_s = (both_s - fwd_s).max(1e-9);
            let fwd_flops = 4.0 * (b * h) as f64 * (t * t * d) as f64 / 2.0;
            let bwd_flops = 2.5 * fwd_flops;
            let tf = |f: f64, s: f64| f / s / 1e12;
            let _ = writeln!(
                md,
                "| {t} | {d} | {b} × {h} | {:.3} | {:.3} | {:.1} | {:.1} | {:.1} |",
                fwd_s * 1e3,
                bwd_s * 1e3,
                tf(fwd_flops, fwd_s),
                tf(bwd_flops, bwd_s),
                tf(fwd_flops + bwd_flops, both_s)
            );
            v.insert(
                format!("t{t}_d{d}"),
                json!({"fwd_ms": fwd_s * 1e3, "bwd_ms": bwd_s * 1e3,
                       "fwd_tflops": tf(fwd_flops, fwd_s), "bwd_tflops": tf(bwd_flops, bwd_s),
                       "fwd_bwd_tflops": tf(fwd_flops + bwd_flops, both_s)}),
            );
        }
    }
    Ok((md, Value::Object(v)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn needs_a_gpu_or_says_why() {
        if sinter_core::cuda::is_available() {
            eprintln!("skipped: a CUDA device is present (the benchmarks run on the GPU machine)");
            return;
        }
        let e = super::run("gemm", None).unwrap_err();
        let chain = format!("{e:#}");
        assert!(chain.contains("CUDA"), "{chain}");
        let e = super::run("flops", None).unwrap_err().to_string();
        assert!(e.contains(super::WHICH), "{e}");
    }
}
