//! One core's slice of the engine: the streams it owns, their waiters, its segment builder
//! and its write-ahead log.
//!
//! Write path: an append is checked by the pure state machine, framed once into the active
//! segment buffer, and parked on a pending-ack queue. The commit loop writes everything that
//! arrived since the last round to the segment's WAL file with one DMA write and one
//! `fdatasync` (group commit), then releases the acks in order and wakes the readers waiting
//! on those streams. A segment that is full (or old) is sealed: its bytes go to the object
//! store through the upload thread, its index to the metadata log, and only then is its WAL
//! file removed.
//!
//! Everything here runs on one executor: `RefCell`s are never held across an `.await`.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_channel::oneshot;
use glommio::io::DmaFile;
use pico_meta::{
    Fence, MetaError, MetaStore, NodeId, PendingTransfer, ProducerState, SegmentFence,
    SegmentRecord, SegmentRun, SegmentStreamEntry, StreamConfig as MetaConfig,
};
use pico_s3::ObjectStore;

use crate::api::{
    AppendAck, AppendRequest, Fork, Op, ReadBatch, ReadBound, ReadFrom, ReadRequest, RecordInput,
    RecordView, Reply, StreamInfo, StreamSummary,
};
use crate::cluster::Cluster;
use crate::error::EngineError;
use crate::frame::{self, FrameMeta, ProducerTuple, FRAME_KIND_CLOSE, FRAME_KIND_RECORD};
use crate::health::{WalHealth, WAL_FILE_RETRY_MS};
use crate::limits;
use crate::metrics::{CoreMetrics, GaugeGuard, OpKind};
use crate::notify::{LocalBroadcast, LocalNotify};
use crate::state::{AppendCommand, AppendOutcome, ForkOrigin, StreamConfig, StreamState};
use crate::{now_ms, Durability, EngineConfig};

/// A merged chunk stops growing at this size so a read never scans far inside one.
const CHUNK_BYTES_MAX: u64 = 256 * 1024;
/// A coarse chunk of a sealed segment spans at most this many bytes (own and other streams'
/// frames), bounding what a read scans to find its first record.
const SEALED_CHUNK_BYTES_MAX: u64 = 1024 * 1024;
/// Uploaded segments are read and cached in blocks of this size (ranged GETs).
const BLOCK_BYTES: usize = 1024 * 1024;
/// A sequential reader's readahead doubles per GET up to this many blocks.
const READAHEAD_BLOCKS_MAX: u64 = 8;
/// Chunks a read keeps fetching from the bucket ahead of the one it decodes. Object
/// durability seals a segment every few milliseconds, so a catch-up read after a failover or
/// a restart spans hundreds of small objects: one GET at a time would read at one round trip
/// per segment (measured: 11 s for a 1 MiB page of 2 KiB records on Garage, debug build).
const READ_GETS_AHEAD: usize = 16;
/// How often the gauges of [`CoreMetrics`] are refreshed.
const GAUGE_REFRESH_INTERVAL: Duration = Duration::from_millis(250);
/// How often expired streams are looked for.
const REAPER_INTERVAL: Duration = Duration::from_secs(1);
/// Streams a core remembers having let go to another node, at most (cleared when full).
const REMOTE_OWNERS_MAX: usize = 100_000;
/// Longest a transfer waits for this core to store what it holds of the stream.
const HAND_OFF_FLUSH_TIMEOUT: Duration = Duration::from_secs(30);
/// Expired streams deleted per reaper round (the rest wait for the next round).
const REAPER_BATCH_MAX: usize = 1000;
/// Extra room in an active segment buffer past `segment_size`: a rotation can be late by the
/// requests that arrive before the next WAL file is ready.
const SEGMENT_SLACK_BYTES: usize = 1024 * 1024;

/// Where one stream's records `first_offset..next_offset` lie: bytes `byte_start..byte_end`
/// of local segment `segment`.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    first_offset: u64,
    next_offset: u64,
    segment: u64,
    byte_start: u64,
    byte_end: u64,
    /// The newest record's timestamp: retention by age drops a chunk once this is too old.
    last_timestamp_ms: i64,
}

struct Stream {
    state: StreamState,
    /// Sorted by offset, contiguous.
    chunks: Vec<Chunk>,
    /// Readers parked until the durable tail moves.
    waiters: Vec<oneshot::Sender<()>>,
    /// The idle clock last written to the metadata log (sliding TTL only).
    recorded_access_ms: i64,
    /// The owner epoch this node holds the stream at (cluster; 0 on a single node): every
    /// metadata write for the stream is fenced by it.
    epoch: u64,
}

/// A recovered stream handed to its core at startup.
#[derive(Clone, Debug)]
pub struct StreamSeed {
    pub name: String,
    pub id: u64,
    pub config: StreamConfig,
    pub created_ms: i64,
    pub closed: bool,
    pub next_offset: u64,
    pub last_timestamp_ms: i64,
    /// `(segment key, segment size, run, newest timestamp of the stream in that segment)`
    /// sorted by offset.
    pub runs: Vec<(std::sync::Arc<str>, u64, SegmentRun, i64)>,
    /// First readable offset (raised by trims).
    pub start_offset: u64,
    /// The idle clock as last recorded in the metadata log.
    pub last_access_ms: i64,
    pub producers: BTreeMap<String, (u64, u64)>,
    pub closed_by: Option<ProducerTuple>,
    pub fork: Option<ForkOrigin>,
    /// Forks (live or soft-deleted) whose origin is this stream.
    pub fork_refs: u64,
    pub soft_deleted: bool,
    pub writer_seq: Option<String>,
    /// The owner epoch (cluster), see `Stream::epoch`.
    pub epoch: u64,
}

/// Per-stream index of a segment being built.
#[derive(Default)]
struct IndexEntry {
    runs: Vec<SegmentRun>,
    last_timestamp_ms: i64,
    closed: bool,
    producers: BTreeMap<String, (u64, u64)>,
    closed_by: Option<ProducerTuple>,
    writer_seq: Option<String>,
    /// The stream's name, to find its chunks when the segment seals.
    name: Option<Rc<str>>,
    /// The owner epoch the frames were written at (cluster), fencing the segment's commit.
    epoch: u64,
}

/// What one append request writes.
struct Frames<'a> {
    records: &'a [RecordInput],
    close: bool,
    producer: Option<&'a ProducerTuple>,
    writer_seq: Option<&'a str>,
}

/// A segment whose frames are still being written to its WAL file.
struct OpenSegment {
    no: u64,
    key: String,
    buf: Vec<u8>,
    /// Bytes of `buf` known to be on disk.
    durable_len: usize,
    wal: Option<Rc<DmaFile>>,
    wal_path: Option<PathBuf>,
    opened: Instant,
    index: BTreeMap<u64, IndexEntry>,
}

enum SegmentData {
    /// Still an [`OpenSegment`] in the log.
    Open,
    /// Sealed and held in memory (uploaded or not yet).
    Memory(Bytes),
    /// Only in the object store: read by blocks (ranged GETs) through the block cache.
    Remote,
}

struct SegmentSlot {
    key: Rc<str>,
    data: SegmentData,
    uploaded: bool,
    /// Object size in bytes (known once sealed): bounds the last block's range.
    size: u64,
}

/// A block of an uploaded segment in the block cache.
enum Block {
    Ready(Bytes),
    /// One ranged GET is in flight for it; these readers wait for that GET.
    Loading(Vec<oneshot::Sender<Result<Bytes, EngineError>>>),
}

/// Sequential-read detection per segment: the block a reader continuing from the last fetch
/// would ask for next, and how many blocks the last GET fetched.
#[derive(Clone, Copy)]
struct Readahead {
    next_block: u64,
    window_blocks: u64,
}

/// A sealed segment on its way to the bucket and the catalog.
struct Sealed {
    no: u64,
    bytes: Bytes,
    record: SegmentRecord,
    /// Cluster: the owner epochs the segment's streams were written at.
    fence: Option<SegmentFence>,
    names: HashMap<u64, Rc<str>>,
}

struct PendingAck {
    segment: u64,
    end: usize,
    name: Rc<str>,
    stream_id: u64,
    /// The owner epoch of the incarnation that wrote the frames (0 on a single node).
    epoch: u64,
    next_offset: u64,
    closed: bool,
    body_bytes: usize,
    reply: oneshot::Sender<Result<(), EngineError>>,
}

pub(crate) struct Shard {
    core: usize,
    config: EngineConfig,
    meta: MetaStore,
    store: ObjectStore,
    streams: RefCell<BTreeMap<Rc<str>, Stream>>,
    /// Open segments, oldest first; the last one is active (takes new frames).
    log: RefCell<VecDeque<OpenSegment>>,
    segments: RefCell<HashMap<u64, SegmentSlot>>,
    /// Uploaded segments held in memory, oldest first, for the cache budget.
    cached: RefCell<VecDeque<(u64, usize)>>,
    cached_bytes: Cell<usize>,
    /// Blocks of uploaded segments, by (segment, block index), with FIFO eviction.
    blocks: RefCell<HashMap<(u64, u64), Block>>,
    block_lru: RefCell<VecDeque<(u64, u64, usize)>>,
    block_bytes: Cell<usize>,
    readahead: RefCell<HashMap<u64, Readahead>>,
    pending: RefCell<VecDeque<PendingAck>>,
    /// Sealed segments not yet in the catalog, in seal order: each commits only after the one
    /// before it (see `upload`).
    commit_order: RefCell<VecDeque<u64>>,
    /// Uploads whose PUT is done, waiting for their turn to commit.
    commit_turn_waiters: RefCell<Vec<oneshot::Sender<()>>>,
    in_flight_bytes: Cell<usize>,
    /// Bytes of sealed segments not yet in the object store.
    unuploaded_bytes: Cell<usize>,
    next_segment_no: Cell<u64>,
    segment_counter: Cell<u64>,
    /// A WAL file created ahead of time so a rotation never waits for the filesystem.
    spare_wal: RefCell<Option<(Rc<DmaFile>, PathBuf, u64)>>,
    commit_wanted: LocalNotify,
    /// Whether the WAL takes appends (`crate::health`).
    health: RefCell<WalHealth>,
    /// When the next WAL file may be tried again after it could not be made.
    next_file_retry_at: Cell<Option<Instant>>,
    /// Sources whose fork went away (deleted or expired here): the node's release task
    /// tells their cores, which may then drop a soft-deleted source.
    fork_releases: RefCell<Vec<(String, u64)>>,
    pub(crate) fork_released: LocalNotify,
    metrics: Arc<CoreMetrics>,
    /// Graceful shutdown began: live reads stop waiting.
    stopping: Cell<bool>,
    /// This node's cluster membership (`None`: a single node).
    cluster: Option<Arc<Cluster>>,
    /// Streams this core let go to another node (handed off, fenced): name → node (0: not
    /// known). An operation already past routing when the stream left is sent there.
    remote: RefCell<HashMap<Rc<str>, NodeId>>,
    /// Incarnations (stream id, owner epoch) this core lost to another node while appends
    /// to them were pending: those acknowledgements fail instead of being released. Keyed by
    /// epoch, not id: the stream may be loaded here again, and its new appends are not the
    /// old incarnation's. Pruned once no pending acknowledgement names an entry.
    fenced: RefCell<HashSet<(u64, u64)>>,
    /// Streams being handed to another node: new operations wait for the hand-off.
    handing_off: RefCell<HashSet<Rc<str>>>,
    handed_off: LocalBroadcast,
}

/// Why a WAL file could not be made.
struct WalFileError {
    message: String,
    /// The filesystem is full (or the quota is): retried until it is not.
    out_of_space: bool,
}

impl WalFileError {
    fn new(what: String, e: std::io::Error) -> WalFileError {
        let out_of_space = matches!(
            e.kind(),
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
        );
        WalFileError {
            message: format!("{what}: {e}"),
            out_of_space,
        }
    }
}

/// Bytes the frames of one append take in a segment.
fn frames_len(
    records: &[RecordInput],
    producer: Option<&ProducerTuple>,
    writer_seq: Option<&str>,
) -> usize {
    records
        .iter()
        .map(|r| frame::frame_len(&r.headers, None, None, r.body.len()))
        .sum::<usize>()
        + frame::frame_len(&[], producer, writer_seq, 0)
}

/// What one stream's retention policy asks for now.
enum RetentionAction {
    /// Raise the start from `from` to `to`.
    Trim { name: Rc<str>, from: u64, to: u64 },
    /// The stream is empty and idle past its delete-on-empty time.
    Delete { name: Rc<str> },
}

/// Retention acts on whole chunks of a stream (each within one segment), only on durable
/// records, and never on a stream that forks read through (`fork_refs`) or on a fork (whose
/// first records are its source's): those keep what they have until the forks are gone.
fn retention_action(name: &Rc<str>, stream: &Stream, now_ms: i64) -> Option<RetentionAction> {
    let state = &stream.state;
    let retention = state.config.retention;
    if retention.is_off() || state.fork_refs > 0 || state.fork.is_some() || state.soft_deleted {
        return None;
    }
    let durable = |c: &&Chunk| c.next_offset <= state.durable_offset;
    let mut to = state.start_offset;
    if let Some(age_ms) = retention.age_ms {
        let cutoff = now_ms.saturating_sub(i64::try_from(age_ms).unwrap_or(i64::MAX));
        for chunk in stream.chunks.iter().take_while(durable) {
            if chunk.last_timestamp_ms >= cutoff {
                break;
            }
            to = to.max(chunk.next_offset);
        }
    }
    if let Some(limit) = retention.bytes {
        let size = |c: &Chunk| c.byte_end - c.byte_start;
        let mut stored: u64 = stream
            .chunks
            .iter()
            .filter(|c| c.next_offset > to)
            .map(size)
            .sum();
        // The newest chunk stays, so a byte limit never empties a stream by itself.
        let older = stream.chunks.len().saturating_sub(1);
        for chunk in stream.chunks.iter().take(older).take_while(durable) {
            if stored <= limit {
                break;
            }
            if chunk.next_offset > to {
                stored -= size(chunk);
                to = chunk.next_offset;
            }
        }
    }
    if to > state.start_offset {
        return Some(RetentionAction::Trim {
            name: name.clone(),
            from: state.start_offset,
            to,
        });
    }
    if let Some(idle_ms) = retention.delete_on_empty_ms {
        let empty =
            state.start_offset >= state.durable_offset && state.next_offset == state.durable_offset;
        let last_write_ms = state.last_timestamp_ms.max(state.created_ms);
        let idle = now_ms.saturating_sub(last_write_ms);
        if empty && idle >= i64::try_from(idle_ms).unwrap_or(i64::MAX) {
            return Some(RetentionAction::Delete { name: name.clone() });
        }
    }
    None
}

