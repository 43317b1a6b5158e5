//! The metadata store against a real SQLite file: registry semantics, id allocation across
//! restarts, trimming, the segment catalog round trip (producer state included), group commit
//! under concurrency, shutdown.

use std::path::Path;
use std::path::PathBuf;

use futures_lite::future::block_on;
use pico_meta::MetaError;
use pico_meta::MetaStore;
use pico_meta::MetaUrl;
use pico_meta::ProducerState;
use pico_meta::SegmentRecord;
use pico_meta::SegmentRun;
use pico_meta::SegmentStreamEntry;
use pico_meta::Snapshot;
use pico_meta::StreamConfig;

fn db_path(dir: &Path) -> PathBuf {
    dir.join("data").join("meta.db")
}

fn open(path: &Path) -> (MetaStore, Snapshot) {
    MetaStore::open(&MetaUrl::SqliteFile(path.to_path_buf())).expect("open metadata store")
}

fn reopen_snapshot(path: &Path) -> Snapshot {
    let (store, snapshot) = open(path);
    store.shutdown();
    snapshot
}

fn config(content_type: &str) -> StreamConfig {
    StreamConfig {
        content_type: content_type.into(),
        ttl_sec: None,
        expires_at_ms: None,
        closed: false,
    }
}

/// Awaits a reply: the outer error would mean the thread dropped the answer, which it never may.
fn wait<T>(reply: pico_meta::Reply<T>) -> Result<T, MetaError> {
    block_on(reply).expect("the metadata thread answers every command")
}

fn run(first: u64, next: u64, start: u64, end: u64) -> SegmentRun {
    SegmentRun {
        first_offset: first,
        next_offset: next,
        byte_start: start,
        byte_end: end,
    }
}

fn entry(
    stream_id: u64,
    runs: Vec<SegmentRun>,
    last_timestamp_ms: i64,
    closed: bool,
) -> SegmentStreamEntry {
    SegmentStreamEntry {
        stream_id,
        runs,
        last_timestamp_ms,
        closed,
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

#[test]
fn create_duplicate_delete_recreate() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let (store, snapshot) = open(&path);
    assert_eq!(snapshot, Snapshot::default());
    assert!(path.exists(), "the parent directory is created");

    let json = StreamConfig {
        content_type: "application/json; charset=utf-8".into(),
        ttl_sec: Some(60),
        expires_at_ms: Some(1_900_000_000_000),
        closed: false,
    };
    let first = wait(store.create_stream("/streams/orders", json.clone(), 1_000)).unwrap();
    assert!(first.created);
    assert_eq!(first.row.name, "/streams/orders");
    assert_eq!(first.row.config, json);
    assert_eq!(first.row.created_ms, 1_000);
    assert_eq!(first.row.start_offset, 0);

    // Same name again: the existing row comes back untouched, whatever the new config says.
    let again = wait(store.create_stream("/streams/orders", config("text/plain"), 2_000)).unwrap();
    assert!(!again.created);
    assert_eq!(again.row, first.row);

    let other = wait(store.create_stream("/streams/other", config("text/plain"), 3_000)).unwrap();
    assert!(other.created);
    assert_ne!(other.row.id, first.row.id);

    assert!(wait(store.delete_stream(first.row.id)).unwrap());
    assert!(
        !wait(store.delete_stream(first.row.id)).unwrap(),
        "second delete finds nothing"
    );
    assert!(!wait(store.delete_stream(9_999)).unwrap());
    assert!(!wait(store.delete_stream(u64::MAX)).unwrap());

    let recreated =
        wait(store.create_stream("/streams/orders", config("text/plain"), 4_000)).unwrap();
    assert!(recreated.created);
    assert!(
        recreated.row.id > other.row.id,
        "a recreated name gets a fresh id"
    );
    assert_eq!(recreated.row.config, config("text/plain"));
    store.shutdown();

    let mut streams = reopen_snapshot(&path).streams;
    streams.sort_by_key(|row| row.id);
    assert_eq!(streams, vec![other.row, recreated.row]);
}

#[test]
fn ids_are_never_reused_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let (store, _) = open(&path);
    let a = wait(store.create_stream("/a", config("text/plain"), 1))
        .unwrap()
        .row;
    let b = wait(store.create_stream("/b", config("text/plain"), 1))
        .unwrap()
        .row;
    // Deleting the highest id is the case where plain SQLite rowids would be handed out again.
    assert!(wait(store.delete_stream(b.id)).unwrap());
    store.shutdown();

    let (store, snapshot) = open(&path);
    assert_eq!(snapshot.streams, vec![a.clone()]);
    let c = wait(store.create_stream("/b", config("text/plain"), 2))
        .unwrap()
        .row;
    assert!(c.id > b.id, "id {} reused after {}", c.id, b.id);
    store.shutdown();
}

