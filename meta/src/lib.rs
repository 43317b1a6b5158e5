//! PicoMQ metadata log.
//!
//! The stream registry (name → id, content type, TTL/expiry, closed, created) and the segment
//! catalog ("segment X holds stream S offsets a..b at bytes p..q"). It is written per stream
//! lifecycle event and per sealed segment, **never per append**.
//!
//! The log lives in SQLite (`sqlite:<path>`, one file next to the node) or PostgreSQL
//! (`postgres://…`, a server several nodes can share). Both backends behave the same; only the
//! SQL they run differs.
//!
//! The store runs on its own plain thread (rusqlite's `Connection` and the synchronous
//! `postgres` client are blocking and must never run on a glommio executor). Callers talk to it through [`MetaStore`], a cheap `Clone + Send`
//! handle that sends commands over a crossbeam channel; every call returns a
//! `futures_channel::oneshot::Receiver` so an async caller on any executor can await the
//! answer without blocking its thread. The thread group-commits: it drains every command that
//! is waiting, applies them all in one transaction, then answers them in order.
//!
//! Module map: [`MetaUrl`] parsing lives here; the handle in `store`, the thread's loop in
//! `batch`, the commands in `command` and what each does (the same for both backends) in
//! `apply`; what a backend must do in `backend`; SQLite in `sqlite` (its schema and migrations
//! in `schema`), Postgres in `pg/`; every limit in `limits`; the packed run format in `runs`, the packed
//! producer-state format in `producers`; test support (a fresh Postgres database per test) in
//! `testing`, behind the `testing` feature that only the workspace's tests turn on.

use std::path::PathBuf;

mod apply;
mod backend;
pub mod backup;
mod batch;
mod cluster;
mod command;
mod compact;
mod consumers;
#[cfg(test)]
mod create_group_tests;
mod fence;
mod high_water;
mod limits;
mod log_limit;
mod page_checksums;
mod pg;
mod producers;
mod rows;
mod runs;
mod schema;
mod sqlite;
mod store;
#[doc(hidden)]
#[cfg(feature = "testing")]
pub mod testing;
mod verify;

/// Makes this process's SQLite connections write and check the catalog's page checksums, as
/// a node's do once it opens a catalog: for a tool or test that edits a catalog file itself
/// (pages it wrote without them would read as damaged).
pub fn use_page_checksums() -> Result<(), MetaError> {
    page_checksums::register()
}

pub use backend::{NodeId, NodeRow};
pub use cluster::{
    place, CatalogStream, ClusterState, PendingTransfer, StreamLoad, TransferAccepted,
};
pub use compact::{CompactOutcome, CompactRequest};
pub use consumers::{ConsumerList, ConsumerRead, ConsumerWrite, StoredConsumer};
pub use fence::{Fence, Ownership, SegmentFence};
pub use limits::MAX_BATCH_COMMANDS;
pub use log_limit::LogLimit;
pub use store::MetaStore;
pub use verify::{StoredObject, StoredRun};

/// A stream's configuration, fixed at create but for its retention: what the protocols give,
/// the engine keeps and the registry stores (whether the stream is closed is its state,
/// [`StreamRow::closed`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamConfig {
    /// The user's content type, verbatim (parameters included).
    pub content_type: String,
    /// Sliding idle expiry in seconds, if set: reads and appends move the deadline to
    /// `now + ttl`.
    pub ttl_sec: Option<u64>,
    /// Absolute expiry instant in Unix milliseconds, if set.
    pub expires_at_ms: Option<i64>,
    /// What the stream keeps (docs/api.md, Retention); changeable after create (a configure
    /// changes it; a re-create neither checks nor changes it).
    pub retention: Retention,
}

/// A stream's retention policy: each limit is off when `None`. Retention acts as a trim (the
/// start offset moves forward), at the granularity of the stream's stored chunks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Records whose timestamp is older than this become unreadable.
    pub age_ms: Option<u64>,
    /// The oldest records go once the stream stores more than this many bytes.
    pub bytes: Option<u64>,
    /// A stream with no records left and no write for this long is deleted.
    pub delete_on_empty_ms: Option<u64>,
}

impl Retention {
    pub fn is_off(&self) -> bool {
        *self == Retention::default()
    }
}

