//! Host all-reduce bandwidth measurement (used by the CLI's bench command).

use std::time::{Duration, Instant};

use crate::comm::{Communicator, ReduceOp};
use crate::error::{DistError, Result};
use crate::host::{run_on_threads, tcp, TcpOptions};
use crate::store::StoreServer;

/// Transport the benchmark runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum BenchTransport {
    /// Ranks are threads exchanging through shared memory.
    Threads,
    /// Ranks are threads connected over TCP on 127.0.0.1.
    TcpLoopback,
}

/// Result of [`bench_host_all_reduce`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AllReduceBench {
    pub transport: BenchTransport,
    pub ranks: usize,
    /// Buffer size per rank.
    pub bytes: usize,
    pub iters: usize,
    /// Mean seconds per all-reduce.
    pub seconds: f64,
    /// bytes / time, GB/s.
    pub algbw_gbs: f64,
    /// 2(n−1)/n · bytes / time, GB/s (comparable across rank counts, as in nccl-tests).
    pub busbw_gbs: f64,
    /// Single-thread memcpy of `bytes`, GB/s: the ceiling for a host transport.
    pub memcpy_gbs: f64,
}

impl std::fmt::Display for AllReduceBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "all_reduce {:?} ranks={} size={} B: {:.3} ms, algbw {:.2} GB/s, busbw {:.2} GB/s (memcpy {:.2} GB/s)",
            self.transport,
            self.ranks,
            self.bytes,
            self.seconds * 1e3,
            self.algbw_gbs,
            self.busbw_gbs,
            self.memcpy_gbs
        )
    }
}

/// GB/s of copying a `bytes` buffer, best of `iters`.
pub fn memcpy_gbs(bytes: usize, iters: usize) -> f64 {
    let src = vec![1u8; bytes.max(1)];
    let mut dst = vec![0u8; bytes.max(1)];
    let mut best = f64::INFINITY;
    for _ in 0..iters.max(1) {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    bytes as f64 / best.max(1e-9) / 1e9
}

fn timed_loop<C: Communicator>(c: &mut C, floats: usize, iters: usize) -> Result<f64> {
    let mut buf = vec![1.0f32; floats];
    c.all_reduce(&mut buf, ReduceOp::Sum)?; // warm-up
    c.barrier()?;
    let t = Instant::now();
    for _ in 0..iters {
        c.all_reduce(&mut buf, ReduceOp::Sum)?;
    }
    c.barrier()?;
    Ok(t.elapsed().as_secs_f64())
}

/// Measures the ring all-reduce of a `bytes`-sized f32 buffer among `ranks` local ranks
/// (`iters` timed iterations after one warm-up), beside a memcpy ceiling.
pub fn bench_host_all_reduce(
    transport: BenchTransport,
    ranks: usize,
    bytes: usize,
    iters: usize,
) -> Result<AllReduceBench> {
    if ranks == 0 || iters == 0 {
        return Err(DistError::InvalidArgument(
            "ranks and iters must be at least 1".into(),
        ));
    }
    let floats = (bytes / 4).max(1);
    let timeout = Duration::from_secs(120);
    let times: Vec<Result<f64>> = match transport {
        BenchTransport::Threads => {
            run_on_threads(ranks, timeout, |mut c| timed_loop(&mut c, floats, iters))
        }
        BenchTransport::TcpLoopback => {
            let server = StoreServer::bind("127.0.0.1:0")?;
            let addr = server.local_addr().to_string();
            let opts = TcpOptions::with_timeout(timeout);
            std::thread::scope(|s| {
                let hs: Vec<_> = (0..ranks)
                    .map(|r| {
                        let (addr, opts) = (addr.clone(), opts.clone());
                        s.spawn(move || {
                            let mut c = tcp::connect(r, ranks, &addr, &opts)?;
                            timed_loop(&mut c, floats, iters)
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                    .collect()
            })
        }
    };
    let mut worst: f64 = 0.0;
    for t in times {
        worst = worst.max(t?);
    }
    let seconds = worst / iters as f64;
    let b = (floats * 4) as f64;
    let n = ranks as f64;
    Ok(AllReduceBench {
        transport,
        ranks,
        bytes: floats * 4,
        iters,
        seconds,
        algbw_gbs: b / seconds / 1e9,
        busbw_gbs: 2.0 * (n - 1.0) / n * b / seconds / 1e9,
        memcpy_gbs: memcpy_gbs(floats * 4, 5),
    })
}
