//! Process set-up before any core runs: the checks that refuse to start (locked memory, auth
//! and remote listeners, TLS files), the engine's boot, the startup log lines, and the
//! settings each protocol is served with.

use std::net::SocketAddr;
use std::sync::Arc;

use pico_engine::{Boot, ClusterConfig, EngineConfig};

use super::error::StartError;
use super::ports;
use crate::admin::NodeFacts;
use crate::auth::SharedTokens;
use crate::config::{Durability, Protocol, ServerConfig};
use crate::consumers::ConsumerWakes;
use crate::ds::DsSettings;
use crate::pico::PicoSettings;
use crate::subscriptions::Subscriptions;
use crate::transport::tls;

/// glommio refuses to start below this much locked memory.
const MEMLOCK_MIN_BYTES: u64 = 512 * 1024;

/// Raises the soft limit of `resource` to its hard one; the soft limit then, and the one before
/// when it was raised. `None` when the limits cannot be read.
fn raise_soft_limit(resource: libc::__rlimit_resource_t) -> Option<(u64, Option<u64>)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(resource, &mut limit) != 0 {
            return None;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(resource, &raised) == 0 {
                return Some((raised.rlim_cur, Some(limit.rlim_cur)));
            }
        }
    }
    Some((limit.rlim_cur, None))
}

/// glommio needs locked memory for its rings; raise the soft limit to the hard one, and say
/// how to fix it when that is still too low.
pub(super) fn check_memlock() -> Result<(), StartError> {
    let Some((limit, _)) = raise_soft_limit(libc::RLIMIT_MEMLOCK) else {
        return Ok(());
    };
    if limit != libc::RLIM_INFINITY && limit < MEMLOCK_MIN_BYTES {
        return Err(StartError::Memlock {
            limit_kib: limit / 1024,
            needed_kib: MEMLOCK_MIN_BYTES / 1024,
        });
    }
    Ok(())
}

/// The process's open-file limit, raised from its soft value to its hard one (a shell's
/// default is often 1,024 of a hard 524,288 or more): every connection and file is one.
#[derive(Clone, Copy, Debug)]
pub(super) struct OpenFiles {
    pub(super) limit: u64,
    pub(super) raised_from: Option<u64>,
}

pub(super) fn raise_open_files() -> OpenFiles {
    match raise_soft_limit(libc::RLIMIT_NOFILE) {
        Some((limit, raised_from)) => OpenFiles { limit, raised_from },
        None => OpenFiles {
            limit: libc::RLIM_INFINITY,
            raised_from: None,
        },
    }
}

/// The connections each core's protocol listeners take, from the open-file limit; logged,
/// with a warning when the limit is so low that the cores take only their minimum.
pub(super) fn connections_per_core(open_files: OpenFiles, cores: usize) -> usize {
    let per_core = crate::limits::connections_per_core_max(open_files.limit, cores);
    let raised = match open_files.raised_from {
        Some(from) => format!(" (raised from {from})"),
        None => String::new(),
    };
    log::info!(
        "open files: {}{raised}; connections: up to {per_core} a core",
        open_files.limit
    );
    if per_core == crate::limits::CONNECTIONS_PER_CORE_MIN {
        log::warn!(
            "the open-file limit ({}) leaves {per_core} connections a core: raise it (`ulimit -n`, \
             LimitNOFILE= in systemd)",
            open_files.limit
        );
    }
    per_core
}

/// `--auth required`: the token table, loaded from `--auth-tokens`.
pub(super) fn load_tokens(config: &ServerConfig) -> Result<Option<Arc<SharedTokens>>, StartError> {
    match (config.auth_required, &config.auth_tokens) {
        (true, Some(path)) => {
            let tokens = SharedTokens::load(path)?;
            // A node that refuses every request is a mistake, not a configuration (emptying
            // the file and reloading it, to revoke every token at once, stays possible).
            if tokens.current_len() == 0 {
                return Err(StartError::NoGrants { path: path.clone() });
            }
            Ok(Some(tokens))
        }
        (true, None) => Err(StartError::TokensNeeded),
        (false, _) => Ok(None),
    }
}

