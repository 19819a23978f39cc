//! Analytic scaling model: predicted step time, speedup and efficiency on 1…512 GPUs for data
//! parallel (bucketed ring all-reduce overlapped with backward), ZeRO-1/2, tensor parallel
//! and pipeline parallel, from single-device timings and an α–β interconnect model.
//!
//! Collective costs (α latency, B bus bandwidth, S bytes, n ranks):
//! * within a node a ring phase (reduce-scatter or all-gather) costs (n−1)α + (n−1)/n · S/B;
//!   an all-reduce is two phases, i.e. 2(n−1)α + 2(n−1)/n · S/B (NCCL's "bus bandwidth").
//! * across nodes the phase is hierarchical (what NCCL achieves in effect): a phase among the
//!   group's ranks inside each node, then one among the m nodes on S/(ranks per node) bytes,
//!   with the node's NIC bandwidth shared by all its GPUs.
//!
//! Throughput is compared in samples (micro-batches) per second, so weak scaling (fixed
//! per-replica batch) and strong scaling (fixed global batch) use the same definitions:
//! speedup(N) = throughput(N)/throughput(1), efficiency = speedup/N.

use serde::{Deserialize, Serialize};

use crate::error::{DistError, Result};

/// α–β model of the interconnect. Bandwidths in bytes/s, latencies in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interconnect {
    pub gpus_per_node: usize,
    /// Ring bus bandwidth inside a node (NVLink 4 through NVSwitch: ~370 GB/s measured).
    pub intra_node_bw: f64,
    pub intra_node_latency: f64,
    /// Bandwidth of one network adapter (400 Gb/s InfiniBand = 50 GB/s).
    pub nic_bw: f64,
    /// Adapters per node (1 by default; rail-optimised DGX-class nodes have 8).
    pub nics_per_node: usize,
    pub inter_node_latency: f64,
}

impl Default for Interconnect {
    fn default() -> Self {
        Self::h100_nvlink_ib()
    }
}

/// How the ranks of one group sit on the nodes: `per_node` of them share a node.
fn split_nodes(n: usize, per_node: usize) -> (usize, usize) {
    let rpn = per_node.clamp(1, n.max(1));
    (rpn, n.div_ceil(rpn))
}

impl Interconnect {
    /// 8 GPUs per node on NVLink 4 (~370 GB/s bus bandwidth, α 5 µs), nodes linked by one
    /// 400 Gb/s InfiniBand adapter (50 GB/s, α 10 µs).
    pub fn h100_nvlink_ib() -> Self {
        Interconnect {
            gpus_per_node: 8,
            intra_node_bw: 370e9,
            intra_node_latency: 5e-6,
            nic_bw: 50e9,
            nics_per_node: 1,
            inter_node_latency: 10e-6,
        }
    }

    /// One box of 8 GPUs whose ring runs at `bus_bw` bytes/s (e.g. PCIe), α 10 µs.
    pub fn single_box(bus_bw: f64) -> Self {
        Interconnect {
            gpus_per_node: 8,
            intra_node_bw: bus_bw,
            intra_node_latency: 10e-6,
            nic_bw: bus_bw,
            nics_per_node: 1,
            inter_node_latency: 10e-6,
        }
    }

    /// Per-GPU share of the node's network bandwidth when every GPU drives a ring.
    fn inter_bw_per_gpu(&self) -> f64 {
        let g = self.gpus_per_node.max(1);
        self.nic_bw * self.nics_per_node.min(g) as f64 / g as f64
    }

    /// One ring phase (reduce-scatter of an `bytes` input, or all-gather of an `bytes`
    /// output) among `n` ranks of which `per_node` share each node.
    pub fn ring_phase_time(&self, bytes: f64, n: usize, per_node: usize) -> f64 {
        if n <= 1 {
            return 0.0;
        }
        let (rpn, nodes) = split_nodes(n, per_node);
        let mut t = 0.0;
        if rpn > 1 {
            let r = rpn as f64;
            t += (r - 1.0) * self.intra_node_latency + (r - 1.0) / r * bytes / self.intra_node_bw;
        }
        if nodes > 1 {
            let m = nodes as f64;
            t += (m - 1.0) * self.inter_node_latency
                + (m - 1.0) / m * (bytes / rpn as f64) / self.inter_bw_per_gpu();
        }
        t
    }

