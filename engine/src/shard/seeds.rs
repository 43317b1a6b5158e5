//! A stream's starting state from the catalog: its tail, timestamps, close flag, producers,
//! fork links and the segment runs that hold its records. Used at boot for every stream and
//! by a core adopting a stream from another node (cluster).

use std::collections::HashMap;
use std::sync::Arc;

use pico_meta::Snapshot;

use super::stream::StreamSeed;
use crate::frame::ProducerTuple;
use crate::producers::Producer;
use crate::rules::ForkOrigin;

/// Each fork's depth (see [`crate::rules::ForkOrigin::depth`]), by id. Walks every chain in a
/// loop, remembering depths already known, so a long chain costs no stack and each stream is
/// visited about once; a source missing from the snapshot ends its chain.
fn fork_depths(snapshot: &Snapshot) -> HashMap<u64, u32> {
    let source_of: HashMap<u64, u64> = snapshot
        .streams
        .iter()
        .filter_map(|row| row.fork.as_ref().map(|f| (row.id, f.source_id)))
        .collect();
    let mut depths: HashMap<u64, u32> = HashMap::new();
    for &start in source_of.keys() {
        let mut chain = Vec::new();
        let mut at = start;
        // Ids only point at older streams, so chains end; the count bounds a damaged catalog.
        let mut base = loop {
            if let Some(&known) = depths.get(&at) {
                break known;
            }
            match source_of.get(&at) {
                Some(&source) if chain.len() <= source_of.len() => {
                    chain.push(at);
                    at = source;
                }
                _ => break 0,
            }
        };
        for id in chain.into_iter().rev() {
            base = base.saturating_add(1);
            depths.insert(id, base);
        }
    }
    depths
}

/// Rebuilds every live stream's tail, timestamps, close flag and chunk list from the catalog.
pub(crate) fn stream_seeds(snapshot: &Snapshot) -> Vec<StreamSeed> {
    let mut snapshot = snapshot.clone();
    stream_seeds_by_core(&mut snapshot, 1, |_| 0)
        .pop()
        .unwrap_or_default()
}

/// [`stream_seeds`] for a whole node, each seed put straight into the list of the core `place`
/// gives its name (`place` must answer below `cores`). It takes the stream rows out of
/// `snapshot`, moving their strings into the seeds: built once, so a restart of a million
/// streams makes no intermediate copies of ~370 bytes per stream for the kernel to zero
/// (docs/decisions/2026-12-small-idle-streams.md). What remains besides the seeds is a 16-byte
/// entry per stream to find a segment entry's seed by id.
pub(crate) fn stream_seeds_by_core(
    snapshot: &mut Snapshot,
    cores: usize,
    place: impl Fn(&str) -> usize,
) -> Vec<Vec<StreamSeed>> {
    let mut fork_refs: HashMap<u64, u64> = HashMap::new();
    for row in &snapshot.streams {
        if let Some(fork) = &row.fork {
            *fork_refs.entry(fork.source_id).or_default() += 1;
        }
    }
    let fork_depths = fork_depths(snapshot);
    let rows = std::mem::take(&mut snapshot.streams);
    let mut per_core: Vec<Vec<StreamSeed>> = (0..cores)
        .map(|_| Vec::with_capacity(rows.len() / cores + rows.len() / 8 + 1))
        .collect();
    // (id, core, index in that core's list), sorted by id for the segment entries' look-ups.
    let mut by_id: Vec<(u64, u32, u32)> = Vec::with_capacity(rows.len());
    for row in rows {
        let core = place(&row.name);
        let depth = fork_depths.get(&row.id).copied().unwrap_or(1);
        let seed = StreamSeed {
            id: row.id,
            closed: row.closed,
            config: row.config,
            created_ms: row.created_ms,
            next_offset: 0,
            last_timestamp_ms: 0,
            runs: Vec::new(),
            start_offset: row.start_offset,
            last_access_ms: row.last_access_ms,
            producers: Default::default(),
            closed_by: None,
            fork: row.fork.map(|row| ForkOrigin { row, depth }),
            fork_refs: fork_refs.get(&row.id).copied().unwrap_or(0),
            soft_deleted: row.soft_deleted,
            writer_seq: None,
            epoch: 0,
            name: row.name,
        };
        let list = &mut per_core[core];
        by_id.push((seed.id, core as u32, list.len() as u32));
        list.push(seed);
    }
    by_id.sort_unstable_by_key(|&(id, _, _)| id);
    for segment in &snapshot.segments {
        let key: Arc<str> = Arc::from(segment.key.as_str());
        for entry in &segment.streams {
            let Ok(at) = by_id.binary_search_by_key(&entry.stream_id, |&(id, _, _)| id) else {
                continue;
            };
            let (_, core, index) = by_id[at];
            let seed = &mut per_core[core as usize][index as usize];
            seed.closed |= entry.closed;
            for producer in &entry.producers {
                let state = seed
                    .producers
                    .entry(producer.id.clone())
                    .or_insert(Producer {
                        epoch: 0,
                        seq: 0,
                        active_ms: i64::MIN,
                    });
                if (producer.epoch, producer.seq) >= (state.epoch, state.seq) {
                    state.epoch = producer.epoch;
                    state.seq = producer.seq;
                }
                state.active_ms = state.active_ms.max(entry.last_timestamp_ms);
            }
            if let Some(closer) = &entry.closed_by {
                seed.closed_by = Some(ProducerTuple {
                    id: closer.id.clone(),
                    epoch: closer.epoch,
                    seq: closer.seq,
                });
            }
            seed.last_timestamp_ms = seed.last_timestamp_ms.max(entry.last_timestamp_ms);
            // Writer sequences only grow: the largest is the last accepted.
            if entry.writer_seq > seed.writer_seq {
                seed.writer_seq = entry.writer_seq.clone();
            }
            for run in &entry.runs {
                seed.next_offset = seed.next_offset.max(run.next_offset);
                seed.runs.push((
                    key.clone(),
                    segment.size_bytes,
                    *run,
                    entry.last_timestamp_ms,
                ));
            }
        }
    }
    for seed in per_core.iter_mut().flatten() {
        seed.runs.sort_by_key(|(_, _, run, _)| run.first_offset);
        // Trimmed-away segments may have been garbage-collected: the trim point still holds
        // the tail, so offsets never restart lower.
        seed.next_offset = seed.next_offset.max(seed.start_offset);
    }
    per_core
}

#[cfg(test)]
mod tests;
