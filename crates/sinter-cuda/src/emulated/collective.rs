//! The emulated devices' NCCL: collectives between ranks that are threads of one process or
//! processes of one machine, over loopback TCP, with NCCL's semantics.
//!
//! As in NCCL's own bootstrap, [`unique_id`] opens a listening socket and puts its address in
//! the id; the process that made the id (rank 0's) runs a coordinator thread there. Every rank
//! connects with [`EmuComm::init_rank`], which returns once all ranks have joined. A collective
//! is queued on the rank's device stream like any device work; when the device reaches it, it
//! sends its buffer to the coordinator and waits. The coordinator combines the buffers of all
//! ranks (reductions in f32 in rank order, rounded once to the dtype) and answers each rank,
//! which writes its result into device memory. Point-to-point sends wait for the matching
//! receive (NCCL's send completes only then).
//!
//! Failures follow NCCL's shape: a collective whose peers never come blocks that device's
//! queue until the communicator is aborted; a rank that leaves without destroying its
//! communicator, or ranks that issue different collectives, break the communicator and every
//! rank sees it as [`EmuComm::async_error`].

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::blas::{load, store};
use super::EmuStream;
use crate::comm::api::{Call, Collectives, Op, RedOp, UniqueId, UNIQUE_ID_BYTES};
use crate::device::CudaDevice;
use crate::driver::Stream;
use crate::dtype::DType;
use crate::error::{CudaError, Result};

const MAGIC: &[u8; 8] = b"SNTREMU1";
/// How long the coordinator waits for every rank to join.
const JOIN_LIMIT: Duration = Duration::from_secs(600);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn comm_err(op: &'static str, msg: impl Into<String>) -> CudaError {
    CudaError::Emulator {
        op,
        msg: msg.into(),
    }
}

// ---- the unique id ----------------------------------------------------------------------------

/// The coordinator's address and this communicator's nonce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Id {
    addr: SocketAddrV4,
    nonce: u64,
}

fn encode_id(id: Id) -> UniqueId {
    let mut b = [0u8; UNIQUE_ID_BYTES];
    b[..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&id.addr.ip().octets());
    b[12..14].copy_from_slice(&id.addr.port().to_le_bytes());
    b[14..22].copy_from_slice(&id.nonce.to_le_bytes());
    b
}

fn decode_id(b: &UniqueId) -> Result<Id> {
    if &b[..8] != MAGIC {
        return Err(comm_err(
            "ncclCommInitRank",
            "this unique id was not made by the emulated NCCL: every rank must use emulated CUDA devices (SINTER_CUDA_EMU / --device cuda-emu), or none",
        ));
    }
    let ip = Ipv4Addr::new(b[8], b[9], b[10], b[11]);
    let port = u16::from_le_bytes([b[12], b[13]]);
    let nonce = u64::from_le_bytes(b[14..22].try_into().expect("8 bytes"));
    Ok(Id {
        addr: SocketAddrV4::new(ip, port),
        nonce,
    })
}

fn fresh_nonce() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = t ^ ((std::process::id() as u64) << 32) ^ COUNTER.fetch_add(1, Ordering::Relaxed);
    // splitmix64: spread the bits.
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A fresh id: a listening socket on loopback and the coordinator thread behind it.
pub(crate) fn unique_id() -> Result<UniqueId> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| comm_err("ncclGetUniqueId", format!("cannot listen on loopback: {e}")))?;
    let addr = match listener.local_addr() {
        Ok(std::net::SocketAddr::V4(a)) => a,
        other => {
            return Err(comm_err(
                "ncclGetUniqueId",
                format!("local address {other:?}"),
            ))
        }
    };
    let id = Id {
        addr,
        nonce: fresh_nonce(),
    };
    std::thread::Builder::new()
        .name("sinter-emu-nccl".into())
        .spawn(move || coordinate(listener, id.nonce))
        .map_err(|e| {
            comm_err(
                "ncclGetUniqueId",
                format!("cannot start the coordinator: {e}"),
            )
        })?;
    Ok(encode_id(id))
}

