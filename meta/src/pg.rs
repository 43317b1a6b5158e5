//! The PostgreSQL [`Backend`]: one connection of the synchronous `postgres` client, owned by the
//! metadata thread, and the Postgres schema with its migrations.
//!
//! The tables and columns are those of the SQLite schema (drawn in `schema.rs`), in Postgres
//! types:
//!
//! ```text
//!  SQLite                              Postgres
//!  INTEGER PRIMARY KEY AUTOINCREMENT   BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY
//!                                      (a sequence: never hands an id out twice, rollbacks and
//!                                      deletes included)
//!  INTEGER                             BIGINT
//!  INTEGER (0|1)                       BOOLEAN
//!  TEXT                                TEXT
//!  BLOB                                BYTEA (the same packed formats, `runs.rs`, `producers.rs`)
//!  max(a, b)                           GREATEST(a, b)
//! ```
//!
//! Migrations are numbered like SQLite's (version 6 is the same layout in both) and are recorded
//! in the same `schema_version` table. Each runs in its own transaction holding a
//! transaction-level advisory lock, and re-reads the version under that lock, so two nodes
//! starting at once on one database migrate it once.
//!
//! A batch is one transaction (READ COMMITTED); a committed transaction is durable with
//! `synchronous_commit` on, which the connection makes sure of. When the connection drops, the
//! batch in flight fails with [`MetaError::Storage`], and the next batch reconnects, at most
//! once per back-off period (doubling from 100 ms to 5 s) while the server stays away.
//!
//! TLS is not supported yet: a URL with `sslmode=require` fails at startup.

use std::collections::HashMap;
use std::time::Duration;
use std::time::Instant;

use postgres::fallible_iterator::FallibleIterator;
use postgres::types::FromSqlOwned;
use postgres::types::ToSql;
use postgres::Client;
use postgres::NoTls;
use postgres::Row;
use postgres::Statement;

use crate::backend;
use crate::backend::entry_columns;
use crate::backend::segment_columns;
use crate::backend::select_stream;
use crate::backend::stream_columns;
use crate::backend::Backend;
use crate::backend::EntryColumns;
use crate::backend::NewStream;
use crate::backend::SegmentColumns;
use crate::backend::StreamColumns;
use crate::backend::StreamUpdate;
use crate::backend::{ClusterSql, NodeId, NodeRow};
use crate::MetaError;
use crate::MetaUrl;

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
];

/// The schema version this build writes.
pub(crate) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The key of the advisory lock migrations hold: "picometa" in ASCII.
const MIGRATION_LOCK: i64 = 0x7069_636f_6d65_7461;

/// Reconnect attempts while the server is away: the first at once, then at most one per
/// period, which doubles from the first to the last.
const FIRST_RETRY: Duration = Duration::from_millis(100);
const LAST_RETRY: Duration = Duration::from_secs(5);

/// Defaults for what the URL leaves unset: a dead address must not hang startup, and a server
/// that stops answering mid-statement must not hang the metadata thread.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) struct Postgres {
    config: postgres::Config,
    /// The URL with its password masked, for every message.
    url: String,
    /// `None` after the connection was found broken, until a reconnect succeeds.
    client: Option<Client>,
    /// Statements prepared on `client`, by SQL text; cleared with it.
    statements: HashMap<&'static str, Statement>,
    /// No reconnect is attempted before this instant.
    retry_at: Instant,
    retry_delay: Duration,
    /// Why the last reconnect failed, repeated to the commands failed until the next one.
    last_error: String,
}

