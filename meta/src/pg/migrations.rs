//! The Postgres schema: its numbered migrations and the one function that applies them, each
//! in its own transaction under an advisory lock so two nodes starting at once migrate once.

use postgres::Client;

use super::errors::failed;

/// The migrations, in order; entry `i` moves the schema from version `i` to `i + 1`, like the
/// SQLite migration of the same number. Append only (see `schema.rs`).
const MIGRATIONS: &[&str] = &[
    // 1: registry and segment catalog.
    "CREATE TABLE streams (
         id            BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
         name          TEXT    NOT NULL UNIQUE,
         content_type  TEXT    NOT NULL,
         ttl_sec       BIGINT,
         expires_at_ms BIGINT,
         closed        BOOLEAN NOT NULL,
         created_ms    BIGINT  NOT NULL
     );
     CREATE TABLE segments (
         seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
         key        TEXT   NOT NULL UNIQUE,
         size_bytes BIGINT NOT NULL,
         created_ms BIGINT NOT NULL
     );
     CREATE TABLE segment_streams (
         segment_seq       BIGINT  NOT NULL REFERENCES segments (seq) ON DELETE CASCADE,
         ord               BIGINT  NOT NULL,
         stream_id         BIGINT  NOT NULL,
         runs              BYTEA   NOT NULL,
         last_timestamp_ms BIGINT  NOT NULL,
         closed            BOOLEAN NOT NULL,
         PRIMARY KEY (segment_seq, ord),
         UNIQUE (segment_seq, stream_id)
     );",
    // 2: trim point of a stream; idempotent producer state per segment entry.
    "ALTER TABLE streams ADD COLUMN start_offset BIGINT NOT NULL DEFAULT 0;
     ALTER TABLE segment_streams ADD COLUMN producers BYTEA NOT NULL DEFAULT ''::bytea;
     ALTER TABLE segment_streams ADD COLUMN closed_by BYTEA;",
    // 3: where a sliding TTL's idle clock stands (NULL: the stream's created_ms).
    "ALTER TABLE streams ADD COLUMN last_access_ms BIGINT;",
    // 4: forks and soft deletes.
    "ALTER TABLE streams ADD COLUMN fork_source TEXT;
     ALTER TABLE streams ADD COLUMN fork_source_id BIGINT;
     ALTER TABLE streams ADD COLUMN fork_offset BIGINT;
     ALTER TABLE streams ADD COLUMN fork_partial_bytes BIGINT;
     ALTER TABLE streams ADD COLUMN soft_deleted BOOLEAN NOT NULL DEFAULT false;",
    // 5: the last writer sequence (Stream-Seq) per segment entry.
    "ALTER TABLE segment_streams ADD COLUMN writer_seq TEXT;",
    // 6: cluster membership and stream ownership.
    "CREATE TABLE nodes (
         node_id          BIGINT PRIMARY KEY,
         epoch            BIGINT NOT NULL,
         address          TEXT   NOT NULL,
         ds_address       TEXT   NOT NULL DEFAULT '',
         slots            BIGINT NOT NULL,
         lease_expires_ms BIGINT NOT NULL,
         registered_ms    BIGINT NOT NULL
     );
     ALTER TABLE streams ADD COLUMN owner_node BIGINT;
     ALTER TABLE streams ADD COLUMN owner_epoch BIGINT NOT NULL DEFAULT 1;
     ALTER TABLE streams ADD COLUMN transfer_to BIGINT;
     CREATE INDEX streams_owner ON streams (owner_node);
     CREATE INDEX segment_streams_stream ON segment_streams (stream_id);",
    // 7: retention policy (NULL: no limit).
    "ALTER TABLE streams ADD COLUMN retention_age_ms BIGINT;
     ALTER TABLE streams ADD COLUMN retention_bytes BIGINT;
     ALTER TABLE streams ADD COLUMN delete_on_empty_ms BIGINT;",
    // 8: the WAL format the nodes of this catalog write, and the quarantine (see the SQLite
    // list).
    "CREATE TABLE wal_format (version BIGINT NOT NULL);
     INSERT INTO wal_format (version) VALUES (2);
     CREATE TABLE quarantine (
         segment_key TEXT   NOT NULL,
         stream_id   BIGINT NOT NULL,
         runs        BYTEA  NOT NULL,
         reason      TEXT   NOT NULL,
         created_ms  BIGINT NOT NULL,
         PRIMARY KEY (segment_key, stream_id)
     );",
    // 9: named consumers (see the SQLite list).
    "CREATE TABLE consumers (
         scope      TEXT   NOT NULL,
         id         TEXT   NOT NULL,
         document   TEXT   NOT NULL,
         updated_ms BIGINT NOT NULL,
         PRIMARY KEY (scope, id)
     );",
    // 10: a consumer's wake webhook (see the SQLite list).
    "ALTER TABLE consumers ADD COLUMN wake TEXT;
     CREATE INDEX consumers_wake ON consumers (scope) WHERE wake IS NOT NULL;",
    // 11: a stream's entries by commit order (see the SQLite list).
    "DROP INDEX segment_streams_stream;
     CREATE INDEX segment_streams_stream_seq ON segment_streams (stream_id, segment_seq);",
    // 12: a scope's consumers counted without reading their documents (see the SQLite list).
    "CREATE INDEX consumers_scope ON consumers (scope, id);",
    // 13: the catalog's identity (see the SQLite list).
    "CREATE TABLE catalog_identity (id TEXT NOT NULL);
     INSERT INTO catalog_identity (id) VALUES (md5(random()::text || clock_timestamp()::text));",
    // 14: no change here (the SQLite catalog's page checksums; the versions stay one list).
    "SELECT 1;",
    // 15: no table change: segment keys under the catalog's id (see the SQLite list).
    "SELECT 1;",
];

