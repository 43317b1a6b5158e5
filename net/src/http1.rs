//! HTTP/1.1 on one connection: `httparse` for the request head, `Content-Length` and chunked
//! bodies, keep-alive and pipelining (requests are answered in order, one at a time).
//!
//! Limits: the request head is at most [`HEAD_BYTES_MAX`] with [`HEADERS_MAX`] headers
//! (else `431`), a body at most `max_body_size` (else `413`, and the connection closes once
//! the rest of the body was discarded, bounded, since it cannot be parsed as a next request).

use std::future::Future;
use std::io::IoSlice;
use std::rc::Rc;

use bytes::{Buf, Bytes, BytesMut};
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::http2;
use crate::limits::{BodyReservation, ConnectionLimits};
use crate::message::{refusal, within, BodyStream, Request, Response};
use crate::shutdown::CoreShutdown;

/// Largest request head (request line and headers).
pub const HEAD_BYTES_MAX: usize = 64 * 1024;
/// Most headers in one request.
pub const HEADERS_MAX: usize = 100;

/// After a `413`, at most this much of the rejected body is read and discarded, for at most
/// this long, so the client sees the answer instead of a reset connection.
pub const OVERSIZED_BODY_DRAIN_BYTES_MAX: usize = 64 * 1024 * 1024;
const OVERSIZED_BODY_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Bytes asked of the socket per read while a request arrives.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Bytes asked of the socket by the first read of a connection and between requests: most
/// request heads (and small bodies) fit. Read through a stack scratch, so an idle
/// connection holds no buffer; the larger reads start once a request is arriving.
const IDLE_READ_BYTES: usize = 4 * 1024;
/// While a request is handled: each read of what the peer sends meanwhile (a pipelined
/// request, or nothing until it closes) takes at most this much.
const PEER_READ_BYTES: usize = 2 * 1024;
/// The stack scratch of [`read_arriving`]: the most one of its reads takes.
const ARRIVING_READ_BYTES_MAX: usize = 4 * 1024;

/// The status line's reason phrase (clients ignore it; RFC 9112 lets it be anything).
fn reason(status: u16) -> &'static str {
    http::StatusCode::from_u16(status)
        .ok()
        .and_then(|status| status.canonical_reason())
        .unwrap_or("Status")
}

/// A request the connection cannot parse: answered with this status and message, then closed.
#[derive(Debug)]
pub struct ProtocolError {
    pub status: u16,
    pub message: String,
}

fn protocol_error(status: u16, message: impl Into<String>) -> ProtocolError {
    ProtocolError {
        status,
        message: message.into(),
    }
}

/// Serves a connection until the peer closes or an error ends it: HTTP/2 when it opens with
/// the h2 preface (prior knowledge), HTTP/1.1 otherwise. `handle` answers one request;
/// `on_error` renders a protocol error in the listener's style.
pub async fn serve_connection<S, H, F>(
    mut stream: S,
    limits: ConnectionLimits,
    handle: Rc<H>,
    on_error: fn(u16, &str) -> Response,
    stop: CoreShutdown,
) where
    S: crate::socket::Socket,
    H: Fn(Request) -> F + 'static,
    F: Future<Output = Response> + 'static,
{
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
            return Box::pin(h2).await;
        }
        let more = within(limits.request_timeout, fill_idle(&mut stream, &mut buf)).await;
        if !matches!(more, Some(Ok(true))) {
            return;
        }
    }
    serve_http1(stream, buf, limits, handle, on_error, stop).await
}

async fn serve_http1<S, H, F>(
    mut stream: S,
    mut buf: BytesMut,
    limits: ConnectionLimits,
    handle: Rc<H>,
    on_error: fn(u16, &str) -> Response,
    stop: CoreShutdown,
) where
    S: AsyncRead + AsyncWrite + Unpin,
    H: Fn(Request) -> F,
    F: Future<Output = Response>,
{
    loop {
        if buf.is_empty() {
            // Idle between requests: a shutdown closes the connection here, never mid-request.
            let first = stop
                .unless_stopped(within(
                    limits.request_timeout,
                    fill_idle(&mut stream, &mut buf),
                ))
                .await;
            if !matches!(first, Some(Some(Ok(true)))) {
                return;
            }
        }
        // A request is arriving. Its future (with the reading and handling phases boxed
        // inside it, about 1.2 KiB) is put on the heap for as long as it runs, so an idle
        // connection's own future stays a few hundred bytes instead of carrying that room for
        // the connection's whole life.
        let served = serve_request(&mut stream, &mut buf, &limits, &*handle, on_error, &stop);
        if !Box::pin(served).await {
            return;
        }
    }
}