// ---- the wire ---------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
enum Msg {
    Hello {
        nonce: u64,
        rank: u32,
        nranks: u32,
    },
    Coll {
        seq: u64,
        call: WireCall,
        data: Vec<u8>,
    },
    Send {
        peer: u32,
        data: Vec<u8>,
    },
    Recv {
        peer: u32,
        bytes: u64,
    },
    Bye,
    Welcome,
    Result {
        data: Vec<u8>,
    },
    Ack,
    Error {
        msg: String,
    },
}

/// What every rank must agree on for one collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WireCall {
    kind: u8,
    op: u8,
    root: u32,
    dtype: u8,
    count: u64,
    recv_count: u64,
}

const KINDS: [&str; 4] = ["all_reduce", "reduce_scatter", "all_gather", "broadcast"];
const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

impl WireCall {
    fn new(op: &Op) -> Option<WireCall> {
        let red = |o: RedOp| if o == RedOp::Sum { 0 } else { 1 };
        let (kind, o, root) = match op.call {
            Call::AllReduce(o) => (0, red(o), 0),
            Call::ReduceScatter(o) => (1, red(o), 0),
            Call::AllGather => (2, 0, 0),
            Call::Broadcast(r) => (3, 0, r as u32),
            Call::Send(_) | Call::Recv(_) => return None,
        };
        Some(WireCall {
            kind,
            op: o,
            root,
            dtype: DTYPES.iter().position(|&d| d == op.dtype)? as u8,
            count: op.count as u64,
            recv_count: op.recv_count as u64,
        })
    }
    fn dtype(&self) -> DType {
        DTYPES[self.dtype as usize % DTYPES.len()]
    }
    fn describe(&self) -> String {
        format!(
            "{} of {} x {}",
            KINDS.get(self.kind as usize).copied().unwrap_or("?"),
            self.count,
            self.dtype()
        )
    }
}

struct Enc(Vec<u8>);
impl Enc {
    fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(v);
        self
    }
}

struct Dec<'a>(&'a [u8]);
impl Dec<'_> {
    fn take(&mut self, n: usize) -> std::io::Result<&[u8]> {
        if self.0.len() < n {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "truncated message",
            ));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> std::io::Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> std::io::Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> std::io::Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn rest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0).to_vec()
    }
}

impl Msg {
    fn encode(&self) -> Vec<u8> {
        let e = Enc(Vec::new());
        match self {
            Msg::Hello {
                nonce,
                rank,
                nranks,
            } => e.u8(1).u64(*nonce).u32(*rank).u32(*nranks),
            Msg::Coll { seq, call, data } => e
                .u8(2)
                .u64(*seq)
                .u8(call.kind)
                .u8(call.op)
                .u32(call.root)
                .u8(call.dtype)
                .u64(call.count)
                .u64(call.recv_count)
                .bytes(data),
            Msg::Send { peer, data } => e.u8(3).u32(*peer).bytes(data),
            Msg::Recv { peer, bytes } => e.u8(4).u32(*peer).u64(*bytes),
            Msg::Bye => e.u8(5),
            Msg::Welcome => e.u8(10),
            Msg::Result { data } => e.u8(11).bytes(data),
            Msg::Ack => e.u8(12),
            Msg::Error { msg } => e.u8(13).bytes(msg.as_bytes()),
        }
        .0
    }

    fn decode(b: &[u8]) -> std::io::Result<Msg> {
        let mut d = Dec(b);
        Ok(match d.u8()? {
            1 => Msg::Hello {
                nonce: d.u64()?,
                rank: d.u32()?,
                nranks: d.u32()?,
            },
            2 => {
                let seq = d.u64()?;
                let call = WireCall {
                    kind: d.u8()?,
                    op: d.u8()?,
                    root: d.u32()?,
                    dtype: d.u8()?,
                    count: d.u64()?,
                    recv_count: d.u64()?,
                };
                Msg::Coll {
                    seq,
                    call,
                    data: d.rest(),
                }
            }
            3 => Msg::Send {
                peer: d.u32()?,
                data: d.rest(),
            },
            4 => Msg::Recv {
                peer: d.u32()?,
                bytes: d.u64()?,
            },
            5 => Msg::Bye,
            10 => Msg::Welcome,
            11 => Msg::Result { data: d.rest() },
            12 => Msg::Ack,
            13 => Msg::Error {
                msg: String::from_utf8_lossy(&d.rest()).into_owned(),
            },
            t => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("unknown message tag {t}"),
                ))
            }
        })
    }
}

