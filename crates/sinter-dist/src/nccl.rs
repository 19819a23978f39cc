//! NCCL backend: collectives on device memory through `libnccl` (loaded at run time).
//!
//! * [`NcclCommunicator`] implements the host-slice [`Communicator`] by staging through device
//!   memory, so every strategy (data parallel, ZeRO, tensor and pipeline parallel) runs over it
//!   unchanged; [`NcclCommunicator::all_reduce_device`] works on device memory in place, which
//!   is what [`DeviceBuckets`] uses to all-reduce CUDA gradients without host copies.
//! * Every call runs on the communicator's own stream, ordered after the compute stream with an
//!   event (recorded on compute, waited on by the NCCL stream) and back again before the result
//!   is used (recorded on the NCCL stream, waited on by compute).
//! * Completion is polled against the collective timeout; on expiry the communicator is aborted
//!   and the error names op, rank and sequence number like the host backends'.
//! * `send` waits (bounded by the timeout) until the peer has received, as NCCL's send only
//!   completes then: two ranks that both send before receiving would time out, so the pipeline
//!   schedules keep using the host ring (`sinter train --tp/--pp` does).
//! * Communicator creation (`ncclCommInitRank`) blocks until every member joined; the id
//!   exchange before it is bounded by the timeout, the creation itself is not.
//! * The unique id is made by rank 0 and handed to the others through the TCP store
//!   ([`exchange_id`]); [`select_backend`] decides between NCCL and the host ring, the same way
//!   on every rank.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sinter_core::{DType, Tensor, TensorId};
use sinter_cuda::comm::{self, Comm, Library, RedOp, UniqueId};
use sinter_cuda::{CudaDevice, DevSlice, DeviceBuffer, Event, Pool, Stream};

use crate::checkpoint_layout::FlatLayout;
use crate::comm::{AsyncCommunicator, Communicator, ReduceOp};
use crate::error::{DistError, OpContext, Result};
use crate::rendezvous::DistEnv;
use crate::store::StoreClient;

/// What to do when NCCL cannot be loaded.
pub use sinter_cuda::comm::NCCL_HINT;

/// Which communication backend the user asked for (`--dist-backend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// NCCL when every rank's model is on CUDA and NCCL loads everywhere, else the host ring.
    #[default]
    Auto,
    /// NCCL or an error saying why not.
    Nccl,
    /// The host ring over TCP (or threads).
    Host,
    /// MPI's collectives ([`crate::mpi`]); ranks from MPI itself (started by `mpirun`).
    Mpi,
}

impl std::str::FromStr for BackendChoice {
    type Err = DistError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(BackendChoice::Auto),
            "nccl" => Ok(BackendChoice::Nccl),
            "host" | "tcp" | "gloo" => Ok(BackendChoice::Host),
            "mpi" => Ok(BackendChoice::Mpi),
            other => Err(DistError::InvalidArgument(format!(
                "unknown distributed backend '{other}': use auto, nccl, host or mpi"
            ))),
        }
    }
}

/// The backend every rank ended up with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Nccl,
    Host,
}

/// What this rank can offer: its model's device and whether NCCL loads here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalSupport {
    /// The model lives on this CUDA device (`None`: on the CPU).
    pub cuda_ordinal: Option<usize>,
    /// `Ok(version)` when NCCL loads, else why not (with [`NCCL_HINT`]).
    pub nccl: std::result::Result<(u32, u32, u32), String>,
}

impl LocalSupport {
    /// Probes NCCL (never panics when the libraries are missing).
    pub fn probe(cuda_ordinal: Option<usize>) -> LocalSupport {
        LocalSupport {
            cuda_ordinal,
            nccl: nccl_status(),
        }
    }
    fn usable(&self) -> bool {
        self.cuda_ordinal.is_some() && self.nccl.is_ok()
    }
}