/// One registry row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamRow {
    /// Internal id, allocated by the store, never reused (also after a delete).
    pub id: u64,
    /// The stream name (the request path, e.g. `/streams/orders`).
    pub name: String,
    pub config: StreamConfig,
    /// Closed streams accept no more appends; permanent for the name.
    pub closed: bool,
    pub created_ms: i64,
    /// First readable offset: raised by [`MetaStore::trim_stream`], never lowered.
    pub start_offset: u64,
    /// Last read or append as last recorded by [`MetaStore::touch_stream`] (`created_ms` until
    /// then): where a sliding TTL's idle clock resumes after a restart.
    pub last_access_ms: i64,
    /// The stream was created as a fork of another: it shares that stream's records below
    /// the fork point.
    pub fork: Option<ForkRow>,
    /// Deleted while forks still read its records: gone for clients, kept for the forks
    /// (see [`MetaStore::soft_delete_stream`]).
    pub soft_deleted: bool,
}

/// Where a fork's inherited records come from: records `0..offset` of the source, plus the
/// first `partial_bytes` bytes of its record `offset` when non-zero (a fork inside a record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForkRow {
    pub source: String,
    pub source_id: u64,
    pub offset: u64,
    pub partial_bytes: u64,
}

/// The answer to [`MetaStore::create_stream`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateOutcome {
    /// The row now registered under the name: the new one, or the one that already existed.
    pub row: StreamRow,
    /// `true` when this call inserted the row, `false` when the name was already registered.
    pub created: bool,
    /// Which node owns the row (a cluster's; `None` on a single node) and at what epoch.
    pub ownership: Ownership,
}

/// A contiguous run of one stream's frames inside a segment object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentRun {
    pub first_offset: u64,
    /// One past the last offset in the run.
    pub next_offset: u64,
    /// Byte range of the run's frames inside the segment object.
    pub byte_start: u64,
    pub byte_end: u64,
}

impl SegmentRun {
    /// Joins `next` to this run when it continues it (its first offset and first byte are
    /// where this run ends): `true` if joined, `false` and nothing changed otherwise.
    pub fn extend(&mut self, next: &SegmentRun) -> bool {
        let follows = self.next_offset == next.first_offset && self.byte_end == next.byte_start;
        if follows {
            self.next_offset = next.next_offset;
            self.byte_end = next.byte_end;
        }
        follows
    }
}

/// What one segment holds of one stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentStreamEntry {
    pub stream_id: u64,
    /// Runs sorted by offset, non-overlapping.
    pub runs: Vec<SegmentRun>,
    /// Timestamp of the stream's last record in this segment (keeps timestamps monotonic
    /// across restarts).
    pub last_timestamp_ms: i64,
    /// The segment holds the stream's close marker.
    pub closed: bool,
    /// The state of every idempotent producer that appended to the stream in this segment,
    /// as of the segment's end (sorted by id). Recovery merges these across segments.
    pub producers: Vec<ProducerState>,
    /// The producer tuple of the request that closed the stream, when this segment holds a
    /// close made by an idempotent producer.
    pub closed_by: Option<ProducerState>,
    /// The last writer sequence (`Stream-Seq`) accepted in this segment; writer sequences
    /// only grow, so recovery keeps the largest across segments.
    pub writer_seq: Option<String>,
}

/// One idempotent producer's position: its epoch and the last request sequence it had
/// accepted.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProducerState {
    pub id: String,
    pub epoch: u64,
    pub seq: u64,
}

/// A sealed segment committed to the catalog after its object was stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentRecord {
    /// Object key in the data bucket, e.g. `segments/0001732890000000-00-0000000000000003.seg`.
    pub key: String,
    pub size_bytes: u64,
    pub created_ms: i64,
    pub streams: Vec<SegmentStreamEntry>,
}

/// Everything a node needs at startup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Live (not deleted) streams, any order.
    pub streams: Vec<StreamRow>,
    /// Committed segments in commit order; entries of deleted streams may be present.
    pub segments: Vec<SegmentRecord>,
    /// The highest stream id the catalog ever handed out, when read: a WAL frame of a higher
    /// one was written with another catalog.
    pub stream_ids_reached: Option<u64>,
    /// The catalog's identity, when read (schema version 13): its bucket holds a marker named
    /// by it.
    pub catalog_id: Option<String>,
}

/// Where the metadata log lives (`--meta-url`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetaUrl {
    /// `sqlite::memory:` or `sqlite://:memory:`.
    SqliteMemory,
    /// `sqlite:<path>` or `sqlite://<path>`; the parent directory is created.
    SqliteFile(PathBuf),
    /// `postgres://…` or `postgresql://…`, a libpq-style URL (`user:password@host:port/db`,
    /// query parameters such as `connect_timeout` or `options` included).
    Postgres(String),
}

/// What the catalog lists in the bucket ([`MetaStore::catalog_usage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CatalogUsage {
    /// Segment objects.
    pub segments: u64,
    /// Their sizes, summed.
    pub bytes: u64,
}

