//! A core's background rounds: retention (trim or delete by a stream's policy, docs/api.md),
//! the reaper of expired streams, and the gauges' refresh.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use crate::limits;
use crate::metrics::CoreMetrics;

use super::state::Shard;
use super::stream::{Chunk, Stream};

/// What one stream's retention policy asks for now.
pub(super) enum RetentionAction {
    /// Raise the start from `from` to `to`.
    Trim { name: Rc<str>, from: u64, to: u64 },
    /// The stream is empty and idle past its delete-on-empty time.
    Delete { name: Rc<str> },
}

/// Retention acts on whole chunks of a stream (each within one segment), only on durable
/// records, and never on a stream that forks read through (`fork_refs`) or on a fork (whose
/// first records are its source's): those keep what they have until the forks are gone.
pub(super) fn retention_action(
    name: &Rc<str>,
    stream: &Stream,
    now_ms: i64,
) -> Option<RetentionAction> {
    let state = &stream.state;
    let extras = state.extras();
    let retention = extras.retention;
    if retention.is_off() || extras.fork_refs > 0 || extras.fork.is_some() || state.soft_deleted {
        return None;
    }
    let durable = |c: &&Chunk| c.next_offset <= state.durable_offset;
    let mut to = state.start_offset;
    if let Some(age_ms) = retention.age_ms {
        let cutoff = now_ms.saturating_sub(i64::try_from(age_ms).unwrap_or(i64::MAX));
        for chunk in stream.chunks.iter().take_while(durable) {
            if chunk.last_timestamp_ms >= cutoff {
                break;
            }
            to = to.max(chunk.next_offset);
        }
    }
    if let Some(limit) = retention.bytes {
        let size = |c: &Chunk| c.byte_end - c.byte_start;
        let mut stored: u64 = stream
            .chunks
            .iter()
            .filter(|c| c.next_offset > to)
            .map(size)
            .sum();
        // The newest chunk stays, so a byte limit never empties a stream by itself.
        let older = stream.chunks.len().saturating_sub(1);
        for chunk in stream.chunks.iter().take(older).take_while(durable) {
            if stored <= limit {
                break;
            }
            if chunk.next_offset > to {
                stored -= size(chunk);
                to = chunk.next_offset;
            }
        }
    }
    if to > state.start_offset {
        return Some(RetentionAction::Trim {
            name: name.clone(),
            from: state.start_offset,
            to,
        });
    }
    if let Some(idle_ms) = retention.delete_on_empty_ms {
        let empty =
            state.start_offset >= state.durable_offset && state.next_offset == state.durable_offset;
        let last_write_ms = state.last_timestamp_ms.max(state.created_ms);
        let idle = now_ms.saturating_sub(last_write_ms);
        if empty && idle >= i64::try_from(idle_ms).unwrap_or(i64::MAX) {
            return Some(RetentionAction::Delete { name: name.clone() });
        }
    }
    None
}

