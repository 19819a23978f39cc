//! A named GPU's predicted time for recorded work ([`super::cost`]): per call,
//!
//! ```text
//! time = max(bytes / (HBM bandwidth · eff_mem), tensor FLOPs / (tensor peak · eff_tc)
//!            + CUDA-core FLOPs / (fp32 peak · eff_fp32)) + per-launch overhead
//! ```
//!
//! with an efficiency per class of work. Every efficiency is calibrated on the only real
//! figures sinter has, one H100 SXM (bench/RESULTS.md, "GPU: the first real GPU run"):
//! - copies: a 2^28-f32 device copy ran 3013 GB/s = 0.90 of 3.35 TB/s; elementwise kernels
//!   (add 97 %, GELU 94 % of the copy) 0.87; row kernels (layer norm 83 %, softmax 59 % of the
//!   copy) 0.75, softmax 0.53;
//! - GEMMs: a ceiling of 0.775 of 989 TFLOP/s, less the wave quantisation of 128×256 output
//!   tiles over 132 SMs and a k-loop fill of ~128, which puts bf16 4096³ at the measured 722.9
//!   TFLOP/s and the padded LM head (16384×50264×768) at its measured 1.90 ms; fp32 8192³
//!   51.6 = 0.77 of 67; a GEMM whose m, n or k is not 16-byte aligned runs cuBLASLt's
//!   align-1 kernels, 6.8× slower (vocab 50257: 12.96 ms against 1.90 ms for 50264);
//! - sinter's flash attention (T 1024, d 64, causal): forward 62 TFLOP/s (0.063), backward
//!   30 TFLOP/s by the usual 2.5×-forward count, 42 (0.042) by the 3.5× its two kernels do;
//! - the per-launch overhead is what is left: with it the model puts today's GPT-2 step
//!   (B 16, T 1024, bf16) at the measured 177,253 tokens/s (see `sinter bench gpu-model`).
//!
//! The H200 has the H100's SMs and clocks with HBM3e: the same efficiencies, its bandwidth.
//!
//! cuDNN's fused attention (calls keyed `cudnn sdpa …`) is PREDICTED, not measured here: its
//! efficiencies come from public figures (bf16, causal, head dim 64): forward 288 TFLOP/s on an
//! H100 at T 1k (FlashAttention-3 paper, Fig. 5) = 0.29 of 989.4; backward from NVIDIA's H200
//! figures for cuDNN 9.19 at T 2k, 264 bwd against 310 fwd, applied to that forward: 0.29 ·
//! 264 / 310 = 0.25 (the same SMs and clocks as the H100), i.e. 247 TFLOP/s by the 2.5×-forward
//! count, the low end of the published 264–350 TFLOP/s backward figures. The composite
//! fused-attention graph (what cuDNN 9.14, the H200's, runs for causal and backward passes) is
//! matched by cuDNN to the same fused flash-attention engines: its calls carry the same key and
//! are priced at the same rates, one library call each.

use std::collections::BTreeMap;

use super::cost::{Call, GemmDims, GemmMath, OpClass};

/// The datasheet figures of a GPU (dense, no sparsity).
#[derive(Clone, Debug, PartialEq)]
pub struct GpuSpec {
    pub name: &'static str,
    /// HBM bandwidth, bytes/s.
    pub bandwidth: f64,
    /// bf16/fp16 dense tensor-core FLOP/s.
    pub tensor_flops: f64,
    /// TF32 dense tensor-core FLOP/s.
    pub tf32_flops: f64,
    /// fp32 FLOP/s on CUDA cores.
    pub fp32_flops: f64,
    /// Device memory, bytes.
    pub memory: usize,
    pub sm_count: u32,
    pub compute_capability: (u32, u32),
}

impl GpuSpec {
    /// H100 SXM5 80 GB: 3.35 TB/s HBM3, 989.4 bf16 / 494.7 TF32 / 66.9 fp32 TFLOP/s, 132 SMs.
    pub fn h100() -> GpuSpec {
        GpuSpec {
            name: "H100 SXM 80GB",
            bandwidth: 3.35e12,
            tensor_flops: 989.4e12,
            tf32_flops: 494.7e12,
            fp32_flops: 66.9e12,
            memory: 80 << 30,
            sm_count: 132,
            compute_capability: (9, 0),
        }
    }

