//! A stream's idempotent producers and the limits on them: how many one stream keeps, how many
//! the whole node keeps, and when an idle one is forgotten (as Kafka expires producer ids).
//!
//! Producer state is client-created: every new `Producer-Id` costs memory on the stream's core
//! and a record in each segment entry it writes to, and is loaded again at every start. So:
//! - an id is at most [`limits::PRODUCER_ID_BYTES_MAX`] bytes (`400` past it);
//! - a stream keeps at most [`ProducerLimits::per_stream_max`] producers and the node about
//!   [`ProducerLimits::node_max`] (a core may overshoot by the producers other cores admit in
//!   the same instant); a new producer past either is refused with
//!   [`AppendError::TooManyProducers`] (`429`), after the stream's idle producers are dropped;
//! - a producer that has not written for [`ProducerLimits::idle_expiry_ms`] is forgotten when
//!   room is needed and at every start (its activity then is the newest timestamp of the last
//!   segment it wrote to). Coming back, it starts a new epoch at sequence 0 as any new producer;
//!   a retry of an old request is answered as from an unknown producer (`409`), never applied
//!   twice.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::AppendError;
use crate::frame::ProducerTuple;
use crate::limits;

/// The producer limits of one node (`pico serve --producers-max`, `--producer-idle-expiry-sec`).
#[derive(Clone, Debug)]
pub struct ProducerLimits {
    /// Producers one stream keeps.
    pub per_stream_max: usize,
    /// Producers the node keeps, over all its streams.
    pub node_max: usize,
    /// A producer idle this long is forgotten.
    pub idle_expiry_ms: u64,
    /// Producers the node keeps now (shared by every core; each table counts its own).
    held: Arc<AtomicUsize>,
}

impl ProducerLimits {
    pub fn new(per_stream_max: usize, node_max: usize, idle_expiry_ms: u64) -> ProducerLimits {
        ProducerLimits {
            per_stream_max,
            node_max,
            idle_expiry_ms,
            held: Arc::default(),
        }
    }

    /// Producers the node holds now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

/// Equal when they are the same node's limits.
impl PartialEq for ProducerLimits {
    fn eq(&self, other: &ProducerLimits) -> bool {
        Arc::ptr_eq(&self.held, &other.held)
            && (self.per_stream_max, self.node_max, self.idle_expiry_ms)
                == (other.per_stream_max, other.node_max, other.idle_expiry_ms)
    }
}

impl Eq for ProducerLimits {}

impl Default for ProducerLimits {
    fn default() -> ProducerLimits {
        ProducerLimits::new(
            limits::PRODUCERS_PER_STREAM_DEFAULT,
            limits::PRODUCERS_PER_NODE_DEFAULT,
            limits::PRODUCER_IDLE_EXPIRY_SEC_DEFAULT.saturating_mul(1000),
        )
    }
}

/// One producer's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Producer {
    pub epoch: u64,
    /// The last accepted request's sequence number.
    pub seq: u64,
    /// When it last wrote (Unix ms).
    pub active_ms: i64,
}

/// A stream's producers by id. Each one counts against the node's total while the table holds
/// it (dropping the table gives them back).
#[derive(Debug, Default)]
pub struct Producers {
    by_id: BTreeMap<String, Producer>,
    /// The node's count, once the table belongs to a stream of a running node.
    held: Option<Arc<AtomicUsize>>,
}

impl Producers {
    /// An empty table, usable in a `static`.
    pub const fn new() -> Producers {
        Producers {
            by_id: BTreeMap::new(),
            held: None,
        }
    }

    /// The table a stream starts with from the catalog: the producers of `seeded` that were
    /// active within `limits.idle_expiry_ms` of `now_ms`, counted against the node.
    pub fn seeded(
        seeded: BTreeMap<String, Producer>,
        limits: &ProducerLimits,
        now_ms: i64,
    ) -> Producers {
        let mut producers = Producers {
            by_id: seeded,
            held: None,
        };
        producers.drop_idle(limits, now_ms);
        producers.count_against(limits);
        producers
    }

    fn count_against(&mut self, limits: &ProducerLimits) {
        if self.held.is_none() {
            limits.held.fetch_add(self.by_id.len(), Ordering::Relaxed);
            self.held = Some(limits.held.clone());
        }
    }

    pub fn get(&self, id: &str) -> Option<&Producer> {
        self.by_id.get(id)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Producer)> {
        self.by_id.iter()
    }

    /// Whether `id` may write: a known producer always; a new one when the stream and the node
    /// have room, after the stream's idle producers are dropped.
    pub fn admit(
        &mut self,
        id: &str,
        limits: &ProducerLimits,
        now_ms: i64,
    ) -> Result<(), AppendError> {
        if self.by_id.contains_key(id) {
            return Ok(());
        }
        if self.by_id.len() >= limits.per_stream_max || limits.held() >= limits.node_max {
            self.drop_idle(limits, now_ms);
        }
        if self.by_id.len() >= limits.per_stream_max {
            return Err(AppendError::TooManyProducers {
                scope: "this stream",
                limit: limits.per_stream_max,
                idle_expiry_sec: limits.idle_expiry_ms / 1000,
            });
        }
        if limits.held() >= limits.node_max {
            return Err(AppendError::TooManyProducers {
                scope: "this node",
                limit: limits.node_max,
                idle_expiry_sec: limits.idle_expiry_ms / 1000,
            });
        }
        Ok(())
    }

