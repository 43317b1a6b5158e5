//! Writing one HTTP/1.1 response: status line and headers, then a sized body in as few
//! writes as the socket takes, or a live response's events as chunks (HTTP/1.1's part of
//! driving it, `transport/drive.rs`).

use std::io::IoSlice;

use bytes::{Bytes, BytesMut};
use futures_lite::{AsyncWrite, AsyncWriteExt};

use super::read::peer_gone;
use crate::transport::drive::{EventFrames, EventWriter};
use crate::transport::message::{LiveBody, Response};
use crate::transport::socket::Socket;

/// The status line's reason phrase (clients ignore it; RFC 9112 lets it be anything).
pub(super) fn reason(status: u16) -> &'static str {
    http::StatusCode::from_u16(status)
        .ok()
        .and_then(|status| status.canonical_reason())
        .unwrap_or("Status")
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend(digits[at..].iter().map(|&d| char::from(d)));
}

/// Sends `response`; for a live response only its head, and hands the events back
/// (`Ok(Some(events))`) for the caller to drive (`transport/drive.rs`). Written apart, the
/// stream does not keep this future and the request's alive for as long as it lives: an SSE
/// subscriber would hold 1.2 KiB of them (docs/decisions/2026-12-small-connection-futures.md).
pub(super) async fn write_response<S: AsyncWrite + Unpin>(
    stream: &mut S,
    mut response: Response,
    head_only: bool,
    keep_alive: bool,
) -> std::io::Result<Option<LiveBody>> {
    // Pushed piece by piece: `write!` costs more per header than the copy (2 % of a small
    // append's CPU).
    let mut head = String::with_capacity(512);
    head.push_str("HTTP/1.1 ");
    push_decimal(&mut head, u64::from(response.status));
    head.push(' ');
    head.push_str(reason(response.status));
    head.push_str("\r\n");
    for (name, value) in &response.headers {
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
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
        head.push_str("content-length: ");
        push_decimal(&mut head, body_len as u64);
        head.push_str("\r\n");
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

/// A live response's events as chunks of a chunked body, staged for one write (HTTP/1.1's
/// [`EventFrames`], plain, TLS and parked alike).
#[derive(Default)]
pub(super) struct Chunks(pub Vec<u8>);

impl EventFrames for Chunks {
    fn stage(&mut self, event: Bytes) {
        push_chunk(&mut self.0, &event);
    }

    fn staged(&self) -> usize {
        self.0.len()
    }
}

/// A live response on an HTTP/1.1 connection's task ([`drive`]'s writer): its events are
/// written as chunks, flushed after each write so they reach the client at once; while it
/// waits for its next read, what the peer sends is kept in `arrived` (a pipelined request),
/// and the peer closing ends the response at once.
pub(super) struct ChunkedWriter<'a, S> {
    pub stream: &'a mut S,
    pub arrived: &'a mut BytesMut,
    /// Staged chunks; their room is given back after each write (a subscriber waiting on a
    /// TLS connection keeps no buffer between events).
    pub chunks: Chunks,
}

impl<S> EventFrames for ChunkedWriter<'_, S> {
    fn stage(&mut self, event: Bytes) {
        self.chunks.stage(event);
    }

    fn staged(&self) -> usize {
        self.chunks.staged()
    }
}

impl<S: Socket> EventWriter for ChunkedWriter<'_, S> {
    async fn send(&mut self) -> std::io::Result<()> {
        let chunks = std::mem::take(&mut self.chunks.0);
        send(self.stream, &chunks).await
    }

    async fn end(&mut self) -> std::io::Result<()> {
        send(self.stream, LAST_CHUNK).await
    }

    async fn peer_gone(&mut self) {
        peer_gone(self.stream, self.arrived).await;
    }

    fn quiet(&self) -> bool {
        self.arrived.is_empty()
    }

    fn unsent(&self) -> usize {
        self.stream.unsent_bytes()
    }
}

/// Writes `bytes` and flushes them (TLS writes its records then).
async fn send<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8]) -> std::io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}

/// The chunk that ends a chunked body (RFC 9112, 7.1).
pub(super) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

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
