//! HTTP/1.1 on one connection: keep-alive and pipelining (requests are answered in order, one
//! at a time); a connection opening with the h2 preface is handed to HTTP/2. Reading a request
//! is `parse.rs` (over `read.rs`), writing its answer `write.rs`.
//!
//! Limits: the request head is at most [`crate::limits::HEAD_BYTES_MAX`] with
//! [`crate::limits::HEADERS_MAX`] headers (else `431`), a body at most `max_body_size` (else
//! `413`, and the connection closes once the rest of the body was discarded, bounded, since it
//! cannot be parsed as a next request).

mod parked;
mod parse;
mod read;
#[cfg(test)]
mod tests;
mod write;

use std::future::Future;
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use futures_lite::AsyncReadExt;

use crate::limits::{
    ConnectionLimits, OVERSIZED_BODY_DRAIN_BYTES_MAX, OVERSIZED_BODY_DRAIN_TIMEOUT,
};
use crate::shutdown::CoreShutdown;
use crate::transport::drive::{drive, Driven};
use crate::transport::http2;
use crate::transport::message::{
    answers_over_budget, hold_answer, refusal, within, LiveBody, Request, Response,
};
pub use parked::{park, PARKED_SUBSCRIBERS};
use parse::read_request;
use read::{fill_idle, peer_gone};
use write::{write_response, ChunkedWriter, Chunks};

/// Serves a connection until the peer closes or an error ends it: HTTP/2 when it opens with
/// the h2 preface (prior knowledge), HTTP/1.1 otherwise. `handle` answers one request;
/// `on_error` renders a protocol error in the listener's style. On a socket that can be
/// parked, a live response waiting at the tail ends the task: it is handed back as
/// [`Parked`] for the core's parked subscribers to hold (`parked.rs`).
pub async fn serve_connection<S, H, F>(
    mut stream: S,
    limits: ConnectionLimits,
    handle: Rc<H>,
    on_error: fn(u16, &str) -> Response,
    stop: CoreShutdown,
) -> Option<Parked<S>>
where
    S: crate::transport::socket::Socket,
    H: Fn(Request) -> F + 'static,
    F: Future<Output = Response> + 'static,
{
    stream.set_send_stall_timeout(limits.send_stall_timeout);
    let mut buf = BytesMut::new();
    loop {
        let seen = buf.len().min(http2::PREFACE.len());
        if buf[..seen] != http2::PREFACE[..seen] {
            break;
        }
        if seen == http2::PREFACE.len() {
            let stream = http2::Prefixed::new(buf, stream);
            // Boxed, so an HTTP/1.1 connection's future does not carry HTTP/2's state.
            let h2 = http2::serve_connection(stream, limits, handle, on_error, stop);
            Box::pin(h2).await;
            return None;
        }
        let more = within(limits.request_timeout, fill_idle(&mut stream, &mut buf)).await;
        if !matches!(more, Some(Ok(true))) {
            return None;
        }
    }
    // By reference: what the connection owns is kept once, here, not again in the future
    // that serves it (an `async fn` keeps room for what it is given).
    let connection = Http1::new(&limits, &handle, on_error, &stop, &stream);
    let streaming = serve_http1(&mut stream, &mut buf, connection, None).await?;
    Some(Parked {
        socket: stream,
        streaming,
    })
}

/// Serves a parked connection again from where its live response is (its events `unsent`
/// first), then its next requests, as [`serve_connection`] does.
pub async fn resume_connection<S, H, F>(
    mut parked: Parked<S>,
    limits: ConnectionLimits,
    handle: Rc<H>,
    on_error: fn(u16, &str) -> Response,
    stop: CoreShutdown,
) -> Option<Parked<S>>
where
    S: crate::transport::socket::Socket,
    H: Fn(Request) -> F + 'static,
    F: Future<Output = Response> + 'static,
{
    // A socket taken back from its descriptor starts without the timeout.
    parked
        .socket
        .set_send_stall_timeout(limits.send_stall_timeout);
    let mut buf = BytesMut::new();
    let connection = Http1::new(&limits, &handle, on_error, &stop, &parked.socket);
    let streaming = serve_http1(
        &mut parked.socket,
        &mut buf,
        connection,
        Some(parked.streaming),
    );
    parked.streaming = streaming.await?;
    Some(parked)
}

/// A connection whose live response waits at the tail, its task ended: its socket, its
/// response's state, and whether the connection goes on once the response ends.
pub struct Parked<S> {
    pub socket: S,
    pub streaming: Box<Streaming>,
}

