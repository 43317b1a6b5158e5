//! The segment table: every segment a core's chunks point into (open, sealed in memory, or
//! only in the object store), the read cache over the uploaded ones and the seal queue of
//! those on their way out, owned in one place. Callers add a segment (it gets the next
//! number), record its seal, upload and collection, locate a chunk's bytes and go through the
//! read cache; the fields stay private so a slot changes only by these steps, and the cache
//! evicts only what the table can then read again from the store.

use std::cell::{Cell, Ref, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use futures_channel::oneshot;

use crate::error::{EngineError, StorageFault};

use super::blocks::{BlockWaiter, Lookup, ReadCache, Wakes};
use super::sealed::SealQueue;

pub(super) enum SegmentData {
    /// Still an open segment in the journal.
    Open,
    /// Sealed and held in memory (uploaded or not yet).
    Memory(Bytes),
    /// Only in the object store: read by blocks (ranged GETs) through the block cache.
    Remote,
}

pub(super) struct SegmentSlot {
    pub(super) key: Rc<str>,
    pub(super) data: SegmentData,
    pub(super) uploaded: bool,
    /// Object size in bytes (known once sealed): bounds the last block's range.
    pub(super) size: u64,
}

/// Where a chunk's bytes are.
pub(super) enum Located {
    /// In a sealed segment held in memory: the chunk's bytes.
    Memory(Bytes),
    /// In an open segment (the journal has them).
    Open,
    /// In the object store, read by blocks: the segment's key and size.
    Remote(Rc<str>, u64),
}

/// One core's segment table. Invariants: a number names one segment for the table's life; a
/// slot is added `Open` (the journal's) or `Remote` (recovered, merged); an open one becomes
/// `Memory` when sealed, then `Remote` once uploaded and no longer held for reads; a slot
/// leaves the table when sealed empty, collected, or merged (after a grace).
#[derive(Default)]
pub(super) struct SegmentTable {
    slots: RefCell<HashMap<u64, SegmentSlot>>,
    /// Numbers the next segment added (the journal's open segments, recovered and merged
    /// objects alike): each is used once.
    next_no: Cell<u64>,
    /// Uploaded segments and blocks held in memory for reads, within one budget.
    cache: RefCell<ReadCache>,
    /// Sealed segments not yet stored and committed, in seal order.
    sealed: RefCell<SealQueue>,
}

impl SegmentTable {
    // --- Slots ----------------------------------------------------------------------------

    /// Adds a segment under the next number, which it returns.
    pub(super) fn add(&self, slot: SegmentSlot) -> u64 {
        let no = self.next_no.get();
        self.next_no.set(no + 1);
        let old = self.slots.borrow_mut().insert(no, slot);
        debug_assert!(old.is_none(), "a segment number is used once");
        no
    }

    /// The slots, to read (compaction's scans); they change only through the table.
    pub(super) fn slots(&self) -> Ref<'_, HashMap<u64, SegmentSlot>> {
        self.slots.borrow()
    }

    /// How many segments the table holds.
    pub(super) fn len(&self) -> usize {
        self.slots.borrow().len()
    }

    /// Whether segment `no` is in the object store.
    pub(super) fn uploaded(&self, no: u64) -> bool {
        self.slots
            .borrow()
            .get(&no)
            .is_some_and(|slot| slot.uploaded)
    }

    /// Whether every sealed segment numbered `target` or below is uploaded.
    pub(super) fn uploaded_through(&self, target: u64) -> bool {
        self.slots
            .borrow()
            .iter()
            .filter(|(no, slot)| **no <= target && !matches!(slot.data, SegmentData::Open))
            .all(|(_, slot)| slot.uploaded)
    }

    /// Where the bytes `start..end` of segment `no` are, for a read at `now`.
    pub(super) fn locate(
        &self,
        no: u64,
        start: usize,
        end: usize,
        now: Instant,
    ) -> Result<Located, EngineError> {
        let slots = self.slots.borrow();
        let slot = slots
            .get(&no)
            .ok_or(EngineError::Storage(StorageFault::SegmentGone {
                segment: no,
            }))?;
        match &slot.data {
            SegmentData::Memory(bytes) => {
                self.cache.borrow_mut().note_sealed_read(now);
                Ok(Located::Memory(bytes.slice(start..end)))
            }
            SegmentData::Open => Ok(Located::Open),
            SegmentData::Remote => {
                self.cache.borrow_mut().note_sealed_read(now);
                Ok(Located::Remote(slot.key.clone(), slot.size))
            }
        }
    }

    /// The key and size of segment `no` if it is only in the object store.
    pub(super) fn remote(&self, no: u64) -> Option<(Rc<str>, u64)> {
        match self.slots.borrow().get(&no) {
            Some(slot) if matches!(slot.data, SegmentData::Remote) => {
                Some((slot.key.clone(), slot.size))
            }
            _ => None,
        }
    }

    /// The first `size` bytes of segment `no` if memory holds them.
    pub(super) fn held(&self, no: u64, size: u64) -> Option<Bytes> {
        match self.slots.borrow().get(&no).map(|s| &s.data) {
            Some(SegmentData::Memory(bytes)) if bytes.len() as u64 >= size => {
                Some(bytes.slice(..size as usize))
            }
            _ => None,
        }
    }

    // --- Seal, upload, collection ---------------------------------------------------------

    /// Open segment `no` was sealed into `bytes`: an empty one leaves the table; any other is
    /// read from memory and queued for upload. Returns whether it was queued.
    pub(super) fn sealed(&self, no: u64, bytes: &Bytes) -> bool {
        let mut slots = self.slots.borrow_mut();
        if bytes.is_empty() {
            slots.remove(&no);
            return false;
        }
        if let Some(slot) = slots.get_mut(&no) {
            debug_assert!(matches!(slot.data, SegmentData::Open), "sealed once");
            slot.data = SegmentData::Memory(bytes.clone());
            slot.size = bytes.len() as u64;
        }
        true
    }

    /// Segment `no` (`len` bytes), sealed after every one queued, waits for its upload.
    pub(super) fn queue_upload(&self, no: u64, len: usize) {
        self.sealed.borrow_mut().sealed(no, len);
    }

    /// `len` bytes of a sealed segment are in the object store.
    pub(super) fn stored(&self, len: usize) {
        self.sealed.borrow_mut().stored(len);
    }

    /// Segment `no` is in the object store and the catalog.
    pub(super) fn mark_uploaded(&self, no: u64) {
        if let Some(slot) = self.slots.borrow_mut().get_mut(&no) {
            slot.uploaded = true;
        }
    }

    /// Segment `no` (`len` bytes) was just uploaded: it stays in memory while readers read
    /// behind the open segments (`ReadCache::keep_uploaded`), within `budget`; else reads
    /// from now on fetch its blocks from the store.
    pub(super) fn keep_or_release(&self, no: u64, len: usize, now: Instant, budget: usize) {
        let keep = self.cache.borrow_mut().keep_uploaded(now);
        if keep {
            self.cache.borrow_mut().hold_segment(no, len);
            self.evict(budget);
        } else if let Some(slot) = self.slots.borrow_mut().get_mut(&no) {
            slot.data = SegmentData::Remote;
        }
    }

    /// No sealed segment waits for its PUT or its catalog commit.
    pub(super) fn none_sealed(&self) -> bool {
        self.sealed.borrow().is_empty()
    }

    /// Bytes of sealed segments not yet in the object store.
    pub(super) fn unuploaded_bytes(&self) -> usize {
        self.sealed.borrow().unuploaded_bytes()
    }

    /// `None` when segment `no` may commit now; else a receiver woken when a commit before
    /// it is done (`SealQueue::turn`).
    pub(super) fn commit_turn(&self, no: u64) -> Option<oneshot::Receiver<()>> {
        self.sealed.borrow_mut().turn(no)
    }

    /// Segment `no` is in the catalog: returns the uploads to wake.
    pub(super) fn end_commit_turn(&self, no: u64) -> Vec<oneshot::Sender<()>> {
        self.sealed.borrow_mut().end_turn(no)
    }

    /// Drops the uploaded segments stored under `keys` (garbage-collected) and their cached
    /// bytes.
    pub(super) fn forget_keys(&self, keys: &HashSet<&str>) {
        let mut slots = self.slots.borrow_mut();
        let gone: Vec<u64> = slots
            .iter()
            .filter(|(_, slot)| slot.uploaded && keys.contains(&*slot.key))
            .map(|(no, _)| *no)
            .collect();
        for no in &gone {
            slots.remove(no);
        }
        self.cache
            .borrow_mut()
            .forget(&gone, |no| slots.contains_key(&no));
    }

    /// Drops segments `olds` (merged into another) and their cached bytes.
    pub(super) fn forget(&self, olds: &[u64]) {
        let mut slots = self.slots.borrow_mut();
        for old in olds {
            slots.remove(old);
        }
        self.cache
            .borrow_mut()
            .forget(olds, |n| slots.contains_key(&n));
    }

    // --- Read cache -----------------------------------------------------------------------

    /// Bytes the read cache holds.
    pub(super) fn cache_bytes(&self) -> usize {
        self.cache.borrow().memory_bytes()
    }

    /// The read cache's generation (`ReadCache::generation`).
    pub(super) fn generation(&self) -> u64 {
        self.cache.borrow().generation()
    }

    /// Whether bytes `start..end` of segment `no` were checked in the blocks cached at
    /// `generation`.
    pub(super) fn checked_at(&self, generation: u64, no: u64, start: u64, end: u64) -> bool {
        let cache = self.cache.borrow();
        cache.generation() == generation && cache.is_checked(no, start, end)
    }

    /// A read checked bytes `start..end` of segment `no` in the blocks cached at `generation`.
    pub(super) fn mark_checked(&self, no: u64, start: u64, end: u64, generation: u64) {
        self.cache
            .borrow_mut()
            .mark_checked(no, start, end, generation);
    }

    /// A read found bytes `start..end` of segment `no` damaged (`ReadCache::drop_blocks`).
    pub(super) fn drop_damaged(&self, no: u64, start: u64, end: u64) {
        self.cache.borrow_mut().drop_blocks(no, start, end);
    }

    /// Block `index` of segment `no` (`ReadCache::lookup`).
    pub(super) fn lookup(&self, no: u64, index: u64) -> Lookup {
        self.cache.borrow_mut().lookup(no, index)
    }

    /// Whether block `index` of segment `no` is cached or being fetched.
    pub(super) fn has_block(&self, no: u64, index: u64) -> bool {
        self.cache.borrow().has_block(no, index)
    }

    /// Marks the blocks one GET from `index` fetches as loading; returns how many
    /// (`ReadCache::start_loading`).
    pub(super) fn start_loading(
        &self,
        no: u64,
        index: u64,
        block_count: u64,
        waiter: Option<BlockWaiter>,
    ) -> u64 {
        self.cache
            .borrow_mut()
            .start_loading(no, index, block_count, waiter)
    }

    /// Files the blocks one GET brought (or fails their waiters), keeps the cache within
    /// `budget`, and returns the readers to wake.
    pub(super) fn finish_blocks(
        &self,
        no: u64,
        first: u64,
        count: u64,
        result: &Result<Bytes, EngineError>,
        budget: usize,
    ) -> Wakes {
        let wake = self.cache.borrow_mut().finish(no, first, count, result);
        self.evict(budget);
        wake
    }

    /// Keeps the read caches within `budget` together: whole uploaded segments still held
    /// since their seal go first (oldest first), then blocks fetched from the store.
    fn evict(&self, budget: usize) {
        let dropped = self.cache.borrow_mut().evict(budget);
        let mut slots = self.slots.borrow_mut();
        for no in dropped {
            if let Some(slot) = slots.get_mut(&no) {
                if slot.uploaded && matches!(slot.data, SegmentData::Memory(_)) {
                    slot.data = SegmentData::Remote;
                }
            }
        }
    }
}