/// Reads, handles and answers one request whose first bytes are in `buf`; whether the
/// connection goes on.
async fn serve_request<S, H, F>(
    stream: &mut S,
    buf: &mut BytesMut,
    limits: &ConnectionLimits,
    handle: &H,
    on_error: fn(u16, &str) -> Response,
    stop: &CoreShutdown,
) -> bool
where
    S: AsyncRead + AsyncWrite + Unpin,
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
            let _ = write_response(stream, buf, response, false, false).await;
        }
        return false;
    };
    let parsed = match read {
        Ok(Some(parsed)) => parsed,
        Ok(None) => return false,
        Err(e) => {
            let response = refusal(on_error, e.status, &e.message);
            let _ = write_response(stream, buf, response, false, false).await;
            // What was received of a refused request is not kept while the rest drains
            // (the core's body budget no longer counts it).
            drop(std::mem::take(buf));
            if e.status == 413 || e.status == 429 {
                // Closing with the body still arriving would reset the connection before
                // the client reads the 413; discard (bounded) what it still sends first.
                let discard = async {
                    // On the heap, only while draining: an array would be part of the
                    // request's future (several times over: a future keeps the room of a
                    // value it moved).
                    let mut sink = vec![0u8; 16 * 1024];
                    let mut left = OVERSIZED_BODY_DRAIN_BYTES_MAX;
                    while left > 0 {
                        match stream.read(&mut sink).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => left = left.saturating_sub(n),
                        }
                    }
                };
                within(OVERSIZED_BODY_DRAIN_TIMEOUT, discard).await;
            }
            return false;
        }
    };
    let (request, keep_alive, body_held) = parsed;
    let head_only = request.method == "HEAD";
    // A read can be dropped when its client leaves (a long-poll then leaves no waiter and
    // frees its connection slot); a write always runs to its end.
    let cancellable = head_only || request.method == "GET";
    let response = if cancellable {
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
            None => return false,
        }
    } else {
        // Boxed too: inline, its room would size this future (and so a live read's) anyway.
        Box::pin(handle(request)).await
    };
    // The body was handled (its records are the engine's now, counted there).
    drop(body_held);
    // Once the node is stopping, the response in hand is the connection's last.
    let keep_alive = keep_alive && !stop.is_set();
    write_response(stream, buf, response, head_only, keep_alive)
        .await
        .is_ok()
        && keep_alive
}

/// Completes when the peer closes the connection (or it fails) while a request is handled;
/// bytes it sends meanwhile (a pipelined next request) are kept in `buf`, up to a request
/// head's worth, after which it stops reading. Cancel-safe: bytes are moved into `buf` in the
/// poll that reads them.
async fn peer_gone<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut BytesMut) {
    while buf.len() < HEAD_BYTES_MAX {
        match read_arriving(stream, buf, PEER_READ_BYTES).await {
            Ok(false) | Err(_) => return,
            Ok(true) => {}
        }
    }
    std::future::pending::<()>().await
}

/// Waits for the next bytes of a connection that holds no room for them: each poll reads
/// into a scratch array on the stack (for that poll only, never part of a future) and only
/// bytes that arrived are appended to `buf`. So a connection waiting for its next request, or
/// for its client to leave during a long-poll or an SSE response, holds no buffer at all
/// (thousands wait at once). Cancel-safe: `buf` changes only in the poll that read. `false`
/// at end of stream.
async fn read_arriving<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    most: usize,
) -> std::io::Result<bool> {
    std::future::poll_fn(|cx| {
        let mut scratch = [0u8; ARRIVING_READ_BYTES_MAX];
        let room = most.min(ARRIVING_READ_BYTES_MAX);
        match std::pin::Pin::new(&mut *stream).poll_read(cx, &mut scratch[..room]) {
            std::task::Poll::Ready(Ok(n)) => {
                buf.extend_from_slice(&scratch[..n]);
                std::task::Poll::Ready(Ok(n > 0))
            }
            std::task::Poll::Ready(Err(e)) => std::task::Poll::Ready(Err(e)),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    })
    .await
}

/// Fills `buf` with at least one more chunk from the socket; `false` at end of stream.
async fn fill<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut BytesMut) -> std::io::Result<bool> {
    read_into(stream, buf, READ_CHUNK_BYTES).await
}