    /// Ring all-reduce of `bytes` among `n` ranks packed onto nodes (`gpus_per_node` each).
    pub fn all_reduce_time(&self, bytes: f64, n: usize) -> f64 {
        self.all_reduce_time_placed(bytes, n, self.gpus_per_node)
    }

    /// Ring all-reduce with `per_node` of the group's ranks on each node.
    pub fn all_reduce_time_placed(&self, bytes: f64, n: usize, per_node: usize) -> f64 {
        2.0 * self.ring_phase_time(bytes, n, per_node)
    }

    /// Point-to-point transfer of `bytes` (inside a node or across nodes).
    pub fn p2p_time(&self, bytes: f64, cross_node: bool) -> f64 {
        if cross_node {
            self.inter_node_latency + bytes / self.nic_bw
        } else {
            self.intra_node_latency + bytes / self.intra_node_bw
        }
    }

    /// Bus bandwidth an all-reduce of `bytes` over `n` packed ranks achieves in this model.
    pub fn all_reduce_bus_bw(&self, bytes: f64, n: usize) -> f64 {
        if n <= 1 {
            return f64::INFINITY;
        }
        2.0 * (n as f64 - 1.0) / n as f64 * bytes / self.all_reduce_time(bytes, n)
    }
}

/// How the batch grows with the number of GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum BatchScaling {
    /// Each model replica processes `micro_batches` micro-batches per step (gradient
    /// accumulation), whatever the number of replicas.
    Weak { micro_batches: usize },
    /// The whole step processes `micro_batches` micro-batches, split over the replicas.
    Strong { micro_batches: usize },
}

/// What is trained, measured on one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub name: String,
    /// Parameter count Ψ.
    pub params: f64,
    /// Bytes per gradient element as reduced (4 fp32, 2 bf16).
    pub grad_bytes_per_param: f64,
    /// Bytes per parameter element as gathered by ZeRO (2 for bf16 weights).
    pub param_bytes_per_param: f64,
    /// Forward and backward time of one micro-batch on one device, seconds.
    pub t_forward: f64,
    pub t_backward: f64,
    /// One optimizer step over all parameters on one device, seconds.
    pub t_optimizer: f64,
    /// Transformer-style layers (tensor parallel all-reduces per layer; pipeline stages).
    pub layers: usize,
    /// Bytes of one layer's output activation for one micro-batch (b·s·h·dtype): the size of
    /// each tensor-parallel all-reduce and of each pipeline send.
    pub activation_bytes: f64,
    pub batch: BatchScaling,
}

/// FLOPs per token of a GPT-style transformer for training (forward + backward):
/// 6·N plus attention 12·L·C·T (PaLM appendix B accounting).
pub fn transformer_train_flops_per_token(
    params: f64,
    layers: usize,
    width: usize,
    seq: usize,
) -> f64 {
    6.0 * params + 12.0 * layers as f64 * width as f64 * seq as f64
}

/// H100 SXM dense BF16 peak, FLOP/s.
pub const H100_BF16_PEAK: f64 = 989.4e12;

impl Workload {
    /// GPT-2 124M as trained by llm.c: micro-batch 64×1024 tokens per GPU, 524,288 tokens
    /// (8 micro-batches) per step, bf16. Compute time from [`transformer_train_flops_per_token`]
    /// at `mfu` of an H100's BF16 peak, split 1:2 forward:backward; AdamW ≈ 1 ms (memory bound:
    /// ~28 bytes/param at 3.35 TB/s).
    pub fn gpt2_124m_h100(mfu: f64) -> Self {
        let params = 124_475_904.0; // padded vocabulary 50304, tied embeddings
        let tokens = 64.0 * 1024.0;
        let flops = tokens * transformer_train_flops_per_token(params, 12, 768, 1024);
        let tc = flops / (mfu * H100_BF16_PEAK);
        Workload {
            name: format!(
                "GPT-2 124M, 64×1024 tokens/GPU, 8×64×1024 tokens/step, H100 at {:.0}% MFU",
                mfu * 100.0
            ),
            params,
            grad_bytes_per_param: 2.0,
            param_bytes_per_param: 2.0,
            t_forward: tc / 3.0,
            t_backward: tc * 2.0 / 3.0,
            t_optimizer: 1.0e-3,
            layers: 12,
            activation_bytes: 64.0 * 1024.0 * 768.0 * 2.0,
            batch: BatchScaling::Strong { micro_batches: 8 },
        }
    }