fn write_msg(w: &mut impl Write, m: &Msg) -> std::io::Result<()> {
    let body = m.encode();
    w.write_all(&(body.len() as u64).to_le_bytes())?;
    w.write_all(&body)?;
    w.flush()
}

fn read_msg(r: &mut impl Read) -> std::io::Result<Msg> {
    let mut len = [0u8; 8];
    r.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len) as usize;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Msg::decode(&body)
}

// ---- reductions -------------------------------------------------------------------------------

fn to_f32(d: DType, bytes: &[u8]) -> Vec<f32> {
    let n = bytes.len() / d.size();
    // SAFETY: `bytes` holds `n` elements of `d`.
    (0..n)
        .map(|i| unsafe { load(d, bytes.as_ptr() as u64, i) })
        .collect()
}

fn from_f32(d: DType, v: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; v.len() * d.size()];
    for (i, &x) in v.iter().enumerate() {
        // SAFETY: `out` holds `v.len()` elements of `d`.
        unsafe { store(d, out.as_mut_ptr() as u64, i, x) };
    }
    out
}

/// The answer of each rank to one collective, from every rank's send buffer.
fn combine(call: &WireCall, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let n = inputs.len();
    let d = call.dtype();
    let reduce = || -> Vec<f32> {
        let mut acc = to_f32(d, &inputs[0]);
        for x in &inputs[1..] {
            for (a, b) in acc.iter_mut().zip(to_f32(d, x)) {
                *a += b;
            }
        }
        if call.op == 1 {
            for a in &mut acc {
                *a /= n as f32;
            }
        }
        acc
    };
    match call.kind {
        0 => vec![from_f32(d, &reduce()); n],
        1 => {
            let all = reduce();
            let rc = call.recv_count as usize;
            (0..n)
                .map(|r| from_f32(d, &all[r * rc..(r + 1) * rc]))
                .collect()
        }
        2 => vec![inputs.concat(); n],
        _ => vec![inputs[call.root as usize].clone(); n],
    }
}

// ---- the coordinator --------------------------------------------------------------------------

/// Accept the ranks, then serve their collectives until all have left.
fn coordinate(listener: TcpListener, nonce: u64) {
    let Some(conns) = join(&listener, nonce) else {
        return;
    };
    drop(listener);
    let (tx, rx) = mpsc::channel::<(usize, std::io::Result<Msg>)>();
    let mut writers = Vec::new();
    for (rank, c) in conns.into_iter().enumerate() {
        let mut reader = match c.try_clone() {
            Ok(r) => r,
            Err(_) => return,
        };
        writers.push(c);
        let tx = tx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("sinter-emu-nccl-r{rank}"))
            .spawn(move || loop {
                let m = read_msg(&mut reader);
                let stop = m.is_err() || matches!(m, Ok(Msg::Bye));
                if tx.send((rank, m)).is_err() || stop {
                    return;
                }
            });
        if spawned.is_err() {
            return;
        }
    }
    drop(tx);
    let mut c = Coordinator::new(writers);
    while c.live() {
        match rx.recv() {
            Ok((rank, m)) => c.handle(rank, m),
            Err(_) => break,
        }
    }
}

