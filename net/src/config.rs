//! The server's configuration, filled by `pico serve` from flags, `PICO_*` variables and defaults.

use std::path::PathBuf;

/// When an append is acknowledged.
pub use pico_engine::Durability;

/// The protocol a listener speaks.
pub use pico_proto::Protocol;

/// What build the node runs, as the start-up log, `/metrics` (`pico_build_info`), the admin
/// API and the dashboard report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildInfo {
    /// The release, e.g. `0.2.0`.
    pub version: &'static str,
    /// The short git commit it was built from, or `unknown`.
    pub commit: &'static str,
}

impl Default for BuildInfo {
    fn default() -> Self {
        BuildInfo {
            version: env!("CARGO_PKG_VERSION"),
            commit: "unknown",
        }
    }
}

/// The port of the Durable Streams listener `pico serve` opens beside the Pico one.
pub const DS_LISTEN_PORT_DEFAULT: u16 = 4438;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Protocol listener, e.g. `127.0.0.1:4437`.
    pub listen: String,
    /// What `listen` speaks.
    pub protocol: Protocol,
    /// A second listener speaking the other protocol on the same node and data (`--ds-listen`):
    /// Durable Streams beside a Pico `listen`, by default on [`DS_LISTEN_PORT_DEFAULT`].
    pub ds_listen: Option<String>,
    /// `--node-id`: names this node's segment keys (`segments/c<catalog id>/n<id>/...`) and, in a cluster,
    /// the node (default 1 there).
    pub node_id: Option<u32>,
    /// `--node-epoch`: this incarnation's fencing token (default: the start time in ms).
    pub node_epoch: Option<u64>,
    /// `--http-address`: the advertised base URL (default `http://{listen}` as bound).
    pub http_address: Option<String>,
    /// `--cluster-id`, reported by the admin API.
    pub cluster_id: String,
    /// `--routing local`: never redirect (a routing proxy in front, or one node).
    pub routing_local: bool,
    /// `--slots`: placement weight of this node among the cluster's (0: no new streams).
    pub slots: u64,
    /// `--lease-ms`: a cluster node that has not renewed its lease for this long is dead to
    /// the others, and its streams move to live nodes.
    pub lease_ms: u64,
    /// Admin listener (`/health`, `/ready`); `None` with `--no-admin`.
    pub admin_listen: Option<String>,
    /// `--meta-url`, e.g. `sqlite:./data/meta.db`.
    pub meta_url: String,
    /// `--storage`, e.g. `-2@file://./objects`.
    pub storage: String,
    /// Directory of the per-core write-ahead logs.
    pub wal_dir: PathBuf,
    /// `--backup-dir`: backups (`POST /admin/backup`) are written under it, nowhere else.
    pub backup_dir: PathBuf,
    /// Executors to run; 0 = one per available CPU.
    pub cores: usize,
    pub durability: Durability,
    /// Long-poll wait before answering 204.
    pub long_poll_timeout_ms: u64,
    /// SSE connection cap before the server ends the response.
    pub sse_max_duration_ms: u64,
    /// Default read budget per response (bytes).
    pub max_chunk_size: usize,
    /// Byte budget of a Durable Streams catch-up read (up to the tail within it).
    pub catch_up_read_size: usize,
    /// `--default-retention-age` and friends: the limits of a stream created without its own.
    pub default_retention: pico_meta::Retention,
    /// Largest accepted request body (bytes); larger → 413.
    pub max_body_size: usize,
    /// A request not received within this is `408`; an idle connection closes after it
    /// (`--request-timeout-sec`).
    pub request_timeout_ms: u64,
    /// A connection with an answer to send that makes no write progress for this long is
    /// closed (`--send-stall-timeout-sec`).
    pub send_stall_timeout_ms: u64,
    /// A segment seals at this size (bytes).
    pub segment_size: usize,
    /// ... or at this age (ms) once it holds data.
    pub segment_max_age_ms: u64,
    /// Listen backlog.
    pub backlog: u32,
    /// `Access-Control-Allow-Origin` sent on every protocol response (`--cors-origin`).
    pub cors_origin: String,
    /// Per core: bytes of appends not yet durable before `429` (`--max-in-flight-bytes`).
    pub in_flight_bytes_max: usize,
    /// Per core: bytes of read answers not yet written to their sockets before reads get
    /// `503` (`--max-unsent-bytes`).
    pub unsent_bytes_max: usize,
    /// Per core: bytes of sealed segments not yet uploaded before `429` (`--max-unuploaded-bytes`).
    pub unuploaded_bytes_max: usize,
    /// Idempotent producers the node keeps over all its streams (`--producers-max`).
    pub producers_max: usize,
    /// An idempotent producer idle this long is forgotten (`--producer-idle-expiry-sec`).
    pub producer_idle_expiry_sec: u64,
    /// Per core: uploaded segments kept in memory for reads (`--block-cache-size`).
    pub segment_cache_bytes: usize,
    /// On SIGINT/SIGTERM, `/ready` fails this long before the process exits.
    pub shutdown_drain_ms: u64,
    /// With object durability: the node's flush PUTs per second (`--object-puts-per-second`);
    /// every append that arrived while the previous PUT ran rides the next one.
    pub object_puts_per_second: u32,
    /// How often segment objects that no live stream needs are deleted (`--gc-interval-ms`).
    pub gc_interval_ms: u64,
    /// `--auth required`: bearer tokens from `auth_tokens` on every request.
    pub auth_required: bool,
    pub auth_tokens: Option<PathBuf>,
    /// Allow a non-loopback listener without auth.
    pub insecure_allow_remote: bool,
    /// `--webhook-allow-loopback`: webhooks may go to loopback hosts even though the node
    /// listens beyond loopback (they always may when every protocol listener is loopback).
    pub webhook_allow_loopback: bool,
    /// `--wal-salvage` (`pico_engine::EngineConfig::wal_salvage`).
    pub wal_salvage: bool,
    /// PEM certificate chain and private key: serve HTTPS (ALPN h2, http/1.1) on every listener.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Called on the main thread once every core serves (what the start loaded is freed by
    /// then): `pico serve` hands freed memory back to the operating system there. The stop
    /// signals are blocked on that thread, and so on any thread it starts.
    pub on_serving: Option<fn()>,
    /// The version and commit reported (`pico serve` sets the commit it was built from).
    pub build: BuildInfo,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:4437".into(),
            protocol: Protocol::Pico,
            ds_listen: Some(format!("127.0.0.1:{DS_LISTEN_PORT_DEFAULT}")),
            node_id: None,
            node_epoch: None,
            http_address: None,
            cluster_id: "picomq".into(),
            routing_local: false,
            slots: 1,
            lease_ms: 6_000,
            admin_listen: Some("127.0.0.1:9090".into()),
            meta_url: "sqlite:./data/meta.db".into(),
            storage: "-2@file://./objects".into(),
            wal_dir: PathBuf::from("./data/wal"),
            backup_dir: PathBuf::from("./data/backups"),
            cores: 0,
            durability: Durability::Local,
            long_poll_timeout_ms: 25_000,
            sse_max_duration_ms: 55_000,
            max_chunk_size: 64 * 1024,
            catch_up_read_size: pico_engine::limits::CATCH_UP_READ_BYTES_DEFAULT,
            default_retention: Default::default(),
            max_body_size: crate::limits::BODY_BYTES_MAX_DEFAULT,
            request_timeout_ms: crate::limits::REQUEST_TIMEOUT_SEC_DEFAULT * 1000,
            send_stall_timeout_ms: crate::limits::SEND_STALL_TIMEOUT_SEC_DEFAULT * 1000,
            segment_size: 8 * 1024 * 1024,
            segment_max_age_ms: 2_000,
            backlog: 1024,
            cors_origin: "*".into(),
            in_flight_bytes_max: pico_engine::limits::IN_FLIGHT_BYTES_PER_CORE_DEFAULT,
            unsent_bytes_max: crate::limits::UNSENT_ANSWER_BYTES_PER_CORE_DEFAULT,
            unuploaded_bytes_max: pico_engine::limits::UNUPLOADED_BYTES_PER_CORE_DEFAULT,
            producers_max: pico_engine::limits::PRODUCERS_PER_NODE_DEFAULT,
            producer_idle_expiry_sec: pico_engine::limits::PRODUCER_IDLE_EXPIRY_SEC_DEFAULT,
            segment_cache_bytes: 64 * 1024 * 1024,
            shutdown_drain_ms: 0,
            gc_interval_ms: 5_000,
            object_puts_per_second: pico_engine::limits::OBJECT_PUTS_PER_SECOND_DEFAULT,
            auth_required: false,
            auth_tokens: None,
            insecure_allow_remote: false,
            webhook_allow_loopback: false,
            wal_salvage: false,
            tls_cert: None,
            tls_key: None,
            on_serving: None,
            build: BuildInfo::default(),
        }
    }
}

