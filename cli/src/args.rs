//! The command line, declared with argh.
//!
//! Every flag's doc text ends with `[env: PICO_<FLAG>]`: `argv::normalize` injects that variable
//! when the flag is absent, and a test checks that the text names the right variable.
//! Defaults are written in the doc text because argh does not print them.

use std::path::PathBuf;

use argh::{ArgsInfo, FromArgs};
use pico_client::Protocol;

/// Client default when neither flag, environment nor profile says otherwise.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:4437";

#[derive(FromArgs, ArgsInfo, Debug)]
/// PicoMQ: durable streams over HTTP. Global flags may appear before or after the command;
/// every flag can also be set with the PICO_* variable shown next to it.
pub struct Cli {
    /// server base URL for client commands (default http://127.0.0.1:4437) [env: PICO_ENDPOINT]
    #[argh(option, arg_name = "url")]
    pub endpoint: Option<String>,

    /// wire protocol of client commands and of the listener started by serve: pico or ds (default pico) [env: PICO_PROTOCOL]
    #[argh(option, from_str_fn(parse_protocol))]
    pub protocol: Option<Protocol>,

    /// use cleartext HTTP/2 with prior knowledge (h2c) for client commands [env: PICO_HTTP2]
    #[argh(switch)]
    pub http2: bool,

    /// saved profile to take endpoint, protocol, http2, token and ca-cert defaults from (default: the config file's default profile) [env: PICO_PROFILE]
    #[argh(option, arg_name = "name")]
    pub profile: Option<String>,

    /// bearer token sent as Authorization on every client request (never printed) [env: PICO_TOKEN]
    #[argh(option, arg_name = "token")]
    pub token: Option<String>,

    /// PEM file of a CA certificate to trust (in addition to the system's) for https endpoints [env: PICO_CA_CERT]
    #[argh(option, arg_name = "file")]
    pub ca_cert: Option<PathBuf>,

    #[argh(subcommand)]
    pub command: Command,
}

// Parsed once per process, so the size of the serve variant costs nothing; argh cannot box it.
#[allow(clippy::large_enum_variant)]
#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand)]
pub enum Command {
    Serve(ServeArgs),
    Create(CreateArgs),
    Head(HeadArgs),
    Append(AppendArgs),
    Read(ReadArgs),
    Tail(TailArgs),
    Consume(ConsumeArgs),
    Ls(LsArgs),
    Close(CloseArgs),
    Delete(DeleteArgs),
    Trim(TrimArgs),
    Retention(RetentionArgs),
    Config(ConfigArgs),
    Bench(pico_bench::BenchArgs),
    Admin(AdminArgs),
    Cert(CertArgs),
}

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

    /// cluster-unique node id (positive; default 1 with a postgres:// --meta-url); names the node and its segment objects (segments/n<id>/) [env: PICO_NODE_ID]
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

    /// start past a damaged WAL file: keep what reads in order, close each stream that lost records at its first lost offset, move the file to <wal-dir>/damaged/ with a report (without it the node refuses to start) [env: PICO_WAL_SALVAGE]
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

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "create")]
/// Create a stream (idempotent); prints created=true or created=false on stderr.
pub struct CreateArgs {
    #[argh(positional)]
    /// stream name, e.g. /streams/orders
    pub stream: String,

    /// content type of the stream (default application/octet-stream) [env: PICO_CONTENT_TYPE]
    #[argh(option, arg_name = "type")]
    pub content_type: Option<String>,

    /// idle expiry in seconds: the whole stream is deleted after this long without reads or appends (HEAD does not count) [env: PICO_TTL]
    #[argh(option, arg_name = "secs")]
    pub ttl: Option<u64>,

    /// records older than this are trimmed away: a duration such as 90s, 30m, 12h or 7d; 0 = off even if the server has a default (Pico protocol) [env: PICO_RETENTION_AGE]
    #[argh(option, arg_name = "duration", from_str_fn(parse_duration))]
    pub retention_age: Option<u64>,

    /// the oldest records go once the stream stores more than this: bytes or with KiB/MiB/GiB suffix; 0 = off (Pico protocol) [env: PICO_RETENTION_BYTES]
    #[argh(option, arg_name = "size", from_str_fn(parse_size))]
    pub retention_bytes: Option<u64>,

