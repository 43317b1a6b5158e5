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
}