#[test]
fn close_is_persistent_and_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let (store, _) = open(&path);
    let row = wait(store.create_stream("/s", config("application/octet-stream"), 5))
        .unwrap()
        .row;
    wait(store.close_stream(row.id)).unwrap();
    wait(store.close_stream(row.id)).unwrap();
    wait(store.close_stream(123_456)).unwrap();
    wait(store.close_stream(u64::MAX)).unwrap();
    // A duplicate create reports the stored (closed) config.
    let again = wait(store.create_stream("/s", config("application/octet-stream"), 6)).unwrap();
    assert!(!again.created);
    assert!(again.row.config.closed);
    store.shutdown();

    let snapshot = reopen_snapshot(&path);
    assert_eq!(snapshot.streams.len(), 1);
    assert!(snapshot.streams[0].config.closed);
}

#[test]
fn trim_only_raises_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let (store, _) = open(&path);
    let row = wait(store.create_stream("/s", config("text/plain"), 1))
        .unwrap()
        .row;
    let other = wait(store.create_stream("/other", config("text/plain"), 1))
        .unwrap()
        .row;
    assert_eq!(row.start_offset, 0);

    wait(store.trim_stream(row.id, 10)).unwrap();
    wait(store.trim_stream(row.id, 10)).unwrap(); // idempotent
    wait(store.trim_stream(row.id, 4)).unwrap(); // a lower trim is no trim
    wait(store.trim_stream(row.id, 0)).unwrap();
    // Unknown ids are fine, as for close.
    wait(store.trim_stream(987_654, 5)).unwrap();
    wait(store.trim_stream(u64::MAX, 5)).unwrap();
    // An offset SQLite cannot hold is refused, and changes nothing.
    match wait(store.trim_stream(row.id, u64::MAX)) {
        Err(MetaError::Storage(message)) => assert!(message.contains("trim"), "{message}"),
        other => panic!("an unstorable offset was accepted: {other:?}"),
    }
    // A duplicate create reports the stored start.
    let again = wait(store.create_stream("/s", config("text/plain"), 2)).unwrap();
    assert!(!again.created);
    assert_eq!(again.row.start_offset, 10);
    store.shutdown();

    let (store, snapshot) = open(&path);
    let starts: Vec<_> = snapshot
        .streams
        .iter()
        .map(|stream| (stream.id, stream.start_offset))
        .collect();
    assert_eq!(starts, [(row.id, 10), (other.id, 0)]);

    // Trims queued together (one batch, most likely) still end at the largest.
    let replies: Vec<_> = [30, 20, i64::MAX as u64, 25]
        .into_iter()
        .map(|offset| store.trim_stream(other.id, offset))
        .collect();
    replies.into_iter().for_each(|reply| wait(reply).unwrap());
    store.shutdown();
    let snapshot = reopen_snapshot(&path);
    assert_eq!(snapshot.streams[1].start_offset, i64::MAX as u64);
    assert_eq!(snapshot.streams[0].start_offset, 10);
}

