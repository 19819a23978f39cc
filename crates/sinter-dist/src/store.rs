//! A small TCP key–value store for rendezvous (run by rank 0 at `MASTER_ADDR:MASTER_PORT`):
//! ranks publish their listening addresses and, later, the NCCL unique id.
//!
//! Wire format (little endian): request `[cmd u8][key len u32][key][body]`, with body
//! `SET: [len u32][value]`, `GET: -`, `WAIT: [timeout ms u64]`, `ADD: [delta i64]`,
//! `DEL: -`; reply `[status u8]` (0 ok, 1 missing/timed out) followed for GET/WAIT by
//! `[len u32][value]` and for ADD by `[i64]`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{DistError, Result};

const CMD_SET: u8 = 1;
const CMD_GET: u8 = 2;
const CMD_WAIT: u8 = 3;
const CMD_ADD: u8 = 4;
const CMD_DEL: u8 = 5;
const MAX_KEY: usize = 4096;
const MAX_VALUE: usize = 64 << 20;

/// Open connections of the server (a handle to shut each down, and its thread).
type Conns = Arc<Mutex<Vec<(TcpStream, JoinHandle<()>)>>>;

#[derive(Default)]
struct State {
    map: Mutex<HashMap<String, Vec<u8>>>,
    cv: Condvar,
}

/// The store server; stops (and closes its connections) when dropped.
pub struct StoreServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
    conns: Conns,
}

impl std::fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StoreServer({})", self.addr)
    }
}

impl StoreServer {
    /// Listens on `addr` (`"127.0.0.1:0"` picks a free port) and serves on background threads.
    pub fn bind(addr: impl ToSocketAddrs + std::fmt::Debug) -> Result<StoreServer> {
        let desc = format!("{addr:?}");
        let listener =
            TcpListener::bind(addr).map_err(|e| DistError::io(format!("store: bind {desc}"), e))?;
        Self::from_listener(listener)
    }