/// Records a segment commit refused after they were acknowledged (the stream moved to another
/// node, was deleted, or the writing node incarnation was superseded), kept for an operator:
/// the garbage collector keeps the segment until the entry is released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quarantined {
    pub segment_key: String,
    pub stream_id: u64,
    /// Where the records are in the segment object, as a catalog entry says it.
    pub runs: Vec<SegmentRun>,
    pub reason: String,
    /// Database clock, Unix ms.
    pub created_ms: i64,
}

/// Errors of the metadata store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaError {
    /// `--meta-url` could not be understood; the message says what is expected.
    BadUrl(String),
    /// The backend is not available in this build or configuration.
    Unsupported(String),
    /// The database (SQLite, the filesystem, Postgres or the connection to it) failed; the
    /// message carries the cause.
    Storage(String),
    /// The database's disk (or quota) is full: nothing was written. Heals by itself once
    /// space is freed.
    OutOfSpace(String),
    /// The metadata thread is gone (shutting down or crashed).
    Closed,
    /// A cluster write by a node that no longer owns the stream (another node took it over
    /// at a newer epoch), or by a node incarnation that a newer one superseded.
    Fenced(String),
    /// A cluster request the current state does not allow (a transfer to an unknown node, a
    /// node id already running at a newer epoch); the message says why.
    Rejected(String),
    /// What the request names does not exist.
    NotFound(String),
    /// A write whose transaction may or may not have committed: the answer to its COMMIT was
    /// lost and the server could not be asked in time. Neither a success nor a failure: the
    /// caller reads the state back before it relies on it.
    Unknown(String),
}

impl std::fmt::Display for MetaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetaError::BadUrl(m)
            | MetaError::Unsupported(m)
            | MetaError::Fenced(m)
            | MetaError::Rejected(m)
            | MetaError::NotFound(m) => f.write_str(m),
            MetaError::Storage(m) | MetaError::OutOfSpace(m) => write!(f, "metadata store: {m}"),
            MetaError::Unknown(m) => write!(f, "metadata store: outcome unknown: {m}"),
            MetaError::Closed => f.write_str("metadata store is shut down"),
        }
    }
}

impl std::error::Error for MetaError {}

impl MetaError {
    /// The same error, its message led by what was being done.
    pub(crate) fn doing(self, doing: &str) -> MetaError {
        match self {
            MetaError::Storage(m) => MetaError::Storage(format!("{doing}: {m}")),
            MetaError::OutOfSpace(m) => MetaError::OutOfSpace(format!("{doing}: {m}")),
            MetaError::Unknown(m) => MetaError::Unknown(format!("{doing}: {m}")),
            other => other,
        }
    }

    /// The message without the kind's own words.
    pub(crate) fn detail(&self) -> String {
        match self {
            MetaError::BadUrl(m)
            | MetaError::Unsupported(m)
            | MetaError::Storage(m)
            | MetaError::OutOfSpace(m)
            | MetaError::Fenced(m)
            | MetaError::Rejected(m)
            | MetaError::NotFound(m)
            | MetaError::Unknown(m) => m.clone(),
            MetaError::Closed => self.to_string(),
        }
    }
}

pub type Reply<T> = futures_channel::oneshot::Receiver<Result<T, MetaError>>;

/// Which stream of a name a tail seen now is, against the stream a position held by name was
/// counted in. Stream ids only grow (SQLite's `AUTOINCREMENT`, Postgres's identity column) and
/// a name is created again only after its delete committed, so of two streams of one name the
/// later has the larger id. Holders that may miss a delete (the reaper tells no one, a restart
/// loses what was not written yet, another node of a cluster served it) judge by this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeenStream {
    /// The position's own stream, or one side's id is not known: the counts compare as they are.
    Same,
    /// A later stream of the name: the position has processed nothing of it.
    Later,
    /// An earlier stream of the name (a report that raced its delete): no news of the
    /// position's stream.
    Earlier,
}

impl SeenStream {
    /// The stream whose id is `seen`, against the one a position counts in (`counted_in`).
    pub fn compare(counted_in: Option<u64>, seen: Option<u64>) -> SeenStream {
        match (counted_in, seen) {
            (Some(counted), Some(seen)) if seen > counted => SeenStream::Later,
            (Some(counted), Some(seen)) if seen < counted => SeenStream::Earlier,
            _ => SeenStream::Same,
        }
    }
}

/// The one error message for every `--meta-url` we cannot use, as the CLI spec fixes it.
fn bad_meta_url(url: &str) -> MetaError {
    MetaError::BadUrl(format!(
        "unsupported --meta-url \"{url}\": expected sqlite::memory:, sqlite:<path> or postgres://…"
    ))
}

