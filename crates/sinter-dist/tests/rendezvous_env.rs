//! Launcher environment parsing, Slurm node lists, and the TCP store.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sinter_dist::cluster_env::{parse_node_env, NodeSource};
use sinter_dist::launch::{resolve_layout, NodeFlags};
use sinter_dist::rendezvous::{
    expand_nodelist, first_host, parse_env, EnvSource, DEFAULT_MASTER_PORT,
};
use sinter_dist::{DistError, StoreClient, StoreServer};

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn torchrun_variables() {
    let e = parse_env(&env(&[
        ("RANK", "11"),
        ("WORLD_SIZE", "16"),
        ("LOCAL_RANK", "3"),
        ("LOCAL_WORLD_SIZE", "8"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "1234"),
    ]))
    .unwrap();
    assert_eq!(e.source, EnvSource::Torchrun);
    assert_eq!(
        (e.rank, e.world_size, e.local_rank, e.local_world_size),
        (11, 16, 3, 8)
    );
    assert_eq!(e.master_addr.as_deref(), Some("10.0.0.1"));
    assert_eq!(e.master_port, 1234);
    assert_eq!(e.node_rank(), 1);
    assert_eq!(e.master_endpoint().unwrap(), "10.0.0.1:1234");
}

#[test]
fn torchrun_defaults_and_errors() {
    let e = parse_env(&env(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "h"),
    ]))
    .unwrap();
    assert_eq!(e.master_port, DEFAULT_MASTER_PORT);
    assert_eq!((e.local_rank, e.local_world_size), (0, 2));
    // Multi-rank without a master.
    assert!(matches!(
        parse_env(&env(&[("RANK", "0"), ("WORLD_SIZE", "2")])),
        Err(DistError::Env(_))
    ));
    // Garbage and out-of-range values.
    assert!(parse_env(&env(&[
        ("RANK", "x"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "h")
    ]))
    .is_err());
    assert!(parse_env(&env(&[
        ("RANK", "2"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "h")
    ]))
    .is_err());
    assert!(parse_env(&env(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "99999")
    ]))
    .is_err());
    // IPv6 master.
    let e = parse_env(&env(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "::1"),
        ("MASTER_PORT", "5"),
    ]))
    .unwrap();
    assert_eq!(e.master_endpoint().unwrap(), "[::1]:5");
}

#[test]
fn torchrun_wins_over_slurm() {
    let e = parse_env(&env(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "a"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_JOB_NODELIST", "n[1-4]"),
    ]))
    .unwrap();
    assert_eq!(
        (e.source, e.rank, e.world_size),
        (EnvSource::Torchrun, 1, 2)
    );
}

