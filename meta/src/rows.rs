//! Rows to values and back: what the engine's records become in the registry and catalog
//! columns of either backend, and the checks on the way. Every error names the row, so an
//! operator knows where to look.

use crate::backend::{Backend, EntryColumns, StreamColumns};
use crate::limits::PRODUCER_ID_MAX_BYTES;
use crate::{producers, runs};
use crate::{
    ForkRow, MetaError, ProducerState, Retention, SegmentRecord, SegmentStreamEntry, StreamConfig,
    StreamRow,
};

/// A nullable limit column: NULL is off, a negative value is damage.
fn limit(value: Option<i64>, what: impl FnOnce() -> String) -> Result<Option<u64>, MetaError> {
    value.map(|v| unsigned(Some(v), what)).transpose()
}

pub(crate) fn storable(value: u64, what: impl FnOnce() -> String) -> Result<i64, MetaError> {
    i64::try_from(value)
        .map_err(|_| MetaError::Storage(format!("{} {value} is not storable", what())))
}

/// A stored integer read back as the `u64` it was written from, or an error naming `what`
/// (`None`: the column is NULL where it may not be).
pub(crate) fn unsigned(
    value: Option<i64>,
    what: impl FnOnce() -> String,
) -> Result<u64, MetaError> {
    match value.map(u64::try_from) {
        Some(Ok(value)) => Ok(value),
        Some(Err(_)) => Err(MetaError::Storage(format!(
            "{} is negative ({})",
            what(),
            value.unwrap_or_default()
        ))),
        None => Err(MetaError::Storage(format!("{} is missing", what()))),
    }
}

/// A registry row as the engine sees it.
pub(crate) fn stream_row(columns: StreamColumns) -> Result<StreamRow, MetaError> {
    let StreamColumns {
        id,
        name,
        content_type,
        ttl_sec,
        expires_at_ms,
        closed,
        created_ms,
        start_offset,
        last_access_ms,
        fork_source,
        fork_source_id,
        fork_offset,
        fork_partial_bytes,
        soft_deleted,
        owner_node: _,
        owner_epoch: _,
        transfer_to: _,
        retention_age_ms,
        retention_bytes,
        delete_on_empty_ms,
    } = columns;
    let column = |what: &'static str| {
        let name = &name;
        move || format!("stream {name:?}: {what}")
    };
    let id = unsigned(Some(id), column("id"))?;
    let start_offset = unsigned(Some(start_offset), column("start_offset"))?;
    let ttl_sec = match ttl_sec {
        Some(ttl) => Some(unsigned(Some(ttl), column("ttl_sec"))?),
        None => None,
    };
    let fork = match fork_source {
        None => None,
        Some(source) => Some(ForkRow {
            source,
            source_id: unsigned(fork_source_id, column("fork_source_id"))?,
            offset: unsigned(fork_offset, column("fork_offset"))?,
            partial_bytes: unsigned(fork_partial_bytes, column("fork_partial_bytes"))?,
        }),
    };
    let retention = Retention {
        age_ms: limit(retention_age_ms, column("retention_age_ms"))?,
        bytes: limit(retention_bytes, column("retention_bytes"))?,
        delete_on_empty_ms: limit(delete_on_empty_ms, column("delete_on_empty_ms"))?,
    };
    Ok(StreamRow {
        id,
        start_offset,
        name,
        config: StreamConfig {
            content_type,
            ttl_sec,
            expires_at_ms,
            retention,
        },
        closed,
        created_ms,
        last_access_ms,
        fork,
        soft_deleted,
    })
}

pub(crate) fn commit(db: &mut dyn Backend, segment: &SegmentRecord) -> Result<(), MetaError> {
    validate_segment(segment)?;
    let key = &segment.key;
    let mut entries = Vec::with_capacity(segment.streams.len());
    for entry in &segment.streams {
        let stream = entry.stream_id;
        // validate_segment checked the id lengths, so neither encoding can fail here.
        let too_long = || {
            MetaError::Storage(format!(
                "segment {key}: stream {stream}: producer id too long"
            ))
        };
        let closed_by = match &entry.closed_by {
            Some(producer) => Some(producers::encode_one(producer).ok_or_else(too_long)?),
            None => None,
        };
        entries.push(EntryColumns {
            stream_id: storable(stream, || format!("segment {key}: stream id"))?,
            runs: runs::encode(&entry.runs),
            last_timestamp_ms: entry.last_timestamp_ms,
            closed: entry.closed,
            producers: producers::encode(&entry.producers).ok_or_else(too_long)?,
            closed_by,
            writer_seq: entry.writer_seq.clone(),
        });
    }
    let size_bytes = storable(segment.size_bytes, || format!("segment {key}: size"))?;
    // The upsert keeps `seq` (the commit-order position) of an already committed key.
    let seq = db.upsert_segment(key, size_bytes, segment.created_ms)?;
    db.replace_entries(seq, &entries)
}

