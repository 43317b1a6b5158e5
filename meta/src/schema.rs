//! The SQLite schema of the metadata log and its migrations.
//!
//! Tables (schema version 2; `(v2)` marks the columns migration 2 added):
//!
//! ```text
//! schema_version   one row per applied migration            append-only
//!   version INTEGER PRIMARY KEY
//!
//! streams          the registry: one row per LIVE stream     row deleted on stream delete
//!   id            INTEGER PRIMARY KEY AUTOINCREMENT          immutable; never reused
//!   name          TEXT NOT NULL UNIQUE                       immutable; reusable after delete
//!   content_type  TEXT NOT NULL                              immutable
//!   ttl_sec       INTEGER NULL                               immutable
//!   expires_at_ms INTEGER NULL                               immutable
//!   closed        INTEGER NOT NULL (0|1)                     0 → 1 only (close is permanent)
//!   created_ms    INTEGER NOT NULL                           immutable
//!   start_offset  INTEGER NOT NULL DEFAULT 0  (v2)           only raised (trim_stream)
//!   last_access_ms INTEGER                     (v3)           only raised (touch_stream); NULL = created_ms
//!   fork_source   TEXT NULL                    (v4)           immutable; source name of a fork
//!   fork_source_id INTEGER NULL                (v4)           immutable; source id of a fork
//!   fork_offset   INTEGER NULL                 (v4)           immutable; records inherited below it
//!   fork_partial_bytes INTEGER NULL            (v4)           immutable; bytes of record fork_offset
//!   soft_deleted  INTEGER NOT NULL DEFAULT 0   (v4)           0 → 1 only; deleted but read by forks
//!   owner_node    INTEGER NULL                 (v6)           cluster: the owning node (NULL: none)
//!   owner_epoch   INTEGER NOT NULL DEFAULT 1   (v6)           +1 on every change of owner (fencing)
//!   transfer_to   INTEGER NULL                 (v6)           cluster: a pending transfer's target
//!   retention_age_ms INTEGER NULL              (v7)           set at create, changed by configure
//!   retention_bytes INTEGER NULL               (v7)           (NULL: that limit is off)
//!   delete_on_empty_ms INTEGER NULL            (v7)
//!
//! nodes            cluster members (v6); rows are never deleted  (Postgres only in practice)
//!   node_id       INTEGER PRIMARY KEY                        --node-id
//!   epoch         INTEGER NOT NULL                           --node-epoch; only grows
//!   address       TEXT NOT NULL                              Pico listener's URL (307 Locations)
//!   ds_address    TEXT NOT NULL DEFAULT ''                   Durable Streams listener's URL
//!   slots         INTEGER NOT NULL                           placement weight; 0 = no new streams
//!   lease_expires_ms INTEGER NOT NULL                        database clock; renewed by the node
//!   registered_ms INTEGER NOT NULL
//!
//! segments         the catalog: one row per committed segment object
//!   seq           INTEGER PRIMARY KEY AUTOINCREMENT          commit order; kept on re-commit
//!   key           TEXT NOT NULL UNIQUE                       object key; the idempotency key
//!                                                              (v15: new ones under
//!                                                              segments/c<catalog id>/)
//!   size_bytes    INTEGER NOT NULL                           replaced on re-commit
//!   created_ms    INTEGER NOT NULL                           replaced on re-commit
//!
//! segment_streams  what one segment holds of one stream
//!   segment_seq   INTEGER NOT NULL → segments.seq (ON DELETE CASCADE)
//!   ord           INTEGER NOT NULL    position in SegmentRecord::streams (keeps its order)
//!   stream_id     INTEGER NOT NULL    deliberately NO foreign key to streams: a deleted
//!                                     stream's entries stay until GC (later work)
//!   runs          BLOB NOT NULL       packed runs, see `runs.rs`
//!   last_timestamp_ms INTEGER NOT NULL
//!   closed        INTEGER NOT NULL (0|1)
//!   producers     BLOB NOT NULL DEFAULT x''  (v2)  packed producer states, see `producers.rs`
//!   closed_by     BLOB NULL                  (v2)  one packed producer; NULL = none
//!   writer_seq    TEXT NULL                  (v5)  last Stream-Seq accepted; NULL = none
//!   PRIMARY KEY (segment_seq, ord), UNIQUE (segment_seq, stream_id)
//!   segment_streams_stream_seq: (stream_id, segment_seq)  (v11; v6-v10: (stream_id))
//!   all columns replaced as a whole when the segment is re-committed
//!
//! every page        (v14) the last 8 bytes: its checksum (`page_checksums.rs`)
//!
//! catalog_identity the catalog's id (v13): one row, made by the migration    never changed
//!   id            TEXT NOT NULL       32 lowercase hex digits (128 random bits)
//!
//! consumers        named consumers (v9): one row per consumer    row deleted on consumer delete
//!   scope         TEXT NOT NULL       the root (or auth scope) it belongs to
//!   id            TEXT NOT NULL       the consumer's id within its scope
//!   document      TEXT NOT NULL       JSON, rewritten whole on every change (net: consumers)
//!   updated_ms    INTEGER NOT NULL    the clock of the last change
//!   wake          TEXT NULL           (v10) JSON {type, url, callback}; NULL = no wake webhook
//!   PRIMARY KEY (scope, id); consumers_wake: (scope) WHERE wake IS NOT NULL
//! ```
//!
//! Why AUTOINCREMENT on `streams.id`: without it SQLite may hand out `max(id) + 1` again after the
//! row with the largest id is deleted, and a recreated stream would then share an id with the
//! segment entries of its deleted predecessor. AUTOINCREMENT keeps the high-water mark in
//! `sqlite_sequence`, inside the same transactions, so ids survive restarts and deletes.
//!
//! Integers are SQLite's signed 64-bit; every `u64` we store (ids, sizes, `start_offset`) is
//! checked on the way in (rusqlite's `u64` conversion fails above `i64::MAX` instead of
//! wrapping). Run offsets and producer epochs/seqs are full `u64`s inside BLOBs and need no such
//! check.
//!
//! Migration 2 only adds columns, with defaults that are right for existing rows: a stream that
//! was never trimmed starts at offset 0, and segments written before producer state was tracked
//! hold no producers and no producer close.

