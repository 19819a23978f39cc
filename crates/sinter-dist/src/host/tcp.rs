//! TCP backend: after a rendezvous through the [`crate::store`], every pair of ranks holds one
//! connection (the higher rank dials the lower one). A reader thread per connection files
//! incoming frames into the rank's mailbox; a closed connection marks the peer lost so that
//! waits on it fail at once.
//!
//! Frame: `[op u8][total u56][group u64][tag u64][len u64]` then `len` little-endian `f32`s
//! (`total`: length of the buffer the frame is a segment of).

use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::mailbox::{Mailbox, Msg};
use super::{HostCommunicator, SendFail, Shared, Transport};
use crate::comm::default_timeout;
use crate::error::{DistError, OpContext, Result};
use crate::store::{StoreClient, StoreServer};

const MAGIC: u32 = 0x534e_5452; // "SNTR"
const HEADER: usize = 32;
/// Upper bound on one frame's element count (guards against corrupt headers); senders split
/// buffers into segments far below it.
const MAX_FRAME_ELEMS: u64 = 1 << 26;
/// Key prefix of the rendezvous in the store.
pub const STORE_PREFIX: &str = "sinter/v1";

/// Options of the TCP backend.
#[derive(Debug, Clone)]
pub struct TcpOptions {
    /// Per-call timeout of the collectives (default: [`crate::default_timeout`]).
    pub timeout: Duration,
    /// Time allowed for the rendezvous: reaching the store, all peers publishing their
    /// addresses and connecting (default: same as `timeout`).
    pub connect_timeout: Duration,
    /// Address to listen on for peers; default: the local address of the connection to the
    /// store (the interface that routes to the master).
    pub bind_ip: Option<IpAddr>,
}

/// Environment variable naming the IP address this rank listens on for its peers (when the
/// address that routes to the master is not the right one, e.g. a hostname mapped to
/// 127.0.1.1).
pub const SOCKET_IP_ENV: &str = "SINTER_SOCKET_IP";

impl Default for TcpOptions {
    /// Timeouts from [`default_timeout`]; `bind_ip` from `SINTER_SOCKET_IP` if set.
    fn default() -> Self {
        let t = default_timeout();
        TcpOptions {
            timeout: t,
            connect_timeout: t,
            bind_ip: std::env::var(SOCKET_IP_ENV)
                .ok()
                .and_then(|v| v.trim().parse().ok()),
        }
    }
}

impl TcpOptions {
    /// Same timeout for the collectives and the rendezvous.
    pub fn with_timeout(timeout: Duration) -> Self {
        TcpOptions {
            timeout,
            connect_timeout: timeout,
            bind_ip: None,
        }
    }
}

struct TcpTransport {
    rank: usize,
    world: usize,
    mailbox: Arc<Mailbox>,
    writers: Vec<Option<Mutex<TcpStream>>>,
    readers: Vec<JoinHandle<()>>,
    closing: Arc<AtomicBool>,
}

fn as_bytes(data: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern may be read; u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

fn as_bytes_mut(data: &mut [f32]) -> &mut [u8] {
    // SAFETY: every byte pattern is a valid f32; u8 has alignment 1; same length in bytes.
    unsafe {
        std::slice::from_raw_parts_mut(data.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(data))
    }
}

fn io_fail(e: std::io::Error) -> SendFail {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => SendFail::Timeout,
        _ => SendFail::Lost(e.to_string()),
    }
}

impl Transport for TcpTransport {
    fn world_rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn mailbox(&self) -> &Mailbox {
        &self.mailbox
    }
    fn name(&self) -> &'static str {
        "tcp"
    }
    fn send(
        &self,
        dst: usize,
        group: u64,
        tag: u64,
        op: u8,
        total: u64,
        data: &[f32],
    ) -> std::result::Result<(), SendFail> {
        if dst == self.rank {
            self.mailbox.push(
                (self.rank, group, tag),
                Msg {
                    op,
                    total,
                    data: data.to_vec(),
                },
            );
            return Ok(());
        }
        if let Some(r) = self.mailbox.lost_reason(dst) {
            return Err(SendFail::Lost(r));
        }
        let w = self.writers[dst]
            .as_ref()
            .ok_or_else(|| SendFail::Lost("no connection".into()))?;
        let mut h = [0u8; HEADER];
        h[0] = op;
        h[1..8].copy_from_slice(&total.to_le_bytes()[..7]);
        h[8..16].copy_from_slice(&group.to_le_bytes());
        h[16..24].copy_from_slice(&tag.to_le_bytes());
        h[24..32].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let mut s = w.lock().unwrap_or_else(|e| e.into_inner());
        let r = if data.len() <= 4096 {
            let mut frame = Vec::with_capacity(HEADER + 4 * data.len());
            frame.extend_from_slice(&h);
            push_le(&mut frame, data);
            s.write_all(&frame)
        } else {
            s.write_all(&h).and_then(|_| {
                if cfg!(target_endian = "little") {
                    s.write_all(as_bytes(data))
                } else {
                    let mut v = Vec::with_capacity(4 * data.len());
                    push_le(&mut v, data);
                    s.write_all(&v)
                }
            })
        };
        r.map_err(|e| {
            // A partly written frame leaves the stream unusable.
            self.mailbox.mark_lost(dst, format!("send failed: {e}"));
            io_fail(e)
        })
    }
}