/// Checks a segment record against itself before anything is written (see
/// [`MetaStore::commit_segment`] for the rules). A record breaking them is an engine bug; storing
/// it would make recovery serve wrong bytes later, so it is refused now, loudly.
pub(crate) fn validate_segment(segment: &SegmentRecord) -> Result<(), MetaError> {
    let reject = |why: String| {
        Err(MetaError::Storage(format!(
            "segment {}: {why}",
            segment.key
        )))
    };
    if segment.key.is_empty() {
        return reject("empty object key".to_string());
    }
    let mut seen = std::collections::HashSet::with_capacity(segment.streams.len());
    for entry in &segment.streams {
        if !seen.insert(entry.stream_id) {
            return reject(format!("stream {} listed twice", entry.stream_id));
        }
        validate_runs(segment.size_bytes, entry).or_else(reject)?;
        validate_producers(entry).or_else(reject)?;
    }
    Ok(())
}

/// One entry of segment `key` as the engine sees it; every error names the segment, so an
/// operator knows where to look.
pub(crate) fn segment_entry(
    key: &str,
    columns: Result<EntryColumns, String>,
) -> Result<SegmentStreamEntry, MetaError> {
    let columns = columns
        .map_err(|error| MetaError::Storage(format!("segment {key}: read entry: {error}")))?;
    let stream_id = unsigned(Some(columns.stream_id), || {
        format!("segment {key}: stream id")
    })?;
    let damaged = |what: &str, blob: &[u8]| {
        MetaError::Storage(format!(
            "segment {key}: stream {stream_id}: damaged {what} ({} bytes)",
            blob.len()
        ))
    };
    let runs = runs::decode(&columns.runs).ok_or_else(|| damaged("runs", &columns.runs))?;
    let producers = producers::decode(&columns.producers)
        .ok_or_else(|| damaged("producers", &columns.producers))?;
    let closed_by = match &columns.closed_by {
        Some(blob) => Some(producers::decode_one(blob).ok_or_else(|| damaged("closed_by", blob))?),
        None => None,
    };
    Ok(SegmentStreamEntry {
        stream_id,
        runs,
        last_timestamp_ms: columns.last_timestamp_ms,
        closed: columns.closed,
        producers,
        closed_by,
        writer_seq: columns.writer_seq,
    })
}

fn validate_runs(size_bytes: u64, entry: &SegmentStreamEntry) -> Result<(), String> {
    let stream = entry.stream_id;
    for run in &entry.runs {
        if run.first_offset > run.next_offset || run.byte_start > run.byte_end {
            return Err(format!("stream {stream}: run {run:?} is inverted"));
        }
        if run.byte_end > size_bytes {
            return Err(format!(
                "stream {stream}: run {run:?} ends past the object's {size_bytes} bytes"
            ));
        }
    }
    for pair in entry.runs.windows(2) {
        if pair[0].next_offset > pair[1].first_offset {
            return Err(format!(
                "stream {stream}: runs {:?} and {:?} are unsorted or overlap",
                pair[0], pair[1]
            ));
        }
    }
    Ok(())
}

fn validate_producers(entry: &SegmentStreamEntry) -> Result<(), String> {
    let stream = entry.stream_id;
    let long_id = |producer: &ProducerState| {
        (producer.id.len() > PRODUCER_ID_MAX_BYTES).then(|| {
            format!(
                "stream {stream}: producer id of {} bytes is longer than {}",
                producer.id.len(),
                PRODUCER_ID_MAX_BYTES
            )
        })
    };
    if let Some(why) = entry
        .producers
        .iter()
        .chain(&entry.closed_by)
        .find_map(long_id)
    {
        return Err(why);
    }
    for pair in entry.producers.windows(2) {
        if pair[0].id >= pair[1].id {
            return Err(format!(
                "stream {stream}: producers {:?} and {:?} are unsorted or duplicated",
                pair[0].id, pair[1].id
            ));
        }
    }
    Ok(())
}
