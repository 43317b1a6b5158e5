//! Compaction's catalog swap: consecutive small segments of one writer become one entry of a
//! new key, in their first segment's place in commit order, in one transaction
//! ([`crate::MetaStore::compact_segments`]).
//!
//! The merged object is the old objects' bytes end to end, stored under a key of its own that
//! no row names (the compacting core's next segment key), never over an old object: two
//! compactors of the same segments (an owner that lost its stream while paused, and the next
//! owner) would otherwise overwrite each other's merged objects, and one catalog row would
//! name an object of another length. A crash after the PUT and before this swap leaves an
//! object no row names, which the node's start-up sweep deletes. The swap then, in the
//! batch's transaction:
//!
//! ```text
//!   merged key   the first old segment's row, renamed (keeps its seq, its place in commit
//!                order) and re-committed with every old entry merged: runs shifted by the
//!                bytes before their object, producers, close, timestamps and writer
//!                sequences as the later segment has them
//!   keys 1..n    kept as rows with no entries ("retired"), created at `retire_at_ms`:
//!                the garbage collector deletes their objects once that time is past
//!                (`GC_SEALED_MARGIN_MS` later), and only then their rows
//! ```
//!
//! It is idempotent: asked again after it committed (an answer lost), it answers
//! [`CompactOutcome::AlreadySwapped`]; asked when the catalog changed meanwhile (a segment
//! collected, resized, quarantined, a stream of it held elsewhere, another segment between
//! them holding one of their streams) it changes nothing and answers
//! [`CompactOutcome::Refused`].

use std::collections::{BTreeMap, HashMap};

use crate::backend::{Backend, NodeId, SegmentColumns};
use crate::fence::{check_fence, Fence};
use crate::rows::{commit, segment_entry, storable, validate_segment};
use crate::{MetaError, ProducerState, SegmentRecord, SegmentRun, SegmentStreamEntry};

/// What [`crate::MetaStore::compact_segments`] is asked to swap.
#[derive(Clone, Debug)]
pub struct CompactRequest {
    /// The segments to merge, in commit order, with the size the catalog has for each: the
    /// merged object is their bytes in this order.
    pub olds: Vec<(String, u64)>,
    /// Where the merged object is stored: a key no row names.
    pub merged_key: String,
    /// The streams the compacting core holds, each with the owner epoch it holds it at (0 on
    /// a single node). An entry of any other stream that still has a row refuses the swap:
    /// another core or node may read the old objects for it.
    pub streams: HashMap<u64, u64>,
    /// Cluster: the compacting node and its incarnation; every stream is fenced by it.
    pub node: Option<(NodeId, u64)>,
    /// The retired rows' time (Unix ms): their objects outlive it by the collector's margin.
    pub retire_at_ms: i64,
    /// The merged row's time (Unix ms).
    pub now_ms: i64,
}

/// The answer of [`crate::MetaStore::compact_segments`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompactOutcome {
    /// The swap committed in this call.
    Swapped,
    /// An earlier call's swap had committed (its answer was lost).
    AlreadySwapped,
    /// Nothing changed: the catalog is not what the request expects; the message says how.
    Refused(String),
}

