//! The metadata store's contract, written once and run against every backend: SQLite always,
//! PostgreSQL when `PICOMQ_PG_URL` names a server (`scripts/pg-up.sh` starts one). The Postgres
//! tests are `#[ignore]`d (`--include-ignored` runs them); without the variable they print a
//! skip note, or fail under `CI=true`.
//!
//! Each test is a function of a [`Db`]; `contract!` makes a `sqlite::<name>` and a
//! `postgres::<name>` test of it. Every Postgres test gets a database of its own (created from
//! `PICOMQ_PG_URL`, dropped at the end), so the tests run in parallel like the SQLite ones.
//! Registry semantics, id allocation across restarts and deletes, trims, touches, forks and
//! soft deletes, the segment catalog round trip (producer state, closes, writer sequences),
//! garbage, group commit under concurrency, racing creates from two stores, migrations, shutdown.
//! Below the contract: what only Postgres has (reconnecting, concurrent migration, startup
//! errors, the same columns as SQLite).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Barrier;
use std::time::Duration;
use std::time::Instant;

use futures_lite::future::block_on;
use pico_meta::testing::PgDatabase;
use pico_meta::ForkRow;
use pico_meta::MetaError;
use pico_meta::MetaStore;
use pico_meta::MetaUrl;
use pico_meta::ProducerState;
use pico_meta::SegmentRecord;
use pico_meta::SegmentRun;
use pico_meta::SegmentStreamEntry;
use pico_meta::Snapshot;
use pico_meta::StreamConfig;
use pico_meta::StreamRow;

/// One backend's database, fresh for one test.
enum Db {
    Sqlite {
        // Dropped last: the file outlives the stores.
        path: PathBuf,
        _dir: tempfile::TempDir,
    },
    Postgres(PgDatabase),
}

impl Db {
    fn sqlite() -> Db {
        let dir = tempfile::tempdir().unwrap();
        Db::Sqlite {
            path: dir.path().join("data").join("meta.db"),
            _dir: dir,
        }
    }

    /// `None` when `PICOMQ_PG_URL` is unset (the skip note is printed).
    fn postgres(test: &str) -> Option<Db> {
        PgDatabase::create(test).map(Db::Postgres)
    }

    fn url(&self) -> MetaUrl {
        match self {
            Db::Sqlite { path, .. } => MetaUrl::SqliteFile(path.clone()),
            Db::Postgres(database) => database.meta_url(),
        }
    }

    fn open(&self) -> (MetaStore, Snapshot) {
        MetaStore::open(&self.url()).expect("open metadata store")
    }

    fn reopen_snapshot(&self) -> Snapshot {
        let (store, snapshot) = self.open();
        store.shutdown();
        snapshot
    }

    /// Runs SQL behind the stores' back.
    fn execute(&self, sql: &str) {
        match self {
            Db::Sqlite { path, .. } => rusqlite::Connection::open(path)
                .and_then(|conn| conn.execute_batch(sql))
                .unwrap_or_else(|error| panic!("{sql}: {error}")),
            Db::Postgres(database) => database.execute(sql),
        }
    }

    /// A BLOB / BYTEA literal.
    fn blob(&self, bytes: &[u8]) -> String {
        let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
        match self {
            Db::Sqlite { .. } => format!("x'{hex}'"),
            Db::Postgres(_) => format!("'\\x{hex}'::bytea"),
        }
    }
}

/// Makes `sqlite::$test` and `postgres::$test` of each contract function `$test(&Db)`.
macro_rules! contract {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[test]
                fn $test() {
                    super::$test(&super::Db::sqlite());
                }
            )*
        }
        mod postgres {
            $(
                #[test]
                #[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
                fn $test() {
                    if let Some(db) = super::Db::postgres(stringify!($test)) {
                        super::$test(&db);
                    }
                }
            )*
        }
    };
}

contract!(
    create_duplicate_delete_recreate,
    ids_are_never_reused_across_reopen,
    close_is_persistent_and_idempotent,
    trim_only_raises_and_survives_reopen,
    touch_only_moves_the_idle_clock_forward_and_survives_reopen,
    forks_and_soft_deletes_survive_reopen,
    producer_state_round_trips_through_reopen,
    damaged_producer_state_is_an_error_naming_the_segment,
    segments_round_trip_in_commit_order,
    runs_in_the_fixed_layout_of_earlier_builds_still_load,
    a_bad_command_does_not_poison_its_batch,
    group_commit_answers_every_concurrent_call,
    racing_creates_of_one_name_register_it_once,
    dropping_the_last_handle_finishes_queued_work,
    calls_after_shutdown_answer_closed,
    garbage_is_what_no_live_stream_needs_and_drop_forgets_it,
    a_verify_lists_what_the_collector_keeps_with_the_runs_readers_reach,
    catalog_usage_sums_the_listed_segments,
    reopening_migrates_nothing_and_a_newer_schema_is_refused,
    retention_is_set_at_create_replaced_by_configure_and_survives_reopen,
    consumer_changes_from_two_nodes_take_turns,
    a_consumer_wake_is_kept_beside_its_document_and_listed_alone,
    consumers_are_listed_a_page_at_a_time_by_scope_then_id,
    a_consumer_decision_is_given_the_live_incarnation_of_each_followed_stream,
);

/// `change_consumer_following` gives the decision the id of the live stream by each name it
/// follows (from the stored document, or none): a name deleted and created again has the new
/// id, a soft-deleted one (a source its forks still read) and an unknown one have none.
fn a_consumer_decision_is_given_the_live_incarnation_of_each_followed_stream(db: &Db) {
    use pico_meta::ConsumerWrite;
    let (store, _) = db.open();
    let create = |name: &str| {
        wait(store.create_stream(name, config("text/plain"), 1))
            .unwrap()
            .row
            .id
    };
    let (old, kept, soft) = (create("/c/a"), create("/c/b"), create("/c/soft"));
    wait(store.delete_stream(old)).unwrap();
    let new = create("/c/a");
    wait(store.soft_delete_stream(soft)).unwrap();
    let followed = |document: Option<&str>| match document {
        Some(document) => document.split(',').map(str::to_string).collect(),
        None => vec!["/c/a".to_string()],
    };
    let given =
        wait(
            store.change_consumer_following("/r/".into(), "follower".into(), followed, |read| {
                (
                    ConsumerWrite::Put("/c/a,/c/b,/c/soft,/c/none".into()),
                    read.incarnations,
                )
            }),
        )
        .unwrap();
    assert_eq!(given, [("/c/a".to_string(), new)].into());
    let given = wait(store.change_consumer_following(
        "/r/".into(),
        "follower".into(),
        followed,
        |read| (ConsumerWrite::Delete, read.incarnations),
    ))
    .unwrap();
    assert_eq!(
        given,
        [("/c/a".to_string(), new), ("/c/b".to_string(), kept)].into()
    );
    assert_ne!(old, new);
    store.shutdown();
}

