//! The packed form of a [`SegmentStreamEntry`]'s runs, stored as one BLOB per entry.
//!
//! A segment holds runs of hundreds of streams; one row per run would multiply the catalog's row
//! count (and the snapshot load time) for no query we need: the catalog is only ever read whole,
//! at startup. So the runs of one (segment, stream) pair are one BLOB of fixed-size records:
//!
//! ```text
//!  run i, 32 bytes, all little-endian u64 (stable, persisted: changing it needs a migration)
//! ┌──────────────┬──────────────┬──────────────┬──────────────┐
//! │ first_offset │ next_offset  │ byte_start   │ byte_end     │
//! │ 8 bytes      │ 8 bytes      │ 8 bytes      │ 8 bytes      │
//! └──────────────┴──────────────┴──────────────┴──────────────┘
//!  the BLOB is run 0 ‖ run 1 ‖ … ; its length is 32 × number of runs (0 runs = empty BLOB)
//! ```
//!
//! [`SegmentStreamEntry`]: crate::SegmentStreamEntry

use crate::SegmentRun;

/// Bytes of one packed run.
pub(crate) const RUN_SIZE_BYTES: usize = 32;

/// Packs runs in order.
pub(crate) fn encode(runs: &[SegmentRun]) -> Vec<u8> {
    let mut blob = Vec::with_capacity(runs.len() * RUN_SIZE_BYTES);
    for run in runs {
        blob.extend_from_slice(&run.first_offset.to_le_bytes());
        blob.extend_from_slice(&run.next_offset.to_le_bytes());
        blob.extend_from_slice(&run.byte_start.to_le_bytes());
        blob.extend_from_slice(&run.byte_end.to_le_bytes());
    }
    debug_assert_eq!(blob.len(), runs.len() * RUN_SIZE_BYTES);
    blob
}

/// Unpacks a BLOB written by [`encode`]; `None` when its length is not a whole number of runs
/// (a damaged or foreign database, never something this crate writes).
pub(crate) fn decode(blob: &[u8]) -> Option<Vec<SegmentRun>> {
    let records = blob.chunks_exact(RUN_SIZE_BYTES);
    if !records.remainder().is_empty() {
        return None;
    }
    let word = |record: &[u8], index: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&record[index * 8..index * 8 + 8]);
        u64::from_le_bytes(bytes)
    };
    let runs = records
        .map(|record| SegmentRun {
            first_offset: word(record, 0),
            next_offset: word(record, 1),
            byte_start: word(record, 2),
            byte_end: word(record, 3),
        })
        .collect();
    Some(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let runs = vec![
            SegmentRun {
                first_offset: 0,
                next_offset: 3,
                byte_start: 0,
                byte_end: 96,
            },
            SegmentRun {
                first_offset: 7,
                next_offset: 9,
                byte_start: 200,
                byte_end: 264,
            },
            SegmentRun {
                first_offset: u64::MAX - 1,
                next_offset: u64::MAX,
                byte_start: u64::MAX - 7,
                byte_end: u64::MAX,
            },
        ];
        let blob = encode(&runs);
        assert_eq!(blob.len(), 3 * RUN_SIZE_BYTES);
        assert_eq!(decode(&blob).unwrap(), runs);
        assert_eq!(decode(&[]).unwrap(), vec![]);
    }

    #[test]
    fn layout_is_little_endian_words() {
        let blob = encode(&[SegmentRun {
            first_offset: 1,
            next_offset: 2,
            byte_start: 3,
            byte_end: 4,
        }]);
        assert_eq!(&blob[0..8], &1u64.to_le_bytes());
        assert_eq!(&blob[24..32], &4u64.to_le_bytes());
    }

    #[test]
    fn torn_blob_is_rejected() {
        assert!(decode(&[0u8; 31]).is_none());
        assert!(decode(&[0u8; 33]).is_none());
    }
}
