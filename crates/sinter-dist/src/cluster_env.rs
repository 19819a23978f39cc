//! Where is this pod in the job? Node-level variables set by Kubernetes job systems, read by
//! `sinter launch` (which then starts the node's ranks) and by a single rank started without
//! it.
//!
//! Sets, in order of precedence (the first present set gives each field, later sets fill
//! only what it lacks):
//!
//! 1. **Kubeflow Trainer v2** (`TrainJob`, also a v1 `PyTorchJob` with `nprocPerNode`):
//!    `PET_NNODES`, `PET_NPROC_PER_NODE`, `PET_NODE_RANK`, `PET_MASTER_ADDR`,
//!    `PET_MASTER_PORT`.
//! 2. **LeaderWorkerSet**: `LWS_LEADER_ADDRESS`, `LWS_GROUP_SIZE`, `LWS_WORKER_INDEX` (the
//!    leader is index 0).
//! 3. **JobSet** alone: `JOB_COMPLETION_INDEX` (set by the Job controller) with `JOBSET_NAME`
//!    and `REPLICATED_JOB_NAME` (the pod's `jobset.sigs.k8s.io/jobset-name` and
//!    `…/replicatedjob-name` annotations through the Downward API). The master is pod 0 of
//!    job 0, `<JOBSET_NAME>-<REPLICATED_JOB_NAME>-0-0.<subdomain>` (`JOBSET_SUBDOMAIN`,
//!    default the JobSet's name, as JobSet's `network.subdomain`). JobSet tells a pod
//!    nothing about the node count: give `--nnodes` (or `PET_NNODES`).
//! 4. **v1 `PyTorchJob`** and **Volcano**'s `pytorch` plugin (Volcano when `VC_TASK_INDEX`
//!    is set too): pod-level `RANK` and `WORLD_SIZE` count pods, with `MASTER_ADDR`,
//!    `MASTER_PORT`. Only read where `LOCAL_RANK` is absent: with it, `RANK` is a process's
//!    rank, set by a launcher.
//!
//! Two sets that are both present and disagree on the node rank, the node count or the
//! master are refused, with both named: the pod spec mixes two systems.

use std::collections::HashMap;

use crate::error::{DistError, Result};

/// The job system that described this pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum NodeSource {
    KubeflowTrainer,
    LeaderWorkerSet,
    JobSet,
    PyTorchJob,
    Volcano,
}

impl NodeSource {
    /// The name and the variables of the set, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            NodeSource::KubeflowTrainer => {
                "Kubeflow Trainer (PET_NNODES/PET_NODE_RANK/PET_MASTER_ADDR)"
            }
            NodeSource::LeaderWorkerSet => {
                "LeaderWorkerSet (LWS_GROUP_SIZE/LWS_WORKER_INDEX/LWS_LEADER_ADDRESS)"
            }
            NodeSource::JobSet => "JobSet (JOB_COMPLETION_INDEX/JOBSET_NAME/REPLICATED_JOB_NAME)",
            NodeSource::PyTorchJob => "PyTorchJob v1 (pod RANK/WORLD_SIZE/MASTER_ADDR)",
            NodeSource::Volcano => {
                "Volcano pytorch plugin (pod RANK/WORLD_SIZE/MASTER_ADDR, VC_TASK_INDEX)"
            }
        }
    }
}

/// This pod's place among the job's nodes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NodeEnv {
    /// The set that gave the node rank (the first present, see the module doc).
    pub source: NodeSource,
    pub node_rank: usize,
    pub nnodes: Option<usize>,
    pub nproc_per_node: Option<usize>,
    pub master_addr: Option<String>,
    pub master_port: Option<u16>,
}

fn port_of(vars: &HashMap<String, String>, k: &str) -> Result<Option<u16>> {
    get(vars, k)
        .map(|v| {
            v.parse::<u16>()
                .map_err(|_| DistError::Env(format!("{k}=`{v}` is not a port number")))
        })
        .transpose()
}

fn trainer(vars: &HashMap<String, String>) -> Result<Option<NodeEnv>> {
    let Some(node_rank) = num(vars, "PET_NODE_RANK")? else {
        return Ok(None);
    };
    let nproc = match get(vars, "PET_NPROC_PER_NODE") {
        None => None,
        Some(v) => Some(v.parse::<usize>().map_err(|_| {
            DistError::Env(format!(
                "PET_NPROC_PER_NODE=`{v}`: sinter needs a number of ranks per node; set the TrainJob's `trainer.numProcPerNode` (or the runtime's `torch.numProcPerNode`) to an integer, or pass --nproc-per-node"
            ))
        })?),
    };
    Ok(Some(NodeEnv {
        source: NodeSource::KubeflowTrainer,
        node_rank,
        nnodes: num(vars, "PET_NNODES")?,
        nproc_per_node: nproc,
        master_addr: get(vars, "PET_MASTER_ADDR").map(str::to_string),
        master_port: port_of(vars, "PET_MASTER_PORT")?,
    }))
}

fn lws(vars: &HashMap<String, String>) -> Result<Option<NodeEnv>> {
    let Some(node_rank) = num(vars, "LWS_WORKER_INDEX")? else {
        return Ok(None);
    };
    Ok(Some(NodeEnv {
        source: NodeSource::LeaderWorkerSet,
        node_rank,
        nnodes: num(vars, "LWS_GROUP_SIZE")?,
        nproc_per_node: None,
        master_addr: get(vars, "LWS_LEADER_ADDRESS").map(str::to_string),
        master_port: port_of(vars, "MASTER_PORT")?,
    }))
}

