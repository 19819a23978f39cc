//! sinter-dist: the distributed layer of sinter.
//!
//! * [`Communicator`]: all-reduce, reduce-scatter, all-gather, broadcast, send/recv and
//!   barrier over `f32` host buffers, with timeouts naming op, rank, peer and sequence number;
//!   [`AsyncCommunicator`] runs them on a background thread; `new_group` and [`mesh_2d`]
//!   build sub-groups for DP×TP / DP×PP meshes.
//! * Host backends ([`host`]): threads in one process ([`ThreadGroup`]) and TCP between
//!   processes ([`host::tcp`]), sharing one ring algorithm.
//! * [`rendezvous`]: torchrun / Slurm / Open MPI variables, the TCP [`store`],
//!   [`init_from_env`].
//! * [`nccl`]: the NCCL backend (device collectives, host-slice staging, device gradient
//!   buckets) and the choice between it and the host ring.
//! * [`mod@mpi`]: MPI's collectives as a third backend (`--dist-backend mpi`, cargo feature
//!   `mpi`), rank and world size from MPI itself.
//! * [`launch`]: the library behind `sinter launch`.
//! * [`scaling`]: analytic scaling model and ZeRO memory accounting.
//! * [`mod@bench`]: host all-reduce bandwidth.
//! * [`data_parallel`]: data parallelism with bucketed gradient all-reduce overlapped with
//!   backward, and gradient accumulation without communication.
//! * [`zero`]: ZeRO stage 1/2 as an [`sinter_nn::Optimizer`] whose state is gathered into full
//!   tensors; [`checkpoint_layout`]: the flat sharded layout and its mapping to and from full
//!   tensors (checkpoints independent of world size).

pub mod bench;
pub mod checkpoint_layout;
pub mod cluster_env;
pub mod comm;
pub mod data_parallel;
pub mod elastic;
pub mod error;
pub mod host;
pub mod launch;
pub mod mpi;
pub mod nccl;
pub mod pipeline;
pub mod rendezvous;
pub mod scaling;
pub mod store;
pub mod tensor_parallel;
pub mod zero;

pub use checkpoint_layout::FlatLayout;
pub use comm::{
    default_timeout, mesh_2d, mesh_2d_groups, AsyncCommunicator, Communicator, Mesh2d, ReduceOp,
    Work, DEFAULT_TIMEOUT, TIMEOUT_ENV,
};
pub use data_parallel::{DataParallel, SharedComm, StepTrace, DEFAULT_BUCKET_MB};
pub use error::{DistError, ExitKind, OpContext, Result};
pub use host::{
    run_on_threads, HostCommunicator, TcpCommunicator, TcpOptions, ThreadCommunicator, ThreadGroup,
};
pub use launch::{LaunchOptions, LaunchReport, LaunchSpec};
pub use nccl::{Backend, BackendChoice, DeviceBuckets, NcclCommunicator};
pub use rendezvous::{init, init_from_env, DistEnv, EnvSource};
pub use store::{StoreClient, StoreServer};
pub use zero::{ShardedAlgo, ZeroMemory, ZeroOptimizer, ZeroOptions};