    /// ResNet-50 (25.6 M parameters, fp32 gradients), 64 images per GPU on a V100-class GPU
    /// (~355 images/s: 60 ms forward, 120 ms backward), SGD 2 ms, weak scaling.
    pub fn resnet50_v100() -> Self {
        Workload {
            name: "ResNet-50, 64 images/GPU, fp32, V100-class".into(),
            params: 25.557e6,
            grad_bytes_per_param: 4.0,
            param_bytes_per_param: 4.0,
            t_forward: 0.060,
            t_backward: 0.120,
            t_optimizer: 0.002,
            layers: 50,
            activation_bytes: 64.0 * 56.0 * 56.0 * 256.0 * 4.0,
            batch: BatchScaling::Weak { micro_batches: 1 },
        }
    }

    fn t_compute(&self) -> f64 {
        self.t_forward + self.t_backward
    }

    /// Micro-batches per replica per step with `replicas` data-parallel replicas.
    fn per_replica(&self, replicas: usize) -> f64 {
        match self.batch {
            BatchScaling::Weak { micro_batches } => micro_batches.max(1) as f64,
            BatchScaling::Strong { micro_batches } => micro_batches.max(1) as f64 / replicas as f64,
        }
    }
}

/// Modelling choices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assumptions {
    /// Gradient bucket size (PyTorch DDP default 25 MiB).
    pub bucket_bytes: f64,
    /// 1 = buckets are all-reduced perfectly pipelined behind backward; 0 = all communication
    /// after backward. Values between blend the two.
    pub overlap: f64,
    /// Largest tensor-parallel degree (kept inside a node); the rest is data parallel.
    pub tp_max: usize,
    /// Largest pipeline depth; the rest is data parallel.
    pub pp_max: usize,
}

impl Default for Assumptions {
    fn default() -> Self {
        Assumptions {
            bucket_bytes: 25.0 * 1024.0 * 1024.0,
            overlap: 1.0,
            tp_max: 8,
            pp_max: 8,
        }
    }
}

/// Parallel strategy of one column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Strategy {
    /// Replicated model, bucketed ring all-reduce of gradients overlapped with backward.
    Dp,
    /// Optimizer states sharded: reduce-scatter of gradients (overlapped like DP), optimizer
    /// on 1/N, all-gather of parameters after the step (not overlapped).
    Zero1,
    /// Gradients sharded too: same communication as ZeRO-1, less memory.
    Zero2,
    /// Megatron tensor parallel inside a node (4 all-reduces of the activation per layer per
    /// micro-batch, not overlapped) × data parallel across nodes.
    Tp,
    /// Pipeline (GPipe/1F1B timing, bubble (p−1)/(m+p−1)) × data parallel.
    Pp,
}

impl Strategy {
    pub const ALL: [Strategy; 5] = [
        Strategy::Dp,
        Strategy::Zero1,
        Strategy::Zero2,
        Strategy::Tp,
        Strategy::Pp,
    ];

    pub fn name(&self) -> &'static str {
        match self {
            Strategy::Dp => "dp",
            Strategy::Zero1 => "zero1",
            Strategy::Zero2 => "zero2",
            Strategy::Tp => "tp",
            Strategy::Pp => "pp",
        }
    }
}

/// Model-state bytes per rank for mixed-precision Adam (fp16/bf16 weights and gradients,
/// fp32 master weights, momentum and variance: 2+2+12 = 16 bytes per parameter), ZeRO stage
/// 0: 16Ψ; 1: 4Ψ + 12Ψ/N; 2: 2Ψ + 14Ψ/N; 3: 16Ψ/N.
pub fn zero_bytes_per_rank(params: f64, stage: u8, n: usize) -> f64 {
    let n = n.max(1) as f64;
    let p = params;
    match stage {
        0 => 16.0 * p,
        1 => 4.0 * p + 12.0 * p / n,
        2 => 2.0 * p + 14.0 * p / n,
        _ => 16.0 * p / n,
    }
}

