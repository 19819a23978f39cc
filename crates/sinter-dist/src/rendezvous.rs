//! Where am I in the job? Reads rank / world size / local rank / master address from the
//! variables set by torchrun (and `sinter launch`), Slurm or Open MPI, and brings up the TCP
//! communicator through the store served by rank 0.

use std::collections::HashMap;

use crate::cluster_env::{get, host_name, num, parse_node_env, NodeEnv, NodeSource};
use crate::error::{DistError, Result};
use crate::host::tcp::{self, TcpOptions};
use crate::host::HostCommunicator;
use crate::store::{StoreClient, StoreServer};

/// Port used when none is given.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// Which launcher the variables came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum EnvSource {
    /// `RANK`, `WORLD_SIZE`, … (torchrun, `sinter launch`).
    Torchrun,
    /// `SLURM_PROCID`, `SLURM_NTASKS`, …
    Slurm,
    /// `OMPI_COMM_WORLD_RANK`, …
    OpenMpi,
    /// MPI itself (`--dist-backend mpi`): `MPI_Comm_rank`/`MPI_Comm_size`.
    Mpi,
    /// A Kubernetes job system's node-level variables, one rank per pod
    /// ([`crate::cluster_env`]).
    Cluster(NodeSource),
    /// Nothing set: a single process.
    Single,
}

/// This process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DistEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    /// Host of rank 0's store (`None` only for a single process).
    pub master_addr: Option<String>,
    pub master_port: u16,
    pub source: EnvSource,
}

impl DistEnv {
    /// A single process: rank 0 of 1.
    pub fn single() -> DistEnv {
        DistEnv {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master_addr: None,
            master_port: DEFAULT_MASTER_PORT,
            source: EnvSource::Single,
        }
    }

    /// Index of this process's node (`rank / local_world_size`).
    pub fn node_rank(&self) -> usize {
        self.rank / self.local_world_size.max(1)
    }

    /// `master_addr:master_port`.
    pub fn master_endpoint(&self) -> Option<String> {
        self.master_addr.as_ref().map(|a| {
            if a.contains(':') && !a.starts_with('[') {
                format!("[{a}]:{}", self.master_port)
            } else {
                format!("{a}:{}", self.master_port)
            }
        })
    }
}

fn port(vars: &HashMap<String, String>) -> Result<u16> {
    match get(vars, "MASTER_PORT") {
        None => Ok(DEFAULT_MASTER_PORT),
        Some(v) => v
            .parse::<u16>()
            .map_err(|_| DistError::Env(format!("MASTER_PORT=`{v}` is not a port number"))),
    }
}

/// Leading count of a Slurm tasks-per-node value: `8`, `8(x4)`, `2(x3),1` → 8, 8, 2.
fn leading_count(v: &str) -> Option<usize> {
    let end = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    v[..end].parse().ok()
}