/// NCCL's version if the driver and NCCL both load, else an explanation with the fix. With
/// emulated CUDA devices the collectives are the emulator's and the version is (0, 0, 0); say
/// which with [`nccl_library`].
pub fn nccl_status() -> std::result::Result<(u32, u32, u32), String> {
    nccl_library().map(|l| match l {
        Library::Nccl(v) => v,
        Library::Emulated => (0, 0, 0),
    })
}

/// What serves NCCL's collectives here (its `Display` names it for logs), or why nothing can.
pub fn nccl_library() -> std::result::Result<Library, String> {
    comm::library()
}

pub use sinter_cuda::comm::split_nccl_version;

/// Decides the backend from this rank's support and whether *every* rank can use NCCL (the
/// caller agrees on that with one collective, see [`agree_backend`]). Returns the backend and,
/// for `auto` falling back to the host, a note saying why.
pub fn select_backend(
    choice: BackendChoice,
    local: &LocalSupport,
    all_ranks_usable: bool,
    rank: usize,
) -> Result<(Backend, Option<String>)> {
    let local_why = || -> Option<String> {
        if local.cuda_ordinal.is_none() {
            return Some(format!(
                "rank {rank} trains on the CPU (NCCL needs the model on a CUDA device: pass --device cuda)"
            ));
        }
        local
            .nccl
            .as_ref()
            .err()
            .map(|e| format!("rank {rank}: {e}"))
    };
    match choice {
        BackendChoice::Host => Ok((Backend::Host, None)),
        // MPI is chosen before any host ring exists (ranks come from MPI); nothing to agree.
        BackendChoice::Mpi => Err(DistError::Backend(
            "--dist-backend mpi does not go through the host ring's backend agreement".into(),
        )),
        BackendChoice::Nccl => {
            if let Some(why) = local_why() {
                return Err(DistError::Backend(format!(
                    "--dist-backend nccl is not usable: {why}; or pass --dist-backend host"
                )));
            }
            if !all_ranks_usable {
                return Err(DistError::Backend(format!(
                    "--dist-backend nccl is not usable: another rank cannot use NCCL (its own error says why); rank {rank} could; or pass --dist-backend host"
                )));
            }
            Ok((Backend::Nccl, None))
        }
        BackendChoice::Auto => {
            if all_ranks_usable {
                return Ok((Backend::Nccl, None));
            }
            let why = local_why().unwrap_or_else(|| "another rank cannot use NCCL".into());
            Ok((
                Backend::Host,
                Some(format!("distributed backend: host ring ({why})")),
            ))
        }
    }
}

/// The first two ranks that would drive the same GPU (same node, same CUDA ordinal), which
/// one NCCL communicator does not allow: `places[r]` is rank `r`'s (node, ordinal).
pub fn shared_gpu(places: &[(usize, Option<usize>)]) -> Option<String> {
    for (a, pa) in places.iter().enumerate() {
        let (na, Some(oa)) = *pa else { continue };
        if let Some(k) = places[a + 1..].iter().position(|p| p == pa) {
            let b = a + 1 + k;
            return Some(format!(
                "ranks {a} and {b} both use cuda:{oa} on node {na}, and NCCL needs one GPU per rank (give each rank its own --device cuda:N)"
            ));
        }
    }
    None
}

/// Every rank contributes whether it can use NCCL and which GPU it drives (one all-gather on
/// `comm`; `node` is this rank's node index), then all decide the same way with
/// [`select_backend`]. Ranks sharing a GPU rule NCCL out (auto falls back to the host ring).
pub fn agree_backend(
    comm: &AsyncCommunicator,
    choice: BackendChoice,
    local: &LocalSupport,
    node: usize,
) -> Result<(Backend, Option<String>)> {
    if choice == BackendChoice::Host {
        return select_backend(choice, local, false, comm.rank());
    }
    if comm.world_size() <= 1 {
        return select_backend(choice, local, local.usable(), comm.rank());
    }
    let mine = vec![
        f32::from(u8::from(local.usable())),
        node as f32,
        local.cuda_ordinal.map_or(-1.0, |o| o as f32),
    ];
    let all = comm.all_gather(mine).wait()?;
    let usable = all.chunks(3).all(|c| c[0] == 1.0);
    let places: Vec<(usize, Option<usize>)> = all
        .chunks(3)
        .map(|c| (c[1] as usize, (c[2] >= 0.0).then_some(c[2] as usize)))
        .collect();
    if usable {
        if let Some(why) = shared_gpu(&places) {
            return match choice {
                BackendChoice::Nccl => Err(DistError::Backend(format!(
                    "--dist-backend nccl is not usable: {why}; or pass --dist-backend host"
                ))),
                _ => Ok((
                    Backend::Host,
                    Some(format!("distributed backend: host ring ({why})")),
                )),
            };
        }
    }
    select_backend(choice, local, usable, comm.rank())
}