/// A flag the node cannot run with, named as it was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// `--segment-size` below [`pico_engine::limits::SEGMENT_BYTES_MIN`].
    SegmentSize { got: usize },
    /// Out of the range the engine allows.
    Setting(pico_engine::limits::SettingError),
    /// A flag that must be greater than 0.
    Zero { flag: &'static str },
    /// `--listen` and `--ds-listen` name one address.
    SameListen { addr: String },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::SegmentSize { got } => write!(
                f,
                "--segment-size must be at least {} KiB, got {got}",
                pico_engine::limits::SEGMENT_BYTES_MIN / 1024
            ),
            ConfigError::Setting(e) => e.fmt(f),
            ConfigError::Zero { flag } => write!(f, "{flag} must be greater than 0"),
            ConfigError::SameListen { addr } => write!(
                f,
                "--listen and --ds-listen are both {addr}: give the second protocol its own \
                 address, or --ds-listen off"
            ),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::Setting(e) => Some(e),
            _ => None,
        }
    }
}

impl From<pico_engine::limits::SettingError> for ConfigError {
    fn from(e: pico_engine::limits::SettingError) -> ConfigError {
        ConfigError::Setting(e)
    }
}

impl ServerConfig {
    /// Refuses values the node cannot run with, naming the flag, rather than quietly running
    /// with another value.
    pub fn check(&self) -> Result<(), ConfigError> {
        use pico_engine::limits::{
            at_least, within, GC_INTERVAL_MS_MIN, LEASE_MS_MIN, OBJECT_PUTS_PER_SECOND_MAX,
            OBJECT_PUTS_PER_SECOND_MIN, SEGMENT_BYTES_MIN, SEGMENT_MAX_AGE_MS_MIN,
        };
        if self.segment_size < SEGMENT_BYTES_MIN {
            return Err(ConfigError::SegmentSize {
                got: self.segment_size,
            });
        }
        at_least("--lease-ms", self.lease_ms, LEASE_MS_MIN)?;
        for (value, flag) in [
            (self.segment_max_age_ms, "--segment-max-age-ms"),
            (self.in_flight_bytes_max as u64, "--max-in-flight-bytes"),
            (self.unsent_bytes_max as u64, "--max-unsent-bytes"),
            (self.send_stall_timeout_ms, "--send-stall-timeout-sec"),
            (self.unuploaded_bytes_max as u64, "--max-unuploaded-bytes"),
            (self.producers_max as u64, "--producers-max"),
            (self.producer_idle_expiry_sec, "--producer-idle-expiry-sec"),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero { flag });
            }
        }
        // The engine refuses these too when it boots (EngineConfig::check); refused here
        // first, they are named by the flag that was given.
        within(
            "--object-puts-per-second",
            u64::from(self.object_puts_per_second),
            u64::from(OBJECT_PUTS_PER_SECOND_MIN),
            u64::from(OBJECT_PUTS_PER_SECOND_MAX),
        )?;
        at_least(
            "--segment-max-age-ms",
            self.segment_max_age_ms,
            SEGMENT_MAX_AGE_MS_MIN,
        )?;
        at_least("--gc-interval-ms", self.gc_interval_ms, GC_INTERVAL_MS_MIN)?;
        // Listeners share their port across cores (SO_REUSEPORT), so two of this node's on
        // one address would both bind and split its connections between the protocols.
        if let Some(ds_listen) = &self.ds_listen {
            if *ds_listen == self.listen && !ds_listen.ends_with(":0") {
                return Err(ConfigError::SameListen {
                    addr: ds_listen.clone(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_pass_and_values_below_a_floor_are_refused_not_raised() {
        assert_eq!(ServerConfig::default().check(), Ok(()));
        let small = ServerConfig {
            segment_size: pico_engine::limits::SEGMENT_BYTES_MIN - 1,
            ..ServerConfig::default()
        };
        assert!(small
            .check()
            .unwrap_err()
            .to_string()
            .starts_with("--segment-size must be at least"));
        let no_puts = ServerConfig {
            object_puts_per_second: 0,
            ..ServerConfig::default()
        };
        assert_eq!(
            no_puts.check().unwrap_err().to_string(),
            "--object-puts-per-second must be between 1 and 3500, got 0"
        );
    }
}