/// A live response being sent on an HTTP/1.1 connection.
pub struct Streaming {
    pub live: LiveBody,
    /// Framed chunks to send before its next events.
    pub unsent: Bytes,
    /// The connection serves its next request once the response ends.
    pub keep_alive: bool,
    /// The peer sent bytes or hung up while the connection was parked: read them first.
    pub stirred: bool,
}

/// What serving one HTTP/1.1 connection uses, borrowed from its owner.
struct Http1<'a, H> {
    limits: &'a ConnectionLimits,
    handle: &'a H,
    on_error: fn(u16, &str) -> Response,
    stop: &'a CoreShutdown,
    /// A live response waiting at the tail hands the connection back (see [`Parked`]).
    parkable: bool,
}

impl<'a, H> Http1<'a, H> {
    fn new<S: crate::transport::socket::Socket>(
        limits: &'a ConnectionLimits,
        handle: &'a Rc<H>,
        on_error: fn(u16, &str) -> Response,
        stop: &'a CoreShutdown,
        socket: &S,
    ) -> Http1<'a, H> {
        Http1 {
            limits,
            handle,
            on_error,
            stop,
            parkable: socket.parkable(),
        }
    }
}

async fn serve_http1<S, H, F>(
    stream: &mut S,
    buf: &mut BytesMut,
    connection: Http1<'_, H>,
    mut streaming: Option<Box<Streaming>>,
) -> Option<Box<Streaming>>
where
    S: crate::transport::socket::Socket,
    H: Fn(Request) -> F,
    F: Future<Output = Response>,
{
    let Http1 {
        limits,
        handle,
        on_error,
        stop,
        parkable,
    } = connection;
    loop {
        if let Some(live) = streaming.take() {
            // The request's future is given back before its events are written, for as long
            // as the response lives: an SSE subscriber holds the response and this.
            match Box::pin(stream_events(stream, buf, live, parkable)).await {
                StreamEnded::AtTail(live) => return Some(live),
                StreamEnded::Next => {}
                StreamEnded::Close => return None,
            }
        }
        if buf.is_empty() {
            // Idle between requests: a shutdown closes the connection here, never mid-request.
            let first = stop
                .unless_stopped_within(limits.request_timeout, fill_idle(stream, buf))
                .await;
            if !matches!(first, Some(Ok(true))) {
                return None;
            }
        }
        // A request is arriving. Its future (with the reading and handling phases boxed
        // inside it, about 1.2 KiB) is put on the heap for as long as it runs, so an idle
        // connection's own future stays a few hundred bytes instead of carrying that room for
        // the connection's whole life.
        let served = serve_request(stream, buf, limits, handle, on_error, stop);
        match Box::pin(served).await {
            Served::Close => return None,
            Served::Next => {}
            Served::Streaming { live, keep_alive } => {
                streaming = Some(Box::new(Streaming {
                    live,
                    unsent: Bytes::new(),
                    keep_alive,
                    stirred: false,
                }))
            }
        }
    }
}

/// How writing a live response ended.
enum StreamEnded {
    /// It waits at the tail with nothing to send: the connection may be parked.
    AtTail(Box<Streaming>),
    /// The response is over and the connection goes on.
    Next,
    /// The connection closes.
    Close,
}

/// Drives a live response (its unsent chunks first) until it ends or waits at the tail of a
/// parkable connection.
async fn stream_events<S: crate::transport::socket::Socket>(
    stream: &mut S,
    buf: &mut BytesMut,
    mut live: Box<Streaming>,
    parkable: bool,
) -> StreamEnded {
    let unsent = std::mem::take(&mut live.unsent);
    let stirred = std::mem::take(&mut live.stirred);
    let mut writer = ChunkedWriter {
        stream,
        arrived: buf,
        chunks: Chunks(unsent.into()),
    };
    match drive(&mut live.live, &mut writer, parkable, stirred).await {
        Ok(Driven::AtTail) => StreamEnded::AtTail(live),
        Ok(Driven::Ended) if live.keep_alive => StreamEnded::Next,
        Ok(Driven::Ended) | Err(_) => StreamEnded::Close,
    }
}

/// How one request's exchange ended.
enum Served {
    /// The connection closes.
    Close,
    /// Answered: the next request may come.
    Next,
    /// The head of a live response is sent; its events are still to be written, and then
    /// the connection goes on if `keep_alive`.
    Streaming { live: LiveBody, keep_alive: bool },
}