/// Wait for every rank's hello; `None` when the join failed (the ranks were told why).
fn join(listener: &TcpListener, nonce: u64) -> Option<Vec<TcpStream>> {
    listener.set_nonblocking(true).ok()?;
    let deadline = Instant::now() + JOIN_LIMIT;
    let mut slots: Vec<Option<TcpStream>> = Vec::new();
    let mut expected: Option<usize> = None;
    while expected.is_none_or(|n| slots.iter().filter(|s| s.is_some()).count() < n) {
        if Instant::now() > deadline {
            let why = format!(
                "not every rank joined within {} s (ncclCommInitRank)",
                JOIN_LIMIT.as_secs()
            );
            for c in slots.iter_mut().flatten() {
                let _ = write_msg(c, &Msg::Error { msg: why.clone() });
            }
            return None;
        }
        let mut c = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(_) => continue,
        };
        let _ = c.set_nonblocking(false);
        let _ = c.set_nodelay(true);
        let _ = c.set_read_timeout(Some(Duration::from_secs(30)));
        let hello = read_msg(&mut c);
        let _ = c.set_read_timeout(None);
        let refuse = |c: &mut TcpStream, msg: String| {
            let _ = write_msg(c, &Msg::Error { msg });
        };
        let Ok(Msg::Hello {
            nonce: got,
            rank,
            nranks,
        }) = hello
        else {
            refuse(&mut c, "expected a hello".into());
            continue;
        };
        let (rank, nranks) = (rank as usize, nranks as usize);
        if got != nonce {
            refuse(
                &mut c,
                "stale unique id (the communicator it named is gone)".into(),
            );
            continue;
        }
        let n = *expected.get_or_insert(nranks);
        if nranks != n || rank >= n {
            refuse(
                &mut c,
                format!("rank {rank} of {nranks} joined a communicator of {n} ranks"),
            );
            continue;
        }
        slots.resize_with(n, || None);
        if slots[rank].is_some() {
            refuse(&mut c, format!("rank {rank} joined twice"));
            continue;
        }
        slots[rank] = Some(c);
    }
    let mut conns: Vec<TcpStream> = slots.into_iter().flatten().collect();
    for c in &mut conns {
        write_msg(c, &Msg::Welcome).ok()?;
    }
    Some(conns)
}

/// One rank's contribution to a collective: its call and its bytes.
type Contribution = (WireCall, Vec<u8>);

struct Coordinator {
    writers: Vec<TcpStream>,
    gone: Vec<bool>,
    broken: Option<String>,
    /// Contributions to collective `seq`: (call, data) per rank.
    colls: HashMap<u64, Vec<Option<Contribution>>>,
    /// Sends from `.0` to `.1` not yet received.
    mail: HashMap<(usize, usize), VecDeque<Vec<u8>>>,
    /// Receives posted by `.1` from `.0` not yet matched, with their byte counts.
    wants: HashMap<(usize, usize), VecDeque<u64>>,
}

impl Coordinator {
    fn new(writers: Vec<TcpStream>) -> Self {
        let n = writers.len();
        Coordinator {
            writers,
            gone: vec![false; n],
            broken: None,
            colls: HashMap::new(),
            mail: HashMap::new(),
            wants: HashMap::new(),
        }
    }

    fn live(&self) -> bool {
        self.gone.iter().any(|g| !g)
    }

    fn tell(&mut self, rank: usize, m: &Msg) {
        if !self.gone[rank] && write_msg(&mut self.writers[rank], m).is_err() {
            self.gone[rank] = true;
        }
    }

    /// Break the communicator: every rank still here hears why (as its next answer).
    fn break_with(&mut self, why: String) {
        if self.broken.is_some() {
            return;
        }
        self.broken = Some(why.clone());
        for r in 0..self.writers.len() {
            self.tell(r, &Msg::Error { msg: why.clone() });
        }
    }

    fn handle(&mut self, rank: usize, m: std::io::Result<Msg>) {
        let m = match m {
            Ok(Msg::Bye) => {
                self.gone[rank] = true;
                return;
            }
            Ok(m) => m,
            Err(_) => {
                self.gone[rank] = true;
                self.break_with(format!(
                    "rank {rank} left the communicator without destroying it (its process or thread ended, or it aborted)"
                ));
                return;
            }
        };
        if let Some(why) = self.broken.clone() {
            self.tell(rank, &Msg::Error { msg: why });
            return;
        }
        match m {
            Msg::Coll { seq, call, data } => self.collective(rank, seq, call, data),
            Msg::Send { peer, data } => {
                let key = (rank, peer as usize);
                if peer as usize >= self.writers.len() {
                    self.tell(
                        rank,
                        &Msg::Error {
                            msg: format!("send to rank {peer}, which does not exist"),
                        },
                    );
                    return;
                }
                self.mail.entry(key).or_default().push_back(data);
                self.match_p2p(key);
            }
            Msg::Recv { peer, bytes } => {
                let key = (peer as usize, rank);
                if peer as usize >= self.writers.len() {
                    self.tell(
                        rank,
                        &Msg::Error {
                            msg: format!("receive from rank {peer}, which does not exist"),
                        },
                    );
                    return;
                }
                self.wants.entry(key).or_default().push_back(bytes);
                self.match_p2p(key);
            }
            other => self.break_with(format!("rank {rank} sent an unexpected {other:?}")),
        }
    }

