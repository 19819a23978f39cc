//! The collective backend of a data-parallel run (NCCL or the host ring), chosen the same on
//! every rank. Here, below the trainer's engines, rather than beside the `launch` command.

use anyhow::{Context, Result};

/// The world group of a launched job: MPI's world for `--dist-backend mpi`, else the host
/// ring reached through the launcher's rendezvous store.
pub fn join_world(
    env: &sinter_dist::DistEnv,
    choice: sinter_dist::BackendChoice,
) -> Result<Box<dyn sinter_dist::Communicator>> {
    let comm: Box<dyn sinter_dist::Communicator> = if choice == sinter_dist::BackendChoice::Mpi {
        sinter_dist::mpi::world(sinter_dist::default_timeout())?
    } else {
        Box::new(sinter_dist::init(env, &sinter_dist::TcpOptions::default())?)
    };
    Ok(comm)
}

/// Where this process stands in the job: from MPI itself for `--dist-backend mpi` (no
/// rendezvous variables needed), else from the launcher's variables.
pub fn job_env(choice: sinter_dist::BackendChoice) -> Result<sinter_dist::DistEnv> {
    if choice == sinter_dist::BackendChoice::Mpi {
        return Ok(sinter_dist::mpi::world_env()?);
    }
    sinter_dist::rendezvous::from_env()
        .context("reading the distributed environment (RANK, WORLD_SIZE, …)")
}

/// What [`pick_backend`] hands back: the shared communicator of the run, the NCCL
/// communicator for device gradient buckets, and the host ring to keep alive beside NCCL.
pub type BackendParts = (
    sinter_dist::SharedComm,
    Option<sinter_dist::NcclCommunicator>,
    Option<sinter_dist::SharedComm>,
);

/// Chooses the collective backend of a data-parallel run, the same on every rank (one
/// all-reduce over the host ring `host`), and for NCCL brings up two communicators: one
/// behind the shared host-slice queue (ZeRO, the loss all-reduce, broadcasts) and one for
/// the device gradient buckets, so the two never interleave differently across ranks.
pub fn pick_backend(
    env: &sinter_dist::DistEnv,
    host: sinter_dist::SharedComm,
    choice: sinter_dist::BackendChoice,
    device: sinter_core::Device,
    talk: bool,
) -> Result<BackendParts> {
    use sinter_dist::nccl::{agree_backend, LocalSupport};
    use sinter_dist::{Backend, BackendChoice, NcclCommunicator};
    if choice == BackendChoice::Mpi {
        if talk {
            crate::say!("distributed backend: MPI");
        }
        return Ok((host, None, None));
    }
    let ordinal = match device {
        sinter_core::Device::Cuda(o) => Some(o),
        sinter_core::Device::Cpu => None,
    };
    let local = if choice == BackendChoice::Host {
        LocalSupport {
            cuda_ordinal: ordinal,
            nccl: Err("not probed".into()),
        }
    } else {
        LocalSupport::probe(ordinal)
    };
    let (backend, note) = agree_backend(&host, choice, &local, env.node_rank())
        .with_context(|| format!("rank {}: choosing the distributed backend", env.rank))?;
    match (backend, ordinal) {
        (Backend::Nccl, Some(ord)) => {
            let dev = sinter_core::cuda::shared_device(ord)?;
            let timeout = sinter_dist::default_timeout();
            let main = NcclCommunicator::init(env, dev.clone(), "main", timeout)
                .with_context(|| format!("rank {}: bringing up NCCL", env.rank))?;
            let grads = NcclCommunicator::init(env, dev, "grads", timeout)
                .with_context(|| format!("rank {}: bringing up NCCL", env.rank))?;
            if talk {
                if let Ok(lib) = sinter_dist::nccl::nccl_library() {
                    crate::say!("distributed backend: {lib} (gradients all-reduced on the device)");
                }
            }
            Ok((
                sinter_dist::data_parallel::shared(main),
                Some(grads),
                Some(host),
            ))
        }
        _ => {
            // Only worth saying when NCCL was a possibility (a CUDA model).
            if let (true, Some(n), Some(_)) = (talk, note, ordinal) {
                eprintln!("{n}");
            }
            Ok((host, None, None))
        }
    }
}
