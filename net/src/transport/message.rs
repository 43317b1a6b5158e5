//! What both HTTP versions hand the protocols and take back: one [`Request`] with its whole
//! body and one [`Response`], plus the two helpers both connection loops share. `http1` and
//! `http2` both build on this file, so neither needs the other's types.

use std::future::Future;

use bytes::{Bytes, BytesMut};

/// Small body parts are joined into writes of up to this many bytes.
pub const WRITE_COALESCE_BYTES: usize = 64 * 1024;

/// A parsed request with its whole body.
#[derive(Debug)]
pub struct Request {
    pub method: String,
    /// The path exactly as received, without the query string.
    pub path: String,
    /// The raw query string (without `?`), empty if none.
    pub query: String,
    /// Header names lowercased.
    pub headers: Vec<(String, Bytes)>,
    pub body: Bytes,
}

impl Request {
    /// The first header with this (lowercase) name, as text; empty values count as absent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    }
}

/// A body produced while it is sent (SSE): each item goes out as one chunk, right away.
pub type BodyStream = std::pin::Pin<Box<dyn futures_lite::Stream<Item = Bytes>>>;

/// A response; `head_only` drops the body on the wire but keeps its length (HEAD).
pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Bytes,
    /// When non-empty, the body is these buffers back to back (`body` is then empty): a read
    /// is served from the stored records' own buffers instead of a joined copy.
    pub parts: Vec<Bytes>,
    /// When set, replaces `body`: sent with chunked transfer encoding until it ends.
    pub stream: Option<BodyStream>,
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Response")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("body", &self.body)
            .field("parts", &self.parts.len())
            .field("stream", &self.stream.is_some())
            .finish()
    }
}

impl Response {
    pub fn new(status: u16) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: Bytes::new(),
            parts: Vec::new(),
            stream: None,
        }
    }

    /// The body as several buffers (see [`Response::parts`]).
    pub fn with_parts(mut self, mut parts: Vec<Bytes>) -> Response {
        parts.retain(|p| !p.is_empty());
        match parts.len() {
            0 => self.body = Bytes::new(),
            1 => self.body = parts.pop().unwrap_or_default(),
            _ => {
                self.body = Bytes::new();
                self.parts = parts;
            }
        }
        self
    }

    /// Bytes of the body, whichever form it has.
    pub fn body_len(&self) -> usize {
        if self.parts.is_empty() {
            self.body.len()
        } else {
            self.parts.iter().map(Bytes::len).sum()
        }
    }

    /// Drops the body (a `304`, or a `HEAD`).
    pub fn clear_body(&mut self) {
        self.body = Bytes::new();
        self.parts.clear();
    }

    /// The body's buffers ready for the socket: small neighbours joined into buffers of up to
    /// [`WRITE_COALESCE_BYTES`] (fewer writes and frames), large ones passed through as they are.
    pub fn take_body_buffers(&mut self) -> Vec<Bytes> {
        if self.parts.is_empty() {
            return if self.body.is_empty() {
                Vec::new()
            } else {
                vec![std::mem::take(&mut self.body)]
            };
        }
        let mut out = Vec::new();
        let mut pending = BytesMut::new();
        for part in std::mem::take(&mut self.parts) {
            if part.len() >= WRITE_COALESCE_BYTES / 4 {
                if !pending.is_empty() {
                    out.push(pending.split().freeze());
                }
                out.push(part);
                continue;
            }
            if pending.len() + part.len() > WRITE_COALESCE_BYTES {
                out.push(pending.split().freeze());
            }
            pending.extend_from_slice(&part);
        }
        if !pending.is_empty() {
            out.push(pending.freeze());
        }
        out
    }

    pub fn with_stream(mut self, stream: BodyStream) -> Response {
        self.stream = Some(stream);
        self
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }

    pub fn with_body(mut self, body: impl Into<Bytes>) -> Response {
        self.body = body.into();
        self
    }
}

/// A request the connection refused, rendered in the listener's style; a `429` also says when
/// to retry. Both HTTP versions answer their refusals through this.
pub(crate) fn refusal(on_error: fn(u16, &str) -> Response, status: u16, message: &str) -> Response {
    let mut response = on_error(status, message);
    if status == 429 {
        response.headers.push(("retry-after", "1".into()));
    }
    response
}

/// `future`'s output, or `None` once `limit` has passed.
pub(crate) async fn within<T>(
    limit: std::time::Duration,
    future: impl Future<Output = T>,
) -> Option<T> {
    futures_lite::future::or(async { Some(future.await) }, async {
        glommio::timer::sleep(limit).await;
        None
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_parts_keep_large_buffers_and_join_small_ones() {
        let large = Bytes::from(vec![7u8; WRITE_COALESCE_BYTES]);
        let parts = vec![
            Bytes::from_static(b"["),
            Bytes::from_static(b"1"),
            large.clone(),
            Bytes::from_static(b","),
            Bytes::from_static(b"]"),
        ];
        let mut response = Response::new(200).with_parts(parts);
        assert_eq!(response.body_len(), WRITE_COALESCE_BYTES + 4);
        let buffers = response.take_body_buffers();
        assert_eq!(buffers.len(), 3);
        assert_eq!(&buffers[0][..], b"[1");
        // The large part is the stored buffer itself, not a copy.
        assert_eq!(buffers[1].as_ptr(), large.as_ptr());
        assert_eq!(&buffers[2][..], b",]");
        assert_eq!(response.body_len(), 0);
        let single = Response::new(200).with_parts(vec![Bytes::new(), large.clone()]);
        assert!(single.parts.is_empty(), "one buffer is the body itself");
        assert_eq!(single.body.as_ptr(), large.as_ptr());
    }
}