    /// delete the stream once it holds no records and had no write for this long: a duration; 0 = off (Pico protocol) [env: PICO_DELETE_ON_EMPTY]
    #[argh(option, arg_name = "duration", from_str_fn(parse_duration))]
    pub delete_on_empty: Option<u64>,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "retention")]
/// Change a stream's retention (Pico protocol): each option given replaces that limit, 0 turns it off, the others stay; prints the policy after the change (age= bytes= delete_on_empty=, - when off).
pub struct RetentionArgs {
    #[argh(positional)]
    /// stream name
    pub stream: String,

    /// records older than this are trimmed away: a duration such as 90s, 30m, 12h or 7d; 0 = off [env: PICO_AGE]
    #[argh(option, arg_name = "duration", from_str_fn(parse_duration))]
    pub age: Option<u64>,

    /// the oldest records go once the stream stores more than this: bytes or with KiB/MiB/GiB suffix; 0 = off [env: PICO_BYTES]
    #[argh(option, arg_name = "size", from_str_fn(parse_size))]
    pub bytes: Option<u64>,

    /// delete the stream once it holds no records and had no write for this long: a duration; 0 = off [env: PICO_DELETE_ON_EMPTY]
    #[argh(option, arg_name = "duration", from_str_fn(parse_duration))]
    pub delete_on_empty: Option<u64>,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "head")]
/// Print a stream's start, next position, closed flag and content type.
pub struct HeadArgs {
    #[argh(positional)]
    /// stream name
    pub stream: String,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "append")]
/// Append stdin, one record per line, in batches of up to 1000 records or 1MiB sent as the input comes (a batch waits at most 5 ms for more); prints one summary line on stderr: records, bytes, requests, time, rate, start=<first> next=<after the last>. With --batch N, PicoMQ 0.1's behaviour: groups of N lines and start=<s> next=<n> per request instead.
pub struct AppendArgs {
    #[argh(positional)]
    /// stream name
    pub stream: String,

    /// content type of each record (Durable Streams only; Pico sends binary batches) [env: PICO_CONTENT_TYPE]
    #[argh(option, arg_name = "type")]
    pub content_type: Option<String>,

    /// the batching of PicoMQ 0.1: exactly N lines per request (the last may hold fewer), no time limit, start=<s> next=<n> per request on stderr and no summary; Durable Streams takes only 1 [env: PICO_BATCH]
    #[argh(option, arg_name = "n", from_str_fn(parse_batch))]
    pub batch: Option<usize>,

    /// most records per request, 1 to 100000 (default 1000; 1 with Durable Streams, which appends one message per request) [env: PICO_BATCH_RECORDS]
    #[argh(option, arg_name = "n")]
    pub batch_records: Option<usize>,

    /// most bytes per request, at most 8MiB (the server's default --max-body-size); a longer line is sent alone (default 1MiB) [env: PICO_BATCH_BYTES]
    #[argh(option, arg_name = "size", from_str_fn(parse_size))]
    pub batch_bytes: Option<u64>,

    /// milliseconds a batch waits for more input after its first record before it is sent, at most 60000 (default 5) [env: PICO_LINGER_MS]
    #[argh(option, arg_name = "ms")]
    pub linger_ms: Option<u64>,

    /// one record per request, each sent as soon as its line is read (the same as --batch-records 1) [env: PICO_NO_BATCH]
    #[argh(switch)]
    pub no_batch: bool,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "read")]
/// Print records as <position>TAB<body> until the reader is up to date.
pub struct ReadArgs {
    #[argh(positional)]
    /// stream name
    pub stream: String,

    /// position to start from: a sequence (Pico) or an offset (Durable Streams); -1 is the beginning (the default), now the tail [env: PICO_FROM]
    #[argh(option, arg_name = "pos")]
    pub from: Option<String>,

    /// after catching up, keep following new records with long-polls until the stream is closed [env: PICO_FOLLOW]
    #[argh(switch, short = 'f')]
    pub follow: bool,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "consume")]
/// Read streams as a named consumer the server remembers (Pico protocol): prints records, acknowledges each page after printing it (at least once), resumes where the consumer stopped and follows live; with --group, members of one consumer share its streams.
pub struct ConsumeArgs {
    #[argh(positional)]
    /// the streams the consumer reads (the same ones on every run: the server keeps them with the consumer)
    pub streams: Vec<String>,

