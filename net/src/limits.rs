//! Every limit of the network layer: what one connection may hold and how long it may take
//! (the same for HTTP/1.1 and HTTP/2), and what admin and subscription requests may ask for.
//! docs/security.md lists the limits with their defaults and errors.
//!
//! Request bodies are counted from their first byte against the core's [`BodyBudget`], so the
//! memory held by uploads in progress is bounded by `--max-in-flight-bytes` per core whatever
//! clients do: a body that would pass it is refused with `429` instead of being buffered.
//!
//! Answers are bounded the same way on the way out: a read's answer (its whole body, built
//! before it is written) counts against the core's [`BodyBudget`] of unsent answers from when
//! it is built until its last byte left for the socket, so readers that never read hold at
//! most `--max-unsent-bytes` per core (past it a read gets `503` with `Retry-After`), and a
//! connection whose writes make no progress for `--send-stall-timeout-sec` is closed.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

/// Default largest request body (`--max-body-size`); larger is `413`.
pub const BODY_BYTES_MAX_DEFAULT: usize = 8 * 1024 * 1024;

/// Default time a request (head and body) has to arrive, and an idle connection stays open
/// (`--request-timeout-sec`).
pub const REQUEST_TIMEOUT_SEC_DEFAULT: u64 = 120;

/// Default time a connection may go without any write progress while it has something to send
/// (a socket that takes no byte, an HTTP/2 answer the peer grants no window for); then it is
/// closed (`--send-stall-timeout-sec`).
pub const SEND_STALL_TIMEOUT_SEC_DEFAULT: u64 = 30;

/// Default bytes of read answers built but not yet written to their sockets, per core
/// (`--max-unsent-bytes`); past it a read is answered `503` with `Retry-After`.
pub const UNSENT_ANSWER_BYTES_PER_CORE_DEFAULT: usize = 64 * 1024 * 1024;

/// Why a read was refused with `503`: the answers this core built are still waiting for their
/// readers.
pub const ANSWERS_OVER_BUDGET: &str =
    "unsent answers per core: answers waiting for slow readers fill --max-unsent-bytes";

/// Why a body was refused with `429`: the core's [`BodyBudget`] cannot hold it.
pub const BODIES_OVER_BUDGET: &str =
    "in-flight bytes per core: request bodies being received fill --max-in-flight-bytes";

/// Largest request head (request line and headers) of HTTP/1.1; larger is `431`.
pub const HEAD_BYTES_MAX: usize = 64 * 1024;
/// Most headers in one HTTP/1.1 request; more is `431`.
pub const HEADERS_MAX: usize = 100;

/// Longest chunk-size line of a chunked HTTP/1.1 body (size and extensions); longer is `400`.
pub const CHUNK_SIZE_LINE_BYTES_MAX: usize = 1024;