/// Without authentication every listener must be loopback, unless `--insecure-allow-remote`.
pub(super) fn refuse_open_remote_listeners(
    config: &ServerConfig,
    authenticated: bool,
) -> Result<(), StartError> {
    if !authenticated && !config.insecure_allow_remote {
        let mut listeners = vec![config.listen.clone()];
        listeners.extend(config.ds_listen.clone());
        listeners.extend(config.admin_listen.clone());
        for addr in listeners {
            if !is_loopback(&addr)? {
                return Err(StartError::OpenRemote { addr });
            }
        }
    }
    Ok(())
}

/// Where the node's listeners bind, resolved once: the checks look at these addresses and the
/// cores bind them.
pub(super) struct ListenAddresses {
    /// The protocol listeners: `--listen` (speaking `--protocol`), then `--ds-listen` (the
    /// other protocol, on the same data).
    pub(super) data: Vec<(SocketAddr, Protocol)>,
    pub(super) admin: Option<SocketAddr>,
}

impl ListenAddresses {
    fn all(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.data.iter().map(|(addr, _)| *addr).chain(self.admin)
    }
}

/// Each listener's address (a name's first address, the one a bind takes). Two on one port
/// are refused: the cores' sharing of a port (`SO_REUSEPORT`) would let both bind and split
/// the port's connections between them.
pub(super) fn listen_addresses(config: &ServerConfig) -> Result<ListenAddresses, StartError> {
    use std::net::ToSocketAddrs;
    let other = match config.protocol {
        Protocol::Pico => Protocol::DurableStreams,
        Protocol::DurableStreams => Protocol::Pico,
    };
    let named = [
        ("--listen", Some(&config.listen), Some(config.protocol)),
        ("--ds-listen", config.ds_listen.as_ref(), Some(other)),
        ("--admin-listen", config.admin_listen.as_ref(), None),
    ];
    let mut seen: Vec<(&'static str, SocketAddr)> = Vec::new();
    let mut addresses = ListenAddresses {
        data: Vec::new(),
        admin: None,
    };
    for (flag, addr, protocol) in named {
        let Some(addr) = addr else { continue };
        let resolve_error = |source| StartError::Resolve {
            addr: addr.clone(),
            source,
        };
        let resolved = addr
            .to_socket_addrs()
            .map_err(resolve_error)?
            .next()
            .ok_or_else(|| {
                resolve_error(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no address",
                ))
            })?;
        if let Some(&earlier) = seen
            .iter()
            .find(|(_, earlier)| resolved.port() != 0 && ports::overlaps(*earlier, resolved))
        {
            return Err(StartError::ListenersOverlap {
                first: earlier,
                second: (flag, resolved),
            });
        }
        seen.push((flag, resolved));
        match protocol {
            Some(protocol) => addresses.data.push((resolved, protocol)),
            None => addresses.admin = Some(resolved),
        }
    }
    Ok(addresses)
}

/// Refuses to start where another socket already listens (see [`ports`]).
pub(super) fn refuse_taken_ports(addresses: &ListenAddresses) -> Result<(), StartError> {
    for addr in addresses.all() {
        if let Some(holder) = ports::listener_on(addr) {
            return Err(StartError::PortTaken { addr, holder });
        }
    }
    Ok(())
}

/// Whether every address `addr` resolves to is a loopback address.
fn is_loopback(addr: &str) -> Result<bool, StartError> {
    use std::net::ToSocketAddrs;
    let resolved: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|source| StartError::Resolve {
            addr: addr.to_string(),
            source,
        })?
        .collect();
    Ok(!resolved.is_empty() && resolved.iter().all(|a| a.ip().is_loopback()))
}

/// `--tls-cert` and `--tls-key`: the TLS set-up every listener then serves.
pub(super) fn tls_config(
    config: &ServerConfig,
) -> Result<Option<Arc<rustls::ServerConfig>>, StartError> {
    match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Ok(Some(tls::server_config(cert, key)?)),
        (None, None) => Ok(None),
        _ => Err(StartError::TlsHalf),
    }
}