    /// the consumer's name, a path such as /billing/invoicer [env: PICO_CONSUMER]
    #[argh(option, arg_name = "name")]
    pub consumer: String,

    /// make the consumer a group and join it: each stream is read by one member at a time, and streams move when members join, leave or go silent [env: PICO_GROUP]
    #[argh(switch)]
    pub group: bool,

    /// this member's name in a group (default: host name and process id) [env: PICO_MEMBER]
    #[argh(option, arg_name = "name")]
    pub member: Option<String>,

    /// lease of the consumer or member in ms: unheard of for that long, it is released and its streams move (default 30000; set at the first registration) [env: PICO_LEASE_TTL_MS]
    #[argh(option, arg_name = "ms")]
    pub lease_ttl_ms: Option<u64>,

    /// stop after this many records, acknowledged (default: follow until every stream is closed) [env: PICO_COUNT]
    #[argh(option, arg_name = "n")]
    pub count: Option<u64>,

    /// records read, printed and acknowledged at a time: what a crash or a hand-over may print again, per stream (default 100) [env: PICO_PAGE_RECORDS]
    #[argh(option, arg_name = "n", default = "100")]
    pub page_records: u64,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "tail")]
/// Print records appended from now on, waiting for them with long-polls.
pub struct TailArgs {
    #[argh(positional)]
    /// stream name
    pub stream: String,

    /// keep waiting for new records until the stream is closed [env: PICO_FOLLOW]
    #[argh(switch, short = 'f')]
    pub follow: bool,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "close")]
/// Close a stream for writers; prints closed next=<pos> on stderr.
pub struct CloseArgs {
    #[argh(positional)]
    /// stream name
    pub stream: String,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "delete")]
/// Delete a stream and its records; prints deleted=true or deleted=false on stderr.
pub struct DeleteArgs {
    #[argh(positional)]
    /// stream name
    pub stream: String,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "ls")]
/// List streams (Pico protocol): <name> start=<s> next=<n> closed=<bool> per line. Any node of a cluster lists every stream of the cluster (taken-over ones included); --owners adds owner=<node id>.
pub struct LsArgs {
    /// list only names starting with this (default /) [env: PICO_PREFIX]
    #[argh(option, arg_name = "prefix")]
    pub prefix: Option<String>,

    /// at most this many streams, 0 = the server's default of 1000 (default 0) [env: PICO_LIMIT]
    #[argh(option, arg_name = "n", default = "0")]
    pub limit: u64,

    /// also print owner=<node id> per stream: the cluster node that serves it (- on a single node) [env: PICO_OWNERS]
    #[argh(switch)]
    pub owners: bool,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "trim")]
/// Drop the records below a position (Pico protocol); prints trimmed start=<s> on stderr.
pub struct TrimArgs {
    #[argh(positional)]
    /// stream name
    pub stream: String,

    /// first position to keep; clamped to the stream's tail [env: PICO_SEQ]
    #[argh(option, arg_name = "n")]
    pub seq: u64,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "cert")]
/// Make a local CA and a server certificate it signed, for TLS in development: ca.pem for clients (--ca-cert, curl --cacert), cert.pem and key.pem for pico serve --tls-cert/--tls-key.
pub struct CertArgs {
    /// directory for ca.pem, ca-key.pem, cert.pem and key.pem; existing files are never replaced (default ./certs) [env: PICO_DIR]
    #[argh(option, arg_name = "dir", default = "PathBuf::from(\"./certs\")")]
    pub dir: PathBuf,

    /// a DNS name or IP address the server is reached at; repeat it or separate with commas (default localhost, 127.0.0.1 and ::1) [env: PICO_HOST]
    #[argh(option, arg_name = "name")]
    pub host: Vec<String>,

    /// days the certificates are valid, 1 to 3650 (default 365) [env: PICO_DAYS]
    #[argh(option, arg_name = "n", default = "365")]
    pub days: u32,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "config")]
/// Manage saved connection profiles (the file at `pico config path`, or $PICO_CONFIG).
pub struct ConfigArgs {
    #[argh(subcommand)]
    pub command: ConfigCommand,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand)]
