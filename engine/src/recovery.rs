//! Recovery of the WAL files a previous run left (whatever its core count): each file's valid
//! prefix is stored as a segment object and indexed in the catalog, then the file is removed.
//! A torn tail (frames after the last whole request, or a bad CRC) holds only unacknowledged
//! data and is dropped. Runs on the main thread before any core starts (see `boot`).

use std::collections::HashMap;

use futures_channel::oneshot;
use pico_meta::{
    MetaStore, ProducerState, SegmentRecord, SegmentRun, SegmentStreamEntry, Snapshot,
};
use pico_s3::ObjectStore;

use crate::clock::now_ms;
use crate::config::EngineConfig;
use crate::frame::{self, FRAME_KIND_CLOSE};
use crate::placement::{epoch_of, segment_key};

/// What recovery learned that the rest of boot needs.
pub(crate) struct Recovered {
    /// The newest node epoch any WAL file or segment was named with: this run names its
    /// files above it.
    pub(crate) max_epoch_ms: u64,
}

/// Turns every WAL file into a committed segment: its valid prefix (frames up to the first
/// bad CRC: a torn tail holds only unacknowledged data) is stored as an object and indexed in
/// the catalog, then the file is removed. Idempotent: a crash midway redoes the same keys.
pub(crate) fn recover_wal_files(
    config: &EngineConfig,
    meta: &MetaStore,
    store: &ObjectStore,
    snapshot: &mut Snapshot,
    report: &mut Vec<String>,
    fence: Option<pico_meta::NodeId>,
) -> Result<Recovered, String> {
    let mut max_epoch_ms = snapshot
        .segments
        .iter()
        .filter_map(|s| epoch_of(s.key.rsplit('/').next().unwrap_or_default()))
        .max()
        .unwrap_or(0);
    let mut files: Vec<_> = std::fs::read_dir(&config.wal_dir)
        .map_err(|e| {
            format!(
                "cannot list WAL directory {}: {e}",
                config.wal_dir.display()
            )
        })?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "wal"))
        .collect();
    files.sort();
    for path in files {
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        max_epoch_ms = max_epoch_ms.max(epoch_of(&stem).unwrap_or(0));
        let data = std::fs::read(&path)
            .map_err(|e| format!("cannot read WAL file {}: {e}", path.display()))?;
        let valid = frame::valid_prefix_len(&data);
        if valid > 0 {
            let bytes = bytes::Bytes::copy_from_slice(&data[..valid]);
            let record = index_segment(segment_key(config.node_id, &stem), &bytes);
            wait(store.put(&record.key, bytes))?;
            match fence {
                None => wait(meta.commit_segment(record.clone()))?,
                Some(node) => {
                    let fence = pico_meta::SegmentFence {
                        node,
                        epochs: HashMap::new(),
                    };
                    let fenced = wait(meta.commit_segment_fenced(record.clone(), fence))?;
                    for id in fenced {
                        // Data this node wrote before another node took the stream over: the
                        // new owner has served the stream since, so these records cannot join
                        // it. They stay in the object for an operator; say so loudly.
                        let entry = record.streams.iter().find(|e| e.stream_id == id);
                        let runs = entry.map(|e| format!("{:?}", e.runs)).unwrap_or_default();
                        log::error!(
                            "WAL file {}: stream {id} was taken over by another node while this \
                             node was down; its records {runs} in object {} were not restored",
                            path.display(),
                            record.key
                        );
                    }
                }
            }
            report.push(format!(
                "recovered WAL file {} ({valid} bytes)",
                path.display()
            ));
            snapshot.segments.retain(|s| s.key != record.key);
            snapshot.segments.push(record);
        }
        std::fs::remove_file(&path)
            .map_err(|e| format!("cannot remove WAL file {}: {e}", path.display()))?;
    }
    Ok(Recovered { max_epoch_ms })
}

/// Blocks on a metadata or object-store answer (boot runs before any executor).
pub(crate) fn wait<T, E: std::fmt::Display>(
    reply: oneshot::Receiver<Result<T, E>>,
) -> Result<T, String> {
    futures_lite::future::block_on(reply)
        .map_err(|_| "storage thread stopped during recovery".to_string())?
        .map_err(|e| e.to_string())
}

/// Builds a segment's catalog entry from its frames.
pub(crate) fn index_segment(key: String, bytes: &bytes::Bytes) -> SegmentRecord {
    let mut entries: std::collections::BTreeMap<u64, SegmentStreamEntry> = Default::default();
    let mut pos = 0;
    while let Ok((frame, len)) = frame::decode_frame(bytes, pos) {
        let entry = entries
            .entry(frame.stream_id)
            .or_insert_with(|| SegmentStreamEntry {
                stream_id: frame.stream_id,
                runs: Vec::new(),
                last_timestamp_ms: 0,
                closed: false,
                producers: Vec::new(),
                closed_by: None,
                writer_seq: None,
            });
        entry.last_timestamp_ms = entry.last_timestamp_ms.max(frame.timestamp_ms);
        if let Some(writer_seq) = &frame.writer_seq {
            entry.writer_seq = entry.writer_seq.clone().max(Some(writer_seq.clone()));
        }
        if let Some(producer) = &frame.producer {
            let state = ProducerState {
                id: producer.id.clone(),
                epoch: producer.epoch,
                seq: producer.seq,
            };
            match entry.producers.iter_mut().find(|p| p.id == producer.id) {
                Some(known) => *known = known.clone().max(state.clone()),
                None => entry.producers.push(state.clone()),
            }
            if frame.kind == FRAME_KIND_CLOSE {
                entry.closed_by = Some(state);
            }
        }
        if frame.kind == FRAME_KIND_CLOSE {
            entry.closed = true;
        } else {
            let (start, end) = (pos as u64, (pos + len) as u64);
            match entry.runs.last_mut() {
                Some(run) if run.byte_end == start && run.next_offset == frame.offset => {
                    run.next_offset += 1;
                    run.byte_end = end;
                }
                _ => entry.runs.push(SegmentRun {
                    first_offset: frame.offset,
                    next_offset: frame.offset + 1,
                    byte_start: start,
                    byte_end: end,
                }),
            }
        }
        pos += len;
    }
    for entry in entries.values_mut() {
        entry.producers.sort();
        // The same spans as a segment sealed by a running core (see `coarsen_runs`).
        crate::shard::coarsen_runs(&mut entry.runs);
    }
    SegmentRecord {
        key,
        size_bytes: pos as u64,
        created_ms: now_ms(),
        streams: entries.into_values().collect(),
    }
}

#[cfg(test)]
mod tests;
