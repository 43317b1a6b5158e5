//! The command line, declared with argh: the global flags and the client commands here,
//! `serve`'s flags in `serve.rs`, the `config` and `admin` groups in `admin.rs`, the value
//! parsers in `parse.rs`.
//!
//! Every flag's doc text ends with `[env: PICO_<FLAG>]`: `argv::normalize` injects that variable
//! when the flag is absent, and a test checks that the text names the right variable.
//! Defaults are written in the doc text because argh does not print them.

mod admin;
mod parse;
mod serve;

use std::path::PathBuf;

use argh::{ArgsInfo, FromArgs};
use pico_client::Protocol;

pub use self::admin::*;
use self::parse::{parse_batch, parse_duration, parse_protocol, parse_size};
pub use self::serve::ServeArgs;

/// Client default when neither flag, environment nor profile says otherwise.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:4437";

#[derive(FromArgs, ArgsInfo, Debug)]
/// PicoMQ: durable streams over HTTP. Global flags may appear before or after the command;
/// every flag can also be set with the PICO_* variable shown next to it. pico --version (or
/// -V) prints the version and the commit it was built from.
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

    /// content type of each record (Durable Streams only, default the stream's own; Pico sends binary batches) [env: PICO_CONTENT_TYPE]
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
/// Print records as <position>TAB<body> until the reader is up to date (Durable Streams, which frames no records: one line per chunk read, at the offset after it).
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
