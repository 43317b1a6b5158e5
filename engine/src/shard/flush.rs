//! Object durability's flushes: a core seals its active segment for upload as soon as its
//! uploader is free, within the node's PUT budget (`put_budget.rs`), instead of waiting out a
//! fixed window. A lone writer then waits one PUT and one catalog commit; under load, every
//! append that arrived during a PUT rides the next one, as the WAL's group commit batches
//! fsyncs.
//!
//! ```text
//!   append ─▶ commit round ─▶ flush_when_free ─┬─ uploader busy: nothing (its end calls again)
//!   upload done ─▶ release acks ─▶ flush_when_free ─┤
//!                                                 └─ free: take a slot ─▶ now, or after a timer
//! ```

use std::rc::Rc;

use crate::config::Durability;

use super::state::Shard;

impl Shard {
    /// Seals the active segment for upload when it holds appends, no segment of this core is
    /// on its way to the bucket, and the node's PUT budget has a slot (or arms a timer for the
    /// slot it took). Called after each commit round and after each upload.
    pub(super) fn flush_when_free(self: &Rc<Self>) {
        if self.config.durability != Durability::Object || self.flush_pending.get() {
            return;
        }
        // One flush in flight per core: a second PUT beside it loses (a 256-in-flight run
        // makes 25.8k appends/s against 29.7k: more, smaller PUTs for the same CPU;
        // docs/decisions/2026-12-object-put-budget.md), so appends wait for the PUT before
        // them and ride the next one together.
        let busy = !self.sealed.borrow().is_empty() || self.log.borrow().len() > 1;
        if busy || !self.active_has_frames() {
            return;
        }
        let wait = self.put_budget.take();
        if wait.is_zero() {
            self.rotate();
            return;
        }
        self.flush_pending.set(true);
        let this = self.clone();
        glommio::spawn_local(async move {
            glommio::timer::sleep(wait).await;
            this.flush_pending.set(false);
            // A size rotation may have sealed meanwhile: the slot goes unused, and that
            // upload's end flushes what came after it.
            let free = this.sealed.borrow().is_empty() && this.log.borrow().len() == 1;
            if free && this.active_has_frames() {
                this.rotate();
            }
        })
        .detach();
    }

    /// Bytes this core holds that the object store does not have yet: the sealed segments
    /// on their way, and with object durability the open ones too, which wait for the PUT
    /// in flight (an outage holds them there, not in sealed segments).
    pub(super) fn unstored_bytes(&self) -> usize {
        let sealed = self.sealed.borrow().unuploaded_bytes();
        if self.config.durability != Durability::Object {
            return sealed;
        }
        let open: usize = self.log.borrow().iter().map(|s| s.buf.len()).sum();
        sealed + open
    }

    fn active_has_frames(&self) -> bool {
        self.log.borrow().back().is_some_and(|s| !s.buf.is_empty())
    }
}
