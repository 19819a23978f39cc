//! MPI as a collective backend (`--dist-backend mpi`), through rsmpi, built only with the
//! crate's `mpi` feature (Open MPI or MPICH and libclang at build time).
//!
//! Rank and world size come from MPI itself, so `mpirun -n N sinter train --dist-backend mpi …`
//! needs no rendezvous store. The communicator implements [`Communicator`] with MPI's own
//! collectives (all-reduce, reduce-scatter, all-gather, broadcast, barrier) and buffered
//! point-to-point sends for the pipeline.
//!
//! Timeouts: MPI cannot cancel a collective, so a call that outlives the communicator's timeout
//! cannot return an error while MPI still holds the caller's buffer. A watchdog thread instead
//! prints the same message the host ring would return (op, rank, sequence number, group) and
//! ends the whole job with `MPI_Abort`.
//!
//! Without the feature every entry point returns an error saying how to build it.

use std::time::Duration;

use crate::comm::Communicator;
use crate::error::Result;
use crate::rendezvous::DistEnv;

/// What to do when MPI is asked for in a build without it.
pub const BUILD_HINT: &str = "this sinter was built without MPI: rebuild with `cargo build --release --features sinter/mpi` (needs Open MPI and libclang: `apt-get install openmpi-bin libopenmpi-dev libclang-dev`), or pass --dist-backend host";

/// True when this build has the MPI backend.
pub fn built_in() -> bool {
    cfg!(feature = "mpi")
}

/// True when this process was started by an MPI launcher (Open MPI's `mpirun`, or a PMI/PMIx
/// launcher such as MPICH's Hydra or Slurm's `srun --mpi=pmix`) rather than by `sinter launch`
/// or torchrun, whose `RANK`/`WORLD_SIZE` take precedence.
pub fn started_by_mpirun(vars: &std::collections::HashMap<String, String>) -> bool {
    let set = |k: &str| vars.get(k).is_some_and(|v| !v.trim().is_empty());
    !set("RANK")
        && !set("WORLD_SIZE")
        && ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
            .iter()
            .any(|k| set(k))
}

/// What `--dist-backend auto` means for this process: MPI's own collectives when MPI started
/// it and this build has MPI (an MPI job then needs no rendezvous address), otherwise `auto` as
/// before (NCCL on GPUs, else the host ring). Any explicit choice is kept.
pub fn resolve_auto(
    choice: crate::BackendChoice,
    vars: &std::collections::HashMap<String, String>,
) -> crate::BackendChoice {
    match choice {
        crate::BackendChoice::Auto if built_in() && started_by_mpirun(vars) => {
            crate::BackendChoice::Mpi
        }
        c => c,
    }
}

/// One line for `sinter info`: whether this build has the MPI backend, and which library.
pub fn describe() -> String {
    #[cfg(feature = "mpi")]
    {
        format!(
            "mpi (built in: {}; `--dist-backend auto` uses it under mpirun)",
            // "Open MPI v4.1.4, package: …": the name and version are enough here.
            imp::mpi_library().split(',').next().unwrap_or_default()
        )
    }
    #[cfg(not(feature = "mpi"))]
    {
        "mpi not built in (rebuild with `--features sinter/mpi`)".into()
    }
}

#[cfg(feature = "mpi")]
mod imp;
mod world;
pub use world::check_world;
#[cfg(feature = "mpi")]
mod watchdog;

#[cfg(feature = "mpi")]
pub use imp::{mpi_library, MpiCommunicator};

/// The world communicator (initialises MPI on first use; every rank calls it).
pub fn world(timeout: Duration) -> Result<Box<dyn Communicator>> {
    #[cfg(feature = "mpi")]
    {
        Ok(Box::new(imp::MpiCommunicator::world(timeout)?))
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = timeout;
        Err(crate::error::DistError::Backend(format!(
            "--dist-backend mpi: {BUILD_HINT}"
        )))
    }
}

/// This process's place in the job as MPI sees it (rank, world size, ranks on this node).
/// Refuses a launch whose own variables (torchrun's `WORLD_SIZE`, Slurm's, a Kubernetes job's)
/// count a different world, e.g. ranks started by `sinter launch`, each of which MPI sees as
/// a world of one.
pub fn world_env() -> Result<DistEnv> {
    #[cfg(feature = "mpi")]
    {
        imp::world_env()
    }
    #[cfg(not(feature = "mpi"))]
    {
        Err(crate::error::DistError::Backend(format!(
            "--dist-backend mpi: {BUILD_HINT}"
        )))
    }
}

/// Ends MPI at the end of the process: `ok` finalises (every rank must get here), otherwise
/// aborts the job so that the other ranks stop at once instead of waiting in a collective.
/// Does nothing when MPI was never started.
pub fn finish(ok: bool) {
    #[cfg(feature = "mpi")]
    imp::finish(ok);
    #[cfg(not(feature = "mpi"))]
    let _ = ok;
}