impl Postgres {
    /// Connects, migrates the schema and returns the backend; every error names the URL (with
    /// its password masked).
    pub(crate) fn open(url: &MetaUrl) -> Result<Postgres, MetaError> {
        let MetaUrl::Postgres(raw) = url else {
            unreachable!("Postgres::open is only called for postgres:// URLs");
        };
        let shown = url.to_string();
        let mut config: postgres::Config = raw
            .parse()
            .map_err(|error| MetaError::BadUrl(format!("invalid --meta-url {shown}: {error}")))?;
        if config.get_application_name().is_none() {
            config.application_name("pico");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_tcp_user_timeout().is_none() {
            config.tcp_user_timeout(TCP_USER_TIMEOUT);
        }
        let mut client = connect(&config).map_err(|why| {
            MetaError::Storage(format!(
                "cannot connect to metadata database {shown}: {why}"
            ))
        })?;
        migrate(&mut client).map_err(|why| MetaError::Storage(format!("{shown}: {why}")))?;
        Ok(Postgres {
            config,
            url: shown,
            client: Some(client),
            statements: HashMap::new(),
            retry_at: Instant::now(),
            retry_delay: FIRST_RETRY,
            last_error: String::new(),
        })
    }

    /// The connection, reconnecting first when it was lost (and the back-off allows).
    fn connected(&mut self) -> Result<&mut Client, String> {
        if self.client.as_ref().is_some_and(Client::is_closed) {
            self.disconnect();
        }
        if self.client.is_none() {
            let now = Instant::now();
            if now < self.retry_at {
                return Err(format!(
                    "not connected to {} (next attempt in {} ms): {}",
                    self.url,
                    (self.retry_at - now).as_millis(),
                    self.last_error
                ));
            }
            match connect(&self.config) {
                Ok(client) => {
                    log::info!("metadata database {}: reconnected", self.url);
                    self.client = Some(client);
                    self.retry_delay = FIRST_RETRY;
                }
                Err(why) => {
                    self.retry_at = now + self.retry_delay;
                    self.retry_delay = (self.retry_delay * 2).min(LAST_RETRY);
                    let message = format!("cannot reconnect to {}: {why}", self.url);
                    self.last_error = why;
                    return Err(message);
                }
            }
        }
        Ok(self.client.as_mut().expect("connected above"))
    }

    /// Forgets a broken connection (and what was prepared on it).
    fn disconnect(&mut self) {
        if self.client.take().is_some() {
            log::warn!("metadata database {}: connection lost", self.url);
        }
        self.statements.clear();
    }

    /// The connection and the prepared form of `sql` on it, for a data statement (inside a
    /// batch, so [`Backend::begin`] connected).
    fn prepared(
        &mut self,
        sql: &'static str,
        doing: &str,
    ) -> Result<(&mut Client, Statement), MetaError> {
        let Some(client) = self.client.as_mut() else {
            return Err(MetaError::Storage(format!(
                "{doing}: not connected to {}",
                self.url
            )));
        };
        let statement = match self.statements.get(sql) {
            Some(statement) => statement.clone(),
            None => {
                let statement = client.prepare(sql).map_err(storage(doing))?;
                self.statements.insert(sql, statement.clone());
                statement
            }
        };
        Ok((client, statement))
    }

    fn query(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        doing: &str,
    ) -> Result<Vec<Row>, MetaError> {
        let (client, statement) = self.prepared(sql, doing)?;
        client.query(&statement, params).map_err(storage(doing))
    }

    fn execute(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        doing: &str,
    ) -> Result<u64, MetaError> {
        let (client, statement) = self.prepared(sql, doing)?;
        client.execute(&statement, params).map_err(storage(doing))
    }
}

/// Opens one connection and makes sure a commit it reports is durable.
fn connect(config: &postgres::Config) -> Result<Client, String> {
    let mut client = config.connect(NoTls).map_err(|error| describe(&error))?;
    let mode: String = client
        .query_one("SHOW synchronous_commit", &[])
        .map_err(|error| describe(&error))?
        .get(0);
    if mode == "off" {
        // The server's default would acknowledge commits that a crash can still lose.
        client
            .batch_execute("SET synchronous_commit TO on")
            .map_err(|error| describe(&error))?;
    }
    Ok(client)
}

/// Brings the schema to [`SCHEMA_VERSION`], one migration per transaction, each under the
/// advisory lock; a no-op on an up-to-date database.
fn migrate(client: &mut Client) -> Result<(), String> {
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
        if current == SCHEMA_VERSION {
            return tx.commit().map_err(failed("end migration check"));
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
        log::info!("metadata schema migrated to version {version}");
    }
}

/// A client error with its causes: `postgres::Error`'s own text is only the kind ("db error"),
/// the server's message is its source.
fn describe(error: &postgres::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn failed(doing: &str) -> impl Fn(postgres::Error) -> String + '_ {
    move |error| format!("{doing}: {}", describe(&error))
}

/// Wraps a client error with what we were doing, for [`MetaError::Storage`].
fn storage(doing: &str) -> impl Fn(postgres::Error) -> MetaError + '_ {
    move |error| MetaError::Storage(format!("{doing}: {}", describe(&error)))
}

