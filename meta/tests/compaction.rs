//! Compaction's catalog swap (`MetaStore::compact_segments`) on both backends: consecutive
//! segments become one entry under the first key with every run shifted and every state
//! merged, the others stay as rows without entries until the collector's time for them; a
//! repeat is answered as done; a catalog that changed meanwhile refuses it and is left as it
//! was; a swap whose COMMIT answer is lost (Postgres fault proxy) is answered as the database
//! has it, and a retry never merges twice; a cluster swap is fenced by the owner epochs.

use std::collections::HashMap;

use futures_lite::future::block_on;
use pico_meta::testing::PgDatabase;
use pico_meta::{
    CompactOutcome, CompactRequest, MetaError, MetaStore, MetaUrl, ProducerState, SegmentRecord,
    SegmentRun, SegmentStreamEntry, StreamConfig,
};
use pico_testkit::pg_proxy::{Fault, PgProxy};

fn wait<T>(reply: pico_meta::Reply<T>) -> Result<T, MetaError> {
    block_on(reply).expect("the metadata thread answers every command")
}

fn config() -> StreamConfig {
    StreamConfig {
        content_type: "text/plain".into(),
        ttl_sec: None,
        expires_at_ms: None,
        retention: Default::default(),
    }
}

fn run(first: u64, next: u64, start: u64, end: u64) -> SegmentRun {
    SegmentRun {
        first_offset: first,
        next_offset: next,
        byte_start: start,
        byte_end: end,
    }
}

fn entry(stream_id: u64, runs: Vec<SegmentRun>, ts: i64) -> SegmentStreamEntry {
    SegmentStreamEntry {
        stream_id,
        runs,
        last_timestamp_ms: ts,
        closed: false,
        producers: vec![],
        closed_by: None,
        writer_seq: None,
    }
}

fn producer(id: &str, epoch: u64, seq: u64) -> ProducerState {
    ProducerState {
        id: id.into(),
        epoch,
        seq,
    }
}

fn segment(key: &str, size: u64, streams: Vec<SegmentStreamEntry>) -> SegmentRecord {
    SegmentRecord {
        key: key.into(),
        size_bytes: size,
        created_ms: 10,
        streams,
    }
}

/// Streams `a` and `b`, and three segments of them: `s1` (150 B), `s2` (50 B), `s3` (30 B).
fn three_segments(store: &MetaStore) -> (u64, u64, Vec<SegmentRecord>) {
    let a = wait(store.create_stream("/a", config(), 1)).unwrap().row.id;
    let b = wait(store.create_stream("/b", config(), 1)).unwrap().row.id;
    let s1 = segment(
        "segments/s1",
        150,
        vec![
            SegmentStreamEntry {
                producers: vec![producer("p", 1, 4), producer("q", 1, 1)],
                ..entry(a, vec![run(0, 2, 0, 100)], 11)
            },
            entry(b, vec![run(0, 1, 100, 150)], 12),
        ],
    );
    let s2 = segment(
        "segments/s2",
        50,
        vec![SegmentStreamEntry {
            producers: vec![producer("p", 2, 0)],
            writer_seq: Some("w7".into()),
            ..entry(a, vec![run(2, 3, 0, 50)], 13)
        }],
    );
    let s3 = segment(
        "segments/s3",
        30,
        vec![SegmentStreamEntry {
            closed: true,
            ..entry(b, vec![run(1, 2, 0, 30)], 9)
        }],
    );
    for s in [&s1, &s2, &s3] {
        wait(store.commit_segment(s.clone())).unwrap();
    }
    (a, b, vec![s1, s2, s3])
}

fn request(segments: &[SegmentRecord], streams: &[u64]) -> CompactRequest {
    CompactRequest {
        olds: segments
            .iter()
            .map(|s| (s.key.clone(), s.size_bytes))
            .collect(),
        merged_key: "segments/m1".into(),
        streams: streams.iter().map(|id| (*id, 0)).collect(),
        node: None,
        retire_at_ms: 5_000,
        now_ms: 1_000,
    }
}

