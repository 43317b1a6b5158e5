//! One core's slice of the engine: the streams it owns, their waiters, its segment builder
//! and its write-ahead log, and how it runs each operation it is sent (`Run`).
//!
//! Write path: an append is checked by the pure state machine, framed once into the active
//! segment buffer, and parked on a pending-ack queue (`append.rs`). The commit loop writes
//! everything that arrived since the last round to the segment's WAL file with one DMA write
//! and one `fdatasync` (group commit, `commit.rs` over `journal.rs` and `wal.rs`), then
//! releases the acks in order and wakes the readers waiting on those streams (`acks.rs`). A segment that is full
//! (or old) is sealed (`segment.rs`): its bytes go to the object store, its index to the
//! metadata log, and only then is its WAL file removed (`upload.rs`). Reads (`read.rs`) take
//! a stream's chunks from open segments, sealed ones in memory, or uploaded ones by blocks
//! (`cache.rs`). See docs/architecture.md.
//!
//! The files build on each other without a loop. At the bottom the types and owned parts,
//! which import no sibling: `stream.rs` (a stream, its chunks, its seed), `pending.rs` (the
//! ack queue), `blocks.rs` (the read cache), `sealed.rs` (seal order and upload backlog),
//! `spare.rs` (segment buffers kept for reuse), `moves.rs` (streams moving between nodes).
//! Over them the three owners of a core's mutable state, each with private fields:
//! `journal.rs` (open segments, WAL, group commit, acknowledgements), `streams.rs` (the
//! streams) and `table.rs` (the segment table, read cache and seal queue); `state.rs` (the
//! `Shard` made of them) over those. Then the `impl Shard` files, each using
//! only those below it: `acks`, `wal`, `cache`, `fence`, `compact`, `upload`, `segment`, `commit`,
//! `lifecycle`, `handoff`, `append`, `read`, `reaper`, and this file on top. Everything here
//! runs on one executor: `RefCell`s are never held across an `.await`.

mod acks;
mod append;
mod blocks;
mod cache;
mod commit;
mod compact;
mod compaction;
mod fence;
mod flush;
mod handoff;
mod journal;
mod lifecycle;
mod moves;
mod pending;
mod read;
mod reaper;
mod sealed;
mod seeds;
mod segment;
mod spare;
mod state;
mod stream;
mod streams;
mod table;
#[cfg(test)]
mod tests;
mod upload;
mod wal;

pub(crate) use self::seeds::stream_seeds_by_core;
pub(crate) use self::state::{Shard, ShardParts};
pub(crate) use self::stream::coarsen_runs;
pub use self::stream::StreamSeed;

use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use crate::api::{AppendAck, AppendRequest, Created, ReadBatch, ReadRequest, StreamInfo};
use crate::error::{AppendError, CreateError, EngineError, ReadError, StartError, TrimError};
use crate::health::WalFault;
use crate::metrics::{CoreMetrics, OpKind};
use crate::ops::{Configure, Create, Delete, ForkAcquire, ForkRelease, Head, StreamOp, Trim};
use crate::rules::{ForkOrigin, StreamConfig};
use crate::wal_ledger::WalLedger;

impl Shard {
    pub(crate) async fn start(
        parts: ShardParts,
        seeds: Vec<StreamSeed>,
    ) -> Result<Rc<Shard>, StartError> {
        let shard = Rc::new(Shard::new(parts));
        let unreleased = shard.load_seeds(seeds);
        if shard.wal_enabled() {
            let group = shard.wal_group();
            let ledger = WalLedger::create(&shard.config.wal_dir, &group)
                .await
                .map_err(|e| {
                    StartError::WalFile(WalFault::Ledger {
                        path: crate::wal_ledger::ledger_path(&shard.config.wal_dir, &group),
                        source: Arc::new(e),
                    })
                })?;
            let _ = shard.ledger.set(ledger);
        }
        let first = shard
            .create_wal_file(wal::WalFill::Head(crate::limits::WAL_HEAD_WRITTEN_BYTES))
            .await
            .map_err(StartError::WalFile)?;
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
        if !shard.recovered_unstored.borrow().is_empty() {
            let recovered = shard.clone();
            glommio::spawn_local(async move { recovered.recovered_stored_loop().await }).detach();
        }
        // Before the core serves: a restart must not answer `410` for what is gone.
        shard.finish_deletes(unreleased).await;
        Ok(shard)
    }

    /// Runs `op` on `name`, routed first in a cluster, counted, and timed when it does work.
    pub(crate) async fn execute<O: Run>(
        self: &Rc<Self>,
        name: &str,
        op: O,
    ) -> Result<O::Answer, O::Error> {
        let timed = op.timed();
        let started = self.clock.now();
        if self.cluster.is_some() {
            // Boxed: only a cluster routes, and its future would size every operation's.
            Box::pin(self.route(name, op.route())).await?;
        }
        let result = op.run(self, name).await;
        self.count_op(O::KIND, result.is_err(), timed.then_some(started));
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
            metrics
                .latency
                .observe(self.clock.now().saturating_duration_since(started));
        }
    }
}

/// An operation as this shard runs it, once routing put it here (`Shard::execute` counts it).
pub(crate) trait Run: StreamOp {
    fn run(
        self,
        shard: &Rc<Shard>,
        name: &str,
    ) -> impl Future<Output = Result<Self::Answer, Self::Error>>;
}

impl Run for Create {
    async fn run(self, shard: &Rc<Shard>, name: &str) -> Result<Created, CreateError> {
        let Create {
            config,
            closed,
            records,
            fork,
        } = self;
        // Boxed: a create's future is the largest, and rare next to appends and reads.
        Box::pin(shard.create(name, config, closed, records, fork)).await
    }
}

impl Run for AppendRequest {
    async fn run(self, shard: &Rc<Shard>, name: &str) -> Result<AppendAck, AppendError> {
        shard.append(name, self).await
    }
}

impl Run for ReadRequest {
    async fn run(self, shard: &Rc<Shard>, name: &str) -> Result<ReadBatch, ReadError> {
        let batch = shard.read(name, self).await?;
        let bytes: usize = batch.records.iter().map(|r| r.body.len()).sum();
        CoreMetrics::add(&shard.metrics.records_read, batch.records.len() as u64);
        CoreMetrics::add(&shard.metrics.bytes_read, bytes as u64);
        Ok(batch)
    }
}

impl Run for Head {
    async fn run(self, shard: &Rc<Shard>, name: &str) -> Result<StreamInfo, EngineError> {
        shard.head(name).await
    }
}

impl Run for Trim {
    async fn run(self, shard: &Rc<Shard>, name: &str) -> Result<u64, TrimError> {
        shard.trim(name, self.offset).await
    }
}

impl Run for Configure {
    async fn run(self, shard: &Rc<Shard>, name: &str) -> Result<StreamInfo, EngineError> {
        shard.configure(name, self.change).await
    }
}

impl Run for Delete {
    async fn run(
        self,
        shard: &Rc<Shard>,
        name: &str,
    ) -> Result<Option<(String, u64)>, EngineError> {
        shard.delete(name).await
    }
}

impl Run for ForkAcquire {
    async fn run(
        self,
        shard: &Rc<Shard>,
        name: &str,
    ) -> Result<(ForkOrigin, StreamConfig), CreateError> {
        shard
            .fork_acquire(name, self.offset, self.partial_bytes)
            .await
    }
}

impl Run for ForkRelease {
    async fn run(self, shard: &Rc<Shard>, name: &str) -> Result<(), EngineError> {
        shard.fork_release(name, self.source_id).await
    }
}