pub enum ConfigCommand {
    Set(ConfigSetArgs),
    Get(ConfigGetArgs),
    Ls(ConfigLsArgs),
    Rm(ConfigRmArgs),
    Use(ConfigUseArgs),
    Path(ConfigPathArgs),
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "set")]
/// Save the given global flags (--endpoint, --protocol, --http2, --token, --ca-cert) into a profile; plain commands use it only with --profile NAME, or once it is the default (--default here, or pico config use NAME).
pub struct ConfigSetArgs {
    #[argh(positional)]
    /// profile name
    pub name: String,

    /// also make it the default profile, which commands without --profile use [env: PICO_DEFAULT]
    #[argh(switch)]
    pub default: bool,

    /// save http2 = false in the profile [env: PICO_NO_HTTP2]
    #[argh(switch)]
    pub no_http2: bool,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "get")]
/// Print a profile as <name>TAB<endpoint> <protocol> <http2> (- when unset), then token=(saved) and ca_cert=<path> when saved; default: the default profile.
pub struct ConfigGetArgs {
    #[argh(positional)]
    /// profile name
    pub name: Option<String>,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "ls")]
/// List the saved profiles, marking the default one.
pub struct ConfigLsArgs {}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "rm")]
/// Remove a profile.
pub struct ConfigRmArgs {
    #[argh(positional)]
    /// profile name
    pub name: String,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "use")]
/// Make a profile the default.
pub struct ConfigUseArgs {
    #[argh(positional)]
    /// profile name
    pub name: String,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "path")]
/// Print the path of the config file.
pub struct ConfigPathArgs {}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "admin")]
/// Inspect and steer a node through its admin listener; ignores profiles and --endpoint, uses --token and --ca-cert.
pub struct AdminArgs {
    /// admin listener base URL (default http://127.0.0.1:9090) [env: PICO_ADMIN_ENDPOINT]
    #[argh(option, arg_name = "url")]
    pub admin_endpoint: Option<String>,

    /// print the answer as pretty JSON on stdout instead of formatted lines [env: PICO_JSON]
    #[argh(switch)]
    pub json: bool,

    #[argh(subcommand)]
    pub command: AdminCommand,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand)]
pub enum AdminCommand {
    Cluster(AdminClusterArgs),
    Nodes(AdminNodesArgs),
    Stream(AdminStreamArgs),
    Transfer(AdminTransferArgs),
    SetSlots(AdminSetSlotsArgs),
    Quarantine(AdminQuarantineArgs),
    Backup(AdminBackupArgs),
    Restore(AdminRestoreArgs),
    Checkpoint(AdminCheckpointArgs),
    GcHold(AdminGcHoldArgs),
    GcRelease(AdminGcReleaseArgs),
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "checkpoint")]
/// Store and commit what only the node's WAL holds (a cluster backup's step, docs/backup.md); prints the time it started and ended.
pub struct AdminCheckpointArgs {
    /// give up after this many seconds (default 3600) [env: PICO_TIMEOUT_SEC]
    #[argh(option, arg_name = "secs")]
    pub timeout_sec: Option<u64>,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "gc-hold")]
/// Hold the node's garbage collector (a cluster backup's step, docs/backup.md): it deletes no object until the hold runs out or gc-release; prints held=true until=<ms>.
pub struct AdminGcHoldArgs {
    /// how long the hold lasts at most, 1 to 86400 seconds [env: PICO_SECONDS]
    #[argh(option, arg_name = "secs")]
    pub seconds: u64,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "gc-release")]
/// Release the hold gc-hold took; prints held=false.
pub struct AdminGcReleaseArgs {}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "backup")]
/// Back the node up while it serves (docs/backup.md): every append acknowledged before the command reached the node, in a new directory under the node's --backup-dir; prints the cut and counts.
pub struct AdminBackupArgs {
    /// the backup's directory, new or empty, under the node's --backup-dir: a name relative to it, or an absolute path inside it [env: PICO_TO]
    #[argh(option, arg_name = "dir")]
    pub to: std::path::PathBuf,

    /// give up (no manifest is written) after this many seconds (default 3600, at most 86400) [env: PICO_TIMEOUT_SEC]
    #[argh(option, arg_name = "secs")]
    pub timeout_sec: Option<u64>,