use rusqlite::Connection;

use crate::limits::SQLITE_BUSY_TIMEOUT_SECS;
use crate::MetaError;

/// The migrations, in order; entry `i` moves the schema from version `i` to `i + 1`.
///
/// `pg/migrations.rs` has the same list for PostgreSQL: a new migration goes into both, under one number.
///
/// Append only: an applied migration is never edited, because databases in the field already
/// ran it. Each runs in its own transaction together with the row recording it, so a crash
/// mid-migration leaves the previous version intact.
const MIGRATIONS: &[&str] = &[
    // 1: registry and segment catalog.
    "CREATE TABLE streams (
         id            INTEGER PRIMARY KEY AUTOINCREMENT,
         name          TEXT    NOT NULL UNIQUE,
         content_type  TEXT    NOT NULL,
         ttl_sec       INTEGER,
         expires_at_ms INTEGER,
         closed        INTEGER NOT NULL CHECK (closed IN (0, 1)),
         created_ms    INTEGER NOT NULL
     );
     CREATE TABLE segments (
         seq        INTEGER PRIMARY KEY AUTOINCREMENT,
         key        TEXT    NOT NULL UNIQUE,
         size_bytes INTEGER NOT NULL,
         created_ms INTEGER NOT NULL
     );
     CREATE TABLE segment_streams (
         segment_seq       INTEGER NOT NULL REFERENCES segments (seq) ON DELETE CASCADE,
         ord               INTEGER NOT NULL,
         stream_id         INTEGER NOT NULL,
         runs              BLOB    NOT NULL,
         last_timestamp_ms INTEGER NOT NULL,
         closed            INTEGER NOT NULL CHECK (closed IN (0, 1)),
         PRIMARY KEY (segment_seq, ord),
         UNIQUE (segment_seq, stream_id)
     ) WITHOUT ROWID;",
    // 2: trim point of a stream; idempotent producer state per segment entry.
    "ALTER TABLE streams ADD COLUMN start_offset INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE segment_streams ADD COLUMN producers BLOB NOT NULL DEFAULT x'';
     ALTER TABLE segment_streams ADD COLUMN closed_by BLOB;",
    // 3: where a sliding TTL's idle clock stands (NULL: the stream's created_ms).
    "ALTER TABLE streams ADD COLUMN last_access_ms INTEGER;",
    // 4: forks (where the inherited records come from) and soft deletes (a deleted source
    // some fork still reads).
    "ALTER TABLE streams ADD COLUMN fork_source TEXT;
     ALTER TABLE streams ADD COLUMN fork_source_id INTEGER;
     ALTER TABLE streams ADD COLUMN fork_offset INTEGER;
     ALTER TABLE streams ADD COLUMN fork_partial_bytes INTEGER;
     ALTER TABLE streams ADD COLUMN soft_deleted INTEGER NOT NULL DEFAULT 0;",
    // 5: the last writer sequence (Stream-Seq) per segment entry.
    "ALTER TABLE segment_streams ADD COLUMN writer_seq TEXT;",
    // 6: cluster membership and stream ownership (used on Postgres; kept in the same layout
    // here so both schemas stay one).
    "CREATE TABLE nodes (
         node_id          INTEGER PRIMARY KEY,
         epoch            INTEGER NOT NULL,
         address          TEXT    NOT NULL,
         ds_address       TEXT    NOT NULL DEFAULT '',
         slots            INTEGER NOT NULL,
         lease_expires_ms INTEGER NOT NULL,
         registered_ms    INTEGER NOT NULL
     );
     ALTER TABLE streams ADD COLUMN owner_node INTEGER;
     ALTER TABLE streams ADD COLUMN owner_epoch INTEGER NOT NULL DEFAULT 1;
     ALTER TABLE streams ADD COLUMN transfer_to INTEGER;
     CREATE INDEX streams_owner ON streams (owner_node);
     CREATE INDEX segment_streams_stream ON segment_streams (stream_id);",
    // 7: retention policy (NULL: no limit).
    "ALTER TABLE streams ADD COLUMN retention_age_ms INTEGER;
     ALTER TABLE streams ADD COLUMN retention_bytes INTEGER;
     ALTER TABLE streams ADD COLUMN delete_on_empty_ms INTEGER;",
    // 8: the WAL format the nodes of this catalog write (engine/src/wal_file.rs). Builds of
    // schema 7 read format 2's file header and commit records as records; they refuse a
    // catalog newer than theirs, so going back to one fails loudly instead. Quarantine:
    // records a segment commit refused (the stream moved, was deleted, or the writer was
    // superseded) after they were acknowledged; the garbage collector keeps their segments.
    "CREATE TABLE wal_format (version INTEGER NOT NULL);
     INSERT INTO wal_format (version) VALUES (2);
     CREATE TABLE quarantine (
         segment_key TEXT    NOT NULL,
         stream_id   INTEGER NOT NULL,
         runs        BLOB    NOT NULL,
         reason      TEXT    NOT NULL,
         created_ms  INTEGER NOT NULL,
         PRIMARY KEY (segment_key, stream_id)
     );",
    // 9: named consumers: one JSON document per consumer (its streams, committed offsets,
    // epoch, lease and token digest), keyed by the scope it belongs to and its id; the
    // document's format is the net crate's (`consumers/state.rs`), opaque here.
    "CREATE TABLE consumers (
         scope      TEXT    NOT NULL,
         id         TEXT    NOT NULL,
         document   TEXT    NOT NULL,
         updated_ms INTEGER NOT NULL,
         PRIMARY KEY (scope, id)
     ) WITHOUT ROWID;",
    // 10: a consumer's wake webhook, a column of its own so the nodes can list the consumers
    // with one (every node reloads them to wake them on appends it takes) without reading
    // every document.
    "ALTER TABLE consumers ADD COLUMN wake TEXT;
     CREATE INDEX consumers_wake ON consumers (scope) WHERE wake IS NOT NULL;",
    // 11: a stream's entries by commit order, so a cluster's segment commit finds a stream's
    // newest entry in one index step (its records must come after it: `fence.rs`); it serves
    // the look-ups by stream alone that the index it replaces served.
    "DROP INDEX segment_streams_stream;
     CREATE INDEX segment_streams_stream_seq ON segment_streams (stream_id, segment_seq);",
    // 12: a scope's consumers counted without reading their documents. The table is WITHOUT
    // ROWID, so its primary key's cells hold whole rows, and a step over a cell whose row
    // overflows its page reads the row (a document of 256 long stream names is hundreds of
    // KiB): on the key, counting a scope of 1,000 such consumers, as each new registration
    // does, would read every one of them.
    "CREATE INDEX consumers_scope ON consumers (scope, id);",
    // 13: the catalog's identity, 128 random bits made once: a node's bucket holds a marker
    // named by it (`engine/src/bucket_check.rs`), which tells the catalog's own bucket that
    // lost its segments from another bucket.
    "CREATE TABLE catalog_identity (id TEXT NOT NULL);
     INSERT INTO catalog_identity (id) VALUES (lower(hex(randomblob(16))));",
    // 14: no table changes: a catalog file this build opens has page checksums
    // (`page_checksums.rs`), and a build before them, which would write pages without their
    // checksums, must refuse it as a newer schema. `user_version` mirrors the version for an
    // operator's `sqlite3` shell.
    "PRAGMA user_version = 14;",
    // 15: no table changes: this build stores new segments under the catalog's id
    // (`engine/src/placement.rs`) and recovers a WAL file by either key; a build before it,
    // which knows only the key without the id, would store a WAL file this build had already
    // committed a second time, so it must refuse the catalog as a newer schema.
    "PRAGMA user_version = 15;",
];

