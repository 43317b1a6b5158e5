//! A sealed segment's way out: PUT to the object store, catalog commit in seal order, WAL
//! file removed, bytes kept in the read cache.

use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use glommio::io::DmaFile;
use pico_meta::{SegmentFence, SegmentRecord};

use crate::config::Durability;
use crate::limits;
use crate::metrics::CoreMetrics;

use super::state::Shard;

/// A sealed segment on its way to the bucket and the catalog.
pub(super) struct Sealed {
    pub(super) no: u64,
    pub(super) bytes: Bytes,
    pub(super) record: SegmentRecord,
    /// Cluster: the owner epochs the segment's streams were written at.
    pub(super) fence: Option<SegmentFence>,
    pub(super) names: HashMap<u64, Rc<str>>,
}

impl Shard {
    /// Stores a sealed segment, commits its index, then frees its WAL file. Retries with
    /// capped exponential backoff: the WAL keeps the data safe meanwhile.
    ///
    /// PUTs run side by side, but catalog commits go in seal order: a segment's entries
    /// commit only once every segment sealed before it on this core has committed. Otherwise
    /// a slow PUT (a retry) lets a later segment's records into the catalog before earlier
    /// offsets of the same stream, and if the node dies or is fenced meanwhile, the stream's
    /// offsets have a hole that no one can fill (the fault test's cluster profile checks it;
    /// docs/decisions/2026-12-cluster-profile-findings.md).
    pub(super) async fn upload(
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
        let mut backoff_ms = limits::UPLOAD_RETRY_FIRST_MS;
        let mut fenced = Vec::new();
        let mut stored = false;
        CoreMetrics::add(&self.metrics.segment_seals, 1);
        let started = self.clock.now();
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
                    let put_started = self.clock.now();
                    put.await
                        .map_err(|_| "object store is shut down".to_string())?
                        .map_err(|e| e.to_string())?;
                    self.metrics
                        .object_put_latency
                        .observe(self.clock.now().saturating_duration_since(put_started));
                    stored = true;
                }
                self.recovered_first().await;
                self.commit_turn(no).await;
                let commit_started = self.clock.now();
                let committed = match &fence {
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
                };
                if committed.is_ok() {
                    self.metrics
                        .meta_commit_latency
                        .observe(self.clock.now().saturating_duration_since(commit_started));
                }
                committed
            }
            .await;
            match result {
                Ok(()) => break,
                Err(message) => {
                    CoreMetrics::add(&self.metrics.upload_failures, 1);
                    // Every pending segment retries on its own: hundreds of them while the
                    // bucket is full or away, so one line per interval, with the count.
                    if let Some(unlogged) = self.upload_failure_log.due(self.clock.now()) {
                        let more = if unlogged > 0 {
                            format!(" ({unlogged} more failed uploads since the last line)")
                        } else {
                            String::new()
                        };
                        log::warn!(
                            "core {}: upload of {} failed, retrying: {message}{more}",
                            self.core,
                            record.key
                        );
                    }
                    glommio::timer::sleep(Duration::from_millis(backoff_ms)).await;
                    backoff_ms = (backoff_ms * 2).min(limits::UPLOAD_RETRY_MAX_MS);
                }
            }
        }
        self.end_commit_turn(no);
        // Fence every refused entry before anything can release acknowledgements (the
        // `forget_stream` of the first one does): a later id of the same segment would
        // otherwise be acknowledged as stored once the segment counts as uploaded: a producer
        // told stored, then refused with a sequence gap by the next owner (the fault test's
        // cluster profile checks it).
        let lost: Vec<(u64, u64)> = fenced
            .iter()
            .map(|id| {
                let epoch = fence.as_ref().and_then(|f| f.epochs.get(id).copied());
                (*id, epoch.unwrap_or_default())
            })
            .collect();
        for &(id, epoch) in &lost {
            self.journal.fence_acks(id, epoch);
        }
        for &(id, epoch) in &lost {
            self.lost_at_commit(id, epoch, names.get(&id), &record);
        }
        CoreMetrics::add(&self.metrics.uploads, 1);
        CoreMetrics::add(&self.metrics.meta_commits, 1);
        self.metrics
            .upload_latency
            .observe(self.clock.now().saturating_duration_since(started));
        self.segments.stored(bytes.len());
        // The file goes beside what follows: the segment's bytes are released (and its
        // buffer reused) without waiting for the ledger's write.
        self.spawn_retire_wal(file, path);
        self.segments.mark_uploaded(no);
        if self.config.durability == Durability::Object {
            self.release_acks();
            self.flush_when_free();
            self.compact_after_upload();
        }
        self.segments.keep_or_release(
            no,
            bytes.len(),
            self.clock.now(),
            self.config.segment_cache_bytes,
        );
    }

    /// Waits until every recovered WAL file the bucket did not take at start is stored: the
    /// catalog learns each stream's records in offset order (`recovery/deferred.rs`).
    async fn recovered_first(&self) {
        while !self.recovery.is_drained() {
            glommio::timer::sleep(Duration::from_millis(limits::RECOVERY_BACKLOG_POLL_MS)).await;
        }
    }

    /// Marks this core's slots of recovered segments stored as the recovery thread stores
    /// them, so they are read (and cached) like any other stored segment from then on.
    pub(super) async fn recovered_stored_loop(self: Rc<Self>) {
        loop {
            let stored: Vec<(u64, Rc<str>)> = {
                let mut unstored = self.recovered_unstored.borrow_mut();
                let (stored, left) = std::mem::take(&mut *unstored)
                    .into_iter()
                    .partition(|(_, key)| self.recovery.is_stored(key));
                *unstored = left;
                stored
            };
            for (no, _) in stored {
                let size = self
                    .segments
                    .slots()
                    .get(&no)
                    .map_or(0, |slot| slot.size as usize);
                self.segments.mark_uploaded(no);
                self.segments.keep_or_release(
                    no,
                    size,
                    self.clock.now(),
                    self.config.segment_cache_bytes,
                );
            }
            if self.recovered_unstored.borrow().is_empty() || self.is_stopping() {
                return;
            }
            glommio::timer::sleep(Duration::from_millis(limits::RECOVERY_BACKLOG_POLL_MS)).await;
        }
    }

    /// Waits until segment `no` is the oldest sealed segment not yet in the catalog.
    pub(super) async fn commit_turn(&self, no: u64) {
        loop {
            let wait = self.segments.commit_turn(no);
            let Some(rx) = wait else {
                return;
            };
            // A dropped sender (the core stopping) just rechecks.
            let _ = rx.await;
        }
    }

    /// Segment `no` is in the catalog: the next one may commit.
    pub(super) fn end_commit_turn(&self, no: u64) {
        let waiters = self.segments.end_commit_turn(no);
        for waiter in waiters {
            let _ = waiter.send(());
        }
    }
}