/// Exposed communication time of `buckets` equal buckets, each taking `per_bucket` seconds,
/// that become ready evenly during a backward window of `window` seconds and are sent one
/// after another; `overlap` blends perfect pipelining (1) and no overlap (0).
pub fn bucket_exposure(buckets: usize, per_bucket: f64, window: f64, overlap: f64) -> f64 {
    let serial = buckets as f64 * per_bucket;
    let mut end: f64 = 0.0;
    for i in 1..=buckets {
        let ready = i as f64 * window / buckets as f64;
        end = end.max(ready) + per_bucket;
    }
    let ideal = (end - window).max(0.0);
    let f = overlap.clamp(0.0, 1.0);
    f * ideal + (1.0 - f) * serial
}

/// Prediction for one strategy at one GPU count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Seconds per optimizer step.
    pub step_time: f64,
    /// Micro-batches processed per step (all replicas).
    pub micro_batches: f64,
    pub speedup: f64,
    pub efficiency: f64,
    /// Communication not hidden behind compute, seconds per step.
    pub exposed_comm: f64,
    /// (data parallel, model parallel) degrees.
    pub dp: usize,
    pub mp: usize,
    /// Model-state bytes per rank (mixed-precision Adam).
    pub state_bytes_per_rank: f64,
}

struct Raw {
    step: f64,
    mb: f64,
    exposed: f64,
    dp: usize,
    mp: usize,
    mem: f64,
}

fn n_buckets(bytes: f64, bucket: f64) -> usize {
    if bytes <= 0.0 {
        return 1;
    }
    ((bytes / bucket.max(1.0)).ceil() as usize).max(1)
}

fn raw(s: Strategy, n: usize, w: &Workload, net: &Interconnect, a: &Assumptions) -> Raw {
    let g = net.gpus_per_node.max(1);
    let grad_bytes = w.params * w.grad_bytes_per_param;
    match s {
        Strategy::Dp | Strategy::Zero1 | Strategy::Zero2 => {
            let d = n;
            let k = w.per_replica(d);
            let compute = k * w.t_compute();
            let window = k.min(1.0) * w.t_backward;
            let nb = n_buckets(grad_bytes, a.bucket_bytes);
            let bucket = grad_bytes / nb as f64;
            if s == Strategy::Dp {
                let c = net.all_reduce_time(bucket, d);
                let exposed = bucket_exposure(nb, c, window, a.overlap);
                Raw {
                    step: compute + exposed + w.t_optimizer,
                    mb: d as f64 * k,
                    exposed,
                    dp: d,
                    mp: 1,
                    mem: zero_bytes_per_rank(w.params, 0, d),
                }
            } else {
                let c = net.ring_phase_time(bucket, d, g);
                let rs = bucket_exposure(nb, c, window, a.overlap);
                let ag = net.ring_phase_time(w.params * w.param_bytes_per_param, d, g);
                let stage = if s == Strategy::Zero1 { 1 } else { 2 };
                Raw {
                    step: compute + rs + w.t_optimizer / d as f64 + ag,
                    mb: d as f64 * k,
                    exposed: rs + ag,
                    dp: d,
                    mp: 1,
                    mem: zero_bytes_per_rank(w.params, stage, d),
                }
            }
        }
        Strategy::Tp => {
            let t = n.min(a.tp_max.max(1)).min(g);
            let d = n / t;
            let k = w.per_replica(d);
            let tp_comm =
                4.0 * w.layers as f64 * net.all_reduce_time_placed(w.activation_bytes, t, t);
            let window = k.min(1.0) * w.t_backward / t as f64;
            let shard = grad_bytes / t as f64;
            let nb = n_buckets(shard, a.bucket_bytes);
            // The DP group takes one rank of each TP block: g/t of its ranks per node.
            let c = net.all_reduce_time_placed(shard / nb as f64, d, (g / t).max(1));
            let exposed_dp = bucket_exposure(nb, c, window, a.overlap);
            let step =
                k * (w.t_compute() / t as f64 + tp_comm) + exposed_dp + w.t_optimizer / t as f64;
            Raw {
                step,
                mb: d as f64 * k,
                exposed: k * tp_comm + exposed_dp,
                dp: d,
                mp: t,
                mem: zero_bytes_per_rank(w.params, 0, 1) / t as f64,
            }
        }
        Strategy::Pp => {
            let p = n.min(a.pp_max.max(1)).min(w.layers.max(1));
            let d = n / p;
            let m = w.per_replica(d);
            let cross = p > g;
            let hop = if p > 1 {
                2.0 * net.p2p_time(w.activation_bytes, cross)
            } else {
                0.0
            };
            let slot = w.t_compute() / p as f64 + hop;
            let pipeline = if m >= 1.0 {
                (m + p as f64 - 1.0) * slot
            } else {
                // Less than one micro-batch per pipeline: it still passes every stage.
                p as f64 * (m * w.t_compute() / p as f64 + hop)
            };
            let shard = grad_bytes / p as f64;
            let nb = n_buckets(shard, a.bucket_bytes);
            let per_node = if p >= g { 1 } else { g / p };
            let c = net.all_reduce_time_placed(shard / nb as f64, d, per_node);
            let window = m.min(1.0) * w.t_backward / p as f64;
            let exposed_dp = bucket_exposure(nb, c, window, a.overlap);
            let exposed_pp = if m >= 1.0 {
                (m + p as f64 - 1.0) * hop
            } else {
                p as f64 * hop
            };
            Raw {
                step: pipeline + exposed_dp + w.t_optimizer / p as f64,
                mb: d as f64 * m,
                exposed: exposed_pp + exposed_dp,
                dp: d,
                mp: p,
                mem: zero_bytes_per_rank(w.params, 0, 1) / p as f64,
            }
        }
    }
}

