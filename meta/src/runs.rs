//! The packed form of a [`SegmentStreamEntry`]'s runs, stored as one BLOB per entry.
//!
//! A segment holds runs of hundreds of streams; one row per run would multiply the catalog's row
//! count (and the snapshot load time) for no query we need: the catalog is only ever read whole,
//! at startup. So the runs of one (segment, stream) pair are one BLOB, in one of two layouts
//! (both stable, persisted: changing either needs a migration). The compact one is written
//! whenever it can be; the fixed one stays readable (catalogs written before the compact one) and
//! is the fallback for runs whose byte ranges do not ascend, which the engine never builds.
//!
//! ```text
//!  fixed: run i, 32 bytes, all little-endian u64; the BLOB is run 0 ‖ run 1 ‖ … and its length
//!  is 32 × number of runs (0 runs = empty BLOB)
//! ┌──────────────┬──────────────┬──────────────┬──────────────┐
//! │ first_offset │ next_offset  │ byte_start   │ byte_end     │
//! │ 8 bytes      │ 8 bytes      │ 8 bytes      │ 8 bytes      │
//! └──────────────┴──────────────┴──────────────┴──────────────┘
//!
//!  compact: a tag, then per run four LEB128 varints, each a distance from the previous run's
//!  end (the first run's from 0): about 8 bytes a run instead of 32
//! ┌─────────────┬──────────────────────┬──────────────────────┬─────┐
//! │ tag         │ run 0                │ run 1                │ …   │
//! │ 0xC1, or    │ first_offset - prev  │ (same four varints)  │     │
//! │ 0xC2 0x00   │   next_offset        │                      │     │
//! │             │ next_offset -        │                      │     │
//! │             │   first_offset       │                      │     │
//! │             │ byte_start - prev    │                      │     │
//! │             │   byte_end           │                      │     │
//! │             │ byte_end - byte_start│                      │     │
//! └─────────────┴──────────────────────┴──────────────────────┴─────┘
//! ```
//!
//! The length tells the layouts apart: a fixed BLOB's is a multiple of 32, a compact one's never
//! is (when it would be, the tag is 0xC2 followed by one zero byte instead of 0xC1).
//!
//! [`SegmentStreamEntry`]: crate::SegmentStreamEntry

use crate::SegmentRun;

/// Bytes of one run in the fixed layout.
pub(crate) const RUN_SIZE_BYTES: usize = 32;
/// First byte of a compact BLOB.
const COMPACT_TAG: u8 = 0xC1;
/// First byte of a compact BLOB padded by one zero byte after it, off a multiple of 32.
const COMPACT_PADDED_TAG: u8 = 0xC2;
/// The longest LEB128 encoding of a `u64`.
const VARINT_MAX_BYTES: usize = 10;

/// Packs runs in order: compact when every run starts at or after the previous one's end, in
/// offsets and in bytes (what the engine builds), else fixed.
pub(crate) fn encode(runs: &[SegmentRun]) -> Vec<u8> {
    if runs.is_empty() {
        return Vec::new();
    }
    encode_compact(runs).unwrap_or_else(|| encode_fixed(runs))
}

