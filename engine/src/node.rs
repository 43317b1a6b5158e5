//! Booting a node (recovery, then one shard per core) and routing operations to the core that
//! owns each stream.
//!
//! Ownership: `owner = fnv1a64(name) % cores`, a stable hash, so a name maps to the same core
//! across restarts with the same core count (and recovery redistributes when the count
//! changes). A request parsed on core A for a stream of core B crosses over a bounded channel
//! to B's inbox; its body `Bytes` move, they are not copied; the reply comes back on a oneshot.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use futures_channel::{mpsc, oneshot};
use futures_lite::StreamExt;
use pico_meta::{
    MetaStore, MetaUrl, ProducerState, SegmentRecord, SegmentRun, SegmentStreamEntry, Snapshot,
};
use pico_s3::{ObjectStore, StorageUri};

use crate::api::{
    Fork, ForkSpec, Op, ReadBatch, ReadBound, ReadFrom, ReadRequest, RecordInput, Reply,
    StreamSummary,
};
use crate::cluster::{Cluster, ClusterConfig};
use crate::error::EngineError;
use crate::frame::{self, ProducerTuple, FRAME_KIND_CLOSE};
use crate::limits;
use crate::metrics::{CoreMetrics, NodeMetrics};
use crate::shard::{Shard, StreamSeed};
use crate::state::StreamConfig;
use crate::{now_ms, EngineConfig};

/// FNV-1a, 64 bit: stable across builds and platforms (unlike `DefaultHasher`).
pub fn stream_hash(name: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

pub fn owner_core(name: &str, cores: usize) -> usize {
    (stream_hash(name) % cores as u64) as usize
}

pub(crate) enum Message {
    Op {
        name: String,
        op: Op,
        reply: oneshot::Sender<Result<Reply, EngineError>>,
    },
    /// Every live stream of the core: id → first readable offset (for garbage collection).
    Live {
        reply: oneshot::Sender<Vec<(u64, u64)>>,
    },
    /// These segments were garbage-collected: drop what is cached of them.
    Forget { keys: Arc<Vec<String>> },
    List {
        prefix: String,
        start_after: String,
        limit: usize,
        reply: oneshot::Sender<Vec<StreamSummary>>,
    },
    /// An operator moves this stream to another node: store what we hold of it, then hand it
    /// over (cluster).
    HandOff {
        transfer: pico_meta::PendingTransfer,
        reply: oneshot::Sender<()>,
    },
    /// The lease had lapsed: keep only the streams still ours (`id → owner epoch`).
    Revalidate {
        owned: Arc<HashMap<u64, u64>>,
        reply: oneshot::Sender<()>,
    },
}

/// Everything one core needs to start its shard; `Send`, handed to the core's thread.
pub struct CoreSeed {
    core: usize,
    config: EngineConfig,
    meta: MetaStore,
    store: ObjectStore,
    streams: Vec<StreamSeed>,
    inbox: mpsc::Receiver<Message>,
    peers: Vec<mpsc::Sender<Message>>,
    metrics: Arc<CoreMetrics>,
    cluster: Option<Arc<Cluster>>,
}

/// The result of [`boot`]: one seed per core plus the shared handles.
pub struct Boot {
    pub seeds: Vec<CoreSeed>,
    pub meta: MetaStore,
    pub store: ObjectStore,
    /// Facts worth a startup log line.
    pub report: Vec<String>,
    /// Exclusive lock on the WAL directory: keep it for as long as the node runs.
    pub wal_lock: std::fs::File,
    /// Every core's counters, for `/metrics` and the admin API.
    pub metrics: NodeMetrics,
    /// This node's membership, when the metadata log is shared (Postgres): its lease keeper
    /// runs from here on.
    pub cluster: Option<Arc<Cluster>>,
}

/// Opens the metadata log and the object store, recovers every WAL file left by a previous
/// run (whatever its core count), and splits the streams across `config.cores` cores.
/// Runs on the main thread before any executor starts.
pub fn boot(
    mut config: EngineConfig,
    meta_url: &str,
    storage: &str,
    cluster: Option<ClusterConfig>,
) -> Result<Boot, String> {
    std::fs::create_dir_all(&config.wal_dir).map_err(|e| {
        format!(
            "cannot create WAL directory {}: {e}",
            config.wal_dir.display()
        )
    })?;
    // Two nodes on one WAL directory would recover (and delete) each other's live files.
    let wal_lock = lock_dir(&config.wal_dir)?;
    let url = MetaUrl::parse(meta_url).map_err(|e| e.to_string())?;
    let (meta, mut snapshot) = MetaStore::open(&url).map_err(|e| e.to_string())?;
    let uri = StorageUri::parse(storage).map_err(|e| e.to_string())?;
    let store = ObjectStore::open(&uri).map_err(|e| e.to_string())?;
    let mut report = Vec::new();
    let cluster = match cluster {
        None => None,
        Some(cluster_config) => {
            let node = cluster_config.node_id;
            let state = wait(meta.register_node(
                node,
                cluster_config.node_epoch,
                &cluster_config.address,
                cluster_config.slots,
                cluster_config.lease_ms,
            ))?;
            report.push(format!(
                "cluster {}: node {node} registered at epoch {} as {} with {} slots ({} nodes \
                 known)",
                cluster_config.cluster_id,
                cluster_config.node_epoch,
                cluster_config.address,
                cluster_config.slots,
                state.nodes.len()
            ));
            Some(Cluster::new(cluster_config, state))
        }
    };
    let fence = cluster.as_ref().map(|c| c.node_id());
    let recovered = recover_wal_files(&config, &meta, &store, &mut snapshot, &mut report, fence)?;
    let mut epochs = HashMap::new();
    if let Some(cluster) = &cluster {
        // Only what this node owns; the other nodes' streams are theirs to serve.
        epochs = wait(meta.owned_streams(cluster.node_id()))?;
        snapshot.streams.retain(|row| epochs.contains_key(&row.id));
    }
    config.node_epoch_ms = config.node_epoch_ms.max(recovered.max_epoch_ms + 1);
    let cores = config.cores.max(1);
    let mut per_core: Vec<Vec<StreamSeed>> = (0..cores).map(|_| Vec::new()).collect();
    for mut seed in stream_seeds(&snapshot) {
        seed.epoch = epochs.get(&seed.id).copied().unwrap_or(0);
        per_core[owner_core(&seed.name, cores)].push(seed);
    }
    report.push(format!(
        "recovered {} streams and {} segments",
        snapshot.streams.len(),
        snapshot.segments.len()
    ));
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..cores)
        .map(|_| mpsc::channel(limits::CROSS_CORE_QUEUE_MAX))
        .unzip();
    let metrics: NodeMetrics = Arc::new(
        (0..config.cores)
            .map(|_| Arc::new(CoreMetrics::default()))
            .collect(),
    );
    let seeds = receivers
        .into_iter()
        .zip(per_core)
        .enumerate()
        .map(|(core, (inbox, streams))| CoreSeed {
            core,
            config: config.clone(),
            meta: meta.clone(),
            store: store.clone(),
            streams,
            inbox,
            peers: senders.clone(),
            metrics: metrics[core].clone(),
            cluster: cluster.clone(),
        })
        .collect();
    if let Some(cluster) = &cluster {
        // The thread runs for the life of the process; it stops renewing on shutdown.
        drop(crate::cluster::start_keeper(
            cluster.clone(),
            meta.clone(),
            senders,
        ));
    }
    Ok(Boot {
        seeds,
        meta,
        store,
        report,
        wal_lock,
        metrics,
        cluster,
    })
}