fn info_of(state: &StreamState) -> StreamInfo {
    StreamInfo {
        id: state.id,
        content_type: state.config.content_type.clone(),
        ttl_sec: state.config.ttl_sec,
        expires_at_ms: state.config.expires_at_ms,
        start_offset: state.start_offset,
        next_offset: state.durable_offset,
        closed: state.closed_durable,
        retention: state.config.retention,
    }
}

impl Shard {
    pub(crate) async fn start(
        core: usize,
        config: EngineConfig,
        meta: MetaStore,
        store: ObjectStore,
        seeds: Vec<StreamSeed>,
        metrics: Arc<CoreMetrics>,
        cluster: Option<Arc<Cluster>>,
    ) -> Result<Rc<Shard>, String> {
        let shard = Rc::new(Shard {
            core,
            config,
            meta,
            store,
            streams: RefCell::new(BTreeMap::new()),
            log: RefCell::new(VecDeque::new()),
            segments: RefCell::new(HashMap::new()),
            cached: RefCell::new(VecDeque::new()),
            cached_bytes: Cell::new(0),
            blocks: RefCell::new(HashMap::new()),
            block_lru: RefCell::new(VecDeque::new()),
            block_bytes: Cell::new(0),
            readahead: RefCell::new(HashMap::new()),
            pending: RefCell::new(VecDeque::new()),
            commit_order: RefCell::new(VecDeque::new()),
            commit_turn_waiters: RefCell::new(Vec::new()),
            in_flight_bytes: Cell::new(0),
            unuploaded_bytes: Cell::new(0),
            next_segment_no: Cell::new(0),
            segment_counter: Cell::new(0),
            spare_wal: RefCell::new(None),
            commit_wanted: LocalNotify::default(),
            health: RefCell::new(WalHealth::Ok),
            next_file_retry_at: Cell::new(None),
            fork_releases: RefCell::new(Vec::new()),
            fork_released: LocalNotify::default(),
            metrics,
            stopping: Cell::new(false),
            cluster,
            remote: RefCell::new(HashMap::new()),
            fenced: RefCell::new(HashSet::new()),
            handing_off: RefCell::new(HashSet::new()),
            handed_off: LocalBroadcast::default(),
        });
        shard.load_seeds(seeds);
        let first = shard.create_wal_file().await.map_err(|e| e.message)?;
        shard.open_segment(first);
        let commit = shard.clone();
        glommio::spawn_local(async move { commit.commit_loop().await }).detach();
        let ager = shard.clone();
        glommio::spawn_local(async move { ager.age_loop().await }).detach();
        let reaper = shard.clone();
        glommio::spawn_local(async move { reaper.reaper_loop().await }).detach();
        let retainer = shard.clone();
        glommio::spawn_local(async move { retainer.retention_loop().await }).detach();
        let gauges = shard.clone();
        glommio::spawn_local(async move { gauges.gauges_loop().await }).detach();
        Ok(shard)
    }

    fn load_seeds(&self, seeds: Vec<StreamSeed>) {
        let mut keys: HashMap<std::sync::Arc<str>, u64> = HashMap::new();
        let mut streams = self.streams.borrow_mut();
        let mut segments = self.segments.borrow_mut();
        for seed in seeds {
            let mut state = StreamState::new(seed.id, seed.config, seed.closed, seed.created_ms);
            state.created_ms = seed.created_ms;
            state.next_offset = seed.next_offset;
            state.durable_offset = seed.next_offset;
            state.last_timestamp_ms = seed.last_timestamp_ms;
            // The idle clock resumes where it stood: the last recorded access, or the last
            // append (its timestamp is durable with the record), never the restart itself.
            state.last_access_ms = seed.last_access_ms.max(seed.last_timestamp_ms);
            let mut chunks = Vec::with_capacity(seed.runs.len());
            for (key, segment_size, run, last_timestamp_ms) in seed.runs {
                let no = *keys.entry(key.clone()).or_insert_with(|| {
                    let no = self.next_segment_no.get();
                    self.next_segment_no.set(no + 1);
                    segments.insert(
                        no,
                        SegmentSlot {
                            key: Rc::from(&*key),
                            data: SegmentData::Remote,
                            uploaded: true,
                            size: segment_size,
                        },
                    );
                    no
                });
                chunks.push(Chunk {
                    first_offset: run.first_offset,
                    next_offset: run.next_offset,
                    segment: no,
                    byte_start: run.byte_start,
                    byte_end: run.byte_end,
                    last_timestamp_ms,
                });
            }
            // A fork's own records start at its fork point; below it the source's are read.
            state.fork = seed.fork;
            state.fork_refs = seed.fork_refs;
            state.soft_deleted = seed.soft_deleted;
            let base = state.own_base();
            state.next_offset = state.next_offset.max(base);
            state.durable_offset = state.next_offset;
            let first_stored = chunks.first().map_or(base, |c| c.first_offset);
            let first_stored = if base > 0 { 0 } else { first_stored };
            state.start_offset = seed.start_offset.max(first_stored).min(state.next_offset);
            chunks.retain(|c| c.next_offset > state.start_offset);
            coarsen(&mut chunks, None);
            state.producers = seed.producers;
            state.closed_by = seed.closed_by;
            state.writer_seq = seed.writer_seq;
            let name: Rc<str> = Rc::from(seed.name.as_str());
            self.remote.borrow_mut().remove(&name);
            streams.insert(
                name,
                Stream {
                    recorded_access_ms: state.last_access_ms,
                    state,
                    chunks,
                    waiters: Vec::new(),
                    epoch: seed.epoch,
                },
            );
        }
        CoreMetrics::set(&self.metrics.streams, streams.len() as u64);
    }

    // ---------------------------------------------------------------- operations

    pub(crate) async fn execute(self: &Rc<Self>, name: &str, op: Op) -> Result<Reply, EngineError> {
        match op {
            Op::Read(request) => self.execute_read(name, request).await.map(Reply::Read),
            op => Box::pin(self.execute_counted(name, op)).await,
        }
    }

    /// A read, counted. Its own path, without the `Op` and `Reply` wrapping the other
    /// operations take: a read may park at the tail (a long-poll, an SSE subscriber, thousands
    /// at once), and every layer's copy of its request would stay with it.
    pub(crate) async fn execute_read(
        self: &Rc<Self>,
        name: &str,
        request: ReadRequest,
    ) -> Result<ReadBatch, EngineError> {
        // A live read's time is mostly waiting for data, not work: its latency is not recorded.
        let timed = request.wait_ms.is_none_or(|ms| ms == 0);
        let started = Instant::now();
        if self.cluster.is_some() {
            Box::pin(self.route(name, &Op::Read(request.clone()))).await?;
        }
        let result = self.read(name, request).await;
        if let Ok(batch) = &result {
            let bytes: usize = batch.records.iter().map(|r| r.body.len()).sum();
            CoreMetrics::add(&self.metrics.records_read, batch.records.len() as u64);
            CoreMetrics::add(&self.metrics.bytes_read, bytes as u64);
        }
        self.count_op(OpKind::Read, result.is_err(), timed.then_some(started));
        result
    }

    /// One operation done: counted, failed or not, and timed from `started` when given.
    fn count_op(&self, kind: OpKind, failed: bool, started: Option<Instant>) {
        let metrics = self.metrics.op(kind);
        CoreMetrics::add(&metrics.total, 1);
        if failed {
            CoreMetrics::add(&metrics.errors, 1);
        }
        if let Some(started) = started {
            metrics.latency.observe(started.elapsed());
        }
    }

    /// Every operation but a read, counted (boxed by `execute`).
    async fn execute_counted(self: &Rc<Self>, name: &str, op: Op) -> Result<Reply, EngineError> {
        let kind = match &op {
            Op::Create { .. } => OpKind::Create,
            Op::Append(_) => OpKind::Append,
            Op::Read(_) => OpKind::Read,
            Op::Head => OpKind::Head,
            Op::Delete => OpKind::Delete,
            Op::Trim { .. } => OpKind::Trim,
            Op::Configure { .. } => OpKind::Configure,
            Op::ForkAcquire { .. } | Op::ForkRelease { .. } => OpKind::Fork,
        };
        let started = Instant::now();
        let result = self.execute_op(name, op).await;
        self.count_op(kind, result.is_err(), Some(started));
        result
    }

    async fn execute_op(self: &Rc<Self>, name: &str, op: Op) -> Result<Reply, EngineError> {
        if self.cluster.is_some() {
            self.route(name, &op).await?;
        }
        match op {
            Op::Create {
                config,
                closed,
                records,
                fork,
            } => {
                let origin = match fork {
                    None => None,
                    Some(Fork::Resolved(origin)) => Some(origin),
                    Some(Fork::Spec(_)) => {
                        return Err(EngineError::Invalid(
                            "a fork must be resolved by its source first".into(),
                        ))
                    }
                };
                self.create(name, config, closed, records, origin).await
            }
            Op::Append(request) => self.append(name, request).await.map(Reply::Appended),
            Op::ForkAcquire {
                offset,
                partial_bytes,
            } => self.fork_acquire(name, offset, partial_bytes).await,
            Op::ForkRelease { source_id } => {
                self.fork_release(name, source_id).await?;
                Ok(Reply::Released)
            }
            Op::Trim { offset } => self
                .trim(name, offset)
                .await
                .map(|start_offset| Reply::Trimmed { start_offset }),
            Op::Configure { change } => self.configure(name, change).await.map(Reply::Configured),
            Op::Read(request) => self.read(name, request).await.map(Reply::Read),
            Op::Head => self.head(name).await.map(Reply::Head),
            Op::Delete => self.delete(name).await.map(|()| Reply::Deleted),
        }
    }

    /// Looks a stream up, deleting it first if it expired (lazy expiry). An expired stream
    /// that forks still read is kept for them but is gone for clients.
    async fn live_stream_id(&self, name: &str, touch: bool) -> Result<u64, EngineError> {
        let now = now_ms();
        let (id, expired) = {
            let mut streams = self.streams.borrow_mut();
            let Some(stream) = streams.get_mut(name) else {
                return Err(self.missing(name));
            };
            if stream.state.soft_deleted {
                return Err(EngineError::Gone);
            }
            let expired = stream.state.is_expired(now);
            if expired && stream.state.fork_refs > 0 {
                return Err(EngineError::NotFound);
            }
            if touch && !expired {
                stream.state.touch(now);
                self.record_access(stream);
            }
            (stream.state.id, expired)
        };
        if expired {
            // Rare, and boxed so that it does not size every read's future.
            Box::pin(self.remove_stream(name, id)).await?;
            return Err(EngineError::NotFound);
        }
        Ok(id)
    }

    /// Writes a sliding-TTL stream's idle clock to the metadata log once it moved by a tenth
    /// of the TTL (at least 1 s), so a restart neither revives an expired stream nor
    /// forgets recent reads; far fewer writes than reads.
    fn record_access(&self, stream: &mut Stream) {
        let Some(ttl_sec) = stream.state.config.ttl_sec else {
            return;
        };
        let step_ms = i64::try_from(ttl_sec.saturating_mul(100))
            .unwrap_or(i64::MAX)
            .max(1000);
        if stream.state.last_access_ms - stream.recorded_access_ms >= step_ms {
            stream.recorded_access_ms = stream.state.last_access_ms;
            drop(self.meta.touch_stream_fenced(
                stream.state.id,
                stream.state.last_access_ms,
                self.fence(stream),
            ));
        }
    }