/// Waits for the next bytes of an idle connection, holding no buffer meanwhile: the previous
/// request's buffer is let go first.
async fn fill_idle<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
) -> std::io::Result<bool> {
    if buf.is_empty() && buf.capacity() > 0 {
        *buf = BytesMut::new();
    }
    read_arriving(stream, buf, IDLE_READ_BYTES).await
}

/// Reads at most `room` more bytes onto the end of `buf`; `false` at end of stream.
async fn read_into<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    room: usize,
) -> std::io::Result<bool> {
    let len = buf.len();
    buf.resize(len + room, 0);
    let n = stream.read(&mut buf[len..]).await;
    let n = match n {
        Ok(n) => n,
        Err(e) => {
            buf.truncate(len);
            return Err(e);
        }
    };
    buf.truncate(len + n);
    Ok(n > 0)
}

/// Reads one request. `Ok(None)`: the peer closed between requests.
async fn read_request<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    limits: &ConnectionLimits,
) -> Result<Option<(Request, bool, BodyReservation)>, ProtocolError> {
    let io_error = |e: std::io::Error| protocol_error(400, format!("connection error: {e}"));
    loop {
        if !buf.is_empty() {
            let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
            let mut parsed = httparse::Request::new(&mut headers);
            match parsed.parse(buf) {
                Ok(httparse::Status::Complete(head_len)) => {
                    if head_len > HEAD_BYTES_MAX {
                        return Err(protocol_error(431, "request head too large"));
                    }
                    if has_bare_lf(&buf[..head_len]) {
                        return Err(protocol_error(400, "request lines must end with CRLF"));
                    }
                    let head = parse_head(&parsed)?;
                    buf.advance(head_len);
                    return read_body(stream, buf, head, limits).await.map(Some);
                }
                Ok(httparse::Status::Partial) => {
                    if buf.len() > HEAD_BYTES_MAX {
                        return Err(protocol_error(431, "request head too large"));
                    }
                }
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(protocol_error(
                        431,
                        format!("more than {HEADERS_MAX} headers"),
                    ));
                }
                Err(e) => return Err(protocol_error(400, format!("malformed request: {e}"))),
            }
        }
        let was_empty = buf.is_empty();
        if !fill(stream, buf).await.map_err(io_error)? {
            if was_empty {
                return Ok(None);
            }
            return Err(protocol_error(400, "connection closed mid-request"));
        }
    }
}

struct Head {
    method: String,
    path: String,
    query: String,
    headers: Vec<(String, Bytes)>,
    keep_alive: bool,
    content_length: Option<usize>,
    chunked: bool,
    expect_continue: bool,
}

