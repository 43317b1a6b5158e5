//! HTTP/2 on a connection that opened with the h2 preface (cleartext, prior knowledge), served
//! by `h2` over the glommio socket ([`TokioIo`] bridges the I/O traits, vectored writes
//! included).
//!
//! Each request runs in its own task; the connection task keeps polling `accept`, which drives
//! the socket for all of them. Request bodies are counted against the core's body budget
//! (`crate::limits`) as their DATA frames arrive, and only then is the flow-control window
//! opened again for them: past the budget a request gets `429` instead of more window.
//! Response bodies are sent as the peer grants capacity. A connection idle for the request
//! timeout gets a GOAWAY.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_lite::{AsyncRead, AsyncWrite};
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};

use crate::limits::{BodyReservation, ConnectionLimits};
use crate::limits::{
    H2_CONCURRENT_STREAMS_MAX, H2_CONNECTION_WINDOW_BYTES, H2_FRAME_BYTES_MAX,
    H2_HEADER_LIST_BYTES_MAX, H2_SEND_BUFFER_BYTES, H2_STREAM_WINDOW_BYTES,
};
use crate::shutdown::CoreShutdown;
use crate::transport::drive::{drive, EventFrames, EventWriter};
use crate::transport::message::{
    answers_over_budget, hold_answer, valid_authority, Body, Request, Response,
};
use crate::transport::socket::{Socket, TokioIo};

/// The client connection preface that starts every HTTP/2 connection.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

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

    fn set_send_stall_timeout(&self, timeout: Duration) {
        self.inner.set_send_stall_timeout(timeout)
    }

    fn unsent_bytes(&self) -> usize {
        self.inner.unsent_bytes()
    }

    fn poll_read_buf(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = buf.remaining().min(self.prefix.len());
            buf.put_slice(&self.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        self.inner.poll_read_buf(cx, buf)
    }
}

/// Serves HTTP/2 on `stream` until the peer goes away, or until it was idle (no request in
/// progress or started) for `limits.request_timeout`: then a GOAWAY closes it.
pub async fn serve_connection<S, H, F>(
    stream: S,
    limits: ConnectionLimits,
    handle: Rc<H>,
    on_error: fn(u16, &str) -> Response,
    stop: CoreShutdown,
) where
    S: Socket,
    H: Fn(Request) -> F + 'static,
    F: Future<Output = Response> + 'static,
{
    let handshake = h2::server::Builder::new()
        .max_concurrent_streams(H2_CONCURRENT_STREAMS_MAX)
        .initial_window_size(H2_STREAM_WINDOW_BYTES)
        .initial_connection_window_size(H2_CONNECTION_WINDOW_BYTES)
        .max_header_list_size(H2_HEADER_LIST_BYTES_MAX)
        .max_frame_size(H2_FRAME_BYTES_MAX)
        .max_send_buffer_size(H2_SEND_BUFFER_BYTES)
        .handshake::<_, Bytes>(TokioIo::new(stream));
    let connection = crate::transport::message::within(limits.request_timeout, handshake).await;
    let mut connection = match connection {
        Some(Ok(connection)) => connection,
        Some(Err(e)) => {
            log::debug!("h2 handshake failed: {e}");
            return;
        }
        None => return,
    };
    let activity = Rc::new(Activity {
        open: Cell::new(0),
        last: Cell::new(Instant::now()),
        waiting: Cell::new(0),
        progress_at: Cell::new(Instant::now()),
    });
    let stall = limits.send_stall_timeout;
    // One timer per timeout period, not one per request: it is re-armed when it fires and the
    // connection turns out neither idle nor stalled, and when a request starts while it is
    // set further than a stall timeout away (to look for a stall in time).
    let mut timer_at = Instant::now() + limits.request_timeout;
    let mut idle = Box::pin(glommio::timer::sleep(limits.request_timeout));
    loop {
        let next = stop
            .unless_stopped(futures_lite::future::or(
                async { Some(connection.accept().await) },
                async {
                    idle.as_mut().await;
                    None
                },
            ))
            .await;
        let accepted = match next {
            Some(Some(Some(accepted))) => accepted,
            // The peer closed the connection.
            Some(Some(None)) => return,
            // Answers wait for window (or for the socket) and none got any for the send stall
            // timeout: the peer stopped reading. The connection closes at once (no GOAWAY: it
            // would not be read either), and its requests with it.
            Some(None) if activity.stalled(stall) => {
                log::debug!("h2 connection closed: no send progress for {stall:?}");
                return;
            }
            // The timer fired: with requests in progress, or one ended within the timeout,
            // the connection is not idle; look again when it could be, or could be stalled.
            Some(None) if Instant::now() < activity.idle_at(limits.request_timeout) => {
                timer_at = activity
                    .idle_at(limits.request_timeout)
                    .min(activity.stall_check_at(stall));
                idle = Box::pin(glommio::timer::sleep(
                    timer_at.saturating_duration_since(Instant::now()),
                ));
                continue;
            }
            // Idle past the timeout, or the node is stopping: GOAWAY, then let the requests
            // in progress finish (bounded, so a peer that stopped reading cannot hold it).
            Some(None) | None => {
                connection.graceful_shutdown();
                let drain = async {
                    while let Some(Ok((request, respond))) = connection.accept().await {
                        spawn_request(request, respond, &activity, &limits, &handle, on_error);
                    }
                };
                crate::transport::message::within(DRAIN_TIMEOUT, drain).await;
                return;
            }
        };
        match accepted {
            Ok((request, respond)) => {
                spawn_request(request, respond, &activity, &limits, &handle, on_error);
                // Its answer may come to wait for window: look for a stall half a stall
                // timeout from now, unless the timer fires sooner anyway.
                let soon = Instant::now() + stall / 2;
                if timer_at > soon + stall / 2 {
                    timer_at = soon;
                    idle = Box::pin(glommio::timer::sleep(stall / 2));
                }
            }
            Err(e) => {
                log::debug!("h2 connection ended: {e}");
                return;
            }
        }
    }
}