    async fn create(
        self: &Rc<Self>,
        name: &str,
        config: StreamConfig,
        closed: bool,
        records: Vec<RecordInput>,
        fork: Option<ForkOrigin>,
    ) -> Result<Reply, EngineError> {
        // The protocols refuse larger TTLs with their own wording; this guards every caller.
        if config.ttl_sec.is_some_and(|ttl| ttl > limits::TTL_SEC_MAX) {
            return Err(EngineError::Invalid(format!(
                "a TTL must be at most {} seconds",
                limits::TTL_SEC_MAX
            )));
        }
        let found = self.live_stream_id(name, false).await;
        if let Err(EngineError::Gone) = found {
            let streams = self.streams.borrow();
            let stream = streams.get(name).ok_or(EngineError::NotFound)?;
            stream
                .state
                .check_recreate(&config, closed, fork.as_ref())?;
        }
        if found.is_err() && self.streams.borrow().contains_key(name) {
            // Expired, but forks still read it: the name stays taken until they are gone.
            return Err(EngineError::ConfigMismatch {
                message: "an expired stream with live forks still holds this name".into(),
                next_offset: 0,
            });
        }
        if found.is_ok() {
            return self.already_created(name, &config, closed, fork.as_ref());
        }
        // A create with a body the WAL cannot take is refused whole, not left half done (a
        // stream without its records).
        if !records.is_empty() {
            self.check_writable(frames_len(&records, None, None))?;
        }
        let meta_config = MetaConfig {
            content_type: config.content_type.clone(),
            ttl_sec: config.ttl_sec,
            expires_at_ms: config.expires_at_ms,
            // A body given with a closing create is appended first, then the close.
            closed: closed && records.is_empty(),
            retention: config.retention,
        };
        let fork_row = fork.as_ref().map(|f| pico_meta::ForkRow {
            source: f.source.clone(),
            source_id: f.source_id,
            offset: f.offset,
            partial_bytes: f.partial_bytes,
        });
        let me = self.cluster.as_ref().map(|c| c.node_id());
        let outcome = self
            .meta
            .create_stream_owned(name, meta_config, fork_row, now_ms(), me)
            .await
            .map_err(|_| EngineError::ShuttingDown)?
            .map_err(|e| EngineError::Storage(e.to_string()))?;
        if let (Some(cluster), false) = (&self.cluster, outcome.created) {
            // Registered meanwhile by another node (or by this one before a restart): serve
            // it where it lives.
            if outcome.ownership.node != me {
                return Err(cluster.moved_to(outcome.ownership.node));
            }
            self.adopt(name, outcome.row.id).await?;
            return self.already_created(name, &config, closed, fork.as_ref());
        }
        let row = outcome.row;
        let created = {
            let mut streams = self.streams.borrow_mut();
            if let Some(existing) = streams.get(name) {
                // Another create of the same name on this core won the race.
                existing
                    .state
                    .check_recreate(&config, closed, fork.as_ref())?;
                false
            } else {
                let row_config = StreamConfig {
                    content_type: row.config.content_type.clone(),
                    ttl_sec: row.config.ttl_sec,
                    expires_at_ms: row.config.expires_at_ms,
                    retention: row.config.retention,
                };
                let mut state =
                    StreamState::new(row.id, row_config, row.config.closed, row.created_ms);
                if let Some(origin) = &fork {
                    state.next_offset = origin.base();
                    state.durable_offset = origin.base();
                }
                state.fork = fork.clone();
                if !outcome.created {
                    state.check_recreate(&config, closed, fork.as_ref())?;
                }
                streams.insert(
                    Rc::from(name),
                    Stream {
                        recorded_access_ms: state.last_access_ms,
                        state,
                        chunks: Vec::new(),
                        waiters: Vec::new(),
                        epoch: outcome.ownership.epoch,
                    },
                );
                CoreMetrics::set(&self.metrics.streams, streams.len() as u64);
                outcome.created
            }
        };
        let mut first = None;
        if created && !records.is_empty() {
            let request = AppendRequest {
                records,
                close: closed,
                match_offset: None,
                producer: None,
                content_type: None,
                writer_seq: None,
            };
            first = Some(self.append(name, request).await?);
        }
        let streams = self.streams.borrow();
        let stream = streams.get(name).ok_or(EngineError::NotFound)?;
        Ok(Reply::Created {
            created,
            info: info_of(&stream.state),
            first,
        })
    }

    /// The answer to a create of a name this core already serves: `200` when the configuration
    /// matches, a conflict otherwise.
    fn already_created(
        &self,
        name: &str,
        config: &StreamConfig,
        closed: bool,
        fork: Option<&ForkOrigin>,
    ) -> Result<Reply, EngineError> {
        let streams = self.streams.borrow();
        let stream = streams.get(name).ok_or(EngineError::NotFound)?;
        stream.state.check_recreate(config, closed, fork)?;
        Ok(Reply::Created {
            created: false,
            info: info_of(&stream.state),
            first: None,
        })
    }

