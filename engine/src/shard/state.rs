//! The state a core holds: the `Shard` with its streams, open segments and segment table,
//! its owned parts (read cache, ack queue, seal queue), WAL file and cluster bookkeeping;
//! made empty, then filled from recovered streams (`load_seeds`).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use glommio::io::DmaFile;
use pico_meta::MetaStore;
use pico_s3::ObjectStore;

use crate::clock::Clock;
use crate::cluster::Cluster;
use crate::config::EngineConfig;
use crate::health::WalHealth;
use crate::limits;
use crate::metrics::CoreMetrics;
use crate::notify::{LocalBroadcast, LocalNotify};
use crate::producers::Producers;
use crate::put_budget::PutBudget;
use crate::state::StreamState;

use super::blocks::ReadCache;
use super::moves::Moves;
use super::pending::AckQueue;
use super::sealed::SealQueue;
use super::spare::SegmentBuffers;
use super::stream::{coarsen, Chunk, IndexEntry, Stream, StreamSeed};

/// A segment whose frames are still being written to its WAL file.
pub(super) struct OpenSegment {
    pub(super) no: u64,
    pub(super) key: String,
    pub(super) buf: Vec<u8>,
    /// Bytes of `buf` known to be on disk.
    pub(super) durable_len: usize,
    pub(super) wal: Option<Rc<DmaFile>>,
    pub(super) wal_path: Option<PathBuf>,
    /// Commit rounds written to the WAL file (`wal_file.rs`: each ends with a commit record
    /// in `buf`, so the file and the segment object are the same bytes).
    pub(super) wal_rounds: u64,
    /// (Cluster) the owner epochs of streams whose first frame in this segment is not yet in
    /// the WAL file: the next round writes them (`wal_file::epoch_record`).
    pub(super) wal_epochs: Vec<(u64, u64)>,
    pub(super) opened: Instant,
    pub(super) index: BTreeMap<u64, IndexEntry>,
}

impl OpenSegment {
    /// Bytes it holds once `needed` more frame bytes are written and the next round ends:
    /// with a WAL file, that round's epoch records and commit record too (an append may be its
    /// stream's first in the segment: one more epoch record).
    pub(super) fn wal_len_after(&self, needed: usize) -> usize {
        let markers = match self.wal {
            Some(_) => (self.wal_epochs.len() + 2) * crate::wal_file::WAL_MARKER_LEN,
            None => 0,
        };
        self.buf.len() + needed + markers
    }
}

pub(super) enum SegmentData {
    /// Still an [`OpenSegment`] in the log.
    Open,
    /// Sealed and held in memory (uploaded or not yet).
    Memory(Bytes),
    /// Only in the object store: read by blocks (ranged GETs) through the block cache.
    Remote,
}

pub(super) struct SegmentSlot {
    pub(super) key: Rc<str>,
    pub(super) data: SegmentData,
    pub(super) uploaded: bool,
    /// Object size in bytes (known once sealed): bounds the last block's range.
    pub(super) size: u64,
}

/// A WAL file ready to take a segment: the file, its path, and the counter naming it.
pub(super) type WalFile = (Rc<DmaFile>, PathBuf, u64);

/// The WAL's files and health. With memory or object durability there are no files, and
/// only the counter is used (it names the segments).
pub(super) struct WalFiles {
    /// Names the next WAL file and segment (`<epoch>-<core>-<counter>`).
    counter: u64,
    /// A WAL file created ahead of time so a rotation never waits for the filesystem.
    pub(super) spare: Option<WalFile>,
    /// Whether the WAL takes appends (`crate::health`).
    pub(super) health: WalHealth,
    /// When the next WAL file may be tried again after it could not be made.
    pub(super) retry_at: Option<Instant>,
}

impl WalFiles {
    fn new() -> WalFiles {
        WalFiles {
            counter: 0,
            spare: None,
            health: WalHealth::Ok,
            retry_at: None,
        }
    }

    /// The counter of the next WAL file or segment; each is used once.
    pub(super) fn next_counter(&mut self) -> u64 {
        let counter = self.counter;
        self.counter += 1;
        counter
    }
}

