//! Every limit of the engine in one place. A limit a client meets is an explicit error
//! (`413`, `429` with `Retry-After`), never an unbounded queue; a bound on a core's own work
//! (the last section) says what reaching it does.

/// Default bytes of appends accepted by one core but not yet durable; past it appends get
/// `429` (`--max-in-flight-bytes`).
pub const IN_FLIGHT_BYTES_PER_CORE_DEFAULT: usize = 64 * 1024 * 1024;
/// Default bytes of sealed segments one core holds before they are uploaded; past it appends
/// get `429` (`--max-unuploaded-bytes`).
pub const UNUPLOADED_BYTES_PER_CORE_DEFAULT: usize = 512 * 1024 * 1024;
/// Reads parked on one stream; past it reads get `429`. The long-polls and SSE subscribers of
/// one core that wait at the same place share one (`live.rs`), so this bounds the distinct
/// places waited at; the readers themselves are bounded by the connections and h2 streams a
/// core admits.
pub const WAITERS_PER_STREAM_MAX: usize = 10_000;
/// Requests queued from other cores to one core; past it the caller gets `429`.
pub const CROSS_CORE_QUEUE_MAX: usize = 4096;
/// Records accepted in one append request.
pub const RECORDS_PER_APPEND_MAX: usize = 100_000;
/// Stream names longer than this are refused with `400`.
pub const STREAM_NAME_LEN_MAX: usize = 1024;
/// Records returned by one read whatever its byte budget.
pub const RECORDS_PER_READ_MAX: usize = 100_000;
/// Largest explicit read byte budget (`bytes=`); larger values are clamped.
pub const READ_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Default byte budget of a Durable Streams catch-up read (`GET` without `live`,
/// `--catch-up-read-size`): it answers up to the tail in one response within it. Clients
/// that do not follow `Stream-Next-Offset` on a catch-up (the official TypeScript client
/// with `live: false`) otherwise see only the first chunk of a stream. The same bound as a
/// Pico read's largest `bytes=`, so no client can make a response hold more than it can now.
pub const CATCH_UP_READ_BYTES_DEFAULT: usize = READ_BYTES_MAX;
/// Largest `--catch-up-read-size`: each catch-up response may hold this much of the stream's
/// buffers until it is written.
pub const CATCH_UP_READ_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Smallest `--segment-size`. The WAL pre-allocates one file per open segment, and a sealed
/// segment is one object PUT and one catalog row: below this, a few records seal a segment and
/// the bucket and catalog fill with tiny objects.
pub const SEGMENT_BYTES_MIN: usize = 64 * 1024;
/// Shortest cluster lease (`--lease-ms`). A node renews every third of it and trusts it for
/// three quarters (`cluster.rs`); below this a loaded machine's scheduling delay lets a live
/// node's lease lapse and its streams move for nothing, and the keeper thread would renew too
/// often for the metadata database. A shorter lease is refused at startup
/// (`ClusterConfig::check`).
pub const LEASE_MS_MIN: u64 = 300;
/// Shortest `--segment-max-age-ms`: each core looks for old segments every half of it, so
/// below this its timer would spin. A younger age is refused at startup
/// (`EngineConfig::check`).
pub const SEGMENT_MAX_AGE_MS_MIN: u64 = 10;
/// Default `--object-puts-per-second`: the node's flush PUTs under object durability
/// (`put_budget.rs`). At 500 a lone writer's flush waits at most 2 ms for its slot, and a
/// 2-core node under load is held back by its PUT latency, not the budget
/// (docs/decisions/2026-12-object-put-budget.md); a node appending without pause makes at most
/// 43.2 million flush PUTs a day. Lower it to trade latency for fewer billed requests.
pub const OBJECT_PUTS_PER_SECOND_DEFAULT: u32 = 500;
/// Bounds of `--object-puts-per-second`: at least one flush a second (an acknowledgement
/// waits a second at most for its slot), and no more than one object-store prefix takes
/// (3,500 PUTs/s on the common S3 services). Outside them it is refused at startup.
pub const OBJECT_PUTS_PER_SECOND_MIN: u32 = 1;
pub const OBJECT_PUTS_PER_SECOND_MAX: u32 = 3_500;
/// `Retry-After` sent with `429`.
pub const OVERLOADED_RETRY_AFTER_SEC: u64 = 1;
/// Forks in a chain from a stream that is no fork to the newest fork of forks (1: a fork of a
/// plain stream). A fork of a stream at this depth is refused with `400`. Reads walk the chain
/// in a loop, so deeper chains made before the limit existed are still served.
pub const FORK_DEPTH_MAX: u32 = 64;
/// Longest TTL a stream may have (100 years); a larger `Pico-TTL` / `Stream-TTL` is `400`.
/// Keeps every deadline in range of millisecond arithmetic on `i64`.
pub const TTL_SEC_MAX: u64 = 100 * 365 * 24 * 3600;
/// Longest idempotent producer id (`Pico-Producer-Id`, `Producer-Id`), in bytes; a longer one
/// is `400`. Every stored producer costs its id in memory and in each segment entry it writes
/// to (`producers.rs`).
pub const PRODUCER_ID_BYTES_MAX: usize = 256;
/// Producers one stream keeps; a new one past it is `429` (`producers.rs`).
pub const PRODUCERS_PER_STREAM_DEFAULT: usize = 4_096;
/// Producers the node keeps over all its streams by default (`--producers-max`): at most about
/// 100 MB with the longest ids. A new one past it is `429`.
pub const PRODUCERS_PER_NODE_DEFAULT: usize = 250_000;
/// A producer that has not written for this long is forgotten (`--producer-idle-expiry-sec`,
/// 7 days, as Kafka expires transactional ids).
pub const PRODUCER_IDLE_EXPIRY_SEC_DEFAULT: u64 = 7 * 24 * 3600;

/// Streams returned by one listing call.
pub const LIST_LIMIT_MAX: usize = 10_000;
/// Default streams per listing call.
pub const LIST_LIMIT_DEFAULT: usize = 1000;
/// Longest retention age or delete-on-empty time a stream may have (100 years, as a TTL); a
/// larger value is `400`.
pub const RETENTION_AGE_SEC_MAX: u64 = TTL_SEC_MAX;
/// Largest retention byte limit (the databases store signed 64-bit integers).
pub const RETENTION_BYTES_MAX: u64 = i64::MAX as u64;

/// A retention age or delete-on-empty time as a client or flag gives it (whole seconds, `0`:
/// off) as the policy holds it (milliseconds); `Err` with the largest allowed value when it
/// is over [`RETENTION_AGE_SEC_MAX`].
pub fn retention_secs(secs: u64) -> Result<Option<u64>, u64> {
    match secs {
        0 => Ok(None),
        // Within the maximum, the product fits.
        s if s <= RETENTION_AGE_SEC_MAX => Ok(Some(s * 1000)),
        _ => Err(RETENTION_AGE_SEC_MAX),
    }
}

/// A retention byte limit as given (`0`: off); `Err` with the largest allowed value when it
/// is over [`RETENTION_BYTES_MAX`].
pub fn retention_bytes(bytes: u64) -> Result<Option<u64>, u64> {
    match bytes {
        0 => Ok(None),
        b if b <= RETENTION_BYTES_MAX => Ok(Some(b)),
        _ => Err(RETENTION_BYTES_MAX),
    }
}

/// A setting out of its allowed range at startup: named (`setting`, with its flag), with the
/// value given and the range it must be in. Out-of-range settings are refused, never raised
/// silently.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingError {
    pub setting: &'static str,
    pub value: u64,
    pub min: u64,
    /// `None`: the setting has a floor only.
    pub max: Option<u64>,
}

