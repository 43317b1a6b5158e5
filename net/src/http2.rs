//! HTTP/2 on a connection that opened with the h2 preface (cleartext, prior knowledge), served
//! by `h2` over the glommio socket ([`TokioIo`] bridges the I/O traits, vectored writes
//! included).
//!
//! Each request runs in its own task; the connection task keeps polling `accept`, which drives
//! the socket for all of them. Request bodies are collected with flow control released as the
//! bytes arrive (or uploads stall at the 64 KiB initial window); response bodies are sent as the
//! peer grants capacity.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_lite::{AsyncRead, AsyncWrite, StreamExt};
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};

use crate::http1::{Request, Response};
use crate::shutdown::CoreShutdown;
use crate::socket::{Socket, TokioIo};

/// The client connection preface that starts every HTTP/2 connection.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Concurrent requests per connection.
pub const MAX_CONCURRENT_STREAMS: u32 = 256;
/// Per-stream receive window: large enough that a big append streams without waiting on
/// WINDOW_UPDATE round trips.
const STREAM_WINDOW_BYTES: u32 = 1 << 20;
const CONNECTION_WINDOW_BYTES: u32 = 8 << 20;
/// Largest DATA frame a client may send (SETTINGS_MAX_FRAME_SIZE; the protocol's default is
/// 16 KiB). A 64 KiB append then arrives as one frame and is kept as received, where 16 KiB
/// frames had to be gathered into a new buffer; clients that honour the setting (h2, hyper,
/// `pico bench`) write 9–13 % more this way (BENCHMARKS.md). Each connection buffers at most
/// one frame of this size while reading it.
const FRAME_BYTES_MAX: u32 = 256 * 1024;
/// Largest accepted header block.
const HEADER_LIST_BYTES_MAX: u32 = 64 * 1024;

/// A socket whose first bytes were already read (while looking for the preface).
pub struct Prefixed<S> {
    prefix: BytesMut,
    inner: S,
}

impl<S> Prefixed<S> {
    pub fn new(prefix: BytesMut, inner: S) -> Prefixed<S> {
        Prefixed { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        if !self.prefix.is_empty() {
            let n = buf.len().min(self.prefix.len());
            buf[..n].copy_from_slice(&self.prefix.split_to(n));
            return Poll::Ready(Ok(n));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_close(cx)
    }
}

impl<S: Socket> Socket for Prefixed<S> {
    fn vectored(&self) -> bool {
        self.inner.vectored()
    }
}

/// Serves HTTP/2 on `stream` until the peer goes away.
pub async fn serve_connection<S, H, F>(
    stream: S,
    max_body_size: usize,
    handle: Rc<H>,
    on_error: fn(u16, &str) -> Response,
    stop: CoreShutdown,
) where
    S: Socket,
    H: Fn(Request) -> F + 'static,
    F: Future<Output = Response> + 'static,
{
    let handshake = h2::server::Builder::new()
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .initial_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_header_list_size(HEADER_LIST_BYTES_MAX)
        .max_frame_size(FRAME_BYTES_MAX)
        .handshake::<_, Bytes>(TokioIo::new(stream));
    let mut connection = match handshake.await {
        Ok(connection) => connection,
        Err(e) => {
            log::debug!("h2 handshake failed: {e}");
            return;
        }
    };
    let mut going_away = false;
    loop {
        // On shutdown: GOAWAY, then keep driving the connection until its streams finish.
        let next = if going_away {
            Some(connection.accept().await)
        } else {
            stop.unless_stopped(connection.accept()).await
        };
        let Some(next) = next else {
            connection.graceful_shutdown();
            going_away = true;
            continue;
        };
        let Some(accepted) = next else { return };
        let (request, respond) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                log::debug!("h2 connection ended: {e}");
                return;
            }
        };
        let handle = handle.clone();
        // A panic ends this request only (its stream is reset): see `crate::panics`.
        glommio::spawn_local(crate::panics::catch_panic(async move {
            let head_only = request.method() == http::Method::HEAD;
            let response = match read_request(request, max_body_size).await {
                Ok(request) => handle(request).await,
                Err((status, message)) => on_error(status, &message),
            };
            if let Err(e) = send_response(respond, response, head_only).await {
                log::debug!("h2 response not delivered: {e}");
            }
        }))
        .detach();
    }
}

