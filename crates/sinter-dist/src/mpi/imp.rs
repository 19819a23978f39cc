//! The MPI communicator over rsmpi's raw bindings (the safe layer has no in-place or
//! buffered-send forms that fit [`Communicator`]'s contract).

use std::collections::HashMap;
use std::os::raw::{c_int, c_void};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ::mpi::environment::{Threading, Universe};
use ::mpi::ffi;

use super::watchdog;
use crate::comm::{Communicator, ReduceOp};
use crate::error::{DistError, OpContext, Result};
use crate::rendezvous::{DistEnv, EnvSource, DEFAULT_MASTER_PORT};

/// MPI stays initialised from the first communicator to [`finish`] (MPI cannot be started
/// twice in a process).
static UNIVERSE: Mutex<Option<Universe>> = Mutex::new(None);
static STARTED: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();

/// Tag of point-to-point messages (MPI keeps messages between two ranks of one communicator
/// with one tag in order, which is the order `recv` expects).
const P2P_TAG: c_int = 7;

fn start() -> Result<()> {
    STARTED
        .get_or_init(|| {
            let (universe, level) = ::mpi::initialize_with_threading(Threading::Multiple)
                .ok_or_else(|| "MPI was already initialised by someone else".to_string())?;
            // The data-parallel communicator runs on its own thread, and the watchdog may
            // abort from another one.
            if level != Threading::Multiple {
                return Err(format!(
                    "{} provides thread level {level:?}, and sinter calls MPI from several threads (needs MPI_THREAD_MULTIPLE)",
                    mpi_library()
                ));
            }
            // Errors come back as codes (and become `DistError`s) instead of aborting.
            // SAFETY: MPI is initialised; both handles are valid constants.
            unsafe { ffi::MPI_Comm_set_errhandler(ffi::RSMPI_COMM_WORLD, ffi::RSMPI_ERRORS_RETURN) };
            *UNIVERSE.lock().unwrap_or_else(|e| e.into_inner()) = Some(universe);
            Ok(())
        })
        .clone()
        .map_err(|e| DistError::Backend(format!("--dist-backend mpi: {e}")))
}

/// The MPI library's own version line, e.g. `Open MPI v4.1.4, …`.
pub fn mpi_library() -> String {
    ::mpi::environment::library_version()
        .map(|v| v.lines().next().unwrap_or("").trim().to_string())
        .unwrap_or_else(|_| "the MPI library".into())
}

pub(super) fn finish(ok: bool) {
    let Some(universe) = UNIVERSE.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return;
    };
    if ok {
        drop(universe); // MPI_Finalize
    } else {
        // SAFETY: MPI is initialised and not finalised (the universe was still held).
        unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 1) };
    }
}

/// The watchdog's way out: MPI cannot cancel the call that overran.
fn abort_job() {
    // SAFETY: MPI is initialised (a call was in progress) and runs at MPI_THREAD_MULTIPLE.
    unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 1) };
}

fn comm_rank_size(comm: ffi::MPI_Comm) -> (usize, usize) {
    let (mut r, mut n): (c_int, c_int) = (0, 0);
    // SAFETY: `comm` is a valid communicator; the outputs are plain ints.
    unsafe {
        ffi::MPI_Comm_rank(comm, &mut r);
        ffi::MPI_Comm_size(comm, &mut n);
    }
    (r as usize, n as usize)
}

pub(super) fn world_env() -> Result<DistEnv> {
    start()?;
    let (rank, size) = comm_rank_size(unsafe { ffi::RSMPI_COMM_WORLD });
    let launcher = crate::rendezvous::from_env().ok();
    super::world::check_world(launcher.as_ref(), rank, size)?;
    // Ranks sharing this node's memory: MPI's own notion of "local".
    let mut node: ffi::MPI_Comm = unsafe { ffi::RSMPI_COMM_NULL };
    // SAFETY: MPI is initialised; `node` receives a new communicator that is freed below.
    let (local_rank, local_size) = unsafe {
        ffi::MPI_Comm_split_type(
            ffi::RSMPI_COMM_WORLD,
            ffi::RSMPI_COMM_TYPE_SHARED,
            rank as c_int,
            ffi::RSMPI_INFO_NULL,
            &mut node,
        );
        let rs = comm_rank_size(node);
        ffi::MPI_Comm_free(&mut node);
        rs
    };
    Ok(DistEnv {
        rank,
        world_size: size,
        local_rank,
        local_world_size: local_size.max(1),
        master_addr: None,
        master_port: DEFAULT_MASTER_PORT,
        source: EnvSource::Mpi,
    })
}