impl MetaUrl {
    /// Parses a `--meta-url` value.
    ///
    /// `sqlite::memory:` and `sqlite://:memory:` are checked before the generic `sqlite:` forms
    /// because they would otherwise parse as a file literally named `:memory:`. A path is taken
    /// verbatim (`sqlite://./data/meta.db` is the relative path `./data/meta.db`,
    /// `sqlite:///var/lib/meta.db` the absolute one).
    pub fn parse(url: &str) -> Result<MetaUrl, MetaError> {
        if url == "sqlite::memory:" || url == "sqlite://:memory:" {
            return Ok(MetaUrl::SqliteMemory);
        }
        if let Some(rest) = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
        {
            if rest.is_empty() {
                return Err(bad_meta_url(url));
            }
            return Ok(MetaUrl::Postgres(url.to_string()));
        }
        let path = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"));
        match path {
            Some(path) if !path.is_empty() => Ok(MetaUrl::SqliteFile(PathBuf::from(path))),
            _ => Err(bad_meta_url(url)),
        }
    }
}

impl std::str::FromStr for MetaUrl {
    type Err = MetaError;

    fn from_str(url: &str) -> Result<MetaUrl, MetaError> {
        MetaUrl::parse(url)
    }
}

/// Prints the URL for logs; a Postgres password is masked so it never lands in a log file.
impl std::fmt::Display for MetaUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetaUrl::SqliteMemory => f.write_str("sqlite::memory:"),
            MetaUrl::SqliteFile(path) => write!(f, "sqlite:{}", path.display()),
            MetaUrl::Postgres(url) => f.write_str(&redact_password(url)),
        }
    }
}

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db`.
fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    // The userinfo ends at the last `@` before the first `/` of the path.
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    let Some(colon) = authority[..at].find(':') else {
        return url.to_string();
    };
    format!("{scheme}://{}:***{}", &authority[..colon], &rest[at..])
}

#[cfg(test)]
mod url_tests {
    use super::*;

    #[test]
    fn memory_forms() {
        assert_eq!(
            MetaUrl::parse("sqlite::memory:").unwrap(),
            MetaUrl::SqliteMemory
        );
        assert_eq!(
            MetaUrl::parse("sqlite://:memory:").unwrap(),
            MetaUrl::SqliteMemory
        );
    }

    #[test]
    fn file_forms() {
        let file = |p: &str| MetaUrl::SqliteFile(PathBuf::from(p));
        assert_eq!(
            MetaUrl::parse("sqlite:./data/meta.db").unwrap(),
            file("./data/meta.db")
        );
        assert_eq!(
            MetaUrl::parse("sqlite://./data/meta.db").unwrap(),
            file("./data/meta.db")
        );
        assert_eq!(MetaUrl::parse("sqlite:meta.db").unwrap(), file("meta.db"));
        assert_eq!(
            MetaUrl::parse("sqlite:///var/lib/meta.db").unwrap(),
            file("/var/lib/meta.db")
        );
        assert_eq!(
            MetaUrl::parse("sqlite:/var/lib/meta.db").unwrap(),
            file("/var/lib/meta.db")
        );
    }

    #[test]
    fn postgres_forms() {
        let url = "postgres://postgres:postgres@127.0.0.1:5432/picomq";
        assert_eq!(MetaUrl::parse(url).unwrap(), MetaUrl::Postgres(url.into()));
        let url = "postgresql://u@h/db";
        assert_eq!(MetaUrl::parse(url).unwrap(), MetaUrl::Postgres(url.into()));
    }

    #[test]
    fn rejected_forms() {
        for url in [
            "",
            "sqlite:",
            "sqlite://",
            "mysql://x",
            "postgres://",
            "./meta.db",
            "SQLITE:x",
        ] {
            match MetaUrl::parse(url) {
                Err(MetaError::BadUrl(message)) => assert_eq!(
                    message,
                    format!(
                        "unsupported --meta-url \"{url}\": expected sqlite::memory:, sqlite:<path> or postgres://…"
                    )
                ),
                other => panic!("{url:?} parsed as {other:?}"),
            }
        }
    }

    #[test]
    fn display_masks_the_password() {
        let url = MetaUrl::parse("postgres://postgres:secret@127.0.0.1:5432/picomq").unwrap();
        assert_eq!(
            url.to_string(),
            "postgres://postgres:***@127.0.0.1:5432/picomq"
        );
        let url = MetaUrl::parse("postgres://127.0.0.1/picomq").unwrap();
        assert_eq!(url.to_string(), "postgres://127.0.0.1/picomq");
        assert_eq!(MetaUrl::SqliteMemory.to_string(), "sqlite::memory:");
    }
}