/// Runs one request in a task of its own, counted in `activity` while it lasts.
fn spawn_request<H, F>(
    request: http::Request<RecvStream>,
    respond: SendResponse<Bytes>,
    activity: &Rc<Activity>,
    limits: &ConnectionLimits,
    handle: &Rc<H>,
    on_error: fn(u16, &str) -> Response,
) where
    H: Fn(Request) -> F + 'static,
    F: Future<Output = Response> + 'static,
{
    let in_progress = InProgress::start(activity);
    let (handle, limits) = (handle.clone(), limits.clone());
    glommio::spawn_local(async move {
        // A request's future is large (its handler reaches into the engine: ~13 KiB), and a
        // spawn moves its future several times; so the task starts small and puts the
        // request's future on the heap once, when it first runs.
        // A panic ends this request only (its stream is reset): see `crate::panics`.
        let serve = Box::pin(crate::panics::catch_panic(serve_request(
            request,
            respond,
            &in_progress.0,
            &limits,
            handle.as_ref(),
            on_error,
        )));
        serve.await
    })
    .detach();
}

/// Longest a connection's requests may take to finish after its GOAWAY.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Requests in progress on a connection, and when one last started or ended; answers waiting
/// to be sent, and when one last could send.
struct Activity {
    open: Cell<usize>,
    last: Cell<Instant>,
    /// Answers waiting for flow-control window (or for `h2`'s buffer to drain to the socket).
    waiting: Cell<usize>,
    /// When an answer last got capacity while one waited, or the first of them started waiting.
    progress_at: Cell<Instant>,
}

impl Activity {
    /// Whether answers wait and none could send anything for `stall`.
    fn stalled(&self, stall: Duration) -> bool {
        self.waiting.get() > 0 && self.progress_at.get().elapsed() >= stall
    }

    /// When to look for a stall next: when the waiting answers would have waited `stall`;
    /// while none waits but requests are in progress, half a `stall` from now (a wait that
    /// starts meanwhile is seen within one and a half); with none in progress, never (a
    /// request that starts re-arms the timer).
    fn stall_check_at(&self, stall: Duration) -> Instant {
        if self.waiting.get() > 0 {
            self.progress_at.get() + stall
        } else if self.open.get() > 0 {
            Instant::now() + stall / 2
        } else {
            Instant::now() + Duration::from_secs(24 * 3600)
        }
    }

    /// The earliest instant the connection could have been idle for `timeout`: never while a
    /// request is in progress (so a timeout from now), else a timeout after the last one.
    fn idle_at(&self, timeout: Duration) -> Instant {
        if self.open.get() > 0 {
            Instant::now() + timeout
        } else {
            self.last.get() + timeout
        }
    }
}

