//! The queue of appends waiting for their acknowledgement, in the order their frames were
//! written, with the bytes they hold (the in-flight budget) and the incarnations whose
//! appends must fail instead (fenced). Decides which to release; `acks.rs` answers them.

use std::collections::{HashSet, VecDeque};
use std::rc::Rc;

use futures_channel::oneshot;

use crate::error::AppendError;

/// One append waiting until its frames (which end at byte `end` of segment `segment`) are
/// durable.
pub(super) struct PendingAck {
    pub(super) segment: u64,
    pub(super) end: usize,
    pub(super) name: Rc<str>,
    pub(super) stream_id: u64,
    /// The owner epoch of the incarnation that wrote the frames (0 on a single node).
    pub(super) epoch: u64,
    pub(super) next_offset: u64,
    pub(super) closed: bool,
    pub(super) body_bytes: usize,
    pub(super) reply: oneshot::Sender<Result<(), AppendError>>,
}

/// How a released acknowledgement is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Release {
    /// Its bytes are durable: the stream's durable tail moves to it.
    Durable,
    /// Its stream's incarnation was lost to another node: the append failed.
    Fenced,
}

/// Invariants (checked in debug builds, `AckQueue::check`): `in_flight_bytes` is the sum of
/// the queued appends' body bytes (until [`AckQueue::drain`]); the queue is in write order
/// (segment, then end byte), and acknowledgements leave in that order, so a stream's durable
/// tail only moves forward; `fenced` names only incarnations some queued append belongs to,
/// once a release round has run.
#[derive(Default)]
pub(super) struct AckQueue {
    queue: VecDeque<PendingAck>,
    in_flight_bytes: usize,
    /// Incarnations (stream id, owner epoch) this core lost to another node while appends
    /// to them were pending: those acknowledgements fail instead of being released. Keyed by
    /// epoch, not id: the stream may be loaded here again, and its new appends are not the
    /// old incarnation's. Pruned once no pending acknowledgement names an entry.
    fenced: HashSet<(u64, u64)>,
    /// Drained after a WAL failure: the bytes stay counted, the queue is empty.
    drained: bool,
}

impl AckQueue {
    /// Queues an append written after every one already queued.
    pub(super) fn push(&mut self, ack: PendingAck) {
        debug_assert!(
            self.queue
                .back()
                .is_none_or(|last| (last.segment, last.end) <= (ack.segment, ack.end)),
            "an acknowledgement is queued in write order"
        );
        self.in_flight_bytes += ack.body_bytes;
        self.queue.push_back(ack);
    }

    /// Asserts the invariants in debug builds (a walk of the queue: once per release round).
    fn check(&self) {
        if cfg!(debug_assertions) {
            if !self.drained {
                let queued: usize = self.queue.iter().map(|ack| ack.body_bytes).sum();
                assert_eq!(
                    self.in_flight_bytes, queued,
                    "in-flight bytes are the queued"
                );
            }
            let mut order = self.queue.iter().map(|ack| (ack.segment, ack.end));
            if let Some(mut last) = order.next() {
                for next in order {
                    assert!(last <= next, "the queue is in write order");
                    last = next;
                }
            }
            for key in &self.fenced {
                assert!(
                    self.queue
                        .iter()
                        .any(|ack| (ack.stream_id, ack.epoch) == *key),
                    "a fenced incarnation has a queued append"
                );
            }
        }
    }

    /// Body bytes of the appends accepted but not yet answered.
    pub(super) fn in_flight_bytes(&self) -> usize {
        self.in_flight_bytes
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The appends of incarnation `(stream id, owner epoch)` fail at the next release.
    pub(super) fn fence(&mut self, id: u64, epoch: u64) {
        self.fenced.insert((id, epoch));
    }

    /// Takes, in order, the acknowledgements that may be answered now: from the front, every
    /// fenced one, and every `ready` one unless `hold` (a lapsed lease holds back all but the
    /// fenced); stops at the first that must wait, as the ones behind it end later.
    pub(super) fn take_released(
        &mut self,
        hold: bool,
        ready: impl Fn(&PendingAck) -> bool,
    ) -> Vec<(PendingAck, Release)> {
        // Only a cluster node that lost a stream has any: one check per round, not per ack.
        let any_fenced = !self.fenced.is_empty();
        let mut released = Vec::new();
        while let Some(front) = self.queue.front() {
            let release = if any_fenced && self.fenced.contains(&(front.stream_id, front.epoch)) {
                Release::Fenced
            } else if !hold && ready(front) {
                Release::Durable
            } else {
                break;
            };
            let ack = self.queue.pop_front().expect("checked front");
            self.in_flight_bytes -= ack.body_bytes;
            released.push((ack, release));
        }
        if any_fenced {
            let named: HashSet<(u64, u64)> = self
                .queue
                .iter()
                .map(|ack| (ack.stream_id, ack.epoch))
                .collect();
            self.fenced.retain(|key| named.contains(key));
        }
        self.check();
        released
    }

    /// Takes every queued acknowledgement (the WAL failed: they all fail). Their bytes stay
    /// counted in flight: the core takes no append after this.
    pub(super) fn drain(&mut self) -> Vec<PendingAck> {
        self.drained = true;
        self.queue.drain(..).collect()
    }
}