/// Takes an exclusive `flock` on `<dir>/LOCK`, released when the process exits (even by
/// SIGKILL), so a second node on the same directory refuses to start.
fn lock_dir(dir: &std::path::Path) -> Result<std::fs::File, String> {
    use std::os::fd::AsRawFd;
    let path = dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor we own; no memory is involved.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    if !locked {
        return Err(format!(
            "{} is in use by another pico serve (lock {}); give each node its own --wal-dir",
            dir.display(),
            path.display()
        ));
    }
    Ok(file)
}

struct Recovered {
    max_epoch_ms: u64,
}

/// Turns every WAL file into a committed segment: its valid prefix (frames up to the first
/// bad CRC: a torn tail holds only unacknowledged data) is stored as an object and indexed in
/// the catalog, then the file is removed. Idempotent: a crash midway redoes the same keys.
fn recover_wal_files(
    config: &EngineConfig,
    meta: &MetaStore,
    store: &ObjectStore,
    snapshot: &mut Snapshot,
    report: &mut Vec<String>,
    fence: Option<pico_meta::NodeId>,
) -> Result<Recovered, String> {
    let mut max_epoch_ms = snapshot
        .segments
        .iter()
        .filter_map(|s| epoch_of(s.key.rsplit('/').next().unwrap_or_default()))
        .max()
        .unwrap_or(0);
    let mut files: Vec<_> = std::fs::read_dir(&config.wal_dir)
        .map_err(|e| {
            format!(
                "cannot list WAL directory {}: {e}",
                config.wal_dir.display()
            )
        })?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "wal"))
        .collect();
    files.sort();
    for path in files {
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        max_epoch_ms = max_epoch_ms.max(epoch_of(&stem).unwrap_or(0));
        let data = std::fs::read(&path)
            .map_err(|e| format!("cannot read WAL file {}: {e}", path.display()))?;
        let valid = frame::valid_prefix_len(&data);
        if valid > 0 {
            let bytes = bytes::Bytes::copy_from_slice(&data[..valid]);
            let record = index_segment(segment_key(config.node_id, &stem), &bytes);
            wait(store.put(&record.key, bytes))?;
            match fence {
                None => wait(meta.commit_segment(record.clone()))?,
                Some(node) => {
                    let fence = pico_meta::SegmentFence {
                        node,
                        epochs: HashMap::new(),
                    };
                    let fenced = wait(meta.commit_segment_fenced(record.clone(), fence))?;
                    for id in fenced {
                        // Data this node wrote before another node took the stream over: the
                        // new owner has served the stream since, so these records cannot join
                        // it. They stay in the object for an operator; say so loudly.
                        let entry = record.streams.iter().find(|e| e.stream_id == id);
                        let runs = entry.map(|e| format!("{:?}", e.runs)).unwrap_or_default();
                        log::error!(
                            "WAL file {}: stream {id} was taken over by another node while this \
                             node was down; its records {runs} in object {} were not restored",
                            path.display(),
                            record.key
                        );
                    }
                }
            }
            report.push(format!(
                "recovered WAL file {} ({valid} bytes)",
                path.display()
            ));
            snapshot.segments.retain(|s| s.key != record.key);
            snapshot.segments.push(record);
        }
        std::fs::remove_file(&path)
            .map_err(|e| format!("cannot remove WAL file {}: {e}", path.display()))?;
    }
    Ok(Recovered { max_epoch_ms })
}

