//! What both HTTP versions hand the protocols and take back: one [`Request`] with its whole
//! body and one [`Response`] with its [`Body`], plus the two helpers both connection loops
//! share. `http1` and `http2` both build on this file, so neither needs the other's types.

use std::future::Future;

use bytes::{Bytes, BytesMut};

use crate::limits::{BodyBudget, BodyReservation};
pub use crate::live_response::{LiveBody, LiveEvents};

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

/// A response's body, in the form it was produced in.
pub enum Body {
    /// One buffer; empty when the response has no body.
    Full(Bytes),
    /// These buffers back to back (at least two, none empty): a read is served from the
    /// stored records' own buffers instead of a joined copy.
    Parts(Vec<Bytes>),
    /// A live response's events, sent while they are produced, with chunked transfer encoding
    /// (HTTP/1.1) or DATA frames (HTTP/2), until it ends.
    Live(LiveBody),
}

impl Body {
    /// No body.
    pub const fn empty() -> Body {
        Body::Full(Bytes::new())
    }
}

/// A response header's value: most are constants (the CORS and content-type headers of every
/// answer), which a response then carries without allocating.
pub type HeaderValue = std::borrow::Cow<'static, str>;

/// The `Access-Control-Allow-Origin` value for `origin`, borrowed when it is `*` (most answers).
pub fn allow_origin(origin: &str) -> HeaderValue {
    match origin {
        "*" => HeaderValue::Borrowed("*"),
        origin => HeaderValue::Owned(origin.to_owned()),
    }
}

/// A response; `head_only` drops the body on the wire but keeps its length (HEAD).
pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, HeaderValue)>,
    pub body: Body,
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body = match &self.body {
            Body::Full(bytes) => format!("{bytes:?}"),
            Body::Parts(parts) => format!("{} parts", parts.len()),
            Body::Live(_) => "live events".to_string(),
        };
        f.debug_struct("Response")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("body", &body)
            .finish()
    }
}

/// Headers a response has room for from the start: a Durable Streams answer carries six to
/// eight (its own and the four CORS headers), which grown from empty would take three
/// allocations.
const RESPONSE_HEADERS_RESERVED: usize = 8;

impl Response {
    pub fn new(status: u16) -> Response {
        Response {
            status,
            headers: Vec::with_capacity(RESPONSE_HEADERS_RESERVED),
            body: Body::empty(),
        }
    }

    /// The body as several buffers (see [`Body::Parts`]); one buffer or none is a plain body.
    pub fn with_parts(mut self, mut parts: Vec<Bytes>) -> Response {
        parts.retain(|p| !p.is_empty());
        self.body = match parts.len() {
            0 => Body::empty(),
            1 => Body::Full(parts.pop().unwrap_or_default()),
            _ => Body::Parts(parts),
        };
        self
    }

    /// Bytes of the body, whichever form it has (an event stream's are not known: 0).
    pub fn body_len(&self) -> usize {
        match &self.body {
            Body::Full(bytes) => bytes.len(),
            Body::Parts(parts) => parts.iter().map(Bytes::len).sum(),
            Body::Live(_) => 0,
        }
    }

    /// The body as one buffer, if it is one (tests read answers with it).
    #[cfg(test)]
    pub fn full_body(&self) -> Option<&Bytes> {
        match &self.body {
            Body::Full(bytes) => Some(bytes),
            _ => None,
        }
    }

    /// Drops the body (a `304`, or a redirect's).
    pub fn clear_body(&mut self) {
        self.body = Body::empty();
    }

    /// The live events, if the body is made of them; the body is then empty.
    pub fn take_live(&mut self) -> Option<LiveBody> {
        match std::mem::replace(&mut self.body, Body::empty()) {
            Body::Live(live) => Some(live),
            other => {
                self.body = other;
                None
            }
        }
    }

    /// The body's buffers ready for the socket: small neighbours joined into buffers of up to
    /// [`WRITE_COALESCE_BYTES`] (fewer writes and frames), large ones passed through as they are.
    /// An event stream is left in place (it has no buffers yet).
    pub fn take_body_buffers(&mut self) -> Vec<Bytes> {
        let parts = match std::mem::replace(&mut self.body, Body::empty()) {
            Body::Full(bytes) if bytes.is_empty() => return Vec::new(),
            Body::Full(bytes) => return vec![bytes],
            Body::Parts(parts) => parts,
            live @ Body::Live(_) => {
                self.body = live;
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        let mut pending = BytesMut::new();
        for part in parts {
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

    pub fn with_live(mut self, live: LiveBody) -> Response {
        self.body = Body::Live(live);
        self
    }

    /// A `200` SSE response of `live`'s events, both protocols: `text/event-stream`, not to be
    /// cached, and not buffered by a proxy (`x-accel-buffering`).
    pub fn event_stream(live: LiveBody) -> Response {
        Response::new(200)
            .header("content-type", pico_proto::media::EVENT_STREAM)
            .header("cache-control", "no-cache")
            .header("x-accel-buffering", "no")
            .with_live(live)
    }

    pub fn header(mut self, name: &'static str, value: impl Into<HeaderValue>) -> Response {
        self.headers.push((name, value.into()));
        self
    }

    pub fn with_body(mut self, body: impl Into<Bytes>) -> Response {
        self.body = Body::Full(body.into());
        self
    }
}

/// Whether `value` is a `Host` (or `:authority`) this server takes: `uri-host [ ":" port ]`
/// (RFC 9110 §7.2, RFC 3986 §3.2.2): an IPv6 literal in brackets, or a name or IPv4 address
/// of unreserved, percent-encoded and sub-delimiter characters, then at most five port digits.
/// Nothing that would change a URL built from it (`/`, `?`, `#`, `@`, white space, controls).
pub(crate) fn valid_authority(value: &[u8]) -> bool {
    let (host, port) = match value.iter().rposition(|&b| b == b':') {
        // A colon inside an IPv6 literal is not the port's.
        Some(at) if !value[at..].contains(&b']') => (&value[..at], &value[at + 1..]),
        _ => (value, &[][..]),
    };
    if port.len() > 5 || !port.iter().all(u8::is_ascii_digit) {
        return false;
    }
    if let Some(literal) = host.strip_prefix(b"[") {
        return literal
            .strip_suffix(b"]")
            .and_then(|ip| std::str::from_utf8(ip).ok())
            .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok());
    }
    // A colon left in the host means two of them (an IPv6 address needs brackets).
    host.iter().all(|&b| HOST_BYTES[usize::from(b)])
}

/// The bytes a host name or IPv4 address may hold, by value: unreserved, percent-encoded and
/// sub-delimiter characters (RFC 3986 §3.2.2). A table, as every request's `Host` is checked.
const HOST_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'%'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
            );
        b += 1;
    }
    table
};