/// A communicator over an MPI communicator (the world or a group split from it).
pub struct MpiCommunicator {
    comm: ffi::MPI_Comm,
    /// The world is MPI's own and never freed.
    owned: bool,
    me: usize,
    /// Global ranks of the members, in group-rank order.
    members: Vec<usize>,
    group_desc: Option<String>,
    seq: u64,
    p2p_send: HashMap<usize, u64>,
    p2p_recv: HashMap<usize, u64>,
    /// Sends handed to MPI but maybe not yet delivered, with the copies MPI reads from.
    pending: Vec<(ffi::MPI_Request, Vec<f32>)>,
    /// All-reduce's send buffer (MPI_IN_PLACE is not in rsmpi's bindings).
    scratch: Vec<f32>,
    timeout: Duration,
}

// SAFETY: MPI runs at MPI_THREAD_MULTIPLE (checked in `start`), and `&mut self` keeps each
// communicator to one thread at a time.
unsafe impl Send for MpiCommunicator {}

impl std::fmt::Debug for MpiCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiCommunicator")
            .field("rank", &self.me)
            .field("world_size", &self.members.len())
            .field("global_rank", &self.global_rank())
            .finish()
    }
}

fn describe_group(members: &[usize]) -> String {
    if members.len() <= 8 {
        format!("group {members:?}")
    } else {
        format!("group of {} ranks from rank {}", members.len(), members[0])
    }
}

impl MpiCommunicator {
    /// Every rank of the MPI job (starts MPI on first use).
    pub fn world(timeout: Duration) -> Result<MpiCommunicator> {
        start()?;
        let comm = unsafe { ffi::RSMPI_COMM_WORLD };
        let (me, n) = comm_rank_size(comm);
        Ok(Self::wrap(comm, false, me, (0..n).collect(), None, timeout))
    }

    fn wrap(
        comm: ffi::MPI_Comm,
        owned: bool,
        me: usize,
        members: Vec<usize>,
        group_desc: Option<String>,
        timeout: Duration,
    ) -> Self {
        MpiCommunicator {
            comm,
            owned,
            me,
            members,
            group_desc,
            seq: 0,
            p2p_send: HashMap::new(),
            p2p_recv: HashMap::new(),
            pending: Vec::new(),
            scratch: Vec::new(),
            timeout,
        }
    }

    fn ctx(&self, op: &'static str, seq: u64) -> OpContext {
        OpContext {
            op,
            seq,
            rank: self.global_rank(),
            group: self.group_desc.clone(),
        }
    }

    fn next_ctx(&mut self, op: &'static str) -> OpContext {
        self.seq += 1;
        self.ctx(op, self.seq)
    }

    /// Runs one MPI call under the watchdog and turns its error code into a [`DistError`].
    fn call(&self, ctx: &OpContext, peer: Option<usize>, f: impl FnOnce() -> c_int) -> Result<()> {
        let why = DistError::Timeout {
            ctx: ctx.clone(),
            peer,
            after: self.timeout,
        };
        let _armed = watchdog::arm(Instant::now() + self.timeout, why.to_string(), abort_job);
        let rc = f();
        if rc == 0 {
            return Ok(());
        }
        Err(DistError::Backend(format!("{ctx}: {}", error_string(rc))))
    }

    fn check_rank(&self, r: usize, what: &str) -> Result<()> {
        if r >= self.members.len() {
            return Err(DistError::InvalidArgument(format!(
                "{what} rank {r} out of range for a group of {}",
                self.members.len()
            )));
        }
        Ok(())
    }

    /// Forgets sends MPI has finished with.
    fn reap(&mut self) {
        self.pending.retain_mut(|(req, _)| {
            let mut done: c_int = 0;
            // SAFETY: `req` is an active request from MPI_Isend whose buffer we still own.
            unsafe { ffi::MPI_Test(req, &mut done, ffi::RSMPI_STATUS_IGNORE) };
            done == 0
        });
    }
}

fn error_string(rc: c_int) -> String {
    let mut buf = vec![0u8; 1024];
    let mut len: c_int = 0;
    // SAFETY: MPI_MAX_ERROR_STRING is at most 512 in Open MPI and MPICH.
    unsafe { ffi::MPI_Error_string(rc, buf.as_mut_ptr() as *mut _, &mut len) };
    buf.truncate(len.max(0) as usize);
    format!("MPI error {rc}: {}", String::from_utf8_lossy(&buf))
}

fn count(n: usize, ctx: &OpContext) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| {
        DistError::InvalidArgument(format!(
            "{ctx}: {n} values is more than one MPI call carries ({}); split the buffer",
            c_int::MAX
        ))
    })
}