/// The object key of the segment whose WAL file is `<stem>.wal`:
///
/// ```text
/// segments/<epoch ms:016>-<core:03>-<counter:010>.seg            single node
/// segments/n<node id>/<epoch ms:016>-<core:03>-<counter:010>.seg  with --node-id
/// ```
pub(crate) fn segment_key(node_id: Option<u32>, stem: &str) -> String {
    match node_id {
        Some(id) => format!("segments/n{id}/{stem}.seg"),
        None => format!("segments/{stem}.seg"),
    }
}

fn epoch_of(stem: &str) -> Option<u64> {
    stem.split('-').next()?.parse().ok()
}

fn wait<T, E: std::fmt::Display>(reply: oneshot::Receiver<Result<T, E>>) -> Result<T, String> {
    futures_lite::future::block_on(reply)
        .map_err(|_| "storage thread stopped during recovery".to_string())?
        .map_err(|e| e.to_string())
}

/// Builds a segment's catalog entry from its frames.
pub(crate) fn index_segment(key: String, bytes: &bytes::Bytes) -> SegmentRecord {
    let mut entries: std::collections::BTreeMap<u64, SegmentStreamEntry> = Default::default();
    let mut pos = 0;
    while let Ok((frame, len)) = frame::decode_frame(bytes, pos) {
        let entry = entries
            .entry(frame.stream_id)
            .or_insert_with(|| SegmentStreamEntry {
                stream_id: frame.stream_id,
                runs: Vec::new(),
                last_timestamp_ms: 0,
                closed: false,
                producers: Vec::new(),
                closed_by: None,
                writer_seq: None,
            });
        entry.last_timestamp_ms = entry.last_timestamp_ms.max(frame.timestamp_ms);
        if let Some(writer_seq) = &frame.writer_seq {
            entry.writer_seq = entry.writer_seq.clone().max(Some(writer_seq.clone()));
        }
        if let Some(producer) = &frame.producer {
            let state = ProducerState {
                id: producer.id.clone(),
                epoch: producer.epoch,
                seq: producer.seq,
            };
            match entry.producers.iter_mut().find(|p| p.id == producer.id) {
                Some(known) => *known = known.clone().max(state.clone()),
                None => entry.producers.push(state.clone()),
            }
            if frame.kind == FRAME_KIND_CLOSE {
                entry.closed_by = Some(state);
            }
        }
        if frame.kind == FRAME_KIND_CLOSE {
            entry.closed = true;
        } else {
            let (start, end) = (pos as u64, (pos + len) as u64);
            match entry.runs.last_mut() {
                Some(run) if run.byte_end == start && run.next_offset == frame.offset => {
                    run.next_offset += 1;
                    run.byte_end = end;
                }
                _ => entry.runs.push(SegmentRun {
                    first_offset: frame.offset,
                    next_offset: frame.offset + 1,
                    byte_start: start,
                    byte_end: end,
                }),
            }
        }
        pos += len;
    }
    for entry in entries.values_mut() {
        entry.producers.sort();
    }
    SegmentRecord {
        key,
        size_bytes: pos as u64,
        created_ms: now_ms(),
        streams: entries.into_values().collect(),
    }
}