/// The engine, booted: its recovered cores' seeds and handles, and the facts set-up decided.
pub(super) struct Booted {
    pub(super) boot: Boot,
    /// Cores to run (`--cores`, else one per available CPU).
    pub(super) cores: usize,
    /// CPUs available: cores past them are not pinned.
    pub(super) available: usize,
    pub(super) node_epoch_ms: u64,
}

/// Opens the metadata log and the object store and recovers the WAL (`pico_engine::boot`),
/// as a cluster member when the metadata log is shared.
pub(super) fn boot_engine(config: &ServerConfig) -> Result<Booted, StartError> {
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
        pico_meta::MetaUrl::parse(&config.meta_url),
        Ok(pico_meta::MetaUrl::Postgres(_))
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
        // Published once the listener is bound (see `advertise`).
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
        segment_max_age_ms: config.segment_max_age_ms,
        segment_cache_bytes: config.segment_cache_bytes,
        node_epoch_ms: node_epoch,
        node_id,
        catalog_id: None,
        in_flight_bytes_max: config.in_flight_bytes_max,
        unuploaded_bytes_max: config.unuploaded_bytes_max,
        gc_interval_ms: config.gc_interval_ms,
        object_puts_per_second: config.object_puts_per_second,
        wal_salvage: config.wal_salvage,
        producers: pico_engine::producers::ProducerLimits::new(
            pico_engine::limits::PRODUCERS_PER_STREAM_DEFAULT,
            config.producers_max,
            config.producer_idle_expiry_sec.saturating_mul(1000),
        ),
    };
    let node_epoch_ms = engine_config.node_epoch_ms;
    let boot = pico_engine::boot(
        engine_config,
        &config.meta_url,
        &config.storage,
        cluster_config,
    )?;
    Ok(Booted {
        boot,
        cores,
        available,
        node_epoch_ms,
    })
}

