//! Whether MPI's world is the job the launcher meant (kept apart from the MPI calls so that
//! it is tested in every build).

use crate::error::{DistError, Result};
use crate::rendezvous::DistEnv;

/// The check behind [`super::world_env`]: `launcher` is what the launcher's variables say (if any
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