/// The fixed layout, which builds before the compact one wrote (and tests write as they did).
pub(crate) fn encode_fixed(runs: &[SegmentRun]) -> Vec<u8> {
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

/// `None` when a distance would be negative (runs out of order or inverted).
fn encode_compact(runs: &[SegmentRun]) -> Option<Vec<u8>> {
    let mut blob = Vec::with_capacity(1 + runs.len() * 8);
    blob.push(COMPACT_TAG);
    let (mut prev_offset, mut prev_byte) = (0u64, 0u64);
    for run in runs {
        put_varint(&mut blob, run.first_offset.checked_sub(prev_offset)?);
        put_varint(&mut blob, run.next_offset.checked_sub(run.first_offset)?);
        put_varint(&mut blob, run.byte_start.checked_sub(prev_byte)?);
        put_varint(&mut blob, run.byte_end.checked_sub(run.byte_start)?);
        (prev_offset, prev_byte) = (run.next_offset, run.byte_end);
    }
    if blob.len().is_multiple_of(RUN_SIZE_BYTES) {
        blob[0] = COMPACT_PADDED_TAG;
        blob.insert(1, 0);
    }
    Some(blob)
}

fn put_varint(blob: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        blob.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    blob.push(value as u8);
}

/// Unpacks a BLOB written by [`encode`] (either layout); `None` when it is neither (a damaged or
/// foreign database, never something this crate writes).
pub(crate) fn decode(blob: &[u8]) -> Option<Vec<SegmentRun>> {
    if blob.len().is_multiple_of(RUN_SIZE_BYTES) {
        return decode_fixed(blob);
    }
    let body = match blob {
        // A tag alone is never written: no runs is the empty BLOB.
        [COMPACT_TAG, body @ ..] if !body.is_empty() => body,
        [COMPACT_PADDED_TAG, 0, body @ ..] if !body.is_empty() => body,
        _ => return None,
    };
    decode_compact(body)
}

fn decode_fixed(blob: &[u8]) -> Option<Vec<SegmentRun>> {
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

fn decode_compact(body: &[u8]) -> Option<Vec<SegmentRun>> {
    let mut runs = Vec::new();
    let mut pos = 0;
    let (mut prev_offset, mut prev_byte) = (0u64, 0u64);
    while pos < body.len() {
        let first_offset = prev_offset.checked_add(take_varint(body, &mut pos)?)?;
        let next_offset = first_offset.checked_add(take_varint(body, &mut pos)?)?;
        let byte_start = prev_byte.checked_add(take_varint(body, &mut pos)?)?;
        let byte_end = byte_start.checked_add(take_varint(body, &mut pos)?)?;
        runs.push(SegmentRun {
            first_offset,
            next_offset,
            byte_start,
            byte_end,
        });
        (prev_offset, prev_byte) = (next_offset, byte_end);
    }
    Some(runs)
}

/// `None` on a truncated varint, one longer than a `u64` needs, or one past `u64::MAX`.
fn take_varint(body: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..VARINT_MAX_BYTES {
        let byte = *body.get(*pos)?;
        *pos += 1;
        let bits = u64::from(byte & 0x7f);
        let shift = 7 * i as u32;
        // The tenth byte may only carry the top bit of a u64.
        if shift == 63 && bits > 1 {
            return None;
        }
        value |= bits << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(first_offset: u64, next_offset: u64, byte_start: u64, byte_end: u64) -> SegmentRun {
        SegmentRun {
            first_offset,
            next_offset,
            byte_start,
            byte_end,
        }
    }

    #[test]
    fn round_trip() {
        let runs = vec![
            run(0, 3, 0, 96),
            run(7, 9, 200, 264),
            run(u64::MAX - 1, u64::MAX, u64::MAX - 7, u64::MAX),
        ];
        let blob = encode(&runs);
        assert_eq!(blob[0], COMPACT_TAG);
        assert_eq!(decode(&blob).unwrap(), runs);
        assert_eq!(decode(&encode_fixed(&runs)).unwrap(), runs);
        assert!(encode(&[]).is_empty());
        assert_eq!(decode(&[]).unwrap(), vec![]);
    }

    #[test]
    fn compact_runs_take_a_few_bytes_each() {
        // A stream's spans in a segment it shares with others: ~1 MiB apart, a few hundred
        // records each (what the engine commits once it coarsens at seal).
        let runs: Vec<SegmentRun> = (0..8u64)
            .map(|i| run(i * 256, (i + 1) * 256, i << 20, (i << 20) + 1_000_000))
            .collect();
        let blob = encode(&runs);
        assert!(blob.len() <= 1 + 8 * 9, "{} bytes", blob.len());
        assert_eq!(decode(&blob).unwrap(), runs);
    }

    #[test]
    fn a_compact_blob_never_has_a_fixed_length() {
        // Growing one distance by a byte at a time crosses every length class, including the
        // multiples of 32 that would read as the fixed layout without the padded tag.
        let mut padded = 0;
        for runs_count in 1..64u64 {
            // Runs of 4 to 13 bytes each.
            for length in [1u64, 200, 70_000, 1 << 30, 1 << 40, 1 << 50] {
                let runs: Vec<SegmentRun> = (0..runs_count)
                    .map(|i| run(i, i + 1, i * length, (i + 1) * length))
                    .collect();
                let blob = encode(&runs);
                assert_ne!(blob.len() % RUN_SIZE_BYTES, 0);
                padded += usize::from(blob[0] == COMPACT_PADDED_TAG);
                assert_eq!(decode(&blob).unwrap(), runs, "{runs_count} × {length}");
            }
        }
        assert!(padded > 0, "the padded tag was exercised");
    }

    #[test]
    fn runs_out_of_byte_order_fall_back_to_the_fixed_layout() {
        let runs = vec![run(0, 2, 500, 600), run(2, 3, 100, 200)];
        let blob = encode(&runs);
        assert_eq!(blob.len(), 2 * RUN_SIZE_BYTES);
        assert_eq!(decode(&blob).unwrap(), runs);
    }

    #[test]
    fn fixed_layout_is_little_endian_words() {
        let blob = encode_fixed(&[run(1, 2, 3, 4)]);
        assert_eq!(&blob[0..8], &1u64.to_le_bytes());
        assert_eq!(&blob[24..32], &4u64.to_le_bytes());
    }

    #[test]
    fn torn_or_foreign_blobs_are_rejected() {
        assert!(decode(&[0u8; 31]).is_none(), "neither layout");
        assert!(decode(&[0u8; 33]).is_none(), "neither layout");
        let blob = encode(&[run(0, 300, 0, 70_000)]);
        for cut in 1..blob.len() {
            if cut % RUN_SIZE_BYTES != 0 {
                assert!(decode(&blob[..cut]).is_none(), "cut at {cut}");
            }
        }
        // A varint past u64::MAX, and one of eleven bytes.
        let mut over = vec![COMPACT_TAG];
        over.extend_from_slice(&[0xff; 9]);
        over.push(0x02);
        assert!(decode(&over).is_none());
        let mut long = vec![COMPACT_TAG];
        long.extend_from_slice(&[0x80; 10]);
        long.push(0);
        assert!(decode(&long).is_none());
        // A distance that overflows the offset it is added to.
        let mut wrap = vec![COMPACT_TAG];
        put_varint(&mut wrap, u64::MAX);
        put_varint(&mut wrap, 1);
        put_varint(&mut wrap, 0);
        put_varint(&mut wrap, 0);
        assert!(decode(&wrap).is_none());
        assert!(decode(&[COMPACT_PADDED_TAG, 1, 0, 0, 0, 0]).is_none());
    }
}