/// Bytes of an NCCL unique id.
pub const ID_BYTES: usize = 128;

/// Rank 0 makes the id with `make` and publishes it under `key`; the others wait for it (up to
/// `timeout`). Every rank returns the same bytes.
pub fn exchange_id(
    store: &StoreClient,
    key: &str,
    rank: usize,
    timeout: Duration,
    make: impl FnOnce() -> Result<[u8; ID_BYTES]>,
) -> Result<[u8; ID_BYTES]> {
    if rank == 0 {
        let id = make()?;
        store.set(key, &id)?;
        return Ok(id);
    }
    let ctx = OpContext {
        op: "nccl_id_exchange",
        seq: 1,
        rank,
        group: None,
    };
    let v = store.wait(key, timeout)?.ok_or(DistError::Timeout {
        ctx: ctx.clone(),
        peer: Some(0),
        after: timeout,
    })?;
    v.as_slice().try_into().map_err(|_| DistError::Mismatch {
        ctx,
        peer: 0,
        detail: format!(
            "the NCCL id under '{key}' has {} bytes, expected {ID_BYTES}",
            v.len()
        ),
    })
}

/// A fresh NCCL unique id.
pub fn new_unique_id() -> Result<[u8; ID_BYTES]> {
    comm::unique_id().map_err(|e| cuda_err("ncclGetUniqueId", e))
}

fn cuda_err(op: &str, e: sinter_cuda::CudaError) -> DistError {
    DistError::Backend(format!("{op}: {e}"))
}

fn red_op(op: ReduceOp) -> RedOp {
    match op {
        ReduceOp::Sum => RedOp::Sum,
        ReduceOp::Avg => RedOp::Avg,
    }
}

/// A collective enqueued on the NCCL stream and not yet waited for.
pub struct Pending {
    ctx: OpContext,
    done: Event,
}

/// An NCCL communicator of one rank, on the process-wide [`CudaDevice`] of its ordinal.
pub struct NcclCommunicator {
    dev: Arc<CudaDevice>,
    comm: Comm,
    stream: Stream,
    rank: usize,
    /// Global rank of each member.
    members: Vec<usize>,
    group: Option<String>,
    /// Store key prefix of this communicator (sub-groups publish their ids below it).
    name: String,
    store: Option<Arc<StoreClient>>,
    splits: HashMap<Vec<usize>, u64>,
    seq: u64,
    p2p: HashMap<(bool, usize), u64>,
    timeout: Duration,
    staging: [Option<DeviceBuffer>; 2],
    /// Set once the communicator was aborted (after a timeout or an asynchronous error).
    broken: Option<String>,
}

