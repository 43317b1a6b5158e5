//! Recovered WAL files the bucket did not take at start. The node serves them anyway: their
//! records are acknowledged, and reads must keep working while writes cannot. Each file's
//! segment stays in memory (the cores read it from there) and its WAL file stays on disk (a
//! crash meanwhile recovers it again), while one thread stores and commits them in file
//! order, retrying as a running core retries its uploads. Until the last one is in the
//! catalog no core commits a segment of its own: the catalog learns every stream's records
//! in offset order, as recovery found them (`Shard::upload` waits on
//! [`RecoveryBacklog::is_drained`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pico_meta::{MetaStore, NodeId, SegmentRecord};
use pico_s3::{ObjectStore, StoreError};

use super::{commit, wait, StorageError};
use crate::limits;
use pico_meta::LogLimit;

/// One recovered WAL file whose segment is not yet in the bucket and the catalog.
pub(crate) struct DeferredSegment {
    pub(crate) path: PathBuf,
    pub(crate) record: SegmentRecord,
    pub(crate) bytes: Bytes,
    /// The owner epochs the file's frames were written at (cluster fencing).
    pub(crate) epochs: HashMap<u64, u64>,
}

/// The recovered segments not yet stored, shared by the cores (which read them from memory
/// and hold back their own commits) and the thread that stores them.
#[derive(Default)]
pub struct RecoveryBacklog {
    /// Each unstored segment's bytes by key; an entry leaves once it is committed.
    held: Mutex<HashMap<String, Bytes>>,
    /// How many entries `held` has: read on every core's commit path without the lock.
    unstored: AtomicUsize,
}

impl std::fmt::Debug for RecoveryBacklog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecoveryBacklog")
            .field("unstored", &self.unstored_segments())
            .finish()
    }
}

impl RecoveryBacklog {
    fn holding(segments: &[DeferredSegment]) -> RecoveryBacklog {
        let held: HashMap<String, Bytes> = segments
            .iter()
            .map(|s| (s.record.key.clone(), s.bytes.clone()))
            .collect();
        RecoveryBacklog {
            unstored: AtomicUsize::new(held.len()),
            held: Mutex::new(held),
        }
    }

    /// How many recovered segments are not yet in the bucket and the catalog.
    pub fn unstored_segments(&self) -> usize {
        self.unstored.load(Ordering::Acquire)
    }

    /// Every recovered segment is in the bucket and the catalog.
    pub(crate) fn is_drained(&self) -> bool {
        self.unstored_segments() == 0
    }

    /// The bytes of recovered segment `key` while it is not yet stored.
    pub(crate) fn held(&self, key: &str) -> Option<Bytes> {
        if self.is_drained() {
            return None;
        }
        self.held.lock().ok()?.get(key).cloned()
    }

    /// Whether recovered segment `key` is no longer waiting to be stored.
    pub(crate) fn is_stored(&self, key: &str) -> bool {
        self.is_drained() || self.held.lock().is_ok_and(|held| !held.contains_key(key))
    }

    fn stored(&self, key: &str) {
        if let Ok(mut held) = self.held.lock() {
            if held.remove(key).is_some() {
                self.unstored.store(held.len(), Ordering::Release);
            }
        }
    }
}

/// Starts the thread that stores and commits `segments` in their order, then removes each
/// one's WAL file. Returns the backlog the cores share (empty, and no thread, when there is
/// nothing to store).
pub(crate) fn store_in_background(
    segments: Vec<DeferredSegment>,
    meta: &MetaStore,
    store: &ObjectStore,
    fence: Option<(NodeId, u64)>,
) -> Arc<RecoveryBacklog> {
    let backlog = Arc::new(RecoveryBacklog::holding(&segments));
    if segments.is_empty() {
        return backlog;
    }
    let (meta, store, shared) = (meta.clone(), store.clone(), backlog.clone());
    let spawned = std::thread::Builder::new()
        .name("pico-recovery".into())
        .spawn(move || {
            for segment in segments {
                if !store_one(&segment, &meta, &store, fence) {
                    return;
                }
                shared.stored(&segment.record.key);
            }
            log::info!("every recovered WAL file is stored in the bucket and the catalog");
        });
    if let Err(e) = spawned {
        // The cores then hold their commits until the next start: nothing is lost, as the
        // WAL files stay, but nothing new reaches the bucket either.
        log::error!("cannot start the thread that stores recovered WAL files: {e}");
    }
    backlog
}

/// Stores and commits one segment, then removes its WAL file, retrying with capped backoff;
/// `false` once the object store or the catalog is shut down (the node is stopping: the WAL
/// file stays for the next start).
fn store_one(
    segment: &DeferredSegment,
    meta: &MetaStore,
    store: &ObjectStore,
    fence: Option<(NodeId, u64)>,
) -> bool {
    let key = &segment.record.key;
    let mut backoff_ms = limits::UPLOAD_RETRY_FIRST_MS;
    let mut stored = false;
    let failure_log = LogLimit::new(limits::UPLOAD_FAILURE_LOG_INTERVAL_MS);
    loop {
        let result = (|| {
            if !stored {
                wait(store.put(key, segment.bytes.clone()))?;
                stored = true;
            }
            commit(meta, &segment.record, fence, &segment.epochs, &segment.path)
        })();
        match result {
            Ok(()) => break,
            Err(StorageError::Stopped | StorageError::Store(StoreError::Closed)) => return false,
            Err(StorageError::Meta(pico_meta::MetaError::Closed)) => return false,
            Err(e) => {
                if let Some(unlogged) = failure_log.due(Instant::now()) {
                    log::warn!(
                        "storing recovered WAL file {} as {key} failed, retrying ({unlogged} \
                         more failures since the last line); until it is stored, the node \
                         serves its records from memory and holds back its own uploads: {e}",
                        segment.path.display()
                    );
                }
                std::thread::sleep(Duration::from_millis(backoff_ms));
                backoff_ms = (backoff_ms * 2).min(limits::UPLOAD_RETRY_MAX_MS);
            }
        }
    }
    let removed =
        crate::wal_ledger::unlist(&segment.path).and_then(|()| std::fs::remove_file(&segment.path));
    if let Err(e) = removed {
        // Stored and committed: the next start finds the segment in the catalog and only
        // removes the file.
        log::warn!(
            "recovered WAL file {} is stored as {key}, but cannot be removed: {e}",
            segment.path.display()
        );
    }
    log::info!(
        "stored recovered WAL file {} as {key} ({} bytes)",
        segment.path.display(),
        segment.bytes.len()
    );
    true
}
