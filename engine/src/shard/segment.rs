//! Building and sealing segments: opening the next active segment, rotating when it is full,
//! sealing the oldest finished one into its catalog record, and flushes that wait until every
//! segment is stored.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use pico_meta::{ProducerState, SegmentFence, SegmentRecord, SegmentStreamEntry};

use super::journal::WalFile;
use super::state::Shard;
use super::stream::{coarsen, coarsen_runs, IndexEntry};
use super::table::{SegmentData, SegmentSlot};
use super::upload::Sealed;

impl Shard {
    pub(super) fn open_segment(&self, wal: Option<WalFile>) {
        let counter = match &wal {
            Some((_, _, counter)) => *counter,
            None => self.journal.next_counter(),
        };
        let (_, key) = self.wal_path(counter);
        let no = self.segments.add(SegmentSlot {
            key: Rc::from(key.as_str()),
            data: SegmentData::Open,
            uploaded: false,
            size: 0,
        });
        let wal = wal.map(|(file, path, _)| (file, path));
        self.journal.open(no, key, wal, self.clock.now());
    }

    /// Starts a new active segment when `needed` more bytes would overflow the current one
    /// (or its WAL file, which holds its commit records too).
    pub(super) fn maybe_rotate(&self, needed: usize) {
        if self
            .journal
            .active_would_overflow(needed, self.config.segment_size)
        {
            self.rotate();
        }
    }

    pub(super) fn rotate(&self) {
        if !self.wal_enabled() {
            self.open_segment(None);
            // The commit loop seals the segment just left behind.
            self.journal.wake_commit();
            return;
        }
        // Without a spare WAL file the segment grows into its slack until one is ready.
        let spare = self.journal.take_spare();
        if let Some(spare) = spare {
            self.open_segment(Some(spare));
        }
        self.journal.wake_commit();
    }

    /// Moves the oldest open segment (fully durable, no longer active) to the upload path.
    pub(super) fn seal_front(self: &Rc<Self>, no: u64) {
        let segment = self.journal.take_front(no);
        self.coarsen_sealed(no, &segment.index);
        let bytes = segment.bytes;
        if !self.segments.sealed(no, &bytes) {
            self.spawn_retire_wal(segment.wal, segment.wal_path);
            return;
        }
        let fence = self.cluster.as_ref().map(|cluster| SegmentFence {
            node: cluster.node_id(),
            node_epoch: cluster.node_epoch(),
            // Local durability acknowledged these records already: refused, they are kept.
            quarantine_refused: self.config.durability != crate::config::Durability::Object,
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
            created_ms: self.clock.now_ms(),
            streams: segment
                .index
                .into_iter()
                .map(|(stream_id, mut entry)| SegmentStreamEntry {
                    stream_id,
                    runs: {
                        coarsen_runs(&mut entry.runs);
                        entry.runs
                    },
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
        self.note_sealed(no, record.streams.iter().map(|e| e.stream_id));
        self.segments.queue_upload(no, bytes.len());
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
    pub(super) fn coarsen_sealed(&self, no: u64, index: &BTreeMap<u64, IndexEntry>) {
        for (id, entry) in index {
            let Some(name) = &entry.name else { continue };
            if let Some(mut stream) = self.streams.get_mut(name) {
                if stream.state.id == *id {
                    coarsen(&mut stream.chunks, Some(no));
                }
            }
        }
    }

    /// Seals what the active segment holds and waits (up to `timeout`) until every segment is
    /// in the object store and its WAL file gone: a clean stop leaves nothing to recover.
    /// `false` if time ran out (the WAL still has it: nothing is lost either way).
    pub(crate) async fn flush(self: &Rc<Self>, timeout: Duration) -> bool {
        let deadline = self.clock.now() + timeout;
        if self.journal.active_has_frames() {
            self.rotate();
        }
        loop {
            let settled = self.journal.settled()
                && self.segments.unuploaded_bytes() == 0
                && self.retiring.get() == 0;
            if settled || self.journal.failed() {
                return settled;
            }
            if self.clock.now() >= deadline {
                return false;
            }
            // A rotation may have waited for a spare WAL file; ask again.
            if self.journal.active_has_frames() {
                self.rotate();
            }
            self.journal.wake_commit();
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A backup's checkpoint: every record this core acknowledged before the call (the WAL
    /// alone may hold it, with `--durability local`) is in the bucket and the catalog once
    /// this answers `true`. Appends go on meanwhile; `false` if `timeout` ran out or the WAL
    /// failed.
    pub(crate) async fn checkpoint(self: &Rc<Self>, timeout: Duration) -> bool {
        self.flush_through_active(timeout).await
    }

    /// Seals the active segment and waits until it and every older one are stored and
    /// committed (unlike `flush`, appends to other streams may go on meanwhile).
    pub(super) async fn flush_through_active(self: &Rc<Self>, timeout: Duration) -> bool {
        self.flush_through(self.journal.active_no(), timeout).await
    }

    /// Waits until segment `target` and every older one are stored and committed (or their
    /// entries refused), sealing the active segment when it is one of them; `false` if
    /// `timeout` ran out or the WAL failed.
    pub(super) async fn flush_through(self: &Rc<Self>, target: u64, timeout: Duration) -> bool {
        let deadline = self.clock.now() + timeout;
        loop {
            if self.journal.active_holds_frames_through(target) {
                self.rotate();
            }
            let settled =
                self.journal.empty_through(target) && self.segments.uploaded_through(target);
            if settled {
                return true;
            }
            if self.clock.now() >= deadline || self.journal.failed() {
                return false;
            }
            self.journal.wake_commit();
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
    }
}