fn push_le(out: &mut Vec<u8>, data: &[f32]) {
    if cfg!(target_endian = "little") {
        out.extend_from_slice(as_bytes(data));
    } else {
        for x in data {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        for s in self.writers.iter().flatten() {
            let _ = s
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .shutdown(Shutdown::Both);
        }
        for h in self.readers.drain(..) {
            let _ = h.join();
        }
    }
}

fn reader_loop(mut s: TcpStream, peer: usize, mb: Arc<Mailbox>, closing: Arc<AtomicBool>) {
    let reason = loop {
        let mut h = [0u8; HEADER];
        if let Err(e) = s.read_exact(&mut h) {
            break if e.kind() == std::io::ErrorKind::UnexpectedEof {
                format!("rank {peer} closed the connection")
            } else {
                format!("reading from rank {peer}: {e}")
            };
        }
        let op = h[0];
        let mut tb = [0u8; 8];
        tb[..7].copy_from_slice(&h[1..8]);
        let total = u64::from_le_bytes(tb);
        let group = u64::from_le_bytes(h[8..16].try_into().unwrap());
        let tag = u64::from_le_bytes(h[16..24].try_into().unwrap());
        let len = u64::from_le_bytes(h[24..32].try_into().unwrap());
        if len > MAX_FRAME_ELEMS {
            break format!("corrupt frame from rank {peer} (length {len})");
        }
        let mut data = vec![0f32; len as usize];
        if let Err(e) = s.read_exact(as_bytes_mut(&mut data)) {
            break format!("reading from rank {peer}: {e}");
        }
        if cfg!(target_endian = "big") {
            for x in &mut data {
                *x = f32::from_bits(u32::from_le(x.to_bits()));
            }
        }
        mb.push((peer, group, tag), Msg { op, total, data });
    };
    if !closing.load(Ordering::SeqCst) {
        mb.mark_lost(peer, reason);
    } else {
        mb.mark_lost(peer, "communicator closed".into());
    }
}

fn handshake_bytes(rank: usize, world: usize) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4..12].copy_from_slice(&(rank as u64).to_le_bytes());
    b[12..20].copy_from_slice(&(world as u64).to_le_bytes());
    b
}

fn parse_handshake(b: &[u8; 20]) -> Option<(usize, usize)> {
    (u32::from_le_bytes(b[0..4].try_into().unwrap()) == MAGIC).then(|| {
        (
            u64::from_le_bytes(b[4..12].try_into().unwrap()) as usize,
            u64::from_le_bytes(b[12..20].try_into().unwrap()) as usize,
        )
    })
}

/// Connects `rank` of a `world`-rank job through the store at `store_addr` (`host:port`,
/// which must already be served, e.g. by [`StoreServer::bind`]). All ranks call it.
pub fn connect(
    rank: usize,
    world: usize,
    store_addr: &str,
    opts: &TcpOptions,
) -> Result<HostCommunicator> {
    if world <= 1 {
        return Ok(single(opts.timeout));
    }
    let store = StoreClient::connect(store_addr, opts.connect_timeout)?;
    connect_with(rank, world, store, None, opts)
}

/// A one-rank TCP communicator (no sockets).
pub(crate) fn single(timeout: Duration) -> HostCommunicator {
    let t = TcpTransport {
        rank: 0,
        world: 1,
        mailbox: Arc::default(),
        writers: vec![None],
        readers: Vec::new(),
        closing: Arc::default(),
    };
    HostCommunicator::new_world(Arc::new(t), Shared::default(), timeout)
}

