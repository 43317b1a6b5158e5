//! Streams on the move between this core and other nodes (cluster only), as one owned part:
//! the ones it let go, remembered to send late requests on, and the ones being handed off,
//! which new operations wait for.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use pico_meta::NodeId;

use crate::limits;

/// Invariant: at most `limits::REMOTE_STREAMS_PER_CORE_MAX` remembered streams.
#[derive(Default)]
pub(super) struct Moves {
    /// Streams this core let go to another node (handed off, fenced): name → node (0: not
    /// known). An operation already past routing when the stream left is sent there.
    remote: HashMap<Rc<str>, NodeId>,
    /// Streams being handed to another node.
    handing_off: HashSet<Rc<str>>,
    /// The newest segment of this core that held frames of a stream it let go while they
    /// were not in the catalog yet: no stream is loaded from the catalog here until every
    /// segment up to it is committed or refused (`Shard::adopt`). One number for the core, not
    /// one per stream: it only ever waits for segments already on their way.
    reload_after: Option<u64>,
}

impl Moves {
    /// Stream `name` left for `node` (0: not known); the memory is cleared when full.
    pub(super) fn remember(&mut self, name: &str, node: NodeId) {
        if self.remote.len() >= limits::REMOTE_STREAMS_PER_CORE_MAX {
            self.remote.clear();
        }
        self.remote.insert(Rc::from(name), node);
    }

    /// Stream `name` is served here (again), or nowhere: nothing to redirect to.
    pub(super) fn forget(&mut self, name: &str) {
        self.remote.remove(name);
    }

    /// The node stream `name` left for, if remembered (0: not known).
    pub(super) fn moved_to(&self, name: &str) -> Option<NodeId> {
        self.remote.get(name).copied()
    }

    pub(super) fn begin_hand_off(&mut self, name: Rc<str>) {
        self.handing_off.insert(name);
    }

    pub(super) fn end_hand_off(&mut self, name: &str) {
        self.handing_off.remove(name);
    }

    pub(super) fn handing_off(&self, name: &str) -> bool {
        self.handing_off.contains(name)
    }

    /// Segment `no` held frames of a stream let go before they reached the catalog.
    pub(super) fn reload_after(&mut self, no: u64) {
        self.reload_after = Some(self.reload_after.map_or(no, |after| after.max(no)));
    }

    /// The segment loads from the catalog wait for, if any.
    pub(super) fn reload_barrier(&self) -> Option<u64> {
        self.reload_after
    }

    /// Every segment up to `no` is committed or refused.
    pub(super) fn settled_through(&mut self, no: u64) {
        if self.reload_after.is_some_and(|after| after <= no) {
            self.reload_after = None;
        }
    }
}
