//! A streamed response's body: the scheduler's events for one request as server-sent events.
//!
//! (Chat: a first chunk naming the role,) one chunk per piece of text as it is made, a
//! closing chunk with `finish_reason`, the usage chunk when asked for, and `data: [DONE]`.
//! A failure after the stream began is an `{"error": …}` event, then `[DONE]`.
//!
//! Each poll drains every event already waiting in the request's channel into one body
//! frame: still one event per piece of text, but one write to the socket when the HTTP side
//! falls behind the scheduler (under load), and no waiting when it does not (a lone
//! request's text goes out as soon as it is made). Text chunks are written from a template
//! ([`DeltaTemplate`]) with the text spliced in, not built as JSON values. While nothing
//! comes (a request waiting in the queue), a comment every `KEEP_ALIVE` keeps proxies and
//! clients from timing the connection out.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::{Instant, Sleep};

use crate::api::{write_event, Delivery, DeltaTemplate, ResponseMeta};
use crate::engine::Event;
use crate::error::ApiError;

/// How long a stream may stay silent before a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// A frame is sent once it holds this much, even if more events wait.
const MAX_FRAME: usize = 64 << 10;

/// The response for a streamed request.
pub fn response(rx: UnboundedReceiver<Event>, meta: ResponseMeta, d: Delivery) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(EventStream::new(rx, meta, d)),
    )
        .into_response()
}

/// The body stream of one streamed request.
pub struct EventStream {
    rx: UnboundedReceiver<Event>,
    meta: ResponseMeta,
    text: DeltaTemplate,
    include_usage: bool,
    /// Bytes to send before any event (the chat role chunk).
    head: Vec<u8>,
    /// `[DONE]` was written: the stream ends.
    over: bool,
    keep_alive: Pin<Box<Sleep>>,
    /// Something was sent since the keep-alive timer last fired.
    sent: bool,
}

impl EventStream {
    pub fn new(rx: UnboundedReceiver<Event>, meta: ResponseMeta, d: Delivery) -> EventStream {
        let mut head = Vec::new();
        if meta.chat {
            write_event(&meta.role_chunk(), &mut head);
        }
        EventStream {
            rx,
            text: meta.delta_template(),
            meta,
            include_usage: d.include_usage,
            head,
            over: false,
            keep_alive: Box::pin(tokio::time::sleep(KEEP_ALIVE)),
            sent: false,
        }
    }

    /// Appends the SSE form of `ev`; true when it ends the stream.
    fn encode(&self, ev: Event, out: &mut Vec<u8>) -> bool {
        match ev {
            Event::Text(t) => {
                self.text.write(&t, out);
                false
            }
            Event::Done {
                finish,
                prompt_tokens,
                completion_tokens,
            } => {
                write_event(&self.meta.delta(None, Some(finish)), out);
                if self.include_usage {
                    let usage = self.meta.usage_chunk(prompt_tokens, completion_tokens);
                    write_event(&usage, out);
                }
                done(out);
                true
            }
            Event::Failed(msg) => {
                failed(msg, out);
                true
            }
        }
    }
}

fn done(out: &mut Vec<u8>) {
    out.extend_from_slice(b"data: [DONE]\n\n");
}

fn failed(msg: String, out: &mut Vec<u8>) {
    write_event(&ApiError::internal(msg).body(), out);
    done(out);
}