/// Rows of three columns as tuples (a column of another type is a storage error).
fn triples<A, B, C>(rows: &[Row], doing: &str) -> Result<Vec<(A, B, C)>, MetaError>
where
    A: FromSqlOwned,
    B: FromSqlOwned,
    C: FromSqlOwned,
{
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
        .collect::<Result<_, postgres::Error>>()
        .map_err(storage(doing))
}

fn stream_columns(row: &Row) -> Result<StreamColumns, postgres::Error> {
    Ok(stream_columns!(row, try_get))
}

impl Backend for Postgres {
    fn begin(&mut self) -> Result<(), String> {
        match self.connected()?.batch_execute("BEGIN") {
            Ok(()) => Ok(()),
            Err(error) => {
                // Nothing of the batch ran yet, so a connection that died while idle (a
                // restarted server, a dropped idle connection) costs one immediate reconnect,
                // not the batch.
                log::warn!(
                    "metadata database {}: begin failed ({}); reconnecting",
                    self.url,
                    describe(&error)
                );
                self.disconnect();
                self.retry_at = Instant::now();
                self.connected()?
                    .batch_execute("BEGIN")
                    .map_err(|error| describe(&error))
            }
        }
    }

    fn begin_read(&mut self) -> Result<(), String> {
        self.connected()?
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .map_err(|error| describe(&error))
    }

    fn execute_batch(&mut self, sql: &str) -> Result<(), String> {
        let client = self
            .client
            .as_mut()
            .ok_or_else(|| format!("not connected to {}", self.url))?;
        client.batch_execute(sql).map_err(|error| describe(&error))
    }

    fn rollback(&mut self) {
        if let Some(client) = self.client.as_mut() {
            if client.batch_execute("ROLLBACK").is_err() {
                // The transaction cannot be ended, so the connection is of no further use.
                self.disconnect();
            }
        }
    }

    fn transaction_lost(&mut self) -> Option<String> {
        self.client
            .as_ref()
            .is_none_or(Client::is_closed)
            .then(|| format!("the connection to {} was lost", self.url))
    }

    fn find_stream(&mut self, name: &str) -> Result<Option<StreamColumns>, MetaError> {
        const SQL: &str = concat!(select_stream!(), " WHERE name = $1");
        let rows = self.query(SQL, &[&name], "look up stream")?;
        rows.first()
            .map(stream_columns)
            .transpose()
            .map_err(storage("look up stream"))
    }

    fn insert_stream(&mut self, stream: &NewStream<'_>) -> Result<Option<i64>, MetaError> {
        let rows = self.query(
            "INSERT INTO streams (name, content_type, ttl_sec, expires_at_ms, closed, created_ms,
                                  fork_source, fork_source_id, fork_offset, fork_partial_bytes,
                                  owner_node, retention_age_ms, retention_bytes,
                                  delete_on_empty_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
             ON CONFLICT (name) DO NOTHING
             RETURNING id",
            &[
                &stream.name,
                &stream.content_type,
                &stream.ttl_sec,
                &stream.expires_at_ms,
                &stream.closed,
                &stream.created_ms,
                &stream.fork_source,
                &stream.fork_source_id,
                &stream.fork_offset,
                &stream.fork_partial_bytes,
                &stream.owner_node,
                &stream.retention[0],
                &stream.retention[1],
                &stream.retention[2],
            ],
            "insert stream",
        )?;
        rows.first()
            .map(|row| row.try_get(0))
            .transpose()
            .map_err(storage("insert stream"))
    }

    fn delete_stream(&mut self, id: i64) -> Result<bool, MetaError> {
        let removed = self.execute("DELETE FROM streams WHERE id = $1", &[&id], "delete stream")?;
        Ok(removed > 0)
    }

