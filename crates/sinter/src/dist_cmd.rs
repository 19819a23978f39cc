//! `sinter launch` (start the ranks of a job on this node) and `sinter bench scaling|allreduce`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use sinter_dist::bench::{bench_host_all_reduce, memcpy_gbs, AllReduceBench, BenchTransport};
use sinter_dist::elastic::ElasticOptions;
use sinter_dist::launch::{self, LaunchOptions, LaunchSpec, NodeFlags, Output};
use sinter_dist::scaling::{scaling_table, Assumptions, Interconnect, Workload};
use sinter_dist::{Communicator, ReduceOp};

#[derive(Args)]
pub struct LaunchArgs {
    // Each layout flag, when absent, comes from the pod's job variables (Kubeflow Trainer
    // PET_*, LeaderWorkerSet, JobSet, PyTorchJob/Volcano; see deploy/README.md), else the
    // single-node default.
    /// Ranks (processes) to start on this node [default: PET_NPROC_PER_NODE].
    #[arg(long)]
    pub nproc_per_node: Option<usize>,
    /// Nodes in the job (run `sinter launch` once per node) [default: from the job's
    /// variables, else 1].
    #[arg(long)]
    pub nnodes: Option<usize>,
    /// This node's index, 0..nnodes [default: from the job's variables, else 0].
    #[arg(long)]
    pub node_rank: Option<usize>,
    /// Host of global rank 0, which serves the rendezvous store [default: from the job's
    /// variables, else 127.0.0.1].
    #[arg(long)]
    pub master_addr: Option<String>,
    /// Port of the rendezvous store; 0 picks a free one (single node only) [default: from
    /// the job's variables, else 29500].
    #[arg(long)]
    pub master_port: Option<u16>,
    /// Print the rank layout and each rank's environment without starting anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Start more than four ranks per CPU core (refused without it: each rank is a whole
    /// sinter process with its own model, so that many would thrash or run out of memory).
    #[arg(long)]
    pub oversubscribe: bool,
    /// Seconds between SIGTERM and SIGKILL when stopping the ranks after a failure.
    #[arg(long, default_value_t = 10.0)]
    pub grace_period: f64,
    /// Restart the whole group up to N times when a rank fails (torchrun's elastic mode):
    /// `train … --out DIR` resumes from DIR's last checkpoint. Across nodes the launchers
    /// agree on each restart through node 0's launcher at --master-port (the ranks then use
    /// --master-port + 1).
    #[arg(long, default_value_t = 0)]
    pub max_restarts: usize,
    /// Fewest nodes a restart may continue with (the checkpoint reshards to the smaller
    /// world) [default: --nnodes].
    #[arg(long)]
    pub min_nodes: Option<usize>,
    /// Most nodes of the job; node ranks are 0..max-nodes [default: --nnodes].
    #[arg(long)]
    pub max_nodes: Option<usize>,
    /// Seconds to wait for the launchers' rendezvous (connecting, the other nodes joining a
    /// round) before ending with an error naming who is missing.
    #[arg(long, default_value_t = 300.0)]
    pub rdzv_timeout: f64,
    /// Seconds node 0 waits for more nodes once --min-nodes joined a round.
    #[arg(long, default_value_t = 10.0)]
    pub rdzv_last_call: f64,
    /// The sinter command every rank runs, after `--` (e.g. `-- train --model mlp`).
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("looking for a free port")?;
    Ok(l.local_addr()?.port())
}

fn spec(
    nproc: usize,
    nnodes: usize,
    node_rank: usize,
    master_addr: &str,
    mut master_port: u16,
    args: Vec<String>,
) -> Result<LaunchSpec> {
    if master_port == 0 {
        if nnodes > 1 {
            bail!("--master-port 0 (pick a free port) only works on a single node; give every node the same port");
        }
        master_port = free_port()?;
    }
    let program = std::env::current_exe().context("finding the sinter executable to re-run")?;
    Ok(LaunchSpec {
        nproc_per_node: nproc,
        nnodes,
        node_rank,
        master_addr: master_addr.to_string(),
        master_port,
        program: program.to_string_lossy().into_owned(),
        args,
        cpu_threads: rank_threads(std::env::var_os("RAYON_NUM_THREADS").is_some()),
    })
}