    /// Serves on an already bound listener.
    pub fn from_listener(listener: TcpListener) -> Result<StoreServer> {
        let addr = listener
            .local_addr()
            .map_err(|e| DistError::io("store: local_addr", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| DistError::io("store: set_nonblocking", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(State::default());
        let conns: Conns = Arc::default();
        let accept = {
            let (stop, state, conns) = (stop.clone(), state.clone(), conns.clone());
            std::thread::Builder::new()
                .name("sinter-store".into())
                .spawn(move || accept_loop(listener, stop, state, conns))
                .map_err(|e| DistError::io("store: spawn", e))?
        };
        Ok(StoreServer {
            addr,
            stop,
            state,
            accept: Some(accept),
            conns,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        self.state.cv.notify_all();
        let conns = std::mem::take(&mut *self.conns.lock().unwrap_or_else(|e| e.into_inner()));
        for (s, _) in &conns {
            let _ = s.shutdown(Shutdown::Both);
        }
        for (_, h) in conns {
            let _ = h.join();
        }
    }
}

fn accept_loop(listener: TcpListener, stop: Arc<AtomicBool>, state: Arc<State>, conns: Conns) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_nodelay(true);
                let Ok(clone) = s.try_clone() else { continue };
                let (stop2, state2) = (stop.clone(), state.clone());
                let h = std::thread::Builder::new()
                    .name("sinter-store-conn".into())
                    .spawn(move || serve_conn(s, stop2, state2));
                if let Ok(h) = h {
                    conns
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((clone, h));
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn read_bytes(r: &mut impl Read, max: usize) -> std::io::Result<Vec<u8>> {
    let n = read_u32(r)? as usize;
    if n > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("length {n} exceeds {max}"),
        ));
    }
    let mut v = vec![0u8; n];
    r.read_exact(&mut v)?;
    Ok(v)
}

fn serve_conn(mut s: TcpStream, stop: Arc<AtomicBool>, state: Arc<State>) {
    let _ = serve_conn_inner(&mut s, &stop, &state);
}

fn serve_conn_inner(s: &mut TcpStream, stop: &AtomicBool, state: &State) -> std::io::Result<()> {
    loop {
        let mut cmd = [0u8; 1];
        s.read_exact(&mut cmd)?;
        let key = String::from_utf8_lossy(&read_bytes(s, MAX_KEY)?).into_owned();
        let mut reply = Vec::new();
        match cmd[0] {
            CMD_SET => {
                let v = read_bytes(s, MAX_VALUE)?;
                state
                    .map
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, v);
                state.cv.notify_all();
                reply.push(0);
            }
            CMD_GET => {
                let m = state.map.lock().unwrap_or_else(|e| e.into_inner());
                push_value(&mut reply, m.get(&key));
            }
            CMD_WAIT => {
                let ms = read_u64(s)?;
                let deadline = Instant::now() + Duration::from_millis(ms);
                let mut m = state.map.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if m.contains_key(&key) || stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        break;
                    }
                    let step = (deadline - now).min(Duration::from_millis(100));
                    m = state
                        .cv
                        .wait_timeout(m, step)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                push_value(&mut reply, m.get(&key));
            }
            CMD_ADD => {
                let delta = read_u64(s)? as i64;
                let mut m = state.map.lock().unwrap_or_else(|e| e.into_inner());
                let cur = m
                    .get(&key)
                    .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
                    .map(i64::from_le_bytes)
                    .unwrap_or(0);
                let new = cur.wrapping_add(delta);
                m.insert(key, new.to_le_bytes().to_vec());
                drop(m);
                state.cv.notify_all();
                reply.push(0);
                reply.extend_from_slice(&new.to_le_bytes());
            }
            CMD_DEL => {
                let existed = state
                    .map
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&key)
                    .is_some();
                reply.push(if existed { 0 } else { 1 });
            }
            _ => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "unknown store command",
                ))
            }
        }
        s.write_all(&reply)?;
    }
}

fn push_value(reply: &mut Vec<u8>, v: Option<&Vec<u8>>) {
    match v {
        Some(v) => {
            reply.push(0);
            reply.extend_from_slice(&(v.len() as u32).to_le_bytes());
            reply.extend_from_slice(v);
        }
        None => reply.push(1),
    }
}

/// A connection to a [`StoreServer`]. Calls are serialised; every call is bounded in time.
pub struct StoreClient {
    stream: Mutex<TcpStream>,
    addr: SocketAddr,
    io_timeout: Duration,
}

impl std::fmt::Debug for StoreClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StoreClient({})", self.addr)
    }
}

/// Resolves `host:port` (first address).
pub(crate) fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(|e| DistError::io(format!("resolve {addr}"), e))?
        .next()
        .ok_or_else(|| DistError::Store(format!("{addr} resolves to no address")))
}

