//! PicoMQ object storage.
//!
//! Sealed segments are stored as objects in a bucket: an S3-compatible store (`s3://`) or a
//! directory (`file://`). All object I/O runs on one dedicated **upload thread** with its own
//! small tokio current-thread runtime; glommio cores never block on it. Callers use
//! [`ObjectStore`], a cheap `Clone + Send` handle that sends requests over an unbounded channel
//! (sending never blocks and needs no runtime) and returns `futures_channel::oneshot::Receiver`s
//! that any executor can await.
//!
//! `s3://` buckets: `<id>@s3://BUCKET?region=R&endpoint=http://HOST:PORT&pathStyle=true`.
//! Credentials come from `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and (optionally)
//! `AWS_SESSION_TOKEN`; the region from the URI, else `AWS_REGION` / `AWS_DEFAULT_REGION`, else
//! `us-east-1`. Without `endpoint` the bucket is on AWS (`https://s3.REGION.amazonaws.com`);
//! without `pathStyle=true` URLs are virtual-host style (`BUCKET.host`). Objects above
//! [`S3Options::multipart_threshold`] (16 MiB) go up as multipart uploads of 8 MiB parts.
//! Transient failures (connection errors, timeouts, 5xx, 429, SlowDown) are retried with
//! exponential backoff and full jitter within [`S3Options::max_attempts`] and
//! [`S3Options::deadline`]; 403 and other 4xx are final and explained (`access denied: check
//! AWS_SECRET_ACCESS_KEY …`). [`ObjectStore::open`] probes the bucket, so a wrong secret, a
//! missing bucket or a dead endpoint fails at startup.
//!
//! Module map: URI parsing in `uri`, object-key rules in `key`, the blocking backends
//! (filesystem and in-memory) in `backend`, the S3 backend in `s3_bucket` (with SigV4 signing in
//! `sigv4` and the little XML it reads in `xml`), the thread and its handle in `store`; every limit in `limits`.

mod backend;
mod key;
mod limits;
mod s3_bucket;
mod sigv4;
mod store;
mod uri;
mod xml;

pub use limits::DEFAULT_MAX_IN_FLIGHT;
pub use s3_bucket::S3Options;
pub use sigv4::S3Credentials;
pub use store::Faults;
pub use store::ObjectStore;
pub use store::ObjectStoreOptions;

/// A parsed bucket URI: `<bucket id>@<scheme>://<path>[?k=v&...]` (`--storage`'s syntax,
/// e.g. `-2@file://./objects`, `-2@s3://bucket?region=us-east-1&endpoint=http://127.0.0.1:3900&pathStyle=true`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageUri {
    /// Signed 16-bit bucket id (the part before `@`).
    pub bucket_id: i16,
    pub location: StorageLocation,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StorageLocation {
    /// Root directory of a `file://` bucket (relative paths are relative to the working dir).
    File(std::path::PathBuf),
    /// `s3://BUCKET?...`: query parameters kept as given, in order.
    S3 {
        bucket: String,
        params: Vec<(String, String)>,
    },
    /// `mem://NAME`: in-memory, tests only.
    Memory(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The URI could not be understood; the message says what is expected.
    BadUri(String),
    /// The key does not exist.
    NotFound(String),
    /// The backend failed; the message carries the cause.
    Io(String),
    /// The object at `key` is `size` bytes, and ends before the range `start..end` asked of
    /// it: what was stored is shorter than what was written (never served as a short read).
    Short {
        key: String,
        start: u64,
        end: u64,
        size: u64,
    },
    /// The upload thread is gone.
    Closed,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::BadUri(m) => f.write_str(m),
            StoreError::NotFound(k) => write!(f, "object {k} not found"),
            StoreError::Io(m) => write!(f, "object store: {m}"),
            StoreError::Short {
                key,
                start,
                end,
                size,
            } => write!(
                f,
                "object store: range {start}..{end} is past the end of {key} ({size} bytes)"
            ),
            StoreError::Closed => f.write_str("object store is shut down"),
        }
    }
}

impl std::error::Error for StoreError {}

pub type Reply<T> = futures_channel::oneshot::Receiver<Result<T, StoreError>>;
