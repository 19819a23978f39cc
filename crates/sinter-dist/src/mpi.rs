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
use crate::error::{DistError, Result};
use crate::rendezvous::DistEnv;

/// What to do when MPI is asked for in a build without it.
pub const BUILD_HINT: &str = "this sinter was built without MPI: rebuild with `cargo build --release --features sinter/mpi` (needs Open MPI and libclang: `apt-get install openmpi-bin libopenmpi-dev libclang-dev`), or pass --dist-backend host";

/// True when this build has the MPI backend.
pub fn built_in() -> bool {
    cfg!(feature = "mpi")
}

#[cfg(feature = "mpi")]
mod imp;
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
        Err(DistError::Backend(format!(
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
        Err(DistError::Backend(format!(
            "--dist-backend mpi: {BUILD_HINT}"
        )))
    }
}

/// The check behind [`world_env`]: `launcher` is what the launcher's variables say (if any
/// launcher set them), `rank`/`size` what MPI says.
pub fn check_world(launcher: Option<&DistEnv>, rank: usize, size: usize) -> Result<()> {
    use crate::rendezvous::EnvSource;
    let Some(l) = launcher else { return Ok(()) };
    // Only launchers that start separate processes themselves: an `mpirun` inside a Slurm
    // allocation may well start fewer ranks than the allocation's tasks.
    if !matches!(l.source, EnvSource::Torchrun | EnvSource::Cluster(_)) || l.world_size == size {
        return Ok(());
    }
    Err(DistError::Env(format!(
        "--dist-backend mpi: the launcher's variables ({:?}) count {} ranks but MPI sees rank {rank} of a world of {size}; start the ranks with `mpirun -n {} sinter …` rather than `sinter launch`/torchrun, or pass --dist-backend host",
        l.source, l.world_size, l.world_size
    )))
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