/// Each fork's depth (see [`crate::state::ForkOrigin::depth`]), by id. Walks every chain in a
/// loop, remembering depths already known, so a long chain costs no stack and each stream is
/// visited about once; a source missing from the snapshot ends its chain.
fn fork_depths(snapshot: &Snapshot) -> HashMap<u64, u32> {
    let source_of: HashMap<u64, u64> = snapshot
        .streams
        .iter()
        .filter_map(|row| row.fork.as_ref().map(|f| (row.id, f.source_id)))
        .collect();
    let mut depths: HashMap<u64, u32> = HashMap::new();
    for &start in source_of.keys() {
        let mut chain = Vec::new();
        let mut at = start;
        // Ids only point at older streams, so chains end; the count bounds a damaged catalog.
        let mut base = loop {
            if let Some(&known) = depths.get(&at) {
                break known;
            }
            match source_of.get(&at) {
                Some(&source) if chain.len() <= source_of.len() => {
                    chain.push(at);
                    at = source;
                }
                _ => break 0,
            }
        };
        for id in chain.into_iter().rev() {
            base = base.saturating_add(1);
            depths.insert(id, base);
        }
    }
    depths
}

/// Rebuilds every live stream's tail, timestamps, close flag and chunk list from the catalog.
pub(crate) fn stream_seeds(snapshot: &Snapshot) -> Vec<StreamSeed> {
    let mut fork_refs: HashMap<u64, u64> = HashMap::new();
    for row in &snapshot.streams {
        if let Some(fork) = &row.fork {
            *fork_refs.entry(fork.source_id).or_default() += 1;
        }
    }
    let fork_depths = fork_depths(snapshot);
    let mut by_id: HashMap<u64, StreamSeed> = snapshot
        .streams
        .iter()
        .map(|row| {
            let seed = StreamSeed {
                name: row.name.clone(),
                id: row.id,
                config: StreamConfig {
                    content_type: row.config.content_type.clone(),
                    ttl_sec: row.config.ttl_sec,
                    expires_at_ms: row.config.expires_at_ms,
                    retention: row.config.retention,
                },
                created_ms: row.created_ms,
                closed: row.config.closed,
                next_offset: 0,
                last_timestamp_ms: 0,
                runs: Vec::new(),
                start_offset: row.start_offset,
                last_access_ms: row.last_access_ms,
                producers: Default::default(),
                closed_by: None,
                fork: row.fork.as_ref().map(|f| crate::state::ForkOrigin {
                    source: f.source.clone(),
                    source_id: f.source_id,
                    offset: f.offset,
                    partial_bytes: f.partial_bytes,
                    depth: fork_depths.get(&row.id).copied().unwrap_or(1),
                }),
                fork_refs: fork_refs.get(&row.id).copied().unwrap_or(0),
                soft_deleted: row.soft_deleted,
                writer_seq: None,
                epoch: 0,
            };
            (row.id, seed)
        })
        .collect();
    for segment in &snapshot.segments {
        let key: Arc<str> = Arc::from(segment.key.as_str());
        for entry in &segment.streams {
            let Some(seed) = by_id.get_mut(&entry.stream_id) else {
                continue;
            };
            seed.closed |= entry.closed;
            for producer in &entry.producers {
                let state = seed.producers.entry(producer.id.clone()).or_insert((0, 0));
                *state = (*state).max((producer.epoch, producer.seq));
            }
            if let Some(closer) = &entry.closed_by {
                seed.closed_by = Some(ProducerTuple {
                    id: closer.id.clone(),
                    epoch: closer.epoch,
                    seq: closer.seq,
                });
            }
            seed.last_timestamp_ms = seed.last_timestamp_ms.max(entry.last_timestamp_ms);
            // Writer sequences only grow: the largest is the last accepted.
            if entry.writer_seq > seed.writer_seq {
                seed.writer_seq = entry.writer_seq.clone();
            }
            for run in &entry.runs {
                seed.next_offset = seed.next_offset.max(run.next_offset);
                seed.runs.push((
                    key.clone(),
                    segment.size_bytes,
                    *run,
                    entry.last_timestamp_ms,
                ));
            }
        }
    }
    by_id
        .into_values()
        .map(|mut seed| {
            seed.runs.sort_by_key(|(_, _, run, _)| run.first_offset);
            // Trimmed-away segments may have been garbage-collected: the trim point still
            // holds the tail, so offsets never restart lower.
            seed.next_offset = seed.next_offset.max(seed.start_offset);
            seed
        })
        .collect()
}

/// A core's handle on the engine: runs operations on the stream's owning core.
pub struct CoreHandle {
    core: usize,
    cores: usize,
    shard: Rc<Shard>,
    peers: RefCell<Vec<mpsc::Sender<Message>>>,
    cluster: Option<Arc<Cluster>>,
}

