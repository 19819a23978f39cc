//! The [`Communicator`] trait, its asynchronous wrapper and device-mesh helpers.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{DistError, Result};

/// Environment variable holding the collective timeout in seconds (fractions allowed).
pub const TIMEOUT_ENV: &str = "SINTER_COLLECTIVE_TIMEOUT_S";
/// Timeout of every collective unless configured otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The collective timeout: `SINTER_COLLECTIVE_TIMEOUT_S` if set and valid, else 300 s.
pub fn default_timeout() -> Duration {
    std::env::var(TIMEOUT_ENV)
        .ok()
        .and_then(|v| parse_timeout(&v))
        .unwrap_or(DEFAULT_TIMEOUT)
}

/// Parses a positive number of seconds.
pub fn parse_timeout(v: &str) -> Option<Duration> {
    let s: f64 = v.trim().parse().ok()?;
    (s.is_finite() && s > 0.0).then(|| Duration::from_secs_f64(s))
}

/// Reduction applied by `all_reduce` and `reduce_scatter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise sum divided by the group size.
    Avg,
}

/// A group of ranks that exchange `f32` host buffers.
///
/// All members must call the collectives in the same order with matching lengths. Every call
/// returns within the communicator's timeout: on expiry, a lost peer or a mismatch the error
/// names the op, the caller's rank, the collective's sequence number and the peer.
/// Results are deterministic: all ranks end with bit-identical buffers.
pub trait Communicator: Send {
    /// This rank's index in the group (0-based).
    fn rank(&self) -> usize;
    /// Number of ranks in the group.
    fn world_size(&self) -> usize;
    /// Rank in the world (the group every other group was split from).
    fn global_rank(&self) -> usize {
        self.rank()
    }
    /// Reduces `buf` across the group in place; every rank gets the result.
    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<()>;
    /// `input.len() == world_size * output.len()`; rank `r` gets the reduction of chunk `r`.
    fn reduce_scatter(&mut self, input: &[f32], output: &mut [f32], op: ReduceOp) -> Result<()>;
    /// `output.len() == world_size * input.len()`; chunk `r` of `output` is rank `r`'s input.
    fn all_gather(&mut self, input: &[f32], output: &mut [f32]) -> Result<()>;
    /// Copies `root`'s `buf` to every rank.
    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<()>;
    /// Sends `buf` to rank `dst` of this group (returns once handed to the transport).
    fn send(&mut self, buf: &[f32], dst: usize) -> Result<()>;
    /// Receives exactly `buf.len()` values from rank `src` of this group.
    fn recv(&mut self, buf: &mut [f32], src: usize) -> Result<()>;
    /// Returns once every rank of the group has entered the barrier.
    fn barrier(&mut self) -> Result<()>;
    /// A communicator over a subset of this group. `ranks` are ranks of *this* group; the new
    /// group's rank `i` is `ranks[i]`. Every member calls it with the same list (non-members
    /// need not call it and get an error if they do). Creating the same list again gives a
    /// new, independent group.
    fn new_group(&mut self, ranks: &[usize]) -> Result<Box<dyn Communicator>>;
    /// Timeout applied to each call.
    fn timeout(&self) -> Duration;
    /// Changes the timeout applied to each later call.
    fn set_timeout(&mut self, timeout: Duration);
}

impl<C: Communicator + ?Sized> Communicator for Box<C> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn world_size(&self) -> usize {
        (**self).world_size()
    }
    fn global_rank(&self) -> usize {
        (**self).global_rank()
    }
    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<()> {
        (**self).all_reduce(buf, op)
    }
    fn reduce_scatter(&mut self, input: &[f32], output: &mut [f32], op: ReduceOp) -> Result<()> {
        (**self).reduce_scatter(input, output, op)
    }
    fn all_gather(&mut self, input: &[f32], output: &mut [f32]) -> Result<()> {
        (**self).all_gather(input, output)
    }
    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<()> {
        (**self).broadcast(buf, root)
    }
    fn send(&mut self, buf: &[f32], dst: usize) -> Result<()> {
        (**self).send(buf, dst)
    }
    fn recv(&mut self, buf: &mut [f32], src: usize) -> Result<()> {
        (**self).recv(buf, src)
    }
    fn barrier(&mut self) -> Result<()> {
        (**self).barrier()
    }
    fn new_group(&mut self, ranks: &[usize]) -> Result<Box<dyn Communicator>> {
        (**self).new_group(ranks)
    }
    fn timeout(&self) -> Duration {
        (**self).timeout()
    }
    fn set_timeout(&mut self, timeout: Duration) {
        (**self).set_timeout(timeout)
    }
}