/// Predicted step time, speedup and efficiency of `strategy` on `n` GPUs.
pub fn predict(
    strategy: Strategy,
    n: usize,
    w: &Workload,
    net: &Interconnect,
    a: &Assumptions,
) -> Prediction {
    let n = n.max(1);
    let base = raw(Strategy::Dp, 1, w, net, a);
    let r = raw(strategy, n, w, net, a);
    let speedup = (r.mb / r.step) / (base.mb / base.step);
    Prediction {
        step_time: r.step,
        micro_batches: r.mb,
        speedup,
        efficiency: speedup / n as f64,
        exposed_comm: r.exposed,
        dp: r.dp,
        mp: r.mp,
        state_bytes_per_rank: r.mem,
    }
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScalingRow {
    pub gpus: usize,
    /// In the order of [`ScalingTable::strategies`].
    pub predictions: Vec<Prediction>,
}

/// Predictions for 1, 2, 4, … GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScalingTable {
    pub workload: Workload,
    pub interconnect: Interconnect,
    pub assumptions: Assumptions,
    pub strategies: Vec<Strategy>,
    pub rows: Vec<ScalingRow>,
}

/// The table for GPU counts 1, 2, 4, …, `max_gpus` (powers of two) and all strategies.
pub fn scaling_table(
    w: &Workload,
    net: &Interconnect,
    a: &Assumptions,
    max_gpus: usize,
) -> ScalingTable {
    let mut rows = Vec::new();
    let mut n = 1;
    while n <= max_gpus.max(1) {
        rows.push(ScalingRow {
            gpus: n,
            predictions: Strategy::ALL
                .iter()
                .map(|&s| predict(s, n, w, net, a))
                .collect(),
        });
        n *= 2;
    }
    ScalingTable {
        workload: w.clone(),
        interconnect: net.clone(),
        assumptions: a.clone(),
        strategies: Strategy::ALL.to_vec(),
        rows,
    }
}

fn fmt_time(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.1} ms", s * 1e3)
    }
}