/// What the catalog holds after `three_segments` is compacted: the merged object in s1's
/// place in commit order, then the retired rows.
fn merged(a: u64, b: u64) -> Vec<SegmentRecord> {
    vec![
        SegmentRecord {
            key: "segments/m1".into(),
            size_bytes: 230,
            created_ms: 1_000,
            streams: vec![
                SegmentStreamEntry {
                    producers: vec![producer("p", 2, 0), producer("q", 1, 1)],
                    writer_seq: Some("w7".into()),
                    ..entry(a, vec![run(0, 2, 0, 100), run(2, 3, 150, 200)], 13)
                },
                SegmentStreamEntry {
                    closed: true,
                    ..entry(b, vec![run(0, 1, 100, 150), run(1, 2, 200, 230)], 12)
                },
            ],
        },
        SegmentRecord {
            created_ms: 5_000,
            ..segment("segments/s2", 50, vec![])
        },
        SegmentRecord {
            created_ms: 5_000,
            ..segment("segments/s3", 30, vec![])
        },
        SegmentRecord {
            created_ms: 5_000,
            ..segment("segments/s1", 150, vec![])
        },
    ]
}

fn catalog(url: &MetaUrl) -> Vec<SegmentRecord> {
    let (store, snapshot) = MetaStore::open(url).expect("open");
    store.shutdown();
    snapshot.segments
}