fn scale_avg(buf: &mut [f32], n: usize) {
    let inv = 1.0 / n as f32;
    buf.iter_mut().for_each(|x| *x *= inv);
}

impl Communicator for MpiCommunicator {
    fn rank(&self) -> usize {
        self.me
    }

    fn world_size(&self) -> usize {
        self.members.len()
    }

    fn global_rank(&self) -> usize {
        self.members[self.me]
    }

    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<()> {
        let ctx = self.next_ctx("all_reduce");
        let n = count(buf.len(), &ctx)?;
        self.scratch.clear();
        self.scratch.extend_from_slice(buf);
        let (src, comm) = (self.scratch.as_ptr(), self.comm);
        // SAFETY: both buffers hold `n` f32s and outlive the blocking call.
        self.call(&ctx, None, || unsafe {
            ffi::MPI_Allreduce(
                src as *const c_void,
                buf.as_mut_ptr() as *mut c_void,
                n,
                ffi::RSMPI_FLOAT,
                ffi::RSMPI_SUM,
                comm,
            )
        })?;
        if op == ReduceOp::Avg {
            scale_avg(buf, self.members.len());
        }
        Ok(())
    }

    fn reduce_scatter(&mut self, input: &[f32], output: &mut [f32], op: ReduceOp) -> Result<()> {
        let ctx = self.next_ctx("reduce_scatter");
        let g = self.members.len();
        if input.len() != g * output.len() {
            return Err(DistError::InvalidArgument(format!(
                "{ctx}: input length {} != group size {g} × output length {}",
                input.len(),
                output.len()
            )));
        }
        count(input.len(), &ctx)?;
        let n = count(output.len(), &ctx)?;
        let comm = self.comm;
        // SAFETY: `input` holds g·n and `output` n f32s, both live across the call.
        self.call(&ctx, None, || unsafe {
            ffi::MPI_Reduce_scatter_block(
                input.as_ptr() as *const c_void,
                output.as_mut_ptr() as *mut c_void,
                n,
                ffi::RSMPI_FLOAT,
                ffi::RSMPI_SUM,
                comm,
            )
        })?;
        if op == ReduceOp::Avg {
            scale_avg(output, g);
        }
        Ok(())
    }

    fn all_gather(&mut self, input: &[f32], output: &mut [f32]) -> Result<()> {
        let ctx = self.next_ctx("all_gather");
        let g = self.members.len();
        if output.len() != g * input.len() {
            return Err(DistError::InvalidArgument(format!(
                "{ctx}: output length {} != group size {g} × input length {}",
                output.len(),
                input.len()
            )));
        }
        count(output.len(), &ctx)?;
        let n = count(input.len(), &ctx)?;
        let comm = self.comm;
        // SAFETY: `input` holds n and `output` g·n f32s, both live across the call.
        self.call(&ctx, None, || unsafe {
            ffi::MPI_Allgather(
                input.as_ptr() as *const c_void,
                n,
                ffi::RSMPI_FLOAT,
                output.as_mut_ptr() as *mut c_void,
                n,
                ffi::RSMPI_FLOAT,
                comm,
            )
        })
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<()> {
        let ctx = self.next_ctx("broadcast");
        self.check_rank(root, "broadcast root")?;
        let n = count(buf.len(), &ctx)?;
        let comm = self.comm;
        // SAFETY: `buf` holds n f32s and lives across the call.
        self.call(&ctx, Some(self.members[root]), || unsafe {
            ffi::MPI_Bcast(
                buf.as_mut_ptr() as *mut c_void,
                n,
                ffi::RSMPI_FLOAT,
                root as c_int,
                comm,
            )
        })
    }

    fn send(&mut self, buf: &[f32], dst: usize) -> Result<()> {
        self.check_rank(dst, "send destination")?;
        let seq = *self
            .p2p_send
            .entry(dst)
            .and_modify(|c| *c += 1)
            .or_insert(1);
        let ctx = self.ctx("send", seq);
        let n = count(buf.len(), &ctx)?;
        self.reap();
        // MPI reads from its own copy, so `send` returns before the peer receives (as the
        // host transport's does) and pipelines that send both ways do not deadlock.
        let copy = buf.to_vec();
        let mut req: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
        let comm = self.comm;
        // SAFETY: `copy`'s heap buffer stays put in `pending` until MPI is done with it.
        self.call(&ctx, Some(self.members[dst]), || unsafe {
            ffi::MPI_Isend(
                copy.as_ptr() as *const c_void,
                n,
                ffi::RSMPI_FLOAT,
                dst as c_int,
                P2P_TAG,
                comm,
                &mut req,
            )
        })?;
        self.pending.push((req, copy));
        Ok(())
    }

    fn recv(&mut self, buf: &mut [f32], src: usize) -> Result<()> {
        self.check_rank(src, "recv source")?;
        let seq = *self
            .p2p_recv
            .entry(src)
            .and_modify(|c| *c += 1)
            .or_insert(1);
        let ctx = self.ctx("recv", seq);
        let n = count(buf.len(), &ctx)?;
        let peer = self.members[src];
        // SAFETY: MPI_Status is plain data that MPI_Recv fills in.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        let comm = self.comm;
        let r = self.call(&ctx, Some(peer), || unsafe {
            ffi::MPI_Recv(
                buf.as_mut_ptr() as *mut c_void,
                n,
                ffi::RSMPI_FLOAT,
                src as c_int,
                P2P_TAG,
                comm,
                &mut status,
            )
        });
        let mut got: c_int = 0;
        // SAFETY: `status` was filled by MPI_Recv (or zeroed: then `got` is 0 or garbage,
        // only used in the message below).
        unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_FLOAT, &mut got) };
        match r {
            Ok(()) if got == n => Ok(()),
            Ok(()) | Err(_) => Err(DistError::Mismatch {
                ctx,
                peer,
                detail: format!(
                    "rank {peer} sent a different number of values than the {n} expected (received {got}{})",
                    r.err().map(|e| format!("; {e}")).unwrap_or_default()
                ),
            }),
        }
    }

    fn barrier(&mut self) -> Result<()> {
        let ctx = self.next_ctx("barrier");
        let comm = self.comm;
        // SAFETY: a valid communicator.
        self.call(&ctx, None, || unsafe { ffi::MPI_Barrier(comm) })
    }

    fn new_group(&mut self, ranks: &[usize]) -> Result<Box<dyn Communicator>> {
        Ok(Box::new(self.split(ranks)?))
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }
}