    /// read objects from the node's bucket at most this fast (default: no limit) [env: PICO_MAX_BYTES_PER_SECOND]
    #[argh(option, arg_name = "n")]
    pub max_bytes_per_second: Option<u64>,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "restore")]
/// Lay a backup out for a new node (runs here, not through the admin listener): checks the manifest and every object, then prints the pico serve flags to start it.
pub struct AdminRestoreArgs {
    /// the backup directory (refused without its manifest.json: an unfinished backup) [env: PICO_FROM]
    #[argh(option, arg_name = "dir")]
    pub from: std::path::PathBuf,

    /// a new or empty directory for the node's catalog (meta.db), WAL directory (wal/) and, without --storage, its bucket (objects/) [env: PICO_TO]
    #[argh(option, arg_name = "dir")]
    pub to: std::path::PathBuf,

    /// put the objects in this bucket instead, --storage's syntax (<id>@file://DIR or <id>@s3://BUCKET?...); it must hold no objects [env: PICO_STORAGE]
    #[argh(option, arg_name = "uri")]
    pub storage: Option<String>,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "quarantine")]
/// Records a segment commit refused after they were acknowledged, kept for an operator.
pub struct AdminQuarantineArgs {
    #[argh(subcommand)]
    pub command: QuarantineCommand,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand)]
pub enum QuarantineCommand {
    Ls(QuarantineLsArgs),
    Export(QuarantineExportArgs),
    Release(QuarantineReleaseArgs),
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "ls")]
/// Print one line per quarantined entry: segment, stream id, offsets, reason.
pub struct QuarantineLsArgs {}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "export")]
/// Print an entry's records, one JSON object per line (offset, timestampMs, headers, body or bodyBase64).
pub struct QuarantineExportArgs {
    #[argh(positional)]
    /// segment key, as `ls` prints it
    pub segment: String,
    #[argh(positional)]
    /// stream id, as `ls` prints it
    pub stream_id: u64,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "release")]
/// Drop an entry (export it first): its segment may then be garbage-collected.
pub struct QuarantineReleaseArgs {
    #[argh(positional)]
    /// segment key, as `ls` prints it
    pub segment: String,
    #[argh(positional)]
    /// stream id, as `ls` prints it
    pub stream_id: u64,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "cluster")]
/// Print the node's view of the cluster: identity, counts and pending transfers.
pub struct AdminClusterArgs {}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "nodes")]
/// Print one line per node ever registered: node=<id> epoch=<incarnation, grows at each start> address=<Pico listener URL> slots=<placement weight> opening=<streams it owns now> placed=<always 0> state=<live: holds its lease; expired: stopped renewing it (killed, paused or cut off), its streams move to live nodes once the lease lapsed; left: stopped cleanly and handed its streams over> lease=<+4.2s: expires in 4.2 s (renewed every third of --lease-ms); -12.3s: lapsed 12.3 s ago; -: none> and (this node) on the node asked. --json adds leaseExpiresAtMs, registeredAtMs and dsAddress.
pub struct AdminNodesArgs {}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "stream")]
/// Print a stream's registry entry: owner, state and committed offsets.
pub struct AdminStreamArgs {
    #[argh(positional)]
    /// stream name
    pub stream: String,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "transfer")]
/// Ask for a stream to move to another node; prints transfer accepted ... on stderr.
pub struct AdminTransferArgs {
    #[argh(positional)]
    /// stream name
    pub stream: String,

    /// id of the node to move the stream to [env: PICO_TO_NODE]
    #[argh(option, arg_name = "id")]
    pub to_node: i32,

    /// wait (up to 30 s) until the transfer has settled on the target node [env: PICO_WAIT]
    #[argh(switch)]
    pub wait: bool,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "set-slots")]
/// Change a node's placement weight; prints node=<id> slots=<n> on stderr.
pub struct AdminSetSlotsArgs {
    #[argh(positional)]
    /// node id
    pub node: i32,

    /// the new placement weight (0 = place no new streams there) [env: PICO_SLOTS]
    #[argh(option, arg_name = "n")]
    pub slots: u64,
}

