//! Scaling model: α–β formulas, overlap, pipeline bubble, validation against published
//! figures, ZeRO memory; and the host bandwidth bench.

use sinter_dist::bench::{bench_host_all_reduce, BenchTransport};
use sinter_dist::scaling::*;

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs().max(1e-300)
}

#[test]
fn validation_against_published_figures_passes() {
    let checks = validate();
    assert_eq!(checks.len(), 5);
    for c in &checks {
        assert!(
            c.pass,
            "{} predicted {:.4} vs published {:.4} ({:.1}% > {:.0}%) under {}",
            c.name,
            c.predicted,
            c.published,
            c.rel_error * 100.0,
            c.tolerance * 100.0,
            c.assumptions
        );
    }
    // llm.c: 8×H100 at ~140 ms/step; data parallel is almost perfectly efficient there.
    let w = Workload::gpt2_124m_h100(LLMC_MFU);
    let p = predict(
        Strategy::Dp,
        8,
        &w,
        &Interconnect::default(),
        &Assumptions::default(),
    );
    assert!(close(p.step_time, LLMC_STEP_S, 0.10), "{}", p.step_time);
    assert!(p.efficiency > 0.95, "{}", p.efficiency);
    // A wrong compute assumption must fail the check: at 20 % MFU the step doubles.
    let slow = predict(
        Strategy::Dp,
        8,
        &Workload::gpt2_124m_h100(0.20),
        &Interconnect::default(),
        &Assumptions::default(),
    );
    assert!(!close(slow.step_time, LLMC_STEP_S, 0.10));
}

#[test]
fn cnn_speedups_need_pcie_class_bandwidth() {
    let fits = fit_cnn_published();
    assert_eq!(fits.len(), 5);
    for f in &fits {
        // Whatever the overlap, 1.7×/3.5×/6.2× are reproduced within ~6 % …
        assert!(f.max_rel_error <= 0.065, "{f:?}");
        // … and only with a slow (PCIe / host-staged) effective bandwidth.
        assert!(f.bus_bw < 8e9, "{f:?}");
    }
    // More overlap is compensated by less bandwidth.
    assert!(fits.windows(2).all(|w| w[1].bus_bw <= w[0].bus_bw));
    let best = best_cnn_fit();
    assert!(best.max_rel_error <= 0.06);
    // With NVLink-class bandwidth the same workload would scale almost linearly.
    let w = Workload::resnet50_v100();
    let nv = predict(
        Strategy::Dp,
        8,
        &w,
        &Interconnect::single_box(370e9),
        &Assumptions::default(),
    );
    assert!(nv.speedup > 7.8, "{}", nv.speedup);
}

#[test]
fn alpha_beta_ring_formulas() {
    let net = Interconnect::h100_nvlink_ib();
    let s = 100e6;
    for n in [2usize, 4, 8] {
        let nf = n as f64;
        let want = 2.0 * (nf - 1.0) * 5e-6 + 2.0 * (nf - 1.0) / nf * s / 370e9;
        assert!(close(net.all_reduce_time(s, n), want, 1e-12), "n={n}");
        assert!(close(net.ring_phase_time(s, n, 8) * 2.0, want, 1e-12));
    }
    assert_eq!(net.all_reduce_time(s, 1), 0.0);
    // Large messages reach the bus bandwidth inside a node.
    assert!(close(net.all_reduce_bus_bw(1e12, 8), 370e9, 1e-3));
    // 16 GPUs = 2 nodes: intra phase among 8, then inter phase among 2 nodes on S/8 bytes,
    // each GPU getting 1/8 of the node's 50 GB/s adapter.
    let intra = 7.0 * 5e-6 + 7.0 / 8.0 * s / 370e9;
    let inter = 1.0 * 10e-6 + 0.5 * (s / 8.0) / (50e9 / 8.0);
    assert!(close(
        net.all_reduce_time(s, 16),
        2.0 * (intra + inter),
        1e-12
    ));
    // Crossing nodes is slower, and more nodes cost more.
    assert!(net.all_reduce_time(s, 16) > net.all_reduce_time(s, 8));
    assert!(net.all_reduce_time(s, 512) > net.all_reduce_time(s, 16));
    // Eight adapters per node make the network 8× faster per GPU.
    let rail = Interconnect {
        nics_per_node: 8,
        ..net.clone()
    };
    let inter8 = 1.0 * 10e-6 + 0.5 * (s / 8.0) / 50e9;
    assert!(close(
        rail.all_reduce_time(s, 16),
        2.0 * (intra + inter8),
        1e-12
    ));
    assert!(close(net.p2p_time(1e9, false), 5e-6 + 1e9 / 370e9, 1e-12));
    assert!(close(net.p2p_time(1e9, true), 10e-6 + 1e9 / 50e9, 1e-12));
}