/// A consumer's wake is written with `PutWithWake`, kept by a plain `Put` of the document,
/// removed with `PutWithWake(_, None)` and by deleting the consumer; `waking_consumers` lists
/// the consumers with one only, across a reopen.
fn a_consumer_wake_is_kept_beside_its_document_and_listed_alone(db: &Db) {
    use pico_meta::ConsumerWrite;
    let (store, _) = db.open();
    let change = |id: &str, write: ConsumerWrite| {
        wait(store.change_consumer("/r/".into(), id.into(), move |read| (write, read.wake)))
            .unwrap()
    };
    assert_eq!(change("plain", ConsumerWrite::Put("p".into())), None);
    assert_eq!(
        change(
            "woken",
            ConsumerWrite::PutWithWake("w".into(), Some("hook".into()))
        ),
        None
    );
    // A document change keeps the wake.
    assert_eq!(
        change("woken", ConsumerWrite::Put("w2".into())),
        Some("hook".to_string())
    );
    store.shutdown();
    let (store, _) = db.open();
    let waking = wait(store.waking_consumers()).unwrap().consumers;
    assert_eq!(waking.len(), 1, "{waking:?}");
    assert_eq!(
        (waking[0].id.as_str(), waking[0].document.as_str()),
        ("woken", "w2")
    );
    assert_eq!(waking[0].wake.as_deref(), Some("hook"));
    assert_eq!(wait(store.consumers()).unwrap().consumers.len(), 2);
    let unwake = wait(store.change_consumer("/r/".into(), "woken".into(), |read| {
        (ConsumerWrite::PutWithWake(read.document.unwrap(), None), ())
    }));
    unwake.unwrap();
    assert!(wait(store.waking_consumers()).unwrap().consumers.is_empty());
    wait(store.change_consumer("/r/".into(), "woken".into(), |read| {
        (
            ConsumerWrite::PutWithWake(read.document.unwrap(), Some("again".into())),
            (),
        )
    }))
    .unwrap();
    wait(store.change_consumer("/r/".into(), "woken".into(), |_| {
        (ConsumerWrite::Delete, ())
    }))
    .unwrap();
    assert!(wait(store.waking_consumers()).unwrap().consumers.is_empty());
    wait(store.change_consumer("/r/".into(), "plain".into(), |_| {
        (ConsumerWrite::Delete, ())
    }))
    .unwrap();
    store.shutdown();
}

/// A report's pages: at most `limit` consumers after the last one seen, by scope then id,
/// with how many there are in all.
fn consumers_are_listed_a_page_at_a_time_by_scope_then_id(db: &Db) {
    use pico_meta::ConsumerWrite;
    let (store, _) = db.open();
    for (scope, id) in [("/b/", "x"), ("", "z"), ("/a/", "y"), ("/a/", "x")] {
        wait(store.change_consumer(scope.into(), id.into(), |_| {
            (ConsumerWrite::Put("{}".into()), ())
        }))
        .unwrap();
    }
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let (page, total) = wait(store.consumer_page(after.clone(), 3)).unwrap();
        assert_eq!(total, 4);
        assert!(page.len() <= 3);
        let Some(last) = page.last() else { break };
        after = Some((last.scope.clone(), last.id.clone()));
        seen.extend(page.into_iter().map(|c| format!("{}{}", c.scope, c.id)));
    }
    assert_eq!(seen, ["z", "/a/x", "/a/y", "/b/x"]);
    store.shutdown();
}

/// Two stores on one database as two nodes have them: on Postgres, two of them. A SQLite
/// catalog is one process's at a time (a second open is refused, checked here), so there both
/// are the one store, and its callers still race.
fn two_stores(db: &Db) -> (MetaStore, MetaStore) {
    let (first, _) = db.open();
    match db {
        Db::Sqlite { .. } => {
            let refused = MetaStore::open(&db.url())
                .err()
                .expect("a second open of a SQLite catalog is refused");
            assert!(
                refused.to_string().contains("in use by another process"),
                "{refused}"
            );
            (first.clone(), first)
        }
        Db::Postgres(_) => (first, db.open().0),
    }
}

/// Two stores on one database (two nodes of a cluster on Postgres) change one consumer
/// document concurrently: each change reads, decides and writes in one transaction under the
/// consumer's row lock, so none is lost and no two see the same version; a delete removes it
/// and a decision that keeps the document writes nothing.
fn consumer_changes_from_two_nodes_take_turns(db: &Db) {
    use pico_meta::ConsumerWrite;
    const CHANGES_PER_THREAD: u64 = 40;
    let (first, second) = two_stores(db);
    let created = wait(first.change_consumer("/r/".into(), "c".into(), |read| {
        assert!(read.document.is_none());
        assert_eq!(read.scope_count, 0);
        (ConsumerWrite::Put("0".into()), read.now_ms)
    }))
    .unwrap();
    assert!(created > 0, "the clock of the metadata log");
    let threads: Vec<_> = [&first, &second, &first, &second]
        .into_iter()
        .map(|store| {
            let store = store.clone();
            std::thread::spawn(move || {
                (0..CHANGES_PER_THREAD)
                    .map(|_| {
                        wait(store.change_consumer("/r/".into(), "c".into(), |read| {
                            let seen: u64 = read.document.unwrap().parse().unwrap();
                            (ConsumerWrite::Put((seen + 1).to_string()), seen)
                        }))
                        .unwrap()
                    })
                    .collect::<Vec<u64>>()
            })
        })
        .collect();
    let mut seen: Vec<u64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..4 * CHANGES_PER_THREAD).collect::<Vec<_>>());
    // Another scope, another consumer of the same id.
    wait(
        second.change_consumer("/other/".into(), "c".into(), |read| {
            assert!(read.document.is_none());
            (ConsumerWrite::Keep, ())
        }),
    )
    .unwrap();
    let list = wait(second.consumers()).unwrap();
    assert_eq!(list.consumers.len(), 1);
    assert_eq!(
        list.consumers[0].document,
        (4 * CHANGES_PER_THREAD).to_string()
    );
    wait(first.change_consumer("/r/".into(), "c".into(), |_| (ConsumerWrite::Delete, ()))).unwrap();
    first.shutdown();
    second.shutdown();
    let (reopened, _) = db.open();
    assert!(wait(reopened.consumers()).unwrap().consumers.is_empty());
    reopened.shutdown();
}