#[test]
fn producer_state_round_trips_through_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let (store, _) = open(&path);
    let with_producers = SegmentStreamEntry {
        producers: vec![
            producer("", 0, 0),
            producer("client-a", 2, 17),
            producer("client-b", u64::MAX, u64::MAX),
            producer("ζ-unicode", 1, 1),
        ],
        closed_by: Some(producer("client-a", 2, 18)),
        writer_seq: Some("0042".into()),
        ..entry(1, vec![run(0, 3, 0, 90)], 100, true)
    };
    let closed_without_producer = entry(2, vec![run(0, 1, 90, 100)], 101, true);
    let only_closed_by = SegmentStreamEntry {
        closed_by: Some(producer("solo", 0, 0)),
        ..entry(3, vec![], 102, true)
    };
    let segment = SegmentRecord {
        key: "segments/producers.seg".into(),
        size_bytes: 100,
        created_ms: 5,
        streams: vec![
            with_producers.clone(),
            closed_without_producer,
            only_closed_by,
        ],
    };
    wait(store.commit_segment(segment.clone())).unwrap();
    store.shutdown();
    assert_eq!(reopen_snapshot(&path).segments, vec![segment.clone()]);

    // A re-commit replaces the producer state too, including clearing it.
    let (store, _) = open(&path);
    let replaced = SegmentRecord {
        streams: vec![SegmentStreamEntry {
            producers: vec![],
            closed_by: None,
            writer_seq: None,
            ..with_producers
        }],
        ..segment
    };
    wait(store.commit_segment(replaced.clone())).unwrap();
    store.shutdown();
    assert_eq!(reopen_snapshot(&path).segments, vec![replaced]);
}

#[test]
fn damaged_producer_state_is_an_error_naming_the_segment() {
    for (column, damage) in [
        ("producers", &[3u8, 0, b'a'][..]), // a record cut short
        ("closed_by", &[][..]),             // present but empty
        ("closed_by", &[0u8; 17][..]),      // one byte short of a record
    ] {
        assert_damaged_entry_is_refused(column, rusqlite::types::Value::Blob(damage.to_vec()));
    }
    // Not a BLOB at all.
    assert_damaged_entry_is_refused("producers", rusqlite::types::Value::Text("p".into()));
    assert_damaged_entry_is_refused("closed_by", rusqlite::types::Value::Integer(7));
}

/// Commits one segment, overwrites `column` of its entry with `damage` behind the store's back,
/// and checks that opening fails with an error naming the segment.
fn assert_damaged_entry_is_refused(column: &str, damage: rusqlite::types::Value) {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let (store, _) = open(&path);
    let segment = SegmentRecord {
        key: "segments/damaged.seg".into(),
        size_bytes: 10,
        created_ms: 1,
        streams: vec![SegmentStreamEntry {
            producers: vec![producer("p", 1, 1)],
            ..entry(4, vec![run(0, 1, 0, 10)], 1, false)
        }],
    };
    wait(store.commit_segment(segment)).unwrap();
    store.shutdown();

    let conn = rusqlite::Connection::open(&path).unwrap();
    let sql = format!("UPDATE segment_streams SET {column} = ?1");
    assert_eq!(conn.execute(&sql, [&damage]).unwrap(), 1);
    drop(conn);

    match MetaStore::open(&MetaUrl::SqliteFile(path)) {
        Err(MetaError::Storage(message)) => {
            assert!(message.contains("segments/damaged.seg"), "{message}");
            if let rusqlite::types::Value::Blob(_) = damage {
                assert!(message.contains(&format!("damaged {column}")), "{message}");
            }
        }
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("damaged {column} ({damage:?}) was loaded"),
    }
}