fn parse_head(parsed: &httparse::Request) -> Result<Head, ProtocolError> {
    let method = parsed.method.unwrap_or_default().to_string();
    let target = parsed.path.unwrap_or_default();
    let version = parsed.version.unwrap_or(1);
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, q),
        None => (target, ""),
    };
    let path = if path.is_empty() { "/" } else { path };
    if !path.starts_with('/') {
        return Err(protocol_error(
            400,
            format!("request target must be a path: {target}"),
        ));
    }
    let mut head = Head {
        method,
        path: path.to_string(),
        query: query.to_string(),
        headers: Vec::with_capacity(parsed.headers.len()),
        keep_alive: version == 1,
        content_length: None,
        chunked: false,
        expect_continue: false,
    };
    for header in parsed.headers.iter() {
        let name = header.name.to_ascii_lowercase();
        let value = header.value;
        match name.as_str() {
            "content-length" => {
                let text = std::str::from_utf8(value).unwrap_or("").trim();
                let length = text
                    .parse::<usize>()
                    .ok()
                    .filter(|_| !text.starts_with('+'))
                    .ok_or_else(|| protocol_error(400, "invalid Content-Length"))?;
                if head.content_length.is_some_and(|l| l != length) {
                    return Err(protocol_error(400, "conflicting Content-Length headers"));
                }
                head.content_length = Some(length);
            }
            "transfer-encoding" => {
                // RFC 9112 §6.1: HTTP/1.0 has no chunked framing, and chunked applies once.
                if version == 0 {
                    return Err(protocol_error(
                        400,
                        "Transfer-Encoding in an HTTP/1.0 request",
                    ));
                }
                if head.chunked {
                    return Err(protocol_error(400, "Transfer-Encoding given twice"));
                }
                let text = String::from_utf8_lossy(value).to_ascii_lowercase();
                if text.trim() != "chunked" {
                    return Err(protocol_error(
                        501,
                        format!("unsupported Transfer-Encoding: {text}"),
                    ));
                }
                head.chunked = true;
            }
            "connection" => {
                let text = String::from_utf8_lossy(value).to_ascii_lowercase();
                if text.contains("close") {
                    head.keep_alive = false;
                } else if text.contains("keep-alive") {
                    head.keep_alive = true;
                }
            }
            "expect" => {
                head.expect_continue = value.eq_ignore_ascii_case(b"100-continue");
            }
            _ => {}
        }
        head.headers.push((name, Bytes::copy_from_slice(value)));
    }
    if head.chunked && head.content_length.is_some() {
        return Err(protocol_error(
            400,
            "both Content-Length and Transfer-Encoding given",
        ));
    }
    Ok(head)
}

async fn read_body<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    head: Head,
    limits: &ConnectionLimits,
) -> Result<(Request, bool, BodyReservation), ProtocolError> {
    let max_body_size = limits.max_body_size;
    let mut held = limits.bodies.reservation();
    let io_error = |e: std::io::Error| protocol_error(400, format!("connection error: {e}"));
    let too_large = || protocol_error(413, format!("body larger than {max_body_size} bytes"));
    let wants_body = head.chunked || head.content_length.is_some_and(|l| l > 0);
    if head.expect_continue && wants_body {
        if head.content_length.is_some_and(|l| l > max_body_size) {
            return Err(too_large());
        }
        stream
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .map_err(io_error)?;
    }
    let body = if head.chunked {
        read_chunked(stream, buf, max_body_size, &mut held).await?
    } else {
        let length = head.content_length.unwrap_or(0);
        if length > max_body_size {
            return Err(too_large());
        }
        // Counted as it arrives, not when complete: a stalled body holds what it sent.
        while buf.len() < length {
            make_room(buf, length, &mut held)?;
            if !fill_spare(stream, buf).await.map_err(io_error)? {
                return Err(protocol_error(400, "connection closed mid-body"));
            }
        }
        if !held.grow_to(charged_bytes(buf.capacity(), length)) {
            return Err(overloaded());
        }
        // The body leaves the read buffer without a copy.
        buf.split_to(length).freeze()
    };
    let request = Request {
        method: head.method,
        path: head.path,
        query: head.query,
        headers: head.headers,
        body,
    };
    Ok((request, head.keep_alive, held))
}

/// The core's request bodies fill `--max-in-flight-bytes`.
fn overloaded() -> ProtocolError {
    protocol_error(429, crate::limits::BODIES_OVER_BUDGET)
}