/// The schema version this build writes.
pub(crate) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The key of the advisory lock migrations hold: "picometa" in ASCII.
const MIGRATION_LOCK: i64 = 0x7069_636f_6d65_7461;
/// Brings the schema to [`SCHEMA_VERSION`], one migration per transaction, each under the
/// advisory lock; a no-op on an up-to-date database.
pub(super) fn migrate(client: &mut Client) -> Result<(), String> {
    // The version this start found (another node may migrate between our transactions).
    let mut found: Option<i64> = None;
    loop {
        let mut tx = client.transaction().map_err(failed("begin migration"))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .map_err(failed("take the migration lock"))?;
        let exists: bool = tx
            .query_one("SELECT to_regclass('schema_version') IS NOT NULL", &[])
            .map_err(failed("look for schema_version"))?
            .get(0);
        if !exists {
            tx.batch_execute("CREATE TABLE schema_version (version BIGINT PRIMARY KEY)")
                .map_err(failed("create schema_version"))?;
        }
        let current: i64 = tx
            .query_one("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[])
            .map_err(failed("read schema_version"))?
            .get(0);
        if current > SCHEMA_VERSION {
            // Refuse rather than guess: an older binary must not write into a newer layout.
            return Err(format!(
                "the metadata database has schema version {current}, newer than this build's \
                 {SCHEMA_VERSION}; upgrade pico"
            ));
        }
        let found = *found.get_or_insert(current);
        if current == SCHEMA_VERSION {
            tx.commit().map_err(failed("end migration check"))?;
            crate::schema::log_migrated(found, SCHEMA_VERSION);
            return Ok(());
        }
        let version = current + 1;
        tx.batch_execute(MIGRATIONS[current as usize])
            .map_err(failed(&format!("apply schema migration {version}")))?;
        tx.execute(
            "INSERT INTO schema_version (version) VALUES ($1)",
            &[&version],
        )
        .map_err(failed("record schema version"))?;
        tx.commit().map_err(failed("commit migration"))?;
        log::debug!("metadata schema migrated to version {version}");
    }
}
