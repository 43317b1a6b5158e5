//! `pico serve`: recovery, one pinned glommio executor per core (each accepting on the shared
//! port through `SO_REUSEPORT`), the admin listener, and shutdown on SIGINT/SIGTERM.
//!
//! [`run`] reads as the node's life: `setup.rs` checks and boots, `cores.rs` starts the
//! executors (whose accept loops are `listeners.rs`), `signals.rs` waits, then the stop.

mod cores;
mod error;
mod listeners;
mod ports;
mod setup;
mod signals;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use pico_engine::Cluster;

use crate::admin::metrics::HttpMetrics;
use crate::admin::shared::NodeFacts;
use crate::config::{Protocol, ServerConfig};
use crate::shutdown::Shutdown;
use cores::{AdminJob, NodeJob, Stopped};
pub use error::{CoreStartError, StartError};

/// The bound on the whole stop (after the drain window).
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs a node until SIGINT/SIGTERM. `Err` says why it could not start, in one line for the
/// operator.
/// The checks of a start that need no listener, thread or data: the settings and how they go
/// together, the token file, remote listeners without authentication, the TLS certificate and
/// key (`pico serve --print-config` runs them too).
pub fn check(config: &ServerConfig) -> Result<(), StartError> {
    config.check()?;
    let auth = setup::load_tokens(config)?;
    setup::refuse_open_remote_listeners(config, auth.is_some())?;
    setup::listen_addresses(config)?;
    setup::tls_config(config)?;
    Ok(())
}

pub fn run(config: ServerConfig) -> Result<(), StartError> {
    config.check()?;
    // Blocked before any thread starts (the metadata and upload threads inherit the mask), so
    // only the main thread's sigwait ever takes SIGINT/SIGTERM/SIGHUP.
    let signals = signals::block_shutdown_signals()?;
    setup::check_memlock()?;
    let open_files = setup::raise_open_files();
    let auth = setup::load_tokens(&config)?;
    setup::refuse_open_remote_listeners(&config, auth.is_some())?;
    // Looked at before the engine boots, so a second server on the port is refused at once;
    // core 0 looks again right before it binds.
    let addresses = setup::listen_addresses(&config)?;
    setup::refuse_taken_ports(&addresses)?;
    let tls_config = setup::tls_config(&config)?;
    let booted = setup::boot_engine(&config)?;
    let cores = booted.cores;
    let boot = booted.boot;
    let cluster = boot.cluster.clone();
    let meta = boot.meta.clone();
    let engine_metrics = boot.metrics.clone();
    let http_metrics: Vec<Arc<HttpMetrics>> = (0..cores)
        .map(|_| Arc::new(HttpMetrics::default()))
        .collect();
    let _wal_lock = boot.wal_lock;
    let wal_witness = boot.wal_witness;
    let recovery_backlog = boot.recovery_backlog.clone();
    setup::log_startup(&config, cores, &boot.report, auth.as_deref());
    let connections_per_core_max = setup::connections_per_core(open_files, cores);
    let scheme = if tls_config.is_some() {
        "https"
    } else {
        "http"
    };
    let subscriptions = setup::open_subscriptions(&config)?;
    let (settings, ds_settings) =
        setup::protocol_settings(&config, auth.clone(), subscriptions.clone(), scheme);
    let mut listeners = addresses.data;
    let (stopped_tx, stopped_rx) = mpsc::channel::<Stopped>();
    let shutdown = Shutdown::default();
    let serving = Arc::new(AtomicBool::new(false));
    let admin = addresses.admin.map(|addr| AdminJob {
        addr,
        facts: NodeFacts {
            wal_salvaged: boot.wal_salvaged.clone(),
            recovery_backlog: boot.recovery_backlog.clone(),
            ..setup::node_facts(&config, cores, booted.node_epoch_ms)
        },
        scheme,
        engine_metrics,
        http_metrics: http_metrics.clone(),
    });
    let node = NodeJob {
        tls: tls_config,
        serving: serving.clone(),
        settings,
        ds_settings,
        max_body_size: config.max_body_size,
        request_timeout: Duration::from_millis(config.request_timeout_ms),
        send_stall_timeout: Duration::from_millis(config.send_stall_timeout_ms),
        in_flight_bytes_max: config.in_flight_bytes_max,
        unsent_bytes_max: config.unsent_bytes_max,
        connections_per_core_max,
        backlog: config.backlog,
        shutdown: shutdown.clone(),
        stopped: stopped_tx,
    };
    let (_executors, admin_addr) = cores::start_cores(
        boot.seeds,
        booted.available,
        &mut listeners,
        node,
        admin,
        &http_metrics,
    )?;
    // Every core serves: ready before the address is announced, so whoever waits for the
    // announcement finds /ready answering 200.
    let (listen, _) = &listeners[0];
    let advertised = config
        .http_address
        .clone()
        .unwrap_or_else(|| format!("{scheme}://{listen}"));
    if let Some(cluster) = &cluster {
        advertise(cluster, &meta, &listeners, &advertised, scheme)?;
    }
    serving.store(true, Ordering::Relaxed);
    if let Some(on_serving) = config.on_serving {
        on_serving();
    }
    // Deliveries never go to this node itself: a wake posted to its own listener is a write
    // that wakes again, and one posted to its admin listener an operator's request.
    subscriptions.set_own_listeners(
        listeners
            .iter()
            .map(|(addr, _)| *addr)
            .chain(admin_addr)
            .collect(),
    );
    announce_listeners(&listeners, admin_addr, &advertised, scheme);
    signals::wait_for_stop(&signals, auth.as_ref());
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
    signals::exit_on_second_stop(signals)?;
    let clean = wait_for_cores(&stopped_rx, cores);
    log::info!("stopped: {clean} of {cores} cores flushed everything to the object store");
    if clean == cores && recovery_backlog.unstored_segments() == 0 {
        // The WAL holds nothing the catalog lacks: a start on another WAL directory loses
        // nothing.
        if let Some(Err(e)) = wal_witness.as_ref().map(|w| w.clean()) {
            log::warn!("cannot tell the catalog the WAL is stored: {e}");
        }
    }
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
    if let Err(e) = subscriptions.flush() {
        log::error!("subscriptions: {e}");
    }
    // The metadata thread ends once what was queued is committed; its SQLite connection, the
    // last one, closes, which checkpoints the catalog into its database file: a stopped node's
    // `meta.db` holds the whole catalog, not just what the last automatic checkpoint left.
    // (Postgres needs nothing of the kind, and a stop must not wait on an unreachable server.)
    if matches!(
        pico_meta::MetaUrl::parse(&config.meta_url),
        Ok(pico_meta::MetaUrl::SqliteFile(_))
    ) {
        meta.shutdown();
    }
    Ok(())
}