async fn read_chunked<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    max_body_size: usize,
    held: &mut BodyReservation,
) -> Result<Bytes, ProtocolError> {
    let io_error = |e: std::io::Error| protocol_error(400, format!("connection error: {e}"));
    let closed = || protocol_error(400, "connection closed mid-body");
    let mut body = BytesMut::new();
    loop {
        let line_end = loop {
            if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                break i;
            }
            if buf.len() > 1024 {
                return Err(protocol_error(400, "malformed chunk size line"));
            }
            if !fill(stream, buf).await.map_err(io_error)? {
                return Err(closed());
            }
        };
        let size = parse_chunk_size(&buf[..line_end])?;
        buf.advance(line_end + 2);
        if size == 0 {
            // Trailers, if any, end with an empty line.
            loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    let empty = i == 0;
                    buf.advance(i + 2);
                    if empty {
                        return Ok(body.freeze());
                    }
                    continue;
                }
                if buf.len() > HEAD_BYTES_MAX {
                    return Err(protocol_error(431, "chunked trailers too large"));
                }
                if !fill(stream, buf).await.map_err(io_error)? {
                    return Err(closed());
                }
            }
        }
        // `size` came off the wire: compared before any sum so nothing can wrap.
        if size > max_body_size - body.len() {
            return Err(protocol_error(
                413,
                format!("body larger than {max_body_size} bytes"),
            ));
        }
        // The chunk moves into `body` as it arrives, so the read buffer stays one read long
        // and the body's allocation is the only one that grows (and is counted).
        let chunk_end = body.len() + size;
        while body.len() < chunk_end {
            if buf.is_empty() && !fill(stream, buf).await.map_err(io_error)? {
                return Err(closed());
            }
            let take = buf.len().min(chunk_end - body.len());
            make_room(&mut body, chunk_end, held)?;
            let take = take.min(body.capacity() - body.len());
            body.extend_from_slice(&buf[..take]);
            buf.advance(take);
        }
        while buf.len() < 2 {
            if !fill(stream, buf).await.map_err(io_error)? {
                return Err(closed());
            }
        }
        if &buf[..2] != b"\r\n" {
            return Err(protocol_error(400, "chunk not terminated by CRLF"));
        }
        buf.advance(2);
    }
}

/// A connection's read buffer up to this capacity is the connection's own (bounded by the
/// connection limit); past it, a body's buffer is counted against the core's budget by its
/// capacity, the memory it really takes.
const STANDING_BUFFER_BYTES: usize = 2 * READ_CHUNK_BYTES;

/// Bytes a body buffer of `capacity` holding `received` body bytes charges the budget.
fn charged_bytes(capacity: usize, received: usize) -> usize {
    if capacity <= STANDING_BUFFER_BYTES {
        received
    } else {
        capacity
    }
}

/// Makes sure `buf`, holding only body bytes, has room for at least one more read of a body
/// that ends at `end_len` bytes, charging `held` first. It grows by doubling (so copies stay linear in the
/// body) but never past `end_len`, and allocates exactly what it charged: `BytesMut` would
/// double past the declared length and the budget would undercount what is held.
fn make_room(
    buf: &mut BytesMut,
    end_len: usize,
    held: &mut BodyReservation,
) -> Result<(), ProtocolError> {
    let len = buf.len();
    let received = len;
    if buf.capacity() > len {
        return if held.grow_to(charged_bytes(buf.capacity(), received)) {
            Ok(())
        } else {
            Err(overloaded())
        };
    }
    let doubled = buf.capacity().saturating_mul(2).max(len + READ_CHUNK_BYTES);
    let capacity = doubled.min(end_len).max(len + 1);
    if !held.grow_to(charged_bytes(capacity, received)) {
        return Err(overloaded());
    }
    let mut bigger = BytesMut::with_capacity(capacity);
    bigger.extend_from_slice(buf);
    *buf = bigger;
    Ok(())
}

/// Reads into `buf`'s spare capacity (at most one read's worth) without growing it; `false`
/// at end of stream.
async fn fill_spare<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
) -> std::io::Result<bool> {
    let room = (buf.capacity() - buf.len()).min(READ_CHUNK_BYTES);
    read_into(stream, buf, room).await
}

/// Most hex digits in a chunk size: 16 of them already exceed any body limit.
const CHUNK_SIZE_DIGITS_MAX: usize = 16;

/// A chunk-size line (RFC 9112 §7.1): `1*HEXDIG [ BWS ";" chunk-ext ]`. Signs, `0x`, leading
/// white space and overlong sizes are refused: a lenient parser here reads a different body
/// than a proxy in front of it would (request smuggling).
fn parse_chunk_size(line: &[u8]) -> Result<usize, ProtocolError> {
    let malformed = || protocol_error(400, "malformed chunk size");
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > CHUNK_SIZE_DIGITS_MAX {
        return Err(malformed());
    }
    let rest = &line[digits..];
    let ext = rest.iter().position(|b| !matches!(b, b' ' | b'\t'));
    if ext.is_some_and(|i| rest[i] != b';') || rest.iter().any(|&b| b == b'\n' || b == b'\r') {
        return Err(malformed());
    }
    let text = std::str::from_utf8(&line[..digits]).map_err(|_| malformed())?;
    usize::from_str_radix(text, 16).map_err(|_| malformed())
}