fn swap_merges_retires_and_is_idempotent(url: MetaUrl) {
    let (store, _) = MetaStore::open(&url).expect("open");
    let (a, b, segments) = three_segments(&store);
    let asked = request(&segments, &[a, b]);
    assert_eq!(
        wait(store.compact_segments(asked.clone())).unwrap(),
        CompactOutcome::Swapped
    );
    assert_eq!(
        wait(store.compact_segments(asked)).unwrap(),
        CompactOutcome::AlreadySwapped,
        "a repeat changes nothing"
    );
    // The retired rows are garbage only once their time is past.
    assert_eq!(
        wait(store.garbage_segments(5_000)).unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(
        wait(store.garbage_segments(5_001)).unwrap(),
        vec![
            "segments/s2".to_string(),
            "segments/s3".to_string(),
            "segments/s1".to_string()
        ]
    );
    store.shutdown();
    assert_eq!(catalog(&url), merged(a, b), "the same after a restart");
}

fn a_changed_catalog_refuses_the_swap_and_keeps_it(url: MetaUrl) {
    let (store, _) = MetaStore::open(&url).expect("open");
    let (a, b, segments) = three_segments(&store);
    let refused = |asked: CompactRequest, why: &str| match wait(store.compact_segments(asked)) {
        Ok(CompactOutcome::Refused(message)) => {
            assert!(message.contains(why), "{message:?} should say {why:?}")
        }
        other => panic!("{why}: {other:?}"),
    };
    let mut wrong_size = request(&segments, &[a, b]);
    wrong_size.olds[1].1 = 49;
    refused(wrong_size, "has 50 bytes");
    refused(request(&segments[..1], &[a, b]), "fewer than two");
    let mut reversed = request(&segments, &[a, b]);
    reversed.olds.reverse();
    refused(reversed, "commit order");
    refused(request(&segments, &[a]), "not held");
    let mut missing = request(&segments, &[a, b]);
    missing.olds.push(("segments/none".into(), 5));
    refused(missing, "not in the catalog");
    // Another writer's segment committed after s3, holding b, then one of a: s3 and s5
    // merged at s3's place would move s4's records of b after s3's.
    wait(store.commit_segment(segment(
        "segments/s4",
        10,
        vec![entry(b, vec![run(2, 3, 0, 10)], 20)],
    )))
    .unwrap();
    let s5 = segment(
        "segments/s5",
        10,
        vec![entry(a, vec![run(3, 4, 0, 10)], 21)],
    );
    wait(store.commit_segment(s5.clone())).unwrap();
    refused(
        request(&[segments[2].clone(), s5], &[a, b]),
        "committed between",
    );
    // The merged object never goes over one the catalog names.
    let mut taken = request(&segments, &[a, b]);
    taken.merged_key = "segments/s4".into();
    refused(taken, "already");
    store.shutdown();
    let after = catalog(&url);
    assert_eq!(after[..3], segments[..], "nothing changed");
}

mod sqlite {
    fn url() -> (tempfile::TempDir, pico_meta::MetaUrl) {
        let dir = tempfile::tempdir().unwrap();
        let url = pico_meta::MetaUrl::SqliteFile(dir.path().join("meta.db"));
        (dir, url)
    }

    #[test]
    fn swap_merges_retires_and_is_idempotent() {
        let (_dir, url) = url();
        super::swap_merges_retires_and_is_idempotent(url);
    }

    #[test]
    fn a_changed_catalog_refuses_the_swap_and_keeps_it() {
        let (_dir, url) = url();
        super::a_changed_catalog_refuses_the_swap_and_keeps_it(url);
    }
}

mod postgres {
    use super::*;

    #[test]
    #[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
    fn swap_merges_retires_and_is_idempotent() {
        if let Some(db) = PgDatabase::create("compact_swap") {
            super::swap_merges_retires_and_is_idempotent(db.meta_url());
        }
    }

    #[test]
    #[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
    fn a_changed_catalog_refuses_the_swap_and_keeps_it() {
        if let Some(db) = PgDatabase::create("compact_refused") {
            super::a_changed_catalog_refuses_the_swap_and_keeps_it(db.meta_url());
        }
    }

    /// The swap's COMMIT answer is lost: the store answers as the database has it (asking the
    /// server), and a retry, whatever the first answer was, leaves one merge.
    #[test]
    #[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
    fn a_swap_whose_commit_answer_was_lost_is_answered_as_the_database_has_it() {
        let Some(database) = PgDatabase::create("compact_lost_commit") else {
            return;
        };
        let (proxy, proxied) = PgProxy::in_front_of(database.url()).expect("proxy");
        let url = MetaUrl::Postgres(proxied);
        let (store, _) = MetaStore::open(&url).expect("open");
        let (a, b, segments) = three_segments(&store);
        let asked = request(&segments, &[a, b]);
        proxy.inject(Fault::LoseCommitAnswerAfter("INSERT INTO segments"));
        let first = wait(store.compact_segments(asked.clone()));
        assert_eq!(proxy.armed_losses(), 0, "the fault hit the swap");
        let in_database = database
            .query("SELECT size_bytes::text FROM segments WHERE key = 'segments/m1'")
            .into_iter()
            .map(|mut row| row.remove(0))
            .collect::<Vec<_>>();
        match &first {
            Ok(CompactOutcome::Swapped) => {
                assert_eq!(in_database, vec![Some("230".to_string())])
            }
            Err(MetaError::Unknown(_)) => {}
            other => panic!("the swap committed; answered {other:?}"),
        }
        let again = wait(store.compact_segments(asked)).unwrap();
        assert_eq!(again, CompactOutcome::AlreadySwapped);
        store.shutdown();
        let direct = database.meta_url();
        assert_eq!(catalog(&direct), merged(a, b));
    }

    /// A cluster swap names the node and each stream's owner epoch: a stream taken over (its
    /// epoch moved on) refuses it.
    #[test]
    #[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
    fn a_cluster_swap_is_fenced_by_the_owner_epochs() {
        let Some(database) = PgDatabase::create("compact_fenced") else {
            return;
        };
        let url = database.meta_url();
        let (store, _) = MetaStore::open(&url).expect("open");
        let node = 1;
        wait(store.register_node(node, 1, "http://127.0.0.1:1", 1, 60_000)).unwrap();
        let a = wait(store.create_stream_owned("/a", config(), false, None, 1, Some(node)))
            .unwrap()
            .row
            .id;
        let s1 = segment("segments/c1", 10, vec![entry(a, vec![run(0, 1, 0, 10)], 1)]);
        let s2 = segment("segments/c2", 10, vec![entry(a, vec![run(1, 2, 0, 10)], 2)]);
        for s in [&s1, &s2] {
            wait(store.commit_segment(s.clone())).unwrap();
        }
        let mut asked = request(&[s1.clone(), s2.clone()], &[a]);
        asked.node = Some((node, 1));
        asked.streams = HashMap::from([(a, 2)]);
        match wait(store.compact_segments(asked.clone())).unwrap() {
            CompactOutcome::Refused(why) => assert!(why.contains("epoch"), "{why}"),
            other => panic!("a stale epoch swapped: {other:?}"),
        }
        asked.node = Some((node, 2));
        asked.streams = HashMap::from([(a, 1)]);
        assert!(matches!(
            wait(store.compact_segments(asked.clone())).unwrap(),
            CompactOutcome::Refused(_)
        ));
        asked.node = Some((node, 1));
        assert_eq!(
            wait(store.compact_segments(asked)).unwrap(),
            CompactOutcome::Swapped
        );
        store.shutdown();
        let segments = catalog(&url);
        assert_eq!(segments[0].size_bytes, 20);
        assert_eq!(
            segments[0].streams[0].runs,
            vec![run(0, 1, 0, 10), run(1, 2, 10, 20)]
        );
        assert!(segments[1].streams.is_empty());
    }
}
