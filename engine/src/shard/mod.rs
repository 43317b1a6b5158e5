//! One core's slice of the engine: the streams it owns, their waiters, its segment builder
//! and its write-ahead log, and the one dispatch of the operations it is sent.
//!
//! Write path: an append is checked by the pure state machine, framed once into the active
//! segment buffer, and parked on a pending-ack queue (`append.rs`). The commit loop writes
//! everything that arrived since the last round to the segment's WAL file with one DMA write
//! and one `fdatasync` (group commit, `commit.rs` over `wal.rs`), then releases the acks in
//! order and wakes the readers waiting on those streams (`acks.rs`). A segment that is full
//! (or old) is sealed (`segment.rs`): its bytes go to the object store, its index to the
//! metadata log, and only then is its WAL file removed (`upload.rs`). Reads (`read.rs`) take
//! a stream's chunks from open segments, sealed ones in memory, or uploaded ones by blocks
//! (`cache.rs`). See docs/architecture.md.
//!
//! The files build on each other without a loop. At the bottom the types and owned parts,
//! which import no sibling: `stream.rs` (a stream, its chunks, its seed), `pending.rs` (the
//! ack queue), `blocks.rs` (the read cache), `sealed.rs` (seal order and upload backlog),
//! `spare.rs` (segment buffers kept for reuse); `state.rs` (the `Shard` made of them) over
//! those. Then the `impl Shard` files, each using
//! only those below it: `acks`, `wal`, `cache`, `fence`, `compact`, `upload`, `segment`, `commit`,
//! `lifecycle`, `handoff`, `append`, `read`, `reaper`, and this file on top. Everything here
//! runs on one executor: `RefCell`s are never held across an `.await`.

mod acks;
mod append;
mod blocks;
mod cache;
mod commit;
mod compact;
mod fence;
mod flush;
mod handoff;
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
#[cfg(test)]
mod tests;
mod upload;
mod wal;

pub(crate) use self::seeds::stream_seeds_by_core;
pub(crate) use self::state::{Shard, ShardParts};
pub(crate) use self::stream::coarsen_runs;
pub use self::stream::StreamSeed;

use std::rc::Rc;
use std::time::Instant;

use crate::api::{Op, ReadBatch, ReadRequest, Reply};
use crate::error::EngineError;
use crate::metrics::{CoreMetrics, OpKind};

impl Shard {
    pub(crate) async fn start(
        parts: ShardParts,
        seeds: Vec<StreamSeed>,
    ) -> Result<Rc<Shard>, String> {
        let shard = Rc::new(Shard::new(parts));
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
                let created = self.create(name, config, closed, records, fork).await?;
                Ok(created.into())
            }
            Op::Append(request) => self.append(name, request).await.map(Reply::Appended),
            Op::ForkAcquire {
                offset,
                partial_bytes,
            } => {
                let (origin, config) = self.fork_acquire(name, offset, partial_bytes).await?;
                Ok(Reply::ForkPoint { origin, config })
            }
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
            Op::Delete => self
                .delete(name)
                .await
                .map(|fork_source| Reply::Deleted { fork_source }),
        }
    }
}
