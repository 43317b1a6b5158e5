//! A core's handle on the engine, what the protocol layers call: one typed method per
//! operation, run on the stream's owning core (`route.rs`), forks stitched (`fork.rs`), and
//! nothing served while a cluster node does not hold its lease.

use std::cell::OnceCell;
use std::rc::Rc;
use std::sync::Arc;

use pico_meta::{CatalogStream, MetaStore, NodeId};

use crate::api::{
    AppendAck, AppendRequest, CreateRequest, Created, ReadBatch, ReadRequest, RetentionChange,
    StreamInfo, StreamSummary,
};
use crate::boot::CoreSeed;
use crate::checkpoint::CheckpointError;
use crate::cluster::Cluster;
use crate::error::{AppendError, CreateError, EngineError, ReadError, StartError, TrimError};
use crate::fork;
use crate::gc;
use crate::inbox::Peers;
use crate::limits;
use crate::live::LiveReads;
use crate::route::{serve_inbox, Router};
use crate::shard::{Shard, ShardParts};

/// A core's handle on the engine: runs operations on the stream's owning core.
pub struct CoreHandle {
    router: Rc<Router>,
    cluster: Option<Arc<Cluster>>,
    /// Long-polls and SSE subscribers of this core waiting at the same place share a read.
    live: LiveReads,
    /// Core 0's garbage collector, held by a backup.
    gc: Rc<gc::GcGate>,
    /// Told of every write and deletion this handle acknowledged ([`WriteObserver`]).
    observer: OnceCell<Rc<dyn WriteObserver>>,
}

/// What the node does after the engine acknowledged a write: subscriptions and wake webhooks
/// hear of it here, once, whichever protocol or service wrote.
pub trait WriteObserver {
    /// `name` (the stream whose id is `stream_id`) took records or was closed; `next_offset`
    /// is its new tail.
    fn on_write(&self, name: &str, stream_id: u64, next_offset: u64);
    /// `name` was deleted.
    fn on_delete(&self, name: &str);
}

impl CoreHandle {
    /// Starts this core's shard and its inbox. Call on the core's executor.
    pub async fn start(seed: CoreSeed) -> Result<Rc<CoreHandle>, StartError> {
        let CoreSeed {
            core,
            config,
            meta,
            store,
            streams,
            inbox,
            peers,
            metrics,
            cluster,
            put_budget,
            clock,
            recovery,
        } = seed;
        let parts = ShardParts {
            core,
            config,
            meta,
            store,
            metrics,
            cluster: cluster.clone(),
            put_budget,
            clock: clock.clone(),
            recovery,
        };
        let shard = Shard::start(parts, streams).await?;
        let inbox_shard = shard.clone();
        // Messages from other threads wake this task: a latency-sensitive queue makes glommio
        // poll for those wakes promptly instead of after its throughput slice.
        let queue = glommio::executor().create_task_queue(
            glommio::Shares::default(),
            glommio::Latency::Matters(std::time::Duration::from_millis(limits::INBOX_LATENCY_MS)),
            "pico-inbox",
        );
        glommio::spawn_local_into(serve_inbox(inbox_shard, inbox), queue)
            .map_err(|source| StartError::Inbox { core, source })?
            .detach();
        let router = Rc::new(Router {
            core,
            shard,
            peers: Peers::new(peers),
        });
        let gc = Rc::new(gc::GcGate::new(clock.clone()));
        if core == 0 {
            glommio::spawn_local(gc::gc_loop(router.clone(), gc.clone())).detach();
        }
        glommio::spawn_local(fork::release_loop(router.clone())).detach();
        Ok(Rc::new(CoreHandle {
            router,
            cluster,
            live: LiveReads::new(clock),
            gc,
            observer: OnceCell::new(),
        }))
    }

    pub fn core(&self) -> usize {
        self.router.core
    }

    pub fn cores(&self) -> usize {
        self.router.cores()
    }

    /// Graceful shutdown of this core's engine: live reads answer now and stop waiting.
    pub fn begin_shutdown(&self) {
        self.router.shard.begin_shutdown();
    }

    pub fn is_stopping(&self) -> bool {
        self.router.shard.is_stopping()
    }

    /// Seals and uploads everything this core holds (see `Shard::flush`); `true` when done
    /// within `timeout`.
    pub async fn flush(&self, timeout: std::time::Duration) -> bool {
        self.router.shard.flush(timeout).await
    }