/// The CPU threads this node's ranks share ([`LaunchSpec::cpu_threads`]): the cores this
/// process may use (affinity and cgroup quota), unless RAYON_NUM_THREADS is set, which then
/// reaches every rank as it is (a count per rank, as torchrun passes OMP_NUM_THREADS).
fn rank_threads(user_set: bool) -> Option<usize> {
    if user_set {
        return None;
    }
    std::thread::available_parallelism().ok().map(|n| n.get())
}

/// `sinter launch`: re-runs this binary with the arguments after `--` in `nproc_per_node`
/// processes carrying RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ….
pub fn launch(a: &LaunchArgs) -> Result<()> {
    // `-- sinter train …` (as in deploy/ and torchrun habits) means `-- train …`: the ranks
    // re-run this binary.
    let skip = usize::from(
        a.command
            .first()
            .is_some_and(|c| c == "sinter" || c.ends_with("/sinter")),
    );
    let command = a.command[skip..].to_vec();
    if command.first().is_some_and(|c| c == "launch") {
        bail!("the command after `--` is itself `launch`; give the command each rank runs, e.g. `-- train …`");
    }
    let flags = NodeFlags {
        nproc_per_node: a.nproc_per_node,
        nnodes: a.nnodes,
        node_rank: a.node_rank,
        master_addr: a.master_addr.clone(),
        master_port: a.master_port,
    };
    let layout =
        launch::resolve_layout(&flags, &std::env::vars().collect()).map_err(anyhow::Error::new)?;
    let spec = spec(
        layout.nproc_per_node,
        layout.nnodes,
        layout.node_rank,
        &layout.master_addr,
        layout.master_port,
        command.clone(),
    )?;
    if a.dry_run {
        match layout.source {
            Some(s) => println!("job variables: {} (flags override them)", s.describe()),
            None => println!("job variables: none (flags and defaults)"),
        }
        print!("{}", launch::dry_run(&spec));
        return Ok(());
    }
    if !(a.grace_period.is_finite() && a.grace_period >= 0.0) {
        bail!("--grace-period must be a non-negative number of seconds");
    }
    check_rank_count(layout.nproc_per_node, a.oversubscribe)?;
    let opts = LaunchOptions {
        grace_period: Duration::from_secs_f64(a.grace_period),
        // The ranks die with this process, even if it is killed by SIGKILL.
        extra_env: vec![(
            crate::signals::LAUNCHER_PID.to_string(),
            std::process::id().to_string(),
        )],
        ..LaunchOptions::default()
    };
    let el = elastic_options(a, layout.nnodes)?;
    let report = if el.max_restarts == 0 && !sinter_dist::elastic::needs_agent(&spec, &el) {
        launch::run_with(&spec, &opts)
    } else {
        sinter_dist::elastic::run_elastic(&spec, &opts, &el, &|round| round_args(&command, round))
    }
    .map_err(anyhow::Error::new)?;
    eprintln!(
        "launch: all {} rank(s) on node {} exited 0",
        report.ranks.len(),
        layout.node_rank
    );
    Ok(())
}

fn secs(v: f64, flag: &str) -> Result<Duration> {
    if !(v.is_finite() && v >= 0.0) {
        bail!("{flag} must be a non-negative number of seconds");
    }
    Ok(Duration::from_secs_f64(v))
}

fn elastic_options(a: &LaunchArgs, nnodes: usize) -> Result<ElasticOptions> {
    let max_nodes = a.max_nodes.unwrap_or(nnodes);
    let min_nodes = a.min_nodes.unwrap_or(nnodes.min(max_nodes));
    if min_nodes == 0 || min_nodes > max_nodes || !(min_nodes..=max_nodes).contains(&nnodes) {
        bail!("need 1 <= --min-nodes ({min_nodes}) <= --nnodes ({nnodes}) <= --max-nodes ({max_nodes})");
    }
    Ok(ElasticOptions {
        max_restarts: a.max_restarts,
        min_nodes,
        max_nodes,
        rdzv_timeout: secs(a.rdzv_timeout, "--rdzv-timeout")?,
        last_call: secs(a.rdzv_last_call, "--rdzv-last-call")?,
    })
}

