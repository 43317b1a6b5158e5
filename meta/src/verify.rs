//! What `pico admin verify` reads (docs/durability.md, "Verifying stored objects"): every
//! object the catalog keeps that a stream still reads, with the size the catalog records and
//! the runs of records readers reach in it; every quarantined object; and, for a report, the
//! names of the streams a damaged object holds.
//!
//! "Still reads" is the garbage collector's rule turned round (`apply::garbage`): an object the
//! next collection would delete is not worth a GET, and damage in it harms no reader.

use std::collections::HashSet;

use crate::apply::{load_segments, needed, stream_starts};
use crate::backend::Backend;
use crate::MetaError;
use crate::SegmentRun;
use crate::SegmentStreamEntry;

/// One object a verify reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredObject {
    pub key: String,
    /// The size its catalog row records; `None` for a quarantined object without one (its
    /// commit was refused, so no row holds its size).
    pub size_bytes: Option<u64>,
    /// The records readers reach in it: per stream, the runs past the stream's start.
    pub runs: Vec<StoredRun>,
}

/// A run of one stream's records inside a [`StoredObject`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredRun {
    pub stream_id: u64,
    pub run: SegmentRun,
}

/// The objects a verify reads, in commit order, quarantined ones (not in the catalog) last;
/// with `only`, just that key's (empty when no stream needs it any more: a collection or a
/// trim came after the listing). Reads the segments and the streams they name, like a
/// collection pass.
pub(crate) fn stored_objects(
    db: &mut dyn Backend,
    only: Option<&str>,
) -> Result<Vec<StoredObject>, MetaError> {
    let segments = load_segments(db, |columns| only.is_none_or(|key| columns.key == key))?;
    let quarantined = db.quarantined()?;
    let ids = segments
        .iter()
        .flat_map(|segment| &segment.streams)
        .map(|entry| entry.stream_id)
        .chain(quarantined.iter().map(|q| q.1 as u64));
    let starts = stream_starts(db, ids)?;
    let readable = |entry: &SegmentStreamEntry| -> Vec<StoredRun> {
        let Some(&start) = starts.get(&entry.stream_id) else {
            return Vec::new();
        };
        entry
            .runs
            .iter()
            .filter(|run| run.next_offset > start)
            .map(|run| StoredRun {
                stream_id: entry.stream_id,
                run: *run,
            })
            .collect()
    };
    let quarantined_keys: HashSet<&str> = quarantined.iter().map(|q| q.0.as_str()).collect();
    let mut objects = Vec::new();
    let mut listed: HashSet<String> = HashSet::new();
    for segment in &segments {
        let kept = segment.streams.iter().any(|e| needed(e, &starts))
            || quarantined_keys.contains(segment.key.as_str());
        if !kept {
            continue;
        }
        listed.insert(segment.key.clone());
        objects.push(StoredObject {
            key: segment.key.clone(),
            size_bytes: Some(segment.size_bytes),
            runs: segment.streams.iter().flat_map(&readable).collect(),
        });
    }
    // A quarantined object whose commit was refused has no catalog row: its records are kept
    // for an operator all the same (`pico admin quarantine`).
    let mut unlisted: Vec<StoredObject> = Vec::new();
    for (key, stream_id, runs, ..) in quarantined {
        if listed.contains(&key) || only.is_some_and(|only| only != key) {
            continue;
        }
        let runs = crate::runs::decode(&runs).ok_or_else(|| {
            MetaError::Storage(format!("quarantine entry {key} / {stream_id}: bad runs"))
        })?;
        let runs = runs.into_iter().map(|run| StoredRun {
            stream_id: stream_id as u64,
            run,
        });
        match unlisted.iter_mut().find(|object| object.key == key) {
            Some(object) => object.runs.extend(runs),
            None => unlisted.push(StoredObject {
                key,
                size_bytes: None,
                runs: runs.collect(),
            }),
        }
    }
    objects.extend(unlisted);
    Ok(objects)
}