/// Parses the job's place from an environment map. Precedence: torchrun variables
/// (`RANK` + `WORLD_SIZE`, as a launcher, a v1 PyTorchJob or Volcano set them), then a
/// Kubernetes job system's node-level variables with one rank per pod
/// ([`crate::cluster_env`]: Kubeflow Trainer `PET_*`, LeaderWorkerSet, JobSet), then Slurm
/// (`SLURM_PROCID` + `SLURM_NTASKS`), then Open MPI (`OMPI_COMM_WORLD_RANK` +
/// `OMPI_COMM_WORLD_SIZE`), else a single process. A rank started by a launcher ignores the
/// node-level variables it inherits: the launcher resolved them (flags may have overridden
/// them). `MASTER_ADDR`/`MASTER_PORT` override the derived master for Slurm and Open MPI.
pub fn parse_env(vars: &HashMap<String, String>) -> Result<DistEnv> {
    let env = if let (Some(rank), Some(world)) = (num(vars, "RANK")?, num(vars, "WORLD_SIZE")?) {
        let local_rank = num(vars, "LOCAL_RANK")?.unwrap_or(rank);
        // Without LOCAL_WORLD_SIZE assume a single node.
        let local_world = num(vars, "LOCAL_WORLD_SIZE")?.unwrap_or(world);
        let master = get(vars, "MASTER_ADDR").map(str::to_string);
        if world > 1 && master.is_none() {
            return Err(DistError::Env(
                "RANK/WORLD_SIZE are set but MASTER_ADDR is not".into(),
            ));
        }
        DistEnv {
            rank,
            world_size: world,
            local_rank,
            local_world_size: local_world,
            master_addr: master,
            master_port: port(vars)?,
            source: EnvSource::Torchrun,
        }
    } else if let Some(node) = parse_node_env(vars)? {
        one_rank_per_pod(&node)?
    } else if let (Some(rank), Some(world)) =
        (num(vars, "SLURM_PROCID")?, num(vars, "SLURM_NTASKS")?)
    {
        let local_rank = num(vars, "SLURM_LOCALID")?.unwrap_or(0);
        let nodes = match num(vars, "SLURM_JOB_NUM_NODES")? {
            Some(n) => Some(n),
            None => num(vars, "SLURM_NNODES")?,
        };
        let local_world = get(vars, "SLURM_NTASKS_PER_NODE")
            .or_else(|| get(vars, "SLURM_TASKS_PER_NODE"))
            .and_then(leading_count)
            .or_else(|| nodes.map(|n| world.div_ceil(n.max(1))))
            .unwrap_or(1);
        let master = match get(vars, "MASTER_ADDR") {
            Some(a) => Some(a.to_string()),
            None => match get(vars, "SLURM_JOB_NODELIST").or_else(|| get(vars, "SLURM_NODELIST")) {
                Some(list) => Some(first_host(list)?),
                None if world == 1 => None,
                None => {
                    return Err(DistError::Env(
                        "Slurm job without SLURM_JOB_NODELIST/SLURM_NODELIST or MASTER_ADDR".into(),
                    ))
                }
            },
        };
        DistEnv {
            rank,
            world_size: world,
            local_rank,
            local_world_size: local_world,
            master_addr: master,
            master_port: port(vars)?,
            source: EnvSource::Slurm,
        }
    } else if let (Some(rank), Some(world)) = (
        num(vars, "OMPI_COMM_WORLD_RANK")?,
        num(vars, "OMPI_COMM_WORLD_SIZE")?,
    ) {
        let local_rank = num(vars, "OMPI_COMM_WORLD_LOCAL_RANK")?.unwrap_or(0);
        let local_world = num(vars, "OMPI_COMM_WORLD_LOCAL_SIZE")?.unwrap_or(1);
        let master = match get(vars, "MASTER_ADDR") {
            Some(a) => Some(a.to_string()),
            // All ranks on this host: the master is local.
            None if local_world == world => Some("127.0.0.1".to_string()),
            None if world == 1 => None,
            None => {
                return Err(DistError::Env(
                    "Open MPI job spanning several hosts: set MASTER_ADDR (e.g. `mpirun -x MASTER_ADDR=<host of rank 0>`) for the host ring, or use MPI's own collectives with `--dist-backend mpi` (a build with `--features sinter/mpi`)".into(),
                ))
            }
        };
        DistEnv {
            rank,
            world_size: world,
            local_rank,
            local_world_size: local_world,
            master_addr: master,
            master_port: port(vars)?,
            source: EnvSource::OpenMpi,
        }
    } else {
        DistEnv::single()
    };
    if env.world_size == 0 || env.rank >= env.world_size {
        return Err(DistError::Env(format!(
            "rank {} is not below world size {}",
            env.rank, env.world_size
        )));
    }
    if env.local_world_size == 0 || env.local_rank >= env.local_world_size {
        return Err(DistError::Env(format!(
            "local rank {} is not below local world size {}",
            env.local_rank, env.local_world_size
        )));
    }
    Ok(env)
}

/// A rank started straight in a pod (no `sinter launch`): rank = node rank.
fn one_rank_per_pod(node: &NodeEnv) -> Result<DistEnv> {
    let what = node.source.describe();
    if let Some(n) = node.nproc_per_node.filter(|&n| n != 1) {
        return Err(DistError::Env(format!("{what} asks for {n} ranks per node: start them with `sinter launch -- <command>`, which reads these variables")));
    }
    let world = node.nnodes.ok_or_else(|| {
        DistError::Env(format!(
            "{what} gives no node count: set PET_NNODES, or start with `sinter launch --nnodes N`"
        ))
    })?;
    let master = node.master_addr.clone();
    if world > 1 && master.is_none() {
        return Err(DistError::Env(format!(
            "{what} gives no master address: set MASTER_ADDR"
        )));
    }
    Ok(DistEnv {
        rank: node.node_rank,
        world_size: world,
        local_rank: 0,
        local_world_size: 1,
        master_addr: master,
        master_port: node.master_port.unwrap_or(DEFAULT_MASTER_PORT),
        source: EnvSource::Cluster(node.source),
    })
}

/// [`parse_env`] over the process environment.
pub fn from_env() -> Result<DistEnv> {
    parse_env(&std::env::vars().collect())
}

