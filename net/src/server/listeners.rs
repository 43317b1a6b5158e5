//! The listeners of one core: each accept loop (TLS handshake, connection limit, panics
//! caught per connection) hands its connections to HTTP/1.1 or HTTP/2 with the handler of its
//! protocol: Pico, Durable Streams or the admin API.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_rustls::TlsAcceptor;
use glommio::net::TcpListener;
use pico_engine::CoreHandle;

use crate::admin::metrics::HttpMetrics;
use crate::admin::{self, AdminState};
use crate::auth::CoreTokens;
use crate::config::Protocol;
use crate::ds::{self, DsSettings};
use crate::limits::{
    ConnectionBudget, ConnectionLimits, OpenConnectionSlot, ACCEPT_FAILURE_LOG_INTERVAL_MS,
    ADMIN_BODY_BYTES_MAX, ADMIN_CONNECTIONS_MAX,
};
use crate::pico::{self, PicoSettings};
use crate::shutdown::CoreShutdown;
use crate::transport::message::{within, Request, Response};
use crate::transport::socket::PlainTcp;
use crate::transport::{http1, http2, tls};

/// Core 0's admin listener, with its own small body limit.
pub(super) fn spawn_admin(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: &ConnectionLimits,
    state: Rc<AdminState>,
    http: Arc<HttpMetrics>,
    stop: CoreShutdown,
) {
    let admin_limits = ConnectionLimits {
        max_body_size: ADMIN_BODY_BYTES_MAX,
        // The admin API's answers are its own: readers filling the protocol listeners' budget
        // do not keep the operator from `/metrics`.
        answers: crate::limits::BodyBudget::new(usize::MAX),
        ..limits.clone()
    };
    glommio::spawn_local(async move {
        let handler = Rc::new(move |request| {
            let state = state.clone();
            async move { admin::handle(&state, request).await }
        });
        accept_loop(
            listener,
            tls,
            admin_limits,
            OpenConnections {
                budget: ConnectionBudget::new(ADMIN_CONNECTIONS_MAX),
                metrics: http,
            },
            handler,
            admin::connection_error,
            stop,
        )
        .await
    })
    .detach();
}

/// What one core's data listeners serve with.
pub(super) struct DataServing {
    pub(super) core: Rc<CoreHandle>,
    pub(super) tls: Option<TlsAcceptor>,
    pub(super) tokens: Option<Rc<CoreTokens>>,
    pub(super) settings: Rc<PicoSettings>,
    pub(super) ds_settings: Rc<DsSettings>,
    pub(super) limits: ConnectionLimits,
    pub(super) connections: ConnectionBudget,
    pub(super) http: Arc<HttpMetrics>,
    pub(super) stop: CoreShutdown,
}

/// The accept loop of a data listener: its requests go to `protocol`'s handler and are
/// counted in this core's metrics.
pub(super) fn spawn_data_listener(
    listener: TcpListener,
    protocol: Protocol,
    serving: &DataServing,
) -> glommio::Task<()> {
    let DataServing {
        core,
        tls,
        tokens,
        settings,
        ds_settings,
        limits,
        connections,
        http,
        stop,
    } = serving;
    let (core, tls, tokens) = (core.clone(), tls.clone(), tokens.clone());
    let counted = http.clone();
    match protocol {
        Protocol::Pico => {
            let settings = settings.clone();
            let handler = Rc::new(move |request| {
                let (core, settings, tokens) = (core.clone(), settings.clone(), tokens.clone());
                let counted = counted.clone();
                async move {
                    let response = pico::handle(&core, &settings, tokens.as_deref(), request).await;
                    counted.respond(Protocol::Pico, response)
                }
            });
            glommio::spawn_local(accept_loop(
                listener,
                tls,
                limits.clone(),
                OpenConnections {
                    budget: connections.clone(),
                    metrics: http.clone(),
                },
                handler,
                pico::connection_error,
                stop.clone(),
            ))
        }
        Protocol::DurableStreams => {
            let settings = ds_settings.clone();
            let handler = Rc::new(move |request| {
                let (core, settings, tokens) = (core.clone(), settings.clone(), tokens.clone());
                let counted = counted.clone();
                async move {
                    let response = ds::handle(&core, &settings, tokens.as_deref(), request).await;
                    counted.respond(Protocol::DurableStreams, response)
                }
            });
            glommio::spawn_local(accept_loop(
                listener,
                tls,
                limits.clone(),
                OpenConnections {
                    budget: connections.clone(),
                    metrics: http.clone(),
                },
                handler,
                ds::connection_error,
                stop.clone(),
            ))
        }
    }
}