impl NcclCommunicator {
    /// Joins the world group of `env` on CUDA device `dev` (the process-wide one, so that its
    /// compute stream is the tensors'). `name` keeps the ids of several communicators apart
    /// (every rank uses the same name for the same communicator).
    pub fn init(
        env: &DistEnv,
        dev: Arc<CudaDevice>,
        name: &str,
        timeout: Duration,
    ) -> Result<Self> {
        nccl_status().map_err(DistError::Backend)?;
        let store = if env.world_size > 1 {
            let endpoint = env
                .master_endpoint()
                .ok_or_else(|| DistError::Env("no master address for a multi-rank job".into()))?;
            Some(Arc::new(StoreClient::connect(&endpoint, timeout)?))
        } else {
            None
        };
        let key = format!("nccl/{name}/id");
        let id = match &store {
            Some(s) => exchange_id(s, &key, env.rank, timeout, new_unique_id)?,
            None => new_unique_id()?,
        };
        Self::from_id(
            dev,
            id,
            env.rank,
            (0..env.world_size).collect(),
            None,
            format!("nccl/{name}"),
            store,
            timeout,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn from_id(
        dev: Arc<CudaDevice>,
        id: [u8; ID_BYTES],
        rank: usize,
        members: Vec<usize>,
        group: Option<String>,
        name: String,
        store: Option<Arc<StoreClient>>,
        timeout: Duration,
    ) -> Result<Self> {
        let stream = dev
            .new_stream()
            .map_err(|e| cuda_err("creating the NCCL stream", e))?;
        let id: UniqueId = id;
        let comm = Comm::init_rank(&dev, &id, members.len(), rank).map_err(|e| {
            cuda_err(
                &format!("ncclCommInitRank (rank {rank} of {})", members.len()),
                e,
            )
        })?;
        Ok(NcclCommunicator {
            dev,
            comm,
            stream,
            rank,
            members,
            group,
            name,
            store,
            splits: HashMap::new(),
            seq: 0,
            p2p: HashMap::new(),
            timeout,
            staging: [None, None],
            broken: None,
        })
    }

    /// The device this communicator works on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    fn ctx(&self, op: &'static str, seq: u64) -> OpContext {
        OpContext {
            op,
            seq,
            rank: self.members[self.rank],
            group: self.group.clone(),
        }
    }

    /// Starts a collective: checks the communicator is usable and orders the NCCL stream after
    /// everything queued on the compute stream so far.
    fn begin(&mut self, op: &'static str, peer: Option<(bool, usize)>) -> Result<OpContext> {
        if let Some(why) = &self.broken {
            return Err(DistError::Backend(format!(
                "{op} on rank {}: the NCCL communicator was aborted earlier ({why})",
                self.members[self.rank]
            )));
        }
        let seq = match peer {
            Some(k) => {
                let c = self.p2p.entry(k).or_insert(0);
                *c += 1;
                *c
            }
            None => {
                self.seq += 1;
                self.seq
            }
        };
        let ctx = self.ctx(op, seq);
        let ready = self
            .dev
            .stream()
            .record_event()
            .map_err(|e| cuda_err("cuEventRecord", e))?;
        self.stream
            .wait(&ready)
            .map_err(|e| cuda_err("cuStreamWaitEvent", e))?;
        Ok(ctx)
    }

    /// Ends the enqueueing of a collective: the compute stream will wait for it.
    fn end(&mut self, ctx: OpContext, r: sinter_cuda::Result<()>) -> Result<Pending> {
        if let Err(e) = r {
            return Err(DistError::Backend(format!("{ctx} failed in NCCL: {e}")));
        }
        let done = self
            .stream
            .record_event()
            .map_err(|e| cuda_err("cuEventRecord", e))?;
        self.dev
            .stream()
            .wait(&done)
            .map_err(|e| cuda_err("cuStreamWaitEvent", e))?;
        Ok(Pending { ctx, done })
    }

    /// Waits for `p` with the collective timeout, watching NCCL's asynchronous error; on a
    /// timeout or an error the communicator is aborted (so no rank hangs in it forever).
    pub fn wait(&mut self, p: Pending, peer: Option<usize>) -> Result<()> {
        let t0 = Instant::now();
        let mut nap = Duration::from_micros(20);
        loop {
            let done = match p.done.query() {
                Ok(d) => d,
                Err(e) => {
                    self.abort(e.to_string());
                    return Err(DistError::Backend(format!("{} failed: {e}", p.ctx)));
                }
            };
            // Checked after completion too: a collective that failed may still complete.
            if let Some(async_err) = self.comm.async_error() {
                self.abort(async_err.clone());
                return Err(DistError::Backend(format!(
                    "{} failed in NCCL: {async_err}",
                    p.ctx
                )));
            }
            if done {
                return Ok(());
            }
            if t0.elapsed() >= self.timeout {
                self.abort(format!("{} timed out", p.ctx));
                return Err(DistError::Timeout {
                    ctx: p.ctx,
                    peer: peer.map(|q| self.members[q]),
                    after: self.timeout,
                });
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(2));
        }
    }

    fn abort(&mut self, why: String) {
        if self.broken.is_none() {
            self.comm.abort();
        }
        self.broken = Some(why);
    }

    /// In-place all-reduce of `buf` (f32 device memory on this communicator's device),
    /// enqueued without waiting: the compute stream is ordered after it; call [`Self::wait`]
    /// to bound it with the timeout.
    pub fn all_reduce_device(&mut self, buf: DevSlice<'_>, op: ReduceOp) -> Result<Pending> {
        check_f32(&buf, "all_reduce")?;
        let ctx = self.begin("all_reduce", None)?;
        // The caller keeps `buf` alive until the compute stream has passed the returned event.
        let r = self.comm.all_reduce(buf, buf, red_op(op), &self.stream);
        self.end(ctx, r)
    }

    /// Staging buffer `i` with room for `n` f32 values.
    fn stage(&mut self, i: usize, n: usize) -> Result<()> {
        let big_enough = self.staging[i].as_ref().is_some_and(|b| b.len() >= n);
        if !big_enough {
            self.staging[i] = None;
            let b = self
                .dev
                .alloc(n.max(1), sinter_cuda::DType::F32, Pool::Permanent)
                .map_err(|e| cuda_err("allocating the NCCL staging buffer", e))?;
            self.staging[i] = Some(b);
        }
        Ok(())
    }

    /// The first `n` values of staging buffer `i` (staged before).
    fn staged(&self, i: usize, n: usize) -> Result<DevSlice<'_>> {
        self.staging[i]
            .as_ref()
            .expect("staged")
            .slice(0, n)
            .map_err(|e| cuda_err("staging slice", e))
    }