#[test]
fn slurm_variables() {
    let e = parse_env(&env(&[
        ("SLURM_PROCID", "13"),
        ("SLURM_NTASKS", "16"),
        ("SLURM_LOCALID", "5"),
        ("SLURM_NTASKS_PER_NODE", "8"),
        ("SLURM_JOB_NODELIST", "gpu[01-04,07]"),
    ]))
    .unwrap();
    assert_eq!(e.source, EnvSource::Slurm);
    assert_eq!(
        (e.rank, e.world_size, e.local_rank, e.local_world_size),
        (13, 16, 5, 8)
    );
    assert_eq!(e.master_addr.as_deref(), Some("gpu01"));
    assert_eq!(e.master_port, DEFAULT_MASTER_PORT);

    // SLURM_TASKS_PER_NODE compressed form, SLURM_NODELIST fallback, MASTER_* override.
    let e = parse_env(&env(&[
        ("SLURM_PROCID", "2"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "2"),
        ("SLURM_TASKS_PER_NODE", "4(x2)"),
        ("SLURM_NODELIST", "node[7-8]"),
        ("MASTER_PORT", "4000"),
    ]))
    .unwrap();
    assert_eq!(e.local_world_size, 4);
    assert_eq!(e.master_addr.as_deref(), Some("node7"));
    assert_eq!(e.master_port, 4000);

    let e = parse_env(&env(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_NNODES", "2"),
        ("SLURM_JOB_NODELIST", "a,b"),
        ("MASTER_ADDR", "10.1.1.1"),
    ]))
    .unwrap();
    assert_eq!(e.local_world_size, 2);
    assert_eq!(e.master_addr.as_deref(), Some("10.1.1.1"));

    // Multi-task job without any node list.
    assert!(parse_env(&env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")])).is_err());
}

#[test]
fn openmpi_variables() {
    let e = parse_env(&env(&[
        ("OMPI_COMM_WORLD_RANK", "2"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
    ]))
    .unwrap();
    assert_eq!(e.source, EnvSource::OpenMpi);
    assert_eq!(
        (e.rank, e.world_size, e.local_rank, e.local_world_size),
        (2, 4, 2, 4)
    );
    assert_eq!(e.master_addr.as_deref(), Some("127.0.0.1"));

    // Several hosts: MASTER_ADDR is required.
    let multi = [
        ("OMPI_COMM_WORLD_RANK", "5"),
        ("OMPI_COMM_WORLD_SIZE", "8"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
    ];
    let err = parse_env(&env(&multi)).unwrap_err();
    assert!(err.to_string().contains("MASTER_ADDR"), "{err}");
    let mut v = multi.to_vec();
    v.push(("MASTER_ADDR", "host0"));
    let e = parse_env(&env(&v)).unwrap();
    assert_eq!((e.rank, e.local_rank, e.node_rank()), (5, 1, 1));
    assert_eq!(e.master_addr.as_deref(), Some("host0"));
}

/// `--dist-backend auto` becomes MPI only for a process an MPI launcher started (and only in
/// a build with MPI); torchrun-style variables, or an explicit choice, win.
#[test]
fn auto_under_mpirun_means_mpi_in_a_build_with_mpi() {
    use sinter_dist::mpi::{built_in, resolve_auto, started_by_mpirun};
    use sinter_dist::BackendChoice::{Auto, Host, Mpi, Nccl};
    let ompi = env(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2")]);
    let hydra = env(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]);
    let pmix = env(&[("PMIX_RANK", "0")]);
    let launched = env(&[
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
    ]);
    for (vars, by_mpi) in [
        (&ompi, true),
        (&hydra, true),
        (&pmix, true),
        (&launched, false),
        (&HashMap::new(), false),
    ] {
        assert_eq!(started_by_mpirun(vars), by_mpi, "{vars:?}");
        let want = if by_mpi && built_in() { Mpi } else { Auto };
        assert_eq!(resolve_auto(Auto, vars), want, "{vars:?}");
        for explicit in [Host, Nccl, Mpi] {
            assert_eq!(resolve_auto(explicit, vars), explicit);
        }
    }
}

#[test]
fn nothing_set_is_single_process() {
    let e = parse_env(&HashMap::new()).unwrap();
    assert_eq!((e.rank, e.world_size, e.source), (0, 1, EnvSource::Single));
    assert_eq!(e.master_addr, None);
}

/// The variables a Kubeflow Trainer v2 TrainJob gives node 1 of 2 (on JobSet, so the Job's
/// completion index is there too).
fn trainer_pod() -> Vec<(&'static str, &'static str)> {
    vec![
        ("PET_NNODES", "2"),
        ("PET_NPROC_PER_NODE", "4"),
        ("PET_NODE_RANK", "1"),
        ("PET_MASTER_ADDR", "job-node-0-0.job"),
        ("PET_MASTER_PORT", "29400"),
        ("JOB_COMPLETION_INDEX", "1"),
    ]
}

#[test]
fn kubernetes_node_variables_of_each_system() {
    let e = parse_node_env(&env(&trainer_pod())).unwrap().unwrap();
    assert_eq!(e.source, NodeSource::KubeflowTrainer);
    assert_eq!(
        (e.node_rank, e.nnodes, e.nproc_per_node),
        (1, Some(2), Some(4))
    );
    assert_eq!(
        (e.master_addr.as_deref(), e.master_port),
        (Some("job-node-0-0.job"), Some(29400))
    );

    let e = parse_node_env(&env(&[
        ("LWS_LEADER_ADDRESS", "lws-0.lws.ns"),
        ("LWS_GROUP_SIZE", "4"),
        ("LWS_WORKER_INDEX", "3"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(e.source, NodeSource::LeaderWorkerSet);
    assert_eq!((e.node_rank, e.nnodes), (3, Some(4)));
    assert_eq!(e.master_addr.as_deref(), Some("lws-0.lws.ns"));

    // JobSet: the master is pod 0 of job 0; the subdomain defaults to the JobSet's name.
    let js = [
        ("JOB_COMPLETION_INDEX", "2"),
        ("JOBSET_NAME", "train"),
        ("REPLICATED_JOB_NAME", "workers"),
    ];
    let e = parse_node_env(&env(&js)).unwrap().unwrap();
    assert_eq!(e.source, NodeSource::JobSet);
    assert_eq!((e.node_rank, e.nnodes), (2, None));
    assert_eq!(e.master_addr.as_deref(), Some("train-workers-0-0.train"));
    let mut sub = js.to_vec();
    sub.push(("JOBSET_SUBDOMAIN", "net"));
    let e = parse_node_env(&env(&sub)).unwrap().unwrap();
    assert_eq!(e.master_addr.as_deref(), Some("train-workers-0-0.net"));
    // A plain Indexed Job (no JobSet name) is no JobSet.
    assert!(parse_node_env(&env(&[("JOB_COMPLETION_INDEX", "2")]))
        .unwrap()
        .is_none());

    // v1 PyTorchJob and Volcano: pod-level RANK/WORLD_SIZE count pods.
    let pj = [
        ("RANK", "1"),
        ("WORLD_SIZE", "3"),
        ("MASTER_ADDR", "pj-master-0"),
        ("MASTER_PORT", "23456"),
    ];
    let e = parse_node_env(&env(&pj)).unwrap().unwrap();
    assert_eq!(e.source, NodeSource::PyTorchJob);
    assert_eq!(
        (e.node_rank, e.nnodes, e.master_port),
        (1, Some(3), Some(23456))
    );
    let mut vc = pj.to_vec();
    vc.push(("VC_TASK_INDEX", "0"));
    assert_eq!(
        parse_node_env(&env(&vc)).unwrap().unwrap().source,
        NodeSource::Volcano
    );
    // With LOCAL_RANK the same RANK is a launched process's: no node-level set.
    let mut launched = pj.to_vec();
    launched.push(("LOCAL_RANK", "0"));
    assert!(parse_node_env(&env(&launched)).unwrap().is_none());
}

#[test]
fn kubernetes_sets_precedence_conflicts_and_errors() {
    // Trainer wins over LWS; fields it lacks come from the next set.
    let mut v = trainer_pod();
    v.retain(|(k, _)| *k != "PET_MASTER_ADDR");
    v.extend([
        ("LWS_WORKER_INDEX", "1"),
        ("LWS_GROUP_SIZE", "2"),
        ("LWS_LEADER_ADDRESS", "leader"),
    ]);
    let e = parse_node_env(&env(&v)).unwrap().unwrap();
    assert_eq!(e.source, NodeSource::KubeflowTrainer);
    assert_eq!(e.master_addr.as_deref(), Some("leader"));

    // Two sets that disagree are refused, both named.
    let mut v = trainer_pod();
    v.extend([("LWS_WORKER_INDEX", "0"), ("LWS_GROUP_SIZE", "2")]);
    let msg = parse_node_env(&env(&v)).unwrap_err().to_string();
    assert!(
        msg.contains("node rank")
            && msg.contains("PET_NODE_RANK")
            && msg.contains("LWS_WORKER_INDEX"),
        "{msg}"
    );
    let mut v = trainer_pod();
    v.extend([("JOBSET_NAME", "other"), ("REPLICATED_JOB_NAME", "node")]);
    let msg = parse_node_env(&env(&v)).unwrap_err().to_string();
    assert!(
        msg.contains("master")
            && msg.contains("job-node-0-0.job")
            && msg.contains("other-node-0-0.other"),
        "{msg}"
    );

    for (bad, needle) in [
        (vec![("PET_NODE_RANK", "x")], "PET_NODE_RANK"),
        (
            vec![("PET_NODE_RANK", "0"), ("PET_NPROC_PER_NODE", "auto")],
            "numProcPerNode",
        ),
        (
            vec![("PET_NODE_RANK", "2"), ("PET_NNODES", "2")],
            "not below",
        ),
        (
            vec![("PET_NODE_RANK", "0"), ("PET_MASTER_PORT", "70000")],
            "PET_MASTER_PORT",
        ),
        (
            vec![("JOB_COMPLETION_INDEX", "0"), ("JOBSET_NAME", "j")],
            "REPLICATED_JOB_NAME",
        ),
        (
            vec![
                ("JOB_COMPLETION_INDEX", "0"),
                ("JOBSET_NAME", "j"),
                ("REPLICATED_JOB_NAME", "w"),
                ("JOB_INDEX", "1"),
            ],
            "JOB_INDEX=1",
        ),
    ] {
        let msg = parse_node_env(&env(&bad)).unwrap_err().to_string();
        assert!(msg.contains(needle), "{bad:?}: {msg}");
    }
}

#[test]
fn a_rank_started_straight_in_a_pod_reads_the_node_variables() {
    // One process per pod: rank = node rank.
    let e = parse_env(&env(&[
        ("PET_NNODES", "3"),
        ("PET_NPROC_PER_NODE", "1"),
        ("PET_NODE_RANK", "2"),
        ("PET_MASTER_ADDR", "m"),
    ]))
    .unwrap();
    assert_eq!(e.source, EnvSource::Cluster(NodeSource::KubeflowTrainer));
    assert_eq!(
        (e.rank, e.world_size, e.local_rank, e.local_world_size),
        (2, 3, 0, 1)
    );
    assert_eq!(
        e.master_endpoint().unwrap(),
        format!("m:{DEFAULT_MASTER_PORT}")
    );
    // Several ranks per pod need the launcher.
    let msg = parse_env(&env(&trainer_pod())).unwrap_err().to_string();
    assert!(msg.contains("sinter launch"), "{msg}");
    // A launched rank ignores the pod's variables: the launcher resolved them.
    let mut v = trainer_pod();
    v.extend([
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "m"),
    ]);
    let e = parse_env(&env(&v)).unwrap();
    assert_eq!(
        (e.source, e.rank, e.world_size),
        (EnvSource::Torchrun, 5, 8)
    );
    // JobSet alone says nothing of the node count.
    let msg = parse_env(&env(&[
        ("JOB_COMPLETION_INDEX", "0"),
        ("JOBSET_NAME", "j"),
        ("REPLICATED_JOB_NAME", "w"),
    ]))
    .unwrap_err()
    .to_string();
    assert!(msg.contains("node count"), "{msg}");
}

#[test]
fn launch_layout_flags_override_the_job_variables() {
    let vars = env(&trainer_pod());
    let l = resolve_layout(&NodeFlags::default(), &vars).unwrap();
    assert_eq!(
        (
            l.nproc_per_node,
            l.nnodes,
            l.node_rank,
            l.master_addr.as_str(),
            l.master_port
        ),
        (4, 2, 1, "job-node-0-0.job", 29400)
    );
    assert_eq!(l.source, Some(NodeSource::KubeflowTrainer));
    let flags = NodeFlags {
        nproc_per_node: Some(2),
        node_rank: Some(0),
        master_addr: Some("x".into()),
        ..NodeFlags::default()
    };
    let l = resolve_layout(&flags, &vars).unwrap();
    assert_eq!(
        (
            l.nproc_per_node,
            l.nnodes,
            l.node_rank,
            l.master_addr.as_str()
        ),
        (2, 2, 0, "x")
    );
    // No variables: defaults, but the rank count must be given.
    let none = HashMap::new();
    assert!(resolve_layout(&NodeFlags::default(), &none)
        .unwrap_err()
        .to_string()
        .contains("--nproc-per-node"));
    let l = resolve_layout(
        &NodeFlags {
            nproc_per_node: Some(3),
            ..NodeFlags::default()
        },
        &none,
    )
    .unwrap();
    assert_eq!(
        (
            l.nnodes,
            l.node_rank,
            l.master_addr.as_str(),
            l.master_port,
            l.source
        ),
        (1, 0, "127.0.0.1", DEFAULT_MASTER_PORT, None)
    );
    // JobSet alone: --nnodes is needed.
    let js = env(&[
        ("JOB_COMPLETION_INDEX", "1"),
        ("JOBSET_NAME", "j"),
        ("REPLICATED_JOB_NAME", "w"),
    ]);
    let f = NodeFlags {
        nproc_per_node: Some(1),
        ..NodeFlags::default()
    };
    assert!(resolve_layout(&f, &js)
        .unwrap_err()
        .to_string()
        .contains("--nnodes"));
}

#[test]
fn slurm_nodelist_expansion() {
    assert_eq!(
        expand_nodelist("gpu[01-04,07]").unwrap(),
        ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]
    );
    assert_eq!(expand_nodelist("node1,node2").unwrap(), ["node1", "node2"]);
    assert_eq!(
        expand_nodelist("a[1-2]-ib,b3").unwrap(),
        ["a1-ib", "a2-ib", "b3"]
    );
    assert_eq!(
        expand_nodelist("r[1-2]n[01-02]").unwrap(),
        ["r1n01", "r1n02", "r2n01", "r2n02"]
    );
    assert_eq!(expand_nodelist("x[9-11]").unwrap(), ["x9", "x10", "x11"]);
    assert_eq!(
        expand_nodelist("gpu[098-101]").unwrap(),
        ["gpu098", "gpu099", "gpu100", "gpu101"]
    );
    assert_eq!(expand_nodelist("c[1,3],d[5]").unwrap(), ["c1", "c3", "d5"]);
    for bad in ["gpu[01-", "gpu[]", "gpu[3-1]", "gpu]1[", "", "g[a-b]"] {
        assert!(expand_nodelist(bad).is_err(), "`{bad}` should be rejected");
    }
    assert_eq!(first_host("gpu[07,01-04],cpu1").unwrap(), "gpu07");
    assert_eq!(first_host("login5").unwrap(), "login5");
    assert_eq!(first_host("node-[0012-0015]").unwrap(), "node-0012");
}

#[test]
fn store_set_get_wait_add_delete() {
    let server = StoreServer::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().to_string();
    let a = StoreClient::connect(&addr, Duration::from_secs(5)).unwrap();
    let b = StoreClient::connect(&addr, Duration::from_secs(5)).unwrap();
    assert_eq!(a.get("k").unwrap(), None);
    let bin: Vec<u8> = (0..=255).collect();
    a.set("k", &bin).unwrap();
    assert_eq!(b.get("k").unwrap().unwrap(), bin);
    assert_eq!(a.add("ctr", 2).unwrap(), 2);
    assert_eq!(b.add("ctr", 5).unwrap(), 7);
    assert!(a.delete("k").unwrap());
    assert!(!a.delete("k").unwrap());

    // wait() blocks until another client sets the key.
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        b.set("late", b"v").unwrap();
    });
    let t = Instant::now();
    assert_eq!(
        a.wait("late", Duration::from_secs(10)).unwrap().unwrap(),
        b"v"
    );
    assert!(t.elapsed() >= Duration::from_millis(90));
    h.join().unwrap();

    // ... and gives up after its timeout.
    let t = Instant::now();
    assert_eq!(a.wait("never", Duration::from_millis(200)).unwrap(), None);
    let el = t.elapsed();
    assert!(
        el >= Duration::from_millis(190) && el < Duration::from_secs(3),
        "{el:?}"
    );
}

#[test]
fn store_client_errors_when_server_goes_away() {
    let server = StoreServer::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().to_string();
    let a = StoreClient::connect(&addr, Duration::from_secs(5)).unwrap();
    a.set("x", b"1").unwrap();
    drop(server);
    assert!(a.get("x").is_err());
}

/// `--dist-backend mpi` takes rank and world from MPI; a launcher that started the processes
/// itself (torchrun's variables, e.g. `sinter launch`) while MPI sees a different world is
/// refused naming both counts and the fix, whatever MPI library is built in.
#[test]
fn mpi_world_must_match_a_torchrun_style_launcher() {
    use sinter_dist::mpi::check_world;
    let launched = parse_env(&env(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
    ]))
    .unwrap();
    let e = check_world(Some(&launched), 0, 1).unwrap_err().to_string();
    assert!(
        e.contains("count 2 ranks") && e.contains("world of 1") && e.contains("mpirun -n 2"),
        "{e}"
    );
    check_world(Some(&launched), 1, 2).unwrap();
    // mpirun's own variables, no launcher, or a Slurm allocation larger than mpirun's -n.
    let ompi = parse_env(&env(&[
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "127.0.0.1"),
    ]))
    .unwrap();
    check_world(Some(&ompi), 0, 2).unwrap();
    check_world(None, 0, 3).unwrap();
    let slurm = parse_env(&env(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_NODELIST", "n1"),
    ]))
    .unwrap();
    check_world(Some(&slurm), 0, 2).unwrap();
    if !sinter_dist::mpi::built_in() {
        let e = sinter_dist::mpi::world(Duration::from_secs(1))
            .err()
            .unwrap();
        assert!(e.to_string().contains("--features sinter/mpi"), "{e}");
    }
}