    async fn append(
        self: &Rc<Self>,
        name: &str,
        request: AppendRequest,
    ) -> Result<AppendAck, EngineError> {
        let AppendRequest {
            records,
            close,
            match_offset,
            producer,
            content_type,
            writer_seq,
        } = request;
        if producer
            .as_ref()
            .is_some_and(|p| p.id.len() > frame::PRODUCER_ID_LEN_MAX)
        {
            return Err(EngineError::Invalid(format!(
                "producer id longer than {} bytes",
                frame::PRODUCER_ID_LEN_MAX
            )));
        }
        if writer_seq
            .as_ref()
            .is_some_and(|w| w.len() > frame::WRITER_SEQ_LEN_MAX)
        {
            return Err(EngineError::Invalid(format!(
                "Stream-Seq longer than {} bytes",
                frame::WRITER_SEQ_LEN_MAX
            )));
        }
        if records.len() > limits::RECORDS_PER_APPEND_MAX {
            return Err(EngineError::Invalid(format!(
                "at most {} records per append",
                limits::RECORDS_PER_APPEND_MAX
            )));
        }
        let body_bytes: usize = records.iter().map(|r| r.body.len()).sum();
        if self.in_flight_bytes.get() + body_bytes > self.config.in_flight_bytes_max
            && self.in_flight_bytes.get() > 0
        {
            return Err(EngineError::Overloaded {
                limit: "in-flight bytes per core",
                retry_after_sec: limits::OVERLOADED_RETRY_AFTER_SEC,
            });
        }
        if self.unuploaded_bytes.get() > self.config.unuploaded_bytes_max {
            return Err(EngineError::Overloaded {
                limit: "unuploaded bytes per core (the object store is behind)",
                retry_after_sec: limits::OVERLOADED_RETRY_AFTER_SEC,
            });
        }
        // Before the stream's state moves: a refused append has no offset.
        self.check_writable(frames_len(
            &records,
            producer.as_ref(),
            writer_seq.as_deref(),
        ))?;
        let id = self.live_stream_id(name, false).await?;
        self.one_incarnation_per_segment(name, id)?;
        let now = now_ms();
        let written = {
            let mut streams = self.streams.borrow_mut();
            let key = streams
                .get_key_value(name)
                .ok_or(EngineError::NotFound)?
                .0
                .clone();
            let stream = streams.get_mut(&key).expect("looked up above");
            if self.handing_off.borrow().contains(name) {
                return Err(EngineError::NotOwner(
                    "the stream is moving to another node; retry".into(),
                ));
            }
            let command = AppendCommand {
                records: records.len() as u64,
                close,
                match_offset,
                producer: producer.as_ref(),
                content_type: content_type.as_deref(),
                writer_seq: writer_seq.as_deref(),
            };
            let outcome = stream.state.apply_append(command, now)?;
            self.record_access(stream);
            match outcome {
                AppendOutcome::Appended {
                    start_offset,
                    next_offset,
                    timestamp_ms,
                    closed,
                } => {
                    let ack = AppendAck {
                        start_offset: Some(start_offset),
                        next_offset,
                        timestamp_ms: Some(timestamp_ms),
                        closed,
                        duplicate_of_seq: None,
                    };
                    let frames = Frames {
                        records: &records,
                        close: closed,
                        producer: producer.as_ref(),
                        writer_seq: writer_seq.as_deref(),
                    };
                    let rx = self.write_frames(&key, stream, frames, &ack, body_bytes);
                    Ok((rx, ack))
                }
                AppendOutcome::Closed { next_offset, newly } => {
                    let ack = AppendAck {
                        start_offset: None,
                        next_offset,
                        timestamp_ms: None,
                        closed: true,
                        duplicate_of_seq: None,
                    };
                    if newly {
                        let frames = Frames {
                            records: &records,
                            close: true,
                            producer: producer.as_ref(),
                            writer_seq: None,
                        };
                        let rx = self.write_frames(&key, stream, frames, &ack, body_bytes);
                        Ok((rx, ack))
                    } else {
                        Err((ack, next_offset, true))
                    }
                }
                AppendOutcome::Duplicate {
                    next_offset,
                    last_seq,
                    closed,
                } => {
                    let ack = AppendAck {
                        start_offset: None,
                        next_offset,
                        timestamp_ms: None,
                        closed,
                        duplicate_of_seq: Some(last_seq),
                    };
                    Err((ack, next_offset, closed))
                }
            }
        };
        let (ack_rx, ack) = match written {
            Ok(written) => written,
            // Nothing to write (already closed, or a producer retry): answer once what the
            // original request wrote is durable.
            Err((ack, offset, closed)) => {
                return self.after_durable(name, ack, offset, closed).await
            }
        };
        self.commit_wanted.notify();
        match ack_rx.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(EngineError::ShuttingDown),
        }
        if let Some(start) = ack.start_offset {
            CoreMetrics::add(&self.metrics.records_appended, ack.next_offset - start);
            CoreMetrics::add(&self.metrics.bytes_appended, body_bytes as u64);
        }
        if ack.closed {
            if let Ok(id) = self.live_stream_id(name, false).await {
                // Durable already through the WAL close frame; the registry follows for listings.
                let fence = self.streams.borrow().get(name).and_then(|s| self.fence(s));
                drop(self.meta.close_stream_fenced(id, fence));
            }
        }
        Ok(ack)
    }

    /// A segment's commit is fenced by one owner epoch per stream, so the active segment
    /// never holds frames of two incarnations of a stream (lost to another node and loaded
    /// here again while the segment was open): the older one's frames would be committed
    /// under the newer one's epoch, beside offsets the newer one assigns again. Starts a new
    /// segment when it would; without a spare WAL file for one, the append is refused as
    /// retryable.
    fn one_incarnation_per_segment(&self, name: &str, id: u64) -> Result<(), EngineError> {
        let Some(epoch) = self.streams.borrow().get(name).map(|s| s.epoch) else {
            return Ok(());
        };
        let mixed = || {
            self.log
                .borrow()
                .back()
                .and_then(|segment| segment.index.get(&id))
                .is_some_and(|entry| entry.epoch != epoch)
        };
        if mixed() {
            self.rotate();
            if mixed() {
                return Err(EngineError::NotOwner(
                    "the stream was just loaded again on this node; retry".into(),
                ));
            }
        }
        Ok(())
    }

    /// Answers a request that wrote nothing once everything before it is durable.
    async fn after_durable(
        self: &Rc<Self>,
        name: &str,
        ack: AppendAck,
        offset: u64,
        closed: bool,
    ) -> Result<AppendAck, EngineError> {
        // The incarnation whose state made this a retry: only its own durable tail proves the
        // original stored. If the stream is dropped (fenced: the original's append is refused)
        // and loaded again here from the catalog, the new incarnation's tail passing `offset`
        // says nothing about the original, which may never have been stored; answering then
        // would tell a producer a sequence number is stored that no one has (found by the
        // fault test's cluster profile: the producer was then refused with a sequence gap).
        let incarnation = self
            .streams
            .borrow()
            .get(name)
            .map(|s| (s.state.id, s.epoch));
        loop {
            let rx = {
                let mut streams = self.streams.borrow_mut();
                let stream = match streams.get_mut(name) {
                    Some(s) if Some((s.state.id, s.epoch)) == incarnation => s,
                    None if self.cluster.is_none() => return Err(EngineError::NotFound),
                    _ => {
                        return Err(EngineError::NotOwner(
                            "the stream moved before the original of this retry was stored; \
                             retry"
                                .into(),
                        ))
                    }
                };
                if stream.state.durable_offset >= offset && (!closed || stream.state.closed_durable)
                {
                    return Ok(ack);
                }
                let (tx, rx) = oneshot::channel();
                stream.waiters.push(tx);
                rx
            };
            let _ = rx.await;
        }
    }

    /// Frames the records into the active segment and queues their acknowledgement. The last
    /// frame of the request carries the request-end flag and the producer tuple.
    fn write_frames(
        &self,
        name: &Rc<str>,
        stream: &mut Stream,
        frames: Frames<'_>,
        ack: &AppendAck,
        body_bytes: usize,
    ) -> oneshot::Receiver<Result<(), EngineError>> {
        let Frames {
            records,
            close,
            producer,
            writer_seq,
        } = frames;
        self.maybe_rotate(frames_len(records, producer, writer_seq));
        let mut log = self.log.borrow_mut();
        let segment = log.back_mut().expect("an active segment always exists");
        let id = stream.state.id;
        let byte_start = segment.buf.len() as u64;
        let timestamp = ack.timestamp_ms.unwrap_or(stream.state.last_timestamp_ms);
        let first_offset = ack.start_offset.unwrap_or(ack.next_offset);
        for (i, record) in records.iter().enumerate() {
            let last = i + 1 == records.len() && !close;
            let meta = FrameMeta {
                kind: FRAME_KIND_RECORD,
                stream_id: id,
                offset: first_offset + i as u64,
                timestamp_ms: timestamp,
                request_end: last,
                producer: if last { producer } else { None },
                writer_seq: if last { writer_seq } else { None },
            };
            frame::encode_frame(&mut segment.buf, meta, &record.headers, &record.body);
        }
        if close {
            let meta = FrameMeta {
                kind: FRAME_KIND_CLOSE,
                stream_id: id,
                offset: ack.next_offset,
                timestamp_ms: timestamp,
                request_end: true,
                producer,
                writer_seq,
            };
            frame::encode_frame(&mut segment.buf, meta, &[], &[]);
        }
        let byte_end = segment.buf.len() as u64;
        let entry = segment.index.entry(id).or_default();
        if entry.name.is_none() {
            entry.name = Some(name.clone());
        }
        entry.epoch = stream.epoch;
        entry.last_timestamp_ms = entry.last_timestamp_ms.max(timestamp);
        entry.closed |= close;
        if let Some(writer_seq) = writer_seq {
            entry.writer_seq = Some(writer_seq.to_string());
        }
        if let Some(producer) = producer {
            entry
                .producers
                .insert(producer.id.clone(), (producer.epoch, producer.seq));
            if close {
                entry.closed_by = Some(producer.clone());
            }
        }
        if !records.is_empty() {
            let run = SegmentRun {
                first_offset,
                next_offset: ack.next_offset,
                byte_start,
                byte_end,
            };
            match entry.runs.last_mut() {
                Some(last) if last.byte_end == byte_start && last.next_offset == first_offset => {
                    last.next_offset = run.next_offset;
                    last.byte_end = run.byte_end;
                }
                _ => entry.runs.push(run),
            }
            let chunk = Chunk {
                first_offset,
                next_offset: ack.next_offset,
                segment: segment.no,
                byte_start,
                byte_end,
                last_timestamp_ms: timestamp,
            };
            match stream.chunks.last_mut() {
                Some(last)
                    if last.segment == chunk.segment
                        && last.byte_end == byte_start
                        && last.next_offset == first_offset
                        && last.byte_end - last.byte_start < CHUNK_BYTES_MAX =>
                {
                    last.next_offset = chunk.next_offset;
                    last.byte_end = chunk.byte_end;
                    last.last_timestamp_ms = chunk.last_timestamp_ms;
                }
                _ => stream.chunks.push(chunk),
            }
        }
        let (tx, rx) = oneshot::channel();
        self.in_flight_bytes
            .set(self.in_flight_bytes.get() + body_bytes);
        self.pending.borrow_mut().push_back(PendingAck {
            segment: segment.no,
            end: segment.buf.len(),
            name: name.clone(),
            stream_id: id,
            epoch: stream.epoch,
            next_offset: ack.next_offset,
            closed: close,
            body_bytes,
            reply: tx,
        });
        rx
    }

    async fn read(
        self: &Rc<Self>,
        name: &str,
        request: ReadRequest,
    ) -> Result<ReadBatch, EngineError> {
        if let Some(bound) = request.bound {
            return Box::pin(self.read_bounded(name, bound, &request)).await;
        }
        let deadline = request
            .wait_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        let mut from = match request.from {
            ReadFrom::Offset(offset) => offset,
            ReadFrom::AtLeast(offset) => {
                self.live_stream_id(name, false).await?;
                let streams = self.streams.borrow();
                let state = &streams.get(name).ok_or(EngineError::NotFound)?.state;
                offset.max(state.start_offset)
            }
            ReadFrom::Tail => {
                self.live_stream_id(name, false).await?;
                let streams = self.streams.borrow();
                streams
                    .get(name)
                    .ok_or(EngineError::NotFound)?
                    .state
                    .durable_offset
            }
        };
        loop {
            self.live_stream_id(name, true).await?;
            if let Some(batch) = self.inherited_below(name, from, &request) {
                return Ok(batch);
            }
            // On the heap while it runs (it may fetch from the object store): a read parked
            // at the tail then holds only this loop's few words.
            let batch = Box::pin(self.read_once(name, from, &request)).await?;
            let Some(deadline) = deadline else {
                return Ok(batch);
            };
            if !batch.records.is_empty() || batch.closed || from < batch.tail {
                return Ok(batch);
            }
            let now = Instant::now();
            if now >= deadline || self.stopping.get() {
                return Ok(batch);
            }
            let rx = {
                let mut streams = self.streams.borrow_mut();
                let stream = streams.get_mut(name).ok_or(EngineError::NotFound)?;
                stream.waiters.retain(|w| !w.is_canceled());
                if stream.waiters.len() >= limits::WAITERS_PER_STREAM_MAX {
                    return Err(EngineError::Overloaded {
                        limit: "waiters per stream",
                        retry_after_sec: limits::OVERLOADED_RETRY_AFTER_SEC,
                    });
                }
                let (tx, rx) = oneshot::channel();
                stream.waiters.push(tx);
                rx
            };
            let parked = GaugeGuard::enter(&self.metrics.live_waiters);
            let woken = futures_lite::future::or(async { rx.await.is_ok() }, async {
                glommio::timer::sleep(deadline - now).await;
                false
            })
            .await;
            drop(parked);
            if !woken {
                self.live_stream_id(name, false).await?;
                let batch = Box::pin(self.read_once(name, from, &request)).await?;
                return Ok(batch);
            }
            from = batch.next_offset;
        }
    }

    /// A fork read starting below the fork point: an empty batch naming the source, which the
    /// node reads (see `CoreHandle::read`).
    fn inherited_below(&self, name: &str, from: u64, request: &ReadRequest) -> Option<ReadBatch> {
        let streams = self.streams.borrow();
        let state = &streams.get(name)?.state;
        let origin = state.fork.as_ref().filter(|o| from < o.base())?;
        Some(ReadBatch {
            from,
            records: Vec::new(),
            next_offset: from,
            tail: state.durable_offset,
            closed: false,
            content_type: request
                .with_content_type
                .then(|| state.config.content_type.clone()),
            inherit: Some(origin.clone()),
        })
    }

    /// A fork reading what it inherited from this stream: records below `bound.until` and
    /// the first `bound.partial_bytes` of record `bound.until`, also when the stream is
    /// deleted for clients or expired (the fork keeps it).
    async fn read_bounded(
        self: &Rc<Self>,
        name: &str,
        bound: ReadBound,
        request: &ReadRequest,
    ) -> Result<ReadBatch, EngineError> {
        let end = bound.until + u64::from(bound.partial_bytes > 0);
        let from = {
            let streams = self.streams.borrow();
            let stream = streams
                .get(name)
                .filter(|s| s.state.id == bound.source_id)
                .ok_or(EngineError::NotFound)?;
            if end > stream.state.durable_offset {
                return Err(EngineError::Storage(format!(
                    "fork source {name} holds fewer records than its forks inherited"
                )));
            }
            match request.from {
                ReadFrom::Offset(offset) => offset,
                // A trim of the source also removed what its forks inherited from there;
                // past the fork point, the fork's own records come next.
                ReadFrom::AtLeast(offset) => offset.max(stream.state.start_offset.min(end)),
                ReadFrom::Tail => bound.until,
            }
        };
        if from >= end {
            return Ok(ReadBatch {
                from,
                records: Vec::new(),
                next_offset: from,
                tail: end,
                closed: false,
                content_type: None,
                inherit: None,
            });
        }
        if let Some(batch) = self.inherited_below(name, from, request) {
            return Ok(batch);
        }
        let limited = ReadRequest {
            max_records: request.max_records.min((end - from) as usize),
            ..request.clone()
        };
        let mut batch = self.read_once(name, from, &limited).await?;
        batch.records.retain(|r| r.offset < end);
        if bound.partial_bytes > 0 {
            if let Some(last) = batch.records.last_mut().filter(|r| r.offset == bound.until) {
                let keep = (bound.partial_bytes as usize).min(last.body.len());
                last.body = last.body.slice(..keep);
            }
        }
        batch.next_offset = batch.records.last().map_or(from, |r| r.offset + 1);
        batch.tail = end;
        batch.closed = false;
        batch.content_type = None;
        Ok(batch)
    }

    /// One pass over the stored chunks from `from`, bounded by the request's budgets.
    async fn read_once(
        self: &Rc<Self>,
        name: &str,
        from: u64,
        request: &ReadRequest,
    ) -> Result<ReadBatch, EngineError> {
        let max_records = request.max_records.clamp(1, limits::RECORDS_PER_READ_MAX);
        let max_bytes = request.max_bytes.max(1);
        let (chunks, tail, closed_durable, stream_id, content_type) = {
            let streams = self.streams.borrow();
            let stream = streams.get(name).ok_or(EngineError::NotFound)?;
            stream.state.check_read(from)?;
            let tail = stream.state.durable_offset;
            let first = stream.chunks.partition_point(|c| c.next_offset <= from);
            let mut picked = Vec::new();
            let mut bytes = 0u64;
            for chunk in &stream.chunks[first..] {
                if chunk.first_offset >= tail || bytes >= max_bytes as u64 {
                    break;
                }
                bytes += chunk.byte_end - chunk.byte_start;
                picked.push(*chunk);
            }
            let content_type = request
                .with_content_type
                .then(|| stream.state.config.content_type.clone());
            (
                picked,
                tail,
                stream.state.closed_durable,
                stream.state.id,
                content_type,
            )
        };
        let mut records = Vec::new();
        let mut bytes = 0usize;
        let mut next = from;
        let mut prefetched = 0;
        'chunks: for (i, chunk) in chunks.iter().enumerate() {
            while prefetched < chunks.len().min(i + READ_GETS_AHEAD) {
                self.prefetch(&chunks[prefetched]);
                prefetched += 1;
            }
            let (data, trusted) = self.chunk_bytes(chunk).await?;
            let mut pos = 0usize;
            let corrupt = |e| {
                EngineError::Storage(format!("corrupt frame in segment {}: {e:?}", chunk.segment))
            };
            while pos < data.len() {
                // A sealed segment's chunk may span other streams' frames: skip them by header.
                // Frames still in this process's memory were CRC'd when written; what came
                // back from the object store is checked.
                let checked = if trusted {
                    frame::check_frame_trusted(&data, pos)
                } else {
                    frame::check_frame(&data, pos)
                };
                let (header, len) = checked.map_err(corrupt)?;
                let at = pos;
                pos += len;
                if header.stream_id.get() != stream_id
                    || header.kind != FRAME_KIND_RECORD
                    || header.offset.get() < next
                {
                    continue;
                }
                let frame = frame::frame_at(&data, at, &header, len);
                if frame.offset >= tail
                    || records.len() >= max_records
                    || (!records.is_empty() && bytes + len > max_bytes)
                {
                    break 'chunks;
                }
                bytes += len;
                next = frame.offset + 1;
                records.push(RecordView {
                    offset: frame.offset,
                    timestamp_ms: frame.timestamp_ms,
                    headers: frame.headers,
                    body: frame.body,
                });
            }
        }
        if records.is_empty() {
            next = from;
        }
        Ok(ReadBatch {
            from,
            records,
            next_offset: next,
            tail,
            closed: closed_durable && next >= tail,
            content_type,
            inherit: None,
        })
    }

    /// The frames of one chunk: a slice of a sealed segment in memory, a copy out of an open
    /// segment, or blocks of an uploaded one from the block cache (ranged GETs on a miss).
    /// The bytes, and whether they never left this process's memory (no CRC check needed).
    async fn chunk_bytes(self: &Rc<Self>, chunk: &Chunk) -> Result<(Bytes, bool), EngineError> {
        let (start, end) = (chunk.byte_start as usize, chunk.byte_end as usize);
        let (key, size) = {
            let segments = self.segments.borrow();
            let slot = segments.get(&chunk.segment).ok_or_else(|| {
                EngineError::Storage(format!("segment {} is gone", chunk.segment))
            })?;
            match &slot.data {
                SegmentData::Memory(bytes) => return Ok((bytes.slice(start..end), true)),
                SegmentData::Open => {
                    let log = self.log.borrow();
                    let open = log
                        .iter()
                        .find(|s| s.no == chunk.segment)
                        .ok_or_else(|| EngineError::Storage("open segment vanished".into()))?;
                    return Ok((Bytes::copy_from_slice(&open.buf[start..end]), true));
                }
                SegmentData::Remote => (slot.key.clone(), slot.size),
            }
        };
        if end as u64 > size {
            return Err(EngineError::Storage(format!(
                "segment {key} is shorter ({size} bytes) than its catalog entry"
            )));
        }
        let (first, last) = (start / BLOCK_BYTES, (end - 1) / BLOCK_BYTES);
        if first == last {
            let block = self.block(chunk.segment, &key, size, first as u64).await?;
            let offset = first * BLOCK_BYTES;
            return Ok((block.slice(start - offset..end - offset), false));
        }
        let mut out = bytes::BytesMut::with_capacity(end - start);
        for index in first..=last {
            let block = self.block(chunk.segment, &key, size, index as u64).await?;
            let offset = index * BLOCK_BYTES;
            let from = start.max(offset) - offset;
            let to = end.min(offset + block.len()) - offset;
            out.extend_from_slice(&block[from..to]);
        }
        Ok((out.freeze(), false))
    }

    /// One block of an uploaded segment: cached, being fetched (wait for that GET), or fetched
    /// now with one ranged GET that also reads ahead when the reader moves sequentially (the
    /// window doubles up to `READAHEAD_BLOCKS_MAX`).
    async fn block(
        self: &Rc<Self>,
        no: u64,
        key: &Rc<str>,
        size: u64,
        index: u64,
    ) -> Result<Bytes, EngineError> {
        let rx = {
            let mut blocks = self.blocks.borrow_mut();
            match blocks.get_mut(&(no, index)) {
                Some(Block::Ready(bytes)) => {
                    CoreMetrics::add(&self.metrics.cache_hits, 1);
                    return Ok(bytes.clone());
                }
                Some(Block::Loading(waiters)) => {
                    let (tx, rx) = oneshot::channel();
                    waiters.push(tx);
                    rx
                }
                None => {
                    CoreMetrics::add(&self.metrics.cache_misses, 1);
                    let (tx, rx) = oneshot::channel();
                    drop(blocks);
                    self.start_fetch(no, key, size, index, Some(tx));
                    rx
                }
            }
        };
        rx.await.map_err(|_| EngineError::ShuttingDown)?
    }

    /// Starts one ranged GET from block `index` of an uploaded segment, which must be
    /// neither cached nor loading, reading ahead when the reader moves sequentially (the
    /// window doubles up to `READAHEAD_BLOCKS_MAX`); `waiter` learns block `index`'s outcome.
    fn start_fetch(
        self: &Rc<Self>,
        no: u64,
        key: &Rc<str>,
        size: u64,
        index: u64,
        waiter: Option<oneshot::Sender<Result<Bytes, EngineError>>>,
    ) {
        let mut blocks = self.blocks.borrow_mut();
        let mut readahead = self.readahead.borrow_mut();
        let block_count = size.div_ceil(BLOCK_BYTES as u64);
        let window = match readahead.get(&no) {
            Some(r) if r.next_block == index => (r.window_blocks * 2).min(READAHEAD_BLOCKS_MAX),
            _ => 1,
        };
        // Fetch the absent blocks from `index` on, up to the window.
        let mut count = 1;
        while count < window
            && index + count < block_count
            && !blocks.contains_key(&(no, index + count))
        {
            count += 1;
        }
        readahead.insert(
            no,
            Readahead {
                next_block: index + count,
                window_blocks: count,
            },
        );
        blocks.insert((no, index), Block::Loading(waiter.into_iter().collect()));
        for ahead in 1..count {
            blocks.insert((no, index + ahead), Block::Loading(Vec::new()));
        }
        let start = index * BLOCK_BYTES as u64;
        let end = ((index + count) * BLOCK_BYTES as u64).min(size);
        let fetch = self.store.get_range(key, start, end);
        let this = self.clone();
        let key = key.to_string();
        // Spawned once no borrow is held (glommio may poll it right away).
        drop(readahead);
        drop(blocks);
        glommio::spawn_local(async move {
            let result = match fetch.await {
                Ok(Ok(bytes)) => Ok(bytes),
                Ok(Err(e)) => Err(EngineError::Storage(format!("reading {key}: {e}"))),
                Err(_) => Err(EngineError::ShuttingDown),
            };
            this.finish_blocks(no, index, count, result);
        })
        .detach();
    }

    /// Starts the GETs of a chunk's blocks that are neither cached nor loading, without
    /// waiting for them: a catch-up read keeps [`READ_GETS_AHEAD`] chunks in flight.
    fn prefetch(self: &Rc<Self>, chunk: &Chunk) {
        let (key, size) = {
            let segments = self.segments.borrow();
            match segments.get(&chunk.segment) {
                Some(slot) if matches!(slot.data, SegmentData::Remote) => {
                    (slot.key.clone(), slot.size)
                }
                _ => return,
            }
        };
        if chunk.byte_end > size || chunk.byte_end <= chunk.byte_start {
            // chunk_bytes reports it.
            return;
        }
        let first = chunk.byte_start / BLOCK_BYTES as u64;
        let last = (chunk.byte_end - 1) / BLOCK_BYTES as u64;
        for index in first..=last {
            if !self.blocks.borrow().contains_key(&(chunk.segment, index)) {
                CoreMetrics::add(&self.metrics.cache_misses, 1);
                self.start_fetch(chunk.segment, &key, size, index, None);
            }
        }
    }

    /// Files the blocks one ranged GET brought (or fails their waiters) and keeps the block
    /// cache within its byte budget, oldest first.
    fn finish_blocks(&self, no: u64, first: u64, count: u64, result: Result<Bytes, EngineError>) {
        let mut wake = Vec::new();
        {
            let mut blocks = self.blocks.borrow_mut();
            let mut lru = self.block_lru.borrow_mut();
            for i in 0..count {
                let index = first + i;
                let outcome = result.as_ref().map(|bytes| {
                    let from = (i as usize * BLOCK_BYTES).min(bytes.len());
                    let to = ((i as usize + 1) * BLOCK_BYTES).min(bytes.len());
                    bytes.slice(from..to)
                });
                let waiters = match blocks.remove(&(no, index)) {
                    Some(Block::Loading(waiters)) => waiters,
                    Some(ready @ Block::Ready(_)) => {
                        blocks.insert((no, index), ready);
                        continue;
                    }
                    None => Vec::new(),
                };
                if let Ok(block) = &outcome {
                    blocks.insert((no, index), Block::Ready(block.clone()));
                    lru.push_back((no, index, block.len()));
                    self.block_bytes.set(self.block_bytes.get() + block.len());
                }
                wake.push((waiters, outcome.map_err(|e| e.clone())));
            }
        }
        self.evict_cache();
        for (waiters, outcome) in wake {
            for waiter in waiters {
                let _ = waiter.send(outcome.clone());
            }
        }
    }

    /// Trim: readers see the new start at once; the catalog records it before the answer.
    async fn trim(&self, name: &str, offset: u64) -> Result<u64, EngineError> {
        self.trim_to(name, offset, true).await
    }

    /// A trim; `touch`: it counts as an access for a sliding TTL (a client's trim does, the
    /// retention pass's does not).
    async fn trim_to(&self, name: &str, offset: u64, touch: bool) -> Result<u64, EngineError> {
        let id = self.live_stream_id(name, touch).await?;
        let (start, fence) = {
            let mut streams = self.streams.borrow_mut();
            let stream = streams.get_mut(name).ok_or(EngineError::NotFound)?;
            let start = stream.state.trim(offset);
            stream.chunks.retain(|c| c.next_offset > start);
            (start, self.fence(stream))
        };
        let trimmed = self
            .meta
            .trim_stream_fenced(id, start, fence)
            .await
            .map_err(|_| EngineError::ShuttingDown)?;
        self.meta_result(name, id, trimmed)?;
        Ok(start)
    }

    /// Changes the stream's retention policy. The change is applied to the policy in memory
    /// and the result sent to the metadata log in one step, so concurrent changes build on
    /// each other and reach the log in the order they were made (its commands run in order);
    /// answered once the log has it. A change the log refuses is taken back, unless another
    /// one was made on top of it meanwhile (that one's write carries it).
    async fn configure(
        &self,
        name: &str,
        change: crate::api::RetentionChange,
    ) -> Result<StreamInfo, EngineError> {
        let id = self.live_stream_id(name, false).await?;
        let (before, after, fence) = {
            let mut streams = self.streams.borrow_mut();
            let stream = streams.get_mut(name).ok_or(EngineError::NotFound)?;
            let before = stream.state.config.retention;
            let after = change.apply(before);
            stream.state.config.retention = after;
            (before, after, self.fence(stream))
        };
        let configured = self
            .meta
            .configure_stream_fenced(id, after, fence)
            .await
            .map_err(|_| EngineError::ShuttingDown);
        let outcome = configured.and_then(|answer| self.meta_result(name, id, answer));
        let mut streams = self.streams.borrow_mut();
        let stream = streams.get_mut(name).filter(|s| s.state.id == id);
        match (outcome, stream) {
            (Ok(()), Some(stream)) => Ok(info_of(&stream.state)),
            (Ok(()), None) => Err(EngineError::NotFound),
            (Err(e), stream) => {
                if let Some(stream) = stream.filter(|s| s.state.config.retention == after) {
                    stream.state.config.retention = before;
                }
                Err(e)
            }
        }
    }

    /// Applies the streams' retention policies (docs/api.md, Retention): each round looks at
    /// up to `RETENTION_STREAMS_PER_ROUND` streams, resuming after the last one, decides from
    /// memory and then trims (or deletes) at most `RETENTION_ACTIONS_PER_ROUND` of them, each
    /// a fenced metadata write like a client's trim. Appends never wait for it: it runs
    /// between them on this core, one short step at a time. The sealed segments it leaves
    /// holding nothing readable are reclaimed by the garbage collector.
    async fn retention_loop(self: Rc<Self>) {
        let mut after: Option<Rc<str>> = None;
        loop {
            glommio::timer::sleep(Duration::from_millis(limits::RETENTION_INTERVAL_MS)).await;
            if self.stopping.get() {
                return;
            }
            let (actions, next) = self.retention_round(after.as_deref(), now_ms());
            after = next;
            for action in actions {
                match action {
                    RetentionAction::Trim { name, from, to } => {
                        match self.trim_to(&name, to, false).await {
                            Ok(start) => CoreMetrics::add(
                                &self.metrics.retention_records,
                                start.saturating_sub(from),
                            ),
                            Err(e) => log::debug!("retention trim of {name}: {e}"),
                        }
                    }
                    RetentionAction::Delete { name } => match self.delete(&name).await {
                        Ok(()) => {
                            log::info!("retention: deleted {name} (empty)");
                            CoreMetrics::add(&self.metrics.retention_deleted_streams, 1);
                        }
                        Err(e) => log::debug!("retention delete of {name}: {e}"),
                    },
                }
            }
        }
    }

    /// One retention round's decisions, from memory; the name to resume after (`None`: the
    /// round reached the last stream, the next starts over).
    fn retention_round(
        &self,
        after: Option<&str>,
        now_ms: i64,
    ) -> (Vec<RetentionAction>, Option<Rc<str>>) {
        use std::ops::Bound;
        let streams = self.streams.borrow();
        let range = match after {
            Some(name) => streams.range::<str, _>((Bound::Excluded(name), Bound::Unbounded)),
            None => streams.range::<str, _>(..),
        };
        let mut actions = Vec::new();
        let mut last = None;
        for (seen, (name, stream)) in range.enumerate() {
            if seen >= limits::RETENTION_STREAMS_PER_ROUND
                || actions.len() >= limits::RETENTION_ACTIONS_PER_ROUND
            {
                return (actions, last);
            }
            last = Some(name.clone());
            if let Some(action) = retention_action(name, stream, now_ms) {
                actions.push(action);
            }
        }
        (actions, None)
    }

    /// Graceful shutdown: parked readers get their (possibly empty) answer now, and no read
    /// waits from here on.
    pub(crate) fn begin_shutdown(&self) {
        self.stopping.set(true);
        for stream in self.streams.borrow_mut().values_mut() {
            for waiter in stream.waiters.drain(..) {
                let _ = waiter.send(());
            }
        }
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.get()
    }

    /// Seals what the active segment holds and waits (up to `timeout`) until every segment is
    /// in the object store and its WAL file gone: a clean stop leaves nothing to recover.
    /// `false` if time ran out (the WAL still has it: nothing is lost either way).
    pub(crate) async fn flush(self: &Rc<Self>, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let has_data = self.log.borrow().back().is_some_and(|s| !s.buf.is_empty());
        if has_data {
            self.rotate();
        }
        loop {
            let settled = {
                let log = self.log.borrow();
                log.len() == 1
                    && log.back().is_some_and(|s| s.buf.is_empty())
                    && self.pending.borrow().is_empty()
                    && self.unuploaded_bytes.get() == 0
            };
            if settled || self.wal_failed() {
                return settled;
            }
            if Instant::now() >= deadline {
                return false;
            }
            // A rotation may have waited for a spare WAL file; ask again.
            if self.log.borrow().back().is_some_and(|s| !s.buf.is_empty()) {
                self.rotate();
            }
            self.commit_wanted.notify();
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Refreshes the gauges the admin listener reads (at most a moment stale).
    async fn gauges_loop(self: Rc<Self>) {
        loop {
            let log_bytes: usize = self.log.borrow().iter().map(|s| s.buf.capacity()).sum();
            let memory = log_bytes + self.cached_bytes.get() + self.block_bytes.get();
            CoreMetrics::set(&self.metrics.memory_bytes, memory as u64);
            CoreMetrics::set(
                &self.metrics.upload_backlog_bytes,
                self.unuploaded_bytes.get() as u64,
            );
            CoreMetrics::set(&self.metrics.segments, self.segments.borrow().len() as u64);
            glommio::timer::sleep(GAUGE_REFRESH_INTERVAL).await;
        }
    }

    /// Deletes expired streams nobody touches, so their metadata does not linger.
    async fn reaper_loop(self: Rc<Self>) {
        loop {
            glommio::timer::sleep(REAPER_INTERVAL).await;
            let now = now_ms();
            let expired: Vec<(Rc<str>, u64)> = self
                .streams
                .borrow()
                .iter()
                .filter(|(_, s)| s.state.is_expired(now) && s.state.fork_refs == 0)
                .take(REAPER_BATCH_MAX)
                .map(|(name, s)| (name.clone(), s.state.id))
                .collect();
            for (name, id) in expired {
                if let Err(e) = self.remove_stream(&name, id).await {
                    log::warn!(
                        "core {}: could not reap expired stream {name}: {e}",
                        self.core
                    );
                }
            }
        }
    }

    async fn head(&self, name: &str) -> Result<StreamInfo, EngineError> {
        self.live_stream_id(name, false).await?;
        let streams = self.streams.borrow();
        let stream = streams.get(name).ok_or(EngineError::NotFound)?;
        Ok(info_of(&stream.state))
    }

    /// Deletes a stream; one that forks still read is only deleted for clients (soft
    /// delete): `410` from then on, its name stays taken, its records stay for the forks.
    async fn delete(&self, name: &str) -> Result<(), EngineError> {
        let id = self.live_stream_id(name, false).await?;
        let has_forks = self
            .streams
            .borrow()
            .get(name)
            .is_some_and(|s| s.state.fork_refs > 0);
        if !has_forks {
            return self.remove_stream(name, id).await;
        }
        let fence = self.streams.borrow().get(name).and_then(|s| self.fence(s));
        let deleted = self
            .meta
            .soft_delete_stream_fenced(id, fence)
            .await
            .map_err(|_| EngineError::ShuttingDown)?;
        self.meta_result(name, id, deleted)?;
        if let Some(stream) = self.streams.borrow_mut().get_mut(name) {
            stream.state.soft_deleted = true;
            for waiter in stream.waiters.drain(..) {
                let _ = waiter.send(());
            }
        }
        Ok(())
    }

    /// Validates a fork point on this (source) stream and counts the fork's reference.
    async fn fork_acquire(
        &self,
        name: &str,
        offset: u64,
        partial_bytes: u64,
    ) -> Result<Reply, EngineError> {
        match self.live_stream_id(name, false).await {
            Err(EngineError::Gone) => return Err(EngineError::SourceGone),
            other => other?,
        };
        let mut streams = self.streams.borrow_mut();
        let stream = streams.get_mut(name).ok_or(EngineError::NotFound)?;
        let source_depth = stream.state.fork.as_ref().map_or(0, |f| f.depth);
        if source_depth >= limits::FORK_DEPTH_MAX {
            return Err(EngineError::Invalid(format!(
                "fork chains are at most {} forks deep, and this source is a fork at that depth",
                limits::FORK_DEPTH_MAX
            )));
        }
        let end = offset.saturating_add(u64::from(partial_bytes > 0));
        if end > stream.state.durable_offset {
            return Err(EngineError::Invalid(format!(
                "fork offset is past the source's tail ({})",
                stream.state.durable_offset
            )));
        }
        stream.state.fork_refs += 1;
        Ok(Reply::ForkPoint {
            origin: ForkOrigin {
                source: name.to_string(),
                source_id: stream.state.id,
                offset,
                partial_bytes,
                depth: source_depth + 1,
            },
            config: stream.state.config.clone(),
        })
    }

    /// A fork of this stream is gone: the last one takes a deleted or expired source with it.
    async fn fork_release(&self, name: &str, source_id: u64) -> Result<(), EngineError> {
        let remove = {
            let mut streams = self.streams.borrow_mut();
            let Some(stream) = streams.get_mut(name).filter(|s| s.state.id == source_id) else {
                return Ok(());
            };
            stream.state.fork_refs = stream.state.fork_refs.saturating_sub(1);
            stream.state.fork_refs == 0
                && (stream.state.soft_deleted || stream.state.is_expired(now_ms()))
        };
        if remove {
            self.remove_stream(name, source_id).await?;
        }
        Ok(())
    }

    /// Sources to tell that one of their forks is gone (drained by the node's release task).
    pub(crate) fn take_fork_releases(&self) -> Vec<(String, u64)> {
        std::mem::take(&mut *self.fork_releases.borrow_mut())
    }

    async fn remove_stream(&self, name: &str, id: u64) -> Result<(), EngineError> {
        let fence = self
            .streams
            .borrow()
            .get(name)
            .filter(|s| s.state.id == id)
            .and_then(|s| self.fence(s));
        let deleted = self
            .meta
            .delete_stream_fenced(id, fence)
            .await
            .map_err(|_| EngineError::ShuttingDown)?;
        self.meta_result(name, id, deleted)?;
        let mut streams = self.streams.borrow_mut();
        if streams.get(name).is_some_and(|s| s.state.id == id) {
            if let Some(stream) = streams.remove(name) {
                CoreMetrics::set(&self.metrics.streams, streams.len() as u64);
                for waiter in stream.waiters {
                    let _ = waiter.send(());
                }
                if let Some(origin) = stream.state.fork {
                    self.fork_releases
                        .borrow_mut()
                        .push((origin.source, origin.source_id));
                    self.fork_released.notify();
                }
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------- cluster

    /// The fence of metadata writes for `stream` (cluster only).
    fn fence(&self, stream: &Stream) -> Option<Fence> {
        self.cluster.as_ref().map(|cluster| Fence {
            node: cluster.node_id(),
            epoch: stream.epoch,
        })
    }

    /// A fenced metadata write's result: when another node owns the stream now, this core
    /// lets it go, and the request is told to retry there.
    fn meta_result<T>(
        &self,
        name: &str,
        id: u64,
        result: Result<T, MetaError>,
    ) -> Result<T, EngineError> {
        match result {
            Ok(value) => Ok(value),
            Err(MetaError::Fenced(message)) => {
                log::warn!("core {}: {name}: {message}", self.core);
                self.forget_stream(name, id, None);
                Err(EngineError::NotOwner(format!("{message}; retry")))
            }
            Err(e) => Err(EngineError::Storage(e.to_string())),
        }
    }

    /// What a request for a stream this core does not hold gets: a redirect when another node
    /// is known to serve it, else not found.
    fn missing(&self, name: &str) -> EngineError {
        let (Some(cluster), Some(node)) = (&self.cluster, self.remote.borrow().get(name).copied())
        else {
            return EngineError::NotFound;
        };
        if node == 0 {
            EngineError::NotOwner("the stream moved to another node; retry".into())
        } else {
            cluster.moved(node)
        }
    }

    fn remember_remote(&self, name: &str, node: NodeId) {
        let mut remote = self.remote.borrow_mut();
        if remote.len() >= REMOTE_OWNERS_MAX {
            remote.clear();
        }
        remote.insert(Rc::from(name), node);
    }

    /// Drops a stream this node no longer owns (fenced, revalidated away, or handed off):
    /// its pending appends fail, its readers wake up and are sent on (`to`: the new owner when
    /// known).
    fn forget_stream(&self, name: &str, id: u64, to: Option<NodeId>) {
        let removed = {
            let mut streams = self.streams.borrow_mut();
            if streams.get(name).is_some_and(|s| s.state.id == id) {
                streams.remove(name)
            } else {
                None
            }
        };
        self.remember_remote(name, to.unwrap_or(0));
        if let Some(stream) = removed {
            self.fenced.borrow_mut().insert((id, stream.epoch));
            CoreMetrics::set(&self.metrics.streams, self.streams.borrow().len() as u64);
            for waiter in stream.waiters {
                let _ = waiter.send(());
            }
            self.release_acks();
        }
    }

    /// A sealed segment's entries for stream `id`, written at owner epoch `epoch`, were
    /// refused at commit: another node owns the stream now, or this node owns a newer
    /// incarnation of it (loaded from the catalog, without these frames). The caller has
    /// already fenced `(id, epoch)`, so none of those appends is acknowledged.
    fn lost_at_commit(&self, id: u64, epoch: u64, name: Option<&Rc<str>>, record: &SegmentRecord) {
        let runs = record
            .streams
            .iter()
            .find(|e| e.stream_id == id)
            .map(|e| format!("{:?}", e.runs))
            .unwrap_or_default();
        if self.config.durability == Durability::Object {
            log::warn!(
                "core {}: stream {id} moved to another node; its unacknowledged appends {runs} \
                 were refused",
                self.core
            );
        } else {
            log::error!(
                "core {}: stream {id} moved to another node before segment {} was stored: \
                 records {runs}, acknowledged with local durability, are not part of the stream \
                 (they stay in that object)",
                self.core,
                record.key
            );
        }
        let Some(name) = name else { return };
        // A newer incarnation loaded here since is not the refused one: it stays.
        let refused_is_live = self
            .streams
            .borrow()
            .get(&**name)
            .is_some_and(|s| s.state.id == id && s.epoch == epoch);
        if refused_is_live {
            self.forget_stream(name, id, None);
        }
    }

    /// Before an operation on a stream this core does not hold: find who serves it. Ours but
    /// not loaded (taken over, transferred here): load it. Another live node's: redirect. A new
    /// name: create it here if placement says so.
    async fn route(self: &Rc<Self>, name: &str, op: &Op) -> Result<(), EngineError> {
        let Some(cluster) = self.cluster.clone() else {
            return Ok(());
        };
        let me = cluster.node_id();
        while self.handing_off.borrow().contains(name) {
            self.handed_off.wait().await;
        }
        if self.streams.borrow().contains_key(name) || matches!(op, Op::ForkRelease { .. }) {
            return Ok(());
        }
        // Always asked of the metadata log, never answered from memory: after a transfer
        // two nodes' memories could send a client back and forth. A client talking to the
        // wrong node pays one indexed lookup per request, the owner's requests pay nothing.
        // An owner whose lease lapsed is replaced by the keeper within a lease round: wait for
        // that (bounded) rather than fail the request.
        let deadline = Instant::now() + Duration::from_millis(cluster.config.lease_ms * 2);
        loop {
            let found = meta_answer(self.meta.lookup_stream(name).await)?;
            let Some((row, ownership)) = found else {
                self.remote.borrow_mut().remove(name);
                // A fork is created where its source lives (this node: the source's core just
                // resolved the fork point here), so a family is never split.
                if matches!(op, Op::Create { fork: None, .. }) {
                    if let Some(target) = cluster.place(name).filter(|&n| n != me) {
                        return Err(cluster.moved(target));
                    }
                }
                return Ok(()); // a new name: created here, or not found
            };
            match ownership.node {
                Some(node) if node == me => return self.adopt(name, row.id).await,
                Some(node) if cluster.live_node(node).is_some() => {
                    return Err(cluster.moved(node));
                }
                owner => {
                    if Instant::now() >= deadline {
                        return Err(EngineError::NotOwner(format!(
                            "stream {name} is owned by {}, which does not renew its lease, \
                             and no node took it over yet; retry",
                            owner.map_or("no node".to_string(), |n| format!("node {n}"))
                        )));
                    }
                    glommio::timer::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Starts serving stream `id` (named `name`), which this node owns now: its state comes
    /// from the catalog (the previous owner stored everything before handing it over, or
    /// acknowledged only what was stored, with object durability).
    async fn adopt(self: &Rc<Self>, name: &str, id: u64) -> Result<(), EngineError> {
        let me = self.cluster.as_ref().map(|c| c.node_id());
        let load = meta_answer(self.meta.load_stream(id).await)?;
        let Some(load) = load else {
            return Ok(()); // deleted meanwhile: not found
        };
        if load.ownership.node != me {
            let cluster = self.cluster.as_ref().expect("adopt runs in a cluster");
            return Err(cluster.moved_to(load.ownership.node));
        }
        if self.streams.borrow().contains_key(name) {
            return Ok(()); // another request loaded it meanwhile
        }
        let seeds: Vec<StreamSeed> = crate::seeds::stream_seeds(&load.snapshot)
            .into_iter()
            .map(|mut seed| {
                seed.epoch = load.ownership.epoch;
                seed.fork_refs = load.fork_refs;
                seed
            })
            .collect();
        log::info!(
            "core {}: serving {name} (stream {id}) at owner epoch {}",
            self.core,
            load.ownership.epoch
        );
        self.load_seeds(seeds);
        Ok(())
    }

    /// Hands a stream to another node: new operations wait, what this core holds of the
    /// stream is stored (sealed, uploaded, in the catalog), then the owner changes in one
    /// fenced update and the waiting operations are redirected.
    pub(crate) async fn hand_off(self: &Rc<Self>, transfer: PendingTransfer) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        let name: Rc<str> = Rc::from(transfer.name.as_str());
        let held = self
            .streams
            .borrow()
            .get(&*name)
            .map(|s| (s.state.id, s.epoch));
        if held.is_some_and(|(id, epoch)| id != transfer.stream_id || epoch != transfer.epoch) {
            return; // not the row the transfer names: the next lease round has the news
        }
        self.handing_off.borrow_mut().insert(name.clone());
        let stored = held.is_none() || self.flush_through_active(HAND_OFF_FLUSH_TIMEOUT).await;
        let fence = Fence {
            node: cluster.node_id(),
            epoch: transfer.epoch,
        };
        if stored {
            match self
                .meta
                .complete_transfer(transfer.stream_id, fence, transfer.to_node)
                .await
            {
                Ok(Ok(epoch)) => {
                    log::info!(
                        "core {}: handed {} to node {} (owner epoch {epoch})",
                        self.core,
                        transfer.name,
                        transfer.to_node
                    );
                    self.forget_stream(&name, transfer.stream_id, Some(transfer.to_node));
                }
                Ok(Err(e)) => log::warn!("transfer of {}: {e}", transfer.name),
                Err(_) => {}
            }
        } else {
            log::warn!(
                "transfer of {}: its data was not stored within {:?}; will retry",
                transfer.name,
                HAND_OFF_FLUSH_TIMEOUT
            );
        }
        self.handing_off.borrow_mut().remove(&name);
        self.handed_off.notify();
    }

    /// Seals the active segment and waits until it and every older one are stored and
    /// committed (unlike `flush`, appends to other streams may go on meanwhile).
    async fn flush_through_active(self: &Rc<Self>, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let target = self.log.borrow().back().map_or(0, |s| s.no);
        loop {
            let active_has_it = self
                .log
                .borrow()
                .back()
                .is_some_and(|s| s.no <= target && !s.buf.is_empty());
            if active_has_it {
                self.rotate();
            }
            let settled = self
                .log
                .borrow()
                .iter()
                .all(|s| s.no > target || s.buf.is_empty())
                && self
                    .segments
                    .borrow()
                    .iter()
                    .filter(|(no, slot)| **no <= target && !matches!(slot.data, SegmentData::Open))
                    .all(|(_, slot)| slot.uploaded);
            if settled {
                return true;
            }
            if Instant::now() >= deadline || self.wal_failed() {
                return false;
            }
            self.commit_wanted.notify();
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
    }

    /// After this node's lease lapsed and was renewed: keep only the streams it still owns
    /// at the same epoch (`owned`: id → owner epoch), let the others go.
    pub(crate) fn revalidate(&self, owned: &HashMap<u64, u64>) {
        let lost: Vec<(Rc<str>, u64)> = self
            .streams
            .borrow()
            .iter()
            .filter(|(_, s)| owned.get(&s.state.id) != Some(&s.epoch))
            .map(|(name, s)| (name.clone(), s.state.id))
            .collect();
        for (name, id) in lost {
            log::warn!(
                "core {}: {name} (stream {id}) moved to another node while this node's lease \
                 had lapsed",
                self.core
            );
            self.forget_stream(&name, id, None);
        }
        self.release_acks();
    }

    pub(crate) fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub(crate) fn meta(&self) -> &MetaStore {
        &self.meta
    }

    pub(crate) fn store(&self) -> &ObjectStore {
        &self.store
    }

    /// Every live stream: id → first readable offset.
    pub(crate) fn live_streams(&self) -> Vec<(u64, u64)> {
        self.streams
            .borrow()
            .values()
            .map(|s| (s.state.id, s.state.start_offset))
            .collect()
    }

    /// Garbage collection deleted `count` segments.
    pub(crate) fn count_collected(&self, count: usize) {
        CoreMetrics::add(&self.metrics.gc_segments_deleted, count as u64);
    }

    /// Drops the table entries (and cached bytes) of garbage-collected segments.
    pub(crate) fn forget_segments(&self, keys: &[String]) {
        let keys: std::collections::HashSet<&str> = keys.iter().map(String::as_str).collect();
        let mut segments = self.segments.borrow_mut();
        let gone: Vec<u64> = segments
            .iter()
            .filter(|(_, slot)| slot.uploaded && keys.contains(&*slot.key))
            .map(|(no, _)| *no)
            .collect();
        for no in &gone {
            segments.remove(no);
            self.readahead.borrow_mut().remove(no);
        }
        // Their cached blocks go now; the byte count follows as the FIFO reaches them.
        self.blocks
            .borrow_mut()
            .retain(|(no, _), _| !gone.contains(no));
        let mut cached = self.cached.borrow_mut();
        let before = cached.len();
        cached.retain(|(no, len)| {
            let keep = segments.contains_key(no);
            if !keep {
                self.cached_bytes.set(self.cached_bytes.get() - len);
            }
            keep
        });
        debug_assert!(cached.len() <= before);
    }

    pub(crate) fn list(&self, prefix: &str, start_after: &str, limit: usize) -> Vec<StreamSummary> {
        let now = now_ms();
        let streams = self.streams.borrow();
        let lower = if start_after >= prefix {
            start_after
        } else {
            prefix
        };
        streams
            .range::<str, _>((std::ops::Bound::Included(lower), std::ops::Bound::Unbounded))
            .filter(|(name, _)| &***name != start_after)
            .take_while(|(name, _)| name.starts_with(prefix))
            .filter(|(_, stream)| !stream.state.is_expired(now))
            .take(limit)
            .map(|(name, stream)| StreamSummary {
                name: name.to_string(),
                info: info_of(&stream.state),
            })
            .collect()
    }

    // ---------------------------------------------------------------- the log

    fn wal_path(&self, counter: u64) -> (PathBuf, String) {
        let stem = format!(
            "{:016}-{:03}-{:010}",
            self.config.node_epoch_ms, self.core, counter
        );
        (
            self.config.wal_dir.join(format!("{stem}.wal")),
            crate::placement::segment_key(self.config.node_id, &stem),
        )
    }

    /// Creates the next WAL file (pre-allocated and with its directory entry durable).
    async fn create_wal_file(&self) -> Result<Option<(Rc<DmaFile>, PathBuf, u64)>, WalFileError> {
        let counter = self.segment_counter.get();
        self.segment_counter.set(counter + 1);
        if !self.wal_enabled() {
            return Ok(None);
        }
        let (path, _) = self.wal_path(counter);
        let cannot_create = |e: std::io::Error| {
            WalFileError::new(format!("cannot create WAL file {}", path.display()), e)
        };
        #[cfg(feature = "fault-injection")]
        if let Some(e) = crate::faults::take(&self.config.wal_dir, crate::faults::WalIo::Create) {
            return Err(cannot_create(e));
        }
        let file = DmaFile::create(&path)
            .await
            .map_err(|e| cannot_create(e.into()))?;
        let size = (self.config.segment_size + SEGMENT_SLACK_BYTES) as u64;
        let made = match file.pre_allocate(size, false).await {
            Ok(()) => sync_dir(&self.config.wal_dir).map_err(|message| WalFileError {
                message,
                out_of_space: false,
            }),
            Err(e) => Err(WalFileError::new(
                format!("cannot pre-allocate WAL file {}", path.display()),
                e.into(),
            )),
        };
        if let Err(e) = made {
            // Nothing was written to it: a half-made file only takes space.
            let _ = file.remove().await;
            let _ = file.close().await;
            return Err(e);
        }
        Ok(Some((Rc::new(file), path, counter)))
    }

    fn open_segment(&self, wal: Option<(Rc<DmaFile>, PathBuf, u64)>) {
        let counter = match &wal {
            Some((_, _, counter)) => *counter,
            None => {
                let counter = self.segment_counter.get();
                self.segment_counter.set(counter + 1);
                counter
            }
        };
        let (_, key) = self.wal_path(counter);
        let no = self.next_segment_no.get();
        self.next_segment_no.set(no + 1);
        let (file, path) = match wal {
            Some((file, path, _)) => (Some(file), Some(path)),
            None => (None, None),
        };
        self.segments.borrow_mut().insert(
            no,
            SegmentSlot {
                key: Rc::from(key.as_str()),
                data: SegmentData::Open,
                uploaded: false,
                size: 0,
            },
        );
        self.log.borrow_mut().push_back(OpenSegment {
            no,
            key,
            buf: Vec::with_capacity(self.config.segment_size + SEGMENT_SLACK_BYTES),
            durable_len: 0,
            wal: file,
            wal_path: path,
            opened: Instant::now(),
            index: BTreeMap::new(),
        });
    }

    /// Whether an append of `needed` frame bytes may go to the WAL now (`crate::health`).
    fn check_writable(&self, needed: usize) -> Result<(), EngineError> {
        match &*self.health.borrow() {
            WalHealth::Ok => Ok(()),
            WalHealth::Failed { message } => Err(EngineError::WritesStopped(format!(
                "{message}; this core takes appends again after a restart"
            ))),
            WalHealth::NoNextFile {
                message,
                out_of_space,
            } => {
                // The active file was pre-allocated with this much room.
                let active_len = self.log.borrow().back().map_or(0, |s| s.buf.len());
                if active_len + needed <= self.config.segment_size + SEGMENT_SLACK_BYTES {
                    return Ok(());
                }
                let message = format!("{message}; appends resume once it can be made");
                Err(if *out_of_space {
                    EngineError::OutOfSpace(message)
                } else {
                    EngineError::WritesStopped(message)
                })
            }
        }
    }

    fn wal_failed(&self) -> bool {
        matches!(*self.health.borrow(), WalHealth::Failed { .. })
    }

    /// Records a change of WAL health: logged once, published for `/ready` and `/metrics`.
    fn set_health(&self, health: WalHealth) {
        if *self.health.borrow() == health {
            return;
        }
        match &health {
            WalHealth::Ok => log::warn!("core {}: the WAL takes appends again", self.core),
            WalHealth::NoNextFile { message, .. } => log::error!(
                "core {}: {message}; appends past the active WAL file are refused until it can be made",
                self.core
            ),
            WalHealth::Failed { message } => log::error!(
                "core {}: WAL failure, appends stop until a restart: {message}",
                self.core
            ),
        }
        self.metrics.wal_health.publish(&health);
        *self.health.borrow_mut() = health;
    }

    /// Local durability writes a WAL; memory and object durability do not (object durability
    /// acknowledges from the bucket instead).
    fn wal_enabled(&self) -> bool {
        self.config.durability == Durability::Local
    }

    /// Starts a new active segment when `needed` more bytes would overflow the current one.
    fn maybe_rotate(&self, needed: usize) {
        let len = self.log.borrow().back().map_or(0, |s| s.buf.len());
        let full = len > 0 && len + needed > self.config.segment_size;
        if full {
            self.rotate();
        }
    }

    fn rotate(&self) {
        if !self.wal_enabled() {
            self.open_segment(None);
            // The commit loop seals the segment just left behind.
            self.commit_wanted.notify();
            return;
        }
        // Without a spare WAL file the segment grows into its slack until one is ready.
        let spare = self.spare_wal.borrow_mut().take();
        if let Some(spare) = spare {
            self.open_segment(Some(spare));
        }
        self.commit_wanted.notify();
    }

    async fn age_loop(self: Rc<Self>) {
        let period_ms = (self.config.segment_max_age_ms.max(10) / 2 + 1).min(WAL_FILE_RETRY_MS);
        let period = Duration::from_millis(period_ms);
        loop {
            glommio::timer::sleep(period).await;
            // A WAL file that could not be made is tried again even when no append comes.
            if matches!(*self.health.borrow(), WalHealth::NoNextFile { .. }) {
                self.commit_wanted.notify();
            }
            let old = {
                let log = self.log.borrow();
                let active = log.back().expect("an active segment always exists");
                !active.buf.is_empty()
                    && active.opened.elapsed()
                        >= Duration::from_millis(self.config.segment_max_age_ms)
            };
            if old {
                self.rotate();
            }
            // Acknowledgements held back while this node's lease was in doubt go out once it
            // is valid again, even when no new append comes to trigger a commit round.
            let held = self.config.durability != Durability::Object
                && self.cluster.as_ref().is_some_and(|c| c.lease_valid())
                && !self.pending.borrow().is_empty();
            if held {
                self.release_acks();
            }
        }
    }

    async fn commit_loop(self: Rc<Self>) {
        loop {
            self.commit_wanted.wait().await;
            loop {
                match self.commit_round().await {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(message) => {
                        self.set_health(WalHealth::Failed {
                            message: message.clone(),
                        });
                        self.fail_pending(&message);
                        return;
                    }
                }
            }
        }
    }

    /// Makes the oldest open segment with unwritten bytes durable, seals a finished one, and
    /// keeps a spare WAL file ready. Returns whether there may be more to do.
    async fn commit_round(self: &Rc<Self>) -> Result<bool, String> {
        // The spare WAL file is created while idle, or right away once the active segment is
        // half full, so creating it rarely delays an acknowledgement and a rotation never
        // waits for it.
        let active_len = self.log.borrow().back().map_or(0, |s| s.buf.len());
        let idle = self
            .log
            .borrow()
            .iter()
            .all(|s| s.durable_len == s.buf.len());
        let wanted = idle || active_len >= self.config.segment_size / 2;
        let due = self
            .next_file_retry_at
            .get()
            .is_none_or(|at| Instant::now() >= at);
        if self.wal_enabled() && self.spare_wal.borrow().is_none() && wanted && due {
            // A spare that cannot be made fails no append: the active file was made with
            // room for its segment, and only appends past that room are refused.
            match self.create_wal_file().await {
                Ok(spare) => {
                    self.next_file_retry_at.set(None);
                    // (A failed WAL ends the commit loop: no round runs after it.)
                    self.set_health(WalHealth::Ok);
                    *self.spare_wal.borrow_mut() = spare;
                    let overdue = self
                        .log
                        .borrow()
                        .back()
                        .is_some_and(|s| s.buf.len() >= self.config.segment_size);
                    if overdue {
                        self.rotate();
                    }
                }
                // The round goes on: what the active file holds is still made durable.
                Err(e) => {
                    let retry_at = Instant::now() + Duration::from_millis(WAL_FILE_RETRY_MS);
                    self.next_file_retry_at.set(Some(retry_at));
                    self.set_health(WalHealth::NoNextFile {
                        message: e.message,
                        out_of_space: e.out_of_space,
                    });
                }
            }
        }
        let job = {
            let log = self.log.borrow();
            let count = log.len();
            log.iter().enumerate().find_map(|(i, segment)| {
                let sealed = i + 1 < count;
                if segment.durable_len < segment.buf.len() {
                    Some((segment.no, false))
                } else if sealed {
                    Some((segment.no, true))
                } else {
                    None
                }
            })
        };
        let Some((no, seal)) = job else {
            return Ok(false);
        };
        if seal {
            self.seal_front(no);
            return Ok(true);
        }
        let (file, start, len, buffer, path) = {
            let log = self.log.borrow();
            let segment = log.iter().find(|s| s.no == no).expect("picked above");
            let len = segment.buf.len();
            match &segment.wal {
                None => (None, 0, len, None, None),
                Some(file) => {
                    let align = file.alignment() as usize;
                    let start = segment.durable_len / align * align;
                    let size = (len - start).div_ceil(align) * align;
                    let mut buffer = file.alloc_dma_buffer(size);
                    let dst = buffer.as_bytes_mut();
                    dst[..len - start].copy_from_slice(&segment.buf[start..len]);
                    dst[len - start..].fill(0);
                    let path = segment.wal_path.clone();
                    (Some(file.clone()), start, len, Some(buffer), path)
                }
            }
        };
        if let (Some(file), Some(buffer)) = (file, buffer) {
            let shown = path.as_deref().unwrap_or(Path::new("?")).display();
            #[cfg(feature = "fault-injection")]
            if let Some(e) = crate::faults::take(&self.config.wal_dir, crate::faults::WalIo::Write)
            {
                return Err(format!("WAL write to {shown}: {e}"));
            }
            // A short write is an error too: the bytes past it are not on disk.
            let written = file
                .write_at(buffer, start as u64)
                .await
                .map_err(|e| format!("WAL write to {shown}: {e}"))?;
            if written < len - start {
                return Err(format!(
                    "WAL write to {shown}: {written} of {} bytes written",
                    len - start
                ));
            }
            let synced = Instant::now();
            #[cfg(feature = "fault-injection")]
            if let Some(e) = crate::faults::take(&self.config.wal_dir, crate::faults::WalIo::Sync) {
                return Err(format!("WAL fdatasync of {shown}: {e}"));
            }
            file.fdatasync()
                .await
                .map_err(|e| format!("WAL fdatasync of {shown}: {e}"))?;
            CoreMetrics::add(&self.metrics.wal_fsyncs, 1);
            self.metrics.wal_fsync_latency.observe(synced.elapsed());
            if let Some(path) = &path {
                same_file(&file, path)?;
            }
        }
        if let Some(segment) = self.log.borrow_mut().iter_mut().find(|s| s.no == no) {
            segment.durable_len = len;
        }
        self.release_acks();
        Ok(true)
    }

    /// Answers, in order, every append whose bytes are now durable.
    fn release_acks(&self) {
        let durable: HashMap<u64, usize> = self
            .log
            .borrow()
            .iter()
            .map(|s| (s.no, s.durable_len))
            .collect();
        let uploaded = |no: u64| {
            self.segments
                .borrow()
                .get(&no)
                .is_some_and(|slot| slot.uploaded)
        };
        // A node that may have lost its streams (its lease lapsed: paused, cut off) does not
        // acknowledge local writes until the lease is renewed and ownership rechecked.
        let lease_lapsed = self.config.durability != Durability::Object
            && self.cluster.as_ref().is_some_and(|c| !c.lease_valid());
        // Only a cluster node that lost a stream has any: one check per round, not per ack.
        let any_fenced = !self.fenced.borrow().is_empty();
        loop {
            let fenced = any_fenced && {
                let pending = self.pending.borrow();
                pending
                    .front()
                    .is_some_and(|ack| self.fenced.borrow().contains(&(ack.stream_id, ack.epoch)))
            };
            if fenced {
                let ack = self
                    .pending
                    .borrow_mut()
                    .pop_front()
                    .expect("checked front");
                self.in_flight_bytes
                    .set(self.in_flight_bytes.get() - ack.body_bytes);
                let _ = ack.reply.send(Err(EngineError::NotOwner(
                    "the stream moved to another node before this append was stored; \
                     it was not appended"
                        .into(),
                )));
                continue;
            }
            if lease_lapsed {
                break;
            }
            let ack = {
                let mut pending = self.pending.borrow_mut();
                let ready = pending.front().is_some_and(|ack| {
                    if self.config.durability == Durability::Object {
                        uploaded(ack.segment)
                    } else {
                        durable.get(&ack.segment).is_none_or(|&len| len >= ack.end)
                    }
                });
                if !ready {
                    break;
                }
                pending.pop_front().expect("checked front")
            };
            self.in_flight_bytes
                .set(self.in_flight_bytes.get() - ack.body_bytes);
            let mut streams = self.streams.borrow_mut();
            if let Some(stream) = streams.get_mut(&*ack.name) {
                if stream.state.id == ack.stream_id {
                    stream.state.mark_durable(ack.next_offset, ack.closed);
                    for waiter in stream.waiters.drain(..) {
                        let _ = waiter.send(());
                    }
                }
            }
            drop(streams);
            let _ = ack.reply.send(Ok(()));
        }
        if any_fenced {
            let named: HashSet<(u64, u64)> = self
                .pending
                .borrow()
                .iter()
                .map(|ack| (ack.stream_id, ack.epoch))
                .collect();
            self.fenced.borrow_mut().retain(|key| named.contains(key));
        }
    }

    fn fail_pending(&self, message: &str) {
        let pending: Vec<PendingAck> = self.pending.borrow_mut().drain(..).collect();
        for ack in pending {
            let _ = ack
                .reply
                .send(Err(EngineError::Durability(message.to_string())));
        }
    }

    /// Moves the oldest open segment (fully durable, no longer active) to the upload path.
    fn seal_front(self: &Rc<Self>, no: u64) {
        let segment = {
            let mut log = self.log.borrow_mut();
            debug_assert_eq!(log.front().map(|s| s.no), Some(no));
            log.pop_front().expect("sealing the front segment")
        };
        self.coarsen_sealed(no, &segment.index);
        let bytes = Bytes::from(segment.buf);
        if let Some(slot) = self.segments.borrow_mut().get_mut(&no) {
            slot.data = SegmentData::Memory(bytes.clone());
            slot.size = bytes.len() as u64;
        }
        if bytes.is_empty() {
            self.segments.borrow_mut().remove(&no);
            let (file, path) = (segment.wal, segment.wal_path);
            glommio::spawn_local(async move { remove_wal(file, path).await }).detach();
            return;
        }
        let fence = self.cluster.as_ref().map(|cluster| SegmentFence {
            node: cluster.node_id(),
            epochs: segment
                .index
                .iter()
                .map(|(id, entry)| (*id, entry.epoch))
                .collect(),
        });
        let names: HashMap<u64, Rc<str>> = segment
            .index
            .iter()
            .filter_map(|(id, entry)| Some((*id, entry.name.clone()?)))
            .collect();
        let record = SegmentRecord {
            key: segment.key.clone(),
            size_bytes: bytes.len() as u64,
            created_ms: now_ms(),
            streams: segment
                .index
                .into_iter()
                .map(|(stream_id, entry)| SegmentStreamEntry {
                    stream_id,
                    runs: entry.runs,
                    last_timestamp_ms: entry.last_timestamp_ms,
                    closed: entry.closed,
                    producers: entry
                        .producers
                        .into_iter()
                        .map(|(id, (epoch, seq))| ProducerState { id, epoch, seq })
                        .collect(),
                    closed_by: entry.closed_by.map(|p| ProducerState {
                        id: p.id,
                        epoch: p.epoch,
                        seq: p.seq,
                    }),
                    writer_seq: entry.writer_seq,
                })
                .collect(),
        };
        self.unuploaded_bytes
            .set(self.unuploaded_bytes.get() + bytes.len());
        self.commit_order.borrow_mut().push_back(no);
        let this = self.clone();
        let (file, path) = (segment.wal, segment.wal_path);
        let sealed = Sealed {
            no,
            bytes,
            record,
            fence,
            names,
        };
        glommio::spawn_local(async move { this.upload(sealed, file, path).await }).detach();
    }

    /// Once a segment is sealed, each stream keeps a few chunks per segment instead of one per
    /// request: reads skip the other streams' frames by header, and the memory per stream
    /// follows the segment count, not the request count.
    fn coarsen_sealed(&self, no: u64, index: &BTreeMap<u64, IndexEntry>) {
        let mut streams = self.streams.borrow_mut();
        for (id, entry) in index {
            let Some(name) = &entry.name else { continue };
            if let Some(stream) = streams.get_mut(&**name) {
                if stream.state.id == *id {
                    coarsen(&mut stream.chunks, Some(no));
                }
            }
        }
    }

    /// Stores a sealed segment, commits its index, then frees its WAL file. Retries with
    /// capped exponential backoff: the WAL keeps the data safe meanwhile.
    ///
    /// PUTs run side by side, but catalog commits go in seal order: a segment's entries
    /// commit only once every segment sealed before it on this core has committed. Otherwise
    /// a slow PUT (a retry) lets a later segment's records into the catalog before earlier
    /// offsets of the same stream, and if the node dies or is fenced meanwhile, the stream's
    /// offsets have a hole that no one can fill (found by the fault test's cluster profile).
    async fn upload(
        self: Rc<Self>,
        sealed: Sealed,
        file: Option<Rc<DmaFile>>,
        path: Option<PathBuf>,
    ) {
        let Sealed {
            no,
            bytes,
            record,
            fence,
            names,
        } = sealed;
        let mut backoff_ms = 50u64;
        let mut fenced = Vec::new();
        let mut stored = false;
        CoreMetrics::add(&self.metrics.segment_seals, 1);
        let started = Instant::now();
        loop {
            let result = async {
                // The sealed WAL file holds these very bytes: a file:// bucket on the same
                // filesystem links it instead of writing them again.
                // A retry after a failed commit does not store the bytes again.
                if !stored {
                    let put = match &path {
                        Some(wal) => {
                            self.store
                                .put_with_local_copy(&record.key, bytes.clone(), wal.clone())
                        }
                        None => self.store.put(&record.key, bytes.clone()),
                    };
                    put.await
                        .map_err(|_| "object store is shut down".to_string())?
                        .map_err(|e| e.to_string())?;
                    stored = true;
                }
                self.commit_turn(no).await;
                match &fence {
                    None => self
                        .meta
                        .commit_segment(record.clone())
                        .await
                        .map_err(|_| "metadata store is shut down".to_string())?
                        .map_err(|e| e.to_string()),
                    Some(fence) => {
                        fenced = self
                            .meta
                            .commit_segment_fenced(record.clone(), fence.clone())
                            .await
                            .map_err(|_| "metadata store is shut down".to_string())?
                            .map_err(|e| e.to_string())?;
                        Ok(())
                    }
                }
            }
            .await;
            match result {
                Ok(()) => break,
                Err(message) => {
                    CoreMetrics::add(&self.metrics.upload_failures, 1);
                    log::warn!(
                        "core {}: upload of {} failed, retrying: {message}",
                        self.core,
                        record.key
                    );
                    glommio::timer::sleep(Duration::from_millis(backoff_ms)).await;
                    backoff_ms = (backoff_ms * 2).min(5_000);
                }
            }
        }
        self.end_commit_turn(no);
        // Fence every refused entry before anything can release acknowledgements (the
        // `forget_stream` of the first one does): a later id of the same segment would
        // otherwise be acknowledged as stored once the segment counts as uploaded (found by
        // the fault test's cluster profile: a producer told stored, then a sequence gap).
        let lost: Vec<(u64, u64)> = fenced
            .iter()
            .map(|id| {
                let epoch = fence.as_ref().and_then(|f| f.epochs.get(id).copied());
                (*id, epoch.unwrap_or_default())
            })
            .collect();
        self.fenced.borrow_mut().extend(lost.iter().copied());
        for &(id, epoch) in &lost {
            self.lost_at_commit(id, epoch, names.get(&id), &record);
        }
        CoreMetrics::add(&self.metrics.uploads, 1);
        CoreMetrics::add(&self.metrics.meta_commits, 1);
        self.metrics.upload_latency.observe(started.elapsed());
        self.unuploaded_bytes
            .set(self.unuploaded_bytes.get() - bytes.len());
        remove_wal(file, path).await;
        if let Some(slot) = self.segments.borrow_mut().get_mut(&no) {
            slot.uploaded = true;
        }
        if self.config.durability == Durability::Object {
            self.release_acks();
        }
        self.cached.borrow_mut().push_back((no, bytes.len()));
        self.cached_bytes.set(self.cached_bytes.get() + bytes.len());
        self.evict_cache();
    }

    /// Waits until segment `no` is the oldest sealed segment not yet in the catalog.
    async fn commit_turn(&self, no: u64) {
        loop {
            if self.commit_order.borrow().front() == Some(&no) {
                return;
            }
            let (tx, rx) = oneshot::channel();
            self.commit_turn_waiters.borrow_mut().push(tx);
            // A dropped sender (the core stopping) just rechecks.
            let _ = rx.await;
        }
    }

    /// Segment `no` is in the catalog: the next one may commit.
    fn end_commit_turn(&self, no: u64) {
        let front = self.commit_order.borrow_mut().pop_front();
        debug_assert_eq!(front, Some(no), "catalog commits go in seal order");
        let waiters: Vec<_> = self.commit_turn_waiters.borrow_mut().drain(..).collect();
        for waiter in waiters {
            let _ = waiter.send(());
        }
    }

    /// Keeps the read caches within `--block-cache-size` together: whole uploaded segments still
    /// held since their seal go first (oldest first), then blocks fetched from the store.
    fn evict_cache(&self) {
        let budget = self.config.segment_cache_bytes;
        while self.cached_bytes.get() + self.block_bytes.get() > budget {
            let segment = self.cached.borrow_mut().pop_front();
            if let Some((no, len)) = segment {
                self.cached_bytes.set(self.cached_bytes.get() - len);
                if let Some(slot) = self.segments.borrow_mut().get_mut(&no) {
                    if slot.uploaded && matches!(slot.data, SegmentData::Memory(_)) {
                        slot.data = SegmentData::Remote;
                    }
                }
                continue;
            }
            let Some((no, index, len)) = self.block_lru.borrow_mut().pop_front() else {
                break;
            };
            let mut blocks = self.blocks.borrow_mut();
            if matches!(blocks.get(&(no, index)), Some(Block::Ready(_))) {
                blocks.remove(&(no, index));
            }
            self.block_bytes.set(self.block_bytes.get() - len);
        }
    }
}

/// Merges consecutive chunks of one sealed segment (only `segment`'s, or all with `None`) into
/// spans of at most `SEALED_CHUNK_BYTES_MAX` bytes.
fn coarsen(chunks: &mut Vec<Chunk>, segment: Option<u64>) {
    let start = match segment {
        Some(no) => match chunks.iter().position(|c| c.segment == no) {
            Some(start) => start,
            None => return,
        },
        None => 0,
    };
    let mut merged: Vec<Chunk> = Vec::with_capacity(chunks.len() - start);
    for chunk in chunks.drain(start..) {
        match merged.last_mut() {
            Some(last)
                if segment.is_none_or(|s| s == chunk.segment)
                    && last.segment == chunk.segment
                    && last.next_offset == chunk.first_offset
                    && chunk.byte_end > last.byte_start
                    && chunk.byte_end - last.byte_start <= SEALED_CHUNK_BYTES_MAX =>
            {
                last.next_offset = chunk.next_offset;
                last.byte_end = chunk.byte_end;
                last.last_timestamp_ms = last.last_timestamp_ms.max(chunk.last_timestamp_ms);
            }
            _ => merged.push(chunk),
        }
    }
    chunks.extend(merged);
}

/// A metadata answer as the engine's result: a dropped answer means the store is stopping.
fn meta_answer<T>(
    answer: Result<Result<T, MetaError>, futures_channel::oneshot::Canceled>,
) -> Result<T, EngineError> {
    answer
        .map_err(|_| EngineError::ShuttingDown)?
        .map_err(|e| EngineError::Storage(e.to_string()))
}

async fn remove_wal(file: Option<Rc<DmaFile>>, path: Option<PathBuf>) {
    drop(file);
    if let Some(path) = path {
        if let Err(e) = std::fs::remove_file(&path) {
            log::warn!("cannot remove WAL file {}: {e}", path.display());
        }
    }
}

/// Whether `path` still names the open WAL `file`. A file removed or replaced under the node
/// (its directory deleted, say) takes writes that recovery will never read: acknowledging
/// them would be a lie.
fn same_file(file: &DmaFile, path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let named = std::fs::metadata(path).map_err(|e| {
        format!(
            "WAL file {} is gone ({e}): it was removed while in use",
            path.display()
        )
    })?;
    let same = named.ino() == file.inode()
        && libc::major(named.dev()) == file.dev_major()
        && libc::minor(named.dev()) == file.dev_minor();
    if same {
        Ok(())
    } else {
        Err(format!(
            "WAL file {} was replaced by another file while in use",
            path.display()
        ))
    }
}

fn sync_dir(dir: &Path) -> Result<(), String> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("cannot sync WAL directory {}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(
        first_offset: u64,
        next_offset: u64,
        segment: u64,
        byte_start: u64,
        byte_end: u64,
    ) -> Chunk {
        Chunk {
            first_offset,
            next_offset,
            segment,
            byte_start,
            byte_end,
            last_timestamp_ms: 0,
        }
    }

    #[test]
    fn coarsen_merges_within_a_segment_and_a_span() {
        let mut chunks = vec![
            chunk(0, 2, 0, 0, 100),
            chunk(2, 3, 1, 0, 50),
            chunk(3, 5, 1, 200, 300),
            chunk(5, 6, 1, 900_000, 1_100_000),
            chunk(6, 7, 2, 0, 10),
        ];
        coarsen(&mut chunks, Some(1));
        let spans: Vec<_> = chunks
            .iter()
            .map(|c| (c.first_offset, c.next_offset, c.segment))
            .collect();
        assert_eq!(spans, vec![(0, 2, 0), (2, 5, 1), (5, 6, 1), (6, 7, 2)]);
        assert_eq!((chunks[1].byte_start, chunks[1].byte_end), (0, 300));
        coarsen(&mut chunks, None);
        assert_eq!(
            chunks.len(),
            4,
            "a merge never crosses segments or the span limit"
        );
    }
}
