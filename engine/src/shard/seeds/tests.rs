use pico_meta::{
    ForkRow, SegmentRecord, SegmentRun, SegmentStreamEntry, StreamConfig as MetaConfig, StreamRow,
};

use super::*;

fn row(id: u64, fork_of: Option<u64>) -> StreamRow {
    StreamRow {
        id,
        name: format!("/s/{id}"),
        config: MetaConfig {
            content_type: "text/plain".into(),
            ttl_sec: None,
            expires_at_ms: None,
            retention: Default::default(),
        },
        closed: false,
        created_ms: 1,
        start_offset: 0,
        last_access_ms: 1,
        fork: fork_of.map(|source_id| ForkRow {
            source: format!("/s/{source_id}"),
            source_id,
            offset: 2,
            partial_bytes: 0,
        }),
        soft_deleted: false,
    }
}

fn run(first_offset: u64, next_offset: u64) -> SegmentRun {
    SegmentRun {
        first_offset,
        next_offset,
        byte_start: 0,
        byte_end: 100,
    }
}

fn segment(key: &str, entry: SegmentStreamEntry) -> SegmentRecord {
    SegmentRecord {
        key: key.into(),
        size_bytes: 100,
        created_ms: 1,
        streams: vec![entry],
    }
}

fn entry(stream_id: u64, runs: Vec<SegmentRun>, last_timestamp_ms: i64) -> SegmentStreamEntry {
    SegmentStreamEntry {
        stream_id,
        runs,
        last_timestamp_ms,
        closed: false,
        producers: Vec::new(),
        closed_by: None,
        writer_seq: None,
    }
}

#[test]
fn fork_depths_follow_chains_and_stop_at_a_missing_source() {
    // 1 <- 2 <- 3, and 4 forked from 99, which the snapshot does not hold.
    let snapshot = Snapshot {
        streams: vec![
            row(1, None),
            row(2, Some(1)),
            row(3, Some(2)),
            row(4, Some(99)),
        ],
        segments: Vec::new(),
        ..Default::default()
    };
    let depths = fork_depths(&snapshot);
    assert_eq!(depths.get(&1), None, "a plain stream has no depth");
    assert_eq!(depths[&2], 1);
    assert_eq!(depths[&3], 2);
    assert_eq!(depths[&4], 1);
    let seeds = stream_seeds(&snapshot);
    let one = seeds.iter().find(|s| s.id == 1).unwrap();
    assert_eq!(one.fork_refs, 1, "stream 1 has one fork");
    let three = seeds.iter().find(|s| s.id == 3).unwrap();
    assert_eq!(three.fork.as_ref().map(|f| f.depth), Some(2));
}

#[test]
fn seeds_gather_runs_in_offset_order_and_keep_the_tail_above_a_trim() {
    let mut closing = entry(7, vec![run(3, 5)], 30);
    closing.closed = true;
    let snapshot = Snapshot {
        streams: vec![row(7, None), row(8, None)],
        segments: vec![
            // Committed out of offset order (another core's segment first).
            segment("segments/b.seg", closing),
            segment("segments/a.seg", entry(7, vec![run(0, 3)], 20)),
            // A deleted stream's entry: no seed.
            segment("segments/c.seg", entry(9, vec![run(0, 1)], 5)),
        ],
        ..Default::default()
    };
    let mut trimmed = snapshot.clone();
    trimmed.streams[1].start_offset = 12;
    for snapshot in [snapshot, trimmed] {
        let seeds = stream_seeds(&snapshot);
        assert_eq!(seeds.len(), 2);
        let seven = seeds.iter().find(|s| s.id == 7).unwrap();
        let keys: Vec<&str> = seven.runs.iter().map(|r| &*r.0).collect();
        assert_eq!(keys, ["segments/a.seg", "segments/b.seg"]);
        assert_eq!(seven.next_offset, 5);
        assert_eq!(seven.last_timestamp_ms, 30);
        assert!(seven.closed);
        // Stream 8 has no segment left: its tail is its start (a trim's point, if any).
        let eight = seeds.iter().find(|s| s.id == 8).unwrap();
        assert_eq!(eight.next_offset, eight.start_offset);
    }
}

#[test]
fn seeds_go_to_the_core_their_name_is_placed_on_with_their_own_runs() {
    // Rows out of id order (a Postgres scan need not sort them), spread over three cores.
    let snapshot = Snapshot {
        streams: vec![row(30, None), row(10, None), row(20, Some(10))],
        segments: vec![
            segment("segments/a.seg", entry(20, vec![run(2, 6)], 9)),
            segment("segments/b.seg", entry(10, vec![run(0, 4)], 7)),
            segment("segments/c.seg", entry(30, vec![run(0, 1)], 8)),
        ],
        ..Default::default()
    };
    let place = |name: &str| match name {
        "/s/10" => 2,
        "/s/20" => 0,
        _ => 1,
    };
    let mut taken = snapshot.clone();
    let per_core = stream_seeds_by_core(&mut taken, 3, place);
    assert!(taken.streams.is_empty(), "the rows moved into the seeds");
    assert_eq!(taken.segments, snapshot.segments, "the segments stay");
    let ids: Vec<Vec<u64>> = per_core
        .iter()
        .map(|seeds| seeds.iter().map(|s| s.id).collect())
        .collect();
    assert_eq!(ids, [vec![20], vec![30], vec![10]]);
    for seeds in &per_core {
        let seed = &seeds[0];
        let expected = match seed.id {
            10 => ("segments/b.seg", 4, 7, 1),
            20 => ("segments/a.seg", 6, 9, 0),
            _ => ("segments/c.seg", 1, 8, 0),
        };
        assert_eq!(seed.runs.len(), 1);
        assert_eq!(
            (
                &*seed.runs[0].0,
                seed.next_offset,
                seed.last_timestamp_ms,
                seed.fork_refs
            ),
            expected,
            "stream {}",
            seed.id
        );
    }
    // The one-core form gives the same seeds.
    let all = stream_seeds(&snapshot);
    assert_eq!(all.len(), 3);
}