/// Non-negative seconds, fractions allowed (`0.5`).
/// Durations in whole seconds: a plain number, or one with a unit (`90s`, `30m`, `12h`, `7d`).
pub fn parse_duration(value: &str) -> Result<u64, String> {
    let trimmed = value.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let bad = || format!("expected a duration such as 90s, 30m, 12h or 7d, got {value:?}");
    let number: u64 = digits.parse().map_err(|_| bad())?;
    let unit_secs = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    number
        .checked_mul(unit_secs)
        .ok_or_else(|| format!("duration {value:?} is too large"))
}

fn parse_seconds(value: &str) -> Result<f64, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 1e9)
        .ok_or_else(|| format!("expected seconds (e.g. 25 or 0.5), got {value:?}"))
}

fn parse_protocol(value: &str) -> Result<Protocol, String> {
    value.parse()
}

fn parse_durability(value: &str) -> Result<pico_net::Durability, String> {
    match value.to_ascii_lowercase().as_str() {
        "local" => Ok(pico_net::Durability::Local),
        "object" => Ok(pico_net::Durability::Object),
        "memory" => Ok(pico_net::Durability::Memory),
        _ => Err("expected local, object or memory".into()),
    }
}

fn parse_log_format(value: &str) -> Result<crate::logger::Format, String> {
    value.parse()
}

fn parse_auth(value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "off" => Ok(false),
        "required" => Ok(true),
        _ => Err("expected off or required".into()),
    }
}

fn parse_routing(value: &str) -> Result<String, String> {
    match value {
        "redirect" | "local" => Ok(value.into()),
        _ => Err("expected redirect or local".into()),
    }
}

fn parse_batch(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("the batch size must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err("expected a positive number".into()),
    }
}

/// `HOST:PORT` with a numeric port. Host names are allowed (`localhost:4437`); resolving and
/// binding are the server's job, which reports failures in its own words.
pub fn parse_socket_addr(value: &str) -> Result<String, String> {
    if value.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(value.into());
    }
    match value.rsplit_once(':') {
        Some((host, port))
            if !host.is_empty() && !host.contains(':') && port.parse::<u16>().is_ok() =>
        {
            Ok(value.into())
        }
        _ => Err("expected HOST:PORT, e.g. 127.0.0.1:4437".into()),
    }
}

/// `--ds-listen`: `HOST:PORT`, or `off` for no second listener.
pub fn parse_listener_or_off(value: &str) -> Result<String, String> {
    if value.eq_ignore_ascii_case("off") {
        return Ok("off".into());
    }
    parse_socket_addr(value).map_err(|e| format!("{e}, or off"))
}

/// Byte sizes: a plain number, or one with a binary suffix (`64KiB`, `8MiB`, `1G`; `K`, `KB`
/// and `KiB` all mean 1024, as cache and segment sizes are customarily powers of two).
pub fn parse_size(value: &str) -> Result<u64, String> {
    let trimmed = value.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(split);
    let bad = || format!("expected a size such as 65536, 64KiB or 8MiB, got {value:?}");
    let number: u64 = digits.parse().map_err(|_| bad())?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(bad()),
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("size {value:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(90));
        assert_eq!(parse_duration("90s"), Ok(90));
        assert_eq!(parse_duration("30m"), Ok(1800));
        assert_eq!(parse_duration("12h"), Ok(43_200));
        assert_eq!(parse_duration("7d"), Ok(604_800));
        assert_eq!(parse_duration("0"), Ok(0));
        for bad in ["", "d", "7w", "-1d", "1.5h", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert!(
            parse_duration("213503982334602d").is_err(),
            "overflows u64 seconds"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("8 MiB"), Ok(8 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("0"), Ok(0));
        assert!(parse_size("").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("18446744073709551615G").is_err());
    }

    #[test]
    fn socket_addrs() {
        for ok in ["127.0.0.1:4437", "[::1]:80", "localhost:9090", "0.0.0.0:0"] {
            assert!(parse_socket_addr(ok).is_ok(), "{ok}");
        }
        for bad in ["4437", "127.0.0.1", ":80", "host:port", "::1:80", "h:70000"] {
            assert!(parse_socket_addr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn batch_zero_is_rejected() {
        assert!(parse_batch("0").is_err());
        assert_eq!(parse_batch("100"), Ok(100));
    }
}
