//! Writing one HTTP/1.1 response: status line and headers, then a sized body in as few
//! writes as the socket takes, or an event stream as chunks until it ends or the peer leaves.

use std::io::IoSlice;

use bytes::BytesMut;
use futures_lite::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::read::peer_gone;
use crate::transport::message::{BodyStream, Response};

/// The status line's reason phrase (clients ignore it; RFC 9112 lets it be anything).
pub(super) fn reason(status: u16) -> &'static str {
    http::StatusCode::from_u16(status)
        .ok()
        .and_then(|status| status.canonical_reason())
        .unwrap_or("Status")
}

/// Sends `response`; for an event stream only its head, and hands the events back
/// (`Ok(Some(events))`) for the caller to send with [`write_chunked`]. Written apart, the
/// stream does not keep this future and the request's alive for as long as it lives: an SSE
/// subscriber held 1.2 KiB of them (BENCHMARKS.md, "SSE subscribers hold less").
pub(super) async fn write_response<S: AsyncWrite + Unpin>(
    stream: &mut S,
    mut response: Response,
    head_only: bool,
    keep_alive: bool,
) -> std::io::Result<Option<BodyStream>> {
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
    if let Some(body) = response.take_stream() {
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

/// Sends each item of `body` as one chunk, flushing after each write so events reach the client
/// at once; a write error (the client went away) ends the stream. While the stream waits for
/// its next event, what the peer sends is kept in `arrived` (a pipelined request), and the
/// peer closing ends the stream at once. Items that are ready together go out in one write:
/// an SSE data event and the control event behind it are one `send` and one TCP segment
/// instead of two, and the client is woken once (10,000 subscribers on one stream pay this per
/// record; BENCHMARKS.md, "Fan-out").
pub(super) async fn write_chunked<S: AsyncRead + AsyncWrite + Unpin>(
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
        let mut out = Vec::with_capacity(chunk.len() + 16);
        push_chunk(&mut out, &chunk);
        let mut ended = false;
        while out.len() < COALESCED_CHUNKS_BYTES_MAX {
            // The stream keeps a read it started here (an unfold holds its future), so a
            // `Pending` loses nothing.
            match futures_lite::future::poll_once(body.next()).await {
                Some(Some(chunk)) => push_chunk(&mut out, &chunk),
                Some(None) => {
                    ended = true;
                    break;
                }
                None => break,
            }
        }
        if ended {
            out.extend_from_slice(LAST_CHUNK);
        }
        if !out.is_empty() {
            stream.write_all(&out).await?;
            stream.flush().await?;
        }
        if ended {
            return Ok(());
        }
    }
    stream.write_all(LAST_CHUNK).await?;
    stream.flush().await
}

/// The chunk that ends a chunked body (RFC 9112, 7.1).
const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Chunks that are ready at once are written together up to about this many bytes.
const COALESCED_CHUNKS_BYTES_MAX: usize = 64 * 1024;

/// `chunk` framed as one chunk of a chunked body; nothing for an empty one, whose frame would
/// end the body.
fn push_chunk(out: &mut Vec<u8>, chunk: &[u8]) {
    use std::io::Write;
    if chunk.is_empty() {
        return;
    }
    let _ = write!(out, "{:x}\r\n", chunk.len());
    out.extend_from_slice(chunk);
    out.extend_from_slice(b"\r\n");
}