/// The schema version this build writes.
pub(crate) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Sets the connection options every metadata connection needs, before any other statement.
///
/// - `journal_mode=WAL`: readers (an operator's `sqlite3` shell) never block the writer thread.
/// - `synchronous=FULL`: in WAL mode, NORMAL may lose the last commits on power loss; FULL
///   fsyncs the WAL on every commit, so a transaction we answered `Ok` for survives kill -9 and
///   power loss. Group commit keeps that to one fsync per batch.
/// - `foreign_keys=ON`: SQLite's default is off, and the cascade from `segments` relies on it.
/// - `busy_timeout`: wait for a short lock held by an outside reader instead of failing.
pub(crate) fn configure(conn: &Connection, in_memory: bool) -> Result<(), MetaError> {
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(storage("set journal_mode=WAL"))?;
    // An in-memory database has no file to log to and reports "memory"; that is expected.
    if !in_memory && !mode.eq_ignore_ascii_case("wal") {
        return Err(MetaError::Storage(format!(
            "could not switch the metadata database to WAL journal mode (it reports {mode:?})"
        )));
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(storage("set synchronous=FULL"))?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(storage("enable foreign keys"))?;
    conn.busy_timeout(std::time::Duration::from_secs(SQLITE_BUSY_TIMEOUT_SECS))
        .map_err(storage("set busy_timeout"))?;
    Ok(())
}

/// Brings the schema to [`SCHEMA_VERSION`]; a no-op on an up-to-date database.
pub(crate) fn migrate(conn: &mut Connection) -> Result<(), MetaError> {
    conn.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY)")
        .map_err(storage("create schema_version"))?;
    let current: i64 = conn
        .query_row(
            "SELECT COALESCE(MAX(version), 0) FROM schema_version",
            [],
            |row| row.get(0),
        )
        .map_err(storage("read schema_version"))?;
    if current > SCHEMA_VERSION {
        // Refuse rather than guess: an older binary must not write into a newer layout.
        return Err(MetaError::Storage(format!(
            "the metadata database has schema version {current}, newer than this build's \
             {SCHEMA_VERSION}; upgrade pico"
        )));
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let version = index as i64 + 1;
        let tx = conn.transaction().map_err(storage("begin migration"))?;
        tx.execute_batch(sql)
            .map_err(storage(&format!("apply schema migration {version}")))?;
        tx.execute(
            "INSERT INTO schema_version (version) VALUES (?1)",
            [version],
        )
        .map_err(storage("record schema version"))?;
        tx.commit().map_err(storage("commit migration"))?;
        log::debug!("metadata schema migrated to version {version}");
    }
    log_migrated(current, SCHEMA_VERSION);
    Ok(())
}