#[test]
fn bucket_overlap_model() {
    // Cheap buckets during a long backward: only the last bucket is exposed.
    assert!(close(bucket_exposure(10, 1.0, 100.0, 1.0), 1.0, 1e-12));
    // No overlap: everything is exposed.
    assert!(close(bucket_exposure(10, 1.0, 100.0, 0.0), 10.0, 1e-12));
    // Communication-bound: exposure = first bucket's ready time + all buckets − window.
    assert!(close(
        bucket_exposure(10, 20.0, 100.0, 1.0),
        10.0 + 200.0 - 100.0,
        1e-12
    ));
    // Half overlap blends.
    assert!(close(bucket_exposure(10, 1.0, 100.0, 0.5), 5.5, 1e-12));
}

fn ideal_net() -> Interconnect {
    Interconnect {
        gpus_per_node: 8,
        intra_node_bw: 1e30,
        intra_node_latency: 0.0,
        nic_bw: 1e30,
        nics_per_node: 8,
        inter_node_latency: 0.0,
    }
}

fn toy(batch: BatchScaling) -> Workload {
    Workload {
        name: "toy".into(),
        params: 1e9,
        grad_bytes_per_param: 2.0,
        param_bytes_per_param: 2.0,
        t_forward: 1.0,
        t_backward: 2.0,
        t_optimizer: 0.0,
        layers: 64,
        activation_bytes: 1e8,
        batch,
    }
}

#[test]
fn pipeline_bubble_and_ideal_limits() {
    let a = Assumptions::default();
    let net = ideal_net();
    // p = 4 stages, m = 8 micro-batches: efficiency m/(m+p−1) = 1 − bubble (p−1)/(m+p−1).
    let w = toy(BatchScaling::Weak { micro_batches: 8 });
    let p = predict(Strategy::Pp, 4, &w, &net, &a);
    assert!(close(p.efficiency, 8.0 / 11.0, 1e-9), "{}", p.efficiency);
    assert!(close(p.step_time, 11.0 * 3.0 / 4.0, 1e-9));
    assert_eq!((p.dp, p.mp), (1, 4));
    // Beyond pp_max the rest is data parallel: 64 GPUs = 8 stages × 8 replicas.
    let p = predict(Strategy::Pp, 64, &w, &net, &a);
    assert_eq!((p.dp, p.mp), (8, 8));
    assert!(close(p.efficiency, 8.0 / 15.0, 1e-9));
    // With a free network, DP, ZeRO and TP scale perfectly, weak or strong.
    for batch in [
        BatchScaling::Weak { micro_batches: 1 },
        BatchScaling::Strong { micro_batches: 512 },
    ] {
        let w = toy(batch);
        for s in [Strategy::Dp, Strategy::Zero1, Strategy::Zero2, Strategy::Tp] {
            for n in [1usize, 2, 8, 64, 512] {
                let p = predict(s, n, &w, &net, &a);
                assert!(
                    close(p.speedup, n as f64, 1e-9),
                    "{s:?} n={n} {batch:?}: {}",
                    p.speedup
                );
            }
        }
    }
    // Speedup at one GPU is 1 for every strategy.
    let w = Workload::gpt2_124m_h100(0.4);
    for s in Strategy::ALL {
        assert!(close(
            predict(s, 1, &w, &Interconnect::default(), &a).speedup,
            1.0,
            1e-12
        ));
    }
}

#[test]
fn tensor_parallel_pays_per_layer_all_reduces() {
    let a = Assumptions::default();
    let net = Interconnect::h100_nvlink_ib();
    let w = toy(BatchScaling::Weak { micro_batches: 1 });
    let p = predict(Strategy::Tp, 8, &w, &net, &a);
    let comm = 4.0 * 64.0 * net.all_reduce_time(1e8, 8);
    // No data parallel at 8 GPUs; the optimizer is free in the toy.
    assert!(
        close(p.step_time, 3.0 / 8.0 + comm, 1e-9),
        "{} vs {}",
        p.step_time,
        3.0 / 8.0 + comm
    );
    assert_eq!((p.dp, p.mp), (1, 8));
}