impl ScalingTable {
    /// Plain-text table: one row per GPU count, per strategy step time, speedup, efficiency.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let net = &self.interconnect;
        out.push_str(&format!("{}\n", self.workload.name));
        out.push_str(&format!(
            "interconnect: {} GPUs/node, intra {:.0} GB/s α {:.0} µs, inter {}×{:.0} GB/s α {:.0} µs; buckets {:.0} MiB, overlap {:.2}\n",
            net.gpus_per_node,
            net.intra_node_bw / 1e9,
            net.intra_node_latency * 1e6,
            net.nics_per_node,
            net.nic_bw / 1e9,
            net.inter_node_latency * 1e6,
            self.assumptions.bucket_bytes / (1024.0 * 1024.0),
            self.assumptions.overlap
        ));
        out.push_str(" GPUs");
        for s in &self.strategies {
            out.push_str(&format!(" | {:^26}", s.name()));
        }
        out.push('\n');
        out.push_str("     ");
        for _ in &self.strategies {
            out.push_str(&format!(" | {:>9} {:>8} {:>6}", "step", "speedup", "eff"));
        }
        out.push('\n');
        for row in &self.rows {
            out.push_str(&format!("{:>5}", row.gpus));
            for p in &row.predictions {
                out.push_str(&format!(
                    " | {:>9} {:>7.1}x {:>5.1}%",
                    fmt_time(p.step_time),
                    p.speedup,
                    p.efficiency * 100.0
                ));
            }
            out.push('\n');
        }
        out
    }

    /// The table as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("scaling table serialises")
    }

    /// SVG plot of speedup against GPUs (both axes log2, labelled 1, 2, 4, …) with the ideal
    /// line.
    pub fn to_svg(&self) -> Result<String> {
        use plotters::prelude::*;
        let max_n = self.rows.last().map(|r| r.gpus).unwrap_or(1).max(2) as f64;
        let top = max_n.log2();
        let pow2 = |v: &f64| {
            let x = 2f64.powf(*v);
            if x >= 1.0 {
                format!("{}", x.round() as u64)
            } else {
                format!("{x:.2}")
            }
        };
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (900, 600)).into_drawing_area();
            let err = |e: &dyn std::fmt::Display| DistError::InvalidArgument(format!("plot: {e}"));
            root.fill(&WHITE).map_err(|e| err(&e))?;
            let mut chart = ChartBuilder::on(&root)
                .caption(
                    format!("Predicted speedup: {}", self.workload.name),
                    ("sans-serif", 16),
                )
                .margin(15)
                .x_label_area_size(45)
                .y_label_area_size(60)
                .build_cartesian_2d(0f64..top, -1f64..top + 0.3)
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc("GPUs")
                .y_desc("speedup")
                .x_labels(top as usize + 1)
                .y_labels(top as usize + 3)
                .x_label_formatter(&pow2)
                .y_label_formatter(&pow2)
                .draw()
                .map_err(|e| err(&e))?;
            let lg = |x: f64| x.max(0.5).log2();
            let ideal: Vec<(f64, f64)> = self
                .rows
                .iter()
                .map(|r| (lg(r.gpus as f64), lg(r.gpus as f64)))
                .collect();
            chart
                .draw_series(LineSeries::new(ideal, BLACK.stroke_width(1)))
                .map_err(|e| err(&e))?
                .label("ideal")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
            let colors = [RED, BLUE, GREEN, MAGENTA, CYAN];
            for (i, s) in self.strategies.iter().enumerate() {
                let c = colors[i % colors.len()];
                let pts: Vec<(f64, f64)> = self
                    .rows
                    .iter()
                    .map(|r| (lg(r.gpus as f64), lg(r.predictions[i].speedup)))
                    .collect();
                chart
                    .draw_series(LineSeries::new(pts, c.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(s.name())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(&e))?;
            root.present().map_err(|e| err(&e))?;
        }
        Ok(svg)
    }

    /// Writes [`Self::to_svg`] to `path`.
    pub fn write_svg(&self, path: &std::path::Path) -> Result<()> {
        let svg = self.to_svg()?;
        std::fs::write(path, svg).map_err(|e| DistError::io(format!("write {}", path.display()), e))
    }
}

// ---------------------------------------------------------------------------------------------
// Validation against published figures
// ---------------------------------------------------------------------------------------------

/// One comparison of the model with a published figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub predicted: f64,
    pub published: f64,
    /// |predicted − published| / published.
    pub rel_error: f64,
    pub tolerance: f64,
    pub pass: bool,
    /// The assumptions that produce `predicted`.
    pub assumptions: String,
}

fn check(name: &str, predicted: f64, published: f64, tolerance: f64, assumptions: String) -> Check {
    let rel_error = (predicted - published).abs() / published.abs();
    Check {
        name: name.to_string(),
        predicted,
        published,
        rel_error,
        tolerance,
        pass: rel_error <= tolerance,
        assumptions,
    }
}

/// MFU assumed for llm.c's GPT-2 124M run on H100 (PaLM-style FLOP count incl. attention).
pub const LLMC_MFU: f64 = 0.40;
/// Published: llm.c, GPT-2 124M, 8×H100, ~140 ms per step of 524,288 tokens.
pub const LLMC_STEP_S: f64 = 0.140;
/// Published CNN data-parallel speedups on 2, 4, 8 GPUs in one box.
pub const CNN_PUBLISHED: [(usize, f64); 3] = [(2, 1.7), (4, 3.5), (8, 6.2)];

