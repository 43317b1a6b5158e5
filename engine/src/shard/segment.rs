//! Building and sealing segments: opening the next active segment, rotating when it is full,
//! sealing the oldest finished one into its catalog record, and flushes that wait until every
//! segment is stored.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use pico_meta::{ProducerState, SegmentFence, SegmentRecord, SegmentStreamEntry};

use super::state::{OpenSegment, SegmentData, SegmentSlot, Shard, WalFile};
use super::stream::{coarsen, coarsen_runs, IndexEntry};
use super::upload::Sealed;
use super::wal::remove_wal;

/// Makes room in a segment buffer for `needed` more bytes: doubling, to amortize the copies,
/// but never past `full` (a full segment plus its slack) unless one frame needs it.
pub(super) fn reserve_frames(buf: &mut Vec<u8>, needed: usize, full: usize) {
    let want = buf.len().saturating_add(needed);
    if want <= buf.capacity() {
        return;
    }
    let target = want.max(buf.capacity().saturating_mul(2).min(full));
    buf.reserve_exact(target - buf.len());
}

impl Shard {
    pub(super) fn open_segment(&self, wal: Option<WalFile>) {
        let counter = match &wal {
            Some((_, _, counter)) => *counter,
            None => self.wal.borrow_mut().next_counter(),
        };
        let (_, key) = self.wal_path(counter);
        let no = self.next_segment_no.get();
        self.next_segment_no.set(no + 1);
        let (file, path) = match wal {
            Some((file, path, _)) => (Some(file), Some(path)),
            None => (None, None),
        };
        self.segments.borrow_mut().insert(
            no,
            SegmentSlot {
                key: Rc::from(key.as_str()),
                data: SegmentData::Open,
                uploaded: false,
                size: 0,
            },
        );
        self.log.borrow_mut().push_back(OpenSegment {
            no,
            key,
            buf: self.buffers.take(),
            durable_len: 0,
            wal: file,
            wal_path: path,
            wal_rounds: 0,
            wal_epochs: Vec::new(),
            opened: self.clock.now(),
            index: BTreeMap::new(),
        });
    }

    /// Starts a new active segment when `needed` more bytes would overflow the current one
    /// (or its WAL file, which holds its commit records too).
    pub(super) fn maybe_rotate(&self, needed: usize) {
        let (len, file_len) = self
            .log
            .borrow()
            .back()
            .map_or((0, 0), |s| (s.buf.len(), s.wal_len_after(needed)));
        let full = len > 0 && (len + needed).max(file_len) > self.config.segment_size;
        if full {
            self.rotate();
        }
    }

    pub(super) fn rotate(&self) {
        if !self.wal_enabled() {
            self.open_segment(None);
            // The commit loop seals the segment just left behind.
            self.commit_wanted.notify();
            return;
        }
        // Without a spare WAL file the segment grows into its slack until one is ready.
        let spare = self.wal.borrow_mut().spare.take();
        if let Some(spare) = spare {
            self.open_segment(Some(spare));
        }
        self.commit_wanted.notify();
    }

    /// Moves the oldest open segment (fully durable, no longer active) to the upload path.
    pub(super) fn seal_front(self: &Rc<Self>, no: u64) {
        let segment = {
            let mut log = self.log.borrow_mut();
            debug_assert_eq!(log.front().map(|s| s.no), Some(no));
            log.pop_front().expect("sealing the front segment")
        };
        self.coarsen_sealed(no, &segment.index);
        let bytes = self.buffers.seal(segment.buf);
        if let Some(slot) = self.segments.borrow_mut().get_mut(&no) {
            slot.data = SegmentData::Memory(bytes.clone());
            slot.size = bytes.len() as u64;
        }
        if bytes.is_empty() {
            self.segments.borrow_mut().remove(&no);
            let (file, path) = (segment.wal, segment.wal_path);
            glommio::spawn_local(async move { remove_wal(file, path).await }).detach();
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
        self.sealed.borrow_mut().sealed(no, bytes.len());
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
        let mut streams = self.streams.borrow_mut();
        for (id, entry) in index {
            let Some(name) = &entry.name else { continue };
            if let Some(stream) = streams.get_mut(&**name) {
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
        let has_data = self.log.borrow().back().is_some_and(|s| !s.buf.is_empty());
        if has_data {
            self.rotate();
        }
        loop {
            let settled = {
                let log = self.log.borrow();
                log.len() == 1
                    && log.back().is_some_and(|s| s.buf.is_empty())
                    && self.acks.borrow().is_empty()
                    && self.sealed.borrow().unuploaded_bytes() == 0
            };
            if settled || self.wal_failed() {
                return settled;
            }
            if self.clock.now() >= deadline {
                return false;
            }
            // A rotation may have waited for a spare WAL file; ask again.
            if self.log.borrow().back().is_some_and(|s| !s.buf.is_empty()) {
                self.rotate();
            }
            self.commit_wanted.notify();
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
        let deadline = self.clock.now() + timeout;
        let target = self.log.borrow().back().map_or(0, |s| s.no);
        loop {
            let active_has_it = self
                .log
                .borrow()
                .back()
                .is_some_and(|s| s.no <= target && !s.buf.is_empty());
            if active_has_it {
                self.rotate();
            }
            let settled = self
                .log
                .borrow()
                .iter()
                .all(|s| s.no > target || s.buf.is_empty())
                && self
                    .segments
                    .borrow()
                    .iter()
                    .filter(|(no, slot)| **no <= target && !matches!(slot.data, SegmentData::Open))
                    .all(|(_, slot)| slot.uploaded);
            if settled {
                return true;
            }
            if self.clock.now() >= deadline || self.wal_failed() {
                return false;
            }
            self.commit_wanted.notify();
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::reserve_frames;

    #[test]
    fn a_segment_buffer_doubles_up_to_its_full_size_and_no_further() {
        let full = 1000;
        let mut buf = Vec::with_capacity(100);
        buf.resize(90, 0);
        reserve_frames(&mut buf, 20, full);
        assert_eq!(buf.capacity(), 200, "doubled");
        buf.resize(600, 0);
        reserve_frames(&mut buf, 500, full);
        assert_eq!(
            buf.capacity(),
            1100,
            "one frame past the full size gets its room"
        );
        let mut near_full = Vec::with_capacity(800);
        near_full.resize(790, 0);
        reserve_frames(&mut near_full, 20, full);
        assert_eq!(
            near_full.capacity(),
            1000,
            "doubling stops at the full size"
        );
        reserve_frames(&mut near_full, 5, full);
        assert_eq!(near_full.capacity(), 1000, "room left: nothing to do");
    }
}