    fn update_stream(&mut self, id: i64, update: StreamUpdate) -> Result<(), MetaError> {
        match update {
            StreamUpdate::Close => self.execute(
                "UPDATE streams SET closed = true WHERE id = $1",
                &[&id],
                "close stream",
            ),
            StreamUpdate::SoftDelete => self.execute(
                "UPDATE streams SET soft_deleted = true WHERE id = $1",
                &[&id],
                "soft-delete stream",
            ),
            StreamUpdate::RaiseStart(offset) => self.execute(
                "UPDATE streams SET start_offset = GREATEST(start_offset, $2) WHERE id = $1",
                &[&id, &offset],
                "trim stream",
            ),
            StreamUpdate::RaiseLastAccess(ms) => self.execute(
                "UPDATE streams
                 SET last_access_ms = GREATEST(COALESCE(last_access_ms, created_ms), $2)
                 WHERE id = $1",
                &[&id, &ms],
                "touch stream",
            ),
            StreamUpdate::SetRetention([age, bytes, empty]) => self.execute(
                "UPDATE streams
                 SET retention_age_ms = $2, retention_bytes = $3, delete_on_empty_ms = $4
                 WHERE id = $1",
                &[&id, &age, &bytes, &empty],
                "configure stream",
            ),
        }?;
        Ok(())
    }

    fn upsert_segment(
        &mut self,
        key: &str,
        size_bytes: i64,
        created_ms: i64,
    ) -> Result<i64, MetaError> {
        let rows = self.query(
            "INSERT INTO segments (key, size_bytes, created_ms) VALUES ($1, $2, $3)
             ON CONFLICT (key) DO UPDATE
                SET size_bytes = excluded.size_bytes, created_ms = excluded.created_ms
             RETURNING seq",
            &[&key, &size_bytes, &created_ms],
            "insert segment",
        )?;
        match rows.first() {
            Some(row) => row.try_get(0).map_err(storage("insert segment")),
            None => Err(MetaError::Storage(
                "insert segment: no seq returned".to_string(),
            )),
        }
    }

    fn replace_entries(&mut self, seq: i64, entries: &[EntryColumns]) -> Result<(), MetaError> {
        self.execute(
            "DELETE FROM segment_streams WHERE segment_seq = $1",
            &[&seq],
            "replace segment entries",
        )?;
        if entries.is_empty() {
            return Ok(());
        }
        // One statement for the whole segment (hundreds of entries): one round trip, not one
        // per entry. Column arrays, zipped back into rows by unnest; ord counts from 0.
        let stream_ids: Vec<i64> = entries.iter().map(|e| e.stream_id).collect();
        let runs: Vec<&[u8]> = entries.iter().map(|e| e.runs.as_slice()).collect();
        let timestamps: Vec<i64> = entries.iter().map(|e| e.last_timestamp_ms).collect();
        let closed: Vec<bool> = entries.iter().map(|e| e.closed).collect();
        let producers: Vec<&[u8]> = entries.iter().map(|e| e.producers.as_slice()).collect();
        let closed_by: Vec<Option<&[u8]>> =
            entries.iter().map(|e| e.closed_by.as_deref()).collect();
        let writer_seqs: Vec<Option<&str>> =
            entries.iter().map(|e| e.writer_seq.as_deref()).collect();
        self.execute(
            "INSERT INTO segment_streams
                (segment_seq, ord, stream_id, runs, last_timestamp_ms, closed,
                 producers, closed_by, writer_seq)
             SELECT $1, e.ord - 1, e.stream_id, e.runs, e.last_timestamp_ms, e.closed,
                    e.producers, e.closed_by, e.writer_seq
             FROM unnest($2::BIGINT[], $3::BYTEA[], $4::BIGINT[], $5::BOOLEAN[], $6::BYTEA[],
                         $7::BYTEA[], $8::TEXT[])
                  WITH ORDINALITY
                  AS e (stream_id, runs, last_timestamp_ms, closed, producers, closed_by,
                        writer_seq, ord)",
            &[
                &seq,
                &stream_ids,
                &runs,
                &timestamps,
                &closed,
                &producers,
                &closed_by,
                &writer_seqs,
            ],
            "insert segment entries",
        )?;
        Ok(())
    }

    fn delete_segment(&mut self, key: &str) -> Result<(), MetaError> {
        self.execute(
            "DELETE FROM segments WHERE key = $1",
            &[&key],
            "drop segment",
        )?;
        Ok(())
    }

    fn streams(&mut self) -> Result<Vec<StreamColumns>, MetaError> {
        const SQL: &str = concat!(select_stream!(), " ORDER BY id");
        let rows = self.query(SQL, &[], "load streams")?;
        rows.iter()
            .map(stream_columns)
            .collect::<Result<_, _>>()
            .map_err(storage("load streams"))
    }

