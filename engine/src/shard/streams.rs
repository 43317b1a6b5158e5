//! The streams a core holds, as one owned part: the map of streams by name, the content types
//! they share, and (cluster) the streams on the move to or from other nodes with the wake-up
//! of the operations that wait for a hand-off. Streams are added and removed only here, which
//! keeps the published stream count right; operations reach one stream (`get`, `get_mut`) or
//! all of them (`scan`, `for_each_mut`) for as long as one step of theirs needs it, never
//! across an `.await`.

use std::cell::{Ref, RefCell, RefMut};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use pico_meta::NodeId;

use crate::limits;
use crate::metrics::CoreMetrics;
use crate::notify::LocalBroadcast;

use super::moves::Moves;
use super::stream::Stream;

pub(super) struct Streams {
    /// Invariant: `metrics.streams` is its length (set by `insert` and `remove`).
    map: RefCell<BTreeMap<Rc<str>, Stream>>,
    /// The content types the streams share (`shared_content_type`), at most
    /// `limits::INTERNED_CONTENT_TYPES_MAX`.
    content_types: RefCell<Vec<Arc<str>>>,
    /// Streams let go to other nodes, or being handed to one.
    moves: RefCell<Moves>,
    /// Wakes the operations that waited for a hand-off.
    handed_off: LocalBroadcast,
    /// Where the stream count is published.
    metrics: Arc<CoreMetrics>,
}

impl Streams {
    /// No streams yet; the count goes to `metrics.streams`.
    pub(super) fn new(metrics: Arc<CoreMetrics>) -> Streams {
        Streams {
            map: RefCell::default(),
            content_types: RefCell::default(),
            moves: RefCell::default(),
            handed_off: LocalBroadcast::default(),
            metrics,
        }
    }

    /// Stream `name`, to read.
    pub(super) fn get(&self, name: &str) -> Option<Ref<'_, Stream>> {
        Ref::filter_map(self.map.borrow(), |map| map.get(name)).ok()
    }

    /// Stream `name`, to change.
    pub(super) fn get_mut(&self, name: &str) -> Option<RefMut<'_, Stream>> {
        RefMut::filter_map(self.map.borrow_mut(), |map| map.get_mut(name)).ok()
    }

    /// Stream `name` with the name as the map holds it (shared by the acknowledgements and
    /// the segment index that name it), to change.
    pub(super) fn get_named_mut(&self, name: &str) -> Option<(Rc<str>, RefMut<'_, Stream>)> {
        let map = self.map.borrow_mut();
        let key = map.get_key_value(name)?.0.clone();
        let stream = RefMut::map(map, |map| map.get_mut(name).expect("looked up above"));
        Some((key, stream))
    }

    /// Adds (or replaces) stream `name` and publishes the count.
    pub(super) fn insert(&self, name: Rc<str>, stream: Stream) {
        let mut map = self.map.borrow_mut();
        map.insert(name, stream);
        CoreMetrics::set(&self.metrics.streams, map.len() as u64);
    }

    /// Removes stream `name` if it is incarnation `id` (a stream of that name created since is
    /// left alone) and publishes the count.
    pub(super) fn remove(&self, name: &str, id: u64) -> Option<Stream> {
        let mut map = self.map.borrow_mut();
        if map.get(name).is_none_or(|s| s.state.id != id) {
            return None;
        }
        let removed = map.remove(name);
        CoreMetrics::set(&self.metrics.streams, map.len() as u64);
        removed
    }

    /// `look` at every stream, by name in order (listings, rounds of retention and reaping,
    /// ownership checks), without changing any.
    pub(super) fn scan<R>(&self, look: impl FnOnce(&BTreeMap<Rc<str>, Stream>) -> R) -> R {
        look(&self.map.borrow())
    }

    /// Changes every stream with `change`.
    pub(super) fn for_each_mut(&self, mut change: impl FnMut(&mut Stream)) {
        for stream in self.map.borrow_mut().values_mut() {
            change(stream);
        }
    }

    /// Whether stream `name` is held here.
    pub(super) fn holds(&self, name: &str) -> bool {
        self.map.borrow().contains_key(name)
    }

    /// The incarnation (stream id, owner epoch) of stream `name` held here.
    pub(super) fn incarnation(&self, name: &str) -> Option<(u64, u64)> {
        self.map.borrow().get(name).map(|s| (s.state.id, s.epoch))
    }

    /// The copy of `content_type` a new stream holds, shared with the other streams of that
    /// type: a million streams of a few types then hold a few copies of it, not a million. A
    /// client cannot grow the table past `limits::INTERNED_CONTENT_TYPES_MAX`: later types are
    /// simply not shared.
    pub(super) fn shared_content_type(&self, content_type: &str) -> Arc<str> {
        intern(&mut self.content_types.borrow_mut(), content_type)
    }

    // --- Moves (cluster) ------------------------------------------------------------------

    /// Stream `name` left for `node` (0: not known): late requests are sent there.
    pub(super) fn remember_moved(&self, name: &str, node: NodeId) {
        self.moves.borrow_mut().remember(name, node);
    }

    /// Stream `name` is served here (again), or nowhere: nothing to redirect to.
    pub(super) fn forget_moved(&self, name: &str) {
        self.moves.borrow_mut().forget(name);
    }

    /// The node stream `name` left for, if remembered (0: not known).
    pub(super) fn moved_to(&self, name: &str) -> Option<NodeId> {
        self.moves.borrow().moved_to(name)
    }

    /// Whether stream `name` is being handed to another node.
    pub(super) fn handing_off(&self, name: &str) -> bool {
        self.moves.borrow().handing_off(name)
    }

    pub(super) fn begin_hand_off(&self, name: Rc<str>) {
        self.moves.borrow_mut().begin_hand_off(name);
    }

    /// The hand-off of `name` is over (done or not): the operations waiting for it go on.
    pub(super) fn end_hand_off(&self, name: &str) {
        self.moves.borrow_mut().end_hand_off(name);
        self.handed_off.notify();
    }

    /// Segment `no` held frames of a stream let go before they reached the catalog: loads
    /// from the catalog wait until it is settled ([`Streams::reload_barrier`]).
    pub(super) fn reload_after(&self, no: u64) {
        self.moves.borrow_mut().reload_after(no);
    }

    /// The newest segment a load from the catalog must wait for (committed or refused), if any.
    pub(super) fn reload_barrier(&self) -> Option<u64> {
        self.moves.borrow().reload_barrier()
    }

    /// Every segment up to `no` is committed or refused.
    pub(super) fn settled_through(&self, no: u64) {
        self.moves.borrow_mut().settled_through(no);
    }

    /// Waits until stream `name` is not being handed off.
    pub(super) async fn wait_hand_off(&self, name: &str) {
        while self.handing_off(name) {
            self.handed_off.wait().await;
        }
    }
}

/// `content_type` as one of `known` when it is there; else a new copy, added to `known` while it
/// holds fewer than `limits::INTERNED_CONTENT_TYPES_MAX` types.
pub(super) fn intern(known: &mut Vec<Arc<str>>, content_type: &str) -> Arc<str> {
    if let Some(shared) = known.iter().find(|t| ***t == *content_type) {
        return shared.clone();
    }
    let copy: Arc<str> = Arc::from(content_type);
    if known.len() < limits::INTERNED_CONTENT_TYPES_MAX {
        known.push(copy.clone());
    }
    copy
}