    /// Holds this node's garbage collector until the hold is dropped (a backup copying the
    /// objects its catalog copy names), once a round in progress ended. `Err` on any core but
    /// 0 (which runs the collector), or when the round did not end within `timeout`.
    pub async fn hold_gc(&self, timeout: std::time::Duration) -> Result<gc::GcHold, gc::HoldError> {
        if self.router.core != 0 {
            return Err(gc::HoldError::NotCollectorCore);
        }
        self.gc
            .hold(timeout)
            .await
            .ok_or(gc::HoldError::RoundRunning {
                timeout_ms: timeout.as_millis(),
            })
    }

    /// A backup's checkpoint: every core stores and commits what it held when asked, so the
    /// bucket and the catalog hold every record acknowledged before this call. `Err` names
    /// the cores that did not finish within `timeout` (their WAL still holds it all).
    pub async fn checkpoint(&self, timeout: std::time::Duration) -> Result<(), CheckpointError> {
        let mut answers = Vec::new();
        for core in self.router.others() {
            let (reply, answer) = futures_channel::oneshot::channel();
            self.router
                .peers
                .send(core, crate::inbox::Message::Checkpoint { timeout, reply })
                .map_err(|source| CheckpointError::Ask { core, source })?;
            answers.push((core, answer));
        }
        let mut late = Vec::new();
        if !self.router.shard.checkpoint(timeout).await {
            late.push(self.router.core);
        }
        for (core, answer) in answers {
            if !answer.await.unwrap_or(false) {
                late.push(core);
            }
        }
        if late.is_empty() {
            return Ok(());
        }
        late.sort_unstable();
        Err(CheckpointError::Late {
            cores: late,
            timeout_ms: timeout.as_millis(),
        })
    }