    fn collective(&mut self, rank: usize, seq: u64, call: WireCall, data: Vec<u8>) {
        let n = self.writers.len();
        let slot = self.colls.entry(seq).or_insert_with(|| vec![None; n]);
        if let Some((other, (first, _))) = slot
            .iter()
            .enumerate()
            .find_map(|(r, c)| c.as_ref().map(|c| (r, c)))
        {
            if *first != call {
                let why = format!(
                    "collective #{seq}: rank {rank} called {} but rank {other} called {}; every rank must issue the same collectives in the same order",
                    call.describe(),
                    first.describe()
                );
                self.break_with(why);
                return;
            }
        }
        if call.kind == 3 && call.root as usize >= n {
            self.break_with(format!(
                "collective #{seq}: broadcast from rank {}, of {n}",
                call.root
            ));
            return;
        }
        slot[rank] = Some((call, data));
        if slot.iter().any(Option::is_none) {
            return;
        }
        let slot = self.colls.remove(&seq).expect("present");
        let inputs: Vec<Vec<u8>> = slot.into_iter().map(|c| c.expect("all").1).collect();
        let size = call.dtype().size() as u64;
        if let Some(r) = inputs
            .iter()
            .position(|x| x.len() as u64 != call.count * size)
        {
            self.break_with(format!(
                "collective #{seq}: rank {r} sent a buffer of the wrong size"
            ));
            return;
        }
        for (r, out) in combine(&call, &inputs).into_iter().enumerate() {
            self.tell(r, &Msg::Result { data: out });
        }
    }

    fn match_p2p(&mut self, key: (usize, usize)) {
        let (from, to) = key;
        loop {
            let ready = self.mail.get(&key).is_some_and(|q| !q.is_empty())
                && self.wants.get(&key).is_some_and(|q| !q.is_empty());
            if !ready {
                return;
            }
            let data = self
                .mail
                .get_mut(&key)
                .and_then(VecDeque::pop_front)
                .expect("ready");
            let want = self
                .wants
                .get_mut(&key)
                .and_then(VecDeque::pop_front)
                .expect("ready");
            if data.len() as u64 != want {
                self.break_with(format!(
                    "rank {from} sent {} bytes to rank {to}, which expected {want}",
                    data.len()
                ));
                return;
            }
            self.tell(to, &Msg::Result { data });
            self.tell(from, &Msg::Ack);
        }
    }
}

// ---- a rank -----------------------------------------------------------------------------------

struct Client {
    rank: usize,
    nranks: usize,
    conn: Mutex<TcpStream>,
    error: Mutex<Option<String>>,
    aborted: AtomicBool,
}

impl Client {
    fn fail(&self, why: String) {
        if !self.aborted.load(Ordering::SeqCst) {
            lock(&self.error).get_or_insert(why);
        }
    }

    /// One operation, run by the device's worker when the stream reaches it.
    fn run(&self, op: Op, seq: u64) {
        if self.aborted.load(Ordering::SeqCst) || lock(&self.error).is_some() {
            return;
        }
        if let Err(why) = self.exchange(&op, seq) {
            self.fail(format!("rank {} of {}: {why}", self.rank, self.nranks));
        }
    }

