//! Writing one HTTP/1.1 response: status line and headers, then a sized body in as few
//! writes as the socket takes, or an event stream as chunks until it ends or the peer leaves.

use std::io::IoSlice;

use bytes::BytesMut;
use futures_lite::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::read::peer_gone;
use crate::live::live_read;
use crate::transport::message::{by_deadline, LiveBody, Response};

/// The status line's reason phrase (clients ignore it; RFC 9112 lets it be anything).
pub(super) fn reason(status: u16) -> &'static str {
    http::StatusCode::from_u16(status)
        .ok()
        .and_then(|status| status.canonical_reason())
        .unwrap_or("Status")
}

/// Sends `response`; for a live response only its head, and hands the events back
/// (`Ok(Some(events))`) for the caller to send with [`write_events`]. Written apart, the
/// stream does not keep this future and the request's alive for as long as it lives: an SSE
/// subscriber would hold 1.2 KiB of them (docs/decisions/2026-12-small-connection-futures.md).
pub(super) async fn write_response<S: AsyncWrite + Unpin>(
    stream: &mut S,
    mut response: Response,
    head_only: bool,
    keep_alive: bool,
) -> std::io::Result<Option<LiveBody>> {
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
    if let Some(body) = response.take_live() {
        if head_only {
            head.push_str("\r\n");
            stream.write_all(head.as_bytes()).await?;
            return stream.flush().await.map(|()| None);
        }
        head.push_str("transfer-encoding: chunked\r\n");
        if !keep_alive {
            head.push_str("connection: close\r\n");
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await?;
        stream.flush().await?;
        return Ok(Some(body));
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
    stream.flush().await.map(|()| None)
}

/// How writing a live response's events ended.
pub(super) enum EventsWritten {
    /// The response is over (its last chunk is sent).
    Ended,
    /// It waits at the tail with nothing left to send and the peer quiet: the connection may
    /// be parked (only asked for with `parkable`).
    AtTail,
}

/// Writes `unsent` (chunks already framed), then each event of `live` as one chunk, flushing
/// after each write so events reach the client at once; a write error (the client went away)
/// ends the response. While it waits for its next events, what the peer sends is kept in
/// `arrived` (a pipelined request), and the peer closing ends the response at once. Events
/// queued together go out in one write: an SSE data event and the control event behind it are
/// one `send` and one TCP segment instead of two, and the client is woken once (10,000
/// subscribers on one stream pay this per record; docs/decisions/2026-12-shared-live-reads.md).
pub(super) async fn write_events<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    arrived: &mut BytesMut,
    live: &mut LiveBody,
    unsent: &[u8],
    parkable: bool,
    stirred: bool,
) -> std::io::Result<EventsWritten> {
    // Handed back because the peer sent bytes or hung up while parked: it does not park again
    // before its next read has watched the peer (reading those bytes, or seeing the hang-up),
    // or the watch would wake it again at once.
    let mut may_park = parkable && !stirred;
    // A reader that stopped reading does not hold the response past its end: a write still
    // waiting then closes the connection (the socket's send stall timeout bounds it too).
    let deadline = live.deadline();
    if !unsent.is_empty() {
        by_deadline(deadline, send(stream, unsent)).await?;
    }
    loop {
        let mut out = Vec::new();
        while out.len() < COALESCED_CHUNKS_BYTES_MAX {
            match live.pop_event() {
                Some(event) => push_chunk(&mut out, &event),
                None => break,
            }
        }
        if !out.is_empty() {
            by_deadline(deadline, send(stream, &out)).await?;
            continue;
        }
        if may_park && arrived.is_empty() && live.at_tail() {
            return Ok(EventsWritten::AtTail);
        }
        let Some(request) = live.next_read() else {
            by_deadline(deadline, send(stream, LAST_CHUNK)).await?;
            return Ok(EventsWritten::Ended);
        };
        // Boxed: a task that drives its response (over TLS) holds the read's room only while
        // it reads.
        let read = Box::pin(live_read(live.core(), live.stream_name(), &request));
        let read = futures_lite::future::or(async { Some(read.await) }, async {
            peer_gone(stream, arrived).await;
            None
        })
        .await;
        // The peer left: the response (and the read waiting under it) is dropped now, not at
        // the next keep-alive.
        let Some(read) = read else {
            return Err(std::io::ErrorKind::ConnectionAborted.into());
        };
        live.answer(read.as_ref());
        may_park = parkable;
    }
}

/// Writes `bytes` and flushes them (TLS writes its records then).
async fn send<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8]) -> std::io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}

/// The chunk that ends a chunked body (RFC 9112, 7.1).
pub(super) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Chunks that are ready at once are written together up to about this many bytes.
const COALESCED_CHUNKS_BYTES_MAX: usize = 64 * 1024;

/// `chunk` framed as one chunk of a chunked body; nothing for an empty one, whose frame would
/// end the body.
pub(super) fn push_chunk(out: &mut Vec<u8>, chunk: &[u8]) {
    use std::io::Write;
    if chunk.is_empty() {
        return;
    }
    let _ = write!(out, "{:x}\r\n", chunk.len());
    out.extend_from_slice(chunk);
    out.extend_from_slice(b"\r\n");
}