fn config(content_type: &str) -> StreamConfig {
    StreamConfig {
        content_type: content_type.into(),
        ttl_sec: None,
        expires_at_ms: None,
        retention: Default::default(),
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

fn create_duplicate_delete_recreate(db: &Db) {
    let (store, snapshot) = db.open();
    // A new catalog has an identity of its own (its bucket's marker is named by it).
    let catalog_id = snapshot.catalog_id.clone().expect("a catalog id");
    assert_eq!(catalog_id.len(), 32, "{catalog_id}");
    assert!(
        catalog_id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{catalog_id}"
    );
    assert_eq!(
        snapshot,
        Snapshot {
            stream_ids_reached: Some(0),
            catalog_id: Some(catalog_id.clone()),
            ..Snapshot::default()
        }
    );

    let json = StreamConfig {
        content_type: "application/json; charset=utf-8".into(),
        ttl_sec: Some(60),
        expires_at_ms: Some(1_900_000_000_000),
        retention: Default::default(),
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

    // A value neither database can hold is refused, and the name stays free.
    let huge = StreamConfig {
        ttl_sec: Some(u64::MAX),
        ..config("text/plain")
    };
    match wait(store.create_stream("/streams/huge", huge, 3_500)) {
        Err(MetaError::Storage(message)) => assert!(message.contains("ttl_sec"), "{message}"),
        other => panic!("an unstorable ttl was accepted: {other:?}"),
    }

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

    let mut reopened = db.reopen_snapshot();
    // The highest id handed out, whatever was deleted since: a WAL frame above it was written
    // with another catalog (engine recovery refuses it).
    let reached = recreated.row.id;
    store_deletes_and_reaches(db, recreated.row.id);
    reopened.streams.sort_by_key(|row| row.id);
    assert_eq!(reopened.streams, vec![other.row, recreated.row]);
    assert_eq!(reopened.stream_ids_reached, Some(reached));
    assert_eq!(
        reopened.catalog_id,
        Some(catalog_id),
        "the same id on every open"
    );
}

/// Deletes stream `id`, the newest: the catalog's reach stays at it.
fn store_deletes_and_reaches(db: &Db, id: u64) {
    let (store, _) = db.open();
    assert!(wait(store.delete_stream(id)).unwrap());
    store.shutdown();
    let reopened = db.reopen_snapshot();
    assert!(reopened.streams.iter().all(|row| row.id != id));
    assert_eq!(reopened.stream_ids_reached, Some(id));
}

fn ids_are_never_reused_across_reopen(db: &Db) {
    let (store, _) = db.open();
    let a = wait(store.create_stream("/a", config("text/plain"), 1))
        .unwrap()
        .row;
    let b = wait(store.create_stream("/b", config("text/plain"), 1))
        .unwrap()
        .row;
    // Deleting the highest id is the case where plain SQLite rowids would be handed out again.
    assert!(wait(store.delete_stream(b.id)).unwrap());
    store.shutdown();

    let (store, snapshot) = db.open();
    assert_eq!(snapshot.streams, vec![a.clone()]);
    let c = wait(store.create_stream("/b", config("text/plain"), 2))
        .unwrap()
        .row;
    assert!(c.id > b.id, "id {} reused after {}", c.id, b.id);
    store.shutdown();
}

fn close_is_persistent_and_idempotent(db: &Db) {
    let (store, _) = db.open();
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
    assert!(again.row.closed);
    store.shutdown();

    let snapshot = db.reopen_snapshot();
    assert_eq!(snapshot.streams.len(), 1);
    assert!(snapshot.streams[0].closed);
}

fn retention_is_set_at_create_replaced_by_configure_and_survives_reopen(db: &Db) {
    use pico_meta::Retention;
    let (store, _) = db.open();
    let kept = Retention {
        age_ms: Some(7 * 24 * 3600 * 1000),
        bytes: Some(10 << 30),
        delete_on_empty_ms: None,
    };
    let with = StreamConfig {
        retention: kept,
        ..config("text/plain")
    };
    let a = wait(store.create_stream("/a", with, 1)).unwrap().row;
    assert_eq!(a.config.retention, kept);
    let b = wait(store.create_stream("/b", config("text/plain"), 1))
        .unwrap()
        .row;
    assert!(b.config.retention.is_off());
    let changed = Retention {
        age_ms: None,
        bytes: Some(1024),
        delete_on_empty_ms: Some(60_000),
    };
    wait(store.configure_stream_fenced(b.id, changed, None)).unwrap();
    // Beyond what the databases store: refused, nothing written.
    let huge = Retention {
        bytes: Some(u64::MAX),
        ..changed
    };
    assert!(wait(store.configure_stream_fenced(a.id, huge, None)).is_err());
    store.shutdown();

    let snapshot = db.reopen_snapshot();
    let retention = |name: &str| {
        snapshot
            .streams
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.config.retention)
    };
    assert_eq!(retention("/a"), Some(kept));
    assert_eq!(retention("/b"), Some(changed));
}

fn trim_only_raises_and_survives_reopen(db: &Db) {
    let (store, _) = db.open();
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

    let (store, snapshot) = db.open();
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
    let snapshot = db.reopen_snapshot();
    assert_eq!(snapshot.streams[1].start_offset, i64::MAX as u64);
    assert_eq!(snapshot.streams[0].start_offset, 10);
}

fn producer_state_round_trips_through_reopen(db: &Db) {
    let (store, _) = db.open();
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
    assert_eq!(db.reopen_snapshot().segments, vec![segment.clone()]);

    // A re-commit replaces the producer state too, including clearing it.
    let (store, _) = db.open();
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
    assert_eq!(db.reopen_snapshot().segments, vec![replaced]);
}

fn segments_round_trip_in_commit_order(db: &Db) {
    let (store, _) = db.open();
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

    let snapshot = db.reopen_snapshot();
    assert_eq!(snapshot.streams, vec![b.clone()]);
    assert_eq!(
        snapshot.segments,
        vec![first.clone(), second.clone(), third.clone(), fourth.clone()]
    );

    // Re-committing a key replaces its contents in place (commit order unchanged).
    let (store, _) = db.open();
    let second_again = SegmentRecord {
        size_bytes: 128,
        streams: vec![entry(b.id, vec![run(5, 6, 64, 128)], 15, true)],
        ..second.clone()
    };
    wait(store.commit_segment(second_again.clone())).unwrap();
    wait(store.commit_segment(second_again.clone())).unwrap();
    store.shutdown();
    let snapshot = db.reopen_snapshot();
    assert_eq!(snapshot.segments, vec![first, second_again, third, fourth]);
}

/// Runs stored by a build that knew only the fixed 32-byte layout load as they were written,
/// next to segments committed now (in the compact layout), through a restart.
fn runs_in_the_fixed_layout_of_earlier_builds_still_load(db: &Db) {
    let (store, _) = db.open();
    let old_runs = vec![run(0, 3, 0, 300), run(3, 5, 500, 700)];
    let old = SegmentRecord {
        key: "segments/old.seg".into(),
        size_bytes: 1_000,
        created_ms: 10,
        streams: vec![entry(7, old_runs.clone(), 11, false)],
    };
    wait(store.commit_segment(old.clone())).unwrap();
    store.shutdown();
    // What the earlier build stored for the same runs: four little-endian u64 per run.
    let fixed: Vec<u8> = old_runs
        .iter()
        .flat_map(|r| [r.first_offset, r.next_offset, r.byte_start, r.byte_end])
        .flat_map(u64::to_le_bytes)
        .collect();
    db.execute(&format!(
        "UPDATE segment_streams SET runs = {}",
        db.blob(&fixed)
    ));
    let (store, snapshot) = db.open();
    assert_eq!(snapshot.segments, vec![old.clone()]);
    let new = SegmentRecord {
        key: "segments/new.seg".into(),
        size_bytes: 5_000,
        created_ms: 20,
        streams: vec![entry(7, vec![run(5, 900, 0, 4_000)], 21, true)],
    };
    wait(store.commit_segment(new.clone())).unwrap();
    store.shutdown();
    assert_eq!(db.reopen_snapshot().segments, vec![old, new]);
}

fn a_bad_command_does_not_poison_its_batch(db: &Db) {
    let (store, _) = db.open();
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

    let snapshot = db.reopen_snapshot();
    let keys: Vec<_> = snapshot
        .segments
        .iter()
        .map(|segment| segment.key.as_str())
        .collect();
    assert_eq!(keys, ["ok/1", "ok/2"]);
    assert_eq!(snapshot.streams.len(), 1);
}

fn group_commit_answers_every_concurrent_call(db: &Db) {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 250;
    let (store, _) = db.open();

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

    let snapshot = db.reopen_snapshot();
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

fn dropping_the_last_handle_finishes_queued_work(db: &Db) {
    let (store, _) = db.open();
    let replies: Vec<_> = (0..50)
        .map(|i| store.create_stream(&format!("/s{i}"), config("text/plain"), 0))
        .collect();
    drop(store);
    for reply in replies {
        assert!(wait(reply).unwrap().created);
    }
    assert_eq!(db.reopen_snapshot().streams.len(), 50);
}

fn calls_after_shutdown_answer_closed(db: &Db) {
    let (store, _) = db.open();
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

fn touch_only_moves_the_idle_clock_forward_and_survives_reopen(db: &Db) {
    let (store, _) = db.open();
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
    let snapshot = db.reopen_snapshot();
    assert_eq!(snapshot.streams.len(), 1);
    assert_eq!(snapshot.streams[0].last_access_ms, 5_000);
}

/// Three streams and six segments (`too-new.seg` sealed at 500, the rest at 10): `/gone`
/// deleted, `/soft` soft-deleted (forks read it), `/kept` trimmed to 4; their ids in that order.
fn streams_and_segments_some_garbage(db: &Db) -> (MetaStore, [u64; 3]) {
    let (store, _) = db.open();
    let gone = wait(store.create_stream("/gone", config("text/plain"), 1))
        .unwrap()
        .row;
    let kept = wait(store.create_stream("/kept", config("text/plain"), 1))
        .unwrap()
        .row;
    // Deleted for clients while forks still read it: its row, and so its records, stay.
    let soft = wait(store.create_stream("/soft", config("text/plain"), 1))
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
            "segments/soft-deleted.seg",
            10,
            vec![
                entry(gone.id, vec![run(5, 6, 0, 50)], 1, false),
                entry(soft.id, vec![run(0, 1, 50, 100)], 1, false),
            ],
        ),
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
    wait(store.soft_delete_stream(soft.id)).unwrap();
    // /kept is trimmed to 4: the first segment of it holds nothing readable any more.
    wait(store.trim_stream(kept.id, 4)).unwrap();
    (store, [gone.id, kept.id, soft.id])
}

fn garbage_is_what_no_live_stream_needs_and_drop_forgets_it(db: &Db) {
    let (store, _) = streams_and_segments_some_garbage(db);
    let mut garbage = wait(store.garbage_segments(100)).unwrap();
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
    let keys: Vec<String> = db
        .reopen_snapshot()
        .segments
        .into_iter()
        .map(|s| s.key)
        .collect();
    assert_eq!(
        keys,
        [
            "segments/producer.seg",
            "segments/soft-deleted.seg",
            "segments/readable.seg",
            "segments/too-new.seg"
        ]
    );
}
/// `pico admin verify`'s list: the objects the collector would keep, whatever their age, each
/// with the runs readers still reach; one key asked alone; the names of the streams by id.
fn a_verify_lists_what_the_collector_keeps_with_the_runs_readers_reach(db: &Db) {
    let (store, [gone, kept, soft]) = streams_and_segments_some_garbage(db);
    let objects = wait(store.stored_objects(None)).unwrap();
    /// An object's key and its `(stream, first, next)` runs.
    type Listed<'a> = (&'a str, Vec<(u64, u64, u64)>);
    let listed: Vec<Listed> = objects
        .iter()
        .map(|o| {
            let runs = o
                .runs
                .iter()
                .map(|r| (r.stream_id, r.run.first_offset, r.run.next_offset))
                .collect();
            (o.key.as_str(), runs)
        })
        .collect();
    assert_eq!(
        listed,
        [
            // Kept for its producer state; its records are trimmed away.
            ("segments/producer.seg", vec![]),
            ("segments/soft-deleted.seg", vec![(soft, 0, 1)]),
            ("segments/readable.seg", vec![(kept, 2, 9)]),
        ]
    );
    assert!(objects.iter().all(|o| o.size_bytes == Some(100)));
    let one = wait(store.stored_objects(Some("segments/readable.seg".into()))).unwrap();
    assert_eq!(one, objects[2..]);
    for gone_key in [
        "segments/deleted.seg",
        "segments/too-new.seg",
        "segments/none.seg",
    ] {
        assert!(wait(store.stored_objects(Some(gone_key.into())))
            .unwrap()
            .is_empty());
    }
    let mut names = wait(store.stream_names(vec![gone, kept, soft])).unwrap();
    names.sort();
    assert_eq!(
        names,
        [(kept, "/kept".to_string()), (soft, "/soft".to_string())]
    );
    store.shutdown();
}

/// The dashboard's bucket bytes: the segments the catalog lists and their sizes, a
/// re-commit counted once at its new size, a dropped segment no longer.
fn catalog_usage_sums_the_listed_segments(db: &Db) {
    let (store, _) = db.open();
    assert_eq!(
        wait(store.catalog_usage()).unwrap(),
        pico_meta::CatalogUsage::default()
    );
    let stream = wait(store.create_stream("/s", config("text/plain"), 1))
        .unwrap()
        .row;
    let segment = |key: &str, size_bytes: u64, first: u64| SegmentRecord {
        key: key.into(),
        size_bytes,
        created_ms: 10,
        streams: vec![entry(
            stream.id,
            vec![run(first, first + 1, 0, size_bytes)],
            1,
            false,
        )],
    };
    // Above 2^32, so a 32-bit sum anywhere would show.
    let large = 5_000_000_000;
    wait(store.commit_segment(segment("segments/a.seg", 100, 0))).unwrap();
    wait(store.commit_segment(segment("segments/b.seg", large, 1))).unwrap();
    wait(store.commit_segment(segment("segments/c.seg", 7, 2))).unwrap();
    // A retried commit replaces the row.
    wait(store.commit_segment(segment("segments/c.seg", 9, 2))).unwrap();
    assert_eq!(
        wait(store.catalog_usage()).unwrap(),
        pico_meta::CatalogUsage {
            segments: 3,
            bytes: 100 + large + 9
        }
    );
    wait(store.drop_segments(vec!["segments/a.seg".into()])).unwrap();
    assert_eq!(
        wait(store.catalog_usage()).unwrap(),
        pico_meta::CatalogUsage {
            segments: 2,
            bytes: large + 9
        }
    );
    store.shutdown();
}

fn forks_and_soft_deletes_survive_reopen(db: &Db) {
    let (store, _) = db.open();
    let source = wait(store.create_stream("/source", config("text/plain"), 1))
        .unwrap()
        .row;
    let fork = ForkRow {
        source: "/source".into(),
        source_id: source.id,
        offset: 7,
        partial_bytes: 3,
    };
    let forked =
        wait(store.create_fork_stream("/fork", config("text/plain"), Some(fork.clone()), 2))
            .unwrap();
    assert!(forked.created);
    assert_eq!(forked.row.fork, Some(fork.clone()));
    assert!(!forked.row.soft_deleted);
    // A fork at the very start of its source inherits nothing but still names it.
    let at_zero = ForkRow {
        offset: 0,
        partial_bytes: 0,
        ..fork.clone()
    };
    let empty_fork = wait(store.create_fork_stream(
        "/fork-at-0",
        config("text/plain"),
        Some(at_zero.clone()),
        3,
    ))
    .unwrap()
    .row;

    wait(store.soft_delete_stream(source.id)).unwrap();
    wait(store.soft_delete_stream(source.id)).unwrap(); // idempotent
    wait(store.soft_delete_stream(987_654)).unwrap(); // unknown id: fine
    wait(store.soft_delete_stream(u64::MAX)).unwrap();
    // The soft-deleted row keeps its name: a create of it finds the row, marked.
    let again = wait(store.create_stream("/source", config("text/plain"), 4)).unwrap();
    assert!(!again.created);
    assert!(again.row.soft_deleted);
    store.shutdown();

    let snapshot = db.reopen_snapshot();
    let expected = vec![
        StreamRow {
            soft_deleted: true,
            ..source.clone()
        },
        forked.row.clone(),
        empty_fork.clone(),
    ];
    assert_eq!(snapshot.streams, expected);
    assert_eq!(snapshot.streams[2].fork, Some(at_zero));

    // The last fork gone, the source's row is deleted for good.
    let (store, _) = db.open();
    assert!(wait(store.delete_stream(forked.row.id)).unwrap());
    assert!(wait(store.delete_stream(empty_fork.id)).unwrap());
    assert!(wait(store.delete_stream(source.id)).unwrap());
    store.shutdown();
    assert_eq!(db.reopen_snapshot().streams, vec![]);
}

fn damaged_producer_state_is_an_error_naming_the_segment(db: &Db) {
    let (store, _) = db.open();
    let segment = SegmentRecord {
        key: "segments/damaged.seg".into(),
        size_bytes: 10,
        created_ms: 1,
        streams: vec![SegmentStreamEntry {
            producers: vec![producer("p", 1, 1)],
            ..entry(4, vec![run(0, 1, 0, 10)], 1, false)
        }],
    };
    wait(store.commit_segment(segment.clone())).unwrap();
    store.shutdown();
    assert_eq!(db.reopen_snapshot().segments, vec![segment]);

    for (column, damage) in [
        ("producers", &[3u8, 0, b'a'][..]), // a record cut short
        ("closed_by", &[][..]),             // present but empty
        ("closed_by", &[0u8; 17][..]),      // one byte short of a record
        ("runs", &[0u8; 31][..]),           // not a whole run
        ("runs", &[0xc1, 0x80][..]),        // a compact run cut short
    ] {
        db.execute(&format!(
            "UPDATE segment_streams SET {column} = {}",
            db.blob(damage)
        ));
        match MetaStore::open(&db.url()) {
            Err(MetaError::Storage(message)) => {
                assert!(message.contains("segments/damaged.seg"), "{message}");
                assert!(message.contains(&format!("damaged {column}")), "{message}");
            }
            Err(other) => panic!("unexpected error {other}"),
            Ok(_) => panic!("damaged {column} ({damage:?}) was loaded"),
        }
        // Repaired, it loads again.
        db.execute(&format!(
            "UPDATE segment_streams SET producers = {}, closed_by = NULL, runs = {}",
            db.blob(&[1, 0, b'p', 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]),
            db.blob(
                &[
                    &[0u8; 8][..],
                    &1u64.to_le_bytes(),
                    &[0u8; 8],
                    &10u64.to_le_bytes()
                ]
                .concat()
            )
        ));
        assert_eq!(db.reopen_snapshot().segments.len(), 1);
    }
}

/// Two stores on one database (two nodes sharing a Postgres; on SQLite, the one store a
/// process may hold) and many callers create the same name at once: one row, created exactly
/// once, and every caller sees it.
fn racing_creates_of_one_name_register_it_once(db: &Db) {
    const CALLERS: usize = 4;
    const ROUNDS: usize = 25;
    let (first, second) = two_stores(db);
    let stores = [first, second];
    let start = Arc::new(Barrier::new(CALLERS));
    let callers: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let store = stores[caller % 2].clone();
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let replies: Vec<_> = (0..ROUNDS)
                    .map(|round| {
                        let name = format!("/race/{round}");
                        store.create_stream(&name, config("text/plain"), caller as i64)
                    })
                    .collect();
                replies
                    .into_iter()
                    .map(|reply| wait(reply).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let outcomes: Vec<Vec<_>> = callers
        .into_iter()
        .map(|caller| caller.join().unwrap())
        .collect();
    for round in 0..ROUNDS {
        let of_round: Vec<_> = outcomes.iter().map(|caller| &caller[round]).collect();
        let created = of_round.iter().filter(|outcome| outcome.created).count();
        assert_eq!(created, 1, "round {round}: {of_round:?}");
        assert!(
            of_round
                .iter()
                .all(|outcome| outcome.row == of_round[0].row),
            "round {round}: {of_round:?}"
        );
    }
    stores.iter().for_each(MetaStore::shutdown);
    assert_eq!(db.reopen_snapshot().streams.len(), ROUNDS);
}

fn reopening_migrates_nothing_and_a_newer_schema_is_refused(db: &Db) {
    let (store, _) = db.open();
    let row = wait(store.create_stream("/kept", config("text/plain"), 1))
        .unwrap()
        .row;
    store.shutdown();
    for _ in 0..2 {
        assert_eq!(db.reopen_snapshot().streams, vec![row.clone()]);
    }

    db.execute("INSERT INTO schema_version (version) VALUES (99)");
    match MetaStore::open(&db.url()) {
        Err(MetaError::Storage(message)) => {
            assert!(message.contains("schema version 99"), "{message}")
        }
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a newer schema was opened"),
    }
}

// ---- What only Postgres has. -------------------------------------------------------------------

/// A server that cannot be reached is a startup error naming the URL, its password masked.
#[test]
fn an_unreachable_postgres_is_a_clear_startup_error() {
    // Port 1 on loopback: nothing listens, the connection is refused at once.
    let url = MetaUrl::parse("postgres://pico:s3cret@127.0.0.1:1/meta").unwrap();
    let error = match MetaStore::open(&url) {
        Err(error) => error,
        Ok(_) => panic!("connected to 127.0.0.1:1"),
    };
    let message = error.to_string();
    assert!(matches!(error, MetaError::Storage(_)), "{error:?}");
    assert!(
        message.contains("postgres://pico:***@127.0.0.1:1/meta"),
        "{message}"
    );
    assert!(!message.contains("s3cret"), "{message}");

    let url = MetaUrl::parse("postgresql://pico:s3cret@h/db?sslmode=sometimes").unwrap();
    match MetaStore::open(&url) {
        Err(MetaError::BadUrl(message)) => {
            assert!(message.contains("postgresql://pico:***@h/db"), "{message}");
            assert!(!message.contains("s3cret"), "{message}");
        }
        Err(other) => panic!("unexpected error {other:?}"),
        Ok(_) => panic!("an invalid URL opened"),
    }
}

/// The Postgres tables have the SQLite tables' columns, and both schemas are at one version.
#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
#[test]
fn postgres_has_the_sqlite_tables_and_columns() {
    let Some(database) = PgDatabase::create("same_columns") else {
        return;
    };
    MetaStore::open(&database.meta_url()).unwrap().0.shutdown();
    let sqlite = Db::sqlite();
    sqlite.reopen_snapshot();
    let Db::Sqlite { path, .. } = &sqlite else {
        unreachable!()
    };
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut query = conn
        .prepare(
            "SELECT m.name, p.name FROM sqlite_master AS m, pragma_table_info(m.name) AS p
             WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' ORDER BY 1, 2",
        )
        .unwrap();
    let sqlite_columns: Vec<Vec<Option<String>>> = query
        .query_map([], |row| Ok(vec![Some(row.get(0)?), Some(row.get(1)?)]))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let postgres_columns = database.query(
        "SELECT table_name::text, column_name::text FROM information_schema.columns
         WHERE table_schema = current_schema() ORDER BY 1, 2",
    );
    assert_eq!(postgres_columns, sqlite_columns);
    assert_eq!(postgres_columns.len(), 53);

    let sqlite_versions: Vec<i64> = conn
        .prepare("SELECT version FROM schema_version ORDER BY version")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let postgres_versions: Vec<i64> = database
        .query("SELECT version FROM schema_version ORDER BY version")
        .into_iter()
        .map(|row| row[0].as_deref().unwrap().parse().unwrap())
        .collect();
    assert_eq!(postgres_versions, sqlite_versions);
}

/// Nodes starting at once on a fresh database migrate it once, under the advisory lock.
#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
#[test]
fn postgres_nodes_starting_at_once_migrate_once() {
    const NODES: usize = 4;
    let Some(database) = PgDatabase::create("migrate_at_once") else {
        return;
    };
    let url = database.meta_url();
    let start = Arc::new(Barrier::new(NODES));
    let nodes: Vec<_> = (0..NODES)
        .map(|_| {
            let (url, start) = (url.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                MetaStore::open(&url).map(|(store, _)| store.shutdown())
            })
        })
        .collect();
    for node in nodes {
        node.join().unwrap().expect("every node opens");
    }
    let versions = database.query("SELECT version FROM schema_version ORDER BY version");
    let versions: Vec<_> = versions.iter().map(|row| row[0].as_deref()).collect();
    assert_eq!(
        versions,
        [
            Some("1"),
            Some("2"),
            Some("3"),
            Some("4"),
            Some("5"),
            Some("6"),
            Some("7"),
            Some("8"),
            Some("9"),
            Some("10"),
            Some("11"),
            Some("12"),
            Some("13"),
            Some("14"),
            Some("15"),
        ]
    );
    let ids = database.query("SELECT id FROM catalog_identity");
    assert_eq!(ids.len(), 1, "one catalog id, made once: {ids:?}");
}

/// A dropped connection fails the commands that need it while the server stays away, never
/// the thread: it reconnects for later commands.
#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
#[test]
fn postgres_connection_loss_fails_commands_then_reconnects() {
    let Some(database) = PgDatabase::create("reconnect") else {
        return;
    };
    let name = database.name().to_string();
    let (store, _) = MetaStore::open(&database.meta_url()).unwrap();
    let create = |stream: &str| wait(store.create_stream(stream, config("text/plain"), 1));
    assert!(create("/before").unwrap().created);

    // An idle connection that died costs nothing: the next batch reconnects before it begins.
    database.terminate_connections();
    assert!(create("/after-idle-loss").unwrap().created);

    // The server refuses the database for a while: commands fail, with the reason.
    database.execute_admin(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false"));
    database.terminate_connections();
    for _ in 0..3 {
        match create("/refused") {
            Err(MetaError::Storage(message)) => {
                assert!(message.contains(&name), "{message}")
            }
            other => panic!("a command succeeded without a connection: {other:?}"),
        }
    }
    match wait(store.commit_segment(SegmentRecord {
        key: "segments/refused.seg".into(),
        size_bytes: 1,
        created_ms: 1,
        streams: vec![],
    })) {
        Err(MetaError::Storage(_)) => {}
        other => panic!("a commit succeeded without a connection: {other:?}"),
    }

    // Back: a later command succeeds within the back-off (at most 5 s between attempts).
    database.execute_admin(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match create("/after-outage") {
            Ok(outcome) => {
                assert!(outcome.created);
                break;
            }
            Err(error) => assert!(Instant::now() < deadline, "never reconnected: {error}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    store.shutdown();

    let names: Vec<String> = MetaStore::open(&database.meta_url())
        .map(|(store, snapshot)| {
            store.shutdown();
            snapshot.streams.into_iter().map(|row| row.name).collect()
        })
        .unwrap();
    assert_eq!(names, ["/before", "/after-idle-loss", "/after-outage"]);
}

// ---- Cluster metadata (Postgres only: SQLite admits one node). ------------------------------

fn segment(key: &str, streams: Vec<SegmentStreamEntry>) -> SegmentRecord {
    SegmentRecord {
        key: key.into(),
        size_bytes: 100,
        created_ms: 1,
        streams,
    }
}

/// Registration, epochs, leases, placement of a dead node's streams, fenced writes and the
/// transfer rules, as two nodes' stores on one database see them.
#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
#[test]
fn postgres_cluster_leases_ownership_fencing_and_transfers() {
    let Some(database) = PgDatabase::create("cluster_contract") else {
        return;
    };
    let (one, _) = MetaStore::open(&database.meta_url()).unwrap();
    let (two, _) = MetaStore::open(&database.meta_url()).unwrap();
    let lease_ms = 60_000;

    // Registration: epochs only grow, per node id.
    let state = wait(one.register_node(1, 100, "http://one", 1, lease_ms)).unwrap();
    assert_eq!(state.nodes.len(), 1);
    assert!(state.nodes[0].is_live(state.now_ms));
    match wait(one.register_node(1, 100, "http://one", 1, lease_ms)) {
        Err(MetaError::Rejected(message)) => assert!(message.contains("must grow"), "{message}"),
        other => panic!("re-registering epoch 100: {other:?}"),
    }
    wait(two.register_node(2, 7, "", 1, lease_ms)).unwrap();
    let state = wait(two.advertise(2, 7, "http://two", "http://two-ds")).unwrap();
    let row = state.nodes.iter().find(|n| n.id == 2).unwrap();
    assert_eq!(
        (row.address.as_str(), row.ds_address.as_str()),
        ("http://two", "http://two-ds")
    );

    // Creates record their owner at epoch 1; fenced writes by the owner pass, others fail.
    let created =
        wait(one.create_stream_owned("/c/a", config("text/plain"), false, None, 5, Some(1)))
            .unwrap();
    assert!(created.created);
    assert_eq!(
        (created.ownership.node, created.ownership.epoch),
        (Some(1), 1)
    );
    let id = created.row.id;
    // Node 1 runs at incarnation 100, node 2 at 7.
    let incarnation = |node| if node == 1 { 100 } else { 7 };
    let by = |node, epoch| {
        Some(pico_meta::Fence {
            node,
            node_epoch: incarnation(node),
            epoch,
        })
    };
    wait(one.trim_stream_fenced(id, 0, by(1, 1))).unwrap();
    assert!(matches!(
        wait(two.close_stream_fenced(id, by(2, 1))),
        Err(MetaError::Fenced(_))
    ));
    let lookup = wait(two.lookup_stream("/c/a")).unwrap().unwrap();
    assert!(!lookup.0.closed, "the fenced close wrote nothing");

    // A segment commit keeps the entries of streams the committer owns and names the others.
    let other =
        wait(two.create_stream_owned("/c/b", config("text/plain"), false, None, 5, Some(2)))
            .unwrap()
            .row
            .id;
    let fence = pico_meta::SegmentFence {
        node: 1,
        node_epoch: 100,
        epochs: [(id, 1), (other, 1)].into_iter().collect(),
        quarantine_refused: false,
    };
    let entries = vec![
        entry(id, vec![run(0, 2, 0, 50)], 9, false),
        entry(other, vec![run(0, 1, 50, 100)], 9, false),
    ];
    let fenced =
        wait(one.commit_segment_fenced(segment("segments/n1/x.seg", entries), fence)).unwrap();
    assert_eq!(fenced, vec![other]);
    let load = wait(two.load_stream(id)).unwrap().unwrap();
    assert_eq!(load.snapshot.segments.len(), 1, "{load:?}");
    assert_eq!(
        load.snapshot.segments[0].streams[0].runs,
        vec![run(0, 2, 0, 50)]
    );
    assert!(wait(two.load_stream(other))
        .unwrap()
        .unwrap()
        .snapshot
        .segments
        .is_empty());

    // Transfers: the rules, then the hand-over at the next epoch.
    let refused = |store: &MetaStore, name: &str, to| match wait(store.request_transfer(name, to)) {
        Err(MetaError::Rejected(message)) => message,
        other => panic!("transfer of {name} to {to}: {other:?}"),
    };
    assert!(refused(&two, "/c/a", 9).contains("not registered"));
    assert!(refused(&two, "/c/a", 1).contains("target equals source"));
    assert!(matches!(
        wait(two.request_transfer("/c/none", 2)),
        Err(MetaError::NotFound(_))
    ));
    let accepted = wait(two.request_transfer("/c/a", 2)).unwrap();
    assert_eq!((accepted.from_node, accepted.to_node), (1, 2));
    let state = wait(one.renew_lease(1, 100, lease_ms)).unwrap();
    assert_eq!(state.transfers.len(), 1);
    assert_eq!(
        (state.transfers[0].stream_id, state.transfers[0].to_node),
        (id, 2)
    );
    assert!(matches!(
        wait(one.complete_transfer(id, by(1, 9).unwrap(), 2)),
        Err(MetaError::Fenced(_))
    ));
    let epoch = wait(one.complete_transfer(id, by(1, 1).unwrap(), 2)).unwrap();
    assert_eq!(epoch, 2);
    assert!(matches!(
        wait(one.trim_stream_fenced(id, 1, by(1, 1))),
        Err(MetaError::Fenced(_))
    ));
    wait(two.trim_stream_fenced(id, 1, by(2, 2))).unwrap();
    assert_eq!(wait(two.owned_streams(2)).unwrap().get(&id), Some(&2));

    // Takeover: nothing moves while node 1 is live; once its lease ended, its streams go to
    // the live node at the next epoch, and only to a node with slots.
    let third =
        wait(one.create_stream_owned("/c/c", config("text/plain"), false, None, 5, Some(1)))
            .unwrap()
            .row
            .id;
    assert!(wait(two.take_over(1, 100)).unwrap().is_empty());
    wait(one.release_lease(1, 100)).unwrap();
    assert!(
        wait(two.take_over(1, 99)).unwrap().is_empty(),
        "another incarnation"
    );
    assert_eq!(wait(two.take_over(1, 100)).unwrap(), vec![(third, 2)]);
    let (_, owner) = wait(two.lookup_stream("/c/c")).unwrap().unwrap();
    assert_eq!((owner.node, owner.epoch), (Some(2), 2));
    // The old incarnation renews (it was only paused) and finds the stream gone.
    wait(one.renew_lease(1, 100, lease_ms)).unwrap();
    assert!(!wait(one.owned_streams(1)).unwrap().contains_key(&third));

    // A newer incarnation of node 1 supersedes the old one, whose renewals now fail, and so
    // do its writes: a segment commit keeps none of its entries, a fenced write is refused.
    let fourth =
        wait(one.create_stream_owned("/c/d", config("text/plain"), false, None, 5, Some(1)))
            .unwrap()
            .row
            .id;
    let registered = wait(two.register_node(1, 101, "http://one", 1, lease_ms)).unwrap();
    assert!(
        registered.previous_lease_left_ms > 0,
        "the old incarnation's lease was still running"
    );
    assert!(matches!(
        wait(one.renew_lease(1, 100, lease_ms)),
        Err(MetaError::Fenced(_))
    ));
    let old = pico_meta::SegmentFence {
        node: 1,
        node_epoch: 100,
        epochs: [(fourth, 1)].into_iter().collect(),
        quarantine_refused: false,
    };
    let stale = segment(
        "segments/n1/stale.seg",
        vec![entry(fourth, vec![run(0, 1, 0, 40)], 9, false)],
    );
    assert_eq!(
        wait(one.commit_segment_fenced(stale, old)).unwrap(),
        vec![fourth]
    );
    assert!(wait(two.load_stream(fourth))
        .unwrap()
        .unwrap()
        .snapshot
        .segments
        .is_empty());
    match wait(one.trim_stream_fenced(fourth, 0, by(1, 1))) {
        Err(MetaError::Fenced(message)) => assert!(message.contains("superseded"), "{message}"),
        other => panic!("a superseded incarnation's trim: {other:?}"),
    }
    let node = wait(two.set_slots(1, 0)).unwrap();
    assert_eq!(node.slots, 0);
    assert!(matches!(
        wait(two.set_slots(9, 1)),
        Err(MetaError::NotFound(_))
    ));
    one.shutdown();
    two.shutdown();
}

/// A commit whose answer was lost (the connection dropped at COMMIT, which succeeded) is
/// retried after the stream moved to another node: what the first attempt stored stays, and
/// the retry reports it stored, not fenced. The new owner loaded those records and appends
/// after them; dropping them would leave a hole in the stream's offsets.
#[test]
fn a_retried_commit_keeps_what_the_first_attempt_stored_after_the_stream_moved() {
    let Some(database) = PgDatabase::create("retried_commit") else {
        return;
    };
    let (one, _) = MetaStore::open(&database.meta_url()).unwrap();
    let (two, _) = MetaStore::open(&database.meta_url()).unwrap();
    let lease_ms = 60_000;
    wait(one.register_node(1, 100, "http://one", 1, lease_ms)).unwrap();
    wait(two.register_node(2, 100, "http://two", 1, lease_ms)).unwrap();
    let id = wait(one.create_stream_owned("/r/s", config("text/plain"), false, None, 5, Some(1)))
        .unwrap()
        .row
        .id;
    let fence = pico_meta::SegmentFence {
        node: 1,
        node_epoch: 100,
        epochs: [(id, 1)].into_iter().collect(),
        quarantine_refused: false,
    };
    let record = segment(
        "segments/n1/retried.seg",
        vec![entry(id, vec![run(0, 3, 0, 90)], 9, false)],
    );
    let first = wait(one.commit_segment_fenced(record.clone(), fence.clone())).unwrap();
    assert!(first.is_empty());
    // The stream moves to node 2 (its next owner epoch).
    wait(two.request_transfer("/r/s", 2)).unwrap();
    let fence_one = pico_meta::Fence {
        node: 1,
        node_epoch: 100,
        epoch: 1,
    };
    let epoch = wait(one.complete_transfer(id, fence_one, 2)).unwrap();
    assert_eq!(epoch, 2);
    // Node 1 never got the first answer and commits the same segment again.
    let retried = wait(one.commit_segment_fenced(record, fence)).unwrap();
    assert!(
        retried.is_empty(),
        "stored records reported fenced: {retried:?}"
    );
    let load = wait(two.load_stream(id)).unwrap().unwrap();
    assert_eq!(load.snapshot.segments.len(), 1, "{load:?}");
    assert_eq!(
        load.snapshot.segments[0].streams[0].runs,
        vec![run(0, 3, 0, 90)]
    );
    one.shutdown();
    two.shutdown();
}

/// Offsets are handed out once: a segment whose records for a stream begin below what the
/// catalog already holds of it (a writer with a stale view of the stream) has that entry
/// refused, like a fenced one, and quarantined when the writer asks for it; its other
/// entries commit. Committing the same segment again is measured against the others only.
#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
#[test]
fn a_segment_whose_records_overlap_committed_ones_is_refused_for_that_stream() {
    let Some(database) = PgDatabase::create("overlapping_commit") else {
        return;
    };
    let (one, _) = MetaStore::open(&database.meta_url()).unwrap();
    wait(one.register_node(1, 100, "http://one", 1, 60_000)).unwrap();
    let create = |name: &str| {
        wait(one.create_stream_owned(name, config("text/plain"), false, None, 5, Some(1)))
            .unwrap()
            .row
            .id
    };
    let (a, b, c) = (create("/o/a"), create("/o/b"), create("/o/c"));
    let fence = |quarantine_refused| pico_meta::SegmentFence {
        node: 1,
        node_epoch: 100,
        epochs: [(a, 1), (b, 1), (c, 1)].into_iter().collect(),
        quarantine_refused,
    };
    let first = segment(
        "segments/n1/first.seg",
        vec![
            entry(a, vec![run(0, 3, 0, 30)], 9, false),
            entry(b, vec![run(0, 2, 30, 60)], 9, false),
        ],
    );
    assert_eq!(
        wait(one.commit_segment_fenced(first.clone(), fence(false))).unwrap(),
        Vec::<u64>::new()
    );
    // b's records from 1 were committed already (to 2); a and c continue where they end.
    let second = segment(
        "segments/n1/second.seg",
        vec![
            entry(a, vec![run(3, 5, 0, 30)], 9, false),
            entry(b, vec![run(1, 4, 30, 60)], 9, false),
            entry(c, vec![run(0, 1, 60, 90)], 9, false),
        ],
    );
    assert_eq!(
        wait(one.commit_segment_fenced(second.clone(), fence(false))).unwrap(),
        vec![b]
    );
    // Asked again (a lost answer): the same; the first segment again: all of it stays.
    assert_eq!(
        wait(one.commit_segment_fenced(second, fence(false))).unwrap(),
        vec![b]
    );
    assert_eq!(
        wait(one.commit_segment_fenced(first, fence(false))).unwrap(),
        Vec::<u64>::new()
    );
    let runs_of = |id: u64| -> Vec<SegmentRun> {
        let load = wait(one.load_stream(id)).unwrap().unwrap();
        load.snapshot
            .segments
            .iter()
            .flat_map(|s| s.streams.iter().flat_map(|e| e.runs.clone()))
            .collect()
    };
    assert_eq!(runs_of(a), vec![run(0, 3, 0, 30), run(3, 5, 0, 30)]);
    assert_eq!(runs_of(b), vec![run(0, 2, 30, 60)]);
    assert_eq!(runs_of(c), vec![run(0, 1, 60, 90)]);
    // With local durability the refused records are kept aside, with the reason.
    let third = segment(
        "segments/n1/third.seg",
        vec![entry(a, vec![run(4, 6, 0, 30)], 9, false)],
    );
    assert_eq!(
        wait(one.commit_segment_fenced(third, fence(true))).unwrap(),
        vec![a]
    );
    let quarantined = wait(one.quarantined()).unwrap();
    assert_eq!(quarantined.len(), 1, "{quarantined:?}");
    assert!(quarantined[0].reason.contains("overlap"), "{quarantined:?}");
    assert_eq!(runs_of(a), vec![run(0, 3, 0, 30), run(3, 5, 0, 30)]);
    one.shutdown();
}

/// A metadata log only one node can use refuses the cluster calls with a clear message.
#[test]
fn sqlite_refuses_cluster_calls() {
    let db = Db::sqlite();
    let (store, _) = db.open();
    match wait(store.register_node(1, 1, "http://x", 1, 1000)) {
        Err(MetaError::Unsupported(message)) => assert!(message.contains("postgres"), "{message}"),
        other => panic!("{other:?}"),
    }
    store.shutdown();
}

/// A renewal that lands after the database expired the lease still renews (the node is that
/// incarnation), but says so: other nodes may have taken its streams over in between, and
/// the node revalidates before it acknowledges anything. A renewal in time says nothing.
#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
#[test]
fn a_renewal_after_the_lease_expired_says_so() {
    let Some(database) = PgDatabase::create("renewal_after_lapse") else {
        return;
    };
    let (store, _) = MetaStore::open(&database.meta_url()).unwrap();
    wait(store.register_node(1, 5, "http://one", 1, 60_000)).unwrap();
    let renewed = wait(store.renew_lease(1, 5, 60_000)).unwrap();
    assert!(!renewed.renewed_after_lapse, "renewed in time");
    // A lease of 1 ms has expired by the next statement.
    wait(store.renew_lease(1, 5, 1)).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let late = wait(store.renew_lease(1, 5, 60_000)).unwrap();
    assert!(
        late.renewed_after_lapse,
        "the lease had expired when it landed"
    );
    store.shutdown();
}

/// The cluster-wide listing: every node's rows by prefix in bytewise order (`_` and `%` are
/// plain characters, `Z` sorts before `a`), paged with `start_after`, soft-deleted rows left
/// out, each with its owner and its committed offsets (the last entry's tail, the trim point).
#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
#[test]
fn the_catalog_lists_every_node_s_streams_in_byte_order() {
    let Some(database) = PgDatabase::create("catalog_listing") else {
        return;
    };
    let (one, _) = MetaStore::open(&database.meta_url()).unwrap();
    let (two, _) = MetaStore::open(&database.meta_url()).unwrap();
    wait(one.register_node(1, 100, "http://one", 1, 60_000)).unwrap();
    wait(two.register_node(2, 100, "http://two", 1, 60_000)).unwrap();
    let create = |store: &MetaStore, name: &str, node| {
        wait(store.create_stream_owned(name, config("text/plain"), false, None, 5, Some(node)))
            .unwrap()
            .row
            .id
    };
    let a = create(&one, "/l/a", 1);
    let upper = create(&two, "/l/Z", 2);
    let literal = create(&two, "/l/_%", 2);
    create(&one, "/lx", 1);
    let gone = create(&one, "/l/gone", 1);
    wait(one.soft_delete_stream(gone)).unwrap();
    let fence = |node, id| pico_meta::SegmentFence {
        node,
        node_epoch: 100,
        epochs: [(id, 1)].into_iter().collect(),
        quarantine_refused: false,
    };
    for (key, runs) in [
        ("segments/n1/l1.seg", vec![run(0, 3, 0, 30)]),
        ("segments/n1/l2.seg", vec![run(3, 7, 0, 40)]),
    ] {
        let record = segment(key, vec![entry(a, runs, 9, false)]);
        wait(one.commit_segment_fenced(record, fence(1, a))).unwrap();
    }
    wait(one.trim_stream(a, 2)).unwrap();

    let all = wait(two.list_streams("/l/", "", 10)).unwrap();
    let names: Vec<&str> = all.iter().map(|s| s.row.name.as_str()).collect();
    assert_eq!(names, ["/l/Z", "/l/_%", "/l/a"]);
    let owners: Vec<Option<u32>> = all.iter().map(|s| s.ownership.node).collect();
    assert_eq!(owners, [Some(2), Some(2), Some(1)]);
    let offsets: Vec<(u64, u64)> = all
        .iter()
        .map(|s| (s.start_offset, s.next_offset))
        .collect();
    assert_eq!(offsets, [(0, 0), (0, 0), (2, 7)]);
    assert_eq!((all[0].row.id, all[1].row.id), (upper, literal));

    let first = wait(one.list_streams("/l/", "", 2)).unwrap();
    assert_eq!(first.len(), 2);
    let rest = wait(one.list_streams("/l/", &first[1].row.name, 2)).unwrap();
    let rest: Vec<&str> = rest.iter().map(|s| s.row.name.as_str()).collect();
    assert_eq!(rest, ["/l/a"]);
    let literal_prefix = wait(one.list_streams("/l/_", "", 10)).unwrap();
    assert_eq!(literal_prefix.len(), 1, "_ is no wildcard");
    one.shutdown();
    two.shutdown();
}