/// Whether a request head uses a line ending other than CRLF. `httparse` accepts a bare LF;
/// an intermediary that does not could see other header boundaries than this server does.
fn has_bare_lf(head: &[u8]) -> bool {
    head.iter()
        .enumerate()
        .any(|(i, &b)| b == b'\n' && (i == 0 || head[i - 1] != b'\r'))
}

/// Sends `response`. While an event stream waits for its next event, what the peer sends is
/// kept in `arrived` (a pipelined request), and the peer closing ends the stream at once.
async fn write_response<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    arrived: &mut BytesMut,
    mut response: Response,
    head_only: bool,
    keep_alive: bool,
) -> std::io::Result<()> {
    use std::fmt::Write;
    let mut head = String::with_capacity(256);
    let _ = write!(
        head,
        "HTTP/1.1 {} {}\r\n",
        response.status,
        reason(response.status)
    );
    for (name, value) in &response.headers {
        let _ = write!(head, "{name}: {value}\r\n");
    }
    let no_body_status = response.status == 204 || response.status == 304 || response.status < 200;
    if let Some(body) = response.stream {
        if head_only {
            head.push_str("\r\n");
            stream.write_all(head.as_bytes()).await?;
            return stream.flush().await;
        }
        head.push_str("transfer-encoding: chunked\r\n");
        if !keep_alive {
            head.push_str("connection: close\r\n");
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await?;
        stream.flush().await?;
        return write_chunked(stream, arrived, body).await;
    }
    let body_len = response.body_len();
    if !no_body_status {
        let _ = write!(head, "content-length: {body_len}\r\n");
    }
    if !keep_alive {
        head.push_str("connection: close\r\n");
    }
    head.push_str("\r\n");
    let send_body = !head_only && !no_body_status && body_len > 0;
    if send_body && body_len <= 16 * 1024 {
        let mut all = Vec::with_capacity(head.len() + body_len);
        all.extend_from_slice(head.as_bytes());
        for buffer in response.take_body_buffers() {
            all.extend_from_slice(&buffer);
        }
        stream.write_all(&all).await?;
    } else {
        let body = if send_body {
            response.take_body_buffers()
        } else {
            Vec::new()
        };
        // The head and the body's buffers as they are: one `sendmsg` for as many as the
        // socket takes (plain TCP), or one buffer per write (TLS).
        let mut slices: Vec<IoSlice<'_>> = std::iter::once(head.as_bytes())
            .chain(body.iter().map(|b| &b[..]))
            .map(IoSlice::new)
            .collect();
        let mut pending = &mut slices[..];
        while !pending.is_empty() {
            let written = stream.write_vectored(pending).await?;
            if written == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut pending, written);
        }
    }
    stream.flush().await
}

