//! Reading one HTTP/1.1 request: the head (`httparse`, strict framing against request
//! smuggling), then a `Content-Length` or chunked body counted against the core's body budget.

use bytes::{Buf, Bytes, BytesMut};
use futures_lite::AsyncWriteExt;

use super::read::{fill, fill_spare, READ_CHUNK_BYTES};
use crate::limits::{
    BodyReservation, ConnectionLimits, CHUNK_SIZE_LINE_BYTES_MAX, HEADERS_MAX, HEAD_BYTES_MAX,
};
use crate::transport::message::{valid_authority, Request};
use crate::transport::socket::Socket;

/// A request the connection cannot parse: answered with this status and message, then closed.
#[derive(Debug)]
pub struct ProtocolError {
    pub status: u16,
    pub message: String,
    /// A refused body's bytes still to arrive, when its `Content-Length` says (`None`:
    /// unknown). The connection discards that many and closes at once, instead of waiting
    /// out the drain's timeout for bytes a client that keeps the connection open never sends.
    pub body_left: Option<usize>,
}

fn protocol_error(status: u16, message: impl Into<String>) -> ProtocolError {
    ProtocolError {
        status,
        message: message.into(),
        body_left: None,
    }
}

impl ProtocolError {
    fn with_body_left(self, body_left: usize) -> ProtocolError {
        ProtocolError {
            body_left: Some(body_left),
            ..self
        }
    }
}

/// Reads one request. `Ok(None)`: the peer closed between requests.
pub(super) async fn read_request<S: Socket>(
    stream: &mut S,
    buf: &mut BytesMut,
    limits: &ConnectionLimits,
) -> Result<Option<(Request, bool, BodyReservation)>, ProtocolError> {
    let io_error = |e: std::io::Error| protocol_error(400, format!("connection error: {e}"));
    loop {
        if !buf.is_empty() {
            if let Some((head, head_len)) = parse_buffered_head(buf)? {
                buf.advance(head_len);
                return read_body(stream, buf, head, limits).await.map(Some);
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

/// The head at the start of `buf` and its length, or `None` while it is incomplete.
///
/// Not part of `read_request`'s future: httparse's room for [`HEADERS_MAX`] headers (3.2 KiB)
/// would be kept in it across the body's awaits, and every request's read phase is boxed
/// (3.9 KiB instead of a few hundred bytes, allocated and copied per request). The room is
/// left uninitialized: httparse writes the headers it finds.
fn parse_buffered_head(buf: &[u8]) -> Result<Option<(Head, usize)>, ProtocolError> {
    let mut headers = [const { std::mem::MaybeUninit::<httparse::Header>::uninit() }; HEADERS_MAX];
    let mut parsed = httparse::Request::new(&mut []);
    match parsed.parse_with_uninit_headers(buf, &mut headers) {
        Ok(httparse::Status::Complete(head_len)) => {
            if head_len > HEAD_BYTES_MAX {
                return Err(protocol_error(431, "request head too large"));
            }
            if has_bare_lf(&buf[..head_len]) {
                return Err(protocol_error(400, "request lines must end with CRLF"));
            }
            Ok(Some((parse_head(&parsed)?, head_len)))
        }
        Ok(httparse::Status::Partial) => {
            if buf.len() > HEAD_BYTES_MAX {
                return Err(protocol_error(431, "request head too large"));
            }
            Ok(None)
        }
        Err(httparse::Error::TooManyHeaders) => Err(protocol_error(
            431,
            format!("more than {HEADERS_MAX} headers"),
        )),
        Err(e) => Err(protocol_error(400, format!("malformed request: {e}"))),
    }
}

pub(super) struct Head {
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
    let mut hosts = 0usize;
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
                // RFC 9110 §10.1.1: `100-continue` is the only expectation there is; anything
                // else is `417`, and HTTP/1.0 has none to meet.
                let text = std::str::from_utf8(value).unwrap_or("").trim();
                if !text.eq_ignore_ascii_case("100-continue") {
                    return Err(protocol_error(
                        417,
                        format!(
                            "unsupported expectation: {}",
                            String::from_utf8_lossy(value)
                        ),
                    ));
                }
                head.expect_continue = version == 1;
            }
            "host" => {
                // RFC 9112 §3.2: one `Host`, with a valid authority (it names the server in
                // the URLs built from it, Durable Streams' `Location`).
                hosts += 1;
                if hosts > 1 {
                    return Err(protocol_error(400, "more than one Host header"));
                }
                if !valid_authority(value) {
                    return Err(protocol_error(
                        400,
                        format!("invalid Host: {}", String::from_utf8_lossy(value)),
                    ));
                }
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
    // HTTP/1.0 has no `Host` requirement (RFC 9112 §3.2 is HTTP/1.1's).
    if hosts == 0 && version == 1 {
        return Err(protocol_error(
            400,
            "an HTTP/1.1 request needs a Host header",
        ));
    }
    Ok(head)
}

async fn read_body<S: Socket>(
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
        // What is left of the body once `buf` holds its start.
        let left = |buf: &BytesMut| length.saturating_sub(buf.len());
        if length > max_body_size {
            return Err(too_large().with_body_left(left(buf)));
        }
        // Counted as it arrives, not when complete: a stalled body holds what it sent.
        while buf.len() < length {
            make_room(buf, length, &mut held).map_err(|e| e.with_body_left(left(buf)))?;
            if !fill_spare(stream, buf).await.map_err(io_error)? {
                return Err(protocol_error(400, "connection closed mid-body"));
            }
        }
        if !held.grow_to(charged_bytes(buf.capacity(), length)) {
            return Err(overloaded().with_body_left(0));
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
pub(super) fn overloaded() -> ProtocolError {
    protocol_error(429, crate::limits::BODIES_OVER_BUDGET)
}

async fn read_chunked<S: Socket>(
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
                // Also when the whole line came in one read.
                if i > CHUNK_SIZE_LINE_BYTES_MAX {
                    return Err(protocol_error(400, "malformed chunk size line"));
                }
                break i;
            }
            if buf.len() > CHUNK_SIZE_LINE_BYTES_MAX {
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

/// Most hex digits in a chunk size: 16 of them already exceed any body limit.
const CHUNK_SIZE_DIGITS_MAX: usize = 16;

/// A chunk-size line (RFC 9112 §7.1): `1*HEXDIG [ BWS ";" chunk-ext ]`. Signs, `0x`, leading
/// or trailing white space (white space only comes before a `;`), control characters (NUL,
/// CR, LF) in an extension and overlong sizes are refused: a lenient parser here reads a
/// different body than a proxy in front of it would (request smuggling).
fn parse_chunk_size(line: &[u8]) -> Result<usize, ProtocolError> {
    let malformed = || protocol_error(400, "malformed chunk size");
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > CHUNK_SIZE_DIGITS_MAX {
        return Err(malformed());
    }
    let rest = &line[digits..];
    if !rest.is_empty() {
        let ext = rest.iter().position(|b| !matches!(b, b' ' | b'\t'));
        if ext.is_none_or(|i| rest[i] != b';') {
            return Err(malformed());
        }
    }
    if rest.iter().any(|&b| b.is_ascii_control() && b != b'\t') {
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