    fn exchange(&self, op: &Op, seq: u64) -> std::result::Result<(), String> {
        let size = op.dtype.size();
        // SAFETY: `Comm` checked the buffers against the call; device memory is host memory,
        // live in stream order.
        let read = |ptr: u64, n: usize| unsafe {
            std::slice::from_raw_parts(ptr as *const u8, n * size).to_vec()
        };
        let msg = match op.call {
            Call::Send(peer) => Msg::Send {
                peer: peer as u32,
                data: read(op.send, op.count),
            },
            Call::Recv(peer) => Msg::Recv {
                peer: peer as u32,
                bytes: (op.count * size) as u64,
            },
            _ => Msg::Coll {
                seq,
                call: WireCall::new(op).ok_or("unsupported collective")?,
                data: read(op.send, op.count),
            },
        };
        let mut conn = lock(&self.conn);
        let io = |e: std::io::Error| format!("lost the connection to the coordinator: {e}");
        write_msg(&mut *conn, &msg).map_err(io)?;
        match (read_msg(&mut *conn).map_err(io)?, op.call) {
            (Msg::Ack, Call::Send(_)) => Ok(()),
            (Msg::Result { data }, c) if !matches!(c, Call::Send(_)) => {
                if data.len() != op.recv_count * size {
                    return Err(format!(
                        "the coordinator answered {} bytes, expected {}",
                        data.len(),
                        op.recv_count * size
                    ));
                }
                // SAFETY: as above, for the receive buffer.
                unsafe {
                    std::ptr::copy_nonoverlapping(data.as_ptr(), op.recv as *mut u8, data.len())
                };
                Ok(())
            }
            (Msg::Error { msg }, _) => Err(msg),
            (other, _) => Err(format!("unexpected answer {other:?}")),
        }
    }
}

/// One rank of an emulated communicator.
pub(crate) struct EmuComm {
    client: Arc<Client>,
    /// The socket, for shutting it down on abort (unblocks a waiting operation).
    control: TcpStream,
    seq: AtomicU64,
}

impl EmuComm {
    /// Join communicator `id` as `rank` of `nranks` on emulated device `ordinal`; returns
    /// once every rank has joined.
    pub(crate) fn init_rank(
        ordinal: usize,
        id: &UniqueId,
        nranks: usize,
        rank: usize,
    ) -> Result<EmuComm> {
        let id = decode_id(id)?;
        let fail = |m: String| {
            comm_err(
                "ncclCommInitRank",
                format!("rank {rank} of {nranks} (emulated device {ordinal}): {m}"),
            )
        };
        let mut conn = TcpStream::connect_timeout(&id.addr.into(), Duration::from_secs(30))
            .map_err(|e| {
                fail(format!(
                    "cannot reach the communicator's coordinator at {} ({e}); the emulated NCCL connects ranks on one machine only",
                    id.addr
                ))
            })?;
        let _ = conn.set_nodelay(true);
        let hello = Msg::Hello {
            nonce: id.nonce,
            rank: rank as u32,
            nranks: nranks as u32,
        };
        write_msg(&mut conn, &hello).map_err(|e| fail(e.to_string()))?;
        match read_msg(&mut conn).map_err(|e| fail(e.to_string()))? {
            Msg::Welcome => {}
            Msg::Error { msg } => return Err(fail(msg)),
            other => return Err(fail(format!("unexpected answer {other:?}"))),
        }
        let control = conn.try_clone().map_err(|e| fail(e.to_string()))?;
        Ok(EmuComm {
            client: Arc::new(Client {
                rank,
                nranks,
                conn: Mutex::new(conn),
                error: Mutex::default(),
                aborted: AtomicBool::new(false),
            }),
            control,
            seq: AtomicU64::new(0),
        })
    }
}

impl Collectives for EmuComm {
    fn owns(&self, dev: &CudaDevice, stream: &Stream) -> bool {
        EmuStream::of(stream).is_some_and(|s| s.ordinal() == dev.ordinal())
    }

    fn is_emulated(&self) -> bool {
        true
    }

    /// Queue `op` on `stream` (the collectives are numbered in queueing order, the order
    /// every rank must follow).
    fn call(&self, _dev: &CudaDevice, op: &Op, stream: &Stream) -> Result<()> {
        let stream = EmuStream::of(stream)
            .ok_or_else(|| comm_err("nccl", "not a stream of an emulated device"))?;
        let op = *op;
        if self.client.aborted.load(Ordering::SeqCst) {
            return Err(comm_err("nccl", "the communicator was aborted"));
        }
        let seq = match op.call {
            Call::Send(_) | Call::Recv(_) => 0,
            _ => self.seq.fetch_add(1, Ordering::SeqCst) + 1,
        };
        let client = self.client.clone();
        stream.submit(Box::new(move || {
            client.run(op, seq);
            Ok(())
        }))
    }

