//! Unit tests of the shard's pure parts.

use super::stream::{coarsen, Chunk};
fn chunk(
    first_offset: u64,
    next_offset: u64,
    segment: u64,
    byte_start: u64,
    byte_end: u64,
) -> Chunk {
    Chunk {
        first_offset,
        next_offset,
        segment,
        byte_start,
        byte_end,
        last_timestamp_ms: 0,
    }
}

#[test]
fn coarsen_merges_within_a_segment_and_a_span() {
    let mut chunks = vec![
        chunk(0, 2, 0, 0, 100),
        chunk(2, 3, 1, 0, 50),
        chunk(3, 5, 1, 200, 300),
        chunk(5, 6, 1, 900_000, 1_100_000),
        chunk(6, 7, 2, 0, 10),
    ];
    coarsen(&mut chunks, Some(1));
    let spans: Vec<_> = chunks
        .iter()
        .map(|c| (c.first_offset, c.next_offset, c.segment))
        .collect();
    assert_eq!(spans, vec![(0, 2, 0), (2, 5, 1), (5, 6, 1), (6, 7, 2)]);
    assert_eq!((chunks[1].byte_start, chunks[1].byte_end), (0, 300));
    coarsen(&mut chunks, None);
    assert_eq!(
        chunks.len(),
        4,
        "a merge never crosses segments or the span limit"
    );
}