    fn segments(&mut self) -> Result<Vec<SegmentColumns>, MetaError> {
        let rows = self.query(backend::SELECT_SEGMENTS, &[], "load segments")?;
        let segment = |row: &Row| Ok(segment_columns!(row, try_get));
        rows.iter()
            .map(segment)
            .collect::<Result<_, postgres::Error>>()
            .map_err(storage("load segments"))
    }

    fn cluster(&mut self) -> Option<&mut dyn ClusterSql> {
        Some(self)
    }

    fn for_each_entry(
        &mut self,
        visit: &mut dyn FnMut(i64, Result<EntryColumns, String>) -> Result<(), MetaError>,
    ) -> Result<(), MetaError> {
        let doing = "load segment entries";
        let (client, statement) = self.prepared(backend::SELECT_ENTRIES, doing)?;
        // Streamed row by row: the catalog can be large.
        let no_params: [&(dyn ToSql + Sync); 0] = [];
        let mut rows = client
            .query_raw(&statement, no_params)
            .map_err(storage(doing))?;
        while let Some(row) = rows.next().map_err(storage(doing))? {
            let seq: i64 = row.try_get(0).map_err(storage("read segment entry"))?;
            let columns = (|| Ok(entry_columns!(row, try_get)))();
            visit(
                seq,
                columns.map_err(|error: postgres::Error| describe(&error)),
            )?;
        }
        Ok(())
    }
}

/// The database clock in Unix ms (`clock_timestamp`, not the transaction's start: a batch
/// may be long).
macro_rules! now_ms {
    () => {
        "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT"
    };
}

fn node_row(row: &Row) -> Result<NodeRow, postgres::Error> {
    let id: i64 = row.try_get(0)?;
    let epoch: i64 = row.try_get(1)?;
    let slots: i64 = row.try_get(3)?;
    Ok(NodeRow {
        id: id as NodeId,
        epoch: epoch as u64,
        address: row.try_get(2)?,
        ds_address: row.try_get(6)?,
        slots: slots.max(0) as u64,
        lease_expires_ms: row.try_get(4)?,
        registered_ms: row.try_get(5)?,
    })
}

const SELECT_NODE: &str =
    "SELECT node_id, epoch, address, slots, lease_expires_ms, registered_ms, ds_address FROM nodes";

impl ClusterSql for Postgres {
    fn clock_ms(&mut self) -> Result<i64, MetaError> {
        let rows = self.query(concat!("SELECT ", now_ms!()), &[], "read the clock")?;
        rows.first()
            .map(|row| row.try_get(0))
            .transpose()
            .map_err(storage("read the clock"))?
            .ok_or_else(|| MetaError::Storage("read the clock: no row".into()))
    }

    fn lock_node(&mut self, node: i64) -> Result<Option<NodeRow>, MetaError> {
        let rows = self.query(
            "SELECT node_id, epoch, address, slots, lease_expires_ms, registered_ms, ds_address
             FROM nodes WHERE node_id = $1 FOR UPDATE",
            &[&node],
            "lock node",
        )?;
        rows.first()
            .map(node_row)
            .transpose()
            .map_err(storage("lock node"))
    }

