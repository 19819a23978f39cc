#![allow(clippy::needless_range_loop)]
//! TCP backend on 127.0.0.1: collectives among threads, rendezvous through the store,
//! timeouts and lost peers, and real child processes started by the launcher.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sinter_dist::host::tcp;
use sinter_dist::launch::{self, LaunchOptions, LaunchSpec, Output};
use sinter_dist::rendezvous::{self, DistEnv, EnvSource};
use sinter_dist::{Communicator, DistError, HostCommunicator, ReduceOp, StoreServer, TcpOptions};

fn val(r: usize, i: usize) -> f32 {
    (((r * 7919 + i * 104_729) % 2003) as f32 - 1001.0) / 997.0
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `f` on `n` TCP-connected ranks (threads) through a fresh store.
fn on_tcp_ranks<R: Send>(
    n: usize,
    timeout: Duration,
    f: impl Fn(HostCommunicator) -> R + Sync,
) -> Vec<R> {
    let server = StoreServer::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().to_string();
    let opts = TcpOptions::with_timeout(timeout);
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (addr, opts) = (addr.clone(), opts.clone());
                s.spawn(move || f(tcp::connect(r, n, &addr, &opts).unwrap()))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn tcp_four_ranks_all_collectives() {
    let n = 4;
    let results = on_tcp_ranks(n, Duration::from_secs(20), |mut c| {
        assert_eq!(c.backend(), "tcp");
        let r = c.rank();
        let mut out = Vec::new();
        // Odd, tiny and large (frames above the small-frame path) lengths.
        for len in [1usize, 3, 1001, 70_001] {
            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                let mut b: Vec<f32> = (0..len).map(|i| val(r, i)).collect();
                c.all_reduce(&mut b, op).unwrap();
                out.push(b);
            }
        }
        let input: Vec<f32> = (0..n * 5).map(|i| val(r, i)).collect();
        let mut rs = vec![0.0; 5];
        c.reduce_scatter(&input, &mut rs, ReduceOp::Sum).unwrap();
        out.push(rs);
        let mut ag = vec![0.0; n * 3];
        c.all_gather(&[r as f32; 3], &mut ag).unwrap();
        out.push(ag);
        let mut bc: Vec<f32> = (0..50_000).map(|i| val(r, i)).collect();
        c.broadcast(&mut bc, 3).unwrap();
        out.push(bc);
        c.send(&[r as f32; 2], (r + 1) % n).unwrap();
        let mut p = [0.0; 2];
        c.recv(&mut p, (r + n - 1) % n).unwrap();
        out.push(p.to_vec());
        let mut g = c.new_group(&[1, 3]).ok();
        if let Some(g) = g.as_mut() {
            let mut x = [r as f32];
            g.all_reduce(&mut x, ReduceOp::Sum).unwrap();
            out.push(x.to_vec());
        }
        c.barrier().unwrap();
        out
    });
    // all-reduce results: serial sum within tolerance, bit-identical across ranks.
    let mut k = 0;
    for len in [1usize, 3, 1001, 70_001] {
        for op in [ReduceOp::Sum, ReduceOp::Avg] {
            for i in 0..len {
                let mut want: f64 = (0..n).map(|r| val(r, i) as f64).sum();
                if op == ReduceOp::Avg {
                    want /= n as f64;
                }
                let got = results[0][k][i] as f64;
                assert!(
                    (got - want).abs() < 1e-5 * (1.0 + want.abs()),
                    "len {len} {op:?} [{i}]: {got} vs {want}"
                );
            }
            for r in 1..n {
                assert!(
                    results[r][k]
                        .iter()
                        .zip(&results[0][k])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "rank {r} not bit-identical (len {len})"
                );
            }
            k += 1;
        }
    }
    for r in 0..n {
        let rs = &results[r][k];
        for j in 0..5 {
            let want: f32 = (0..n).map(|q| val(q, r * 5 + j)).sum();
            assert!((rs[j] - want).abs() < 1e-5, "reduce_scatter rank {r}");
        }
        assert_eq!(
            results[r][k + 1],
            vec![0., 0., 0., 1., 1., 1., 2., 2., 2., 3., 3., 3.]
        );
        let want_bc: Vec<f32> = (0..50_000).map(|i| val(3, i)).collect();
        assert!(results[r][k + 2] == want_bc, "broadcast rank {r}");
        assert_eq!(results[r][k + 3], vec![((r + n - 1) % n) as f32; 2]);
        if r % 2 == 1 {
            assert_eq!(results[r][k + 4], vec![4.0]);
        }
    }
}

#[test]
fn init_from_dist_env_with_rank0_store_and_store_access() {
    let port = free_port();
    let world = 3;
    let results: Vec<Vec<u8>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|rank| {
                s.spawn(move || {
                    let env = DistEnv {
                        rank,
                        world_size: world,
                        local_rank: rank,
                        local_world_size: world,
                        master_addr: Some("127.0.0.1".into()),
                        master_port: port,
                        source: EnvSource::Torchrun,
                    };
                    let mut c =
                        rendezvous::init(&env, &TcpOptions::with_timeout(Duration::from_secs(20)))
                            .unwrap();
                    let mut b = [rank as f32 + 1.0; 3];
                    c.all_reduce(&mut b, ReduceOp::Sum).unwrap();
                    assert_eq!(b, [6.0; 3]);
                    // The store stays usable, e.g. to pass an NCCL unique id from rank 0.
                    let store = c.store().unwrap();
                    if rank == 0 {
                        store.set("nccl/uid", b"0123456789abcdef").unwrap();
                    }
                    let v = store
                        .wait("nccl/uid", Duration::from_secs(10))
                        .unwrap()
                        .unwrap();
                    c.barrier().unwrap();
                    v
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(results.iter().all(|v| v == b"0123456789abcdef"));
}

#[test]
fn world_size_one_needs_no_master() {
    let env = rendezvous::parse_env(&Default::default()).unwrap();
    assert_eq!(env.world_size, 1);
    let mut c = rendezvous::init(&env, &TcpOptions::default()).unwrap();
    let mut b = [2.0f32, 3.0];
    c.all_reduce(&mut b, ReduceOp::Avg).unwrap();
    c.barrier().unwrap();
    assert_eq!(b, [2.0, 3.0]);
    assert_eq!((c.rank(), c.world_size()), (0, 1));
}

#[test]
fn rendezvous_peer_that_never_shows_up() {
    // Rank 0 of a 2-rank job; rank 1 never starts.
    let env = DistEnv {
        rank: 0,
        world_size: 2,
        local_rank: 0,
        local_world_size: 2,
        master_addr: Some("127.0.0.1".into()),
        master_port: free_port(),
        source: EnvSource::Torchrun,
    };
    let t = Instant::now();
    let e =
        rendezvous::init(&env, &TcpOptions::with_timeout(Duration::from_millis(500))).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(
        e.to_string(),
        "rendezvous #1 on rank 0 timed out after 0.5 s waiting for rank 1"
    );

    // Rank 2 of 3 where ranks 0 and 1 never register: it names the first missing rank.
    let server = StoreServer::bind("127.0.0.1:0").unwrap();
    let e = tcp::connect(
        2,
        3,
        &server.local_addr().to_string(),
        &TcpOptions::with_timeout(Duration::from_millis(300)),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "rendezvous #1 on rank 2 timed out after 0.3 s waiting for rank 0"
    );

    // No store at all.
    let e = tcp::connect(
        1,
        2,
        &format!("127.0.0.1:{}", free_port()),
        &TcpOptions::with_timeout(Duration::from_millis(300)),
    )
    .unwrap_err();
    assert!(matches!(e, DistError::Store(_)), "{e}");
}

#[test]
fn tcp_collective_timeout_and_disconnect() {
    let server = StoreServer::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().to_string();
    let opts = TcpOptions {
        timeout: Duration::from_millis(300),
        connect_timeout: Duration::from_secs(10),
        bind_ip: None,
    };
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (a2, o2) = (addr.clone(), opts.clone());
    let h = std::thread::spawn(move || {
        let c1 = tcp::connect(1, 2, &a2, &o2).unwrap();
        rx.recv().unwrap(); // stay connected but silent until told
        drop(c1); // then disconnect
    });
    let mut c0 = tcp::connect(0, 2, &addr, &opts).unwrap();
    let mut b = [1.0f32; 16];
    c0.all_reduce(&mut b, ReduceOp::Sum).unwrap_err(); // #1 times out
    let e = c0.all_reduce(&mut b, ReduceOp::Sum).unwrap_err();
    assert_eq!(
        e.to_string(),
        "all_reduce #2 on rank 0 timed out after 0.3 s waiting for rank 1"
    );

    // Now the peer disconnects: fail fast, long before a (raised) timeout.
    c0.set_timeout(Duration::from_secs(30));
    tx.send(()).unwrap();
    h.join().unwrap();
    let t = Instant::now();
    let e = c0.all_reduce(&mut b, ReduceOp::Sum).unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert!(matches!(e, DistError::PeerLost { peer: 1, .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.starts_with("all_reduce #3 on rank 0 failed: connection to rank 1 lost"),
        "{msg}"
    );
}

/// Entry point of the child processes of `launcher_starts_tcp_ranks_as_processes` (a no-op
/// in a normal test run).
#[test]
fn tcp_child_entry() {
    if std::env::var("SINTER_DIST_TEST_CHILD").as_deref() != Ok("tcp") {
        return;
    }
    let mut c = sinter_dist::init_from_env().unwrap();
    let env = rendezvous::from_env().unwrap();
    assert_eq!(c.rank(), env.rank);
    let n = c.world_size();
    let mut b = vec![c.rank() as f32 + 1.0; 1000];
    c.all_reduce(&mut b, ReduceOp::Sum).unwrap();
    let want = (n * (n + 1) / 2) as f32;
    assert!(b.iter().all(|&x| x == want));
    let mut ag = vec![0.0; n];
    c.all_gather(&[c.rank() as f32], &mut ag).unwrap();
    c.barrier().unwrap();
    println!(
        "child rank {} of {} ok: sum {} gather {:?}",
        c.rank(),
        n,
        b[0],
        ag
    );
}

#[test]
fn launcher_starts_tcp_ranks_as_processes() {
    let exe = std::env::current_exe().unwrap();
    let spec = LaunchSpec {
        nproc_per_node: 3,
        nnodes: 1,
        node_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: free_port(),
        program: exe.to_string_lossy().into_owned(),
        args: [
            "tcp_child_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ]
        .map(String::from)
        .to_vec(),
        cpu_threads: None,
    };
    let lines = Arc::new(Mutex::new(Vec::new()));
    let opts = LaunchOptions {
        grace_period: Duration::from_secs(2),
        forward_signals: false,
        output: Output::Capture(lines.clone()),
        extra_env: vec![
            ("SINTER_DIST_TEST_CHILD".into(), "tcp".into()),
            ("SINTER_COLLECTIVE_TIMEOUT_S".into(), "20".into()),
        ],
        cancel: None,
    };
    let report = launch::run_with(&spec, &opts);
    let lines = lines.lock().unwrap().clone();
    let report = report.unwrap_or_else(|e| panic!("{e}\n{}", lines.join("\n")));
    assert_eq!(report.ranks.len(), 3);
    for r in 0..3 {
        // libtest prints `test tcp_child_entry ... ` before the child's own line.
        let want = format!("child rank {r} of 3 ok: sum 6 gather [0.0, 1.0, 2.0]");
        let prefix = format!("[rank {r}] ");
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&prefix) && l.ends_with(&want)),
            "missing `{prefix}…{want}` in\n{}",
            lines.join("\n")
        );
    }
}
