//! `pico serve`: recovery, one pinned glommio executor per core (each accepting on the shared
//! port through `SO_REUSEPORT`), the admin listener, and shutdown on SIGINT/SIGTERM.

use pico_proto::header::*;
use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};

use crate::transport::socket::PlainTcp;
use pico_engine::ClusterConfig;
use pico_engine::{CoreHandle, CoreSeed, EngineConfig};

use crate::admin::metrics::HttpMetrics;
use crate::admin::{self, AdminState, NodeFacts};
use crate::auth::{CoreTokens, SharedTokens};
use crate::config::{Durability, Protocol, ServerConfig};
use crate::ds::subscriptions::Subscriptions;
use crate::ds::{self, DsSettings};
use crate::limits::{BodyBudget, ConnectionLimits};
use crate::limits::{ADMIN_BODY_BYTES_MAX, CONNECTIONS_PER_CORE_MAX};
use crate::pico::{self, PicoSettings};
use crate::shutdown::{CoreShutdown, Shutdown};
use crate::transport::http1;
use crate::transport::http2;
use crate::transport::tls;
use futures_rustls::TlsAcceptor;

/// Graceful shutdown: how long in-flight requests get to finish, how long the final upload
/// may take, and the bound on the whole stop (after the drain window).
const SHUTDOWN_CONNECTIONS_WAIT: Duration = Duration::from_secs(10);
const SHUTDOWN_FLUSH_WAIT: Duration = Duration::from_secs(15);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// io_uring registered-buffer memory per core: small, so the default 8 MiB memlock suffices.
const IO_MEMORY_PER_CORE_BYTES: usize = 1 << 20;
/// glommio refuses to start below this much locked memory.
const MEMLOCK_MIN_BYTES: u64 = 512 * 1024;