    fn upsert_node(
        &mut self,
        node: i64,
        epoch: i64,
        address: &str,
        slots: i64,
        lease_ms: i64,
    ) -> Result<(), MetaError> {
        self.execute(
            concat!(
                "INSERT INTO nodes (node_id, epoch, address, slots, lease_expires_ms, registered_ms)
                 VALUES ($1, $2, $3, $4, ",
                now_ms!(),
                " + $5, ",
                now_ms!(),
                ")
                 ON CONFLICT (node_id) DO UPDATE
                    SET epoch = excluded.epoch, address = excluded.address, ds_address = '',
                        slots = excluded.slots, lease_expires_ms = excluded.lease_expires_ms,
                        registered_ms = excluded.registered_ms"
            ),
            &[&node, &epoch, &address, &slots, &lease_ms],
            "register node",
        )?;
        Ok(())
    }

    fn renew(&mut self, node: i64, epoch: i64, lease_ms: i64) -> Result<bool, MetaError> {
        let renewed = self.execute(
            concat!(
                "UPDATE nodes SET lease_expires_ms = ",
                now_ms!(),
                " + $3 WHERE node_id = $1 AND epoch = $2"
            ),
            &[&node, &epoch, &lease_ms],
            "renew lease",
        )?;
        Ok(renewed > 0)
    }

    fn release(&mut self, node: i64, epoch: i64) -> Result<(), MetaError> {
        self.execute(
            "UPDATE nodes SET lease_expires_ms = 0 WHERE node_id = $1 AND epoch = $2",
            &[&node, &epoch],
            "release lease",
        )?;
        Ok(())
    }

    fn set_slots(&mut self, node: i64, slots: i64) -> Result<bool, MetaError> {
        let changed = self.execute(
            "UPDATE nodes SET slots = $2 WHERE node_id = $1",
            &[&node, &slots],
            "set slots",
        )?;
        Ok(changed > 0)
    }

    fn set_address(
        &mut self,
        node: i64,
        epoch: i64,
        address: &str,
        ds_address: &str,
    ) -> Result<bool, MetaError> {
        let changed = self.execute(
            "UPDATE nodes SET address = $3, ds_address = $4 WHERE node_id = $1 AND epoch = $2",
            &[&node, &epoch, &address, &ds_address],
            "advertise address",
        )?;
        Ok(changed > 0)
    }

    fn nodes(&mut self) -> Result<Vec<NodeRow>, MetaError> {
        const SQL: &str = concat!(
            "SELECT node_id, epoch, address, slots, lease_expires_ms, registered_ms, ds_address FROM nodes",
            " ORDER BY node_id"
        );
        debug_assert!(SQL.starts_with(SELECT_NODE));
        let rows = self.query(SQL, &[], "list nodes")?;
        rows.iter()
            .map(node_row)
            .collect::<Result<_, _>>()
            .map_err(storage("list nodes"))
    }

    fn adopt_unowned(&mut self, node: i64) -> Result<u64, MetaError> {
        self.execute(
            "UPDATE streams SET owner_node = $1 WHERE owner_node IS NULL",
            &[&node],
            "adopt unowned streams",
        )
    }

    fn transfers_of(&mut self, node: i64) -> Result<Vec<(i64, String, i64, i64)>, MetaError> {
        let rows = self.query(
            "SELECT id, name, owner_epoch, transfer_to FROM streams
             WHERE owner_node = $1 AND transfer_to IS NOT NULL ORDER BY id",
            &[&node],
            "list pending transfers",
        )?;
        rows.iter()
            .map(|row| {
                Ok((
                    row.try_get(0)?,
                    row.try_get(1)?,
                    row.try_get(2)?,
                    row.try_get(3)?,
                ))
            })
            .collect::<Result<_, postgres::Error>>()
            .map_err(storage("list pending transfers"))
    }

    fn all_transfers(&mut self) -> Result<Vec<(i64, Option<i64>, i64)>, MetaError> {
        let rows = self.query(
            "SELECT id, owner_node, transfer_to FROM streams
             WHERE transfer_to IS NOT NULL ORDER BY id",
            &[],
            "list pending transfers",
        )?;
        triples(&rows, "list pending transfers")
    }

    fn owned_by(
        &mut self,
        node: i64,
        lock: bool,
    ) -> Result<Vec<(i64, i64, Option<i64>)>, MetaError> {
        let rows = if lock {
            self.query(
                "SELECT id, owner_epoch, fork_source_id FROM streams
                 WHERE owner_node = $1 ORDER BY id FOR UPDATE",
                &[&node],
                "lock owned streams",
            )?
        } else {
            self.query(
                "SELECT id, owner_epoch, fork_source_id FROM streams
                 WHERE owner_node = $1 ORDER BY id",
                &[&node],
                "list owned streams",
            )?
        };
        triples(&rows, "list owned streams")
    }

    fn owners(&mut self, ids: &[i64]) -> Result<Vec<(i64, Option<i64>, i64)>, MetaError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = ids.to_vec();
        let rows = self.query(
            "SELECT id, owner_node, owner_epoch FROM streams
             WHERE id = ANY($1) ORDER BY id FOR SHARE",
            &[&ids],
            "check stream owners",
        )?;
        triples(&rows, "check stream owners")
    }

    fn committed_streams(&mut self, key: &str) -> Result<Vec<i64>, MetaError> {
        let rows = self.query(
            "SELECT e.stream_id FROM segment_streams e JOIN segments s ON s.seq = e.segment_seq
             WHERE s.key = $1",
            &[&key],
            "check a segment's committed entries",
        )?;
        rows.iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, postgres::Error>>()
            .map_err(storage("check a segment's committed entries"))
    }