impl CoreHandle {
    /// Starts this core's shard and its inbox. Call on the core's executor.
    pub async fn start(seed: CoreSeed) -> Result<Rc<CoreHandle>, String> {
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
        } = seed;
        let cores = peers.len();
        let shard =
            Shard::start(core, config, meta, store, streams, metrics, cluster.clone()).await?;
        let inbox_shard = shard.clone();
        // Messages from other threads wake this task: a latency-sensitive queue makes glommio
        // poll for those wakes promptly instead of after its throughput slice.
        let queue = glommio::executor().create_task_queue(
            glommio::Shares::default(),
            glommio::Latency::Matters(std::time::Duration::from_millis(1)),
            "pico-inbox",
        );
        glommio::spawn_local_into(serve_inbox(inbox_shard, inbox), queue)
            .map_err(|e| format!("cannot start core {core} inbox: {e}"))?
            .detach();
        let handle = Rc::new(CoreHandle {
            core,
            cores,
            shard,
            peers: RefCell::new(peers),
            cluster,
        });
        if core == 0 {
            let collector = handle.clone();
            glommio::spawn_local(async move { collector.gc_loop().await }).detach();
        }
        let releaser = handle.clone();
        glommio::spawn_local(async move { releaser.fork_release_loop().await }).detach();
        Ok(handle)
    }

    /// Tells sources that a fork of theirs is gone (deleted or expired on this core).
    async fn fork_release_loop(self: Rc<Self>) {
        loop {
            self.shard.fork_released.wait().await;
            for (source, source_id) in self.shard.take_fork_releases() {
                if let Err(e) = self
                    .call_owner(&source, Op::ForkRelease { source_id })
                    .await
                {
                    log::warn!("could not release a fork of {source}: {e}");
                }
            }
        }
    }

    pub fn core(&self) -> usize {
        self.core
    }

    /// Graceful shutdown of this core's engine: live reads answer now and stop waiting.
    pub fn begin_shutdown(&self) {
        self.shard.begin_shutdown();
    }

    pub fn is_stopping(&self) -> bool {
        self.shard.is_stopping()
    }

    /// Seals and uploads everything this core holds (see `Shard::flush`); `true` when done
    /// within `timeout`.
    pub async fn flush(&self, timeout: std::time::Duration) -> bool {
        self.shard.flush(timeout).await
    }

    pub fn cores(&self) -> usize {
        self.cores
    }

    /// This node's cluster membership (`None`: a single node).
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.as_ref()
    }

    /// The metadata log (the admin API reads the cluster's state from it).
    pub fn meta(&self) -> &MetaStore {
        self.shard.meta()
    }

    /// Runs `op` on the stream's owning core (here, or across a channel). Reads of a fork
    /// below its fork point are stitched from its source's records; creating a fork first
    /// resolves the fork point with the source.
    pub async fn call(&self, name: &str, op: Op) -> Result<Reply, EngineError> {
        if let Some(cluster) = &self.cluster {
            // A node that may have lost its streams serves none until it knows.
            cluster.wait_for_lease().await?;
        }
        match op {
            Op::Read(request) => self.read(name, request).await.map(Reply::Read),
            Op::Create {
                config,
                closed,
                records,
                fork: Some(Fork::Spec(spec)),
            } => {
                // Boxed: a fork's create is rare and its future the largest here; unboxed it
                // would size every request's future.
                Box::pin(self.create_fork(name, config, closed, records, spec)).await
            }
            op => self.call_owner(name, op).await,
        }
    }

    /// A read, stitched across forks: a fork read below its fork point continues in its
    /// source (bounded by the fork point), then in the fork's own records. Walks a chain of
    /// forks in a loop, one level per step, so no chain depth can exhaust the stack.
    async fn read(&self, name: &str, request: ReadRequest) -> Result<ReadBatch, EngineError> {
        // Each level down the chain: the fork read, its request and where its source ends.
        struct Level {
            name: String,
            request: ReadRequest,
            batch: ReadBatch,
            origin: crate::state::ForkOrigin,
            inherited_end: u64,
            more_allowed: bool,
        }
        let mut levels: Vec<Level> = Vec::new();
        let (mut name, mut request) = (name.to_string(), request);
        let mut batch = loop {
            let batch = self.read_owner(&name, request.clone()).await?;
            let Some(origin) = batch.inherit.clone() else {
                break batch;
            };
            // The inherited part, bounded by both the fork point and any bound of our own.
            let fork_end = (origin.offset, origin.partial_bytes);
            let own_bound = request.bound.map(|b| (b.until, b.partial_bytes));
            let (until, partial_bytes) = match own_bound {
                Some(bound) if bound < fork_end => bound,
                _ => fork_end,
            };
            // A read from the beginning starts at the source's start if it was trimmed.
            let source_from = match request.from {
                ReadFrom::AtLeast(_) => ReadFrom::AtLeast(batch.from),
                _ => ReadFrom::Offset(batch.from),
            };
            let source_request = ReadRequest {
                from: source_from,
                wait_ms: None,
                with_content_type: false,
                bound: Some(ReadBound {
                    source_id: origin.source_id,
                    until,
                    partial_bytes,
                }),
                ..request.clone()
            };
            let source = origin.source.clone();
            levels.push(Level {
                name: std::mem::replace(&mut name, source),
                request: std::mem::replace(&mut request, source_request),
                batch,
                origin,
                inherited_end: until.saturating_add(u64::from(partial_bytes > 0)),
                more_allowed: own_bound.is_none_or(|bound| bound > fork_end),
            });
        };
        // Back up the chain: each fork's answer is its source's part, then its own records.
        while let Some(level) = levels.pop() {
            let mut inherited = batch;
            let mut stitched = ReadBatch {
                from: inherited.from,
                next_offset: inherited.next_offset,
                records: std::mem::take(&mut inherited.records),
                tail: level.batch.tail,
                closed: false,
                content_type: level.batch.content_type,
                inherit: None,
            };
            let bytes: usize = stitched.records.iter().map(|r| r.body.len()).sum();
            if stitched.next_offset >= level.inherited_end
                && level.more_allowed
                && stitched.records.len() < level.request.max_records
                && bytes < level.request.max_bytes
            {
                let own_request = ReadRequest {
                    from: ReadFrom::Offset(level.origin.base()),
                    max_records: level.request.max_records - stitched.records.len(),
                    max_bytes: level.request.max_bytes - bytes,
                    wait_ms: None,
                    with_content_type: false,
                    bound: level.request.bound,
                };
                // Boxed: only forks get here, and it would size every read's future.
                let own = Box::pin(self.read_owner(&level.name, own_request)).await?;
                if own.inherit.is_some() {
                    return Err(EngineError::Storage(format!(
                        "{}: a read from its own first offset named its source again",
                        level.name
                    )));
                }
                if !own.records.is_empty() {
                    stitched.next_offset = own.next_offset;
                    stitched.records.extend(own.records);
                }
                stitched.tail = own.tail;
                stitched.closed = own.closed;
            }
            batch = stitched;
        }
        Ok(batch)
    }

    /// One read on the stream's owning core, as is (no stitching).
    async fn read_owner(&self, name: &str, request: ReadRequest) -> Result<ReadBatch, EngineError> {
        let owner = owner_core(name, self.cores);
        if owner == self.core {
            return self.shard.execute_read(name, request).await;
        }
        match self.call_core(owner, name, Op::Read(request)).await? {
            Reply::Read(batch) => Ok(batch),
            other => Err(unexpected_reply("read", &other)),
        }
    }

    /// Creates a fork: resolves the fork point with the source (which counts the reference),
    /// then creates the stream on its own core; a fork that is not created releases it.
    async fn create_fork(
        &self,
        name: &str,
        mut config: StreamConfig,
        closed: bool,
        records: Vec<RecordInput>,
        spec: ForkSpec,
    ) -> Result<Reply, EngineError> {
        let head = match self.call_owner(&spec.source, Op::Head).await {
            Err(EngineError::Gone) => return Err(EngineError::SourceGone),
            other => other?,
        };
        let source = match head {
            Reply::Head(source) => source,
            other => return Err(unexpected_reply("head", &other)),
        };
        if spec.offset_bytes > 0 {
            return Err(EngineError::Invalid(
                "Stream-Fork-Offset is not an offset this server issued".into(),
            ));
        }
        let offset = spec.offset.unwrap_or(source.next_offset);
        if offset > source.next_offset {
            return Err(EngineError::Invalid(format!(
                "fork offset is past the source's tail ({})",
                source.next_offset
            )));
        }
        let (offset, partial_bytes) = if spec.sub_offset == 0 {
            (offset, 0)
        } else if crate::state::mime_base_eq(&source.content_type, "application/json") {
            // JSON: the sub-offset counts messages, which are records.
            let at = offset.checked_add(spec.sub_offset);
            let Some(at) = at.filter(|&at| at <= source.next_offset) else {
                return Err(EngineError::Invalid(
                    "Stream-Fork-Sub-Offset is past the source's last message".into(),
                ));
            };
            (at, 0)
        } else {
            if offset >= source.next_offset {
                return Err(EngineError::Invalid(
                    "Stream-Fork-Sub-Offset needs a record after the fork offset".into(),
                ));
            }
            let record = self
                .read(
                    &spec.source,
                    ReadRequest {
                        from: ReadFrom::Offset(offset),
                        max_records: 1,
                        max_bytes: 1,
                        wait_ms: None,
                        with_content_type: false,
                        bound: None,
                    },
                )
                .await?;
            let length = record.records.first().map_or(0, |r| r.body.len() as u64);
            match spec.sub_offset.cmp(&length) {
                std::cmp::Ordering::Greater => {
                    return Err(EngineError::Invalid(
                        "Stream-Fork-Sub-Offset is past the end of the record".into(),
                    ))
                }
                std::cmp::Ordering::Equal => (offset + 1, 0),
                std::cmp::Ordering::Less => (offset, spec.sub_offset),
            }
        };
        let acquired = match self
            .call_owner(
                &spec.source,
                Op::ForkAcquire {
                    offset,
                    partial_bytes,
                },
            )
            .await?
        {
            Reply::ForkPoint { origin, config } => (origin, config),
            other => return Err(unexpected_reply("fork acquire", &other)),
        };
        let (origin, source_config) = acquired;
        let release = || Op::ForkRelease {
            source_id: origin.source_id,
        };
        if config.content_type.is_empty() {
            config.content_type = source_config.content_type.clone();
        } else if !crate::state::mime_base_eq(&config.content_type, &source_config.content_type) {
            let _ = self.call_owner(&spec.source, release()).await;
            return Err(EngineError::ConfigMismatch {
                message: format!(
                    "fork content type differs from the source's ({})",
                    source_config.content_type
                ),
                next_offset: 0,
            });
        }
        if config.ttl_sec.is_none() && config.expires_at_ms.is_none() {
            config.ttl_sec = source_config.ttl_sec;
            config.expires_at_ms = source_config.expires_at_ms;
        }
        let created = self
            .call_owner(
                name,
                Op::Create {
                    config,
                    closed,
                    records,
                    fork: Some(Fork::Resolved(origin.clone())),
                },
            )
            .await;
        if !matches!(created, Ok(Reply::Created { created: true, .. })) {
            let _ = self.call_owner(&spec.source, release()).await;
        }
        created
    }

    /// Runs `op` on the stream's owning core, as is.
    async fn call_owner(&self, name: &str, op: Op) -> Result<Reply, EngineError> {
        let owner = owner_core(name, self.cores);
        if owner == self.core {
            return self.shard.execute(name, op).await;
        }
        self.call_core(owner, name, op).await
    }

    /// `op` on another core (`owner`), answered through a one-shot.
    async fn call_core(&self, owner: usize, name: &str, op: Op) -> Result<Reply, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.send(
            owner,
            Message::Op {
                name: name.to_string(),
                op,
                reply,
            },
        )?;
        rx.await.map_err(|_| EngineError::ShuttingDown)?
    }

    /// Streams whose names start with `prefix` and sort after `start_after`, from every core,
    /// in name order; the flag says whether more exist past `limit`.
    pub async fn list(
        &self,
        prefix: &str,
        start_after: &str,
        limit: usize,
    ) -> Result<(Vec<StreamSummary>, bool), EngineError> {
        let mut all = self.shard.list(prefix, start_after, limit + 1);
        for core in (0..self.cores).filter(|&c| c != self.core) {
            let (reply, rx) = oneshot::channel();
            self.send(
                core,
                Message::List {
                    prefix: prefix.to_string(),
                    start_after: start_after.to_string(),
                    limit: limit + 1,
                    reply,
                },
            )?;
            all.extend(rx.await.map_err(|_| EngineError::ShuttingDown)?);
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        let more = all.len() > limit;
        all.truncate(limit);
        Ok((all, more))
    }

    /// Garbage collection of segment objects, run by core 0 for the node: segments that hold
    /// only deleted, expired or trimmed-away data are deleted from the object store, then from
    /// the catalog (in that order, so a crash in between leaves a row to find again, never an
    /// object nobody knows of).
    async fn gc_loop(self: Rc<Self>) {
        let interval =
            std::time::Duration::from_millis(self.shard.config().gc_interval_ms.max(100));
        loop {
            glommio::timer::sleep(interval).await;
            match self.collect_garbage().await {
                Ok(0) => {}
                Ok(count) => log::info!("garbage collection removed {count} segments"),
                Err(e) => log::warn!("garbage collection: {e}"),
            }
        }
    }

    async fn collect_garbage(&self) -> Result<usize, String> {
        // Only segments sealed before the live set is gathered are judged by it.
        let sealed_before_ms = now_ms() - 1000;
        let mut live: HashMap<u64, u64> = self.shard.live_streams().into_iter().collect();
        for core in (0..self.cores).filter(|&c| c != self.core) {
            let (reply, rx) = oneshot::channel();
            self.send(core, Message::Live { reply })
                .map_err(|e| e.to_string())?;
            live.extend(rx.await.map_err(|_| "a core stopped".to_string())?);
        }
        let (meta, store) = (self.shard.meta(), self.shard.store());
        let keys = meta
            .garbage_segments(live, sealed_before_ms)
            .await
            .map_err(|_| "metadata store stopped".to_string())?
            .map_err(|e| e.to_string())?;
        if keys.is_empty() {
            return Ok(0);
        }
        for key in &keys {
            match store.delete(key).await {
                Ok(Ok(())) | Ok(Err(pico_s3::StoreError::NotFound(_))) => {}
                Ok(Err(e)) => return Err(format!("deleting {key}: {e}")),
                Err(_) => return Err("object store stopped".into()),
            }
        }
        meta.drop_segments(keys.clone())
            .await
            .map_err(|_| "metadata store stopped".to_string())?
            .map_err(|e| e.to_string())?;
        self.shard.count_collected(keys.len());
        let keys = Arc::new(keys);
        self.shard.forget_segments(&keys);
        for core in (0..self.cores).filter(|&c| c != self.core) {
            let _ = self.send(core, Message::Forget { keys: keys.clone() });
        }
        Ok(keys.len())
    }

    fn send(&self, core: usize, message: Message) -> Result<(), EngineError> {
        let mut peers = self.peers.borrow_mut();
        peers[core].try_send(message).map_err(|e| {
            if e.is_full() {
                EngineError::Overloaded {
                    limit: "cross-core queue",
                    retry_after_sec: limits::OVERLOADED_RETRY_AFTER_SEC,
                }
            } else {
                EngineError::ShuttingDown
            }
        })
    }
}