/// One core's engine. Fields are visible to the `impl Shard` files beside this one; the
/// parts with invariants of their own (`ReadCache`, `AckQueue`, `SealQueue`) keep their
/// fields private and change only through their methods.
pub(crate) struct Shard {
    pub(super) core: usize,
    pub(super) config: EngineConfig,
    pub(super) meta: MetaStore,
    pub(super) store: ObjectStore,
    pub(super) streams: RefCell<BTreeMap<Rc<str>, Stream>>,
    /// The content types this core's streams share (`shared_content_type`), at most
    /// `limits::INTERNED_CONTENT_TYPES_MAX`.
    pub(super) content_types: RefCell<Vec<Arc<str>>>,
    /// Open segments, oldest first; the last one is active (takes new frames).
    pub(super) log: RefCell<VecDeque<OpenSegment>>,
    /// Buffers of sealed segments kept for the next ones (`spare.rs`).
    pub(super) buffers: SegmentBuffers,
    pub(super) segments: RefCell<HashMap<u64, SegmentSlot>>,
    /// Uploaded segments and blocks held in memory for reads, within one budget.
    pub(super) cache: RefCell<ReadCache>,
    /// Appends waiting for their acknowledgement.
    pub(super) acks: RefCell<AckQueue>,
    /// Sealed segments not yet stored and committed, in seal order.
    pub(super) sealed: RefCell<SealQueue>,
    pub(super) next_segment_no: Cell<u64>,
    /// The WAL's files, spare and health.
    pub(super) wal: RefCell<WalFiles>,
    /// Wakes the commit loop: frames were written, a segment rotated, or a flush waits.
    pub(super) commit_wanted: LocalNotify,
    /// Sources whose fork went away (deleted or expired here): the node's release task
    /// tells their cores, which may then drop a soft-deleted source.
    pub(super) fork_releases: RefCell<Vec<(String, u64)>>,
    pub(crate) fork_released: LocalNotify,
    pub(super) metrics: Arc<CoreMetrics>,
    /// Graceful shutdown began: live reads stop waiting.
    pub(super) stopping: Cell<bool>,
    /// This node's cluster membership (`None`: a single node).
    pub(super) cluster: Option<Arc<Cluster>>,
    /// Streams let go to other nodes, or being handed to one.
    pub(super) moves: RefCell<Moves>,
    /// Wakes the operations that waited for a hand-off.
    pub(super) handed_off: LocalBroadcast,
    /// Object durability: the node's flush PUTs, shared with the other cores.
    pub(super) put_budget: Arc<PutBudget>,
    /// Object durability: a flush waits for its slot in `put_budget` (`flush.rs`).
    pub(super) flush_pending: Cell<bool>,
    /// Every time the shard reads: deadlines, ages, record timestamps and expiry.
    pub(super) clock: Clock,
    /// Object durability: merges small stored segments (`compact.rs`).
    pub(super) compaction: super::compaction::Compaction,
}

/// `content_type` as one of `known` when it is there; else a new copy, added to `known` while it
/// holds fewer than `limits::INTERNED_CONTENT_TYPES_MAX` types.
pub(super) fn intern(known: &mut Vec<Arc<str>>, content_type: &str) -> Arc<str> {
    if let Some(shared) = known.iter().find(|t| ***t == *content_type) {
        return shared.clone();
    }
    let copy: Arc<str> = Arc::from(content_type);
    if known.len() < limits::INTERNED_CONTENT_TYPES_MAX {
        known.push(copy.clone());
    }
    copy
}

/// What a core's shard is made of, handed over by its seed (`boot.rs`).
pub(crate) struct ShardParts {
    pub(crate) core: usize,
    pub(crate) config: EngineConfig,
    pub(crate) meta: MetaStore,
    pub(crate) store: ObjectStore,
    pub(crate) metrics: Arc<CoreMetrics>,
    pub(crate) cluster: Option<Arc<Cluster>>,
    pub(crate) put_budget: Arc<PutBudget>,
    /// Where the shard reads the time (real outside tests).
    pub(crate) clock: Clock,
}

