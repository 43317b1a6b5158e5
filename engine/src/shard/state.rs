//! The state a core holds: the `Shard`, made of its owners (the journal, the streams, the
//! segment table), its immutable parts (config, stores, metrics, cluster, clock) and a little
//! bookkeeping; made empty, then filled from recovered streams (`load_seeds`).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use pico_meta::MetaStore;
use pico_s3::ObjectStore;

use crate::clock::Clock;
use crate::cluster::Cluster;
use crate::config::EngineConfig;
use crate::metrics::CoreMetrics;
use crate::notify::LocalNotify;
use crate::producers::Producers;
use crate::put_budget::PutBudget;
use crate::recovery::RecoveryBacklog;
use crate::rules::StreamState;

use super::journal::Journal;
use super::stream::{coarsen, Chunk, Stream, StreamSeed};
use super::streams::Streams;
use super::table::{SegmentData, SegmentSlot, SegmentTable};

/// One core's engine. Its mutable state lives in owners that keep their fields private and
/// change only through their methods: the `Journal` (open segments, WAL, group commit,
/// acknowledgements), the `Streams` and the `SegmentTable` (with the read cache and the seal
/// queue); the `impl Shard` files beside this one compose them into operations.
pub(crate) struct Shard {
    pub(super) core: usize,
    pub(super) config: EngineConfig,
    pub(super) meta: MetaStore,
    pub(super) store: ObjectStore,
    /// The open segments, WAL, group commit and acknowledgements (`journal.rs`).
    pub(super) journal: Journal,
    /// The streams, their shared content types and their moves between nodes (`streams.rs`).
    pub(super) streams: Streams,
    /// Every segment the streams' chunks point into, the read cache and the seal queue
    /// (`table.rs`).
    pub(super) segments: SegmentTable,
    /// Sources whose fork went away (deleted or expired here): the node's release task
    /// tells their cores, which may then drop a soft-deleted source.
    pub(super) fork_releases: RefCell<Vec<(String, u64)>>,
    pub(crate) fork_released: LocalNotify,
    pub(super) metrics: Arc<CoreMetrics>,
    /// Graceful shutdown began: live reads stop waiting.
    pub(super) stopping: Cell<bool>,
    /// This node's cluster membership (`None`: a single node).
    pub(super) cluster: Option<Arc<Cluster>>,
    /// Object durability: the node's flush PUTs, shared with the other cores.
    pub(super) put_budget: Arc<PutBudget>,
    /// Every time the shard reads: deadlines, ages, record timestamps and expiry.
    pub(super) clock: Clock,
    /// Object durability: merges small stored segments (`compact.rs`).
    pub(super) compaction: super::compaction::Compaction,
    /// When this core last logged damaged stored bytes, and how many it met since (`read.rs`).
    pub(super) damage_log: super::read::DamageLog,
    /// The upload failures' log lines (`upload.rs`): one per `limits::UPLOAD_FAILURE_LOG_INTERVAL_MS`.
    pub(super) upload_failure_log: pico_meta::LogLimit,
    /// Recovered WAL files the bucket did not take at start (`recovery/deferred.rs`): no
    /// segment of this core commits before they are all stored.
    pub(super) recovery: Arc<RecoveryBacklog>,
    /// This core's slots of those segments, read from memory until each is stored.
    pub(super) recovered_unstored: RefCell<Vec<(u64, Rc<str>)>>,
    /// Local durability: the WAL files this core made and has not retired (`wal_ledger.rs`).
    pub(super) ledger: std::cell::OnceCell<crate::wal_ledger::WalLedger>,
    /// WAL files being retired (their ledger write, then their removal): a clean stop waits
    /// for them, so it leaves no stored segment's file behind.
    pub(super) retiring: Cell<usize>,
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
    /// Recovered segments not yet stored, shared by the node's cores.
    pub(crate) recovery: Arc<RecoveryBacklog>,
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
            recovery,
        } = parts;
        Shard {
            core,
            journal: Journal::new(config.segment_size, clock.now()),
            config,
            meta,
            store,
            streams: Streams::new(metrics.clone()),
            segments: SegmentTable::default(),
            fork_releases: RefCell::new(Vec::new()),
            fork_released: LocalNotify::default(),
            metrics,
            stopping: Cell::new(false),
            cluster,
            put_budget,
            clock,
            compaction: Default::default(),
            damage_log: Default::default(),
            upload_failure_log: pico_meta::LogLimit::new(
                crate::limits::UPLOAD_FAILURE_LOG_INTERVAL_MS,
            ),
            recovery,
            recovered_unstored: RefCell::new(Vec::new()),
            ledger: std::cell::OnceCell::new(),
            retiring: Cell::new(0),
        }
    }

    /// Installs `seeds` as this core's streams. Returns the streams deleted for clients whose
    /// forks are all gone (a crash came between the last fork's delete and its release of the
    /// source): [`Shard::finish_deletes`] removes them.
    #[must_use]
    pub(super) fn load_seeds(&self, seeds: Vec<StreamSeed>) -> Vec<(Rc<str>, u64)> {
        let mut unreleased = Vec::new();
        let mut keys: HashMap<std::sync::Arc<str>, u64> = HashMap::new();
        for seed in seeds {
            let config = &seed.config;
            let mut state = StreamState::with_content_type(
                seed.id,
                self.streams.shared_content_type(&config.content_type),
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
                    let key: Rc<str> = Rc::from(&*key);
                    // A recovered segment the bucket has not taken yet is read from memory.
                    let held = self.recovery.held(&key);
                    let unstored = held.is_some();
                    let no = self.segments.add(SegmentSlot {
                        key: key.clone(),
                        data: held.map_or(SegmentData::Remote, SegmentData::Memory),
                        uploaded: !unstored,
                        size: segment_size,
                    });
                    if unstored {
                        self.recovered_unstored.borrow_mut().push((no, key));
                    }
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
            if state.soft_deleted && seed.fork_refs == 0 {
                unreleased.push((name.clone(), state.id));
            }
            self.streams.forget_moved(&name);
            self.streams.insert(
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
        unreleased
    }

    /// Finishes the deletes of streams that only forks kept (soft-deleted) once no fork is
    /// left ([`Shard::load_seeds`]'s list): an acknowledged delete of the last fork promised
    /// the source's name free. One that fails is left to the reaper, which removes such
    /// streams too.
    pub(super) async fn finish_deletes(&self, streams: Vec<(Rc<str>, u64)>) {
        for (name, id) in streams {
            match self.remove_stream(&name, id).await {
                Ok(()) => log::info!(
                    "core {}: {name} (stream {id}) was deleted and no fork reads it any more: \
                     removed",
                    self.core
                ),
                Err(e) => log::warn!(
                    "core {}: could not remove {name} (stream {id}), deleted with no fork \
                     left: {e}; the reaper tries again",
                    self.core
                ),
            }
        }
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