/// One line per startup fact, so each can be grepped for.
pub(super) fn log_startup(
    config: &ServerConfig,
    cores: usize,
    report: &[String],
    auth: Option<&SharedTokens>,
) {
    log::info!(
        "pico {} (commit {})",
        config.build.version,
        config.build.commit
    );
    for line in report {
        log::info!("{line}");
    }
    log::info!("cores: {cores}");
    log::info!(
        "durability: {}",
        match config.durability {
            Durability::Local => "local (acknowledged once the WAL write is durable)".to_string(),
            Durability::Object => format!(
                "object (acknowledged once stored in the bucket; a core flushes as soon as its \
                 previous PUT is done, at most {} PUTs/s for the node)",
                config.object_puts_per_second
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
    match auth {
        Some(tokens) => log::info!(
            "auth required: {} token grants (SIGHUP reloads)",
            tokens.current_len()
        ),
        None => log::info!("auth off"),
    }
    if config.durability == Durability::Memory {
        log::warn!("--durability memory: acknowledged appends are lost on a crash");
    }
}

/// One registry per node: both protocols' writes wake the same subscriptions. Its state
/// file is node-local like the WAL, and the WAL directory is already locked to this node.
/// `--durability memory` keeps nothing across a crash, subscriptions included.
/// Loopback webhooks are allowed when every protocol listener is loopback (local development,
/// tests) or with `--webhook-allow-loopback`; otherwise a subscription creator could make the
/// node POST to its own or its neighbours' local ports.
pub(super) fn open_subscriptions(config: &ServerConfig) -> Result<Arc<Subscriptions>, StartError> {
    let subscriptions = open_subscription_state(config)?;
    let allowed = webhook_loopback_allowed(config)?;
    subscriptions.set_webhook_loopback(allowed);
    if !allowed {
        log::info!(
            "subscriptions: webhooks to loopback hosts are off (the node listens beyond loopback; --webhook-allow-loopback turns them on)"
        );
    }
    Ok(subscriptions)
}

/// Whether webhooks may go to loopback hosts on a node of `config` (see `open_subscriptions`).
pub(super) fn webhook_loopback_allowed(config: &ServerConfig) -> Result<bool, StartError> {
    if config.webhook_allow_loopback {
        return Ok(true);
    }
    let mut listeners = vec![config.listen.as_str()];
    listeners.extend(config.ds_listen.as_deref());
    for addr in listeners {
        if !is_loopback(addr)? {
            return Ok(false);
        }
    }
    Ok(true)
}

fn open_subscription_state(config: &ServerConfig) -> Result<Arc<Subscriptions>, StartError> {
    Ok(Arc::new(if config.durability == Durability::Memory {
        log::info!("subscriptions: in memory (--durability memory)");
        Subscriptions::new()
    } else {
        let subscriptions =
            Subscriptions::open(&config.wal_dir).map_err(StartError::Subscriptions)?;
        if let Some(path) = subscriptions.state_path() {
            log::info!(
                "subscriptions: {} loaded from {}",
                subscriptions.len(),
                path.display()
            );
        }
        subscriptions
    }))
}

/// The settings of the Pico and the Durable Streams handlers.
pub(super) fn protocol_settings(
    config: &ServerConfig,
    auth: Option<Arc<SharedTokens>>,
    subscriptions: Arc<Subscriptions>,
    scheme: &'static str,
) -> (PicoSettings, DsSettings) {
    // Told of the same writes as the subscriptions, and delivering on their threads.
    let consumer_wakes = ConsumerWakes::new();
    subscriptions.set_watcher(Arc::new(consumer_wakes.clone()));
    let settings = PicoSettings {
        long_poll_timeout_ms: config.long_poll_timeout_ms,
        max_chunk_size: if config.max_chunk_size == 0 {
            64 * 1024
        } else {
            config.max_chunk_size
        },
        sse_max_duration_ms: config.sse_max_duration_ms,
        cors_origin: config.cors_origin.clone(),
        auth,
        subscriptions: subscriptions.clone(),
        consumer_wakes: consumer_wakes.clone(),
        scheme,
        default_retention: config.default_retention,
        durable_streams: Default::default(),
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
        consumer_wakes,
        default_retention: config.default_retention,
        pico: Default::default(),
    };
    (settings, ds_settings)
}

/// What the admin API says about the node (the advertised address is filled in once bound).
pub(super) fn node_facts(config: &ServerConfig, cores: usize, node_epoch_ms: u64) -> NodeFacts {
    NodeFacts {
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
        wal_salvaged: Vec::new(),
        recovery_backlog: Default::default(),
        build: config.build,
        backup_dir: config.backup_dir.clone(),
        disk: crate::admin::usage::DiskPaths::new(config.wal_dir.clone(), &config.meta_url),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loopback webhooks are on for a node that only listens on loopback,
    /// off for one that listens beyond it, unless `--webhook-allow-loopback` (no socket is
    /// bound: the addresses are only resolved).
    #[test]
    fn loopback_webhooks_follow_the_listeners_and_the_flag() {
        let config = |listen: &str, ds_listen: Option<&str>, flag: bool| ServerConfig {
            listen: listen.into(),
            ds_listen: ds_listen.map(str::to_string),
            webhook_allow_loopback: flag,
            ..ServerConfig::default()
        };
        let allowed = |c: ServerConfig| webhook_loopback_allowed(&c).unwrap();
        assert!(allowed(ServerConfig::default()));
        assert!(allowed(config("127.0.0.1:0", Some("[::1]:0"), false)));
        assert!(allowed(config("localhost:0", None, false)));
        assert!(!allowed(config("0.0.0.0:4437", None, false)));
        assert!(!allowed(config("127.0.0.1:0", Some("0.0.0.0:4438"), false)));
        assert!(!allowed(config("[::]:4437", None, false)));
        assert!(allowed(config("0.0.0.0:4437", None, true)));
    }
}