async fn accept_loop<H, F>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: ConnectionLimits,
    connections: OpenConnections,
    handler: Rc<H>,
    on_error: fn(u16, &str) -> Response,
    stop: CoreShutdown,
) where
    H: Fn(Request) -> F + 'static,
    F: Future<Output = Response> + 'static,
{
    let mut plain = None;
    let accept_failures = pico_meta::LogLimit::new(ACCEPT_FAILURE_LOG_INTERVAL_MS);
    loop {
        let accepted = stop.unless_stopped(listener.accept()).await;
        // Shutdown: the listener closes here; open connections finish on their own.
        let Some(accepted) = accepted else { return };
        let stream = match accepted {
            Ok(stream) => stream,
            Err(e) => {
                // Out of descriptors (`EMFILE`, `ENFILE`) or memory: the connection waits in
                // the backlog; one line per interval, not one per try.
                if let Some(unlogged) = accept_failures.due(std::time::Instant::now()) {
                    log::warn!(
                        "accept failed: {e} ({unlogged} more since the last such line); new \
                         connections wait in the backlog"
                    );
                }
                glommio::timer::sleep(Duration::from_millis(ACCEPT_RETRY_MS)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Some(open) = connections.admit() else {
            glommio::spawn_local(refuse_overloaded(stream)).detach();
            continue;
        };
        // A task per kind of connection, each sized for its own: a plain connection's task
        // carries none of the TLS states (handshake, rustls, HTTP/2 over TLS).
        match &tls {
            None => {
                let serving = plain.get_or_insert_with(|| {
                    Rc::new(PlainServing {
                        limits: limits.clone(),
                        handler: handler.clone(),
                        on_error,
                        stop: stop.clone(),
                    })
                });
                let stream = PlainTcp::new(stream);
                let served = http1::serve_connection(
                    stream,
                    limits.clone(),
                    handler.clone(),
                    on_error,
                    stop.clone(),
                );
                spawn_plain(served, open, serving.clone());
            }
            Some(acceptor) => {
                let (limits, handler, stop) = (limits.clone(), handler.clone(), stop.clone());
                let served = serve_tls(acceptor.clone(), stream, limits, handler, on_error, stop);
                spawn_connection(served, open);
            }
        }
    }
}

/// Runs a connection on its own task; a panic closes it (its socket is dropped) and is
/// logged.
fn spawn_connection(served: impl Future<Output = ()> + 'static, open: OpenConnection) {
    let connection = Connection {
        served: crate::panics::catch_panic(served),
        _open: open,
    };
    glommio::spawn_local(connection).detach();
}

/// What a plain listener's connections are served with, shared: a parked connection keeps a
/// reference to be served again with.
struct PlainServing<H> {
    limits: ConnectionLimits,
    handler: Rc<H>,
    on_error: fn(u16, &str) -> Response,
    stop: CoreShutdown,
}

/// Runs a plain connection on its own task, as [`spawn_connection`]; when its live response
/// waits at the tail, the task ends and the connection is parked with its place in the count
/// (`transport/http1/parked.rs`), to be served again by a new task when it must.
fn spawn_plain<S, H, F>(served: S, open: OpenConnection, serving: Rc<PlainServing<H>>)
where
    S: Future<Output = Option<http1::Parked<PlainTcp>>> + 'static,
    H: Fn(Request) -> F + 'static,
    F: Future<Output = Response> + 'static,
{
    let connection = PlainConnection {
        served: crate::panics::catch_panic(served),
        open: Some(open),
        serving,
    };
    glommio::spawn_local(connection).detach();
}

/// Serves a parked connection again, on a new task.
fn resume_plain<H, F>(
    parked: http1::Parked<PlainTcp>,
    open: OpenConnection,
    serving: Rc<PlainServing<H>>,
) where
    H: Fn(Request) -> F + 'static,
    F: Future<Output = Response> + 'static,
{
    let served = http1::resume_connection(
        parked,
        serving.limits.clone(),
        serving.handler.clone(),
        serving.on_error,
        serving.stop.clone(),
    );
    spawn_plain(served, open, serving);
}

/// Answers a connection past the core's limit with a `503` and closes it.
async fn refuse_overloaded(mut stream: glommio::net::TcpStream) {
    use futures_lite::AsyncWriteExt;
    let body = "{\"error\":\"overloaded\",\"message\":\"too many connections on this core\"}";
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
}

pin_project_lite::pin_project! {
    /// A connection's task: serving it, and its place in the core's count of open
    /// connections. A struct, not an `async` block: a block that awaits a future it captured
    /// keeps room for it twice, and this one is the whole state of every open connection.
    struct Connection<F> {
        #[pin]
        served: F,
        _open: OpenConnection,
    }
}

impl<F: Future> Future for Connection<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.project().served.poll(cx).map(|_| ())
    }
}

pin_project_lite::pin_project! {
    /// A plain connection's task, as [`Connection`], which may end with the connection parked.
    struct PlainConnection<F, H> {
        #[pin]
        served: F,
        open: Option<OpenConnection>,
        serving: Rc<PlainServing<H>>,
    }
}

impl<F, H, R> Future for PlainConnection<F, H>
where
    F: Future<Output = Result<Option<http1::Parked<PlainTcp>>, ()>>,
    H: Fn(Request) -> R + 'static,
    R: Future<Output = Response> + 'static,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        let Poll::Ready(served) = this.served.poll(cx) else {
            return Poll::Pending;
        };
        if let (Ok(Some(parked)), Some(open)) = (served, this.open.take()) {
            let serving = this.serving.clone();
            http1::park(
                parked,
                Box::new(move |parked| resume_plain(parked, open, serving)),
            );
        }
        Poll::Ready(())
    }
}