#[test]
fn segments_round_trip_in_commit_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let (store, _) = open(&path);
    let a = wait(store.create_stream("/a", config("text/plain"), 1))
        .unwrap()
        .row;
    let b = wait(store.create_stream("/b", config("text/plain"), 1))
        .unwrap()
        .row;

    // Keys deliberately not in lexical order: the snapshot must follow commit order.
    let first = SegmentRecord {
        key: "segments/0003.seg".into(),
        size_bytes: 1_000,
        created_ms: 10,
        streams: vec![
            entry(
                b.id,
                vec![run(0, 2, 0, 100), run(2, 5, 400, 700)],
                11,
                false,
            ),
            entry(a.id, vec![run(0, 1, 100, 400)], 12, true),
        ],
    };
    let second = SegmentRecord {
        key: "segments/0001.seg".into(),
        size_bytes: 64,
        created_ms: 20,
        streams: vec![entry(a.id, vec![], 13, false)],
    };
    let third = SegmentRecord {
        key: "segments/0002.seg".into(),
        size_bytes: 0,
        created_ms: 30,
        streams: vec![],
    };
    for segment in [&first, &second, &third] {
        wait(store.commit_segment(segment.clone())).unwrap();
    }
    // Entries of a deleted stream are accepted and kept, but the stream stays deleted.
    assert!(wait(store.delete_stream(a.id)).unwrap());
    let fourth = SegmentRecord {
        key: "segments/0000.seg".into(),
        size_bytes: 200,
        created_ms: 40,
        streams: vec![entry(a.id, vec![run(1, 2, 0, 200)], 14, false)],
    };
    wait(store.commit_segment(fourth.clone())).unwrap();
    store.shutdown();

    let snapshot = reopen_snapshot(&path);
    assert_eq!(snapshot.streams, vec![b.clone()]);
    assert_eq!(
        snapshot.segments,
        vec![first.clone(), second.clone(), third.clone(), fourth.clone()]
    );

    // Re-committing a key replaces its contents in place (commit order unchanged).
    let (store, _) = open(&path);
    let second_again = SegmentRecord {
        size_bytes: 128,
        streams: vec![entry(b.id, vec![run(5, 6, 64, 128)], 15, true)],
        ..second.clone()
    };
    wait(store.commit_segment(second_again.clone())).unwrap();
    wait(store.commit_segment(second_again.clone())).unwrap();
    store.shutdown();
    let snapshot = reopen_snapshot(&path);
    assert_eq!(snapshot.segments, vec![first, second_again, third, fourth]);
}

#[test]
fn a_bad_command_does_not_poison_its_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let (store, _) = open(&path);
    let good = |key: &str| SegmentRecord {
        key: key.into(),
        size_bytes: 10,
        created_ms: 1,
        streams: vec![entry(7, vec![run(0, 1, 0, 10)], 1, false)],
    };
    let bad_records = [
        SegmentRecord {
            key: "past-end".into(),
            streams: vec![entry(7, vec![run(0, 1, 0, 11)], 1, false)],
            ..good("")
        },
        SegmentRecord {
            key: "inverted".into(),
            streams: vec![entry(7, vec![run(2, 1, 0, 1)], 1, false)],
            ..good("")
        },
        SegmentRecord {
            key: "overlap".into(),
            streams: vec![entry(7, vec![run(0, 2, 0, 1), run(1, 3, 1, 2)], 1, false)],
            ..good("")
        },
        SegmentRecord {
            key: "twice".into(),
            streams: vec![entry(7, vec![], 1, false), entry(7, vec![], 1, false)],
            ..good("")
        },
        SegmentRecord {
            key: "producers-unsorted".into(),
            streams: vec![SegmentStreamEntry {
                producers: vec![producer("b", 0, 0), producer("a", 0, 0)],
                ..entry(7, vec![], 1, false)
            }],
            ..good("")
        },
        SegmentRecord {
            key: "producer-twice".into(),
            streams: vec![SegmentStreamEntry {
                producers: vec![producer("a", 0, 0), producer("a", 1, 0)],
                ..entry(7, vec![], 1, false)
            }],
            ..good("")
        },
        SegmentRecord {
            key: "producer-id-too-long".into(),
            streams: vec![SegmentStreamEntry {
                producers: vec![producer(&"p".repeat(65_536), 0, 0)],
                ..entry(7, vec![], 1, false)
            }],
            ..good("")
        },
        SegmentRecord {
            key: "closed-by-id-too-long".into(),
            streams: vec![SegmentStreamEntry {
                closed_by: Some(producer(&"p".repeat(65_536), 0, 0)),
                ..entry(7, vec![], 1, true)
            }],
            ..good("")
        },
        good(""),
    ];
    // Queue everything before awaiting anything, so the commands share batches.
    let mut replies = vec![store.commit_segment(good("ok/1"))];
    let created = store.create_stream("/x", config("text/plain"), 1);
    for bad in bad_records.iter().cloned() {
        replies.push(store.commit_segment(bad));
    }
    replies.push(store.commit_segment(good("ok/2")));

    let results: Vec<_> = replies.into_iter().map(wait).collect();
    assert!(results[0].is_ok());
    for (result, bad) in results[1..=bad_records.len()].iter().zip(&bad_records) {
        match result {
            Err(MetaError::Storage(message)) => assert!(message.contains("segment"), "{message}"),
            other => panic!("{:?} was accepted: {other:?}", bad.key),
        }
    }
    assert!(results.last().unwrap().is_ok());
    assert!(wait(created).unwrap().created);
    store.shutdown();

    let snapshot = reopen_snapshot(&path);
    let keys: Vec<_> = snapshot
        .segments
        .iter()
        .map(|segment| segment.key.as_str())
        .collect();
    assert_eq!(keys, ["ok/1", "ok/2"]);
    assert_eq!(snapshot.streams.len(), 1);
}