    fn reassign(&mut self, ids: &[i64], node: i64) -> Result<(), MetaError> {
        let ids = ids.to_vec();
        self.execute(
            "UPDATE streams SET owner_node = $2, owner_epoch = owner_epoch + 1, transfer_to = NULL
             WHERE id = ANY($1)",
            &[&ids, &node],
            "reassign streams",
        )?;
        Ok(())
    }

    fn set_transfer(&mut self, id: i64, to: Option<i64>) -> Result<(), MetaError> {
        self.execute(
            "UPDATE streams SET transfer_to = $2 WHERE id = $1",
            &[&id, &to],
            "record transfer",
        )?;
        Ok(())
    }

    fn finish_transfer(
        &mut self,
        id: i64,
        from: i64,
        epoch: i64,
        to: i64,
    ) -> Result<Option<i64>, MetaError> {
        let rows = self.query(
            "UPDATE streams
             SET owner_node = $4, owner_epoch = owner_epoch + 1, transfer_to = NULL
             WHERE id = $1 AND owner_node = $2 AND owner_epoch = $3 AND transfer_to = $4
             RETURNING owner_epoch",
            &[&id, &from, &epoch, &to],
            "finish transfer",
        )?;
        rows.first()
            .map(|row| row.try_get(0))
            .transpose()
            .map_err(storage("finish transfer"))
    }

    fn find(&mut self, name: &str) -> Result<Option<StreamColumns>, MetaError> {
        self.find_stream(name)
    }

    fn find_id(&mut self, id: i64) -> Result<Option<StreamColumns>, MetaError> {
        const SQL: &str = concat!(select_stream!(), " WHERE id = $1");
        let rows = self.query(SQL, &[&id], "look up stream by id")?;
        rows.first()
            .map(stream_columns)
            .transpose()
            .map_err(storage("look up stream by id"))
    }

    fn fork_count(&mut self, id: i64) -> Result<u64, MetaError> {
        let rows = self.query(
            "SELECT COUNT(*) FROM streams WHERE fork_source_id = $1",
            &[&id],
            "count forks",
        )?;
        let count: i64 = rows
            .first()
            .map(|row| row.try_get(0))
            .transpose()
            .map_err(storage("count forks"))?
            .unwrap_or(0);
        Ok(count.max(0) as u64)
    }

    fn owner_counts(&mut self) -> Result<Vec<(Option<i64>, u64)>, MetaError> {
        let rows = self.query(
            "SELECT owner_node, COUNT(*) FROM streams GROUP BY owner_node ORDER BY owner_node",
            &[],
            "count streams per node",
        )?;
        rows.iter()
            .map(|row| {
                let count: i64 = row.try_get(1)?;
                Ok((row.try_get(0)?, count.max(0) as u64))
            })
            .collect::<Result<_, postgres::Error>>()
            .map_err(storage("count streams per node"))
    }

    fn entries_of(&mut self, id: i64) -> Result<Vec<(SegmentColumns, EntryColumns)>, MetaError> {
        let rows = self.query(
            "SELECT e.segment_seq, e.stream_id, e.runs, e.last_timestamp_ms, e.closed, e.producers,
                    e.closed_by, e.writer_seq, s.key, s.size_bytes, s.created_ms
             FROM segment_streams e JOIN segments s ON s.seq = e.segment_seq
             WHERE e.stream_id = $1 ORDER BY e.segment_seq",
            &[&id],
            "load a stream's segment entries",
        )?;
        rows.iter()
            .map(|row| {
                let segment = SegmentColumns {
                    seq: row.try_get(0)?,
                    key: row.try_get(8)?,
                    size_bytes: row.try_get(9)?,
                    created_ms: row.try_get(10)?,
                };
                Ok((segment, entry_columns!(row, try_get)))
            })
            .collect::<Result<_, postgres::Error>>()
            .map_err(storage("load a stream's segment entries"))
    }
}

#[cfg(test)]
mod tests {
    /// A migration is added to both backends under one number (the schema comparison against a
    /// live server is in `tests/pg_contract.rs`).
    #[test]
    fn numbered_like_the_sqlite_migrations() {
        assert_eq!(super::SCHEMA_VERSION, crate::schema::SCHEMA_VERSION);
    }
}