/// One answer waiting to send, counted in [`Activity`] until dropped.
struct Waiting<'a>(&'a Activity);

impl<'a> Waiting<'a> {
    fn start(activity: &'a Activity) -> Waiting<'a> {
        if activity.waiting.get() == 0 {
            activity.progress_at.set(Instant::now());
        }
        activity.waiting.set(activity.waiting.get() + 1);
        Waiting(activity)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.set(self.0.waiting.get().saturating_sub(1));
    }
}

/// One request counted in [`Activity`] until dropped (also when its task panics).
struct InProgress(Rc<Activity>);

impl InProgress {
    fn start(activity: &Rc<Activity>) -> InProgress {
        activity.open.set(activity.open.get() + 1);
        activity.last.set(Instant::now());
        InProgress(activity.clone())
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.open.set(self.0.open.get().saturating_sub(1));
        self.0.last.set(Instant::now());
    }
}

/// Reads one request (within the request timeout), answers it, sends the answer. A `GET` or
/// `HEAD` the client resets is dropped at once, so a cancelled long-poll or SSE read leaves
/// no waiter behind; other requests run to their end (an append is never cut in half).
async fn serve_request<H, F>(
    request: http::Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    activity: &Activity,
    limits: &ConnectionLimits,
    handle: &H,
    on_error: fn(u16, &str) -> Response,
) where
    H: Fn(Request) -> F,
    F: Future<Output = Response>,
{
    let head_only = request.method() == http::Method::HEAD;
    let is_get = request.method() == http::Method::GET;
    let cancellable = head_only || is_get;
    // `answer` is called in each branch, not held in a variable across them: a future kept
    // in a local and then moved into another is stored twice in this one's state.
    let mut response = if is_get && limits.answers.is_full() {
        // Answers already built fill the budget: this one is not even built.
        answers_over_budget(on_error)
    } else if cancellable {
        let reset = std::future::poll_fn(|cx| respond.poll_reset(cx));
        let raced = futures_lite::future::or(
            async { Some(answer(request, limits, handle, on_error).await) },
            async {
                let _ = reset.await;
                None
            },
        )
        .await;
        match raced {
            Some(response) => response,
            None => return,
        }
    } else {
        answer(request, limits, handle, on_error).await
    };
    // A read's answer counts against the core's budget until it is handed to `h2` whole
    // (which buffers at most `H2_SEND_BUFFER_BYTES` of it ahead of the socket). A connection
    // may hold many, as a client multiplexing large reads does; the budget bounds them all,
    // and the send stall timeout closes a connection whose answers get no window.
    let _answer_held = if is_get {
        hold_answer(&mut response, &limits.answers, on_error)
    } else {
        None
    };
    if let Err(e) = send_response(respond, response, head_only, activity).await {
        log::debug!("h2 response not delivered: {e}");
    }
}

/// Receives the request and runs its handler; the body's share of the budget is held until
/// the handler is done with it.
async fn answer<H, F>(
    request: http::Request<RecvStream>,
    limits: &ConnectionLimits,
    handle: &H,
    on_error: fn(u16, &str) -> Response,
) -> Response
where
    H: Fn(Request) -> F,
    F: Future<Output = Response>,
{
    let (request, body_held) = match receive(request, limits).await {
        Ok(read) => read,
        Err(refused) => return refused.into_response(on_error),
    };
    let response = handle(request).await;
    drop(body_held);
    response
}

/// Why a request was not received: a refusal, or the request timeout.
enum NotReceived {
    Refused(u16, String),
    TimedOut,
}

impl NotReceived {
    fn into_response(self, on_error: fn(u16, &str) -> Response) -> Response {
        match self {
            NotReceived::Refused(status, message) => {
                crate::transport::message::refusal(on_error, status, &message)
            }
            NotReceived::TimedOut => on_error(408, "request not received in time"),
        }
    }
}

/// [`read_request`] within the request timeout. Most requests arrive whole (HEADERS and DATA
/// together): only one still arriving after its first poll needs a timer. Its own function so
/// the reading state is gone before the handler runs (the request's task stays small).
async fn receive(
    request: http::Request<RecvStream>,
    limits: &ConnectionLimits,
) -> Result<(Request, BodyReservation), NotReceived> {
    let mut read = std::pin::pin!(read_request(request, limits));
    let read = match futures_lite::future::poll_once(&mut read).await {
        Some(read) => read,
        None => crate::transport::message::within(limits.request_timeout, read)
            .await
            .ok_or(NotReceived::TimedOut)?,
    };
    read.map_err(|(status, message)| NotReceived::Refused(status, message))
}

/// A request DATA frame smaller than this is copied out of the connection's read buffer
/// (see `read_request`), into buffers of [`SMALL_FRAMES_BUFFER_BYTES`].
const SMALL_FRAME_BYTES: usize = 4 * 1024;
const SMALL_FRAMES_BUFFER_BYTES: usize = 16 * 1024;

async fn read_request(
    request: http::Request<RecvStream>,
    limits: &ConnectionLimits,
) -> Result<(Request, BodyReservation), (u16, String)> {
    let max_body_size = limits.max_body_size;
    let (parts, mut body) = request.into_parts();
    let path = match parts.uri.path() {
        "" => "/",
        path => path,
    };
    // `:path` may be `*` (or an authority, for CONNECT): never a stream name.
    if !path.starts_with('/') {
        return Err((400, format!("request target must be a path: {path}")));
    }
    let too_large = || (413, format!("body larger than {max_body_size} bytes"));
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|l| l > max_body_size) {
        return Err(too_large());
    }
    let mut held = limits.bodies.reservation();
    // The DATA frames as received, joined once at the end: no buffer sized by a declared
    // length (a promise, not bytes) and no copies while growing one. Small frames are copied
    // into buffers of their own as they arrive: a frame's `Bytes` keeps the whole connection
    // read buffer it was cut from alive, so keeping many tiny frames (a client pacing a body one
    // byte per frame) would cost far more memory than the bytes the budget counts.
    let mut frames: Vec<Bytes> = Vec::new();
    let mut small = BytesMut::new();
    let mut total = 0usize;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| (400, format!("request body: {e}")))?;
        total += chunk.len();
        if total > max_body_size {
            return Err(too_large());
        }
        if !held.grow_to(total) {
            return Err((429, crate::limits::BODIES_OVER_BUDGET.into()));
        }
        // The window opens again only for bytes this core's budget holds: a client cannot
        // make the server buffer more than the budget, however many streams it opens.
        let _ = body.flow_control().release_capacity(chunk.len());
        if chunk.len() >= SMALL_FRAME_BYTES {
            if !small.is_empty() {
                frames.push(small.split().freeze());
            }
            frames.push(chunk);
            continue;
        }
        if small.is_empty() {
            small.reserve(SMALL_FRAMES_BUFFER_BYTES);
        }
        small.extend_from_slice(&chunk);
        if small.len() + SMALL_FRAME_BYTES > SMALL_FRAMES_BUFFER_BYTES {
            frames.push(small.split().freeze());
        }
    }
    if !small.is_empty() {
        frames.push(small.freeze());
    }
    // A body that arrives in one DATA frame is kept as is (no copy).
    let body = match frames.len() {
        0 => Bytes::new(),
        1 => frames.pop().unwrap_or_default(),
        _ => {
            let mut joined = BytesMut::with_capacity(total);
            for frame in frames {
                joined.extend_from_slice(&frame);
            }
            joined.freeze()
        }
    };
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
    // The host names the server in URLs built from it (Durable Streams' `Location`): one, and
    // a valid authority, as over HTTP/1.1.
    let mut hosts = headers.iter().filter(|(name, _)| name == "host");
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err((400, "more than one Host header".into()));
    }
    let authority = parts.uri.authority().map(|a| a.as_str().as_bytes());
    for value in [host.map(|(_, v)| &v[..]), authority].into_iter().flatten() {
        if !valid_authority(value) {
            let value = String::from_utf8_lossy(value);
            return Err((400, format!("invalid Host: {value}")));
        }
    }
    // HTTP/2 carries the host in `:authority`; handlers read `host` for both versions.
    if let Some(authority) = parts.uri.authority() {
        if !headers.iter().any(|(name, _)| name == "host") {
            headers.push((
                "host".to_string(),
                Bytes::copy_from_slice(authority.as_str().as_bytes()),
            ));
        }
    }
    Ok((
        Request {
            method: parts.method.as_str().to_string(),
            path: path.to_string(),
            query: parts.uri.query().unwrap_or("").to_string(),
            headers,
            body,
        },
        held,
    ))
}