// ---------------------------------------------------------------------------------------------
// Asynchronous wrapper
// ---------------------------------------------------------------------------------------------

enum Job {
    AllReduce(Vec<f32>, ReduceOp),
    ReduceScatter(Vec<f32>, ReduceOp),
    AllGather(Vec<f32>),
    Broadcast(Vec<f32>, usize),
    Send(Vec<f32>, usize),
    Recv(usize, usize),
    Barrier,
}

type Reply = mpsc::Sender<Result<Vec<f32>>>;

/// Handle to a call submitted to an [`AsyncCommunicator`].
pub struct Work {
    rx: mpsc::Receiver<Result<Vec<f32>>>,
    done: Option<Result<Vec<f32>>>,
}

impl Work {
    /// Blocks until the call has finished; returns its output buffer (the reduced buffer, the
    /// gathered buffer, the received buffer; empty for `send` and `barrier`).
    pub fn wait(mut self) -> Result<Vec<f32>> {
        if let Some(r) = self.done.take() {
            return r;
        }
        self.rx.recv().unwrap_or(Err(DistError::Shutdown))
    }

    /// True once the call has finished (successfully or not); never blocks.
    pub fn is_completed(&mut self) -> bool {
        if self.done.is_some() {
            return true;
        }
        match self.rx.try_recv() {
            Ok(r) => {
                self.done = Some(r);
                true
            }
            Err(mpsc::TryRecvError::Empty) => false,
            Err(mpsc::TryRecvError::Disconnected) => {
                self.done = Some(Err(DistError::Shutdown));
                true
            }
        }
    }
}

/// Owns a communicator on a background thread and runs submitted calls there in submission
/// order, so that communication overlaps with work on the calling thread (e.g. gradient
/// buckets all-reduced while backward continues).
///
/// All ranks must submit the same calls in the same order, as with the synchronous form.
pub struct AsyncCommunicator {
    tx: Option<mpsc::Sender<(Job, Reply)>>,
    thread: Option<JoinHandle<Box<dyn Communicator>>>,
    rank: usize,
    world_size: usize,
}

impl AsyncCommunicator {
    /// Moves `comm` onto a new background thread.
    pub fn new<C: Communicator + 'static>(comm: C) -> Self {
        let mut comm: Box<dyn Communicator> = Box::new(comm);
        let rank = comm.rank();
        let world_size = comm.world_size();
        let (tx, rx) = mpsc::channel::<(Job, Reply)>();
        let thread = std::thread::Builder::new()
            .name(format!("sinter-comm-{}", comm.global_rank()))
            .spawn(move || {
                while let Ok((job, reply)) = rx.recv() {
                    let r = run_job(&mut *comm, job);
                    let _ = reply.send(r);
                }
                comm
            })
            .expect("spawn communicator thread");
        AsyncCommunicator {
            tx: Some(tx),
            thread: Some(thread),
            rank,
            world_size,
        }
    }

    /// Rank of the wrapped communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Group size of the wrapped communicator.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    fn submit(&self, job: Job) -> Work {
        let (rtx, rrx) = mpsc::channel();
        let mut work = Work {
            rx: rrx,
            done: None,
        };
        let sent = self.tx.as_ref().map(|tx| tx.send((job, rtx)).is_ok());
        if sent != Some(true) {
            work.done = Some(Err(DistError::Shutdown));
        }
        work
    }

    /// All-reduces `buf`; `wait()` returns the reduced buffer.
    pub fn all_reduce(&self, buf: Vec<f32>, op: ReduceOp) -> Work {
        self.submit(Job::AllReduce(buf, op))
    }
    /// Reduce-scatters `input` (length divisible by the group size); `wait()` returns this
    /// rank's chunk.
    pub fn reduce_scatter(&self, input: Vec<f32>, op: ReduceOp) -> Work {
        self.submit(Job::ReduceScatter(input, op))
    }
    /// All-gathers `input`; `wait()` returns the concatenation over ranks.
    pub fn all_gather(&self, input: Vec<f32>) -> Work {
        self.submit(Job::AllGather(input))
    }
    /// Broadcasts from `root`; `wait()` returns root's buffer.
    pub fn broadcast(&self, buf: Vec<f32>, root: usize) -> Work {
        self.submit(Job::Broadcast(buf, root))
    }
    /// Sends `buf` to `dst`.
    pub fn send(&self, buf: Vec<f32>, dst: usize) -> Work {
        self.submit(Job::Send(buf, dst))
    }
    /// Receives `len` values from `src`; `wait()` returns them.
    pub fn recv(&self, len: usize, src: usize) -> Work {
        self.submit(Job::Recv(len, src))
    }
    /// Barrier.
    pub fn barrier(&self) -> Work {
        self.submit(Job::Barrier)
    }

    /// Waits for all submitted calls, stops the thread and gives the communicator back.
    pub fn into_inner(mut self) -> Result<Box<dyn Communicator>> {
        self.tx = None;
        let t = self.thread.take().ok_or(DistError::Shutdown)?;
        t.join().map_err(|_| DistError::Shutdown)
    }
}

