//! Records a segment commit refused after they were acknowledged (the stream moved to another
//! node, was deleted, or the writing incarnation was superseded), kept in the quarantine for an
//! operator (`MetaStore::quarantined`; the garbage collector keeps their segments): reading
//! them back from the segment object, CRC-checked.

use pico_meta::Quarantined;
use pico_s3::{ObjectStore, StoreError};

use crate::api::RecordView;
use crate::frame::{self, FrameError, FRAME_KIND_RECORD};

/// Why a quarantined entry's records could not be read back.
#[derive(Debug)]
pub enum ExportError {
    /// The object store's thread is gone.
    StoreStopped,
    /// The segment object could not be read.
    Read { key: String, source: StoreError },
    /// The segment's bytes at `at` are not a whole, CRC-checked frame.
    Frame {
        key: String,
        at: u64,
        error: FrameError,
    },
}

impl std::fmt::Display for ExportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExportError::StoreStopped => f.write_str("object store stopped"),
            ExportError::Read { key, source } => write!(f, "reading {key}: {source}"),
            ExportError::Frame { key, at, error } => {
                write!(f, "segment {key} at byte {at}: {error:?}")
            }
        }
    }
}

impl std::error::Error for ExportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ExportError::Read { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The records of a quarantined entry, in offset order.
pub async fn export(
    store: &ObjectStore,
    entry: &Quarantined,
) -> Result<Vec<RecordView>, ExportError> {
    let mut records = Vec::new();
    for run in &entry.runs {
        let bytes = store
            .get_range(&entry.segment_key, run.byte_start, run.byte_end)
            .await
            .map_err(|_| ExportError::StoreStopped)?
            .map_err(|source| ExportError::Read {
                key: entry.segment_key.clone(),
                source,
            })?;
        let mut pos = 0;
        while pos < bytes.len() {
            let (found, len) =
                frame::decode_frame(&bytes, pos).map_err(|error| ExportError::Frame {
                    key: entry.segment_key.clone(),
                    at: run.byte_start + pos as u64,
                    error,
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