async fn send_response(
    mut respond: SendResponse<Bytes>,
    mut response: Response,
    head_only: bool,
    activity: &Activity,
) -> Result<(), h2::Error> {
    let mut builder = http::Response::builder().status(response.status);
    for (name, value) in &response.headers {
        builder = builder.header(*name, value.as_ref());
    }
    let no_body = head_only || response.status == 204 || response.status == 304;
    let body_len = response.body_len();
    let streamed = matches!(response.body, Body::Live(_));
    if !no_body && !streamed {
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
    if no_body || (!streamed && body_len == 0) {
        respond.send_response(head, true)?;
        return Ok(());
    }
    let mut send = respond.send_response(head, false)?;
    if let Some(mut live) = response.take_live() {
        let mut writer = DataFrames {
            send: &mut send,
            activity,
            staged: Vec::new(),
            staged_bytes: 0,
            failed: None,
        };
        return match drive(&mut live, &mut writer, false, false).await {
            Ok(_) => Ok(()),
            // A stream the peer reset, or a write not done by the response's deadline.
            Err(_) => Err(writer
                .failed
                .take()
                .unwrap_or_else(|| h2::Error::from(h2::Reason::CANCEL))),
        };
    }
    for buffer in response.take_body_buffers() {
        send_data(&mut send, buffer, activity).await?;
    }
    send.send_data(Bytes::new(), true)
}

/// A live response on an HTTP/2 stream ([`drive`]'s writer): each set of ready events goes
/// out as DATA frames as the peer's window allows, the events' own buffers (shared by the
/// core's subscribers) passed as they are; a reset stream ends it.
struct DataFrames<'a> {
    send: &'a mut SendStream<Bytes>,
    activity: &'a Activity,
    staged: Vec<Bytes>,
    staged_bytes: usize,
    /// What `h2` said when a write failed.
    failed: Option<h2::Error>,
}

