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
