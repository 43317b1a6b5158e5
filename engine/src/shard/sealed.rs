//! Sealed segments on their way out, as one owned part: the bytes not yet in the object
//! store (the backlog appends are refused past) and the seal order their catalog commits
//! take turns in (see `upload.rs` for why).

use std::collections::VecDeque;

use futures_channel::oneshot;

/// Invariants: `unuploaded_bytes` is the sum of the sealed segments not yet stored;
/// `order` holds the segments not yet in the catalog in the order they were sealed, and
/// only its front may commit.
#[derive(Default)]
pub(super) struct SealQueue {
    order: VecDeque<u64>,
    /// Uploads whose PUT is done, waiting for their turn to commit.
    turn_waiters: Vec<oneshot::Sender<()>>,
    unuploaded_bytes: usize,
}

impl SealQueue {
    /// Segment `no` (`len` bytes) was sealed after every one queued.
    pub(super) fn sealed(&mut self, no: u64, len: usize) {
        self.unuploaded_bytes += len;
        self.order.push_back(no);
    }

    /// No sealed segment waits for its PUT or its catalog commit.
    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Bytes of sealed segments not yet in the object store.
    pub(super) fn unuploaded_bytes(&self) -> usize {
        self.unuploaded_bytes
    }

    /// `len` bytes of a sealed segment are in the object store (and its WAL file may go).
    pub(super) fn stored(&mut self, len: usize) {
        self.unuploaded_bytes -= len;
    }

    /// `None` when segment `no` may commit now; else a receiver woken when a commit before
    /// it is done (or dropped when the core stops), after which the caller asks again.
    pub(super) fn turn(&mut self, no: u64) -> Option<oneshot::Receiver<()>> {
        if self.order.front() == Some(&no) {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        self.turn_waiters.push(tx);
        Some(rx)
    }

    /// Segment `no`, the front, is in the catalog: returns the uploads to wake, as the next
    /// one may commit.
    pub(super) fn end_turn(&mut self, no: u64) -> Vec<oneshot::Sender<()>> {
        let front = self.order.pop_front();
        debug_assert_eq!(front, Some(no), "catalog commits go in seal order");
        std::mem::take(&mut self.turn_waiters)
    }
}
