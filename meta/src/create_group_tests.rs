//! Group commit of concurrent creates (`batch.rs`, `apply::create_group`) on real SQLite and
//! real Postgres: fewer transactions than creates, every create durable after a reopen,
//! duplicates answered as sequential creates are, a failed group failing each of its creates.

use std::sync::mpsc;

use futures_lite::future::block_on;

use crate::testing::PgDatabase;
use crate::CreateOutcome;
use crate::MetaError;
use crate::MetaStore;
use crate::MetaUrl;
use crate::Reply;
use crate::StreamConfig;

fn config(content_type: &str) -> StreamConfig {
    StreamConfig {
        content_type: content_type.to_string(),
        ttl_sec: None,
        expires_at_ms: None,
        retention: Default::default(),
    }
}

fn wait<T>(reply: Reply<T>) -> Result<T, MetaError> {
    block_on(reply).expect("the metadata thread answers every command")
}

/// Holds the metadata thread in a job until the returned sender is dropped, so commands sent
/// meanwhile queue up and arrive together, as concurrent creates from every core do.
/// Returns once the job runs, alone in its batch (nothing else was queued).
fn hold(store: &MetaStore) -> (mpsc::Sender<()>, Reply<()>) {
    let (release, held) = mpsc::channel::<()>();
    let (started, running) = mpsc::channel::<()>();
    let done = store.job(move |_| {
        let _ = started.send(());
        let _ = held.recv();
        Ok(())
    });
    running.recv().expect("the hold job runs");
    (release, done)
}

const CREATES: usize = 3_000;

fn concurrent_creates_share_transactions(url: &MetaUrl) {
    let (store, _) = MetaStore::open(url).unwrap();
    let (release, held) = hold(&store);
    let before = store.transactions_committed();
    let mut replies: Vec<Reply<CreateOutcome>> = (0..CREATES)
        .map(|i| store.create_stream(&format!("/c/{i}"), config("text/plain"), 1_000))
        .collect();
    // Repeats inside the same batch: the same config, and another one (the engine compares
    // configs; the catalog answers with the first one's row either way).
    replies.push(store.create_stream("/c/7", config("text/plain"), 2_000));
    replies.push(store.create_stream("/c/8", config("application/json"), 2_000));
    drop(release);
    wait(held).unwrap();
    let outcomes: Vec<CreateOutcome> = replies.into_iter().map(|r| wait(r).unwrap()).collect();
    let transactions = store.transactions_committed() - before;
    // The held job's own batch, then at most ceil(3,002 / MAX_BATCH_COMMANDS) more.
    assert!(
        transactions <= 1 + CREATES.div_ceil(crate::limits::MAX_BATCH_COMMANDS) as u64 + 1,
        "{transactions} transactions for {CREATES} creates"
    );
    for (i, outcome) in outcomes.iter().take(CREATES).enumerate() {
        assert!(outcome.created, "create {i}: {outcome:?}");
        assert_eq!(outcome.row.name, format!("/c/{i}"));
    }
    for (repeat, of) in [(CREATES, 7), (CREATES + 1, 8)] {
        assert!(!outcomes[repeat].created, "{:?}", outcomes[repeat]);
        assert_eq!(outcomes[repeat].row, outcomes[of].row);
    }
    let mut ids: Vec<u64> = outcomes.iter().take(CREATES).map(|o| o.row.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), CREATES, "every stream got its own id");
    store.shutdown();

    let (store, snapshot) = MetaStore::open(url).unwrap();
    assert_eq!(snapshot.streams.len(), CREATES);
    for outcome in outcomes.iter().take(CREATES) {
        let row = snapshot.streams.iter().find(|r| r.id == outcome.row.id);
        assert_eq!(row, Some(&outcome.row), "durable as acknowledged");
    }
    // After the reopen the names are taken: a create answers the stored row.
    let again = wait(store.create_stream("/c/5", config("text/plain"), 3_000)).unwrap();
    assert!(!again.created);
    assert_eq!(again.row, outcomes[5].row);
    store.shutdown();
}