    /// H200 SXM 141 GB: 4.8 TB/s HBM3e, the H100's compute.
    pub fn h200() -> GpuSpec {
        GpuSpec {
            name: "H200 SXM 141GB",
            bandwidth: 4.8e12,
            memory: 141 << 30,
            ..GpuSpec::h100()
        }
    }

    /// `h100` or `h200`.
    pub fn named(name: &str) -> Option<GpuSpec> {
        match name.to_ascii_lowercase().as_str() {
            "h100" => Some(GpuSpec::h100()),
            "h200" => Some(GpuSpec::h200()),
            _ => None,
        }
    }

    /// The names [`GpuSpec::named`] takes.
    pub const NAMES: &'static str = "h100, h200";
}

/// Fractions of the peaks each class of work reaches, and the per-launch overhead.
#[derive(Clone, Debug, PartialEq)]
pub struct Efficiency {
    pub elementwise: f64,
    pub row: f64,
    pub softmax: f64,
    pub copy: f64,
    pub gemm_ceiling: f64,
    pub gemm_fp32: f64,
    pub gemm_unaligned_slowdown: f64,
    pub attention_fwd: f64,
    pub attention_bwd: f64,
    /// cuDNN fused attention, forward and backward (PREDICTED from public figures).
    pub cudnn_sdpa_fwd: f64,
    pub cudnn_sdpa_bwd: f64,
    /// Tensor-core conv efficiency (cuDNN, not measured: set to the GEMM ceiling's 0.6).
    pub conv: f64,
    /// Host-device copies over PCIe 5 x16, bytes/s.
    pub pcie: f64,
    /// Seconds per launch outside a CUDA graph, and inside one.
    pub launch: f64,
    pub launch_in_graph: f64,
}

impl Default for Efficiency {
    /// The H100 calibration (see the module docs).
    fn default() -> Self {
        Efficiency {
            elementwise: 0.87,
            row: 0.75,
            softmax: 0.53,
            copy: 0.90,
            gemm_ceiling: 0.775,
            gemm_fp32: 0.77,
            gemm_unaligned_slowdown: 6.8,
            attention_fwd: 0.063,
            attention_bwd: 0.042,
            cudnn_sdpa_fwd: 0.29,
            cudnn_sdpa_bwd: 0.25,
            conv: 0.45,
            pcie: 25e9,
            launch: 4.0e-6,
            launch_in_graph: 1.0e-6,
        }
    }
}

/// cuBLASLt's output tile on Hopper for large bf16 problems.
const GEMM_TILE: (usize, usize) = (128, 256);
/// The k-loop's fill and drain, in k elements.
const GEMM_K_FILL: usize = 128;

impl Efficiency {
    /// The fraction of the tensor (or fp32) peak a GEMM reaches: the ceiling, times the wave
    /// quantisation of its output tiles over the SMs, times k / (k + fill).
    pub fn gemm(&self, g: &GemmDims, sms: u32) -> f64 {
        let tiles = g.m.div_ceil(GEMM_TILE.0) * g.n.div_ceil(GEMM_TILE.1) * g.batch;
        let sms = sms.max(1) as usize;
        let waves = tiles.div_ceil(sms).max(1);
        let quant = tiles as f64 / (waves * sms) as f64;
        let fill = g.k as f64 / (g.k + GEMM_K_FILL) as f64;
        let ceiling = if g.math == GemmMath::Fp32 {
            self.gemm_fp32
        } else {
            self.gemm_ceiling
        };
        let e = ceiling * quant * fill;
        if g.aligned {
            e
        } else {
            e / self.gemm_unaligned_slowdown
        }
    }

    /// The bandwidth fraction of a call's memory traffic.
    fn memory(&self, c: &Call) -> f64 {
        match c.class {
            OpClass::Elementwise => self.elementwise,
            OpClass::Row if c.key.starts_with("softmax") => self.softmax,
            OpClass::Row => self.row,
            OpClass::Copy | OpClass::Memset => self.copy,
            // Library and attention kernels stream their operands near the copy rate.
            OpClass::Gemm | OpClass::Attention | OpClass::Conv => self.copy,
            OpClass::HostCopy => 1.0,
        }
    }
}