/// Runs a node until SIGINT/SIGTERM. Returns a one-line, user-facing reason on failure.
pub fn run(config: ServerConfig) -> Result<(), String> {
    config.check()?;
    // Blocked before any thread starts (the metadata and upload threads inherit the mask), so
    // only the main thread's sigwait ever takes SIGINT/SIGTERM/SIGHUP.
    let signals = block_shutdown_signals()?;
    check_memlock()?;
    let auth = match (config.auth_required, &config.auth_tokens) {
        (true, Some(path)) => {
            let tokens = SharedTokens::load(path)?;
            Some(tokens)
        }
        (true, None) => return Err("--auth required needs --auth-tokens FILE".into()),
        (false, _) => None,
    };
    if auth.is_none() && !config.insecure_allow_remote {
        let mut listeners = vec![config.listen.clone()];
        listeners.extend(config.ds_listen.clone());
        listeners.extend(config.admin_listen.clone());
        for addr in listeners {
            if !is_loopback(&addr)? {
                return Err(format!(
                    "refusing to listen on {addr} without authentication: use --auth required --auth-tokens FILE, or --insecure-allow-remote to expose it anyway"
                ));
            }
        }
    }
    let tls_config = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(tls::server_config(cert, key)?),
        (None, None) => None,
        _ => return Err("--tls-cert and --tls-key go together".into()),
    };

    let available = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let cores = if config.cores == 0 {
        available
    } else {
        config.cores
    };
    // A shared metadata database makes this node a cluster member (SQLite admits one node).
    let clustered = matches!(
        pico_engine::meta::MetaUrl::parse(&config.meta_url),
        Ok(pico_engine::meta::MetaUrl::Postgres(_))
    );
    let node_epoch = config
        .node_epoch
        .unwrap_or_else(|| pico_engine::now_ms() as u64);
    let node_id = match (clustered, config.node_id) {
        (true, None) => Some(1),
        (_, id) => id,
    };
    let cluster_config = clustered.then(|| ClusterConfig {
        node_id: node_id.unwrap_or(1),
        node_epoch,
        // Published once the listener is bound (see below).
        address: config.http_address.clone().unwrap_or_default(),
        slots: config.slots,
        lease_ms: config.lease_ms,
        redirect: !config.routing_local,
        cluster_id: config.cluster_id.clone(),
    });
    let engine_config = EngineConfig {
        cores,
        wal_dir: config.wal_dir.clone(),
        durability: config.durability,
        segment_size: config.segment_size,
        segment_max_age_ms: match config.durability {
            Durability::Object => config.object_flush_ms,
            Durability::Local | Durability::Memory => config.segment_max_age_ms,
        },
        segment_cache_bytes: config.segment_cache_bytes,
        node_epoch_ms: node_epoch,
        node_id,
        in_flight_bytes_max: config.in_flight_bytes_max,
        unuploaded_bytes_max: config.unuploaded_bytes_max,
        gc_interval_ms: config.gc_interval_ms,
    };
    let node_epoch_ms = engine_config.node_epoch_ms;
    let boot = pico_engine::boot(
        engine_config,
        &config.meta_url,
        &config.storage,
        cluster_config,
    )?;
    let cluster = boot.cluster.clone();
    let meta = boot.meta.clone();
    let engine_metrics = boot.metrics.clone();
    let http_metrics: Vec<Arc<HttpMetrics>> = (0..cores)
        .map(|_| Arc::new(HttpMetrics::default()))
        .collect();
    let _wal_lock = boot.wal_lock;
    for line in &boot.report {
        log::info!("{line}");
    }
    // One line per startup fact, so each can be grepped for.
    log::info!("cores: {cores}");
    log::info!(
        "durability: {}",
        match config.durability {
            Durability::Local => "local (acknowledged after the WAL fdatasync)".to_string(),
            Durability::Object => format!(
                "object (acknowledged once stored in the bucket; segments seal every {} ms)",
                config.object_flush_ms
            ),
            Durability::Memory => {
                "memory (NOTHING survives a crash: benchmarks and tests only)".to_string()
            }
        }
    );
    log::info!(
        "metadata: {}",
        pico_engine::displayed_meta_url(&config.meta_url)
    );
    log::info!("storage: {}", config.storage);
    log::info!("wal: {}", config.wal_dir.display());
    match &auth {
        Some(tokens) => log::info!(
            "auth required: {} token grants (SIGHUP reloads)",
            tokens.current_len()
        ),
        None => log::info!("auth off"),
    }
    if config.durability == Durability::Memory {
        log::warn!("--durability memory: acknowledged appends are lost on a crash");
    }
    let scheme = if tls_config.is_some() {
        "https"
    } else {
        "http"
    };
    // One registry per node: both protocols' writes wake the same subscriptions. Its state
    // file is node-local like the WAL, and the WAL directory is already locked to this node.
    // `--durability memory` keeps nothing across a crash, subscriptions included.
    let subscriptions = Arc::new(if config.durability == Durability::Memory {
        log::info!("subscriptions: in memory (--durability memory)");
        Subscriptions::new()
    } else {
        let subscriptions = Subscriptions::open(&config.wal_dir)?;
        if let Some(path) = subscriptions.state_path() {
            log::info!(
                "subscriptions: {} loaded from {}",
                subscriptions.len(),
                path.display()
            );
        }
        subscriptions
    });
    let node_subscriptions = subscriptions.clone();
    let settings = PicoSettings {
        long_poll_timeout_ms: config.long_poll_timeout_ms,
        max_chunk_size: if config.max_chunk_size == 0 {
            64 * 1024
        } else {
            config.max_chunk_size
        },
        sse_max_duration_ms: config.sse_max_duration_ms,
        cors_origin: config.cors_origin.clone(),
        auth: auth.clone(),
        subscriptions: subscriptions.clone(),
        default_retention: config.default_retention,
    };
    let ds_settings = DsSettings {
        long_poll_timeout_ms: config.long_poll_timeout_ms,
        sse_max_duration_ms: config.sse_max_duration_ms,
        max_chunk_size: settings.max_chunk_size,
        // A catch-up never answers less than a live read would.
        catch_up_bytes: config.catch_up_read_size.max(settings.max_chunk_size),
        cors_origin: config.cors_origin.clone(),
        scheme,
        subscriptions,
        default_retention: config.default_retention,
    };
    // `--listen` speaks `--protocol`; `--ds-listen` adds the other one on the same data.
    let other = match config.protocol {
        Protocol::Pico => Protocol::DurableStreams,
        Protocol::DurableStreams => Protocol::Pico,
    };
    let mut listeners: Vec<(String, Protocol)> = vec![(config.listen.clone(), config.protocol)];
    if let Some(addr) = &config.ds_listen {
        listeners.push((addr.clone(), other));
    }
    let (ready_tx, ready_rx) = mpsc::channel::<Result<Started, String>>();
    let (stopped_tx, stopped_rx) = mpsc::channel::<Stopped>();
    let shutdown = Shutdown::default();
    let serving = Arc::new(AtomicBool::new(false));
    let mut admin_addr = None;
    let mut handles = Vec::new();
    for (index, seed) in boot.seeds.into_iter().enumerate() {
        let placement = if cores <= available {
            Placement::Fixed(index)
        } else {
            Placement::Unbound
        };
        let job = CoreJob {
            seed,
            tls: tls_config.clone(),
            serving: serving.clone(),
            listeners: listeners.clone(),
            admin: if index == 0 {
                config.admin_listen.clone().map(|addr| AdminJob {
                    addr,
                    facts: NodeFacts {
                        advertised_address: String::new(),
                        node_epoch_ms,
                        cores,
                        durability: match config.durability {
                            Durability::Local => "local",
                            Durability::Object => "object",
                            Durability::Memory => "memory",
                        },
                        storage: config.storage.clone(),
                        meta_url: pico_engine::displayed_meta_url(&config.meta_url),
                    },
                    scheme,
                    engine_metrics: engine_metrics.clone(),
                    http_metrics: http_metrics.clone(),
                })
            } else {
                None
            },
            http: http_metrics[index].clone(),
            settings: settings.clone(),
            ds_settings: ds_settings.clone(),
            max_body_size: config.max_body_size,
            request_timeout: Duration::from_millis(config.request_timeout_ms),
            in_flight_bytes_max: config.in_flight_bytes_max,
            ready: ready_tx.clone(),
            shutdown: shutdown.clone(),
            stopped: stopped_tx.clone(),
        };
        let handle = LocalExecutorBuilder::new(placement)
            .name(&format!("pico-core-{index}"))
            .io_memory(IO_MEMORY_PER_CORE_BYTES)
            .spawn(move || run_core(job))
            .map_err(|e| explain_executor_error(&e.to_string()))?;
        handles.push(handle);
        // Core 0 resolves the address (port 0 picks a free one); the others share it.
        let started = ready_rx
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| format!("core {index} did not start within 30 s"))??;
        if index == 0 {
            for (listener, addr) in listeners.iter_mut().zip(&started.listens) {
                listener.0 = addr.to_string();
            }
            admin_addr = started.admin;
        }
    }
    // Every core serves: ready before the address is announced, so whoever waits for the
    // announcement finds /ready answering 200.
    let (listen, _) = &listeners[0];
    let advertised = config
        .http_address
        .clone()
        .unwrap_or_else(|| format!("{scheme}://{listen}"));
    if let Some(cluster) = &cluster {
        // One advertised URL per protocol: a redirect keeps the client on its protocol.
        let url_of = |wanted: Protocol| {
            listeners
                .iter()
                .enumerate()
                .find(|(_, (_, protocol))| *protocol == wanted)
                .map_or_else(String::new, |(i, (addr, _))| {
                    if i == 0 {
                        advertised.clone()
                    } else {
                        format!("{scheme}://{addr}")
                    }
                })
        };
        cluster.advertise(
            &meta,
            &url_of(Protocol::Pico),
            &url_of(Protocol::DurableStreams),
        )?;
        log::info!(
            "cluster {}: node {} serves as {advertised} (routing {}, {} slots, lease {} ms)",
            cluster.config.cluster_id,
            cluster.node_id(),
            if cluster.config.redirect {
                "redirect"
            } else {
                "local"
            },
            cluster.config.slots,
            cluster.config.lease_ms
        );
    }
    serving.store(true, Ordering::Relaxed);
    announce(format_args!(
        "serving on {scheme}://{listen} (advertised {advertised})"
    ));
    for (addr, protocol) in &listeners[1..] {
        let name = match protocol {
            Protocol::Pico => "pico",
            Protocol::DurableStreams => "durable streams",
        };
        announce(format_args!("{name} on {scheme}://{addr}"));
    }
    if let Some(addr) = admin_addr {
        announce(format_args!("admin on {scheme}://{addr}"));
    }
    for (addr, protocol) in &listeners {
        let name = match protocol {
            Protocol::Pico => "pico",
            Protocol::DurableStreams => "ds (Durable Streams)",
        };
        log::info!("protocol {name} on {scheme}://{addr}");
    }
    // SIGHUP reloads the token file; SIGINT and SIGTERM stop the node.
    while wait_for_signal(&signals) == libc::SIGHUP {
        match &auth {
            Some(tokens) => match tokens.reload() {
                Ok(count) => log::info!("SIGHUP: reloaded {count} token grants"),
                Err(e) => log::error!("SIGHUP: kept the previous tokens: {e}"),
            },
            None => log::info!("SIGHUP: nothing to reload (--auth off)"),
        }
    }
    announce(format_args!("shutting down"));
    serving.store(false, Ordering::Relaxed);
    if config.shutdown_drain_ms > 0 {
        log::info!(
            "draining for {} ms (/ready answers 503)",
            config.shutdown_drain_ms
        );
        std::thread::sleep(Duration::from_millis(config.shutdown_drain_ms));
    }
    // Listeners stop accepting, idle connections close, in-flight requests finish (their
    // appends acknowledged as usual), live readers get a clean end, then each core seals and
    // uploads what it holds. Every acknowledged append was already durable; this leaves
    // nothing to recover on the next start.
    shutdown.begin();
    // A second SIGINT/SIGTERM while stopping means "now".
    std::thread::Builder::new()
        .name(PICO_SIGNALS.into())
        .spawn(move || loop {
            let signal = wait_for_signal(&signals);
            if signal != libc::SIGHUP {
                log::error!("second stop signal: exiting without finishing the shutdown");
                std::process::exit(1);
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    let deadline = std::time::Instant::now() + SHUTDOWN_TIMEOUT;
    let mut clean = 0;
    for _ in 0..cores {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match stopped_rx.recv_timeout(left) {
            Ok(report) => {
                if report.open_connections > 0 {
                    log::warn!(
                        "core {}: {} connections still open at shutdown",
                        report.core,
                        report.open_connections
                    );
                }
                if report.flushed {
                    clean += 1;
                } else {
                    log::warn!(
                        "core {}: not everything uploaded before the deadline; the WAL keeps it",
                        report.core
                    );
                }
            }
            Err(_) => break,
        }
    }
    log::info!("stopped: {clean} of {cores} cores flushed everything to the object store");
    if let Some(cluster) = &cluster {
        if clean == cores {
            // Everything is stored: the others may take this node's streams over right away.
            cluster.release(&meta);
        } else {
            // The WAL still holds data: keep the streams ours until the lease runs out, so a
            // restart within it recovers them here.
            cluster.begin_shutdown();
        }
    }
    // What the sweeper had not written yet (a pattern's new links, wake generations).
    if let Err(e) = node_subscriptions.flush() {
        log::error!("subscriptions: {e}");
    }
    Ok(())
}

struct Started {
    /// The bound address of each listener, in the job's order.
    listens: Vec<SocketAddr>,
    admin: Option<SocketAddr>,
}

struct CoreJob {
    seed: CoreSeed,
    tls: Option<Arc<rustls::ServerConfig>>,
    serving: Arc<AtomicBool>,
    listeners: Vec<(String, Protocol)>,
    admin: Option<AdminJob>,
    http: Arc<HttpMetrics>,
    settings: PicoSettings,
    ds_settings: DsSettings,
    max_body_size: usize,
    request_timeout: Duration,
    in_flight_bytes_max: usize,
    ready: mpsc::Sender<Result<Started, String>>,
    shutdown: Shutdown,
    stopped: mpsc::Sender<Stopped>,
}

/// A core's report at the end of a graceful shutdown.
struct Stopped {
    core: usize,
    open_connections: u64,
    flushed: bool,
}

/// What core 0 needs to run the admin listener.
struct AdminJob {
    addr: String,
    facts: NodeFacts,
    scheme: &'static str,
    engine_metrics: pico_engine::metrics::NodeMetrics,
    http_metrics: Vec<Arc<HttpMetrics>>,
}

async fn run_core(job: CoreJob) {
    let CoreJob {
        seed,
        tls,
        serving,
        listeners,
        admin,
        http,
        settings,
        ds_settings,
        max_body_size,
        request_timeout,
        in_flight_bytes_max,
        ready,
        shutdown,
        stopped,
    } = job;
    // One budget for the bodies all this core's connections are receiving.
    let bodies = BodyBudget::new(in_flight_bytes_max);
    let limits = ConnectionLimits {
        max_body_size,
        request_timeout,
        bodies,
    };
    let started = async {
        let core = CoreHandle::start(seed).await?;
        let mut bound = Vec::new();
        for (addr, protocol) in &listeners {
            let listener =
                TcpListener::bind(addr).map_err(|e| explain_bind_error(addr, &e.to_string()))?;
            let local = listener.local_addr().map_err(|e| e.to_string())?;
            bound.push((listener, local, *protocol));
        }
        let admin_listener = match &admin {
            Some(job) => Some(
                TcpListener::bind(&job.addr)
                    .map_err(|e| explain_bind_error(&job.addr, &e.to_string()))?,
            ),
            None => None,
        };
        let admin_addr = admin_listener.as_ref().and_then(|l| l.local_addr().ok());
        Ok::<_, String>((core, bound, admin_listener, admin_addr))
    }
    .await;
    let (core, bound, admin_listener, admin_addr) = match started {
        Ok(parts) => parts,
        Err(message) => {
            let _ = ready.send(Err(message));
            return;
        }
    };
    settings.subscriptions.start_on_core(&core);
    let tls = tls.map(TlsAcceptor::from);
    let admin_tls = tls.clone();
    let stop = shutdown.on_this_core();
    // The core's executor runs until this task ends: connections and uploads finish first.
    let stopper = {
        let (stop, core, http) = (stop.clone(), core.clone(), http.clone());
        glommio::spawn_local(async move {
            stop.wait().await;
            core.begin_shutdown();
            let deadline = std::time::Instant::now() + SHUTDOWN_CONNECTIONS_WAIT;
            while http.connections.load(Ordering::Relaxed) > 0
                && std::time::Instant::now() < deadline
            {
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
            let open_connections = http.connections.load(Ordering::Relaxed);
            let flushed = core.flush(SHUTDOWN_FLUSH_WAIT).await;
            let _ = stopped.send(Stopped {
                core: core.core(),
                open_connections,
                flushed,
            });
        })
    };
    let tokens = settings.auth.clone().map(CoreTokens::new);
    if let (Some(admin_listener), Some(job)) = (admin_listener, admin) {
        let advertised = bound
            .first()
            .map(|(_, addr, _)| format!("{}://{addr}", job.scheme))
            .unwrap_or_default();
        let state = Rc::new(AdminState {
            serving,
            core: core.clone(),
            engine_metrics: job.engine_metrics,
            http_metrics: job.http_metrics,
            started: std::time::Instant::now(),
            facts: NodeFacts {
                advertised_address: advertised,
                ..job.facts
            },
            slots: Cell::new(job.facts.cores as u64),
            tokens: tokens.clone(),
        });
        let (admin_http, admin_stop) = (http.clone(), stop.clone());
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
                admin_listener,
                admin_tls,
                admin_limits,
                handler,
                admin::connection_error,
                admin_http,
                admin_stop,
            )
            .await
        })
        .detach();
    }
    let _ = ready.send(Ok(Started {
        listens: bound.iter().map(|(_, addr, _)| *addr).collect(),
        admin: admin_addr,
    }));
    let settings = Rc::new(settings);
    let ds_settings = Rc::new(ds_settings);
    let mut loops = Vec::new();
    for (listener, _, protocol) in bound {
        let (core, tls, tokens) = (core.clone(), tls.clone(), tokens.clone());
        let counted = http.clone();
        let task = match protocol {
            Protocol::Pico => {
                let settings = settings.clone();
                let handler = Rc::new(move |request| {
                    let (core, settings, tokens) = (core.clone(), settings.clone(), tokens.clone());
                    let counted = counted.clone();
                    async move {
                        let response =
                            pico::handle(&core, &settings, tokens.as_deref(), request).await;
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
                        let response =
                            ds::handle(&core, &settings, tokens.as_deref(), request).await;
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
        };
        loops.push(task);
    }
    for task in loops {
        task.await;
    }
    stopper.await;
}

async fn accept_loop<H, F>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: ConnectionLimits,
    handler: Rc<H>,
    on_error: fn(u16, &str) -> crate::transport::message::Response,
    metrics: Arc<HttpMetrics>,
    stop: CoreShutdown,
) where
    H: Fn(crate::transport::message::Request) -> F + 'static,
    F: std::future::Future<Output = crate::transport::message::Response> + 'static,
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
    on_error: fn(u16, &str) -> crate::transport::message::Response,
    stop: CoreShutdown,
) where
    H: Fn(crate::transport::message::Request) -> F + 'static,
    F: std::future::Future<Output = crate::transport::message::Response> + 'static,
{
    let handshake = acceptor.accept(stream);
    let stream = match crate::transport::message::within(
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

/// Whether every address `addr` resolves to is a loopback address.
fn is_loopback(addr: &str) -> Result<bool, String> {
    use std::net::ToSocketAddrs;
    let resolved: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve listen address {addr}: {e}"))?
        .collect();
    Ok(!resolved.is_empty() && resolved.iter().all(|a| a.ip().is_loopback()))
}

fn explain_bind_error(addr: &str, error: &str) -> String {
    format!("cannot listen on {addr}: {error} (is another server using it? pick another with --listen / --admin-listen)")
}

fn explain_executor_error(error: &str) -> String {
    if error.contains("io_uring")
        || error.contains("Operation not permitted")
        || error.contains("ENOSYS")
    {
        format!("cannot start an io_uring executor: {error}. io_uring may be disabled (kernel < 5.8, sysctl kernel.io_uring_disabled, or a container seccomp profile blocking io_uring_setup)")
    } else {
        format!("cannot start an executor: {error}")
    }
}

/// glommio needs locked memory for its rings; raise the soft limit to the hard one, and say
/// how to fix it when that is still too low.
fn check_memlock() -> Result<(), String> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) != 0 {
            return Ok(());
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &raised) == 0 {
                limit = raised;
            }
        }
    }
    if limit.rlim_cur != libc::RLIM_INFINITY && limit.rlim_cur < MEMLOCK_MIN_BYTES {
        return Err(format!(
            "locked-memory limit is {} KiB but io_uring needs at least {} KiB: run `ulimit -l 8192` (or set LimitMEMLOCK= in systemd, --ulimit memlock= in Docker)",
            limit.rlim_cur / 1024,
            MEMLOCK_MIN_BYTES / 1024
        ));
    }
    Ok(())
}

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread and every thread it starts, so `sigwait`
/// here receives them.
fn block_shutdown_signals() -> Result<libc::sigset_t, String> {
    // SAFETY: plain signal-set manipulation on a zeroed, then initialised, set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err("cannot block shutdown signals".into());
        }
        Ok(set)
    }
}

fn wait_for_signal(set: &libc::sigset_t) -> i32 {
    let mut signal = 0;
    // SAFETY: `set` was initialised by `block_shutdown_signals`; sigwait writes one int.
    unsafe {
        libc::sigwait(set, &mut signal);
    }
    signal
}

/// A status line on stdout (the addresses, for scripts and supervisors). A node keeps serving
/// when nobody reads them any more, so a closed stdout is ignored, where `println!` panics.
fn announce(line: std::fmt::Arguments) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_fmt(line).and_then(|()| out.write_all(b"\n"));
}