    fn upload(&mut self, i: usize, data: &[f32]) -> Result<()> {
        self.stage(i, data.len())?;
        let s = self.staged(i, data.len())?;
        self.dev
            .copy_htod(data, s)
            .map_err(|e| cuda_err("copying to the NCCL staging buffer", e))
    }

    fn download(&self, i: usize, out: &mut [f32]) -> Result<()> {
        let v: Vec<f32> = self
            .dev
            .dtoh(self.staged(i, out.len())?)
            .map_err(|e| cuda_err("copying from the NCCL staging buffer", e))?;
        out.copy_from_slice(&v);
        Ok(())
    }
}

fn check_f32(buf: &DevSlice<'_>, op: &str) -> Result<()> {
    if buf.dtype() != sinter_cuda::DType::F32 {
        return Err(DistError::InvalidArgument(format!(
            "{op}: NCCL buffers here are f32, got {:?}",
            buf.dtype()
        )));
    }
    Ok(())
}

impl Drop for NcclCommunicator {
    fn drop(&mut self) {
        // Nothing may be pending on the NCCL stream when the communicator is destroyed (its
        // `comm` field, dropped after this).
        let _ = self.stream.synchronize();
    }
}

impl Communicator for NcclCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.members.len()
    }
    fn global_rank(&self) -> usize {
        self.members[self.rank]
    }

    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<()> {
        self.upload(0, buf)?;
        let ctx = self.begin("all_reduce", None)?;
        let s = self.staged(0, buf.len())?;
        let r = self.comm.all_reduce(s, s, red_op(op), &self.stream);
        let pending = self.end(ctx, r)?;
        self.wait(pending, None)?;
        self.download(0, buf)
    }

    fn reduce_scatter(&mut self, input: &[f32], output: &mut [f32], op: ReduceOp) -> Result<()> {
        let n = self.world_size();
        if input.len() != n * output.len() {
            return Err(DistError::InvalidArgument(format!(
                "reduce_scatter: input has {} values, expected {n} x {}",
                input.len(),
                output.len()
            )));
        }
        self.upload(0, input)?;
        self.stage(1, output.len())?;
        let ctx = self.begin("reduce_scatter", None)?;
        let (src, dst) = (self.staged(0, input.len())?, self.staged(1, output.len())?);
        let r = self.comm.reduce_scatter(src, dst, red_op(op), &self.stream);
        let pending = self.end(ctx, r)?;
        self.wait(pending, None)?;
        self.download(1, output)
    }

    fn all_gather(&mut self, input: &[f32], output: &mut [f32]) -> Result<()> {
        let n = self.world_size();
        if output.len() != n * input.len() {
            return Err(DistError::InvalidArgument(format!(
                "all_gather: output has {} values, expected {n} x {}",
                output.len(),
                input.len()
            )));
        }
        self.upload(0, input)?;
        self.stage(1, output.len())?;
        let ctx = self.begin("all_gather", None)?;
        let (src, dst) = (self.staged(0, input.len())?, self.staged(1, output.len())?);
        let r = self.comm.all_gather(src, dst, &self.stream);
        let pending = self.end(ctx, r)?;
        self.wait(pending, None)?;
        self.download(1, output)
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<()> {
        if root >= self.world_size() {
            return Err(DistError::InvalidArgument(format!(
                "broadcast: root {root} is not a rank of a group of {}",
                self.world_size()
            )));
        }
        self.upload(0, buf)?;
        let ctx = self.begin("broadcast", None)?;
        let s = self.staged(0, buf.len())?;
        let r = self.comm.broadcast(s, s, root, &self.stream);
        let pending = self.end(ctx, r)?;
        self.wait(pending, Some(root))?;
        self.download(0, buf)
    }

    fn send(&mut self, buf: &[f32], dst: usize) -> Result<()> {
        if dst >= self.world_size() || dst == self.rank {
            return Err(DistError::InvalidArgument(format!(
                "send: destination {dst} is not another rank of a group of {}",
                self.world_size()
            )));
        }
        self.upload(0, buf)?;
        let ctx = self.begin("send", Some((true, dst)))?;
        let s = self.staged(0, buf.len())?;
        let r = self.comm.send(s, dst, &self.stream);
        // NCCL's send completes only when the peer receives: wait (bounded) so the staging
        // buffer can be reused.
        let pending = self.end(ctx, r)?;
        self.wait(pending, Some(dst))
    }

    fn recv(&mut self, buf: &mut [f32], src: usize) -> Result<()> {
        if src >= self.world_size() || src == self.rank {
            return Err(DistError::InvalidArgument(format!(
                "recv: source {src} is not another rank of a group of {}",
                self.world_size()
            )));
        }
        self.stage(0, buf.len())?;
        let ctx = self.begin("recv", Some((false, src)))?;
        let s = self.staged(0, buf.len())?;
        let r = self.comm.recv(s, src, &self.stream);
        let pending = self.end(ctx, r)?;
        self.wait(pending, Some(src))?;
        self.download(0, buf)
    }

    fn barrier(&mut self) -> Result<()> {
        let mut one = [1.0f32];
        self.all_reduce(&mut one, ReduceOp::Sum)
    }

    fn new_group(&mut self, ranks: &[usize]) -> Result<Box<dyn Communicator>> {
        let n = self.world_size();
        let mut seen = vec![false; n];
        for &r in ranks {
            if r >= n || std::mem::replace(&mut seen[r], true) {
                return Err(DistError::InvalidArgument(format!(
                    "new_group: {ranks:?} must list distinct ranks below {n}"
                )));
            }
        }
        let Some(pos) = ranks.iter().position(|&r| r == self.rank) else {
            return Err(DistError::InvalidArgument(format!(
                "new_group: rank {} is not a member of {ranks:?}",
                self.rank
            )));
        };
        let count = self.splits.entry(ranks.to_vec()).or_insert(0);
        *count += 1;
        let name = format!("{}/g{ranks:?}#{count}", self.name);
        let id = match &self.store {
            Some(s) => exchange_id(s, &format!("{name}/id"), pos, self.timeout, new_unique_id)?,
            None => new_unique_id()?,
        };
        let members: Vec<usize> = ranks.iter().map(|&r| self.members[r]).collect();
        let group = Some(format!("group {members:?}"));
        let c = NcclCommunicator::from_id(
            self.dev.clone(),
            id,
            pos,
            members,
            group,
            name,
            self.store.clone(),
            self.timeout,
        )?;
        Ok(Box::new(c))
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }
}

