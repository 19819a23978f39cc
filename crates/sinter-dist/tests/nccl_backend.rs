//! The NCCL backend, on the CPU: `--dist-backend` parsing, the backend decision (the same on
//! every rank, with clear errors naming the rank and the fix), the unique-id exchange through
//! the TCP store (and its timeout), and NCCL's absence reported without a panic. The NCCL
//! backend on CUDA devices (real, or emulated in CI) is tested in `nccl_device.rs`.

use std::time::Duration;

use sinter_dist::nccl::{
    agree_backend, exchange_id, nccl_status, select_backend, LocalSupport, ID_BYTES,
};
use sinter_dist::{
    run_on_threads, Backend, BackendChoice, Communicator, DistError, StoreClient, StoreServer,
};

const T: Duration = Duration::from_secs(20);

fn support(cuda: bool, nccl: bool) -> LocalSupport {
    LocalSupport {
        cuda_ordinal: cuda.then_some(0),
        nccl: if nccl {
            Ok((2, 21, 5))
        } else {
            Err("NCCL could not be loaded. (hint)".into())
        },
    }
}

#[test]
fn backend_choice_parses_and_rejects_unknown_names() {
    assert_eq!(
        "auto".parse::<BackendChoice>().unwrap(),
        BackendChoice::Auto
    );
    assert_eq!(
        "NCCL".parse::<BackendChoice>().unwrap(),
        BackendChoice::Nccl
    );
    assert_eq!(
        "host".parse::<BackendChoice>().unwrap(),
        BackendChoice::Host
    );
    assert_eq!("mpi".parse::<BackendChoice>().unwrap(), BackendChoice::Mpi);
    let e = "ucc".parse::<BackendChoice>().unwrap_err().to_string();
    assert!(
        e.contains("ucc") && e.contains("auto, nccl, host or mpi"),
        "{e}"
    );
}

#[test]
fn backend_selection_rules() {
    let ok = support(true, true);
    let cpu = support(false, true);
    let nolib = support(true, false);
    // auto: NCCL only when every rank can.
    assert_eq!(
        select_backend(BackendChoice::Auto, &ok, true, 0).unwrap(),
        (Backend::Nccl, None)
    );
    let (b, note) = select_backend(BackendChoice::Auto, &cpu, false, 3).unwrap();
    assert_eq!(b, Backend::Host);
    let note = note.unwrap();
    assert!(
        note.contains("rank 3") && note.contains("--device cuda"),
        "{note}"
    );
    let (b, note) = select_backend(BackendChoice::Auto, &ok, false, 1).unwrap();
    assert_eq!(b, Backend::Host);
    assert!(note.unwrap().contains("another rank"));
    // host: always the host ring.
    assert_eq!(
        select_backend(BackendChoice::Host, &ok, true, 0).unwrap().0,
        Backend::Host
    );
    // nccl: an error that says why and what to do.
    let e = select_backend(BackendChoice::Nccl, &cpu, false, 2)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rank 2") && e.contains("--device cuda") && e.contains("--dist-backend host"),
        "{e}"
    );
    let e = select_backend(BackendChoice::Nccl, &nolib, false, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("NCCL could not be loaded"), "{e}");
    let e = select_backend(BackendChoice::Nccl, &ok, false, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("another rank"), "{e}");
    assert_eq!(
        select_backend(BackendChoice::Nccl, &ok, true, 0).unwrap().0,
        Backend::Nccl
    );
}

#[test]
fn every_rank_agrees_on_the_backend() {
    // Rank 1 trains on the CPU: auto falls back to the host ring on both ranks; nccl fails
    // on both (each saying why), instead of one rank waiting for the other forever.
    let out = run_on_threads(2, T, |c| {
        let r = c.rank();
        let comm = sinter_dist::AsyncCommunicator::new(c);
        let local = support(r == 0, true);
        let auto = agree_backend(&comm, BackendChoice::Auto, &local, 0)
            .unwrap()
            .0;
        let forced = agree_backend(&comm, BackendChoice::Nccl, &local, 0)
            .unwrap_err()
            .to_string();
        (auto, forced)
    });
    assert_eq!(out[0].0, Backend::Host);
    assert_eq!(out[1].0, Backend::Host);
    assert!(out[0].1.contains("another rank"), "{}", out[0].1);
    assert!(
        out[1].1.contains("rank 1") && out[1].1.contains("--device cuda"),
        "{}",
        out[1].1
    );
}