async fn read_request(
    request: http::Request<RecvStream>,
    max_body_size: usize,
) -> Result<Request, (u16, String)> {
    let (parts, mut body) = request.into_parts();
    let too_large = || (413, format!("body larger than {max_body_size} bytes"));
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|l| l > max_body_size) {
        return Err(too_large());
    }
    let mut collected = BytesMut::with_capacity(declared.unwrap_or(0));
    let mut single: Option<Bytes> = None;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| (400, format!("request body: {e}")))?;
        let _ = body.flow_control().release_capacity(chunk.len());
        let total = collected.len() + single.as_ref().map_or(0, Bytes::len) + chunk.len();
        if total > max_body_size {
            return Err(too_large());
        }
        // A body that arrives in one DATA frame is kept as is (no copy).
        match single.take() {
            None if collected.is_empty() => single = Some(chunk),
            first => {
                if let Some(first) = first {
                    collected.extend_from_slice(&first);
                }
                collected.extend_from_slice(&chunk);
            }
        }
    }
    let body = single.unwrap_or_else(|| collected.freeze());
    let mut headers: Vec<(String, Bytes)> = parts
        .headers
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_string(),
                Bytes::copy_from_slice(value.as_bytes()),
            )
        })
        .collect();
    // HTTP/2 carries the host in `:authority`; handlers read `host` for both versions.
    if let Some(authority) = parts.uri.authority() {
        if !headers.iter().any(|(name, _)| name == "host") {
            headers.push((
                "host".to_string(),
                Bytes::copy_from_slice(authority.as_str().as_bytes()),
            ));
        }
    }
    let path = match parts.uri.path() {
        "" => "/",
        path => path,
    };
    // `:path` may be `*` (or an authority, for CONNECT): never a stream name.
    if !path.starts_with('/') {
        return Err((400, format!("request target must be a path: {path}")));
    }
    Ok(Request {
        method: parts.method.as_str().to_string(),
        path: path.to_string(),
        query: parts.uri.query().unwrap_or("").to_string(),
        headers,
        body,
    })
}

async fn send_response(
    mut respond: SendResponse<Bytes>,
    mut response: Response,
    head_only: bool,
) -> Result<(), h2::Error> {
    let mut builder = http::Response::builder().status(response.status);
    for (name, value) in &response.headers {
        builder = builder.header(*name, value.as_str());
    }
    let no_body = head_only || response.status == 204 || response.status == 304;
    let body_len = response.body_len();
    if !no_body && response.stream.is_none() {
        builder = builder.header(http::header::CONTENT_LENGTH, body_len);
    }
    let head = match builder.body(()) {
        Ok(head) => head,
        Err(e) => {
            // A header value this server built is not valid HTTP: say so instead of panicking.
            log::error!("h2 response head rejected: {e}");
            let head = http::Response::builder().status(500).body(());
            respond.send_response(head.unwrap_or_default(), true)?;
            return Ok(());
        }
    };
    if no_body || (response.stream.is_none() && body_len == 0) {
        respond.send_response(head, true)?;
        return Ok(());
    }
    let mut send = respond.send_response(head, false)?;
    match response.stream.take() {
        Some(mut events) => {
            while let Some(chunk) = events.next().await {
                send_data(&mut send, chunk).await?;
            }
        }
        None => {
            for buffer in response.take_body_buffers() {
                send_data(&mut send, buffer).await?;
            }
        }
    }
    send.send_data(Bytes::new(), true)
}

/// Sends `data` as the peer's flow-control window allows.
async fn send_data(send: &mut SendStream<Bytes>, mut data: Bytes) -> Result<(), h2::Error> {
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        let granted = std::future::poll_fn(|cx| send.poll_capacity(cx)).await;
        let granted = match granted {
            Some(Ok(n)) => n,
            Some(Err(e)) => return Err(e),
            None => return Err(h2::Error::from(h2::Reason::CANCEL)),
        };
        if granted == 0 {
            continue;
        }
        let chunk = data.split_to(granted.min(data.len()));
        send.send_data(chunk, false)?;
    }
    Ok(())
}