impl MpiCommunicator {
    /// [`Communicator::new_group`] returning the concrete type (`MPI_Comm_create_group`: only
    /// the members take part).
    pub fn split(&mut self, ranks: &[usize]) -> Result<MpiCommunicator> {
        if ranks.is_empty() {
            return Err(DistError::InvalidArgument(
                "new_group: empty rank list".into(),
            ));
        }
        let mut seen = vec![false; self.members.len()];
        for &r in ranks {
            self.check_rank(r, "new_group member")?;
            if std::mem::replace(&mut seen[r], true) {
                return Err(DistError::InvalidArgument(format!(
                    "new_group: rank {r} listed twice"
                )));
            }
        }
        let me = ranks.iter().position(|&r| r == self.me).ok_or_else(|| {
            DistError::InvalidArgument(format!(
                "new_group: rank {} is not a member of {ranks:?}",
                self.me
            ))
        })?;
        let members: Vec<usize> = ranks.iter().map(|&r| self.members[r]).collect();
        let ctx = self.next_ctx("new_group");
        let list: Vec<c_int> = ranks.iter().map(|&r| r as c_int).collect();
        let mut comm: ffi::MPI_Comm = unsafe { ffi::RSMPI_COMM_NULL };
        let parent = self.comm;
        // SAFETY: groups and the new communicator are created and the groups freed here.
        self.call(&ctx, None, || unsafe {
            let mut whole: ffi::MPI_Group = ffi::RSMPI_GROUP_NULL;
            let mut sub: ffi::MPI_Group = ffi::RSMPI_GROUP_NULL;
            ffi::MPI_Comm_group(parent, &mut whole);
            ffi::MPI_Group_incl(whole, list.len() as c_int, list.as_ptr(), &mut sub);
            let rc = ffi::MPI_Comm_create_group(parent, sub, 0, &mut comm);
            ffi::MPI_Group_free(&mut sub);
            ffi::MPI_Group_free(&mut whole);
            rc
        })?;
        let desc = describe_group(&members);
        Ok(Self::wrap(
            comm,
            true,
            me,
            members,
            Some(desc),
            self.timeout,
        ))
    }
}

impl Drop for MpiCommunicator {
    fn drop(&mut self) {
        if ::mpi::is_finalized() {
            return;
        }
        let ctx = self.ctx("send (delivery at close)", 0);
        for (mut req, _copy) in std::mem::take(&mut self.pending) {
            // SAFETY: an active request whose buffer `_copy` lives until after the wait.
            let _ = self.call(&ctx, None, || unsafe {
                ffi::MPI_Wait(&mut req, ffi::RSMPI_STATUS_IGNORE)
            });
        }
        if self.owned {
            // SAFETY: a communicator this value created and nobody else holds.
            unsafe { ffi::MPI_Comm_free(&mut self.comm) };
        }
    }
}