/// Where a listener counts its open connections: the budget it admits them against, and the
/// core's metrics.
struct OpenConnections {
    budget: ConnectionBudget,
    metrics: Arc<HttpMetrics>,
}

impl OpenConnections {
    /// One more open connection, counted until it drops; `None` when the budget is spent.
    fn admit(&self) -> Option<OpenConnection> {
        let slot = self.budget.open_one()?;
        self.metrics.connections.fetch_add(1, Ordering::Relaxed);
        Some(OpenConnection {
            _slot: slot,
            metrics: self.metrics.clone(),
        })
    }
}

/// One open connection in its core's count and in the metrics, until dropped: when the
/// connection ends, and also when its task is dropped unfinished (the executor stopping).
struct OpenConnection {
    _slot: OpenConnectionSlot,
    metrics: Arc<HttpMetrics>,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.metrics.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How long an accept loop waits after a failed `accept` before it tries again.
const ACCEPT_RETRY_MS: u64 = 10;

/// Completes the TLS handshake (bounded in time), then serves the protocol ALPN chose.
async fn serve_tls<H, F>(
    acceptor: TlsAcceptor,
    stream: glommio::net::TcpStream,
    limits: ConnectionLimits,
    handler: Rc<H>,
    on_error: fn(u16, &str) -> Response,
    stop: CoreShutdown,
) where
    H: Fn(Request) -> F + 'static,
    F: Future<Output = Response> + 'static,
{
    let handshake = acceptor.accept(stream);
    let stream = match within(
        Duration::from_secs(crate::limits::TLS_HANDSHAKE_TIMEOUT_SEC),
        handshake,
    )
    .await
    {
        Some(Ok(stream)) => stream,
        Some(Err(e)) => {
            log::debug!("TLS handshake failed: {e}");
            return;
        }
        None => return,
    };
    let h2 = stream.get_ref().1.alpn_protocol() == Some(tls::ALPN_H2);
    if h2 {
        http2::serve_connection(stream, limits, handler, on_error, stop).await;
    } else {
        http1::serve_connection(stream, limits, handler, on_error, stop).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::panics::CatchPanic;

    type Handler = fn(Request) -> std::future::Ready<Response>;
    type Serve<F> =
        fn(PlainTcp, ConnectionLimits, Rc<Handler>, fn(u16, &str) -> Response, CoreShutdown) -> F;

    /// The sizes of serving a connection and of the task that does it.
    fn sizes<F>(_: Serve<F>) -> (usize, usize) {
        (
            std::mem::size_of::<F>(),
            std::mem::size_of::<Connection<CatchPanic<F>>>(),
        )
    }

    /// Every open plain connection's task holds its serving state once, and no room for
    /// TLS (an `async` block choosing between the two would take 1,512 bytes).
    #[test]
    fn a_connection_task_holds_its_state_once() {
        let serve = http1::serve_connection::<PlainTcp, Handler, std::future::Ready<Response>>;
        let (served, task) = sizes(serve);
        assert!(
            task <= served + 64,
            "a connection's task takes {task} bytes to serve it in {served}"
        );
        assert!(task < 800, "a connection's task takes {task} bytes");
    }
}
