//! One client connection, served by hyper directly rather than through `axum::serve`, for
//! what production servers do and that loop does not:
//! - timeouts: a request head must arrive within `header` (counted from the connection's
//!   start, or from its first byte after an idle spell), and a keep-alive connection without
//!   a request for `idle` is closed; the body's own limit is `http.rs`'s (408);
//! - shutdown: connections stay open while requests are in flight, so that a new request on
//!   one gets a 503 (`http.rs`) instead of a closed connection; once none is in flight
//!   (`close` turns true), idle connections close at once and busy ones after their response;
//! - a request that hyper cannot parse (not HTTP, a Content-Length that is not a number) gets
//!   OpenAI's error JSON, not hyper's empty 400: [`ClientStream`] recognises hyper's automatic
//!   error response as it is written and sends a JSON one in its place.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{Request, Response, StatusCode};
use axum::Router;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};

use crate::error::ApiError;

/// How long a connection may take over each part of a request (`sinter serve
/// --header-timeout`, `--body-timeout`, `--idle-timeout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// From the connection's start (or its first byte after idling) to a complete head.
    pub header: Duration,
    /// From a complete head to the whole body.
    pub body: Duration,
    /// A kept-alive connection with no request in progress.
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header: Duration::from_secs(10),
            body: Duration::from_secs(30),
            idle: Duration::from_secs(60),
        }
    }
}

/// Where a connection is between requests, for its timeouts.
#[derive(Clone, Copy, Debug)]
enum Phase {
    /// Reading a request head since this instant.
    Head(Instant),
    /// This many requests in progress (their responses not yet fully sent).
    Busy(usize),
    /// Nothing to do since this instant.
    Idle(Instant),
}

/// A connection's phase, shared by its stream (bytes read), its requests (begun, done) and
/// its task (which sleeps until the phase's deadline).
struct Activity {
    phase: Mutex<Phase>,
    changed: Notify,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            phase: Mutex::new(Phase::Head(Instant::now())),
            changed: Notify::new(),
        })
    }
    fn update(&self, f: impl FnOnce(Phase) -> Phase) {
        let mut p = self.phase.lock().unwrap_or_else(|e| e.into_inner());
        *p = f(*p);
        drop(p);
        self.changed.notify_one();
    }
    fn phase(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// Bytes arrived: after an idle spell they are the start of the next request's head.
    fn bytes_read(&self) {
        if matches!(self.phase(), Phase::Idle(_)) {
            self.update(|p| match p {
                Phase::Idle(_) => Phase::Head(Instant::now()),
                p => p,
            });
        }
    }
    fn request_begun(self: &Arc<Self>) -> RequestGuard {
        self.update(|p| match p {
            Phase::Busy(n) => Phase::Busy(n + 1),
            _ => Phase::Busy(1),
        });
        RequestGuard(self.clone())
    }
    fn request_done(&self) {
        self.update(|p| match p {
            Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
            _ => Phase::Idle(Instant::now()),
        });
    }
    /// When the connection is to be closed if nothing changes (None while busy).
    fn deadline(&self, t: &Timeouts) -> Option<Instant> {
        match self.phase() {
            Phase::Head(since) => Some(since + t.header),
            Phase::Idle(since) => Some(since + t.idle),
            Phase::Busy(_) => None,
        }
    }
}

/// A request in progress until dropped (with its response body, once hyper has sent it).
struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.request_done();
    }
}

/// A response body that keeps its request counted as in progress while it is being sent.
struct GuardedBody {
    inner: Body,
    _guard: RequestGuard,
}

impl HttpBody for GuardedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The router as one connection's hyper service, counting its requests.
#[derive(Clone)]
struct ConnService {
    router: Router,
    activity: Arc<Activity>,
}

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<GuardedBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let guard = self.activity.request_begun();
        let mut router = self.router.clone();
        Box::pin(async move {
            // A Router is always ready (axum's docs), so no poll_ready first.
            let res = tower_service::Service::call(&mut router, req).await?;
            Ok(res.map(|inner| GuardedBody {
                inner,
                _guard: guard,
            }))
        })
    }
}