impl std::fmt::Display for SettingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let SettingError {
            setting,
            value,
            min,
            max,
        } = self;
        match max {
            None => write!(f, "{setting} must be at least {min}, got {value}"),
            Some(max) => write!(f, "{setting} must be between {min} and {max}, got {value}"),
        }
    }
}

impl std::error::Error for SettingError {}

/// A setting checked against its floor at startup: `Err` naming it when `value` is below
/// `min`.
pub fn at_least(setting: &'static str, value: u64, min: u64) -> Result<(), SettingError> {
    if value < min {
        return Err(SettingError {
            setting,
            value,
            min,
            max: None,
        });
    }
    Ok(())
}

/// `Err` naming `setting` when `value` is outside `min..=max`.
pub fn within(setting: &'static str, value: u64, min: u64, max: u64) -> Result<(), SettingError> {
    if value < min || value > max {
        return Err(SettingError {
            setting,
            value,
            min,
            max: Some(max),
        });
    }
    Ok(())
}

/// How often each core's retention pass runs.
pub const RETENTION_INTERVAL_MS: u64 = 1_000;
/// Streams one retention round of a core looks at (it resumes after the last one next
/// round), so a core with millions of streams spends a bounded moment per round.
pub const RETENTION_STREAMS_PER_ROUND: usize = 4_096;
/// Trims and deletes one retention round of a core makes at most (each is a metadata write).
pub const RETENTION_ACTIONS_PER_ROUND: usize = 256;

// ---------------------------------------------------------------- one core's work bounds