/// Reads, handles and answers one request whose first bytes are in `buf` (an event stream's
/// head only: its events are the caller's to write).
async fn serve_request<S, H, F>(
    stream: &mut S,
    buf: &mut BytesMut,
    limits: &ConnectionLimits,
    handle: &H,
    on_error: fn(u16, &str) -> Response,
    stop: &CoreShutdown,
) -> Served
where
    S: crate::transport::socket::Socket,
    H: Fn(Request) -> F,
    F: Future<Output = Response>,
{
    // Each phase's future is on the heap only while that phase runs: a request parked in its
    // handler (a long-poll) or streaming its response (SSE) holds that phase's room only.
    let read = Box::pin(within(
        limits.request_timeout,
        read_request(stream, buf, limits),
    ))
    .await;
    let Some(read) = read else {
        // Idle keep-alive connections just close; a stalled request learns why.
        if !buf.is_empty() {
            let response = on_error(408, "request not received in time");
            let _ = Box::pin(write_response(stream, response, false, false)).await;
        }
        return Served::Close;
    };
    let parsed = match read {
        Ok(Some(parsed)) => parsed,
        Ok(None) => return Served::Close,
        Err(e) => {
            let response = refusal(on_error, e.status, &e.message);
            let _ = Box::pin(write_response(stream, response, false, false)).await;
            // What was received of a refused request is not kept while the rest drains
            // (the core's body budget stops counting it here).
            drop(std::mem::take(buf));
            if e.status == 413 || e.status == 429 {
                // Closing with the body still arriving would reset the connection before
                // the client reads the 413; discard (bounded) what it still sends first.
                let discard = async {
                    // On the heap, only while draining: an array would be part of the
                    // request's future (several times over: a future keeps the room of a
                    // value it moved).
                    let mut sink = vec![0u8; 16 * 1024];
                    let mut left = e
                        .body_left
                        .unwrap_or(OVERSIZED_BODY_DRAIN_BYTES_MAX)
                        .min(OVERSIZED_BODY_DRAIN_BYTES_MAX);
                    while left > 0 {
                        let most = left.min(sink.len());
                        match stream.read(&mut sink[..most]).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => left = left.saturating_sub(n),
                        }
                    }
                };
                // Boxed: only a refused request drains, and inline its room (about 200
                // bytes) would be part of every request's future, parked long-polls included.
                Box::pin(within(OVERSIZED_BODY_DRAIN_TIMEOUT, discard)).await;
            }
            return Served::Close;
        }
    };
    let (request, keep_alive, body_held) = parsed;
    let head_only = request.method == "HEAD";
    let is_get = request.method == "GET";
    // A read can be dropped when its client leaves (a long-poll then leaves no waiter and
    // frees its connection slot); a write always runs to its end.
    let cancellable = head_only || is_get;
    let mut response = if is_get && limits.answers.is_full() {
        // Answers already built fill the core's budget: this one is not even built.
        answers_over_budget(on_error)
    } else if cancellable {
        // Boxed: once the handler answers, its room is given back before the response is
        // written (an SSE response is written for as long as it lives).
        let answer = Box::pin(futures_lite::future::or(
            async { Some(handle(request).await) },
            async {
                peer_gone(stream, buf).await;
                None
            },
        ));
        match answer.await {
            Some(response) => response,
            None => return Served::Close,
        }
    } else {
        // Boxed too: inline, its room would size this future (and so a live read's) anyway.
        Box::pin(handle(request)).await
    };
    // The body was handled (its records are the engine's now, counted there).
    drop(body_held);
    // A read's answer counts against the core's budget until it is written (or the
    // connection is closed: a reader that stops reading is, after the send stall timeout).
    let _answer_held = if is_get {
        hold_answer(&mut response, &limits.answers, on_error)
    } else {
        None
    };
    // Once the node is stopping, the response in hand is the connection's last.
    let keep_alive = keep_alive && !stop.is_set();
    // Boxed like the other phases: inline, the writer's room (the response, its head's text)
    // would be part of every parked long-poll's future, 2.5 KiB of its 3.
    match Box::pin(write_response(stream, response, head_only, keep_alive)).await {
        Ok(Some(live)) => Served::Streaming { live, keep_alive },
        Ok(None) if keep_alive => Served::Next,
        Ok(None) | Err(_) => Served::Close,
    }
}