/// The value of `--flag X` or `--flag=X` in `args`.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let eq = format!("{flag}=");
    args.iter().enumerate().find_map(|(i, a)| {
        if a == flag {
            args.get(i + 1).map(String::as_str)
        } else {
            a.strip_prefix(&eq)
        }
    })
}

/// The command of restart round `round`. `train … --out DIR` continues from DIR's last
/// checkpoint (`--resume DIR`, any `--overwrite` or earlier `--resume` dropped), or, with
/// no checkpoint yet, starts over (`--overwrite`, unless it was itself a resume); other
/// commands run again unchanged.
fn round_args(cmd: &[String], round: usize) -> Vec<String> {
    if round == 0 || cmd.first().map(String::as_str) != Some("train") {
        return cmd.to_vec();
    }
    let Some(out) = flag_value(cmd, "--out").or_else(|| flag_value(cmd, "--resume")) else {
        return cmd.to_vec();
    };
    let out = out.to_string();
    if !std::path::Path::new(&out)
        .join(crate::checkpoint::FILE_NAME)
        .is_file()
    {
        if flag_value(cmd, "--resume").is_some() {
            return cmd.to_vec();
        }
        let mut v: Vec<String> = cmd
            .iter()
            .filter(|a| *a != "--overwrite")
            .cloned()
            .collect();
        v.push("--overwrite".into());
        return v;
    }
    let mut v = Vec::with_capacity(cmd.len() + 2);
    let mut it = cmd.iter();
    while let Some(a) = it.next() {
        if a == "--overwrite" || a.starts_with("--resume=") {
            continue;
        }
        if a == "--resume" {
            it.next();
            continue;
        }
        v.push(a.clone());
    }
    v.extend(["--resume".to_string(), out]);
    v
}

/// Ranks per CPU core that `launch` starts without `--oversubscribe`.
const RANKS_PER_CORE: usize = 4;