/// A reply of another kind than the operation's: a bug, answered as an internal error rather
/// than a panic that would take the core down.
pub fn unexpected_reply(op: &str, reply: &Reply) -> EngineError {
    log::error!("engine: a {op} was answered with {reply:?}");
    EngineError::Storage(format!("internal error: a {op} got an unexpected reply"))
}

async fn serve_inbox(shard: Rc<Shard>, mut inbox: mpsc::Receiver<Message>) {
    while let Some(message) = inbox.next().await {
        match message {
            Message::Op {
                name,
                op,
                mut reply,
            } => {
                let shard = shard.clone();
                // A read whose requester went away (a long-poll's client left) is dropped
                // with its waiter; any other operation runs to its end.
                let cancellable = matches!(op, Op::Read(_) | Op::Head);
                glommio::spawn_local(async move {
                    let run = async { Some(shard.execute(&name, op).await) };
                    let result = if cancellable {
                        let gone = async {
                            reply.cancellation().await;
                            None
                        };
                        futures_lite::future::or(run, gone).await
                    } else {
                        run.await
                    };
                    if let Some(result) = result {
                        let _ = reply.send(result);
                    }
                })
                .detach();
            }
            Message::List {
                prefix,
                start_after,
                limit,
                reply,
            } => {
                let _ = reply.send(shard.list(&prefix, &start_after, limit));
            }
            Message::Live { reply } => {
                let _ = reply.send(shard.live_streams());
            }
            Message::Forget { keys } => shard.forget_segments(&keys),
            Message::HandOff { transfer, reply } => {
                let shard = shard.clone();
                glommio::spawn_local(async move {
                    shard.hand_off(transfer).await;
                    let _ = reply.send(());
                })
                .detach();
            }
            Message::Revalidate { owned, reply } => {
                shard.revalidate(&owned);
                let _ = reply.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_is_stable() {
        // Persisted behaviour: changing the hash moves streams between cores.
        assert_eq!(stream_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stream_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(owner_core("/streams/orders", 1), 0);
    }

    #[test]
    fn index_rebuilds_runs_and_close() {
        let mut buf = Vec::new();
        let closer = ProducerTuple {
            id: "p".into(),
            epoch: 2,
            seq: 7,
        };
        let frame = |kind, stream_id, offset, timestamp_ms, producer| frame::FrameMeta {
            kind,
            stream_id,
            offset,
            timestamp_ms,
            request_end: true,
            producer,
            writer_seq: None,
        };
        let record = frame::FRAME_KIND_RECORD;
        frame::encode_frame(&mut buf, frame(record, 1, 0, 10, None), &[], b"a");
        frame::encode_frame(&mut buf, frame(record, 1, 1, 11, None), &[], b"b");
        frame::encode_frame(&mut buf, frame(record, 2, 0, 12, None), &[], b"c");
        frame::encode_frame(&mut buf, frame(record, 1, 2, 13, None), &[], b"d");
        frame::encode_frame(
            &mut buf,
            frame(FRAME_KIND_CLOSE, 1, 3, 13, Some(&closer)),
            &[],
            b"",
        );
        let bytes = bytes::Bytes::from(buf);
        let record = index_segment("segments/x.seg".into(), &bytes);
        assert_eq!(record.streams.len(), 2);
        let one = &record.streams[0];
        assert_eq!(one.runs.len(), 2);
        assert_eq!((one.runs[0].first_offset, one.runs[0].next_offset), (0, 2));
        assert_eq!((one.runs[1].first_offset, one.runs[1].next_offset), (2, 3));
        assert!(one.closed);
        assert_eq!(one.last_timestamp_ms, 13);
        assert_eq!(
            one.producers,
            vec![ProducerState {
                id: "p".into(),
                epoch: 2,
                seq: 7
            }]
        );
        assert_eq!(one.closed_by.as_ref().map(|p| p.seq), Some(7));
        assert!(!record.streams[1].closed);
    }
}