impl StoreClient {
    /// Connects to `addr` (`host:port`), retrying until `timeout` passes (the server may not
    /// be up yet).
    pub fn connect(addr: &str, timeout: Duration) -> Result<StoreClient> {
        let deadline = Instant::now() + timeout;
        let mut delay = Duration::from_millis(10);
        let last_err = loop {
            let err = match resolve(addr) {
                Ok(sa) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match TcpStream::connect_timeout(
                        &sa,
                        left.clamp(Duration::from_millis(10), Duration::from_secs(5)),
                    ) {
                        Ok(s) => {
                            s.set_nodelay(true)
                                .map_err(|e| DistError::io("store: nodelay", e))?;
                            return Ok(StoreClient {
                                stream: Mutex::new(s),
                                addr: sa,
                                io_timeout: timeout.max(Duration::from_secs(1)),
                            });
                        }
                        Err(e) => e.to_string(),
                    }
                }
                Err(e) => e.to_string(),
            };
            let now = Instant::now();
            if now >= deadline {
                break err;
            }
            std::thread::sleep(delay.min(deadline - now));
            delay = (delay * 2).min(Duration::from_millis(500));
        };
        Err(DistError::Store(format!(
            "could not reach the store at {addr} within {}: {last_err}",
            crate::error::fmt_secs(timeout)
        )))
    }

    /// The server's address.
    pub fn server_addr(&self) -> SocketAddr {
        self.addr
    }

    /// This end's address (the local interface that routes to the server).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.stream
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .local_addr()
            .map_err(|e| DistError::io("store: local_addr", e))
    }

    fn request(&self, cmd: u8, key: &str, body: &[u8], wait: Duration) -> Result<(u8, Vec<u8>)> {
        if key.len() > MAX_KEY {
            return Err(DistError::InvalidArgument(format!(
                "store key longer than {MAX_KEY} bytes"
            )));
        }
        let mut s = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        let ctx = |what: &str| format!("store {what} `{key}` at {}", self.addr);
        let mut msg = Vec::with_capacity(9 + key.len() + body.len());
        msg.push(cmd);
        msg.extend_from_slice(&(key.len() as u32).to_le_bytes());
        msg.extend_from_slice(key.as_bytes());
        msg.extend_from_slice(body);
        s.set_write_timeout(Some(self.io_timeout))
            .map_err(|e| DistError::io(ctx("set timeout"), e))?;
        s.set_read_timeout(Some(self.io_timeout + wait))
            .map_err(|e| DistError::io(ctx("set timeout"), e))?;
        s.write_all(&msg)
            .map_err(|e| DistError::io(ctx("write"), e))?;
        let mut st = [0u8; 1];
        s.read_exact(&mut st)
            .map_err(|e| DistError::io(ctx("read"), e))?;
        let mut payload = Vec::new();
        if st[0] == 0 {
            match cmd {
                CMD_GET | CMD_WAIT => {
                    payload =
                        read_bytes(&mut *s, MAX_VALUE).map_err(|e| DistError::io(ctx("read"), e))?
                }
                CMD_ADD => {
                    payload = read_u64(&mut *s)
                        .map_err(|e| DistError::io(ctx("read"), e))?
                        .to_le_bytes()
                        .to_vec()
                }
                _ => {}
            }
        }
        Ok((st[0], payload))
    }

    /// Sets `key` to `value` (overwrites).
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        if value.len() > MAX_VALUE {
            return Err(DistError::InvalidArgument(format!(
                "store value longer than {MAX_VALUE} bytes"
            )));
        }
        let mut body = (value.len() as u32).to_le_bytes().to_vec();
        body.extend_from_slice(value);
        self.request(CMD_SET, key, &body, Duration::ZERO)
            .map(|_| ())
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let (st, v) = self.request(CMD_GET, key, &[], Duration::ZERO)?;
        Ok((st == 0).then_some(v))
    }

    /// Waits until `key` is set and returns its value; `Ok(None)` after `timeout`.
    pub fn wait(&self, key: &str, timeout: Duration) -> Result<Option<Vec<u8>>> {
        let ms = timeout.as_millis().min(u64::MAX as u128) as u64;
        let (st, v) = self.request(CMD_WAIT, key, &ms.to_le_bytes(), timeout)?;
        Ok((st == 0).then_some(v))
    }

    /// Atomically adds `delta` to the integer counter `key` (missing = 0); returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let (_, v) = self.request(CMD_ADD, key, &delta.to_le_bytes(), Duration::ZERO)?;
        let b: [u8; 8] = v
            .as_slice()
            .try_into()
            .map_err(|_| DistError::Store("bad ADD reply".into()))?;
        Ok(i64::from_le_bytes(b))
    }

    /// Removes `key`; true if it existed.
    pub fn delete(&self, key: &str) -> Result<bool> {
        let (st, _) = self.request(CMD_DEL, key, &[], Duration::ZERO)?;
        Ok(st == 0)
    }
}
