//! The pending-acknowledgement queue: appends are answered in order, once their bytes are
//! durable (the WAL round, or the upload with object durability), never while this node's
//! lease is in doubt, and failed when the stream moved to another node meanwhile.

use std::collections::{HashMap, HashSet};

use crate::error::EngineError;
use crate::Durability;

use super::state::{PendingAck, Shard};

impl Shard {
    /// Answers, in order, every append whose bytes are now durable.
    pub(super) fn release_acks(&self) {
        let durable: HashMap<u64, usize> = self
            .log
            .borrow()
            .iter()
            .map(|s| (s.no, s.durable_len))
            .collect();
        let uploaded = |no: u64| {
            self.segments
                .borrow()
                .get(&no)
                .is_some_and(|slot| slot.uploaded)
        };
        // A node that may have lost its streams (its lease lapsed: paused, cut off) does not
        // acknowledge local writes until the lease is renewed and ownership rechecked.
        let lease_lapsed = self.config.durability != Durability::Object
            && self.cluster.as_ref().is_some_and(|c| !c.lease_valid());
        // Only a cluster node that lost a stream has any: one check per round, not per ack.
        let any_fenced = !self.fenced.borrow().is_empty();
        loop {
            let fenced = any_fenced && {
                let pending = self.pending.borrow();
                pending
                    .front()
                    .is_some_and(|ack| self.fenced.borrow().contains(&(ack.stream_id, ack.epoch)))
            };
            if fenced {
                let ack = self
                    .pending
                    .borrow_mut()
                    .pop_front()
                    .expect("checked front");
                self.in_flight_bytes
                    .set(self.in_flight_bytes.get() - ack.body_bytes);
                let _ = ack.reply.send(Err(EngineError::NotOwner(
                    "the stream moved to another node before this append was stored; \
                     it was not appended"
                        .into(),
                )));
                continue;
            }
            if lease_lapsed {
                break;
            }
            let ack = {
                let mut pending = self.pending.borrow_mut();
                let ready = pending.front().is_some_and(|ack| {
                    if self.config.durability == Durability::Object {
                        uploaded(ack.segment)
                    } else {
                        durable.get(&ack.segment).is_none_or(|&len| len >= ack.end)
                    }
                });
                if !ready {
                    break;
                }
                pending.pop_front().expect("checked front")
            };
            self.in_flight_bytes
                .set(self.in_flight_bytes.get() - ack.body_bytes);
            let mut streams = self.streams.borrow_mut();
            if let Some(stream) = streams.get_mut(&*ack.name) {
                if stream.state.id == ack.stream_id {
                    stream.state.mark_durable(ack.next_offset, ack.closed);
                    for waiter in stream.waiters.drain(..) {
                        let _ = waiter.send(());
                    }
                }
            }
            drop(streams);
            let _ = ack.reply.send(Ok(()));
        }
        if any_fenced {
            let named: HashSet<(u64, u64)> = self
                .pending
                .borrow()
                .iter()
                .map(|ack| (ack.stream_id, ack.epoch))
                .collect();
            self.fenced.borrow_mut().retain(|key| named.contains(key));
        }
    }

    pub(super) fn fail_pending(&self, message: &str) {
        let pending: Vec<PendingAck> = self.pending.borrow_mut().drain(..).collect();
        for ack in pending {
            let _ = ack
                .reply
                .send(Err(EngineError::Durability(message.to_string())));
        }
    }
}