impl Drop for AsyncCommunicator {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run_job(comm: &mut dyn Communicator, job: Job) -> Result<Vec<f32>> {
    match job {
        Job::AllReduce(mut buf, op) => comm.all_reduce(&mut buf, op).map(|_| buf),
        Job::ReduceScatter(input, op) => {
            let n = comm.world_size();
            if input.len() % n != 0 {
                return Err(DistError::InvalidArgument(format!(
                    "reduce_scatter input length {} is not divisible by the group size {n}",
                    input.len()
                )));
            }
            let mut out = vec![0.0; input.len() / n];
            comm.reduce_scatter(&input, &mut out, op).map(|_| out)
        }
        Job::AllGather(input) => {
            let mut out = vec![0.0; input.len() * comm.world_size()];
            comm.all_gather(&input, &mut out).map(|_| out)
        }
        Job::Broadcast(mut buf, root) => comm.broadcast(&mut buf, root).map(|_| buf),
        Job::Send(buf, dst) => comm.send(&buf, dst).map(|_| Vec::new()),
        Job::Recv(len, src) => {
            let mut buf = vec![0.0; len];
            comm.recv(&mut buf, src).map(|_| buf)
        }
        Job::Barrier => comm.barrier().map(|_| Vec::new()),
    }
}

// ---------------------------------------------------------------------------------------------
// Device meshes
// ---------------------------------------------------------------------------------------------

/// Lists of group members (ranks of the parent group).
pub type RankGroups = Vec<Vec<usize>>;

/// Rank lists of a 2-D mesh `world = outer × inner`: `inner` groups are blocks of consecutive
/// ranks (tensor/pipeline parallel inside a node), `outer` groups take one rank of each block
/// (data parallel across them). Returns `(inner_groups, outer_groups)`.
pub fn mesh_2d_groups(world: usize, inner: usize) -> Result<(RankGroups, RankGroups)> {
    if inner == 0 || world == 0 || !world.is_multiple_of(inner) {
        return Err(DistError::InvalidArgument(format!(
            "mesh: inner size {inner} does not divide world size {world}"
        )));
    }
    let outer = world / inner;
    let inner_groups = (0..outer)
        .map(|o| (o * inner..(o + 1) * inner).collect())
        .collect();
    let outer_groups = (0..inner)
        .map(|i| (0..outer).map(|o| o * inner + i).collect())
        .collect();
    Ok((inner_groups, outer_groups))
}

/// The two communicators of this rank in a 2-D mesh (see [`mesh_2d_groups`]).
pub struct Mesh2d {
    /// Consecutive ranks (e.g. tensor parallel within a node).
    pub inner: Box<dyn Communicator>,
    /// Strided ranks (e.g. data parallel across the inner blocks).
    pub outer: Box<dyn Communicator>,
}

/// Splits `comm` into this rank's inner and outer group. Every rank of `comm` calls it.
pub fn mesh_2d(comm: &mut dyn Communicator, inner: usize) -> Result<Mesh2d> {
    let (ig, og) = mesh_2d_groups(comm.world_size(), inner)?;
    let r = comm.rank();
    let inner_comm = comm.new_group(&ig[r / inner])?;
    let outer_comm = comm.new_group(&og[r % inner])?;
    Ok(Mesh2d {
        inner: inner_comm,
        outer: outer_comm,
    })
}