    /// This node's cluster membership (`None`: a single node).
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.as_ref()
    }

    /// The metadata log (the admin API reads the cluster's state from it).
    pub fn meta(&self) -> &MetaStore {
        self.router.shard.meta()
    }

    /// The object store (the admin API reads quarantined records from it).
    pub fn store(&self) -> &pico_s3::ObjectStore {
        self.router.shard.store()
    }

    /// A node that may have lost its streams serves none until it knows.
    async fn leased(&self) -> Result<(), EngineError> {
        match &self.cluster {
            Some(cluster) => cluster.wait_for_lease().await,
            None => Ok(()),
        }
    }

    /// Creates a stream (idempotently: an existing one with the same configuration is
    /// `created: false`), with its first records if given; a fork first resolves its fork
    /// point with the source.
    /// Tells `observer` of every write and deletion acknowledged from now on (once per core).
    pub fn observe_writes(&self, observer: Rc<dyn WriteObserver>) {
        if self.observer.set(observer).is_err() {
            log::error!("a second write observer is ignored");
        }
    }

    fn wrote(&self, name: &str, stream_id: u64, next_offset: u64) {
        if let Some(observer) = self.observer.get() {
            observer.on_write(name, stream_id, next_offset);
        }
    }

    /// Creates a stream (a fork with `request.fork`); the observer hears of a create that
    /// wrote records or made the stream closed.
    pub async fn create(&self, name: &str, request: CreateRequest) -> Result<Created, CreateError> {
        let created = self.create_stream(name, request).await?;
        if created.first.is_some() || created.info.closed {
            self.wrote(name, created.info.id, created.info.next_offset);
        }
        Ok(created)
    }

    async fn create_stream(
        &self,
        name: &str,
        request: CreateRequest,
    ) -> Result<Created, CreateError> {
        self.leased().await?;
        let CreateRequest {
            config,
            closed,
            records,
            fork,
        } = request;
        match fork {
            // Boxed: a fork's create is rare and its future the largest here; unboxed it
            // would size every request's future.
            Some(spec) => {
                Box::pin(fork::create(
                    &self.router,
                    name,
                    config,
                    closed,
                    records,
                    spec,
                ))
                .await
            }
            None => {
                self.router
                    .create(name, config, closed, records, None)
                    .await
            }
        }
    }

    /// Appends once durable (as `--durability` says).
    pub async fn append(
        &self,
        name: &str,
        request: AppendRequest,
    ) -> Result<AppendAck, AppendError> {
        self.leased().await?;
        let ack = self.router.append(name, request).await?;
        // Records taken or the stream closed (a producer's duplicate close too).
        if ack.start_offset.is_some() || ack.closed {
            self.wrote(name, ack.stream_id, ack.next_offset);
        }
        Ok(ack)
    }

    /// Reads records; a fork read below its fork point is stitched from its source. Live
    /// reads waiting at the same place share one read (`live.rs`).
    /// `request` by reference: a by-value argument is held by the future for its whole life,
    /// and a live read (thousands wait at once) would carry a copy at each level.
    pub async fn read(&self, name: &str, request: &ReadRequest) -> Result<ReadBatch, ReadError> {
        self.leased().await?;
        if let Some(answer) = self.live.read(&self.router, name, request).await {
            return answer;
        }
        // On the heap: a live read parked at the tail then holds only the shared read's
        // small future, not room for this one too.
        Box::pin(fork::read(&self.router, name, request.clone())).await
    }

    pub async fn head(&self, name: &str) -> Result<StreamInfo, EngineError> {
        self.leased().await?;
        self.router.head(name).await
    }

    /// Raises the first readable offset (clamped to the durable tail); the new one.
    pub async fn trim(&self, name: &str, offset: u64) -> Result<u64, TrimError> {
        self.leased().await?;
        self.router.trim(name, offset).await
    }

    /// Changes the retention policy; the stream as it is now.
    pub async fn configure(
        &self,
        name: &str,
        change: RetentionChange,
    ) -> Result<StreamInfo, EngineError> {
        self.leased().await?;
        self.router.configure(name, change).await
    }

    pub async fn delete(&self, name: &str) -> Result<(), EngineError> {
        self.leased().await?;
        self.router.delete(name).await?;
        if let Some(observer) = self.observer.get() {
            observer.on_delete(name);
        }
        Ok(())
    }

    /// Streams whose names start with `prefix` and sort after `start_after`, from every core,
    /// in name order; the flag says whether more exist past `limit`.
    pub async fn list(
        &self,
        prefix: &str,
        start_after: &str,
        limit: usize,
    ) -> Result<(Vec<StreamSummary>, bool), EngineError> {
        self.router.list(prefix, start_after, limit).await
    }

    /// [`CoreHandle::list`] over the whole cluster, each stream with its owner node: the page
    /// comes from the catalog, which every node shares, so a stream is listed by any node,
    /// taken-over ones as soon as the metadata log moved them. Offsets are live for this
    /// node's streams (their `HEAD`); for other nodes' they are the catalog's committed ones,
    /// which with object durability (a cluster's default) are every acknowledged append. Of
    /// other nodes' streams only those past a fixed expiry are left out: a sliding TTL is
    /// their owner's to judge. A single node lists its own streams, with no owner.
    pub async fn list_cluster_wide(
        &self,
        prefix: &str,
        start_after: &str,
        limit: usize,
    ) -> Result<(Vec<(StreamSummary, Option<NodeId>)>, bool), EngineError> {
        let Some(cluster) = &self.cluster else {
            let (page, more) = self.router.list(prefix, start_after, limit).await?;
            return Ok((page.into_iter().map(|s| (s, None)).collect(), more));
        };
        let me = cluster.node_id();
        let rows = self
            .meta()
            .list_streams(prefix, start_after, limit.saturating_add(1))
            .await
            .map_err(|_| EngineError::ShuttingDown)?
            .map_err(EngineError::from)?;
        let more = rows.len() > limit;
        // This node's loaded streams of the same range, from every core in one round: the
        // catalog page's names of this node are among them unless not loaded yet (taken over
        // or transferred here just now) or expired, which their `HEAD` tells apart.
        let (loaded, _) = self
            .router
            .list(prefix, start_after, limit.saturating_add(1))
            .await?;
        let mut loaded: std::collections::HashMap<String, StreamInfo> =
            loaded.into_iter().map(|s| (s.name, s.info)).collect();
        let now = self.router.shard.clock().now_ms();
        let mut page = Vec::with_capacity(rows.len().min(limit));
        for listed in rows.into_iter().take(limit) {
            let owner = listed.ownership.node;
            let info = if let Some(info) = loaded.remove(&listed.row.name) {
                info
            } else if owner == Some(me) {
                match self.head(&listed.row.name).await {
                    Ok(info) => info,
                    // Deleted or expired since the catalog was read.
                    Err(EngineError::NotFound | EngineError::Gone) => continue,
                    // Moved away meanwhile, or not servable now: what the catalog says.
                    Err(_) => committed_info(&listed),
                }
            } else if listed.row.config.expires_at_ms.is_some_and(|at| at <= now) {
                continue;
            } else {
                committed_info(&listed)
            };
            let name = listed.row.name;
            page.push((StreamSummary { name, info }, owner));
        }
        Ok((page, more))
    }
}

/// A stream's [`StreamInfo`] as the catalog has it.
fn committed_info(listed: &CatalogStream) -> StreamInfo {
    let config = &listed.row.config;
    StreamInfo {
        id: listed.row.id,
        content_type: config.content_type.clone(),
        ttl_sec: config.ttl_sec,
        expires_at_ms: config.expires_at_ms,
        start_offset: listed.start_offset,
        next_offset: listed.next_offset,
        closed: listed.row.closed,
        retention: config.retention,
    }
}