/// A stream's chunk (its records' place in an open segment) stops growing at this many bytes
/// and the next append starts a new one, so a read never scans far inside one.
pub const CHUNK_BYTES_MAX: u64 = 256 * 1024;
/// A coarse chunk of a sealed segment spans at most this many bytes (own and other streams'
/// frames): merging stops there, bounding what a read scans to find its first record. The
/// catalog's runs are these same spans (`coarsen_runs`), so the trade-off is the catalog's size
/// (runs per stream and segment: about segment size / this, not one per commit round) against
/// a read's header scan, and it is set at the block cache's block (`CACHE_BLOCK_BYTES`): a span
/// touches at most two blocks, one more than a per-append index could have a read fetch.
pub const SEALED_CHUNK_BYTES_MAX: u64 = 1024 * 1024;
/// Uploaded segments are read and cached in blocks of this many bytes: one ranged GET per
/// block, or per readahead window of blocks.
pub const CACHE_BLOCK_BYTES: usize = 1024 * 1024;
/// A segment uploaded within this many milliseconds of a read of sealed data stays in memory
/// for the readers behind the tail (`ReadCache::keep_uploaded`); else only the bucket has it.
pub const SEALED_READ_RECENT_MS: u64 = 10_000;
/// A core logs the damaged stored bytes its reads meet at most once per this many
/// milliseconds (each is counted in `pico_damaged_reads_total`): a reader retrying a damaged
/// range must not flood the log.
pub const DAMAGE_LOG_INTERVAL_MS: u64 = 10_000;
/// A damaged segment's blocks leave the read cache (so the next read fetches them again) at
/// most once per this many milliseconds per segment: a reader retrying a damaged range costs
/// the bucket one GET per interval, not one per request, and an object restored in place
/// reads again within it.
pub const DAMAGE_REFETCH_INTERVAL_MS: u64 = 5_000;
/// Damaged segments whose last refetch a core remembers; past this many the ones whose
/// interval is over are forgotten, and if none is, the oldest.
pub const DAMAGED_SEGMENTS_MAX: usize = 1024;
/// Checked byte ranges the read cache remembers per cached segment (`ReadCache::mark_checked`;
/// 16 bytes each). A stream's chunks are ranges that merge as one reader reads on; past this
/// many apart, further reads of the segment check their frames again.
pub const CHECKED_RANGES_PER_SEGMENT_MAX: usize = 256;
/// A sequential reader's readahead doubles per GET up to this many blocks, then stays there.
pub const READAHEAD_BLOCKS_MAX: u64 = 8;
/// Chunks a read keeps fetching from the bucket ahead of the one it decodes; further chunks
/// are fetched as it moves on. Object durability seals a segment every few milliseconds, so a
/// catch-up read after a failover or a restart spans hundreds of small objects: one GET at a
/// time would read at one round trip per segment (measured: 11 s for a 1 MiB page of 2 KiB
/// records on Garage, debug build).
pub const READ_CHUNKS_AHEAD: usize = 16;
/// Extra bytes of room in an active segment buffer (and its pre-allocated WAL file) past
/// `--segment-size`: a rotation can be late by the requests that arrive before the next WAL
/// file is ready. Past it, while no next file can be made, appends are refused.
pub const SEGMENT_SLACK_BYTES: usize = 1024 * 1024;
/// Largest average commit round (bytes of a segment per WAL write) for which the next WAL
/// file is written through with zeros (`shard/wal.rs` `WalFill`): writing it costs a
/// segment's bytes once, and saves each round a hand-off to a kernel worker and an extent-map
/// write. Appends of 256 B gather rounds of ~35 KiB (W1: ~5 % more appends per CPU second);
/// 64 KiB appends make rounds of 64 KiB and more, where the zeros cost more than they save
/// (W3: 20 % fewer appends per second).
pub const WAL_FILL_ROUND_BYTES_MAX: usize = 64 * 1024;
/// Bytes at the start of every WAL file written through with zeros at least (`shard/wal.rs`
/// `WalFill`), so a slow writer's rounds are plain overwrites too: a writer of 64 B every
/// 10 ms fills ~30 KiB before its segment seals by age (2 s).
pub const WAL_HEAD_WRITTEN_BYTES: usize = 256 * 1024;
/// A new segment's buffer; it doubles as frames arrive, up to the segment size plus slack.
pub const SEGMENT_BUFFER_INITIAL_BYTES: usize = 64 * 1024;
/// How often each core refreshes the gauges of `CoreMetrics` (they are at most this stale).
pub const GAUGE_REFRESH_MS: u64 = 250;
/// How often each core looks for expired streams to delete.
pub const REAPER_INTERVAL_MS: u64 = 1_000;
/// Expired streams one reaper round deletes at most; the rest wait for the next round.
pub const REAPER_STREAMS_PER_ROUND: usize = 1_000;
/// Streams one reaper round looks at (resuming where the last stopped): the cost of a round
/// stays flat however many streams a core holds; a core of a million streams is looked over
/// in 100 rounds.
pub const REAPER_SCAN_STREAMS_PER_ROUND: usize = 10_000;
/// Streams a core remembers having let go to another node (to redirect late requests); when
/// full the memory is cleared, and a late request is looked up in the catalog instead.
pub const REMOTE_STREAMS_PER_CORE_MAX: usize = 100_000;
/// Longest a transfer waits for this core to store what it holds of the stream; past it the
/// transfer is given up and tried again at the next lease round.
pub const HAND_OFF_FLUSH_TIMEOUT_MS: u64 = 30_000;
/// First wait before a failed segment upload (PUT or catalog commit) is retried; it doubles
/// per failure. The WAL keeps the data meanwhile.
pub const UPLOAD_RETRY_FIRST_MS: u64 = 50;
/// Longest wait between two tries of a failed segment upload.
pub const UPLOAD_RETRY_MAX_MS: u64 = 5_000;
/// While recovered WAL files wait for the bucket, how often a core looks whether they are
/// stored (its commits wait for all of them; its slots of each turn into stored ones).
pub const RECOVERY_BACKLOG_POLL_MS: u64 = 100;
/// A core logs its failed uploads at most once per this interval (`pico_upload_failures_total`
/// counts every one).
pub const UPLOAD_FAILURE_LOG_INTERVAL_MS: u64 = 10_000;
/// How long a fork release that failed (the source's core overloaded, its metadata write
/// refused) waits before it is tried again; it is tried until it goes through, so a deleted
/// source whose last fork went is always removed in the end.
pub const FORK_RELEASE_RETRY_MS: u64 = 1_000;