/// Refuses more ranks than this machine can run (four per core) unless `--oversubscribe`.
fn check_rank_count(nproc: usize, oversubscribe: bool) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let limit = RANKS_PER_CORE * cores;
    if nproc > limit && !oversubscribe {
        bail!("--nproc-per-node {nproc} would start {nproc} processes on a machine with {cores} CPU core(s); the limit is {limit} ({RANKS_PER_CORE} per core): each rank is a whole sinter process with its own model and threads, so that many would thrash or run out of memory. Use at most {limit}, or add --oversubscribe to start them anyway");
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum BenchCmd {
    /// CPU figures without Python: GEMM, conv, training steps, inference, generation and the
    /// whole default `train` (see bench/vs-torch for the comparison with PyTorch).
    Cpu(crate::bench_cpu::CpuBenchArgs),
    /// Predicted step time, speedup and efficiency of DP, ZeRO-1/2, TP and PP on 1…N GPUs
    /// (analytic model), with the speedup curve as SVG.
    Scaling(ScalingArgs),
    /// Host all-reduce bandwidth (bus bandwidth, as nccl-tests report it) beside a memcpy
    /// ceiling, over threads, TCP loopback threads and TCP loopback processes.
    Allreduce(AllReduceArgs),
    /// int8 against f32 on the CPU: Linear layers, a checkpoint's accuracy and speed, or a
    /// random model's speed (`sinter bench int8 --checkpoint DIR` / `--model gpt2`).
    Int8(crate::int8_bench::Int8BenchArgs),
    /// GPU benchmarks on the CUDA device, as a markdown table: gemm (bf16 GEMM), tc (tensor
    /// cores vs CUDA cores), linear (Linear forward + backward, CPU vs GPU), bandwidth
    /// (elementwise and row kernels vs a copy), attention (fused flash attention) or all.
    Gpu {
        /// gemm, tc, linear, bandwidth, attention or all [default: all].
        #[arg(default_value = "all", hide_default_value = true)]
        which: String,
        /// Also write the table here (and `<out>.json`).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Load test of `sinter serve`: concurrent streaming clients (requests/s, tokens/s, time to
    /// first token, inter-token latency) at several concurrencies.
    Serve(crate::serve_cmd::BenchServeArgs),
    /// Prompt processing and greedy generation tokens/s of a pretrained GGUF or Hugging Face
    /// model (one JSON line per round; bench/llm/vs-transformers sets PyTorch beside it).
    Llm(crate::llm_bench::LlmBenchArgs),
    /// PREDICTED training step time, tokens/s and MFU on a named GPU (h100, h200) without a
    /// GPU: the step traced on the emulated device (nothing runs), a per-kernel table of bytes,
    /// FLOPs and predicted µs, and the launch/byte budget check (`--budget`).
    GpuModel(crate::gpu_model_cmd::GpuModelArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WorkloadName {
    /// GPT-2 124M on H100s (llm.c's setup), 40% MFU.
    Gpt2,
    /// ResNet-50 on V100-class GPUs, fp32 gradients.
    Resnet50,
}

#[derive(Args)]
pub struct ScalingArgs {
    #[arg(long, value_enum, default_value = "gpt2")]
    pub workload: WorkloadName,
    /// Largest GPU count (rows are powers of two).
    #[arg(long, default_value_t = 512)]
    pub max_gpus: usize,
    /// Directory for scaling.svg and scaling.json.
    #[arg(long, default_value = ".")]
    pub out: PathBuf,
    /// Measured bus bandwidth between nodes in GB/s (e.g. `bench allreduce --worker` between
    /// two nodes, as deploy/testbed/netns-nodes.sh measures it) in place of the workload's
    /// assumed network.
    #[arg(long)]
    pub link_gbs: Option<f64>,
    /// Latency between nodes in microseconds, with --link-gbs [default: the assumed network's].
    #[arg(long, requires = "link_gbs")]
    pub link_latency_us: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// Threads exchanging through shared memory.
    Threads,
    /// Threads connected over TCP on 127.0.0.1.
    Tcp,
    /// Processes (started like `sinter launch`) connected over TCP on 127.0.0.1: the host
    /// backend as training uses it.
    #[value(alias = "host")]
    Procs,
    /// Processes started by `mpirun`, reducing with MPI (a build with `--features
    /// sinter/mpi`).
    Mpi,
    /// Threads, tcp and procs, and mpi when built in.
    All,
}

#[derive(Args)]
pub struct AllReduceArgs {
    #[arg(long, default_value_t = 4)]
    pub ranks: usize,
    /// Buffer size per rank, MiB.
    #[arg(long, default_value_t = 64.0)]
    pub mb: f64,
    /// Timed iterations (after one warm-up).
    #[arg(long, default_value_t = 5)]
    pub iters: usize,
    #[arg(long, value_enum, default_value = "all")]
    pub transport: Transport,
    /// Internal: run as one rank of a `procs` measurement.
    #[arg(long, hide = true)]
    pub worker: bool,
}

pub fn bench(which: &BenchCmd) -> Result<()> {
    match which {
        BenchCmd::Cpu(a) => crate::bench_cpu::run(a),
        BenchCmd::Scaling(a) => bench_scaling(a),
        BenchCmd::Allreduce(a) => bench_allreduce(a),
        BenchCmd::Int8(a) => crate::int8_bench::run(a),
        BenchCmd::Gpu { which, out } => {
            println!("{}", crate::gpu_bench::run(which, out.as_deref())?);
            Ok(())
        }
        BenchCmd::Serve(a) => crate::serve_cmd::bench_serve(a),
        BenchCmd::Llm(a) => crate::llm_bench::run(a),
        BenchCmd::GpuModel(a) => crate::gpu_model_cmd::run(a),
    }
}

fn bench_scaling(a: &ScalingArgs) -> Result<()> {
    let (w, mut net) = match a.workload {
        WorkloadName::Gpt2 => (
            Workload::gpt2_124m_h100(0.4),
            Interconnect::h100_nvlink_ib(),
        ),
        WorkloadName::Resnet50 => (Workload::resnet50_v100(), Interconnect::default()),
    };
    if let Some(gbs) = a.link_gbs {
        if !(gbs.is_finite() && gbs > 0.0) {
            bail!("--link-gbs must be a positive number of GB/s, not {gbs}");
        }
        // The measured figure is a bus bandwidth of the whole link: one adapter of that rate.
        net.nic_bw = gbs * 1e9;
        net.nics_per_node = 1;
        println!("network between nodes: measured {gbs} GB/s bus bandwidth (--link-gbs)");
    }
    if let Some(us) = a.link_latency_us {
        if !(us.is_finite() && us >= 0.0) {
            bail!("--link-latency-us must be a number of microseconds ≥ 0, not {us}");
        }
        net.inter_node_latency = us * 1e-6;
    }
    let table = scaling_table(&w, &net, &Assumptions::default(), a.max_gpus.max(1));
    print!("{}", table.to_text());
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("cannot create {}", a.out.display()))?;
    let svg = a.out.join("scaling.svg");
    table.write_svg(&svg).map_err(anyhow::Error::new)?;
    let js = a.out.join("scaling.json");
    std::fs::write(&js, table.to_json())
        .with_context(|| format!("cannot write {}", js.display()))?;
    println!("wrote {} and {}", svg.display(), js.display());
    Ok(())
}

const RESULT_TAG: &str = "SINTER_ALLREDUCE_RESULT ";

fn timed_loop(c: &mut dyn Communicator, floats: usize, iters: usize) -> Result<f64> {
    let mut buf = vec![1.0f32; floats];
    c.all_reduce(&mut buf, ReduceOp::Sum)?;
    c.barrier()?;
    let t = Instant::now();
    for _ in 0..iters {
        c.all_reduce(&mut buf, ReduceOp::Sum)?;
    }
    c.barrier()?;
    Ok(t.elapsed().as_secs_f64())
}

fn result(
    label: &str,
    ranks: usize,
    bytes: usize,
    iters: usize,
    seconds_total: f64,
) -> serde_json::Value {
    let s = seconds_total / iters as f64;
    let (b, n) = (bytes as f64, ranks as f64);
    serde_json::json!({"transport": label, "ranks": ranks, "bytes": bytes, "iters": iters, "seconds": s, "algbw_gbs": b / s / 1e9, "busbw_gbs": 2.0 * (n - 1.0) / n * b / s / 1e9})
}

fn from_lib(r: &AllReduceBench, label: &str) -> serde_json::Value {
    result(label, r.ranks, r.bytes, r.iters, r.seconds * r.iters as f64)
}

fn bench_allreduce(a: &AllReduceArgs) -> Result<()> {
    if a.ranks == 0 || a.iters == 0 || !(a.mb.is_finite() && a.mb > 0.0) {
        bail!("--ranks, --iters and --mb must be positive");
    }
    let floats = ((a.mb * 1024.0 * 1024.0) as usize / 4).max(1);
    let bytes = floats * 4;
    if a.worker {
        let (mut c, label): (Box<dyn Communicator>, _) = if a.transport == Transport::Mpi {
            let c = sinter_dist::mpi::world(sinter_dist::default_timeout())?;
            (c, "mpi processes")
        } else {
            let c = sinter_dist::init_from_env().context("joining the benchmark group")?;
            (Box::new(c), "tcp processes")
        };
        let secs = timed_loop(&mut *c, floats, a.iters)?;
        if c.rank() == 0 {
            println!(
                "{RESULT_TAG}{}",
                result(label, c.world_size(), bytes, a.iters, secs)
            );
        }
        return Ok(());
    }
    let memcpy = memcpy_gbs(bytes, 5);
    println!("host all-reduce, {} ranks, {:.1} MiB per rank, {} iterations (this machine is shared: expect noise)", a.ranks, bytes as f64 / (1024.0 * 1024.0), a.iters);
    println!(
        "memcpy ceiling (one thread, {:.1} MiB): {memcpy:.2} GB/s",
        bytes as f64 / (1024.0 * 1024.0)
    );
    let want = |t: Transport| a.transport == t || a.transport == Transport::All;
    let mut rows = Vec::new();
    if want(Transport::Threads) {
        rows.push(from_lib(
            &bench_host_all_reduce(BenchTransport::Threads, a.ranks, bytes, a.iters)?,
            "threads",
        ));
    }
    if want(Transport::Tcp) {
        rows.push(from_lib(
            &bench_host_all_reduce(BenchTransport::TcpLoopback, a.ranks, bytes, a.iters)?,
            "tcp threads",
        ));
    }
    if want(Transport::Procs) {
        let args: Vec<String> = [
            "bench",
            "allreduce",
            "--worker",
            "--mb",
            &a.mb.to_string(),
            "--iters",
            &a.iters.to_string(),
            "--ranks",
            &a.ranks.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let spec = spec(a.ranks, 1, 0, "127.0.0.1", 0, args)?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let opts = LaunchOptions {
            output: Output::Capture(lines.clone()),
            forward_signals: true,
            ..LaunchOptions::default()
        };
        launch::run_with(&spec, &opts).map_err(|e| {
            anyhow!(
                "{e}; rank output:\n{}",
                lines.lock().unwrap_or_else(|e| e.into_inner()).join("\n")
            )
        })?;
        let lines = lines.lock().unwrap_or_else(|e| e.into_inner());
        let r = lines
            .iter()
            .find_map(|l| l.split_once(RESULT_TAG).map(|(_, j)| j.to_string()))
            .ok_or_else(|| anyhow!("rank 0 printed no result:\n{}", lines.join("\n")))?;
        rows.push(serde_json::from_str(&r).context("reading rank 0's result")?);
    }
    if a.transport == Transport::Mpi
        || (a.transport == Transport::All && sinter_dist::mpi::built_in())
    {
        rows.push(mpi_row(a)?);
    }
    println!(
        "{:<15} {:>11} {:>13} {:>13} {:>12}",
        "transport", "time", "algbw GB/s", "busbw GB/s", "of memcpy"
    );
    for r in &rows {
        let bus = r["busbw_gbs"].as_f64().unwrap_or(0.0);
        println!(
            "{:<15} {:>8.2} ms {:>13.2} {:>13.2} {:>11.0}%",
            r["transport"].as_str().unwrap_or("?"),
            r["seconds"].as_f64().unwrap_or(0.0) * 1e3,
            r["algbw_gbs"].as_f64().unwrap_or(0.0),
            bus,
            100.0 * bus / memcpy
        );
    }
    Ok(())
}

/// Starts `mpirun -n RANKS` on this binary as benchmark workers and reads rank 0's result.
fn mpi_row(a: &AllReduceArgs) -> Result<serde_json::Value> {
    if !sinter_dist::mpi::built_in() {
        bail!("--transport mpi: {}", sinter_dist::mpi::BUILD_HINT);
    }
    let exe = std::env::current_exe().context("finding this sinter binary for mpirun")?;
    let mut cmd = std::process::Command::new("mpirun");
    // Open MPI refuses root and more ranks than cores unless told; MPICH ignores these.
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .args(["-n", &a.ranks.to_string()])
        .arg(exe)
        .args(["bench", "allreduce", "--worker", "--transport", "mpi"])
        .args(["--mb", &a.mb.to_string(), "--iters", &a.iters.to_string()]);
    let out = cmd.output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            anyhow!("--transport mpi: mpirun is not on PATH: install Open MPI (`apt-get install openmpi-bin`)")
        } else {
            anyhow!("--transport mpi: cannot start mpirun: {e}")
        }
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let r = stdout
        .lines()
        .find_map(|l| l.split_once(RESULT_TAG).map(|(_, j)| j.to_string()));
    match (out.status.success(), r) {
        (true, Some(r)) => Ok(serde_json::from_str(&r).context("reading rank 0's result")?),
        _ => bail!(
            "mpirun -n {} failed ({}):\n{stdout}{}",
            a.ranks,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}