    fn async_error(&self) -> Option<String> {
        lock(&self.client.error).clone()
    }

    fn abort(&mut self) {
        self.client.aborted.store(true, Ordering::SeqCst);
        let _ = self.control.shutdown(Shutdown::Both);
    }
}

impl Drop for EmuComm {
    fn drop(&mut self) {
        if !self.client.aborted.load(Ordering::SeqCst) {
            let _ = write_msg(&mut self.control, &Msg::Bye);
        }
        let _ = self.control.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_messages_round_trip() {
        let id = Id {
            addr: SocketAddrV4::new(Ipv4Addr::LOCALHOST, 40123),
            nonce: 0xDEAD_BEEF_1234,
        };
        assert_eq!(decode_id(&encode_id(id)).unwrap(), id);
        assert!(decode_id(&[7u8; UNIQUE_ID_BYTES]).is_err());
        let call = WireCall {
            kind: 1,
            op: 1,
            root: 0,
            dtype: 2,
            count: 6,
            recv_count: 3,
        };
        for m in [
            Msg::Hello {
                nonce: 5,
                rank: 1,
                nranks: 2,
            },
            Msg::Coll {
                seq: 9,
                call,
                data: vec![1, 2, 3],
            },
            Msg::Send {
                peer: 3,
                data: vec![9; 10],
            },
            Msg::Recv { peer: 0, bytes: 40 },
            Msg::Bye,
            Msg::Welcome,
            Msg::Result { data: vec![] },
            Msg::Ack,
            Msg::Error { msg: "x y".into() },
        ] {
            let mut buf = Vec::new();
            write_msg(&mut buf, &m).unwrap();
            assert_eq!(read_msg(&mut buf.as_slice()).unwrap(), m);
        }
        assert!(Msg::decode(&[99]).is_err());
        assert!(Msg::decode(&[1, 0]).is_err());
    }

    #[test]
    fn combine_follows_nccl() {
        let f = |v: &[f32]| from_f32(DType::F32, v);
        let back = |b: &[u8]| to_f32(DType::F32, b);
        let call = |kind, op, count, recv_count| WireCall {
            kind,
            op,
            root: 1,
            dtype: 0,
            count,
            recv_count,
        };
        let ins = vec![f(&[1.0, 2.0, 3.0, 4.0]), f(&[10.0, 20.0, 30.0, 40.0])];
        let sum = combine(&call(0, 0, 4, 4), &ins);
        assert_eq!(back(&sum[1]), [11.0, 22.0, 33.0, 44.0]);
        let avg = combine(&call(0, 1, 4, 4), &ins);
        assert_eq!(back(&avg[0]), [5.5, 11.0, 16.5, 22.0]);
        let rs = combine(&call(1, 0, 4, 2), &ins);
        assert_eq!(
            (back(&rs[0]), back(&rs[1])),
            (vec![11.0, 22.0], vec![33.0, 44.0])
        );
        let ag = combine(&call(2, 0, 4, 8), &ins);
        assert_eq!(back(&ag[0]), [1.0, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0, 40.0]);
        let bc = combine(&call(3, 0, 4, 4), &ins);
        assert_eq!(back(&bc[0]), [10.0, 20.0, 30.0, 40.0]);
        // bf16 sums in f32 and rounds once: 256 + 1 + 1 = 258, where rounding after each
        // addition would stay at 256 (ties to even).
        let b = |v: &[f32]| from_f32(DType::BF16, v);
        let s = combine(
            &WireCall {
                dtype: 2,
                ..call(0, 0, 1, 1)
            },
            &[b(&[256.0]), b(&[1.0]), b(&[1.0])],
        );
        assert_eq!(to_f32(DType::BF16, &s[0]), [258.0]);
    }
}