    /// Records `producer`'s accepted request at `now_ms` (admitted before).
    pub fn record(&mut self, producer: &ProducerTuple, limits: &ProducerLimits, now_ms: i64) {
        self.count_against(limits);
        let state = Producer {
            epoch: producer.epoch,
            seq: producer.seq,
            active_ms: now_ms,
        };
        // A known producer's entry is updated in place: no id copied per append.
        if let Some(known) = self.by_id.get_mut(&producer.id) {
            *known = state;
        } else {
            self.by_id.insert(producer.id.clone(), state);
            limits.held.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Forgets the producers idle for `limits.idle_expiry_ms` or longer; how many.
    pub fn drop_idle(&mut self, limits: &ProducerLimits, now_ms: i64) -> usize {
        let expiry_ms = i64::try_from(limits.idle_expiry_ms).unwrap_or(i64::MAX);
        let before = self.by_id.len();
        self.by_id
            .retain(|_, producer| now_ms.saturating_sub(producer.active_ms) < expiry_ms);
        let dropped = before - self.by_id.len();
        if let Some(held) = &self.held {
            held.fetch_sub(dropped, Ordering::Relaxed);
        }
        dropped
    }
}

impl Clone for Producers {
    fn clone(&self) -> Producers {
        if let Some(held) = &self.held {
            held.fetch_add(self.by_id.len(), Ordering::Relaxed);
        }
        Producers {
            by_id: self.by_id.clone(),
            held: self.held.clone(),
        }
    }
}

impl PartialEq for Producers {
    fn eq(&self, other: &Producers) -> bool {
        self.by_id == other.by_id
    }
}

impl Eq for Producers {}

impl Drop for Producers {
    fn drop(&mut self) {
        if let Some(held) = &self.held {
            held.fetch_sub(self.by_id.len(), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(id: &str, seq: u64) -> ProducerTuple {
        ProducerTuple {
            id: id.to_string(),
            epoch: 0,
            seq,
        }
    }

    #[test]
    fn a_stream_keeps_at_most_its_limit_and_idle_producers_make_room() {
        let limits = ProducerLimits::new(2, 100, 1_000);
        let mut producers = Producers::new();
        for (id, at) in [("a", 0), ("b", 500)] {
            producers.admit(id, &limits, at).unwrap();
            producers.record(&tuple(id, 0), &limits, at);
        }
        assert_eq!(limits.held(), 2);
        // Known producers always write; a third is refused while both are active.
        producers.admit("a", &limits, 900).unwrap();
        assert_eq!(
            producers.admit("c", &limits, 900),
            Err(AppendError::TooManyProducers {
                scope: "this stream",
                limit: 2,
                idle_expiry_sec: 1
            })
        );
        // Once "a" has been idle for the expiry, it makes room.
        producers.admit("c", &limits, 1_000).unwrap();
        assert!(producers.get("a").is_none());
        producers.record(&tuple("c", 0), &limits, 1_000);
        assert_eq!(limits.held(), 2);
        drop(producers);
        assert_eq!(limits.held(), 0, "a dropped table gives its producers back");
    }

    #[test]
    fn the_node_limit_counts_every_stream_and_clones() {
        let limits = ProducerLimits::new(10, 3, 60_000);
        let mut one = Producers::new();
        let mut two = Producers::new();
        for (in_one, id) in [(true, "a"), (true, "b"), (false, "c")] {
            let table = if in_one { &mut one } else { &mut two };
            table.admit(id, &limits, 0).unwrap();
            table.record(&tuple(id, 0), &limits, 0);
        }
        assert!(matches!(
            two.admit("d", &limits, 1),
            Err(AppendError::TooManyProducers {
                scope: "this node",
                ..
            })
        ));
        let copy = one.clone();
        assert_eq!(limits.held(), 5);
        drop(copy);
        drop(one);
        two.admit("d", &limits, 1).unwrap();
    }

    #[test]
    fn a_seeded_table_forgets_producers_idle_past_the_expiry() {
        let limits = ProducerLimits::new(10, 10, 1_000);
        let seeded = BTreeMap::from([
            (
                "old".to_string(),
                Producer {
                    epoch: 0,
                    seq: 4,
                    active_ms: 0,
                },
            ),
            (
                "new".to_string(),
                Producer {
                    epoch: 1,
                    seq: 2,
                    active_ms: 9_500,
                },
            ),
        ]);
        let producers = Producers::seeded(seeded, &limits, 10_000);
        assert!(producers.get("old").is_none());
        assert_eq!(producers.get("new").map(|p| p.seq), Some(2));
        assert_eq!(limits.held(), 1);
    }
}