/// Sends each item of `body` as one chunk, flushing after each so events reach the client at
/// once; a write error (the client went away) ends the stream.
async fn write_chunked<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    arrived: &mut BytesMut,
    mut body: BodyStream,
) -> std::io::Result<()> {
    use futures_lite::StreamExt;
    loop {
        let next = futures_lite::future::or(async { Some(body.next().await) }, async {
            peer_gone(stream, arrived).await;
            None
        })
        .await;
        // The peer left: the event stream (and the read waiting under it) is dropped now,
        // not at the next keep-alive.
        let Some(next) = next else {
            return Err(std::io::ErrorKind::ConnectionAborted.into());
        };
        let Some(chunk) = next else { break };
        if chunk.is_empty() {
            continue;
        }
        let mut out = Vec::with_capacity(chunk.len() + 16);
        out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        out.extend_from_slice(&chunk);
        out.extend_from_slice(b"\r\n");
        stream.write_all(&out).await?;
        stream.flush().await?;
    }
    stream.write_all(b"0\r\n\r\n").await?;
    stream.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle HTTP/1.1 connection holds its own small future only: the request's (here a
    /// handler holding 32 KiB across an await) is on the heap while it runs. Inline, every
    /// connection would carry that room for its whole life (124 KiB per idle connection
    /// before, measured with 2,000 of them; BENCHMARKS.md).
    #[test]
    fn an_idle_connection_does_not_carry_a_request_s_future() {
        let bytes = glommio::LocalExecutor::default().run(async {
            let handle = Rc::new(|_request: Request| async {
                let scratch = [1u8; 32 * 1024];
                futures_lite::future::yield_now().await;
                Response::new(200).with_body(Bytes::copy_from_slice(&scratch[..1]))
            });
            let stop = crate::shutdown::Shutdown::default().on_this_core();
            let stream = futures_lite::io::Cursor::new(Vec::<u8>::new());
            let limits = ConnectionLimits::with_body_limit(1 << 20);
            let connection = serve_http1(
                stream,
                BytesMut::new(),
                limits,
                handle,
                |s, _| Response::new(s),
                stop,
            );
            std::mem::size_of_val(&connection)
        });
        assert!(bytes < 4096, "a connection's future takes {bytes} bytes");
    }

    /// A request parked in its handler (a long-poll) or streaming its response (SSE) holds the
    /// handler's future plus little else: reading the request and handling it are boxed
    /// phases, writing the answer is small, and watching for the peer leaving keeps no buffer
    /// of its own. (With a trivial handler: 12,048 bytes before, when the phases were inline.)
    #[test]
    fn a_parked_request_holds_little_besides_its_handler() {
        let (request, watch, write) = glommio::LocalExecutor::default().run(async {
            let handle = |_request: Request| async {
                futures_lite::future::yield_now().await;
                Response::new(200)
            };
            let stop = crate::shutdown::Shutdown::default().on_this_core();
            let mut stream = futures_lite::io::Cursor::new(Vec::<u8>::new());
            let limits = ConnectionLimits::with_body_limit(1 << 20);
            let mut buf = BytesMut::new();
            let on_error = |s, _: &str| Response::new(s);
            let request = std::mem::size_of_val(&serve_request(
                &mut stream,
                &mut buf,
                &limits,
                &handle,
                on_error,
                &stop,
            ));
            let watch = std::mem::size_of_val(&peer_gone(&mut stream, &mut buf));
            let response = Response::new(200);
            let write = std::mem::size_of_val(&write_response(
                &mut stream,
                &mut buf,
                response,
                false,
                false,
            ));
            (request, watch, write)
        });
        assert!(
            request < 2048,
            "a request's own future takes {request} bytes"
        );
        assert!(watch < 256, "watching for the peer takes {watch} bytes");
        assert!(write < 2048, "writing a response takes {write} bytes");
    }

    /// Parses `wire` as one request with a 1 MiB body limit: the status of the error, or 0.
    fn parse_status(wire: &[u8]) -> u16 {
        let mut stream = futures_lite::io::Cursor::new(wire.to_vec());
        let mut buf = BytesMut::new();
        let limits = ConnectionLimits::with_body_limit(1 << 20);
        let read = read_request(&mut stream, &mut buf, &limits);
        match futures_lite::future::block_on(read) {
            Ok(_) => 0,
            Err(e) => e.status,
        }
    }

    proptest::proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn fuzz_http1_request(wire in crate::fuzzing::inputs("http1")) {
            let mut stream = futures_lite::io::Cursor::new(wire);
            let mut buf = BytesMut::new();
            let limits = ConnectionLimits::with_body_limit(4096);
            let read = read_request(&mut stream, &mut buf, &limits);
            if let Ok(Some((request, _, _))) = futures_lite::future::block_on(read) {
                proptest::prop_assert!(request.body.len() <= 4096);
                proptest::prop_assert!(request.path.starts_with('/'));
            }
        }
    }

    const CHUNKED: &str = "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";

    #[test]
    fn chunk_sizes_from_the_wire_never_overflow() {
        for size in ["ffffffffffffffff", "fffffffffffffff0", "100001"] {
            let wire = format!("{CHUNKED}1\r\na\r\n{size}\r\n");
            assert_eq!(parse_status(wire.as_bytes()), 413, "chunk size {size}");
        }
        let overlong = format!("{CHUNKED}00000000000000001\r\na\r\n0\r\n\r\n");
        assert_eq!(parse_status(overlong.as_bytes()), 400);
    }

    #[test]
    fn chunk_size_lines_are_strict() {
        for line in ["+1", "-1", "0x1", " 1", "1 x", "", ";a", "1\na"] {
            let wire = format!("{CHUNKED}{line}\r\na\r\n0\r\n\r\n");
            assert_eq!(
                parse_status(wire.as_bytes()),
                400,
                "chunk size line {line:?}"
            );
        }
        for line in ["1", "1;name=value", "1 ;name", "01"] {
            let wire = format!("{CHUNKED}{line}\r\na\r\n0\r\n\r\n");
            assert_eq!(parse_status(wire.as_bytes()), 0, "chunk size line {line:?}");
        }
    }

    #[test]
    fn framing_that_proxies_read_differently_is_refused() {
        let http10 = "POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n";
        assert_eq!(parse_status(http10.as_bytes()), 400);
        let twice = "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        assert_eq!(parse_status(twice.as_bytes()), 400);
        let bare_lf = "POST /x HTTP/1.1\nHost: a\nContent-Length: 1\n\na";
        assert_eq!(parse_status(bare_lf.as_bytes()), 400);
        let mixed = "GET /x HTTP/1.1\r\nHost: a\nX: y\r\n\r\n";
        assert_eq!(parse_status(mixed.as_bytes()), 400);
        let signed = "POST /x HTTP/1.1\r\nContent-Length: +1\r\n\r\na";
        assert_eq!(parse_status(signed.as_bytes()), 400);
        let fine = "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\na";
        assert_eq!(parse_status(fine.as_bytes()), 0);
    }

    /// A stream that hands out its bytes a few KiB per read, as a socket under load does.
    struct Trickle(futures_lite::io::Cursor<Vec<u8>>);

    impl futures_lite::AsyncRead for Trickle {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            out: &mut [u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = out.len().min(3000);
            std::pin::Pin::new(&mut self.0).poll_read(cx, &mut out[..n])
        }
    }

    impl futures_lite::AsyncWrite for Trickle {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            data: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::task::Poll::Ready(Ok(data.len()))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_close(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[test]
    fn a_body_takes_no_more_memory_than_the_budget_was_charged() {
        let size = 3_000_000;
        let mut chunked = CHUNKED.as_bytes().to_vec();
        for part in vec![b'c'; size].chunks(100_000) {
            chunked.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
            chunked.extend_from_slice(part);
            chunked.extend_from_slice(b"\r\n");
        }
        chunked.extend_from_slice(b"0\r\n\r\n");
        let mut plain = format!("POST /x HTTP/1.1\r\nContent-Length: {size}\r\n\r\n").into_bytes();
        plain.extend(std::iter::repeat_n(b'p', size));
        for wire in [plain, chunked] {
            let mut stream = Trickle(futures_lite::io::Cursor::new(wire));
            let mut buf = BytesMut::new();
            let limits = ConnectionLimits::with_body_limit(8 << 20);
            let read = read_request(&mut stream, &mut buf, &limits);
            let (request, _, held) = futures_lite::future::block_on(read).unwrap().unwrap();
            assert_eq!(request.body.len(), size);
            drop(buf);
            let allocated = request.body.try_into_mut().unwrap().capacity();
            let charged = limits.bodies.held_bytes();
            // Left to `BytesMut`, doubling left up to twice the body allocated, half uncounted.
            assert!(
                allocated <= charged,
                "{allocated} bytes held, {charged} charged"
            );
            assert!(
                charged <= size + (64 << 10),
                "charged {charged} for {size} bytes"
            );
            drop(held);
            assert_eq!(limits.bodies.held_bytes(), 0);
        }
    }

    #[test]
    fn a_body_past_the_budget_is_refused_while_another_is_held() {
        let limits = ConnectionLimits {
            bodies: crate::limits::BodyBudget::new(1 << 20),
            ..ConnectionLimits::with_body_limit(8 << 20)
        };
        let mut first = limits.bodies.reservation();
        assert!(first.grow_to(512 << 10));
        let size = 600 << 10;
        let mut wire = format!("POST /x HTTP/1.1\r\nContent-Length: {size}\r\n\r\n").into_bytes();
        wire.extend(std::iter::repeat_n(b'p', size));
        let mut stream = Trickle(futures_lite::io::Cursor::new(wire));
        let mut buf = BytesMut::new();
        let read = read_request(&mut stream, &mut buf, &limits);
        let refused = futures_lite::future::block_on(read).err().unwrap();
        assert_eq!(refused.status, 429);
        assert_eq!(
            limits.bodies.held_bytes(),
            512 << 10,
            "the refused body gave its share back"
        );
    }
}
