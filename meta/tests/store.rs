//! What only the SQLite backend has: files and their directories, WAL mode, the in-memory
//! database, untyped columns. The contract both backends share is in `pg_contract.rs`.

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

/// Awaits a reply: the outer error would mean the thread dropped the answer, which it never may.
fn wait<T>(reply: pico_meta::Reply<T>) -> Result<T, MetaError> {
    block_on(reply).expect("the metadata thread answers every command")
}

#[test]
fn the_file_and_its_directory_are_created_in_wal_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(dir.path());
    let (store, snapshot) = open(&path);
    assert!(snapshot.catalog_id.is_some(), "a new catalog has an id");
    assert_eq!(
        snapshot,
        Snapshot {
            stream_ids_reached: Some(0),
            catalog_id: snapshot.catalog_id.clone(),
            ..Snapshot::default()
        }
    );
    assert!(path.exists(), "the parent directory is created");
    store.shutdown();

    let conn = rusqlite::Connection::open(&path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn in_memory_store_works() {
    let (store, snapshot) = MetaStore::open(&MetaUrl::parse("sqlite::memory:").unwrap()).unwrap();
    assert_eq!(
        snapshot,
        Snapshot {
            stream_ids_reached: Some(0),
            catalog_id: snapshot.catalog_id.clone(),
            ..Snapshot::default()
        }
    );
    let outcome = wait(store.create_stream(
        "/m",
        StreamConfig {
            content_type: "text/plain".into(),
            ttl_sec: None,
            expires_at_ms: None,
            retention: Default::default(),
        },
        0,
    ))
    .unwrap();
    assert!(outcome.created);
    assert_eq!(outcome.row.id, 1);
    store.shutdown();
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

/// SQLite's columns take any type: a value that is not a BLOB where one belongs is refused at
/// load with an error naming the segment (Postgres's typed columns cannot hold one).
#[test]
fn a_value_of_the_wrong_type_is_an_error_naming_the_segment() {
    for (column, damage) in [
        ("producers", rusqlite::types::Value::Text("p".into())),
        ("closed_by", rusqlite::types::Value::Integer(7)),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(dir.path());
        let (store, _) = open(&path);
        let segment = SegmentRecord {
            key: "segments/damaged.seg".into(),
            size_bytes: 10,
            created_ms: 1,
            streams: vec![SegmentStreamEntry {
                stream_id: 4,
                runs: vec![SegmentRun {
                    first_offset: 0,
                    next_offset: 1,
                    byte_start: 0,
                    byte_end: 10,
                }],
                last_timestamp_ms: 1,
                closed: false,
                producers: vec![ProducerState {
                    id: "p".into(),
                    epoch: 1,
                    seq: 1,
                }],
                closed_by: None,
                writer_seq: None,
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
            }
            Err(other) => panic!("unexpected error {other}"),
            Ok(_) => panic!("damaged {column} ({damage:?}) was loaded"),
        }
    }
}