impl Shard {
    /// Applies the streams' retention policies (docs/api.md, Retention): each round looks at
    /// up to `RETENTION_STREAMS_PER_ROUND` streams, resuming after the last one, decides from
    /// memory and then trims (or deletes) at most `RETENTION_ACTIONS_PER_ROUND` of them, each
    /// a fenced metadata write like a client's trim. Appends never wait for it: it runs
    /// between them on this core, one short step at a time. The sealed segments it leaves
    /// holding nothing readable are reclaimed by the garbage collector.
    pub(super) async fn retention_loop(self: Rc<Self>) {
        let mut after: Option<Rc<str>> = None;
        loop {
            glommio::timer::sleep(Duration::from_millis(limits::RETENTION_INTERVAL_MS)).await;
            if self.stopping.get() {
                return;
            }
            let (actions, next) = self.retention_round(after.as_deref(), self.clock.now_ms());
            after = next;
            for action in actions {
                match action {
                    RetentionAction::Trim { name, from, to } => {
                        match self.trim_to(&name, to, false).await {
                            Ok(start) => CoreMetrics::add(
                                &self.metrics.retention_records,
                                start.saturating_sub(from),
                            ),
                            Err(e) => log::debug!("retention trim of {name}: {e}"),
                        }
                    }
                    RetentionAction::Delete { name } => {
                        if !self.retire_if_still_empty(&name) {
                            continue;
                        }
                        match self.delete(&name).await {
                            Ok(fork_source) => {
                                self.queue_fork_releases(fork_source);
                                log::info!("retention: deleted {name} (empty)");
                                CoreMetrics::add(&self.metrics.retention_deleted_streams, 1);
                            }
                            Err(e) => {
                                log::debug!("retention delete of {name}: {e}");
                                if let Some(mut stream) = self.streams.get_mut(&name) {
                                    stream.retiring = false;
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Judges a delete-on-empty again now (the round's decision may predate an append: a
    /// trim before it awaited) and, if it stands, stops the stream taking appends until the
    /// delete is done. No await between the two.
    pub(super) fn retire_if_still_empty(&self, name: &Rc<str>) -> bool {
        let Some(mut stream) = self.streams.get_mut(name) else {
            return false;
        };
        let due = matches!(
            retention_action(name, &stream, self.clock.now_ms()),
            Some(RetentionAction::Delete { .. })
        );
        stream.retiring = due;
        due
    }

    /// One retention round's decisions, from memory; the name to resume after (`None`: the
    /// round reached the last stream, the next starts over).
    pub(super) fn retention_round(
        &self,
        after: Option<&str>,
        now_ms: i64,
    ) -> (Vec<RetentionAction>, Option<Rc<str>>) {
        self.streams.scan(|streams| {
            scan_round(
                streams,
                after,
                limits::RETENTION_STREAMS_PER_ROUND,
                limits::RETENTION_ACTIONS_PER_ROUND,
                |name, stream| retention_action(name, stream, now_ms),
            )
        })
    }

    /// Refreshes the gauges the admin listener reads (at most a moment stale).
    pub(super) async fn gauges_loop(self: Rc<Self>) {
        loop {
            let memory = self.journal.memory_bytes(self.clock.now()) + self.segments.cache_bytes();
            CoreMetrics::set(&self.metrics.memory_bytes, memory as u64);
            CoreMetrics::set(
                &self.metrics.upload_backlog_bytes,
                self.segments.unuploaded_bytes() as u64,
            );
            CoreMetrics::set(&self.metrics.segments, self.segments.len() as u64);
            glommio::timer::sleep(Duration::from_millis(limits::GAUGE_REFRESH_MS)).await;
        }
    }

    /// Deletes expired streams nobody touches, so their metadata does not linger, and deleted
    /// ones no fork reads any more whose removal failed (`finish_deletes`). Each round
    /// looks at up to `REAPER_SCAN_STREAMS_PER_ROUND` streams, resuming after the last one:
    /// looking at all of them every round would cost an idle node of a million streams a scan of
    /// the whole map per core every second. An expired stream is answered as gone from the
    /// moment it expires (`live_stream_id`); the reaper only tidies up after it.
    pub(super) async fn reaper_loop(self: Rc<Self>) {
        let mut after: Option<Rc<str>> = None;
        loop {
            glommio::timer::sleep(Duration::from_millis(limits::REAPER_INTERVAL_MS)).await;
            let now_ms = self.clock.now_ms();
            let (reapable, next) = self
                .streams
                .scan(|streams| reapable_round(streams, after.as_deref(), now_ms));
            after = next;
            for (name, id) in reapable {
                if let Err(e) = self.remove_stream(&name, id).await {
                    log::warn!(
                        "core {}: could not reap expired or deleted stream {name}: {e}",
                        self.core
                    );
                }
            }
        }
    }
}

/// A stream to reap (expired, or deleted with no fork left): its name and id.
pub(super) type ReapableStream = (Rc<str>, u64);

/// One reaper round: the expired or deleted streams no fork reads among the next
/// `REAPER_SCAN_STREAMS_PER_ROUND` after `after` (at most `REAPER_STREAMS_PER_ROUND` of them),
/// and the name to resume after (`None`: the round reached the last stream).
pub(super) fn reapable_round(
    streams: &BTreeMap<Rc<str>, Stream>,
    after: Option<&str>,
    now_ms: i64,
) -> (Vec<ReapableStream>, Option<Rc<str>>) {
    scan_round(
        streams,
        after,
        limits::REAPER_SCAN_STREAMS_PER_ROUND,
        limits::REAPER_STREAMS_PER_ROUND,
        |name, stream| {
            // A deleted one (soft-deleted while forks read it) whose last fork is gone is
            // removed when the fork is; the reaper only meets one whose removal failed.
            let gone = stream.state.is_expired(now_ms) || stream.state.soft_deleted;
            (gone && stream.state.extras().fork_refs == 0).then(|| (name.clone(), stream.state.id))
        },
    )
}

/// One round of a scan over a core's streams in name order that resumes where the last one
/// stopped, so a round's cost stays flat however many streams the core holds: `pick` is asked
/// of at most `scan_max` streams after `after`, and the round ends once `take_max` were picked.
/// Returns what was picked and the name to resume after (`None`: the round reached the last
/// stream, the next starts over).
fn scan_round<T>(
    streams: &BTreeMap<Rc<str>, Stream>,
    after: Option<&str>,
    scan_max: usize,
    take_max: usize,
    mut pick: impl FnMut(&Rc<str>, &Stream) -> Option<T>,
) -> (Vec<T>, Option<Rc<str>>) {
    use std::ops::Bound;
    let range = match after {
        Some(name) => streams.range::<str, _>((Bound::Excluded(name), Bound::Unbounded)),
        None => streams.range::<str, _>(..),
    };
    let mut picked = Vec::new();
    let mut last = None;
    for (seen, (name, stream)) in range.enumerate() {
        if seen >= scan_max || picked.len() >= take_max {
            return (picked, last);
        }
        last = Some(name.clone());
        picked.extend(pick(name, stream));
    }
    (picked, None)
}
