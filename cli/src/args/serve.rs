//! `pico serve`'s flags: listeners, storage, cluster, limits and TLS of a node.

use std::path::PathBuf;

use argh::{ArgsInfo, FromArgs};

use super::parse::*;

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "serve")]
/// Run a PicoMQ node.
pub struct ServeArgs {
    /// listener of the Pico protocol, or of Durable Streams with --protocol ds (default 127.0.0.1:4437) [env: PICO_LISTEN]
    #[argh(
        option,
        arg_name = "addr",
        default = "\"127.0.0.1:4437\".into()",
        from_str_fn(parse_socket_addr)
    )]
    pub listen: String,

    /// listener of the Durable Streams protocol beside the Pico one, same node and data, or off (default: the host of --listen, port 4438; port 0 when --listen's is 0; with --protocol ds, where --listen speaks Durable Streams, an extra Pico listener and none by default) [env: PICO_DS_LISTEN]
    #[argh(option, arg_name = "addr|off", from_str_fn(parse_listener_or_off))]
    pub ds_listen: Option<String>,

    /// admin listener address for /health and /ready (default 127.0.0.1:9090) [env: PICO_ADMIN_LISTEN]
    #[argh(
        option,
        arg_name = "addr",
        default = "\"127.0.0.1:9090\".into()",
        from_str_fn(parse_socket_addr)
    )]
    pub admin_listen: String,

    /// disable the admin listener and its probes [env: PICO_NO_ADMIN]
    #[argh(switch)]
    pub no_admin: bool,

    /// metadata store: sqlite:<path>, sqlite::memory: or postgres://... (default sqlite:./data/meta.db) [env: PICO_META_URL]
    #[argh(option, arg_name = "url", default = "\"sqlite:./data/meta.db\".into()")]
    pub meta_url: String,

    /// data bucket URI, <bucket id>@file://DIR or <bucket id>@s3://BUCKET?... (default -2@file://./objects) [env: PICO_STORAGE]
    #[argh(option, arg_name = "uri", default = "\"-2@file://./objects\".into()")]
    pub storage: String,

    /// directory of the per-core write-ahead logs (default ./data/wal) [env: PICO_WAL_DIR]
    #[argh(option, arg_name = "dir", default = "PathBuf::from(\"./data/wal\")")]
    pub wal_dir: PathBuf,

    /// directory that POST /admin/backup (pico admin backup) writes backups under; a backup's "to" names a new directory in it (default ./data/backups) [env: PICO_BACKUP_DIR]
    #[argh(
        option,
        arg_name = "dir",
        default = "PathBuf::from(\"./data/backups\")"
    )]
    pub backup_dir: PathBuf,

    /// executor cores to run, 0 = one per available CPU (default 0) [env: PICO_CORES]
    #[argh(option, arg_name = "n", default = "0")]
    pub cores: usize,

    /// when appends are acknowledged: local (after the WAL fsync), object (once stored in the bucket; survives losing the disk) or memory (no crash safety; tests and benchmarks) (default: object for s3:// storage or a postgres:// --meta-url, a cluster; local otherwise) [env: PICO_DURABILITY]
    #[argh(option, arg_name = "mode", from_str_fn(parse_durability))]
    pub durability: Option<pico_net::Durability>,

    /// with --durability object: the flush PUTs the whole node may make per second, the cost control; a core flushes its appends as soon as its previous PUT is done, within this budget (default 500) [env: PICO_OBJECT_PUTS_PER_SECOND]
    #[argh(option, arg_name = "n")]
    pub object_puts_per_second: Option<u32>,

    /// superseded by --object-puts-per-second, accepted for earlier scripts: N caps the node's flushes at 1000/N PUTs per second (1 to 1000) [env: PICO_OBJECT_FLUSH_MS]
    #[argh(option, arg_name = "ms")]
    pub object_flush_ms: Option<u64>,

    /// seconds a live read stays silent at most, both protocols: a long-poll answers, an idle SSE response sends a keep-alive; fractions allowed: 0.5 (default 25) [env: PICO_LONG_POLL_TIMEOUT_SEC]
    #[argh(
        option,
        arg_name = "secs",
        default = "25.0",
        from_str_fn(parse_seconds)
    )]
    pub long_poll_timeout_sec: f64,

    /// seconds before the server ends an SSE response and clients reconnect, fractions allowed (default 55) [env: PICO_SSE_MAX_DURATION_SEC]
    #[argh(
        option,
        arg_name = "secs",
        default = "55.0",
        from_str_fn(parse_seconds)
    )]
    pub sse_max_duration_sec: f64,

    /// default read budget per response and SSE chunk size, bytes or with KiB/MiB suffix; 0 = 64 KiB (default 65536) [env: PICO_MAX_CHUNK_SIZE]
    #[argh(option, arg_name = "size", default = "65536", from_str_fn(parse_size))]
    pub max_chunk_size: u64,

    /// byte budget of a Durable Streams catch-up read (GET without live): it answers up to the tail within it; at most 64MiB (default 4MiB) [env: PICO_CATCH_UP_READ_SIZE]
    #[argh(
        option,
        arg_name = "size",
        default = "4194304",
        from_str_fn(parse_size)
    )]
    pub catch_up_read_size: u64,

    /// retention age of streams created without one: older records are trimmed away; a duration such as 90s, 30m, 12h or 7d, 0 = off (default 0) [env: PICO_DEFAULT_RETENTION_AGE]
    #[argh(
        option,
        arg_name = "duration",
        default = "0",
        from_str_fn(parse_duration)
    )]
    pub default_retention_age: u64,

    /// retention size of streams created without one: their oldest records go beyond it; bytes or with KiB/MiB/GiB suffix, 0 = off (default 0) [env: PICO_DEFAULT_RETENTION_BYTES]
    #[argh(option, arg_name = "size", default = "0", from_str_fn(parse_size))]
    pub default_retention_bytes: u64,

    /// streams created without their own are deleted once empty with no write for this long; a duration, 0 = off (default 0) [env: PICO_DEFAULT_DELETE_ON_EMPTY]
    #[argh(
        option,
        arg_name = "duration",
        default = "0",
        from_str_fn(parse_duration)
    )]
    pub default_delete_on_empty: u64,

    /// largest accepted request body; larger gets 413 (default 8MiB) [env: PICO_MAX_BODY_SIZE]
    #[argh(
        option,
        arg_name = "size",
        default = "pico_net::BODY_BYTES_MAX_DEFAULT as u64",
        from_str_fn(parse_size)
    )]
    pub max_body_size: u64,

    /// seconds a client has to send a whole request (else 408) and an idle connection stays open, both HTTP versions, fractions allowed (default 120) [env: PICO_REQUEST_TIMEOUT_SEC]
    #[argh(
        option,
        arg_name = "secs",
        default = "120.0",
        from_str_fn(parse_seconds)
    )]
    pub request_timeout_sec: f64,

    /// seconds a connection may go without any write progress while it has an answer to send (a client that stopped reading, an HTTP/2 window that never opens); then it is closed, both HTTP versions, TLS and SSE alike, fractions allowed (default 30) [env: PICO_SEND_STALL_TIMEOUT_SEC]
    #[argh(
        option,
        arg_name = "secs",
        default = "30.0",
        from_str_fn(parse_seconds)
    )]
    pub send_stall_timeout_sec: f64,

    /// a storage segment seals at this size (default 8MiB, at least 64KiB) [env: PICO_SEGMENT_SIZE]
    #[argh(
        option,
        arg_name = "size",
        default = "8 << 20",
        from_str_fn(parse_size)
    )]
    pub segment_size: u64,

    /// a storage segment also seals at this age in milliseconds once it holds data (default 2000) [env: PICO_SEGMENT_MAX_AGE_MS]
    #[argh(option, arg_name = "ms", default = "2000")]
    pub segment_max_age_ms: u64,

    /// listen backlog, clamped by the kernel to somaxconn (default 1024) [env: PICO_BACKLOG]
    #[argh(option, arg_name = "n", default = "1024")]
    pub backlog: u32,

    /// cluster-unique node id (positive; default 1 with a postgres:// --meta-url); names the node and its segment objects (segments/c<catalog id>/n<id>/) [env: PICO_NODE_ID]
    #[argh(option, arg_name = "id")]
    pub node_id: Option<i32>,

    /// fencing token of this process incarnation, must grow across restarts (default: the start time in ms) [env: PICO_NODE_EPOCH]
    #[argh(option, arg_name = "epoch")]
    pub node_epoch: Option<u64>,

    /// advertised base URL other nodes send clients to in 307 redirects (default http://{listen} as bound) [env: PICO_HTTP_ADDRESS]
    #[argh(option, arg_name = "url")]
    pub http_address: Option<String>,

    /// cluster id reported by the admin API (default picomq) [env: PICO_CLUSTER_ID]
    #[argh(option, arg_name = "id")]
    pub cluster_id: Option<String>,

    /// redirect: requests for other nodes' streams get 307 to their owner; local: never redirect, for a routing proxy in front (default redirect) [env: PICO_ROUTING]
    #[argh(option, arg_name = "mode", from_str_fn(parse_routing))]
    pub routing: Option<String>,

    /// placement weight of this node: new streams and taken-over ones spread across live nodes by slots; 0 takes none (default 1) [env: PICO_SLOTS]
    #[argh(option, arg_name = "n")]
    pub slots: Option<u32>,

    /// cluster lease in milliseconds: a node that has not renewed it for this long is dead to the others, which take its streams over (default 6000, at least 300) [env: PICO_LEASE_MS]
    #[argh(option, arg_name = "ms", default = "6000")]
    pub lease_ms: u64,

    /// on SIGINT/SIGTERM, seconds /ready answers 503 before the process exits (default 0) [env: PICO_SHUTDOWN_DRAIN_SEC]
    #[argh(option, arg_name = "secs")]
    pub shutdown_drain_sec: Option<u64>,

    /// off, or required: every request needs an Authorization: Bearer token from --auth-tokens (default off) [env: PICO_AUTH]
    #[argh(option, arg_name = "mode", default = "false", from_str_fn(parse_auth))]
    pub auth: bool,

    /// token file, one `token prefix permissions` per line (permissions: read,append,admin); reloaded on SIGHUP [env: PICO_AUTH_TOKENS]
    #[argh(option, arg_name = "file")]
    pub auth_tokens: Option<PathBuf>,

    /// allow listening on a non-loopback address with --auth off [env: PICO_INSECURE_ALLOW_REMOTE]
    #[argh(switch)]
    pub insecure_allow_remote: bool,

    /// let Durable Streams webhooks go to loopback hosts (localhost, 127.0.0.0/8, ::1) although the node listens beyond loopback; without it they may only when every protocol listener is loopback [env: PICO_WEBHOOK_ALLOW_LOOPBACK]
    #[argh(switch)]
    pub webhook_allow_loopback: bool,

    /// start past a damaged or missing WAL file, or a bucket without the catalog's segments: keep what reads in order, close each stream that lost records at its first lost offset, move a damaged file to <wal-dir>/damaged/ with a report (without it the node refuses to start) [env: PICO_WAL_SALVAGE]
    #[argh(switch)]
    pub wal_salvage: bool,

    /// PEM certificate chain: serve HTTPS (ALPN h2 and http/1.1) on every listener; needs --tls-key [env: PICO_TLS_CERT]
    #[argh(option, arg_name = "file")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert [env: PICO_TLS_KEY]
    #[argh(option, arg_name = "file")]
    pub tls_key: Option<PathBuf>,

    /// the Access-Control-Allow-Origin sent on every response (default *) [env: PICO_CORS_ORIGIN]
    #[argh(option, arg_name = "origin", default = "String::from(\"*\")")]
    pub cors_origin: String,

    /// per core: bytes of appends not yet durable before appends get 429 (default 64MiB) [env: PICO_MAX_IN_FLIGHT_BYTES]
    #[argh(option, arg_name = "size", from_str_fn(parse_size))]
    pub max_in_flight_bytes: Option<u64>,

    /// idempotent producers the node keeps over all its streams (4096 per stream); a new one past either gets 429 (default 250000) [env: PICO_PRODUCERS_MAX]
    #[argh(option, arg_name = "n")]
    pub producers_max: Option<usize>,

    /// an idempotent producer that has not written for this long is forgotten, in seconds (default 604800: 7 days) [env: PICO_PRODUCER_IDLE_EXPIRY_SEC]
    #[argh(option, arg_name = "sec")]
    pub producer_idle_expiry_sec: Option<u64>,
    /// per core: bytes of read answers built but not yet written to their sockets (readers that read slowly or never) before reads get 503 with Retry-After (default 64MiB) [env: PICO_MAX_UNSENT_BYTES]
    #[argh(option, arg_name = "size", from_str_fn(parse_size))]
    pub max_unsent_bytes: Option<u64>,

    /// how often segment objects that only hold deleted, expired or trimmed data are deleted, in ms (default 5000) [env: PICO_GC_INTERVAL_MS]
    #[argh(option, arg_name = "ms", default = "5000")]
    pub gc_interval_ms: u64,

    /// per core: bytes of sealed segments not yet in object storage before appends get 429 (default 512MiB) [env: PICO_MAX_UNUPLOADED_BYTES]
    #[argh(option, arg_name = "size", from_str_fn(parse_size))]
    pub max_unuploaded_bytes: Option<u64>,

    /// accepted for compatibility with PicoMQ 0.1 scripts; has no effect, since 0.1's WAL bucket URI has no counterpart here: the WAL is local files in --wal-dir [env: PICO_WAL]
    #[argh(option, arg_name = "uri")]
    pub wal: Option<String>,

    /// accepted for compatibility with PicoMQ 0.1 scripts; has no effect, since this engine has no log cache to size (uploaded segments are cached per --block-cache-size) [env: PICO_WAL_CACHE_SIZE]
    #[argh(option, arg_name = "size", from_str_fn(parse_size))]
    pub wal_cache_size: Option<u64>,

    /// per core: bytes of uploaded segments kept in memory for reads (default 64MiB) [env: PICO_BLOCK_CACHE_SIZE]
    #[argh(option, arg_name = "size", from_str_fn(parse_size))]
    pub block_cache_size: Option<u64>,

    /// accepted for compatibility with PicoMQ 0.1 scripts; has no effect, since segments are sealed and uploaded at --segment-size, the closest equivalent [env: PICO_WAL_UPLOAD_THRESHOLD]
    #[argh(option, arg_name = "size", from_str_fn(parse_size))]
    pub wal_upload_threshold: Option<u64>,

    /// accepted for compatibility with PicoMQ 0.1 scripts; has no effect, since segments are sealed and uploaded by age at --segment-max-age-ms, the closest equivalent [env: PICO_WAL_UPLOAD_INTERVAL_MS]
    #[argh(option, arg_name = "ms")]
    pub wal_upload_interval_ms: Option<u64>,

    /// log lines on stderr: text, or json (one object per line: ts, level, target, msg); RUST_LOG filters them (default text) [env: PICO_LOG_FORMAT]
    #[argh(
        option,
        arg_name = "format",
        default = "crate::logger::Format::Text",
        from_str_fn(parse_log_format)
    )]
    pub log_format: crate::logger::Format,

    /// TOML file of serve settings, keyed by flag name (docs/configuration.md); flags and PICO_* variables win over it [env: PICO_CONFIG_FILE]
    #[argh(option, arg_name = "file")]
    pub config_file: Option<PathBuf>,

    /// print the settings this node would start with as TOML, each with where it came from (flag, variable, config file or default), and exit without starting [env: PICO_PRINT_CONFIG]
    #[argh(switch)]
    pub print_config: bool,
}
