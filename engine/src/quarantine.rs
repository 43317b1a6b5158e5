//! Records a segment commit refused after they were acknowledged (the stream moved to another
//! node, was deleted, or the writing incarnation was superseded), kept in the quarantine for an
//! operator (`MetaStore::quarantined`; the garbage collector keeps their segments): reading
//! them back from the segment object, CRC-checked.

use pico_meta::Quarantined;
use pico_s3::ObjectStore;

use crate::api::RecordView;
use crate::frame::{self, FRAME_KIND_RECORD};

/// The records of a quarantined entry, in offset order.
pub async fn export(store: &ObjectStore, entry: &Quarantined) -> Result<Vec<RecordView>, String> {
    let mut records = Vec::new();
    for run in &entry.runs {
        let bytes = store
            .get_range(&entry.segment_key, run.byte_start, run.byte_end)
            .await
            .map_err(|_| "object store stopped".to_string())?
            .map_err(|e| format!("reading {}: {e}", entry.segment_key))?;
        let mut pos = 0;
        while pos < bytes.len() {
            let (found, len) = frame::decode_frame(&bytes, pos).map_err(|e| {
                format!(
                    "segment {} at byte {}: {e:?}",
                    entry.segment_key,
                    run.byte_start + pos as u64
                )
            })?;
            let wanted = found.kind == FRAME_KIND_RECORD
                && found.stream_id == entry.stream_id
                && (run.first_offset..run.next_offset).contains(&found.offset);
            if wanted {
                records.push(RecordView {
                    offset: found.offset,
                    timestamp_ms: found.timestamp_ms,
                    headers: found.headers,
                    body: found.body,
                });
            }
            pos += len;
        }
    }
    Ok(records)
}
