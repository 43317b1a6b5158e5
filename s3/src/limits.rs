//! Every limit of the object-store crate in one place: key length, in-flight requests, the
//! `s3://` backend's sizes, attempts and time bounds. Each says what happens when it is hit.
//! (SigV4's and S3's format strings are not limits and stay in `sigv4.rs` and `key.rs`.)

/// Longest object key, in bytes: S3's limit, so a key valid here is valid on every backend. A
/// longer key is refused with `StoreError::BadUri` before any I/O.
pub(crate) const KEY_MAX_BYTES: usize = 1024;

/// Requests executing at once unless `ObjectStoreOptions::max_in_flight` says otherwise.
///
/// Enough to overlap the fsyncs (file) or round trips (S3) of the few segments a node seals per
/// flush interval, small enough that a slow store cannot pile up unbounded work on this thread.
/// When hit, further requests wait in the queue, in order (nothing is refused).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 8;

/// Default `S3Options::multipart_threshold`: objects larger than this many bytes go up as a
/// multipart upload instead of one PUT.
pub(crate) const S3_MULTIPART_THRESHOLD_BYTES: usize = 16 << 20;

/// Default `S3Options::part_size`, in bytes: the size of each part of a multipart upload
/// (raised to [`S3_MIN_PART_BYTES`], or further so that no object needs more than
/// [`S3_MAX_PARTS`] parts).
pub(crate) const S3_PART_BYTES: usize = 8 << 20;

/// S3's smallest part, in bytes (every part but the last): a smaller configured part size is
/// raised to it.
pub(crate) const S3_MIN_PART_BYTES: usize = 5 << 20;

/// S3's largest part count of one multipart upload: a part size that would need more parts is
/// raised until the object fits in this many.
pub(crate) const S3_MAX_PARTS: usize = 10_000;

/// Parts of one multipart put in flight at once; the next part is sent when one finishes.
pub(crate) const S3_PARTS_IN_FLIGHT: usize = 4;

/// Bodies of at least this many bytes are hashed (for SigV4) on the blocking pool, so the
/// runtime thread keeps serving; smaller ones are hashed in place.
pub(crate) const HASH_OFF_THREAD_MIN_BYTES: usize = 256 << 10;

/// Most bytes read of a successful answer that is not an object's data (a listing page, a
/// multipart upload's XML, a PUT's answer): a ListObjectsV2 page of 1,000 keys of 1,024 bytes,
/// each percent-encoded, fits with room to spare. A longer answer fails the call (it is not
/// retried) and the connection is dropped unread.
pub(crate) const S3_ANSWER_BYTES_MAX: usize = 16 << 20;

/// Most bytes read of an error answer's body, which only feeds the error message; the rest is
/// dropped unread.
pub(crate) const S3_ERROR_ANSWER_BYTES_MAX: usize = 64 << 10;

/// Default `S3Options::list_page_size`: keys asked per ListObjectsV2 page (S3's maximum); a
/// longer listing takes more pages.
pub(crate) const S3_LIST_PAGE_KEYS: u32 = 1000;

/// Default `S3Options::max_attempts`: attempts per call, the first included. When used up by
/// transient failures, the call fails with `StoreError::Io` ("gave up after N attempts").
pub(crate) const S3_MAX_ATTEMPTS: u32 = 8;

/// Default `S3Options::deadline`: total time one call may spend, retries and backoff included.
/// When the next retry would pass it, the call fails with `StoreError::Io` ("gave up").
pub(crate) const S3_CALL_DEADLINE_SECS: u64 = 60;

/// Default `S3Options::attempt_timeout`: time limit of one attempt (connect, send, whole
/// answer). A timed-out attempt is a transient failure and is retried.
pub(crate) const S3_ATTEMPT_TIMEOUT_SECS: u64 = 30;

/// Default `S3Options::connect_timeout`: time limit of a TCP (and TLS) connect. A connect that
/// takes longer is a transient failure and is retried.
pub(crate) const S3_CONNECT_TIMEOUT_SECS: u64 = 5;

/// Default `S3Options::base_backoff`: the first retry's backoff ceiling, doubling per retry up
/// to [`S3_MAX_BACKOFF_MS`] (full jitter below the ceiling).
pub(crate) const S3_BASE_BACKOFF_MS: u64 = 50;

/// Default `S3Options::max_backoff`: the largest backoff ceiling between two attempts, also the
/// most a server's `Retry-After` is believed.
pub(crate) const S3_MAX_BACKOFF_MS: u64 = 5_000;

/// An idle pooled connection to the store is closed after this long; the next call connects
/// anew.
pub(crate) const S3_POOL_IDLE_TIMEOUT_SECS: u64 = 30;