// ---------------------------------------------------------------------------------------------
// Data-parallel gradient buckets on the device
// ---------------------------------------------------------------------------------------------

/// Data-parallel gradient all-reduce entirely on the device: each parameter's CUDA gradient is
/// copied (device to device) into its bucket when final, and each complete bucket is
/// all-reduced in place on the NCCL stream while backward continues on the compute stream.
pub struct DeviceBuckets {
    comm: NcclCommunicator,
    layout: FlatLayout,
    bufs: Vec<Option<Arc<DeviceBuffer>>>,
}

struct DevicePass<'a> {
    db: &'a mut DeviceBuckets,
    got: Vec<bool>,
    filled: Vec<usize>,
    zeroed: Vec<bool>,
    next: usize,
    pending: Vec<Pending>,
}

fn core_err(e: DistError) -> sinter_core::Error {
    sinter_core::Error::Msg(e.to_string())
}

impl DeviceBuckets {
    /// Buckets following `layout` (the data-parallel bucket plan), reduced over `comm`.
    pub fn new(comm: NcclCommunicator, layout: FlatLayout) -> Self {
        let nb = layout.buckets.len();
        DeviceBuckets {
            comm,
            layout,
            bufs: vec![None; nb],
        }
    }

    /// True when every parameter lives on this communicator's device (the device path
    /// applies).
    pub fn applies_to(&self, params: &[(String, Tensor)]) -> bool {
        let ord = self.comm.device().ordinal();
        params
            .iter()
            .all(|(_, t)| t.device() == sinter_core::Device::Cuda(ord))
    }