/// Publishes this node's URLs in the metadata log, one per protocol: a redirect keeps the
/// client on its protocol.
fn advertise(
    cluster: &Cluster,
    meta: &pico_meta::MetaStore,
    listeners: &[(SocketAddr, Protocol)],
    advertised: &str,
    scheme: &str,
) -> Result<(), StartError> {
    let url_of = |wanted: Protocol| {
        listeners
            .iter()
            .enumerate()
            .find(|(_, (_, protocol))| *protocol == wanted)
            .map_or_else(String::new, |(i, (addr, _))| {
                if i == 0 {
                    advertised.to_string()
                } else {
                    second_listener_url(*addr, advertised, scheme)
                }
            })
    };
    cluster.advertise(
        meta,
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
    Ok(())
}

/// The URL other nodes send a client of the second listener's protocol to: its bound address,
/// or, bound to every address (`0.0.0.0:4438`, the default beside `--listen 0.0.0.0:4437`),
/// the host of the advertised URL (`--http-address`) with the listener's port.
fn second_listener_url(bound: SocketAddr, advertised: &str, scheme: &str) -> String {
    if !bound.ip().is_unspecified() {
        return format!("{scheme}://{bound}");
    }
    let host = advertised
        .split_once("://")
        .map_or(advertised, |(_, rest)| rest)
        .split('/')
        .next()
        .unwrap_or_default();
    let host = match host.rsplit_once(':') {
        Some((name, port)) if !name.is_empty() && !port.contains(']') => name,
        _ => host,
    };
    format!("{scheme}://{host}:{}", bound.port())
}

/// The addresses on stdout (for scripts and supervisors) and in the log.
fn announce_listeners(
    listeners: &[(SocketAddr, Protocol)],
    admin_addr: Option<SocketAddr>,
    advertised: &str,
    scheme: &str,
) {
    let (listen, _) = &listeners[0];
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
    for (addr, protocol) in listeners {
        let name = match protocol {
            Protocol::Pico => "pico",
            Protocol::DurableStreams => "ds (Durable Streams)",
        };
        log::info!("protocol {name} on {scheme}://{addr}");
    }
}

/// Collects each core's shutdown report until [`SHUTDOWN_TIMEOUT`]; how many flushed
/// everything.
fn wait_for_cores(stopped: &mpsc::Receiver<Stopped>, cores: usize) -> usize {
    let deadline = std::time::Instant::now() + SHUTDOWN_TIMEOUT;
    let mut clean = 0;
    for _ in 0..cores {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match stopped.recv_timeout(left) {
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
    clean
}

/// A status line on stdout (the addresses, for scripts and supervisors). A node keeps serving
/// when nobody reads them any more, so a closed stdout is ignored, where `println!` panics.
fn announce(line: std::fmt::Arguments) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_fmt(line).and_then(|()| out.write_all(b"\n"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_second_listener_is_advertised_on_the_nodes_host() {
        let url = |addr: &str, advertised| {
            second_listener_url(addr.parse().expect("an address"), advertised, "http")
        };
        assert_eq!(
            url("0.0.0.0:4438", "http://node1.internal:4437"),
            "http://node1.internal:4438"
        );
        assert_eq!(
            url("[::]:4438", "http://[fd00::1]:4437"),
            "http://[fd00::1]:4438"
        );
        assert_eq!(url("[::]:4438", "http://node2"), "http://node2:4438");
        assert_eq!(
            url("10.0.0.5:4438", "http://node1.internal:4437"),
            "http://10.0.0.5:4438"
        );
    }
}