#[test]
fn zero_memory_formulas() {
    let psi = 7.5e9;
    // ZeRO paper, 7.5B parameters on 64 GPUs: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
    assert_eq!(zero_bytes_per_rank(psi, 0, 64), 16.0 * psi);
    assert!(close(
        zero_bytes_per_rank(psi, 1, 64),
        4.0 * psi + 12.0 * psi / 64.0,
        1e-15
    ));
    assert!(close(
        zero_bytes_per_rank(psi, 2, 64),
        2.0 * psi + 14.0 * psi / 64.0,
        1e-15
    ));
    assert!(close(
        zero_bytes_per_rank(psi, 3, 64),
        16.0 * psi / 64.0,
        1e-15
    ));
    assert!(close(
        zero_bytes_per_rank(psi, 1, 64) / 1e9,
        31.40625,
        1e-12
    ));
    assert!(close(
        zero_bytes_per_rank(psi, 2, 64) / 1e9,
        16.640625,
        1e-12
    ));
    // One rank: every stage holds everything.
    for st in 0..=3 {
        assert_eq!(zero_bytes_per_rank(psi, st, 1), 16.0 * psi);
    }
    let w = Workload::gpt2_124m_h100(0.4);
    let p = predict(
        Strategy::Zero2,
        8,
        &w,
        &Interconnect::default(),
        &Assumptions::default(),
    );
    assert!(close(
        p.state_bytes_per_rank,
        zero_bytes_per_rank(w.params, 2, 8),
        1e-12
    ));
}

#[test]
fn table_text_json_svg() {
    let w = Workload::gpt2_124m_h100(0.4);
    let t = scaling_table(&w, &Interconnect::default(), &Assumptions::default(), 512);
    assert_eq!(
        t.rows.iter().map(|r| r.gpus).collect::<Vec<_>>(),
        vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    );
    let text = t.to_text();
    assert_eq!(text.lines().count(), 4 + 10);
    assert!(text.contains("dp") && text.contains("zero1") && text.contains("pp"));
    assert!(text.lines().any(|l| l.trim_start().starts_with("512 |")));
    let back: ScalingTable = serde_json::from_str(&t.to_json()).unwrap();
    assert_eq!(back.rows.len(), 10);
    assert!(close(
        back.rows[3].predictions[0].step_time,
        t.rows[3].predictions[0].step_time,
        1e-12
    ));
    let svg = t.to_svg().unwrap();
    assert!(
        svg.starts_with("<svg")
            && svg.contains("ideal")
            && svg.contains("zero1")
            && svg.contains("<polyline"),
        "{}",
        &svg[..200.min(svg.len())]
    );
    let path = std::env::temp_dir().join(format!("sinter-scaling-{}.svg", std::process::id()));
    t.write_svg(&path).unwrap();
    assert!(std::fs::metadata(&path).unwrap().len() > 1000);
    let _ = std::fs::remove_file(path);
}

#[test]
fn host_all_reduce_bench_reports_bandwidth() {
    for (tr, ranks) in [
        (BenchTransport::Threads, 4),
        (BenchTransport::TcpLoopback, 2),
    ] {
        let b = bench_host_all_reduce(tr, ranks, 1 << 20, 3).unwrap();
        assert_eq!((b.ranks, b.bytes), (ranks, 1 << 20));
        assert!(
            b.seconds > 0.0 && b.algbw_gbs > 0.0 && b.memcpy_gbs > 0.0,
            "{b}"
        );
        let n = ranks as f64;
        assert!(close(b.busbw_gbs, b.algbw_gbs * 2.0 * (n - 1.0) / n, 1e-9));
    }
    assert!(bench_host_all_reduce(BenchTransport::Threads, 0, 16, 1).is_err());
}

/// Prints host bandwidth and the model's tables (`cargo test -p sinter-dist --test
/// scaling_model -- --ignored --nocapture`).
#[test]
#[ignore]
fn print_bench_and_tables() {
    for (tr, ranks) in [
        (BenchTransport::Threads, 2),
        (BenchTransport::Threads, 4),
        (BenchTransport::TcpLoopback, 2),
        (BenchTransport::TcpLoopback, 4),
    ] {
        println!("{}", bench_host_all_reduce(tr, ranks, 64 << 20, 5).unwrap());
    }
    for c in validate() {
        println!(
            "{} : predicted {:.4}, published {:.4}, error {:.1}% — {}",
            c.name,
            c.predicted,
            c.published,
            c.rel_error * 100.0,
            c.assumptions
        );
    }
    for f in fit_cnn_published() {
        println!(
            "CNN fit: overlap {:.2}, bus {:.2} GB/s, max error {:.1}%, {:?}",
            f.overlap,
            f.bus_bw / 1e9,
            f.max_rel_error * 100.0,
            f.speedups
        );
    }
    let w = Workload::gpt2_124m_h100(LLMC_MFU);
    println!(
        "{}",
        scaling_table(&w, &Interconnect::default(), &Assumptions::default(), 512).to_text()
    );
}