impl DataFrames<'_> {
    fn sent(&mut self, sent: Result<(), h2::Error>) -> std::io::Result<()> {
        sent.map_err(|e| {
            let error = std::io::Error::other(e.to_string());
            self.failed = Some(e);
            error
        })
    }
}

impl EventFrames for DataFrames<'_> {
    fn stage(&mut self, event: Bytes) {
        if !event.is_empty() {
            self.staged_bytes += event.len();
            self.staged.push(event);
        }
    }

    fn staged(&self) -> usize {
        self.staged_bytes
    }
}

impl EventWriter for DataFrames<'_> {
    async fn send(&mut self) -> std::io::Result<()> {
        self.staged_bytes = 0;
        for event in std::mem::take(&mut self.staged) {
            let sent = send_data(self.send, event, self.activity).await;
            self.sent(sent)?;
        }
        Ok(())
    }

    async fn end(&mut self) -> std::io::Result<()> {
        let sent = self.send.send_data(Bytes::new(), true);
        self.sent(sent)
    }

    async fn peer_gone(&mut self) {
        let _ = std::future::poll_fn(|cx| self.send.poll_reset(cx)).await;
    }

    fn quiet(&self) -> bool {
        // Never parked: the connection's task serves all its streams.
        false
    }
}

/// Sends `data` as the peer's flow-control window allows; while it waits for window, it
/// counts in `activity` as waiting (a connection whose waiting answers get no window for the
/// send stall timeout is closed).
async fn send_data(
    send: &mut SendStream<Bytes>,
    mut data: Bytes,
    activity: &Activity,
) -> Result<(), h2::Error> {
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        let mut waiting = None;
        let granted = std::future::poll_fn(|cx| {
            let granted = send.poll_capacity(cx);
            if granted.is_pending() && waiting.is_none() {
                waiting = Some(Waiting::start(activity));
            }
            granted
        })
        .await;
        let granted = match granted {
            Some(Ok(n)) => n,
            Some(Err(e)) => return Err(e),
            None => return Err(h2::Error::from(h2::Reason::CANCEL)),
        };
        if granted == 0 {
            continue;
        }
        // Any answer that sends is the connection's progress (one waiting for a window of its
        // own does not make the connection stalled while the others go on).
        if activity.waiting.get() > 0 {
            activity.progress_at.set(Instant::now());
        }
        let chunk = data.split_to(granted.min(data.len()));
        send.send_data(chunk, false)?;
    }
    Ok(())
}