#[test]
fn group_commit_answers_every_concurrent_call() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 250;
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let (store, _) = open(&path);

    let workers: Vec<_> = (0..THREADS)
        .map(|thread| {
            let store = store.clone();
            std::thread::spawn(move || {
                // Fire every request first, then await: that is what fills batches.
                let replies: Vec<_> = (0..PER_THREAD)
                    .map(|i| {
                        store.create_stream(
                            &format!("/t{thread}/s{i}"),
                            config("text/plain"),
                            i as i64,
                        )
                    })
                    .collect();
                let segments: Vec<_> = (0..PER_THREAD / 10)
                    .map(|i| {
                        store.commit_segment(SegmentRecord {
                            key: format!("segments/t{thread}-{i:04}"),
                            size_bytes: 1,
                            created_ms: i as i64,
                            streams: vec![entry(i as u64 + 1, vec![run(0, 1, 0, 1)], 0, false)],
                        })
                    })
                    .collect();
                let ids: Vec<u64> = replies
                    .into_iter()
                    .map(|reply| wait(reply).unwrap().row.id)
                    .collect();
                segments.into_iter().for_each(|reply| wait(reply).unwrap());
                ids
            })
        })
        .collect();
    let mut ids: Vec<u64> = workers
        .into_iter()
        .flat_map(|worker| worker.join().unwrap())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ids.len(),
        THREADS * PER_THREAD,
        "every create got its own id"
    );
    drop(store); // the last handle: shuts the thread down after the queue

    let snapshot = reopen_snapshot(&path);
    assert_eq!(snapshot.streams.len(), THREADS * PER_THREAD);
    assert_eq!(snapshot.segments.len(), THREADS * (PER_THREAD / 10));
    // Per thread, segments appear in the order that thread committed them.
    for thread in 0..THREADS {
        let prefix = format!("segments/t{thread}-");
        let keys: Vec<_> = snapshot
            .segments
            .iter()
            .filter(|s| s.key.starts_with(&prefix))
            .map(|s| s.key.clone())
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }
}

#[test]
fn dropping_the_last_handle_finishes_queued_work() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let (store, _) = open(&path);
    let replies: Vec<_> = (0..50)
        .map(|i| store.create_stream(&format!("/s{i}"), config("text/plain"), 0))
        .collect();
    drop(store);
    for reply in replies {
        assert!(wait(reply).unwrap().created);
    }
    assert_eq!(reopen_snapshot(&path).streams.len(), 50);
}

#[test]
fn calls_after_shutdown_answer_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = open(&db_path(dir.path()));
    let clone = store.clone();
    let queued = store.create_stream("/before", config("text/plain"), 0);
    store.shutdown();
    store.shutdown(); // idempotent
    assert!(
        wait(queued).unwrap().created,
        "work queued before shutdown is finished"
    );
    assert!(matches!(
        wait(clone.create_stream("/after", config("text/plain"), 0)),
        Err(MetaError::Closed)
    ));
    assert!(matches!(
        wait(clone.delete_stream(1)),
        Err(MetaError::Closed)
    ));
    assert!(matches!(
        wait(clone.close_stream(1)),
        Err(MetaError::Closed)
    ));
    assert!(matches!(
        wait(clone.trim_stream(1, 1)),
        Err(MetaError::Closed)
    ));
}

#[test]
fn in_memory_store_works() {
    let (store, snapshot) = MetaStore::open(&MetaUrl::parse("sqlite::memory:").unwrap()).unwrap();
    assert_eq!(snapshot, Snapshot::default());
    let outcome = wait(store.create_stream("/m", config("text/plain"), 0)).unwrap();
    assert!(outcome.created);
    assert_eq!(outcome.row.id, 1);
    store.shutdown();
}

