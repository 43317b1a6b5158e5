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
        if self.config.durability != Durability::Object || self.journal.flush_pending() {
            return;
        }
        // One flush in flight per core: a second PUT beside it loses (a 256-in-flight run
        // makes 25.8k appends/s against 29.7k: more, smaller PUTs for the same CPU;
        // docs/decisions/2026-12-object-put-budget.md), so appends wait for the PUT before
        // them and ride the next one together.
        let busy = !self.segments.none_sealed() || self.journal.open_count() > 1;
        if busy || !self.active_has_frames() {
            return;
        }
        let wait = self.put_budget.take();
        if wait.is_zero() {
            self.rotate();
            return;
        }
        self.journal.set_flush_pending(true);
        let this = self.clone();
        glommio::spawn_local(async move {
            glommio::timer::sleep(wait).await;
            this.journal.set_flush_pending(false);
            // A size rotation may have sealed meanwhile: the slot goes unused, and that
            // upload's end flushes what came after it.
            let free = this.segments.none_sealed() && this.journal.open_count() == 1;
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
        let sealed = self.segments.unuploaded_bytes();
        if self.config.durability != Durability::Object {
            return sealed;
        }
        sealed + self.journal.open_bytes()
    }

    fn active_has_frames(&self) -> bool {
        self.journal.active_has_frames()
    }
}