/// One line for what a start did to the schema: made it, or moved it on.
pub(crate) fn log_migrated(from: i64, to: i64) {
    match from {
        0 => log::info!("metadata schema created (version {to})"),
        from if from < to => log::info!("metadata schema migrated from version {from} to {to}"),
        _ => {}
    }
}

/// Wraps a rusqlite error with what we were doing, for [`MetaError::Storage`] (or
/// [`MetaError::OutOfSpace`] for a full disk).
pub(crate) fn storage(doing: &str) -> impl Fn(rusqlite::Error) -> MetaError + '_ {
    move |error| sqlite_error(error).doing(doing)
}

/// A rusqlite error as a [`MetaError`]: a full disk is [`MetaError::OutOfSpace`], anything
/// else [`MetaError::Storage`].
pub(crate) fn sqlite_error(error: rusqlite::Error) -> MetaError {
    match error.sqlite_error().map(|e| (e.code, e.extended_code)) {
        Some((_, rusqlite::ffi::SQLITE_IOERR_DATA)) => MetaError::Storage(
            "a page of the catalog fails its checksum: the file is damaged (a flipped bit, a \
             bad sector), or another program changed it (reading it with the sqlite3 shell is \
             safe; changing it is not); restore it from a backup (pico admin restore)"
                .to_string(),
        ),
        Some((rusqlite::ErrorCode::DiskFull, _)) => MetaError::OutOfSpace(error.to_string()),
        _ => MetaError::Storage(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use futures_lite::future::block_on;

    use super::*;
    use crate::MetaStore;
    use crate::MetaUrl;
    use crate::SegmentRecord;
    use crate::SegmentRun;
    use crate::SegmentStreamEntry;
    use crate::StreamConfig;
    use crate::StreamRow;

    fn versions(conn: &Connection) -> Vec<i64> {
        let mut query = conn
            .prepare("SELECT version FROM schema_version ORDER BY version")
            .unwrap();
        let rows = query.query_map([], |row| row.get(0)).unwrap();
        rows.collect::<rusqlite::Result<_>>().unwrap()
    }

    /// A database written by a build that only knew migration 1 opens, migrates to the current
    /// version and keeps its rows, with the defaults of the new columns.
    #[test]
    fn a_version_1_database_is_migrated_with_its_rows_intact() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        {
            // What a version-1 build left behind, written the way it wrote it.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE schema_version (version INTEGER PRIMARY KEY);
                 INSERT INTO schema_version (version) VALUES (1);",
            )
            .unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.execute(
                "INSERT INTO streams (name, content_type, ttl_sec, expires_at_ms, closed,
                                      created_ms)
                 VALUES ('/old', 'text/plain', 30, NULL, 1, 1000)",
                [],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO segments (key, size_bytes, created_ms)
                 VALUES ('segments/old.seg', 64, 2000)",
                [],
            )
            .unwrap();
            // The fixed run layout: the only one such a build knew.
            let runs = crate::runs::encode_fixed(&[SegmentRun {
                first_offset: 0,
                next_offset: 4,
                byte_start: 0,
                byte_end: 64,
            }]);
            conn.execute(
                "INSERT INTO segment_streams
                    (segment_seq, ord, stream_id, runs, last_timestamp_ms, closed)
                 VALUES (1, 0, 1, ?1, 1500, 1)",
                [runs],
            )
            .unwrap();
            assert_eq!(versions(&conn), [1]);
        }

        let (store, snapshot) = MetaStore::open(&MetaUrl::SqliteFile(path.clone())).unwrap();
        let old = StreamRow {
            id: 1,
            name: "/old".into(),
            config: StreamConfig {
                content_type: "text/plain".into(),
                ttl_sec: Some(30),
                expires_at_ms: None,
                retention: Default::default(),
            },
            closed: true,
            created_ms: 1000,
            start_offset: 0,
            last_access_ms: 1000,
            fork: None,
            soft_deleted: false,
        };
        assert_eq!(snapshot.streams, vec![old.clone()]);
        let segment = SegmentRecord {
            key: "segments/old.seg".into(),
            size_bytes: 64,
            created_ms: 2000,
            streams: vec![SegmentStreamEntry {
                stream_id: 1,
                runs: vec![SegmentRun {
                    first_offset: 0,
                    next_offset: 4,
                    byte_start: 0,
                    byte_end: 64,
                }],
                last_timestamp_ms: 1500,
                closed: true,
                producers: vec![],
                closed_by: None,
                writer_seq: None,
            }],
        };
        assert_eq!(snapshot.segments, vec![segment.clone()]);

        // The migrated database takes the new columns' writes.
        block_on(store.trim_stream(1, 3)).unwrap().unwrap();
        let created = block_on(store.create_stream("/new", old.config.clone(), 3000))
            .unwrap()
            .unwrap();
        assert!(created.created);
        assert!(created.row.id > 1);
        store.shutdown();

        let (store, snapshot) = MetaStore::open(&MetaUrl::SqliteFile(path.clone())).unwrap();
        store.shutdown();
        assert_eq!(
            snapshot.streams,
            vec![
                StreamRow {
                    start_offset: 3,
                    ..old
                },
                created.row
            ]
        );
        assert_eq!(snapshot.segments, vec![segment]);
        let conn = Connection::open(&path).unwrap();
        assert_eq!(
            versions(&conn),
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
        );
        assert_eq!(SCHEMA_VERSION, 15);
    }

    #[test]
    fn migrating_twice_is_a_no_op() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let id: String = conn
            .query_row("SELECT id FROM catalog_identity", [], |row| row.get(0))
            .unwrap();
        assert_eq!(id.len(), 32, "{id}");
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        migrate(&mut conn).unwrap();
        assert_eq!(
            versions(&conn),
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
        );
        let again: String = conn
            .query_row("SELECT id FROM catalog_identity", [], |row| row.get(0))
            .unwrap();
        assert_eq!(again, id, "the id is made once");
    }

    /// Counting a scope's consumers (each registration of a new one does) steps over the
    /// narrow index, never over the table's own cells, which hold whole documents.
    #[test]
    fn a_scope_is_counted_on_its_narrow_index() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let plan: Vec<String> = conn
            .prepare("EXPLAIN QUERY PLAN SELECT count(*) FROM consumers WHERE scope = ?1")
            .unwrap()
            .query_map([""], |row| row.get::<_, String>(3))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(
            plan.iter()
                .any(|step| step.contains("COVERING INDEX consumers_scope")),
            "{plan:?}"
        );
    }
}
