//! What the engine's integration tests share: an engine booted in process on a SQLite catalog
//! and a `file://` bucket in a temporary directory, one executor thread per core, and the
//! requests the tests send it.

// Each test file uses its own part of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;
use pico_engine::metrics::NodeMetrics;
use pico_engine::{
    boot, AppendRequest, CoreHandle, CreateRequest, EngineConfig, ReadFrom, ReadRequest,
    RecordInput, RecordView, StreamConfig,
};
use pico_s3::ObjectStore;

/// A local-durability engine of `cores` cores in `dir`: 64 KiB segments sealed by size (the
/// age limit is a minute), a 1 MiB segment cache, garbage collection once a minute.
pub fn config(dir: &Path, cores: usize) -> EngineConfig {
    EngineConfig {
        cores,
        wal_dir: dir.join("wal"),
        durability: pico_engine::Durability::Local,
        segment_size: 64 * 1024,
        segment_max_age_ms: 60_000,
        segment_cache_bytes: 1 << 20,
        node_epoch_ms: pico_engine::now_ms() as u64,
        node_id: None,
        catalog_id: None,
        in_flight_bytes_max: pico_engine::limits::IN_FLIGHT_BYTES_PER_CORE_DEFAULT,
        unuploaded_bytes_max: pico_engine::limits::UNUPLOADED_BYTES_PER_CORE_DEFAULT,
        gc_interval_ms: 60_000,
        object_puts_per_second: pico_engine::limits::OBJECT_PUTS_PER_SECOND_DEFAULT,
        wal_salvage: false,
        producers: Default::default(),
    }
}

/// The node's shared handles, for a test body that looks past core 0's handle.
pub struct Node {
    pub store: ObjectStore,
    pub metrics: NodeMetrics,
}

/// [`run_node`] without the node's handles; the boot's report lines.
pub fn run<F, Fut>(config: EngineConfig, dir: &Path, f: F) -> Vec<String>
where
    F: FnOnce(Rc<CoreHandle>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    run_node(config, dir, |_| {}, move |core, _| f(core)).1
}

/// [`run_node`] for a test body that answers with what it found: what `f` returned.
pub fn run_returning<T, F, Fut>(config: EngineConfig, dir: &Path, f: F) -> T
where
    T: Send + 'static,
    F: FnOnce(Rc<CoreHandle>, Node) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
{
    run_node(config, dir, |_| {}, f).0
}

/// Boots `config` in `dir` (recovering what an earlier run left) and starts every core on its
/// own executor thread; `before` sees the object store once recovery is done and before the
/// cores start, `f` runs on core 0 while the other cores serve their streams through their
/// inboxes. Then every core stops without flushing (what is on disk is what a crash would
/// leave) and the metadata log shuts down. Returns what `f` returned and the boot's report
/// lines.
pub fn run_node<T, B, F, Fut>(config: EngineConfig, dir: &Path, before: B, f: F) -> (T, Vec<String>)
where
    T: Send + 'static,
    B: FnOnce(&ObjectStore),
    F: FnOnce(Rc<CoreHandle>, Node) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
{
    let meta = format!("sqlite:{}", dir.join("meta.db").display());
    let storage = format!("-2@file://{}", dir.join("objects").display());
    let booted = boot(config, &meta, &storage, None).expect("boot");
    before(&booted.store);
    let node = Node {
        store: booted.store.clone(),
        metrics: booted.metrics.clone(),
    };
    let mut seeds = booted.seeds.into_iter();
    let first = seeds.next().expect("core 0");
    let mut stops = Vec::new();
    let mut others = Vec::new();
    for seed in seeds {
        let (stop, stopped) = futures_channel::oneshot::channel::<()>();
        stops.push(stop);
        let executor = executor()
            .spawn(move || async move {
                let _core = CoreHandle::start(seed).await.expect("core starts");
                // Serves the other cores' requests until core 0 is done.
                let _ = stopped.await;
            })
            .expect("executor");
        others.push(executor);
    }
    let out = executor()
        .spawn(move || async move {
            let core = CoreHandle::start(first).await.expect("core starts");
            f(core, node).await
        })
        .expect("executor")
        .join()
        .expect("join");
    drop(stops);
    for executor in others {
        executor.join().expect("join");
    }
    booted.meta.shutdown();
    (out, booted.report)
}

/// An executor for one core of a test engine.
pub fn executor() -> glommio::LocalExecutorBuilder {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound).io_memory(1 << 20)
}

/// An open, empty stream of `content_type` that never expires.
pub fn create_request(content_type: &str) -> CreateRequest {
    CreateRequest {
        config: StreamConfig {
            content_type: content_type.into(),
            ttl_sec: None,
            expires_at_ms: None,
            retention: Default::default(),
        },
        closed: false,
        records: Vec::new(),
        fork: None,
    }
}

pub fn record(body: impl Into<Bytes>) -> RecordInput {
    RecordInput {
        headers: Vec::new(),
        body: body.into(),
    }
}

/// `records` appended, closing the stream after them with `close`.
pub fn append_request(records: Vec<RecordInput>, close: bool) -> AppendRequest {
    AppendRequest {
        records,
        close,
        match_offset: None,
        producer: None,
        content_type: None,
        writer_seq: None,
        json_checked: false,
    }
}

/// A catch-up read of up to `max_records` records and `max_bytes` from `from`.
pub fn page_request(from: u64, max_records: usize, max_bytes: usize) -> ReadRequest {
    ReadRequest {
        from: ReadFrom::Offset(from),
        max_records,
        max_bytes,
        wait_ms: None,
        with_content_type: false,
        bound: None,
    }
}

/// Every record of `name` from offset 0, read in pages of at most `page_bytes`.
pub async fn read_all(core: &CoreHandle, name: &str, page_bytes: usize) -> Vec<RecordView> {
    let mut out = Vec::new();
    let mut from = 0;
    loop {
        let request = page_request(from, 1000, page_bytes);
        let batch = core.read(name, &request).await.expect("read");
        out.extend(batch.records.iter().cloned());
        if batch.records.is_empty() || batch.up_to_date() {
            return out;
        }
        from = batch.next_offset;
    }
}

/// Every record of `name` from offset 0 as `(offset, body)`, in pages of at most
/// `page_bytes`.
pub async fn read_bodies(core: &CoreHandle, name: &str, page_bytes: usize) -> Vec<(u64, Bytes)> {
    let records = read_all(core, name, page_bytes).await;
    records.into_iter().map(|r| (r.offset, r.body)).collect()
}

/// The WAL files (`*.wal`) of an engine run in `dir`, in name order.
pub fn wal_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    files.sort();
    files
}

/// The directory of a single node's segment objects in the `file://` bucket of `dir`:
/// `objects/segments/c<catalog id>/` (`placement::segment_key`); a path that does not exist
/// while no segment is stored.
pub fn segments_dir(dir: &Path) -> PathBuf {
    let root = dir.join("objects/segments");
    std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .find(|path| {
            path.is_dir()
                && path
                    .file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with('c'))
        })
        .unwrap_or_else(|| root.join("c-none-stored-yet"))
}
