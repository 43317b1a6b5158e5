//! The listeners of one core: each accept loop (TLS handshake, connection limit, panics
//! caught per connection) hands its connections to HTTP/1.1 or HTTP/2 with the handler of its
//! protocol: Pico, Durable Streams or the admin API.

use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_rustls::TlsAcceptor;
use glommio::net::TcpListener;
use pico_engine::CoreHandle;

use crate::admin::metrics::HttpMetrics;
use crate::admin::{self, AdminState};
use crate::auth::CoreTokens;
use crate::config::Protocol;
use crate::ds::{self, DsSettings};
use crate::limits::{ConnectionLimits, ADMIN_BODY_BYTES_MAX, CONNECTIONS_PER_CORE_MAX};
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
            handler,
            admin::connection_error,
            http,
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
                handler,
                pico::connection_error,
                http.clone(),
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
                handler,
                ds::connection_error,
                http.clone(),
                stop.clone(),
            ))
        }
    }
}

async fn accept_loop<H, F>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: ConnectionLimits,
    handler: Rc<H>,
    on_error: fn(u16, &str) -> Response,
    metrics: Arc<HttpMetrics>,
    stop: CoreShutdown,
) where
    H: Fn(Request) -> F + 'static,
    F: Future<Output = Response> + 'static,
{
    let open = Rc::new(Cell::new(0usize));
    loop {
        let accepted = stop.unless_stopped(listener.accept()).await;
        // Shutdown: the listener closes here; open connections finish on their own.
        let Some(accepted) = accepted else { return };
        let stream = match accepted {
            Ok(stream) => stream,
            Err(e) => {
                log::warn!("accept failed: {e}");
                glommio::timer::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (open, handler, tls) = (open.clone(), handler.clone(), tls.clone());
        let limits = limits.clone();
        let (metrics, stop) = (metrics.clone(), stop.clone());
        glommio::spawn_local(async move {
            if open.get() >= CONNECTIONS_PER_CORE_MAX {
                use futures_lite::AsyncWriteExt;
                let body = "{\"error\":\"overloaded\",\"message\":\"too many connections on this core\"}";
                let response = format!(
                    "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let mut stream = stream;
                let _ = stream.write_all(response.as_bytes()).await;
                return;
            }
            open.set(open.get() + 1);
            metrics.connections.fetch_add(1, Ordering::Relaxed);
            let served = crate::panics::catch_panic(async move {
                match tls {
                    None => {
                        let stream = PlainTcp::new(stream);
                        http1::serve_connection(stream, limits, handler, on_error, stop).await
                    }
                    // Boxed: a future holds room for its largest state from the start, and
                    // the TLS states (handshake, rustls, HTTP/2 over TLS) would make every
                    // plain connection pay for them while it sits idle.
                    Some(acceptor) => {
                        Box::pin(serve_tls(acceptor, stream, limits, handler, on_error, stop))
                            .await
                    }
                }
            });
            // A panic has closed the connection (its socket was dropped) and was logged.
            let _ = served.await;
            open.set(open.get() - 1);
            metrics.connections.fetch_sub(1, Ordering::Relaxed);
        })
        .detach();
    }
}

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

pub(super) fn explain_bind_error(addr: &str, error: &str) -> String {
    format!("cannot listen on {addr}: {error} (is another server using it? pick another with --listen / --admin-listen)")
}