fn jobset(vars: &HashMap<String, String>) -> Result<Option<NodeEnv>> {
    let (Some(index), Some(js)) = (num(vars, "JOB_COMPLETION_INDEX")?, get(vars, "JOBSET_NAME"))
    else {
        return Ok(None);
    };
    let rj = get(vars, "REPLICATED_JOB_NAME").ok_or_else(|| {
        DistError::Env(format!("JOBSET_NAME={js} is set but REPLICATED_JOB_NAME is not: expose the pod's `jobset.sigs.k8s.io/replicatedjob-name` annotation as REPLICATED_JOB_NAME (Downward API), so the master's host name `<jobset>-<replicated job>-0-0.<subdomain>` can be built"))
    })?;
    // Nodes are the pods of one Job (completions = nodes); a second Job of the replicated
    // job would repeat the completion indices.
    if let Some(j) = num(vars, "JOB_INDEX")?.filter(|&j| j != 0) {
        return Err(DistError::Env(format!("JOB_INDEX={j}: sinter reads the node rank from JOB_COMPLETION_INDEX, so a JobSet's nodes must be the pods of one Job (replicas: 1, completions = parallelism = nodes)")));
    }
    let sub = get(vars, "JOBSET_SUBDOMAIN").unwrap_or(js);
    Ok(Some(NodeEnv {
        source: NodeSource::JobSet,
        node_rank: index,
        nnodes: None,
        nproc_per_node: None,
        master_addr: Some(format!("{js}-{rj}-0-0.{sub}")),
        master_port: port_of(vars, "MASTER_PORT")?,
    }))
}

fn pytorchjob(vars: &HashMap<String, String>) -> Result<Option<NodeEnv>> {
    if get(vars, "LOCAL_RANK").is_some() {
        return Ok(None);
    }
    let (Some(rank), Some(world), Some(master)) = (
        num(vars, "RANK")?,
        num(vars, "WORLD_SIZE")?,
        get(vars, "MASTER_ADDR"),
    ) else {
        return Ok(None);
    };
    let source = if get(vars, "VC_TASK_INDEX").is_some() {
        NodeSource::Volcano
    } else {
        NodeSource::PyTorchJob
    };
    // A newer PyTorchJob with `nprocPerNode` also sets PET_*, and its WORLD_SIZE may count
    // processes rather than pods: then the node count is PET_NNODES's alone.
    let pods = get(vars, "PET_NPROC_PER_NODE").is_none().then_some(world);
    Ok(Some(NodeEnv {
        source,
        node_rank: rank,
        nnodes: pods,
        nproc_per_node: None,
        master_addr: Some(master.to_string()),
        master_port: port_of(vars, "MASTER_PORT")?,
    }))
}

/// Refuses two sets that give different values for the same field.
fn check_agree(a: &NodeEnv, b: &NodeEnv) -> Result<()> {
    let clash = |what: &str, x: String, y: String| {
        DistError::Env(format!(
            "conflicting job variables: {} says {what} {x}, {} says {y}; the pod spec mixes two job systems, remove one set (or override with --node-rank/--nnodes/--master-addr)",
            a.source.describe(),
            b.source.describe()
        ))
    };
    if a.node_rank != b.node_rank {
        return Err(clash(
            "node rank",
            a.node_rank.to_string(),
            b.node_rank.to_string(),
        ));
    }
    if let (Some(x), Some(y)) = (a.nnodes, b.nnodes) {
        if x != y {
            return Err(clash("node count", x.to_string(), y.to_string()));
        }
    }
    if let (Some(x), Some(y)) = (&a.master_addr, &b.master_addr) {
        if x != y {
            return Err(clash("master", x.clone(), y.clone()));
        }
    }
    Ok(())
}

/// The node-level variables of `vars` (see the module doc for the sets and their
/// precedence); `None` when no set is present. A pure function of the map.
pub fn parse_node_env(vars: &HashMap<String, String>) -> Result<Option<NodeEnv>> {
    let sets: Vec<NodeEnv> = [trainer(vars)?, lws(vars)?, jobset(vars)?, pytorchjob(vars)?]
        .into_iter()
        .flatten()
        .collect();
    let Some((first, rest)) = sets.split_first() else {
        return Ok(None);
    };
    let mut env = first.clone();
    for other in rest {
        check_agree(first, other)?;
        env.nnodes = env.nnodes.or(other.nnodes);
        env.nproc_per_node = env.nproc_per_node.or(other.nproc_per_node);
        env.master_addr = env.master_addr.or_else(|| other.master_addr.clone());
        env.master_port = env.master_port.or(other.master_port);
    }
    if let Some(n) = env.nnodes {
        if env.node_rank >= n {
            return Err(DistError::Env(format!(
                "{}: node rank {} is not below the node count {n}",
                env.source.describe(),
                env.node_rank
            )));
        }
    }
    Ok(Some(env))
}

pub(crate) fn get<'a>(vars: &'a HashMap<String, String>, k: &str) -> Option<&'a str> {
    vars.get(k).map(|s| s.trim()).filter(|s| !s.is_empty())
}

pub(crate) fn num(vars: &HashMap<String, String>, k: &str) -> Result<Option<usize>> {
    match get(vars, k) {
        None => Ok(None),
        Some(v) => v
            .parse::<usize>()
            .map(Some)
            .map_err(|_| DistError::Env(format!("{k}=`{v}` is not a non-negative integer"))),
    }
}

/// This machine's host name (`?` if unknown), for messages.
pub(crate) fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    if ok && end > 0 {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "?".into()
    }
}