pub(crate) fn connect_with(
    rank: usize,
    world: usize,
    store: StoreClient,
    server: Option<StoreServer>,
    opts: &TcpOptions,
) -> Result<HostCommunicator> {
    if rank >= world {
        return Err(DistError::InvalidArgument(format!(
            "rank {rank} >= world size {world}"
        )));
    }
    let ctx = OpContext {
        op: "rendezvous",
        seq: 1,
        rank,
        group: None,
    };
    let timeout_err = |peer: Option<usize>| DistError::Timeout {
        ctx: ctx.clone(),
        peer,
        after: opts.connect_timeout,
    };
    let deadline = Instant::now() + opts.connect_timeout;
    let left = || deadline.saturating_duration_since(Instant::now());

    let ip = match opts.bind_ip {
        Some(ip) => ip,
        None => store.local_addr()?.ip(),
    };
    let listener = TcpListener::bind(SocketAddr::new(ip, 0))
        .map_err(|e| DistError::io(format!("rendezvous: listen on {ip}"), e))?;
    let my_addr = listener
        .local_addr()
        .map_err(|e| DistError::io("rendezvous: local_addr", e))?;
    store.set(
        &format!("{STORE_PREFIX}/addr/{rank}"),
        my_addr.to_string().as_bytes(),
    )?;

    // Read every lower rank's address first, so that once the lower ranks have accepted us
    // we no longer need the store (rank 0 may then drop it).
    let mut lower = Vec::with_capacity(rank);
    for j in 0..rank {
        let v = store
            .wait(&format!("{STORE_PREFIX}/addr/{j}"), left())?
            .ok_or_else(|| timeout_err(Some(j)))?;
        let s = String::from_utf8_lossy(&v).into_owned();
        let a: SocketAddr = s
            .parse()
            .map_err(|_| DistError::Store(format!("rank {j} published a bad address `{s}`")))?;
        lower.push(a);
    }

    let mut streams: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
    for (j, a) in lower.iter().enumerate() {
        let s = dial(*a, j, rank, world, deadline).map_err(|e| match e {
            DialError::Timeout => timeout_err(Some(j)),
            DialError::Other(m) => {
                DistError::Store(format!("rendezvous: connecting to rank {j} at {a}: {m}"))
            }
        })?;
        streams[j] = Some(s);
    }

    // Accept the higher ranks.
    listener
        .set_nonblocking(true)
        .map_err(|e| DistError::io("rendezvous: set_nonblocking", e))?;
    let mut missing = world - rank - 1;
    while missing > 0 {
        match listener.accept() {
            Ok((mut s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(
                    left().clamp(Duration::from_millis(10), Duration::from_secs(10)),
                ));
                let mut hb = [0u8; 20];
                if s.read_exact(&mut hb).is_err() {
                    continue;
                }
                let Some((peer, w)) = parse_handshake(&hb) else {
                    continue;
                };
                if w != world || peer <= rank || peer >= world || streams[peer].is_some() {
                    continue;
                }
                if s.write_all(&handshake_bytes(rank, world)).is_err() {
                    continue;
                }
                streams[peer] = Some(s);
                missing -= 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let first_missing = (rank + 1..world).find(|&p| streams[p].is_none());
                    return Err(timeout_err(first_missing));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(DistError::io("rendezvous: accept", e)),
        }
    }

    let mailbox: Arc<Mailbox> = Arc::default();
    let closing: Arc<AtomicBool> = Arc::default();
    let mut writers = Vec::with_capacity(world);
    let mut readers = Vec::new();
    for (peer, s) in streams.into_iter().enumerate() {
        let Some(s) = s else {
            writers.push(None);
            continue;
        };
        s.set_nodelay(true)
            .map_err(|e| DistError::io("set_nodelay", e))?;
        s.set_read_timeout(None)
            .map_err(|e| DistError::io("set_read_timeout", e))?;
        s.set_write_timeout(Some(opts.timeout))
            .map_err(|e| DistError::io("set_write_timeout", e))?;
        let r = s.try_clone().map_err(|e| DistError::io("try_clone", e))?;
        let (mb, cl) = (mailbox.clone(), closing.clone());
        let h = std::thread::Builder::new()
            .name(format!("sinter-tcp-{rank}<-{peer}"))
            .stack_size(256 * 1024)
            .spawn(move || reader_loop(r, peer, mb, cl))
            .map_err(|e| DistError::io("spawn reader", e))?;
        readers.push(h);
        writers.push(Some(Mutex::new(s)));
    }
    let t = TcpTransport {
        rank,
        world,
        mailbox,
        writers,
        readers,
        closing,
    };
    Ok(HostCommunicator::new_world(
        Arc::new(t),
        Shared {
            store: Some(store),
            server,
        },
        opts.timeout,
    ))
}

enum DialError {
    Timeout,
    Other(String),
}

fn dial(
    addr: SocketAddr,
    peer: usize,
    rank: usize,
    world: usize,
    deadline: Instant,
) -> std::result::Result<TcpStream, DialError> {
    let mut delay = Duration::from_millis(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(DialError::Timeout);
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(mut s) => {
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(10));
                s.set_read_timeout(Some(left))
                    .map_err(|e| DialError::Other(e.to_string()))?;
                s.write_all(&handshake_bytes(rank, world))
                    .map_err(|e| DialError::Other(e.to_string()))?;
                let mut hb = [0u8; 20];
                match s.read_exact(&mut hb) {
                    Ok(()) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        return Err(DialError::Timeout)
                    }
                    Err(e) => return Err(DialError::Other(e.to_string())),
                }
                return match parse_handshake(&hb) {
                    Some((p, w)) if p == peer && w == world => Ok(s),
                    _ => Err(DialError::Other(format!(
                        "unexpected handshake from {addr}"
                    ))),
                };
            }
            Err(_) => {
                std::thread::sleep(delay.min(left));
                delay = (delay * 2).min(Duration::from_millis(200));
            }
        }
    }
}