/// Serves one connection until the client closes it, a timeout closes it, or shutdown does
/// (`close` true: at once when idle, after the response in progress otherwise).
pub(crate) async fn serve_connection(
    tcp: TcpStream,
    router: Router,
    timeouts: Timeouts,
    mut close: watch::Receiver<bool>,
) {
    let activity = Activity::new();
    let stream = ClientStream::new(tcp, activity.clone());
    let service = ConnService {
        router,
        activity: activity.clone(),
    };
    // hyper's own header timeout would also run while a kept-alive connection idles; the
    // loop below keeps the two apart.
    let conn = hyper::server::conn::http1::Builder::new()
        .header_read_timeout(None)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        let deadline = if closing {
            None
        } else {
            activity.deadline(&timeouts)
        };
        let expired = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut conn => return,
            _ = expired => {
                if activity.deadline(&timeouts).is_some_and(|d| d <= Instant::now()) {
                    return; // dropping the connection closes it
                }
            }
            _ = activity.changed.notified() => {}
            // (A lost sender means the server is gone: close too.)
            _ = close.wait_for(|c| *c), if !closing => {
                if !matches!(activity.phase(), Phase::Busy(_)) {
                    return;
                }
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// The client's TCP stream as hyper sees it: reads mark the connection active, and hyper's
/// automatic answer to an unparsable request is replaced by a JSON one (see the module
/// comment).
struct ClientStream {
    tcp: TcpStream,
    activity: Arc<Activity>,
    /// What was read since the last write (the start of it): the request hyper refused, to
    /// say what was wrong with it.
    recent: Vec<u8>,
    /// A JSON error response being written in place of hyper's, and how much of it is out.
    replacing: Option<(Vec<u8>, usize)>,
}

/// How much of a request [`ClientStream`] keeps to describe a bad head.
const RECENT_BYTES: usize = 16 << 10;

impl ClientStream {
    fn new(tcp: TcpStream, activity: Arc<Activity>) -> ClientStream {
        ClientStream {
            tcp,
            activity,
            recent: Vec::new(),
            replacing: None,
        }
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut me.tcp).poll_read(cx, buf))?;
        let got = &buf.filled()[before..];
        if !got.is_empty() {
            me.activity.bytes_read();
            let room = RECENT_BYTES.saturating_sub(me.recent.len());
            me.recent.extend_from_slice(&got[..got.len().min(room)]);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        if me.replacing.is_none() {
            if let Some(status) = hyper_parse_error_status(buf) {
                me.replacing = Some((json_parse_error(status, &me.recent), 0));
            }
        }
        me.recent.clear();
        let Some((reply, sent)) = &mut me.replacing else {
            return Pin::new(&mut me.tcp).poll_write(cx, buf);
        };
        while *sent < reply.len() {
            let n = ready!(Pin::new(&mut me.tcp).poll_write(cx, &reply[*sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *sent += n;
        }
        // hyper's response counts as written: the connection closes after it.
        me.replacing = None;
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

/// The status of hyper's automatic response to a request it could not parse, if `buf` is
/// one: a whole 4xx head with `content-length: 0` and no content type. Every response of
/// the router has a body and a content type, so nothing of ours matches.
fn hyper_parse_error_status(buf: &[u8]) -> Option<u16> {
    if !buf.starts_with(b"HTTP/1.1 4") || !buf.ends_with(b"\r\n\r\n") || buf.len() > 512 {
        return None;
    }
    let head = std::str::from_utf8(buf).ok()?.to_ascii_lowercase();
    if head.contains("\r\ncontent-type:") || !head.contains("\r\ncontent-length: 0\r\n") {
        return None;
    }
    head.get(9..12)?.parse().ok()
}

/// An OpenAI-shaped error response for a request hyper refused with `status`, saying what
/// was wrong with `request` (what the client sent) where that can be told.
fn json_parse_error(status: u16, request: &[u8]) -> Vec<u8> {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    let message = if status == StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE {
        "the request head is larger than this server accepts".to_string()
    } else if status == StatusCode::URI_TOO_LONG {
        "the request's path is longer than this server accepts".to_string()
    } else {
        describe_bad_head(request)
    };
    let body = ApiError::new(status, "invalid_request_error", message, None, None)
        .body()
        .to_string();
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes()
}

/// What is wrong with a request head that hyper refused.
fn describe_bad_head(request: &[u8]) -> String {
    const HINT: &str = "send HTTP/1.1, e.g. POST /v1/completions with a JSON body";
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    if let Err(e) = req.parse(request) {
        return format!("the request is not valid HTTP/1.1 ({e}); {HINT}");
    }
    for h in req.headers.iter() {
        let v = String::from_utf8_lossy(h.value);
        let digits = v.trim_matches([' ', '\t']);
        if h.name.eq_ignore_ascii_case("content-length")
            && (digits.is_empty() || digits.parse::<u64>().is_err())
        {
            return format!(
                "the Content-Length header '{v}' is not a number of bytes; send the body's length in bytes"
            );
        }
    }
    format!("the request head is malformed; {HINT}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hyper_s_empty_error_responses_are_replaced() {
        let canned = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: Sat, 28 Nov 2026 09:00:00 GMT\r\n\r\n";
        assert_eq!(hyper_parse_error_status(canned), Some(400));
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(hyper_parse_error_status(ours), None);
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(hyper_parse_error_status(ok), None);
        let with_body = b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(hyper_parse_error_status(with_body), None);
    }

    #[test]
    fn bad_heads_are_described() {
        let m = describe_bad_head(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03");
        assert!(m.contains("not valid HTTP/1.1"), "{m}");
        let m = describe_bad_head(
            b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: abc\r\n\r\n",
        );
        assert!(m.contains("Content-Length header 'abc'"), "{m}");
        let reply = String::from_utf8(json_parse_error(400, b"hello\r\n\r\n")).unwrap();
        let (head, body) = reply.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
}