/// Predicted seconds of one call on `gpu`.
pub fn call_time(c: &Call, gpu: &GpuSpec, e: &Efficiency) -> f64 {
    let t = &c.traffic;
    let bytes = (t.read + t.written) as f64;
    let overhead = if c.in_graph {
        e.launch_in_graph
    } else {
        e.launch
    };
    if c.class == OpClass::HostCopy {
        return t.read as f64 / e.pcie + overhead;
    }
    let mem = bytes / (gpu.bandwidth * e.memory(c));
    let tensor_eff = match (c.class, &c.gemm) {
        (OpClass::Gemm, Some(g)) => e.gemm(g, gpu.sm_count),
        (OpClass::Attention, _) if c.key.starts_with(super::sdpa::KEY_PREFIX) => {
            if c.key.contains("bwd") {
                e.cudnn_sdpa_bwd
            } else {
                e.cudnn_sdpa_fwd
            }
        }
        (OpClass::Attention, _) if c.key.contains("bwd") => e.attention_bwd,
        (OpClass::Attention, _) => e.attention_fwd,
        (OpClass::Conv, _) => e.conv,
        _ => e.gemm_ceiling,
    };
    let tensor_peak = match c.gemm.map(|g| g.math) {
        Some(GemmMath::Tf32) => gpu.tf32_flops,
        _ => gpu.tensor_flops,
    };
    let fp32_eff = match (c.class, &c.gemm) {
        (OpClass::Gemm, Some(g)) => e.gemm(g, gpu.sm_count),
        _ => 0.5,
    };
    let compute = t.tensor_flops as f64 / (tensor_peak * tensor_eff.max(1e-6))
        + t.flops as f64 / (gpu.fp32_flops * fp32_eff.max(1e-6));
    mem.max(compute) + overhead
}

/// One row of the table: every call with one key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    pub key: String,
    pub class: Option<OpClass>,
    pub calls: u64,
    pub bytes: u64,
    pub flops: u64,
    pub tensor_flops: u64,
    pub seconds: f64,
    /// Every call's traffic was declared by its op (none estimated).
    pub declared: bool,
}

/// The prediction for a list of calls.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    pub gpu: GpuSpec,
    /// Rows by predicted time, largest first.
    pub rows: Vec<Row>,
    /// Kernel launches and library calls (memsets and copies included; host copies not).
    pub launches: u64,
    pub bytes: u64,
    pub seconds: f64,
}