/// One create of a group the database refuses fails the group: every create in it errors,
/// and none of them is found after a reopen (never acknowledged, never registered).
fn failed_group_fails_every_create(url: &MetaUrl, refuse_fail_names: impl FnOnce()) {
    let (store, _) = MetaStore::open(url).unwrap();
    let earlier = wait(store.create_stream("/ok/earlier", config("text/plain"), 1)).unwrap();
    refuse_fail_names();
    let (release, held) = hold(&store);
    let replies: Vec<_> = (0..100)
        .map(|i| {
            let name = if i == 50 {
                "/fail/x".to_string()
            } else {
                format!("/ok/{i}")
            };
            store.create_stream(&name, config("text/plain"), 2)
        })
        .collect();
    drop(release);
    wait(held).unwrap();
    for (i, reply) in replies.into_iter().enumerate() {
        match wait(reply) {
            Err(MetaError::Storage(_)) => {}
            other => panic!("create {i} of the failed group: {other:?}"),
        }
    }
    // The transaction itself goes on: a later create commits.
    assert!(
        wait(store.create_stream("/ok/later", config("text/plain"), 3))
            .unwrap()
            .created
    );
    store.shutdown();
    let (_store, snapshot) = MetaStore::open(url).unwrap();
    let mut names: Vec<&str> = snapshot.streams.iter().map(|r| r.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["/ok/earlier", "/ok/later"]);
    assert_eq!(snapshot.streams[0].id, earlier.row.id);
}

#[test]
fn sqlite_concurrent_creates_share_transactions() {
    let dir = tempfile::tempdir().unwrap();
    concurrent_creates_share_transactions(&MetaUrl::SqliteFile(dir.path().join("meta.db")));
}

#[test]
fn sqlite_failed_group_fails_every_create() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.db");
    let url = MetaUrl::SqliteFile(path.clone());
    failed_group_fails_every_create(&url, || {
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch(
                "CREATE TRIGGER refuse_fail BEFORE INSERT ON streams
                 WHEN NEW.name LIKE '/fail/%' BEGIN SELECT RAISE(ABORT, 'refused'); END;",
            )
            .unwrap();
    });
}

#[test]
#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
fn postgres_concurrent_creates_share_transactions() {
    let Some(db) = PgDatabase::create("concurrent_creates") else {
        return;
    };
    concurrent_creates_share_transactions(&db.meta_url());
}

#[test]
#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
fn postgres_failed_group_fails_every_create() {
    let Some(db) = PgDatabase::create("failed_create_group") else {
        return;
    };
    failed_group_fails_every_create(&db.meta_url(), || {
        db.execute(
            "ALTER TABLE streams ADD CONSTRAINT refuse_fail CHECK (name NOT LIKE '/fail/%')",
        );
    });
}

/// A cluster's look-ups that arrive together share one statement and each gets its own row
/// (or none), a name asked twice included; on SQLite they are refused as before.
#[test]
#[ignore = "needs Postgres: PICOMQ_PG_URL (scripts/pg-up.sh)"]
fn postgres_lookups_in_one_group() {
    let Some(db) = PgDatabase::create("lookup_group") else {
        return;
    };
    let (store, _) = MetaStore::open(&db.meta_url()).unwrap();
    let a = wait(store.create_stream("/l/a", config("text/plain"), 1)).unwrap();
    let b = wait(store.create_stream("/l/b", config("application/json"), 1)).unwrap();
    let (release, held) = hold(&store);
    let replies: Vec<_> = ["/l/a", "/l/missing", "/l/b", "/l/a"]
        .iter()
        .map(|name| store.lookup_stream(name))
        .collect();
    drop(release);
    wait(held).unwrap();
    let rows: Vec<Option<u64>> = replies
        .into_iter()
        .map(|reply| wait(reply).unwrap().map(|(row, _)| row.id))
        .collect();
    assert_eq!(rows, [Some(a.row.id), None, Some(b.row.id), Some(a.row.id)]);

    // Mixed, as a cluster's creates come (each after its own look-up): a look-up after the
    // create of its name sees the new row, one before it does not.
    let (release, held) = hold(&store);
    let first = store.lookup_stream("/l/c");
    let create = store.create_stream("/l/c", config("text/plain"), 2);
    let after = store.lookup_stream("/l/c");
    let other = store.lookup_stream("/l/b");
    drop(release);
    wait(held).unwrap();
    assert_eq!(wait(first).unwrap(), None);
    let c = wait(create).unwrap();
    assert!(c.created);
    assert_eq!(wait(after).unwrap().map(|(row, _)| row.id), Some(c.row.id));
    assert_eq!(wait(other).unwrap().map(|(row, _)| row.id), Some(b.row.id));
}

#[test]
fn sqlite_lookups_are_refused() {
    let (store, _) = MetaStore::open(&MetaUrl::SqliteMemory).unwrap();
    match wait(store.lookup_stream("/l/a")) {
        Err(MetaError::Unsupported(_)) => {}
        other => panic!("{other:?}"),
    }
}