    /// Backward of `loss` (or, with `None`, the gradients the parameters already hold) with
    /// the averaged gradients written back into the parameters.
    pub fn sync(
        &mut self,
        loss: Option<&Tensor>,
        params: &[(String, Tensor)],
        index: &HashMap<TensorId, usize>,
    ) -> sinter_core::Result<()> {
        let nb = self.layout.buckets.len();
        let mut pass = DevicePass {
            db: self,
            got: vec![false; params.len()],
            filled: vec![0; nb],
            zeroed: vec![false; nb],
            next: 0,
            pending: Vec::new(),
        };
        if let Some(loss) = loss {
            loss.backward_with_hook(|var, grad| {
                if let Some(&p) = index.get(&var.id()) {
                    pass.add(p, grad)?;
                    var.set_grad(None);
                }
                Ok(())
            })?;
        }
        for (p, (_, param)) in params.iter().enumerate() {
            if !pass.got[p] {
                match param.grad() {
                    Some(g) => pass.add(p, &g)?,
                    None => {
                        let b = pass.db.layout.slots[p].bucket;
                        pass.bucket(b)?;
                        pass.filled[b] += 1;
                    }
                }
            }
        }
        pass.submit_ready()?;
        let DevicePass {
            db, got, pending, ..
        } = pass;
        for p in pending {
            db.comm.wait(p, None).map_err(core_err)?;
        }
        db.write_back(params, &got)
    }