/// Predict `calls` on `gpu`.
pub fn predict(calls: &[Call], gpu: &GpuSpec, e: &Efficiency) -> Prediction {
    let mut rows: BTreeMap<&str, Row> = BTreeMap::new();
    for c in calls {
        let r = rows.entry(&c.key).or_insert_with(|| Row {
            key: c.key.clone(),
            class: Some(c.class),
            declared: true,
            ..Row::default()
        });
        r.calls += 1;
        r.bytes += c.traffic.read + c.traffic.written;
        r.flops += c.traffic.flops;
        r.tensor_flops += c.traffic.tensor_flops;
        r.seconds += call_time(c, gpu, e);
        r.declared &= c.declared;
    }
    let mut rows: Vec<Row> = rows.into_values().collect();
    rows.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then(a.key.cmp(&b.key)));
    let device = |r: &&Row| r.class != Some(OpClass::HostCopy);
    Prediction {
        gpu: gpu.clone(),
        launches: rows.iter().filter(device).map(|r| r.calls).sum(),
        bytes: rows.iter().filter(device).map(|r| r.bytes).sum(),
        seconds: rows.iter().map(|r| r.seconds).sum(),
        rows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emulated::cost::Traffic;

    fn gemm(m: usize, n: usize, k: usize, aligned: bool) -> Call {
        Call {
            key: format!("gemm {m}x{n}x{k}"),
            class: OpClass::Gemm,
            traffic: Traffic::bytes(2 * (m * k + k * n), 2 * m * n)
                .with_tensor_flops(2 * m * n * k),
            declared: true,
            in_graph: true,
            gemm: Some(GemmDims {
                m,
                n,
                k,
                batch: 1,
                aligned,
                math: GemmMath::Half,
            }),
        }
    }

    #[test]
    fn gemm_calibration_reproduces_the_measured_h100_figures() {
        let (gpu, e) = (GpuSpec::h100(), Efficiency::default());
        // bf16 4096³: 722.9 TFLOP/s measured.
        let c = gemm(4096, 4096, 4096, true);
        let tf = 2.0 * 4096f64.powi(3) / (call_time(&c, &gpu, &e) - e.launch_in_graph) / 1e12;
        assert!((tf - 722.9).abs() / 722.9 < 0.1, "{tf}");
        // The LM head padded to 50264: 1.90 ms measured; unpadded 50257: 12.96 ms.
        let ms = |c: &Call| call_time(c, &gpu, &e) * 1e3;
        let padded = ms(&gemm(16384, 50264, 768, true));
        let odd = ms(&gemm(16384, 50257, 768, false));
        assert!((padded - 1.90).abs() / 1.90 < 0.2, "{padded}");
        assert!((odd - 12.96).abs() / 12.96 < 0.2, "{odd}");
    }

    #[test]
    fn cudnn_attention_is_priced_at_its_public_figures() {
        use crate::cudnn::sdpa::graph::{SdpaGraph, SdpaLayout, SdpaPass, SdpaProblem};
        let (gpu, e) = (GpuSpec::h100(), Efficiency::default());
        // GPT-2's attention at B 16, T 1024, d 64, causal.
        let p = SdpaProblem {
            b: 16,
            h: 12,
            tq: 1024,
            tk: 1024,
            d: 64,
            dtype: crate::dtype::DType::BF16,
            causal: true,
            scale: 0.125,
        };
        let layout = SdpaLayout::packed(1024, 12, 64);
        let tflops = |pass| {
            let g = SdpaGraph::build(&p, &layout, pass).unwrap();
            let c = super::super::sdpa::sdpa_cost(&g);
            c.traffic.tensor_flops as f64 / (call_time(&c, &gpu, &e) - e.launch) / 1e12
        };
        // Forward 288 TFLOP/s (FA3 paper, H100), backward 0.25 of the peak.
        let fwd = tflops(SdpaPass::Forward);
        assert!((fwd - 288.0).abs() < 3.0, "{fwd}");
        let bwd = tflops(SdpaPass::Backward);
        assert!((bwd - 0.25 * 989.4).abs() < 3.0, "{bwd}");
        // The flash kernel's calibration is untouched: a call not keyed `cudnn sdpa`.
        let flash = Call::new(
            "flash_attention fwd".into(),
            OpClass::Attention,
            Traffic::bytes(0, 0).with_tensor_flops(1 << 40),
        );
        let t = (1u64 << 40) as f64 / (call_time(&flash, &gpu, &e) - e.launch) / 1e12;
        assert!((t - 0.063 * 989.4).abs() < 0.5, "{t}");
    }

    #[test]
    fn memory_bound_calls_scale_with_bandwidth_and_launch_overhead() {
        let e = Efficiency::default();
        let c = Call {
            key: "add_bf16".into(),
            class: OpClass::Elementwise,
            traffic: Traffic::bytes(2 << 30, 1 << 30),
            declared: true,
            in_graph: false,
            gemm: None,
        };
        let t100 = call_time(&c, &GpuSpec::h100(), &e) - e.launch;
        let t200 = call_time(&c, &GpuSpec::h200(), &e) - e.launch;
        assert!((t100 / t200 - 4.8 / 3.35).abs() < 1e-9);
        assert!((t100 - (3u64 << 30) as f64 / (3.35e12 * 0.87)).abs() < 1e-9);
        let p = predict(&[c.clone(), c], &GpuSpec::h100(), &e);
        assert_eq!((p.launches, p.rows.len(), p.rows[0].calls), (2, 1, 2));
        assert_eq!(p.bytes, 2 * (3u64 << 30));
    }
}