/// After a `413` (or a `429` for the body budget), the rest of the rejected body is read and
/// discarded (what its `Content-Length` declares; a chunked body until the client stops), at
/// most this much and for at most [`OVERSIZED_BODY_DRAIN_TIMEOUT`], so the client sees the
/// answer instead of a reset connection; then the connection closes.
pub const OVERSIZED_BODY_DRAIN_BYTES_MAX: usize = 64 * 1024 * 1024;
/// See [`OVERSIZED_BODY_DRAIN_BYTES_MAX`].
pub const OVERSIZED_BODY_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the admin core measures the storage the node uses (WAL directory, SQLite
/// catalog file, the catalog's bucket bytes): one directory walk off the core and one
/// aggregate catalog query each time, so not per scrape.
pub const STORAGE_USAGE_REFRESH_MS: u64 = 5_000;
/// Directory entries one disk measurement looks at, at most (the WAL directory holds a few
/// files per core; a directory filled by something else must not stall the measurement).
pub const DISK_USAGE_ENTRIES_MAX: usize = 100_000;
/// Directory levels below the WAL directory one disk measurement descends.
pub const DISK_USAGE_DEPTH_MAX: usize = 4;

/// How long a client may take to finish the TLS handshake; then the connection is closed.
pub const TLS_HANDSHAKE_TIMEOUT_SEC: u64 = 10;
/// Open connections per core on the protocol listeners, at most; past the core's limit new
/// connections get `503` and are closed. The limit is lower where the process's open-file
/// limit is (`connections_per_core_max`): a client's connections must never take the
/// descriptors the node needs for its own files.
pub const CONNECTIONS_PER_CORE_MAX: usize = 10_000;
/// At most one log line per this interval about failed `accept`s of one listener (out of
/// descriptors, each try fails again until a connection closes).
pub const ACCEPT_FAILURE_LOG_INTERVAL_MS: u64 = 10_000;
/// The fewest connections a core takes, whatever the open-file limit (a start logs a warning
/// when the limit leaves less).
pub const CONNECTIONS_PER_CORE_MIN: usize = 16;
/// Open connections on the admin listener; its own budget, so clients filling the protocol
/// listeners do not keep the operator from `/metrics`.
pub const ADMIN_CONNECTIONS_MAX: usize = 64;
/// Descriptors kept back from clients' connections for the node's own: WAL and segment files,
/// the catalog, connections to the bucket, database and webhooks, listeners, rings and event
/// descriptors (an idle node holds about 35). An eighth of the open-file limit when that is
/// more.
pub const OPEN_FILES_RESERVED_MIN: u64 = 256;

/// The most connections one of `cores` cores takes with an open-file limit of `open_files`:
/// what is left after the node's own descriptors and the admin listener's connections, shared
/// by the cores, within [`CONNECTIONS_PER_CORE_MIN`]..=[`CONNECTIONS_PER_CORE_MAX`].
pub fn connections_per_core_max(open_files: u64, cores: usize) -> usize {
    let reserved = OPEN_FILES_RESERVED_MIN
        .max(open_files / 8)
        .saturating_add(ADMIN_CONNECTIONS_MAX as u64);
    let per_core = open_files.saturating_sub(reserved) / cores.max(1) as u64;
    usize::try_from(per_core)
        .unwrap_or(usize::MAX)
        .clamp(CONNECTIONS_PER_CORE_MIN, CONNECTIONS_PER_CORE_MAX)
}
/// Largest request body the admin listener takes (its API takes small JSON documents); larger
/// is `413`.
pub const ADMIN_BODY_BYTES_MAX: usize = 64 * 1024;
/// Streams per `/admin/streams` page when `limit` is absent or 0.
pub const ADMIN_STREAMS_PAGE_DEFAULT: usize = 100;
/// The most streams an `/admin/streams` page holds; a larger `limit` is lowered to it.
pub const ADMIN_STREAMS_PAGE_MAX: usize = 1000;
/// How long a backup (`POST /admin/backup`) may take when its request gives no `timeoutSec`;
/// past it the backup stops without a manifest and the collector's hold is released.
pub const BACKUP_TIMEOUT_SEC_DEFAULT: u64 = 3_600;
/// How long `POST /admin/gc-hold` waits for a collection round in progress to end before it
/// answers `503` (a round stuck on an outage).
pub const GC_HOLD_WAIT_SEC: u64 = 30;
/// The longest `to` of a backup request (a path under `--backup-dir`).
pub const BACKUP_DESTINATION_BYTES_MAX: usize = 1_024;
/// The largest `timeoutSec` a backup may ask for (a day): the collector is held meanwhile.
pub const BACKUP_TIMEOUT_SEC_MAX: u64 = 86_400;
/// How long a verify of the stored objects (`POST /admin/verify`) may take when its request
/// gives no `timeoutSec`, and the most it may ask for (a week: at 50 MB/s, 30 TB).
pub const VERIFY_TIMEOUT_SEC_DEFAULT: u64 = 86_400;
pub const VERIFY_TIMEOUT_SEC_MAX: u64 = 604_800;
/// Damaged objects a verify's report lists (all are counted), and logs one line each.
pub const VERIFY_LISTED_DAMAGE_MAX: usize = 1_000;
pub const VERIFY_LOGGED_DAMAGE_MAX: usize = 100;
/// A verify stops, failed, once this many objects in a row could not be read (the bucket is
/// down: every later GET would fail too).
pub const VERIFY_UNREADABLE_IN_A_ROW_MAX: u32 = 16;
/// The most a verify or a backup reads of an object no catalog row gives a size (a
/// quarantined segment): the store's answer is not trusted to end. Longer is an error.
pub const UNSIZED_OBJECT_BYTES_MAX: usize = 1 << 30;

// HTTP/2 (each sent to the client in SETTINGS; a client exceeding one gets a stream or
// connection error from `h2`).

/// Concurrent requests per HTTP/2 connection; more are refused with `REFUSED_STREAM`.
pub const H2_CONCURRENT_STREAMS_MAX: u32 = 256;
/// Per-stream receive window: large enough that a big append streams without waiting on
/// WINDOW_UPDATE round trips; a client sending past it gets `FLOW_CONTROL_ERROR`.
pub const H2_STREAM_WINDOW_BYTES: u32 = 1 << 20;
/// The connection's receive window, over all its streams.
pub const H2_CONNECTION_WINDOW_BYTES: u32 = 8 << 20;
/// Largest DATA frame a client may send (SETTINGS_MAX_FRAME_SIZE; the protocol's default is
/// 16 KiB); a larger one is `FRAME_SIZE_ERROR`. A 64 KiB append then arrives as one frame and is
/// kept as received, where 16 KiB frames would have to be gathered into a new buffer; clients
/// that honour the setting (h2, hyper, `pico bench`) write 9–13 % more this way
/// (docs/decisions/2026-12-inbound-h2-frames.md).
/// Each connection buffers at most one frame of this size while reading it.
pub const H2_FRAME_BYTES_MAX: u32 = 256 * 1024;
/// Largest accepted HTTP/2 header block; larger is `431`.
pub const H2_HEADER_LIST_BYTES_MAX: u32 = 64 * 1024;
/// Bytes of one response stream `h2` buffers ahead of the socket (its `max_send_buffer_size`;
/// 400 KB by default): a peer that opens a large window and then stops reading the socket
/// makes each of its requests hold at most this much there until the send stall closes it.
pub const H2_SEND_BUFFER_BYTES: usize = 128 * 1024;

// Durable Streams subscriptions (docs/api.md lists the error bodies; each refusal below is a
// `400` naming the limit unless it says otherwise).

/// Subscriptions per node; one more is `429 LIMIT_EXCEEDED`.
pub const SUBSCRIPTIONS_PER_NODE_MAX: usize = 1024;
/// Subscriptions under one scope: the prefix of the admin grant that allows the request (with
/// auth), else the request's root. One tenant so takes at most a quarter of the node; one more
/// is `429 LIMIT_EXCEEDED`.
pub const SUBSCRIPTIONS_PER_SCOPE_MAX: usize = 256;
/// Linked streams per subscription (explicit and pattern-matched together); also bounds the
/// size of a wake notification, which lists them all. Past it an explicit link is refused;
/// pattern matches past it are not linked (logged once).
pub const STREAMS_PER_SUBSCRIPTION_MAX: usize = 1000;
/// Acks in one callback or ack request.
pub const ACKS_PER_REQUEST_MAX: usize = 256;
/// Subscription ids, in bytes once percent-decoded.
pub const SUBSCRIPTION_ID_BYTES_MAX: usize = 256;
/// Relative stream paths and patterns, in bytes.
pub const SUBSCRIPTION_PATH_BYTES_MAX: usize = 1024;
/// A subscription's description, in bytes.
pub const SUBSCRIPTION_DESCRIPTION_BYTES_MAX: usize = 4096;
/// A pull-wake worker's name, in bytes.
pub const WORKER_NAME_BYTES_MAX: usize = 256;
/// A subscription's lease when it names none.
pub const LEASE_TTL_MS_DEFAULT: u64 = 30_000;
/// The shortest lease a subscription may ask for.
pub const LEASE_TTL_MS_MIN: u64 = 1_000;
/// The longest lease a subscription may ask for.
pub const LEASE_TTL_MS_MAX: u64 = 600_000;
/// Longest subscription pattern, in segments; the matcher is O(pattern × path) either way.
pub const PATTERN_SEGMENTS_MAX: usize = 32;
/// Longest webhook URL accepted.
pub const WEBHOOK_URL_BYTES_MAX: usize = 2048;
/// Bodies of subscription control requests; larger is `413`.
pub const CONTROL_BODY_BYTES_MAX: usize = 1024 * 1024;
/// Streams a pattern subscription's creation looks at to link the existing matches; past it
/// the creation stops linking (logged), later writes still link.
pub const CREATE_SCAN_STREAMS_MAX: usize = 100_000;
/// Longest callback token accepted for verification (a real one is about 150 bytes); longer is
/// `401`.
pub const TOKEN_BYTES_MAX: usize = 1024;

// Webhook deliveries (outgoing, so a slow or hostile receiver cannot hold the delivery threads;
// docs/security.md, "Outbound").

/// Failed POSTs of one wake before it is given up (the subscription is then `failed` until a
/// delivery succeeds; the next write to a pending stream starts a new wake).
pub const DELIVERY_ATTEMPTS_MAX: u32 = 8;
/// Subscriptions with a delivery waiting for a thread (each has at most one waiting); past it a
/// delivery counts as failed and is retried.
pub const QUEUED_DELIVERIES_MAX: usize = 1024;
/// Threads delivering webhooks. A subscription has at most one delivery in flight, so one slow
/// receiver holds at most one of them; the others serve the other subscriptions in turn.
pub const WEBHOOK_DELIVERY_THREADS: usize = 4;
/// Connecting to a webhook receiver (within [`WEBHOOK_DEADLINE`]).
pub const WEBHOOK_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// One whole delivery: connect, TLS handshake, request and answer (name resolution aside), so
/// a receiver dribbling bytes cannot hold a thread longer.
pub const WEBHOOK_DEADLINE: Duration = Duration::from_secs(5);
/// Longest answer head (interim answers included) of a delivery; longer fails the delivery.
pub const WEBHOOK_RESPONSE_HEAD_BYTES_MAX: usize = 16 * 1024;
/// Longest answer body of a delivery (only `{"done":true}` is looked for in it); longer, by
/// `Content-Length`, chunk sizes or bytes sent, fails the delivery as soon as it shows.
pub const WEBHOOK_RESPONSE_BODY_BYTES_MAX: usize = 64 * 1024;

/// The limits every connection of a listener is served with.
#[derive(Clone)]
pub struct ConnectionLimits {
    /// Largest request body (bytes); larger is `413`.
    pub max_body_size: usize,
    /// A request not received within this is `408`; a connection idle this long is closed
    /// (HTTP/2: with a GOAWAY).
    pub request_timeout: Duration,
    /// Bodies being received on this core.
    pub bodies: BodyBudget,
    /// Read answers built on this core and not yet written to their sockets.
    pub answers: BodyBudget,
    /// A connection whose writes make no progress for this long is closed.
    pub send_stall_timeout: Duration,
}

impl ConnectionLimits {
    /// Limits for tests: a body limit, the default timeout, an unshared budget.
    #[cfg(test)]
    pub fn with_body_limit(max_body_size: usize) -> ConnectionLimits {
        ConnectionLimits {
            max_body_size,
            request_timeout: Duration::from_secs(REQUEST_TIMEOUT_SEC_DEFAULT),
            bodies: BodyBudget::new(usize::MAX),
            answers: BodyBudget::new(usize::MAX),
            send_stall_timeout: Duration::from_secs(SEND_STALL_TIMEOUT_SEC_DEFAULT),
        }
    }
}

/// Open connections against a maximum: one per core for the protocol listeners, one for the
/// admin listener. Shared by the listeners' accept loops on one core (so not `Send`), and kept
/// out of [`ConnectionLimits`], which every connection's task holds a copy of.
#[derive(Clone)]
pub struct ConnectionBudget {
    open: Rc<Cell<usize>>,
    max: usize,
}

impl ConnectionBudget {
    pub fn new(max: usize) -> ConnectionBudget {
        ConnectionBudget {
            open: Rc::new(Cell::new(0)),
            max,
        }
    }

    /// Counts one more open connection until the returned guard drops; `None` at the maximum.
    pub fn open_one(&self) -> Option<OpenConnectionSlot> {
        if self.open.get() >= self.max {
            return None;
        }
        self.open.set(self.open.get() + 1);
        Some(OpenConnectionSlot {
            open: self.open.clone(),
        })
    }
}

/// One connection's place in its [`ConnectionBudget`], given back when dropped.
pub struct OpenConnectionSlot {
    open: Rc<Cell<usize>>,
}

impl Drop for OpenConnectionSlot {
    fn drop(&mut self) {
        self.open.set(self.open.get() - 1);
    }
}

/// Bytes one core holds for its connections, against a maximum: request bodies being received
/// or handled, or read answers not yet written. One of each per core, shared by its
/// connections (so not `Send`).
#[derive(Clone)]
pub struct BodyBudget {
    shared: Rc<Budget>,
}

struct Budget {
    held_bytes: Cell<usize>,
    max_bytes: usize,
}

impl BodyBudget {
    pub fn new(max_bytes: usize) -> BodyBudget {
        BodyBudget {
            shared: Rc::new(Budget {
                held_bytes: Cell::new(0),
                max_bytes,
            }),
        }
    }

    /// An empty reservation of one request's body.
    pub fn reservation(&self) -> BodyReservation {
        BodyReservation {
            budget: self.clone(),
            bytes: 0,
        }
    }

    /// Bytes held now, by all reservations.
    #[cfg(test)]
    pub fn held_bytes(&self) -> usize {
        self.shared.held_bytes.get()
    }

    /// Whether the budget holds its maximum or more: nothing more fits next to what is held.
    pub fn is_full(&self) -> bool {
        self.shared.held_bytes.get() >= self.shared.max_bytes
    }
}

/// One request body's share of its core's [`BodyBudget`]; given back when dropped (once the
/// request was answered).
pub struct BodyReservation {
    budget: BodyBudget,
    bytes: usize,
}

impl BodyReservation {
    /// Grows this reservation to `total` bytes; `false` (and unchanged) when the core cannot
    /// hold them. A core holding nothing else always takes one body, however large, so a
    /// budget below `--max-body-size` still lets every body through one at a time.
    #[must_use]
    pub fn grow_to(&mut self, total: usize) -> bool {
        let Some(more) = total.checked_sub(self.bytes).filter(|&more| more > 0) else {
            return true;
        };
        let shared = &self.budget.shared;
        let held = shared.held_bytes.get();
        let alone = held == self.bytes;
        let fits = held
            .checked_add(more)
            .is_some_and(|after| after <= shared.max_bytes);
        if !fits && !alone {
            return false;
        }
        shared.held_bytes.set(held.saturating_add(more));
        self.bytes = total;
        true
    }
}

impl Drop for BodyReservation {
    fn drop(&mut self) {
        let shared = &self.budget.shared;
        shared
            .held_bytes
            .set(shared.held_bytes.get().saturating_sub(self.bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_share_the_budget_and_give_it_back() {
        let budget = BodyBudget::new(100);
        let mut a = budget.reservation();
        assert!(a.grow_to(60));
        let mut b = budget.reservation();
        assert!(b.grow_to(40));
        assert!(!b.grow_to(41), "past the budget with another body held");
        assert_eq!(budget.held_bytes(), 100);
        drop(a);
        assert_eq!(budget.held_bytes(), 40);
        // Alone, a body may pass the budget: one body always fits.
        assert!(b.grow_to(1000));
        let mut c = budget.reservation();
        assert!(!c.grow_to(1));
        drop(b);
        assert!(c.grow_to(usize::MAX));
        assert!(c.grow_to(5), "shrinking is a no-op");
        drop(c);
        assert_eq!(budget.held_bytes(), 0);
    }
}