/// Result of fitting the interconnect assumptions to the published CNN speedups.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CnnFit {
    /// Effective ring bus bandwidth, bytes/s.
    pub bus_bw: f64,
    pub overlap: f64,
    /// Largest relative error over 2/4/8 GPUs.
    pub max_rel_error: f64,
    pub speedups: Vec<(usize, f64)>,
}

/// For each overlap level (0, ¼, ½, ¾, 1), the effective ring bus bandwidth (1–64 GB/s,
/// 2^(1/8) steps) for which the ResNet-50 workload ([`Workload::resnet50_v100`]) best
/// reproduces the published 1.7×/3.5×/6.2× (minimax relative error).
pub fn fit_cnn_published() -> Vec<CnnFit> {
    let w = Workload::resnet50_v100();
    let mut fits = Vec::new();
    for oi in 0..=4 {
        let overlap = oi as f64 / 4.0;
        let a = Assumptions {
            overlap,
            ..Assumptions::default()
        };
        let mut best: Option<CnnFit> = None;
        for bi in 0..=48 {
            let bus_bw = 1e9 * 2f64.powf(bi as f64 / 8.0);
            let net = Interconnect::single_box(bus_bw);
            let speedups: Vec<(usize, f64)> = CNN_PUBLISHED
                .iter()
                .map(|&(n, _)| (n, predict(Strategy::Dp, n, &w, &net, &a).speedup))
                .collect();
            let err = CNN_PUBLISHED
                .iter()
                .zip(&speedups)
                .map(|(&(_, p), &(_, s))| (s - p).abs() / p)
                .fold(0.0, f64::max);
            if best.as_ref().is_none_or(|b| err < b.max_rel_error) {
                best = Some(CnnFit {
                    bus_bw,
                    overlap,
                    max_rel_error: err,
                    speedups,
                });
            }
        }
        fits.extend(best);
    }
    fits
}

/// The fit of [`fit_cnn_published`] with the smallest error.
pub fn best_cnn_fit() -> CnnFit {
    fit_cnn_published()
        .into_iter()
        .min_by(|a, b| a.max_rel_error.total_cmp(&b.max_rel_error))
        .expect("non-empty grid")
}

/// Compares the model with published figures:
/// * llm.c GPT-2 124M on 8×H100: ~140 ms per 524,288-token step, predicted with compute from
///   the FLOP count at [`LLMC_MFU`] (data parallel and ZeRO-1), tolerance 10 %;
/// * CNN speedups 1.7×/3.5×/6.2× on 2/4/8 GPUs with the best-fitting effective bandwidth and
///   overlap from [`best_cnn_fit`], tolerance 6 % each.
pub fn validate() -> Vec<Check> {
    let mut out = Vec::new();
    let w = Workload::gpt2_124m_h100(LLMC_MFU);
    let net = Interconnect::h100_nvlink_ib();
    let a = Assumptions::default();
    let desc = format!(
        "compute {:.1} ms/micro-batch from (6N+12LCT)·65536 FLOP at {:.0}% of {:.0} TFLOP/s; NVLink {:.0} GB/s; bf16 grads; buckets 25 MiB overlapped",
        (w.t_forward + w.t_backward) * 1e3,
        LLMC_MFU * 100.0,
        H100_BF16_PEAK / 1e12,
        net.intra_node_bw / 1e9
    );
    for s in [Strategy::Dp, Strategy::Zero1] {
        let p = predict(s, 8, &w, &net, &a);
        out.push(check(
            &format!("llm.c GPT-2 124M step time on 8×H100 ({}), s", s.name()),
            p.step_time,
            LLMC_STEP_S,
            0.10,
            desc.clone(),
        ));
    }
    let fit = best_cnn_fit();
    for (&(n, published), &(_, s)) in CNN_PUBLISHED.iter().zip(&fit.speedups) {
        out.push(check(
            &format!("CNN data-parallel speedup on {n} GPUs"),
            s,
            published,
            0.06,
            format!(
                "ResNet-50 fp32 on V100-class GPUs, effective ring bus bandwidth {:.1} GB/s, overlap {:.2}",
                fit.bus_bw / 1e9,
                fit.overlap
            ),
        ));
    }
    out
}