#[test]
fn ranks_sharing_a_gpu_rule_nccl_out() {
    // Two processes on one GPU (e.g. `launch --nproc-per-node 2` with --device cuda on a
    // one-GPU machine): NCCL refuses duplicate GPUs, so auto takes the host ring.
    let out = run_on_threads(2, T, |c| {
        let comm = sinter_dist::AsyncCommunicator::new(c);
        let local = support(true, true);
        let auto = agree_backend(&comm, BackendChoice::Auto, &local, 0).unwrap();
        let forced = agree_backend(&comm, BackendChoice::Nccl, &local, 0)
            .unwrap_err()
            .to_string();
        // Different nodes: the same ordinal is a different GPU.
        let apart = agree_backend(&comm, BackendChoice::Auto, &local, comm.rank())
            .unwrap()
            .0;
        (auto, forced, apart)
    });
    for (auto, forced, apart) in out {
        assert_eq!(auto.0, Backend::Host);
        assert!(auto.1.unwrap().contains("ranks 0 and 1 both use cuda:0"));
        assert!(forced.contains("one GPU per rank"), "{forced}");
        assert_eq!(apart, Backend::Nccl);
    }
    assert_eq!(
        sinter_dist::nccl::shared_gpu(&[(0, Some(0)), (0, Some(1)), (1, Some(0))]),
        None
    );
    assert!(sinter_dist::nccl::shared_gpu(&[(0, None), (0, None)]).is_none());
}

#[test]
fn missing_nccl_is_reported_with_the_fix_not_a_panic() {
    match nccl_status() {
        Ok(v) => println!("NCCL {v:?} is loadable here"),
        Err(e) => {
            assert!(
                e.contains("libcuda.so.1")
                    || (e.contains("libnccl.so") && e.contains("LD_LIBRARY_PATH")),
                "{e}"
            );
        }
    }
}

#[test]
fn unique_id_goes_from_rank_0_to_every_rank_through_the_store() {
    let server = StoreServer::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().to_string();
    let ids: Vec<[u8; ID_BYTES]> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|rank| {
                let addr = addr.clone();
                s.spawn(move || {
                    let store = StoreClient::connect(&addr, T).unwrap();
                    exchange_id(&store, "nccl/test/id", rank, T, || {
                        assert_eq!(rank, 0, "only rank 0 makes the id");
                        let mut id = [0u8; ID_BYTES];
                        for (i, b) in id.iter_mut().enumerate() {
                            *b = (i * 7 + 3) as u8;
                        }
                        Ok(id)
                    })
                    .unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(ids[0][5], 38);
    assert!(ids.iter().all(|i| i == &ids[0]));

    // Rank 0 never publishes: the others time out with the op, their rank and the peer.
    let store = StoreClient::connect(&addr, T).unwrap();
    let e = exchange_id(
        &store,
        "nccl/missing/id",
        2,
        Duration::from_millis(200),
        || unreachable!(),
    )
    .unwrap_err();
    assert!(matches!(e, DistError::Timeout { .. }), "{e}");
    let m = e.to_string();
    assert!(
        m.contains("nccl_id_exchange") && m.contains("rank 2") && m.contains("rank 0"),
        "{m}"
    );
    // A malformed id is a mismatch, not a panic.
    store.set("nccl/short/id", &[1, 2, 3]).unwrap();
    let e = exchange_id(&store, "nccl/short/id", 1, T, || unreachable!()).unwrap_err();
    assert!(e.to_string().contains("3 bytes"), "{e}");
}