/// Splits at commas outside brackets.
fn split_top(s: &str) -> Result<Vec<&str>> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth < 0 {
                    return Err(DistError::Env(format!("unbalanced `]` in node list `{s}`")));
                }
            }
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(DistError::Env(format!("unbalanced `[` in node list `{s}`")));
    }
    out.push(&s[start..]);
    Ok(out
        .into_iter()
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .collect())
}

/// Expands one bracket range list `01-04,07` into zero-padded numbers.
fn expand_ranges(spec: &str, whole: &str) -> Result<Vec<String>> {
    let bad = || DistError::Env(format!("bad range `[{spec}]` in node list `{whole}`"));
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        if a.is_empty()
            || !a.bytes().all(|c| c.is_ascii_digit())
            || !b.bytes().all(|c| c.is_ascii_digit())
            || b.is_empty()
        {
            return Err(bad());
        }
        let width = a.len();
        let lo: u64 = a.parse().map_err(|_| bad())?;
        let hi: u64 = b.parse().map_err(|_| bad())?;
        if hi < lo || hi - lo > 100_000 {
            return Err(bad());
        }
        for v in lo..=hi {
            out.push(format!("{v:0width$}"));
        }
    }
    Ok(out)
}

/// Expands a Slurm host list: `gpu[01-04,07]` → gpu01 gpu02 gpu03 gpu04 gpu07;
/// `a[1-2]-ib,b3` → a1-ib a2-ib b3; several bracket groups expand as a cartesian product
/// (`r[1-2]n[1-2]` → r1n1 r1n2 r2n1 r2n2).
pub fn expand_nodelist(list: &str) -> Result<Vec<String>> {
    let mut hosts = Vec::new();
    for item in split_top(list)? {
        let mut partial = vec![String::new()];
        let mut rest = item;
        while !rest.is_empty() {
            match rest.find('[') {
                None => {
                    for p in &mut partial {
                        p.push_str(rest);
                    }
                    rest = "";
                }
                Some(open) => {
                    let close = rest[open..].find(']').map(|c| c + open).ok_or_else(|| {
                        DistError::Env(format!("unbalanced `[` in node list `{list}`"))
                    })?;
                    let prefix = &rest[..open];
                    let nums = expand_ranges(&rest[open + 1..close], list)?;
                    let mut next = Vec::with_capacity(partial.len() * nums.len());
                    for p in &partial {
                        for n in &nums {
                            next.push(format!("{p}{prefix}{n}"));
                        }
                    }
                    partial = next;
                    rest = &rest[close + 1..];
                }
            }
        }
        hosts.extend(partial);
    }
    if hosts.is_empty() {
        return Err(DistError::Env(format!("empty node list `{list}`")));
    }
    Ok(hosts)
}

/// The first host of a (possibly compressed) Slurm node list.
pub fn first_host(list: &str) -> Result<String> {
    // Only the first item needs expanding.
    let first = split_top(list)?
        .into_iter()
        .next()
        .ok_or_else(|| DistError::Env(format!("empty node list `{list}`")))?;
    Ok(expand_nodelist(first)?.swap_remove(0))
}

/// Brings up the TCP communicator for `env`: rank 0 serves the store at
/// `master_addr:master_port` (kept alive inside its communicator), every rank registers and
/// connects to all others. World size 1 needs no master.
pub fn init(env: &DistEnv, opts: &TcpOptions) -> Result<HostCommunicator> {
    if env.world_size == 1 {
        return Ok(tcp::single(opts.timeout));
    }
    let endpoint = env
        .master_endpoint()
        .ok_or_else(|| DistError::Env("no master address for a multi-rank job".into()))?;
    let server = if env.rank == 0 {
        Some(match StoreServer::bind(endpoint.as_str()) {
            Ok(s) => s,
            // MASTER_ADDR may name this host by an address it cannot bind (NAT, alias).
            Err(_) => StoreServer::bind(("0.0.0.0", env.master_port))?,
        })
    } else {
        None
    };
    let store = StoreClient::connect(&endpoint, opts.connect_timeout).map_err(|e| {
        DistError::Store(format!(
            "rank {} of {} (host {}) could not reach rank 0's rendezvous: {e}",
            env.rank,
            env.world_size,
            host_name()
        ))
    })?;
    tcp::connect_with(env.rank, env.world_size, store, server, opts)
}

/// [`init`] from the process environment with default options (timeout from
/// `SINTER_COLLECTIVE_TIMEOUT_S`, default 300 s).
pub fn init_from_env() -> Result<HostCommunicator> {
    init(&from_env()?, &TcpOptions::default())
}