impl Shard {
    /// A core with no streams yet and no open segment (`start` makes the first).
    pub(super) fn new(parts: ShardParts) -> Shard {
        let ShardParts {
            core,
            config,
            meta,
            store,
            metrics,
            cluster,
            put_budget,
            clock,
        } = parts;
        Shard {
            core,
            buffers: SegmentBuffers::new(config.segment_size),
            config,
            meta,
            store,
            streams: RefCell::new(BTreeMap::new()),
            content_types: RefCell::new(Vec::new()),
            log: RefCell::new(VecDeque::new()),
            segments: RefCell::new(HashMap::new()),
            cache: RefCell::new(ReadCache::default()),
            acks: RefCell::new(AckQueue::default()),
            sealed: RefCell::new(SealQueue::default()),
            next_segment_no: Cell::new(0),
            wal: RefCell::new(WalFiles::new()),
            commit_wanted: LocalNotify::default(),
            fork_releases: RefCell::new(Vec::new()),
            fork_released: LocalNotify::default(),
            metrics,
            stopping: Cell::new(false),
            cluster,
            moves: RefCell::new(Moves::default()),
            handed_off: LocalBroadcast::default(),
            put_budget,
            flush_pending: Cell::new(false),
            clock,
            compaction: Default::default(),
        }
    }

    /// The copy of `content_type` a new stream of this core holds, shared with the core's other
    /// streams of that type: a million streams of a few types then hold a few copies of it, not
    /// a million. A client cannot grow the table past `limits::INTERNED_CONTENT_TYPES_MAX`:
    /// later types are simply not shared.
    pub(super) fn shared_content_type(&self, content_type: &str) -> Arc<str> {
        intern(&mut self.content_types.borrow_mut(), content_type)
    }

    pub(super) fn load_seeds(&self, seeds: Vec<StreamSeed>) {
        let mut keys: HashMap<std::sync::Arc<str>, u64> = HashMap::new();
        let mut streams = self.streams.borrow_mut();
        let mut segments = self.segments.borrow_mut();
        for seed in seeds {
            let config = &seed.config;
            let mut state = StreamState::with_content_type(
                seed.id,
                self.shared_content_type(&config.content_type),
                (config.ttl_sec, config.expires_at_ms, config.retention),
                seed.closed,
                seed.created_ms,
            );
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
                chunks.push(Chunk::new(run, no, last_timestamp_ms));
            }
            // A fork's own records start at its fork point; below it the source's are read.
            if seed.fork.is_some() || seed.fork_refs > 0 {
                let extras = state.extras_mut();
                extras.fork = seed.fork;
                extras.fork_refs = seed.fork_refs;
            }
            state.soft_deleted = seed.soft_deleted;
            let base = state.own_base();
            state.next_offset = state.next_offset.max(base);
            state.durable_offset = state.next_offset;
            let first_stored = chunks.first().map_or(base, |c| c.first_offset);
            let first_stored = if base > 0 { 0 } else { first_stored };
            state.start_offset = seed.start_offset.max(first_stored).min(state.next_offset);
            chunks.retain(|c| c.next_offset > state.start_offset);
            coarsen(&mut chunks, None);
            chunks.shrink_to_fit();
            if !seed.producers.is_empty() || seed.closed_by.is_some() || seed.writer_seq.is_some() {
                let extras = state.extras_mut();
                extras.producers = Producers::seeded(
                    seed.producers,
                    &self.config().producers,
                    self.clock.now_ms(),
                );
                extras.closed_by = seed.closed_by;
                extras.writer_seq = seed.writer_seq;
            }
            let name: Rc<str> = Rc::from(seed.name.as_str());
            self.moves.borrow_mut().forget(&name);
            streams.insert(
                name,
                Stream {
                    recorded_access_ms: state.last_access_ms,
                    state,
                    chunks,
                    waiters: Vec::new(),
                    epoch: seed.epoch,
                    retiring: false,
                },
            );
        }
        CoreMetrics::set(&self.metrics.streams, streams.len() as u64);
    }

    pub(crate) fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Where this shard reads the time.
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    pub(crate) fn meta(&self) -> &MetaStore {
        &self.meta
    }

    pub(crate) fn store(&self) -> &ObjectStore {
        &self.store
    }
}