/// The swap, in the caller's transaction (a job's savepoint).
pub(crate) fn compact(
    db: &mut dyn Backend,
    request: &CompactRequest,
) -> Result<CompactOutcome, MetaError> {
    let refuse = |why: String| Ok(CompactOutcome::Refused(why));
    if request.olds.len() < 2 {
        return refuse("fewer than two segments".into());
    }
    let total: u64 = request.olds.iter().map(|(_, size)| size).sum();
    if let Some(row) = db.segment_row(&request.merged_key)? {
        return match u64::try_from(row.size_bytes) {
            Ok(size) if size == total => Ok(CompactOutcome::AlreadySwapped),
            _ => refuse(format!(
                "the merged key {} is a segment of {} bytes already",
                request.merged_key, row.size_bytes
            )),
        };
    }
    let mut rows: Vec<Option<SegmentColumns>> = Vec::with_capacity(request.olds.len());
    for (key, _) in &request.olds {
        rows.push(db.segment_row(key)?);
    }
    let sizes: Vec<Option<u64>> = rows
        .iter()
        .map(|row| row.as_ref().and_then(|r| u64::try_from(r.size_bytes).ok()))
        .collect();
    let mut seqs = Vec::with_capacity(rows.len());
    for ((key, size), (row, found)) in request.olds.iter().zip(rows.iter().zip(&sizes)) {
        match row {
            None => return refuse(format!("segment {key} is not in the catalog")),
            Some(row) if *found != Some(*size) => {
                return refuse(format!(
                    "segment {key} has {} bytes in the catalog, not {size}",
                    row.size_bytes
                ))
            }
            Some(row) => seqs.push(row.seq),
        }
    }
    if seqs.windows(2).any(|pair| pair[0] >= pair[1]) {
        return refuse("the segments are not in commit order".into());
    }
    let quarantined = db.quarantined()?;
    if let Some((key, ..)) = quarantined
        .iter()
        .find(|(key, ..)| request.olds.iter().any(|(old, _)| old == key))
    {
        return refuse(format!("segment {key} holds quarantined records"));
    }
    // Every entry from the first segment to the last, those of segments between them too.
    let (first, last) = (seqs[0], seqs[seqs.len() - 1]);
    let position: HashMap<i64, usize> = seqs.iter().enumerate().map(|(i, s)| (*s, i)).collect();
    let mut merged: Vec<Vec<SegmentStreamEntry>> = vec![Vec::new(); seqs.len()];
    let mut between: Vec<u64> = Vec::new();
    db.for_each_entry_between(first, last, &mut |seq, columns| {
        match position.get(&seq) {
            Some(&i) => merged[i].push(segment_entry(&request.olds[i].0, columns)?),
            None => between.push(segment_entry("(between)", columns)?.stream_id),
        }
        Ok(())
    })?;
    let ids: Vec<u64> = {
        let mut ids: Vec<u64> = merged.iter().flatten().map(|e| e.stream_id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    };
    if let Some(id) = ids.iter().find(|id| between.contains(id)) {
        return refuse(format!(
            "stream {id} has records in a segment committed between those merged"
        ));
    }
    let foreign: Vec<i64> = ids
        .iter()
        .filter(|id| !request.streams.contains_key(id))
        .filter_map(|id| i64::try_from(*id).ok())
        .collect();
    if let Some((id, _)) = db.stream_starts(&foreign)?.first() {
        return refuse(format!("stream {id} is not held by the compacting core"));
    }
    if let Some((node, node_epoch)) = request.node {
        for id in &ids {
            let Some(&epoch) = request.streams.get(id) else {
                continue; // no row: checked above
            };
            let fence = Fence {
                node,
                node_epoch,
                epoch,
            };
            match check_fence(db, *id, Some(fence)) {
                Ok(()) => {}
                Err(MetaError::Fenced(why)) => return refuse(why),
                Err(e) => return Err(e),
            }
        }
    }
    let record = SegmentRecord {
        key: request.merged_key.clone(),
        size_bytes: total,
        created_ms: request.now_ms,
        streams: merge_entries(&request.olds, merged),
    };
    if let Err(MetaError::Storage(why)) = validate_segment(&record) {
        return refuse(why);
    }
    db.rename_segment(&request.olds[0].0, &request.merged_key)?;
    commit(db, &record)?;
    for (key, size) in &request.olds {
        let size = storable(*size, || format!("segment {key}: size"))?;
        let seq = db.upsert_segment(key, size, request.retire_at_ms)?;
        db.replace_entries(seq, &[])?;
    }
    Ok(CompactOutcome::Swapped)
}

/// One entry per stream, in the order the streams first appear: runs shifted by the bytes of
/// the objects before theirs; what later segments say of a stream's state wins.
fn merge_entries(
    olds: &[(String, u64)],
    segments: Vec<Vec<SegmentStreamEntry>>,
) -> Vec<SegmentStreamEntry> {
    let mut order: Vec<u64> = Vec::new();
    let mut by_stream: HashMap<u64, (SegmentStreamEntry, BTreeMap<String, ProducerState>)> =
        HashMap::new();
    let mut base = 0u64;
    for ((_, size), entries) in olds.iter().zip(segments) {
        for entry in entries {
            let (merged, producers) = by_stream.entry(entry.stream_id).or_insert_with(|| {
                order.push(entry.stream_id);
                (
                    SegmentStreamEntry {
                        stream_id: entry.stream_id,
                        runs: Vec::new(),
                        last_timestamp_ms: entry.last_timestamp_ms,
                        closed: false,
                        producers: Vec::new(),
                        closed_by: None,
                        writer_seq: None,
                    },
                    BTreeMap::new(),
                )
            });
            merged.runs.extend(entry.runs.iter().map(|run| SegmentRun {
                byte_start: run.byte_start + base,
                byte_end: run.byte_end + base,
                ..*run
            }));
            merged.last_timestamp_ms = merged.last_timestamp_ms.max(entry.last_timestamp_ms);
            merged.closed |= entry.closed;
            if entry.closed_by.is_some() {
                merged.closed_by = entry.closed_by;
            }
            if entry.writer_seq.is_some() {
                merged.writer_seq = entry.writer_seq;
            }
            for producer in entry.producers {
                producers.insert(producer.id.clone(), producer);
            }
        }
        base += size;
    }
    order
        .into_iter()
        .filter_map(|id| by_stream.remove(&id))
        .map(|(mut entry, producers)| {
            entry.producers = producers.into_values().collect();
            entry
        })
        .collect()
}