#[test]
fn file_database_is_durable_wal_and_refuses_a_newer_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let (store, _) = open(&path);
    store.shutdown();

    let conn = rusqlite::Connection::open(&path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    conn.execute("INSERT INTO schema_version (version) VALUES (99)", [])
        .unwrap();
    drop(conn);

    match MetaStore::open(&MetaUrl::SqliteFile(path)) {
        Err(MetaError::Storage(message)) => {
            assert!(message.contains("schema version 99"), "{message}")
        }
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a newer schema was opened"),
    }
}

#[test]
fn an_unwritable_location_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"not a directory").unwrap();
    match MetaStore::open(&MetaUrl::SqliteFile(blocker.join("meta.db"))) {
        Err(MetaError::Storage(message)) => assert!(message.contains("file"), "{message}"),
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("opened below a regular file"),
    }
}

#[test]
fn touch_only_moves_the_idle_clock_forward_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let (store, _) = open(&path);
    let row = wait(store.create_stream("/ttl", config("text/plain"), 1_000))
        .unwrap()
        .row;
    assert_eq!(
        row.last_access_ms, 1_000,
        "a new stream's idle clock starts at its creation"
    );
    wait(store.touch_stream(row.id, 5_000)).unwrap();
    wait(store.touch_stream(row.id, 3_000)).unwrap(); // older: ignored
    wait(store.touch_stream(987_654, 9_000)).unwrap(); // unknown id: fine
    store.shutdown();
    let snapshot = reopen_snapshot(&path);
    assert_eq!(snapshot.streams.len(), 1);
    assert_eq!(snapshot.streams[0].last_access_ms, 5_000);
}

#[test]
fn garbage_is_what_no_live_stream_needs_and_drop_forgets_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let (store, _) = open(&path);
    let gone = wait(store.create_stream("/gone", config("text/plain"), 1))
        .unwrap()
        .row;
    let kept = wait(store.create_stream("/kept", config("text/plain"), 1))
        .unwrap()
        .row;
    let segment = |key: &str, created_ms: i64, streams: Vec<SegmentStreamEntry>| SegmentRecord {
        key: key.into(),
        size_bytes: 100,
        created_ms,
        streams,
    };
    let mut with_producer = entry(kept.id, vec![run(0, 2, 0, 100)], 1, false);
    with_producer.producers = vec![producer("p", 0, 0)];
    let segments = [
        segment(
            "segments/deleted.seg",
            10,
            vec![entry(gone.id, vec![run(0, 5, 0, 100)], 1, false)],
        ),
        segment(
            "segments/trimmed.seg",
            10,
            vec![entry(kept.id, vec![run(0, 2, 0, 100)], 1, false)],
        ),
        segment("segments/producer.seg", 10, vec![with_producer]),
        segment(
            "segments/readable.seg",
            10,
            vec![entry(kept.id, vec![run(2, 9, 0, 100)], 1, false)],
        ),
        segment(
            "segments/too-new.seg",
            500,
            vec![entry(gone.id, vec![run(5, 6, 0, 100)], 1, false)],
        ),
    ];
    for record in segments {
        wait(store.commit_segment(record)).unwrap();
    }
    assert!(wait(store.delete_stream(gone.id)).unwrap());
    // /kept is trimmed to 4: the first segment of it holds nothing readable any more.
    let live = std::collections::HashMap::from([(kept.id, 4u64)]);
    let mut garbage = wait(store.garbage_segments(live, 100)).unwrap();
    garbage.sort();
    assert_eq!(
        garbage,
        vec![
            "segments/deleted.seg".to_string(),
            "segments/trimmed.seg".to_string()
        ]
    );
    wait(store.drop_segments(garbage)).unwrap();
    store.shutdown();
    let keys: Vec<String> = reopen_snapshot(&path)
        .segments
        .into_iter()
        .map(|s| s.key)
        .collect();
    assert_eq!(
        keys,
        [
            "segments/producer.seg",
            "segments/readable.seg",
            "segments/too-new.seg"
        ]
    );
}