    fn write_back(&mut self, params: &[(String, Tensor)], got: &[bool]) -> sinter_core::Result<()> {
        let dev = self.comm.device().clone();
        for (p, (_, t)) in params.iter().enumerate() {
            if !got[p] {
                continue;
            }
            let s = &self.layout.slots[p];
            let bucket = self.bufs[s.bucket].as_ref().expect("filled bucket");
            let src = bucket
                .slice(s.offset_in_bucket, s.numel)
                .map_err(|e| core_err(cuda_err("gradient slice", e)))?;
            let out = dev
                .alloc(s.numel, sinter_cuda::DType::F32, Pool::Temporary)
                .map_err(|e| core_err(cuda_err("allocating a gradient", e)))?;
            dev.copy(src, out.as_slice())
                .map_err(|e| core_err(cuda_err("copying a gradient", e)))?;
            let g = Tensor::from_cuda_buffer(&dev, Arc::new(out), DType::F32, &s.shape)?;
            let g = if t.dtype() == DType::F32 {
                g
            } else {
                g.to_dtype(t.dtype())?
            };
            t.set_grad(Some(g));
        }
        Ok(())
    }
}

impl DevicePass<'_> {
    fn bucket(&mut self, b: usize) -> sinter_core::Result<Arc<DeviceBuffer>> {
        let padded = self.db.layout.buckets[b].padded;
        if self.db.bufs[b].is_none() {
            let buf = self
                .db
                .comm
                .device()
                .alloc(padded, sinter_cuda::DType::F32, Pool::Permanent)
                .map_err(|e| core_err(cuda_err("allocating a gradient bucket", e)))?;
            self.db.bufs[b] = Some(Arc::new(buf));
        }
        let buf = self.db.bufs[b].clone().expect("allocated above");
        if !self.zeroed[b] {
            // Padding and parameters without a gradient count as zeros.
            self.db
                .comm
                .device()
                .zero(buf.as_slice())
                .map_err(|e| core_err(cuda_err("clearing a gradient bucket", e)))?;
            self.zeroed[b] = true;
        }
        Ok(buf)
    }

    fn add(&mut self, p: usize, grad: &Tensor) -> sinter_core::Result<()> {
        if self.got[p] {
            return Ok(());
        }
        let slot = &self.db.layout.slots[p];
        let (b, off, n) = (slot.bucket, slot.offset_in_bucket, slot.numel);
        if grad.numel() != n {
            sinter_core::bail!(
                "gradient of {} has {} values, expected {n}",
                slot.name,
                grad.numel()
            );
        }
        let g = if grad.dtype() == DType::F32 {
            grad.contiguous()?
        } else {
            grad.to_dtype(DType::F32)?.contiguous()?
        };
        let Some((_, src_buf, range)) = g.cuda_buffer() else {
            sinter_core::bail!(
                "gradient of {} is on {}, not on the NCCL device cuda:{}",
                slot.name,
                g.device(),
                self.db.comm.device().ordinal()
            );
        };
        let buf = self.bucket(b)?;
        let dev = self.db.comm.device().clone();
        let src = src_buf
            .slice(range.start, n)
            .map_err(|e| core_err(cuda_err("gradient slice", e)))?;
        let dst = buf
            .slice(off, n)
            .map_err(|e| core_err(cuda_err("bucket slice", e)))?;
        dev.copy(src, dst)
            .map_err(|e| core_err(cuda_err("copying a gradient into its bucket", e)))?;
        self.got[p] = true;
        self.filled[b] += 1;
        self.submit_ready()
    }

    fn submit_ready(&mut self) -> sinter_core::Result<()> {
        while self.next < self.db.layout.buckets.len()
            && self.filled[self.next] == self.db.layout.buckets[self.next].params.len()
        {
            let buf = self.bucket(self.next)?;
            let p = self
                .db
                .comm
                .all_reduce_device(buf.as_slice(), ReduceOp::Avg)
                .map_err(core_err)?;
            self.pending.push(p);
            self.next += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(split_nccl_version(21903), (2, 19, 3));
        assert_eq!(split_nccl_version(2804), (2, 8, 4));
    }
}
