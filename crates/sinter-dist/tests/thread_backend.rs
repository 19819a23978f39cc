//! Thread backend: collectives, sub-groups, async wrapper, timeouts.

use std::time::{Duration, Instant};

use sinter_dist::{
    mesh_2d, mesh_2d_groups, run_on_threads, AsyncCommunicator, Communicator, DistError, ReduceOp,
    ThreadGroup,
};

const T: Duration = Duration::from_secs(20);

/// Deterministic pseudo-random value of rank `r`, element `i` in [-1, 1).
fn val(r: usize, i: usize) -> f32 {
    let mut x = (r as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (i as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 29;
    ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

fn serial_sum(n: usize, len: usize) -> Vec<f64> {
    (0..len)
        .map(|i| (0..n).map(|r| val(r, i) as f64).sum())
        .collect()
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

const LENS: [usize; 9] = [0, 1, 2, 3, 5, 7, 64, 1001, 40_003];

#[test]
fn all_reduce_sum_and_avg_match_serial_and_are_bit_identical() {
    for n in [2, 3, 4] {
        for &len in &LENS {
            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                let results = run_on_threads(n, T, |mut c| {
                    let r = c.rank();
                    let mut buf: Vec<f32> = (0..len).map(|i| val(r, i)).collect();
                    c.all_reduce(&mut buf, op).unwrap();
                    buf
                });
                let mut want = serial_sum(n, len);
                if op == ReduceOp::Avg {
                    want.iter_mut().for_each(|x| *x /= n as f64);
                }
                assert_close(&results[0], &want, &format!("n={n} len={len} {op:?}"));
                for r in 1..n {
                    let same = results[r]
                        .iter()
                        .zip(&results[0])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "n={n} len={len} {op:?}: rank {r} differs bitwise from rank 0"
                    );
                }
            }
        }
    }
}

#[test]
fn all_reduce_integers_exact() {
    // Small integers are exact in f32: the ring must produce exactly the serial sum.
    let results = run_on_threads(4, T, |mut c| {
        let r = c.rank() as f32;
        let mut buf: Vec<f32> = (0..13).map(|i| r * 100.0 + i as f32).collect();
        c.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        buf
    });
    let want: Vec<f32> = (0..13).map(|i| 600.0 + 4.0 * i as f32).collect();
    for r in results {
        assert_eq!(r, want);
    }
}

#[test]
fn reduce_scatter_gives_rank_its_chunk() {
    for n in [2, 3, 4] {
        for m in [0usize, 1, 3, 17] {
            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                let results = run_on_threads(n, T, |mut c| {
                    let r = c.rank();
                    let input: Vec<f32> = (0..n * m).map(|i| val(r, i)).collect();
                    let mut out = vec![f32::NAN; m];
                    c.reduce_scatter(&input, &mut out, op).unwrap();
                    out
                });
                let mut full = serial_sum(n, n * m);
                if op == ReduceOp::Avg {
                    full.iter_mut().for_each(|x| *x /= n as f64);
                }
                for (r, out) in results.iter().enumerate() {
                    assert_close(
                        out,
                        &full[r * m..(r + 1) * m],
                        &format!("n={n} m={m} rank {r} {op:?}"),
                    );
                }
            }
        }
    }
}

#[test]
fn reduce_scatter_rejects_bad_lengths() {
    let mut comms = ThreadGroup::with_timeout(2, T);
    let mut out = vec![0.0; 3];
    let e = comms[0]
        .reduce_scatter(&[0.0; 5], &mut out, ReduceOp::Sum)
        .unwrap_err();
    assert!(matches!(e, DistError::InvalidArgument(_)), "{e}");
}

#[test]
fn all_gather_concatenates_in_rank_order() {
    for n in [2, 3, 4] {
        for m in [0usize, 1, 5, 1000] {
            let results = run_on_threads(n, T, |mut c| {
                let r = c.rank();
                let input: Vec<f32> = (0..m).map(|i| val(r, i)).collect();
                let mut out = vec![f32::NAN; n * m];
                c.all_gather(&input, &mut out).unwrap();
                out
            });
            let want: Vec<f32> = (0..n)
                .flat_map(|r| (0..m).map(move |i| val(r, i)))
                .collect();
            for out in results {
                assert_eq!(out, want, "n={n} m={m}");
            }
        }
    }
}

#[test]
fn broadcast_from_every_root_small_and_large() {
    for n in [2, 3, 4] {
        for root in 0..n {
            // 100_003 elements takes the scatter + all-gather path.
            for len in [1usize, 7, 100_003] {
                let results = run_on_threads(n, T, |mut c| {
                    let r = c.rank();
                    let mut buf: Vec<f32> = (0..len).map(|i| val(r, i)).collect();
                    c.broadcast(&mut buf, root).unwrap();
                    buf
                });
                let want: Vec<f32> = (0..len).map(|i| val(root, i)).collect();
                for (r, out) in results.iter().enumerate() {
                    assert!(out == &want, "n={n} root={root} len={len}: rank {r} wrong");
                }
            }
        }
    }
}

#[test]
fn send_recv_ring_and_ordering() {
    for n in [2, 3, 4] {
        let results = run_on_threads(n, T, |mut c| {
            let r = c.rank();
            let next = (r + 1) % n;
            let prev = (r + n - 1) % n;
            // Two messages to the same peer arrive in order.
            c.send(&[r as f32, 1.0], next).unwrap();
            c.send(&[r as f32, 2.0, 9.0], next).unwrap();
            let mut a = [0.0; 2];
            let mut b = [0.0; 3];
            c.recv(&mut a, prev).unwrap();
            c.recv(&mut b, prev).unwrap();
            (prev, a, b)
        });
        for (prev, a, b) in results {
            assert_eq!(a, [prev as f32, 1.0]);
            assert_eq!(b, [prev as f32, 2.0, 9.0]);
        }
    }
}

#[test]
fn barrier_and_mixed_sequence() {
    let results = run_on_threads(3, T, |mut c| {
        let r = c.rank();
        let mut s = 0.0;
        for k in 0..20 {
            c.barrier().unwrap();
            let mut b = [r as f32 + k as f32];
            c.all_reduce(&mut b, ReduceOp::Sum).unwrap();
            s += b[0];
        }
        s
    });
    let want: f32 = (0..20).map(|k| 3.0 + 3.0 * k as f32).sum();
    assert!(results.iter().all(|&s| s == want));
}

#[test]
fn sub_groups_reduce_only_among_members() {
    // Groups {0, 2} and {1, 3} of a 4-rank world, plus a reversed-order group.
    let results = run_on_threads(4, T, |mut c| {
        let r = c.rank();
        let members: Vec<usize> = if r % 2 == 0 { vec![0, 2] } else { vec![1, 3] };
        let mut g = c.new_group(&members).unwrap();
        assert_eq!(g.world_size(), 2);
        assert_eq!(g.rank(), r / 2);
        assert_eq!(g.global_rank(), r);
        let mut b = [r as f32 + 1.0];
        g.all_reduce(&mut b, ReduceOp::Sum).unwrap();
        // Group ranks follow the list order: in [3, 2, 1, 0] world rank 3 is group rank 0.
        let mut rev = c.new_group(&[3, 2, 1, 0]).unwrap();
        assert_eq!(rev.rank(), 3 - r);
        let mut x = [r as f32];
        rev.broadcast(&mut x, 0).unwrap();
        // The world communicator still works alongside.
        let mut w = [1.0f32];
        c.all_reduce(&mut w, ReduceOp::Sum).unwrap();
        (b[0], x[0], w[0])
    });
    assert_eq!(results[0], (4.0, 3.0, 4.0)); // 1 + 3
    assert_eq!(results[2], (4.0, 3.0, 4.0));
    assert_eq!(results[1], (6.0, 3.0, 4.0)); // 2 + 4
    assert_eq!(results[3], (6.0, 3.0, 4.0));
}

#[test]
fn new_group_rejects_non_members_and_duplicates() {
    let mut comms = ThreadGroup::with_timeout(3, T);
    assert!(comms[0].new_group(&[1, 2]).is_err());
    assert!(comms[0].new_group(&[0, 0]).is_err());
    assert!(comms[0].new_group(&[0, 5]).is_err());
}

#[test]
fn mesh_2d_tp_by_dp() {
    let (inner, outer) = mesh_2d_groups(8, 4).unwrap();
    assert_eq!(inner, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    assert_eq!(outer, vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
    assert!(mesh_2d_groups(8, 3).is_err());

    let results = run_on_threads(4, T, |mut c| {
        let r = c.rank();
        let mut mesh = mesh_2d(&mut c, 2).unwrap();
        let mut a = [r as f32];
        mesh.inner.all_reduce(&mut a, ReduceOp::Sum).unwrap();
        let mut b = [r as f32];
        mesh.outer.all_reduce(&mut b, ReduceOp::Sum).unwrap();
        (a[0], b[0])
    });
    // inner {0,1},{2,3}; outer {0,2},{1,3}
    assert_eq!(
        results,
        vec![(1.0, 2.0), (1.0, 4.0), (5.0, 2.0), (5.0, 4.0)]
    );
}

#[test]
fn async_communicator_runs_in_submission_order_and_overlaps() {
    let results = run_on_threads(3, T, |c| {
        let r = c.rank();
        let a = AsyncCommunicator::new(c);
        let works: Vec<_> = (0..8)
            .map(|k| a.all_reduce(vec![(r * 10 + k) as f32; 5], ReduceOp::Sum))
            .collect();
        let rs = a.reduce_scatter((0..6).map(|i| (r + i) as f32).collect(), ReduceOp::Sum);
        let ag = a.all_gather(vec![r as f32]);
        let bc = a.broadcast(vec![r as f32; 2], 2);
        let bar = a.barrier();
        let sums: Vec<f32> = works.into_iter().map(|w| w.wait().unwrap()[0]).collect();
        let rs = rs.wait().unwrap();
        let ag = ag.wait().unwrap();
        let bc = bc.wait().unwrap();
        bar.wait().unwrap();
        let mut back = a.into_inner().unwrap();
        back.barrier().unwrap();
        (sums, rs, ag, bc)
    });
    for (r, (sums, rs, ag, bc)) in results.into_iter().enumerate() {
        let want: Vec<f32> = (0..8).map(|k| (30 + 3 * k) as f32).collect();
        assert_eq!(sums, want);
        // input[i] = rank + i, summed over 3 ranks = 3 + 3i; rank r owns elements 2r, 2r+1.
        assert_eq!(rs, vec![(3 + 6 * r) as f32, (6 + 6 * r) as f32]);
        assert_eq!(ag, vec![0.0, 1.0, 2.0]);
        assert_eq!(bc, vec![2.0, 2.0]);
    }
}

#[test]
fn async_work_can_be_polled() {
    let mut comms = ThreadGroup::with_timeout(2, T);
    let c1 = comms.pop().unwrap();
    let c0 = comms.pop().unwrap();
    let a0 = AsyncCommunicator::new(c0);
    let mut w = a0.all_reduce(vec![1.0; 4], ReduceOp::Sum);
    std::thread::sleep(Duration::from_millis(50));
    assert!(!w.is_completed(), "cannot finish before rank 1 joins");
    let h = std::thread::spawn(move || {
        let mut c1 = c1;
        let mut b = vec![2.0; 4];
        c1.all_reduce(&mut b, ReduceOp::Sum).unwrap();
        b
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !w.is_completed() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(w.wait().unwrap(), vec![3.0; 4]);
    assert_eq!(h.join().unwrap(), vec![3.0; 4]);
}

#[test]
fn timeout_names_op_rank_peer_and_sequence() {
    let mut comms = ThreadGroup::with_timeout(3, Duration::from_millis(200));
    let _keep = comms.split_off(1); // ranks 1 and 2 exist but never call
    let c0 = &mut comms[0];
    let mut b = [0.0f32; 4];
    // Two successful local calls would need peers, so count calls through failures instead:
    let t = Instant::now();
    let e1 = c0.all_reduce(&mut b, ReduceOp::Sum).unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(190) && t.elapsed() < Duration::from_secs(5));
    let msg = e1.to_string();
    // Rank 0 waits on its ring predecessor, rank 2.
    assert_eq!(
        msg,
        "all_reduce #1 on rank 0 timed out after 0.2 s waiting for rank 2"
    );
    assert!(e1.is_timeout());
    let e2 = c0.broadcast(&mut b, 1).unwrap_err();
    assert_eq!(
        e2.to_string(),
        "broadcast #2 on rank 0 timed out after 0.2 s waiting for rank 1"
    );
    let ctx = e2.context().unwrap();
    assert_eq!((ctx.op, ctx.seq, ctx.rank), ("broadcast", 2, 0));
    let e3 = c0.recv(&mut b, 1).unwrap_err();
    assert_eq!(
        e3.to_string(),
        "recv #1 on rank 0 timed out after 0.2 s waiting for rank 1"
    );
}

#[test]
fn timeout_from_env_variable_format() {
    assert_eq!(
        sinter_dist::comm::parse_timeout("30"),
        Some(Duration::from_secs(30))
    );
    assert_eq!(
        sinter_dist::comm::parse_timeout("0.5"),
        Some(Duration::from_millis(500))
    );
    assert_eq!(sinter_dist::comm::parse_timeout("0"), None);
    assert_eq!(sinter_dist::comm::parse_timeout("abc"), None);
}

#[test]
fn dropped_peer_fails_fast_with_peer_lost() {
    let mut comms = ThreadGroup::with_timeout(2, Duration::from_secs(30));
    let c1 = comms.pop().unwrap();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        drop(c1); // e.g. the rank panicked
    });
    let t = Instant::now();
    let e = comms[0]
        .all_reduce(&mut [1.0; 8], ReduceOp::Sum)
        .unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "must not wait for the 30 s timeout"
    );
    assert!(matches!(e, DistError::PeerLost { peer: 1, .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with("all_reduce #1 on rank 0 failed: connection to rank 1 lost"),
        "{e}"
    );
    h.join().unwrap();
}

#[test]
fn mismatched_collectives_are_reported() {
    // Each rank returns its communicator so that none is dropped (which would make the other
    // fail with "peer lost" instead) before both are done.
    let results = run_on_threads(2, Duration::from_secs(2), |mut c| {
        let mut b = [1.0f32; 4];
        let r = if c.rank() == 0 {
            c.all_reduce(&mut b, ReduceOp::Sum)
        } else {
            c.broadcast(&mut b, 1)
        };
        (r.map_err(|e| e.to_string()), c)
    });
    let e0 = results[0].0.clone().unwrap_err();
    assert!(
        e0.contains("all_reduce #1 on rank 0: mismatch with rank 1: rank 1 called broadcast"),
        "{e0}"
    );

    let results = run_on_threads(2, Duration::from_secs(2), |mut c| {
        let mut b = vec![1.0f32; 4 + c.rank() * 2];
        let r = c.all_reduce(&mut b, ReduceOp::Sum);
        (r.map_err(|e| e.to_string()), c)
    });
    for (r, (res, _)) in results.iter().enumerate() {
        let e = res.clone().unwrap_err();
        assert!(e.contains("values, expected"), "rank {r}: {e}");
    }
}

#[test]
fn single_rank_is_identity() {
    let mut c = ThreadGroup::new(1).pop().unwrap();
    let mut b = vec![1.5f32, 2.5];
    c.all_reduce(&mut b, ReduceOp::Avg).unwrap();
    assert_eq!(b, vec![1.5, 2.5]);
    let mut out = vec![0.0; 2];
    c.reduce_scatter(&b, &mut out, ReduceOp::Sum).unwrap();
    c.all_gather(&b, &mut out).unwrap();
    c.broadcast(&mut b, 0).unwrap();
    c.barrier().unwrap();
    assert_eq!(out, vec![1.5, 2.5]);
    assert!(sinter_dist::default_timeout() > Duration::ZERO);
}