/// Shortest `--gc-interval-ms` (the pause between two garbage-collection rounds of core 0);
/// a smaller one is refused at startup (`EngineConfig::check`): each round queries the catalog.
pub const GC_INTERVAL_MS_MIN: u64 = 100;
/// Only segments sealed at least this long before a collection round are judged by it; younger
/// ones wait for a later round (a segment is not collected while it is being sealed).
pub const GC_SEALED_MARGIN_MS: i64 = 1_000;
/// Compaction (`shard/compact.rs`): segments of about the same size are merged once this
/// many lie side by side (or once their merge would fill a segment); each byte is rewritten
/// about once per factor of this between the smallest objects and `--segment-size`.
pub const COMPACT_FANOUT: usize = 8;
/// Compaction's smallest size class: objects below it are one tier, each tier above it this
/// many times `COMPACT_FANOUT` larger.
pub const COMPACT_TIER_BASE_BYTES: u64 = 16 * 1024;
/// A core that stored no segment for this long merges whatever small segments lie side by
/// side, whatever their sizes (a writer that stopped leaves no tail of small objects). Long
/// enough that the collector takes a deleted or trimmed stream's segments first: merged, the
/// retired ones would wait out `COMPACT_RETIRE_GRACE_MS`.
pub const COMPACT_IDLE_MS: u64 = 10_000;
/// While its core still stores segments (a slow writer's), compaction writes objects of at most
/// this many bytes; larger merges (up to `--segment-size`) wait until the core is idle.
pub const COMPACT_ACTIVE_BYTES_MAX: u64 = 1024 * 1024;
/// A core that stores segments closer together than this merges only once idle
/// (`COMPACT_IDLE_MS`): merges beside a fast lone writer's flushes halved its appends a second
/// and raised its acknowledgement p99 from 5 to 50 ms against a Garage on the same 2 CPUs. A
/// slow writer (a flush every quarter second or less often) is merged as it goes.
pub const COMPACT_BUSY_GAP_MS: u64 = 250;
/// The most segments one compaction merges (its GETs and its catalog swap stay bounded).
pub const COMPACT_SEGMENTS_MAX: usize = 512;
/// GETs one compaction keeps in flight while it reads the segments it merges.
pub const COMPACT_GETS_IN_FLIGHT: usize = 16;
/// How long the objects a compaction retired stay in the bucket (then the collector deletes
/// them), and how long their core keeps their table entries: a read that picked its chunks
/// before the swap finishes on them.
pub const COMPACT_RETIRE_GRACE_MS: u64 = 60_000;
/// How often a backup taking the collector's hold looks whether a round in progress ended.
pub const GC_HOLD_POLL_MS: u64 = 10;
/// How often a request waiting for a lapsed lease looks again; the wait ends after one lease
/// time with a `503` (`EngineError::NotOwner`).
pub const LEASE_WAIT_POLL_MS: u64 = 20;
/// Latency a core's inbox asks of glommio: messages from other cores are polled for at least
/// this often instead of after the executor's throughput slice.
pub const INBOX_LATENCY_MS: u64 = 1;

/// Distinct content types a core shares among its streams (`Streams::shared_content_type`):
/// each stream of a shared type points at one copy instead of holding its own. Types past this
/// many are kept per stream, so hostile creates of ever new types cost only their own streams.
pub const INTERNED_CONTENT_TYPES_MAX: usize = 64;