/// A request the connection refused, rendered in the listener's style; a `429` or `503` also
/// says when to retry. Both HTTP versions answer their refusals through this.
pub(crate) fn refusal(on_error: fn(u16, &str) -> Response, status: u16, message: &str) -> Response {
    let mut response = on_error(status, message);
    if status == 429 || status == 503 {
        response.headers.push(("retry-after", "1".into()));
    }
    response
}

/// Holds `response`'s body against the core's budget of unsent answers until the reservation
/// is dropped, once its last byte left for the socket (`crate::limits`); when the budget cannot
/// hold it, the response becomes a `503` with `Retry-After` (its body dropped now) and nothing
/// is held. Only for reads (`GET`): an append's answer is small and must reach its client.
pub(crate) fn hold_answer(
    response: &mut Response,
    budget: &BodyBudget,
    on_error: fn(u16, &str) -> Response,
) -> Option<BodyReservation> {
    let mut held = budget.reservation();
    if !held.grow_to(response.body_len()) {
        *response = answers_over_budget(on_error);
        return None;
    }
    Some(held)
}

/// The `503` of a read refused because unsent answers fill their budget.
pub(crate) fn answers_over_budget(on_error: fn(u16, &str) -> Response) -> Response {
    refusal(on_error, 503, crate::limits::ANSWERS_OVER_BUDGET)
}

/// `io`'s output, or `TimedOut` once `deadline` has passed (never with no deadline). Polled
/// once first: what completes at once (a write the socket takes) arms no timer.
pub(crate) async fn by_deadline<T>(
    deadline: Option<std::time::Instant>,
    io: impl Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    let mut io = std::pin::pin!(io);
    let Some(deadline) = deadline else {
        return io.await;
    };
    if let Some(done) = futures_lite::future::poll_once(&mut io).await {
        return done;
    }
    let rest = deadline.saturating_duration_since(std::time::Instant::now());
    // Boxed: the timer's room is taken only by a write that had to wait.
    Box::pin(within(rest, io))
        .await
        .unwrap_or_else(|| Err(std::io::ErrorKind::TimedOut.into()))
}

/// `future`'s output, or `None` once `limit` has passed.
///
/// Not an `async fn`: one would keep `future` in its own state and again in the block that
/// awaits it, doubling the room of every future wrapped here (every connection waits in one).
pub(crate) fn within<T>(
    limit: std::time::Duration,
    future: impl Future<Output = T>,
) -> impl Future<Output = Option<T>> {
    futures_lite::future::or(SomeOf { future }, async move {
        glommio::timer::sleep(limit).await;
        None
    })
}

pin_project_lite::pin_project! {
    /// A future's output in `Some`. A struct, as `async move { Some(future.await) }` keeps
    /// room for `future` twice (captured, and moved to be awaited); every connection waits
    /// in one of these.
    pub(crate) struct SomeOf<F> {
        #[pin]
        pub(crate) future: F,
    }
}

impl<F: Future> Future for SomeOf<F> {
    type Output = Option<F::Output>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.project().future.poll(cx).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_holds_unreserved_percent_and_sub_delimiter_bytes_only() {
        let allowed: Vec<u8> = (0..=255u8)
            .filter(|&b| HOST_BYTES[usize::from(b)])
            .collect();
        let mut expected: Vec<u8> = (b'0'..=b'9')
            .chain(b'A'..=b'Z')
            .chain(b'a'..=b'z')
            .collect();
        expected.extend_from_slice(b"-._~%!$&'()*+,;=");
        expected.sort_unstable();
        assert_eq!(allowed, expected);
        for good in [
            &b"example.com"[..],
            b"127.0.0.1:8080",
            b"[::1]:443",
            b"a",
            b"x_y~z:1",
        ] {
            assert!(valid_authority(good), "{}", String::from_utf8_lossy(good));
        }
        for bad in [
            &b"a/b"[..],
            b"a b",
            b"a@b",
            b"a:b:c",
            b"a:123456",
            b"\xc3\xa9",
            b"a?",
            b"[::1",
        ] {
            assert!(!valid_authority(bad), "{}", String::from_utf8_lossy(bad));
        }
    }

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
        let body = single.full_body().expect("one buffer is the body itself");
        assert_eq!(body.as_ptr(), large.as_ptr());
    }
}