impl Stream for EventStream {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let s = self.get_mut();
        if s.over {
            return Poll::Ready(None);
        }
        let mut out = std::mem::take(&mut s.head);
        while out.len() < MAX_FRAME {
            match s.rx.poll_recv(cx) {
                Poll::Ready(Some(ev)) => {
                    if s.encode(ev, &mut out) {
                        s.over = true;
                        break;
                    }
                }
                Poll::Ready(None) => {
                    failed("the scheduler stopped".into(), &mut out);
                    s.over = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        if !out.is_empty() {
            s.sent = true;
            return Poll::Ready(Some(Ok(Bytes::from(out))));
        }
        // Nothing to send: the keep-alive timer is polled only now, so a busy stream does
        // not touch it per event.
        while s.keep_alive.as_mut().poll(cx).is_ready() {
            s.keep_alive.as_mut().reset(Instant::now() + KEEP_ALIVE);
            if !std::mem::take(&mut s.sent) {
                return Poll::Ready(Some(Ok(Bytes::from_static(b":\n\n"))));
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;
    use serde_json::Value;
    use tokio::sync::mpsc;

    use super::*;
    use crate::bench::{sse_data, SseBuffer};
    use crate::engine::Finish;

    fn meta(chat: bool) -> ResponseMeta {
        ResponseMeta {
            id: "chatcmpl-9".into(),
            created: 1,
            model: "m".into(),
            chat,
        }
    }

    /// A stream and the sender of its events.
    fn stream(chat: bool, include_usage: bool) -> (mpsc::UnboundedSender<Event>, EventStream) {
        let (tx, rx) = mpsc::unbounded_channel();
        let d = Delivery {
            stream: true,
            include_usage,
        };
        (tx, EventStream::new(rx, meta(chat), d))
    }

    /// The events of `frames`, split and parsed as a client does (`[DONE]` as a string).
    fn events(frames: &[Bytes]) -> Vec<Value> {
        let mut buf = SseBuffer::default();
        let mut out = Vec::new();
        for f in frames {
            buf.push(f);
            while let Some(ev) = buf.next_event() {
                let data = sse_data(ev).expect("every event has data");
                out.push(match data {
                    b"[DONE]" => Value::from("[DONE]"),
                    d => serde_json::from_slice(d).unwrap(),
                });
            }
        }
        out
    }

    fn text(v: &Value) -> &str {
        let c = &v["choices"][0];
        c["delta"]["content"]
            .as_str()
            .or(c["text"].as_str())
            .unwrap()
    }

    #[tokio::test]
    async fn events_waiting_together_go_out_in_one_frame_as_separate_events_in_order() {
        let (tx, mut s) = stream(true, true);
        let pieces = ["Hi", " \"there\"", "\n", "é😀"];
        for p in pieces {
            tx.send(Event::Text(p.into())).unwrap();
        }
        let first = s.next().await.unwrap().unwrap();
        // Later text, sent while the client reads, comes in a frame of its own.
        tx.send(Event::Text("!".into())).unwrap();
        let second = s.next().await.unwrap().unwrap();
        tx.send(Event::Done {
            finish: Finish::Length,
            prompt_tokens: 3,
            completion_tokens: 6,
        })
        .unwrap();
        let third = s.next().await.unwrap().unwrap();
        assert!(s.next().await.is_none(), "the stream ends after [DONE]");

        let first_events = events(std::slice::from_ref(&first));
        assert_eq!(first_events.len(), 1 + pieces.len(), "role chunk + 4 texts");
        assert_eq!(first_events[0]["choices"][0]["delta"]["role"], "assistant");
        let all = events(&[first, second, third]);
        let texts: Vec<&str> = all[1..6].iter().map(text).collect();
        assert_eq!(texts, ["Hi", " \"there\"", "\n", "é😀", "!"]);
        assert!(all[..7].iter().all(|v| v["id"] == "chatcmpl-9"));
        assert_eq!(all[6]["choices"][0]["finish_reason"], "length");
        assert_eq!(all[7]["usage"]["completion_tokens"], 6);
        assert_eq!(all[8], "[DONE]");
        assert_eq!(all.len(), 9);
    }

    #[tokio::test]
    async fn a_failure_or_a_lost_scheduler_ends_the_stream_with_an_error_event() {
        let (tx, mut s) = stream(false, false);
        tx.send(Event::Text("a".into())).unwrap();
        tx.send(Event::Failed("the model broke".into())).unwrap();
        tx.send(Event::Text("never sent".into())).unwrap();
        let all = events(&[s.next().await.unwrap().unwrap()]);
        assert!(s.next().await.is_none());
        assert_eq!(text(&all[0]), "a");
        assert_eq!(all[1]["error"]["message"], "the model broke");
        assert_eq!((all[2].clone(), all.len()), (Value::from("[DONE]"), 3));

        let (tx, mut s) = stream(false, false);
        drop(tx);
        let all = events(&[s.next().await.unwrap().unwrap()]);
        assert_eq!(all[0]["error"]["message"], "the scheduler stopped");
        assert_eq!(all[1], "[DONE]");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_stream_gets_keep_alive_comments_and_a_busy_one_does_not() {
        let (tx, mut s) = stream(false, false);
        let t0 = Instant::now();
        assert_eq!(&s.next().await.unwrap().unwrap()[..], b":\n\n");
        assert_eq!(t0.elapsed(), KEEP_ALIVE);
        // Text within each period: no comment, however long the stream runs.
        for _ in 0..4 {
            tokio::time::sleep(KEEP_ALIVE / 2).await;
            tx.send(Event::Text("x".into())).unwrap();
            let frame = s.next().await.unwrap().unwrap();
            assert_eq!(events(&[frame]).len(), 1);
        }
        let t1 = Instant::now();
        assert_eq!(&s.next().await.unwrap().unwrap()[..], b":\n\n");
        assert!(t1.elapsed() >= KEEP_ALIVE / 2 && t1.elapsed() <= KEEP_ALIVE * 2);
    }

    #[test]
    fn events_split_across_reads_are_reassembled() {
        let stream = b"data: 1\n\n: comment\n\ndata: 22\n\ndata: [DONE]\n\n";
        for cut in 0..stream.len() {
            let mut buf = SseBuffer::default();
            let mut got = Vec::new();
            for part in [&stream[..cut], &stream[cut..]] {
                buf.push(part);
                while let Some(ev) = buf.next_event() {
                    got.push(sse_data(ev).map(|d| d.to_vec()));
                }
            }
            let want: Vec<Option<Vec<u8>>> = vec![
                Some(b"1".to_vec()),
                None,
                Some(b"22".to_vec()),
                Some(b"[DONE]".to_vec()),
            ];
            assert_eq!(got, want, "cut at {cut}");
        }
    }
}
