//! One core's compactor state (`compact.rs` runs it): what is under way, when the core last
//! stored a segment, and the segments a compaction retired, refused or merged.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::time::Instant;

/// One core's compactor.
#[derive(Default)]
pub(super) struct Compaction {
    /// A compaction is under way (one at a time per core).
    pub(super) running: Cell<bool>,
    /// A timer will look again once the core has been idle.
    pub(super) timer_armed: Cell<bool>,
    /// When this core last stored a segment.
    pub(super) last_upload: Cell<Option<Instant>>,
    /// The core stores segments closer together than `COMPACT_BUSY_GAP_MS`: it merges only
    /// once idle.
    pub(super) busy: Cell<bool>,
    /// After a failed compaction, none starts before this (a store or catalog outage is not
    /// hammered).
    pub(super) not_before: Cell<Option<Instant>>,
    /// Table entries of retired objects, kept for reads already under way; never picked.
    pub(super) retired: RefCell<HashSet<u64>>,
    /// Segments a swap refused (the catalog disagreed), and damaged ones: left as they are.
    pub(super) refused: RefCell<HashSet<u64>>,
    /// A merged object's place in seal order: that of the first segment it holds.
    pub(super) order: RefCell<HashMap<u64, u64>>,
    /// The one stream a stored segment holds (`None`: several, or none left): only one
    /// stream's segments are merged, so a merged object is garbage once that stream's records
    /// are, as its segments would have been.
    pub(super) owner: RefCell<HashMap<u64, Option<u64>>>,
}
