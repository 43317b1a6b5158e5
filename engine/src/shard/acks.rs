//! Answering appends: in queue order, once their bytes are durable (the WAL round, or the
//! upload with object durability), never while this node's lease is in doubt, and failed
//! when the stream moved to another node meanwhile (the queue itself is `pending.rs`).

use crate::config::Durability;
use crate::error::{AppendError, EngineError, NotOwnerReason};
use crate::health::WalFault;

use super::pending::Release;
use super::state::Shard;

impl Shard {
    /// Answers, in order, every append whose bytes are now durable.
    pub(super) fn release_acks(&self) {
        // A node that may have lost its streams (its lease lapsed: paused, cut off) does not
        // acknowledge local writes until the lease is renewed and ownership rechecked.
        let lease_lapsed = self.config.durability != Durability::Object
            && self.cluster.as_ref().is_some_and(|c| !c.lease_valid());
        let released = if self.config.durability == Durability::Object {
            self.journal
                .take_uploaded(lease_lapsed, |no| self.segments.uploaded(no))
        } else {
            self.journal.take_durable(lease_lapsed)
        };
        for (ack, release) in released {
            if release == Release::Fenced {
                let _ = ack.reply.send(Err(
                    EngineError::from(NotOwnerReason::MovedBeforeStored).into()
                ));
                continue;
            }
            let waiters = {
                match self
                    .streams
                    .get_mut(&ack.name)
                    .filter(|stream| stream.state.id == ack.stream_id)
                {
                    Some(mut stream) => {
                        stream.state.mark_durable(ack.next_offset, ack.closed);
                        std::mem::take(&mut stream.waiters)
                    }
                    None => Vec::new(),
                }
            };
            // The writer first: the executor runs woken tasks in order, and one woken reader
            // may wake thousands of subscribers (`live.rs`); the writer's acknowledgement
            // must not wait for all of their deliveries.
            let _ = ack.reply.send(Ok(()));
            for waiter in waiters {
                let _ = waiter.send(());
            }
        }
    }

    /// The WAL failed: every append waiting for it fails with `fault`, and every request
    /// waiting for an earlier append's durability (a producer's retry, a repeated close) is
    /// woken to find the WAL failed (`after_durable`), instead of waiting for ever.
    pub(super) fn fail_pending(&self, fault: &WalFault) {
        let pending = self.journal.drain_acks();
        for ack in pending {
            let fault = fault.clone();
            let _ = ack.reply.send(Err(AppendError::Durability {
                fault,
                retry: false,
            }));
        }
        let mut waiters = Vec::new();
        self.streams
            .for_each_mut(|stream| waiters.extend(std::mem::take(&mut stream.waiters)));
        for waiter in waiters {
            let _ = waiter.send(());
        }
    }
}
