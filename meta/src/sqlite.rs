//! The SQLite [`Backend`]: one `rusqlite` connection to a file (or memory), schema in `schema.rs`.

use std::path::Path;

use rusqlite::params;
use rusqlite::Connection;
use rusqlite::OptionalExtension;

use crate::backend;
use crate::backend::entry_columns;
use crate::backend::segment_columns;
use crate::backend::select_stream;
use crate::backend::stream_columns;
use crate::backend::Backend;
use crate::backend::ConsumerColumns;
use crate::backend::EntryColumns;
use crate::backend::NewStream;
use crate::backend::QuarantineColumns;
use crate::backend::SegmentColumns;
use crate::backend::StreamColumns;
use crate::backend::StreamUpdate;
use crate::high_water;
use crate::page_checksums;
use crate::schema;
use crate::schema::{sqlite_error, storage};
use crate::MetaError;

pub(crate) struct Sqlite {
    pub(crate) conn: Connection,
    /// The high-water mark beside the database file (`None` in memory).
    mark: Option<high_water::MarkFile>,
}

impl Sqlite {
    /// Opens (creating it and its parent directory if needed) and migrates a database file.
    pub(crate) fn open(path: &Path) -> Result<Sqlite, MetaError> {
        // SQLite creates the file, not the directories above it.
        if let Some(parent) = path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
        {
            std::fs::create_dir_all(parent).map_err(|error| {
                MetaError::Storage(format!("create directory {}: {error}", parent.display()))
            })?;
        }
        // Locked before anything is read or migrated; held while the database is open.
        let mut mark = high_water::MarkFile::lock(path)?;
        page_checksums::register()?;
        let conn = Connection::open(path)
            .map_err(|error| MetaError::Storage(format!("open {}: {error}", path.display())))?;
        page_checksums::ensure(&conn, path)?;
        let mut db = Sqlite::prepare(conn, false)?;
        let now = high_water::check(path, &db.conn)?;
        mark.raise(now);
        db.mark = Some(mark);
        Ok(db)
    }

    /// A fresh database in memory (gone with the process).
    pub(crate) fn open_in_memory() -> Result<Sqlite, MetaError> {
        let conn = Connection::open_in_memory().map_err(storage("open in-memory SQLite"))?;
        Sqlite::prepare(conn, true)
    }

    fn prepare(mut conn: Connection, in_memory: bool) -> Result<Sqlite, MetaError> {
        schema::configure(&conn, in_memory)?;
        schema::migrate(&mut conn)?;
        Ok(Sqlite { conn, mark: None })
    }
}

fn stream_columns(row: &rusqlite::Row<'_>) -> rusqlite::Result<StreamColumns> {
    Ok(stream_columns!(row, get))
}

impl Sqlite {
    /// `(id, value)` of each stream of `ids` that has a row, `sql` selecting the value of the
    /// row `?1`: one indexed look-up per id (in-process, a few microseconds each).
    fn per_stream<T: rusqlite::types::FromSql>(
        &mut self,
        sql: &str,
        ids: &[i64],
        what: &str,
    ) -> Result<Vec<(i64, T)>, MetaError> {
        let mut query = self
            .conn
            .prepare_cached(sql)
            .map_err(storage(&format!("prepare the {what} look-up")))?;
        let mut found = Vec::with_capacity(ids.len());
        for &id in ids {
            let value: Option<T> = query
                .query_row([id], |row| row.get(0))
                .optional()
                .map_err(storage(&format!("look up a {what}")))?;
            if let Some(value) = value {
                found.push((id, value));
            }
        }
        Ok(found)
    }
}

impl Backend for Sqlite {
    fn committed(&mut self) {
        let Some(mark) = &mut self.mark else {
            return;
        };
        match high_water::Mark::of(&self.conn) {
            Ok(now) => mark.raise(now),
            Err(e) => log::warn!("the catalog's high-water mark: {e}"),
        }
    }

    fn begin(&mut self) -> Result<(), MetaError> {
        // IMMEDIATE takes the write lock now instead of at the first write, so a concurrent
        // reader cannot turn it into a mid-batch SQLITE_BUSY.
        self.execute_batch("BEGIN IMMEDIATE")
    }

    fn begin_read(&mut self) -> Result<(), MetaError> {
        self.execute_batch("BEGIN")
    }

    fn execute_batch(&mut self, sql: &str) -> Result<(), MetaError> {
        self.conn.execute_batch(sql).map_err(sqlite_error)
    }

    fn rollback(&mut self) {
        if !self.conn.is_autocommit() {
            if let Err(error) = self.conn.execute_batch("ROLLBACK") {
                log::error!("metadata: roll back: {error}");
            }
        }
    }

    fn transaction_lost(&mut self) -> Option<MetaError> {
        self.conn.is_autocommit().then(|| {
            MetaError::Storage("SQLite rolled the transaction back after an error".to_string())
        })
    }

    fn find_stream(&mut self, name: &str) -> Result<Option<StreamColumns>, MetaError> {
        self.conn
            .prepare_cached(concat!(select_stream!(), " WHERE name = ?1"))
            .and_then(|mut query| query.query_row([name], stream_columns).optional())
            .map_err(storage("look up stream"))
    }

    fn insert_stream(&mut self, stream: &NewStream<'_>) -> Result<Option<i64>, MetaError> {
        self.conn
            .prepare_cached(
                "INSERT INTO streams (name, content_type, ttl_sec, expires_at_ms, closed,
                                      created_ms, fork_source, fork_source_id, fork_offset,
                                      fork_partial_bytes, owner_node, retention_age_ms,
                                      retention_bytes, delete_on_empty_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
                 ON CONFLICT (name) DO NOTHING
                 RETURNING id",
            )
            .and_then(|mut insert| {
                insert
                    .query_row(
                        params![
                            stream.name,
                            stream.content_type,
                            stream.ttl_sec,
                            stream.expires_at_ms,
                            stream.closed,
                            stream.created_ms,
                            stream.fork_source,
                            stream.fork_source_id,
                            stream.fork_offset,
                            stream.fork_partial_bytes,
                            stream.owner_node,
                            stream.retention[0],
                            stream.retention[1],
                            stream.retention[2]
                        ],
                        |row| row.get(0),
                    )
                    .optional()
            })
            .map_err(storage("insert stream"))
    }

    fn delete_stream(&mut self, id: i64) -> Result<bool, MetaError> {
        let removed = self
            .conn
            .execute("DELETE FROM streams WHERE id = ?1", [id])
            .map_err(storage("delete stream"))?;
        Ok(removed > 0)
    }

    fn update_stream(&mut self, id: i64, update: StreamUpdate) -> Result<(), MetaError> {
        // The two-argument max() is SQLite's scalar function: the larger of the two.
        let (sql, value, doing) = match update {
            StreamUpdate::Close => ("UPDATE streams SET closed = 1 WHERE id = ?1", None, "close"),
            StreamUpdate::SoftDelete => (
                "UPDATE streams SET soft_deleted = 1 WHERE id = ?1",
                None,
                "soft-delete",
            ),
            StreamUpdate::RaiseStart(offset) => (
                "UPDATE streams SET start_offset = max(start_offset, ?2) WHERE id = ?1",
                Some(offset),
                "trim",
            ),
            StreamUpdate::RaiseLastAccess(ms) => (
                "UPDATE streams SET last_access_ms = max(coalesce(last_access_ms, created_ms), ?2) \
                 WHERE id = ?1",
                Some(ms),
                "touch",
            ),
            StreamUpdate::SetRetention(_) => ("", None, "configure"),
        };
        let result = match (value, update) {
            (_, StreamUpdate::SetRetention([age, bytes, empty])) => self.conn.execute(
                "UPDATE streams SET retention_age_ms = ?2, retention_bytes = ?3, \
                 delete_on_empty_ms = ?4 WHERE id = ?1",
                params![id, age, bytes, empty],
            ),
            (None, _) => self.conn.execute(sql, [id]),
            (Some(value), _) => self.conn.execute(sql, [id, value]),
        };
        result.map_err(storage(&format!("{doing} stream")))?;
        Ok(())
    }

    fn upsert_segment(
        &mut self,
        key: &str,
        size_bytes: i64,
        created_ms: i64,
    ) -> Result<i64, MetaError> {
        self.conn
            .query_row(
                "INSERT INTO segments (key, size_bytes, created_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (key) DO UPDATE
                    SET size_bytes = excluded.size_bytes, created_ms = excluded.created_ms
                 RETURNING seq",
                params![key, size_bytes, created_ms],
                |row| row.get(0),
            )
            .map_err(storage("insert segment"))
    }

    fn replace_entries(&mut self, seq: i64, entries: &[EntryColumns]) -> Result<(), MetaError> {
        self.conn
            .execute("DELETE FROM segment_streams WHERE segment_seq = ?1", [seq])
            .map_err(storage("replace segment entries"))?;
        let mut insert = self
            .conn
            .prepare_cached(
                "INSERT INTO segment_streams
                    (segment_seq, ord, stream_id, runs, last_timestamp_ms, closed,
                     producers, closed_by, writer_seq)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )
            .map_err(storage("prepare segment entry insert"))?;
        for (ord, entry) in entries.iter().enumerate() {
            insert
                .execute(params![
                    seq,
                    ord as i64,
                    entry.stream_id,
                    entry.runs,
                    entry.last_timestamp_ms,
                    entry.closed,
                    entry.producers,
                    entry.closed_by,
                    entry.writer_seq,
                ])
                .map_err(storage("insert segment entry"))?;
        }
        Ok(())
    }

    fn delete_segment(&mut self, key: &str) -> Result<(), MetaError> {
        self.conn
            .execute("DELETE FROM segments WHERE key = ?1", [key])
            .map_err(storage("drop segment"))?;
        Ok(())
    }

    fn rename_segment(&mut self, from: &str, to: &str) -> Result<(), MetaError> {
        self.conn
            .execute(
                "UPDATE segments SET key = ?1 WHERE key = ?2",
                params![to, from],
            )
            .map(drop)
            .map_err(storage("rename segment"))
    }

    fn segment_exists(&mut self, key: &str) -> Result<bool, MetaError> {
        self.conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM segments WHERE key = ?1)",
                [key],
                |row| row.get(0),
            )
            .map_err(storage("look up segment"))
    }

    fn quarantine(
        &mut self,
        key: &str,
        stream_id: i64,
        runs: &[u8],
        reason: &str,
        now_ms: i64,
    ) -> Result<(), MetaError> {
        self.conn
            .execute(
                "INSERT OR REPLACE INTO quarantine (segment_key, stream_id, runs, reason, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![key, stream_id, runs, reason, now_ms],
            )
            .map_err(storage("quarantine refused records"))?;
        Ok(())
    }

    fn quarantined(&mut self) -> Result<Vec<QuarantineColumns>, MetaError> {
        let mut query = self
            .conn
            .prepare(
                "SELECT segment_key, stream_id, runs, reason, created_ms FROM quarantine
                 ORDER BY created_ms, segment_key, stream_id",
            )
            .map_err(storage("list the quarantine"))?;
        let rows = query
            .query_map([], |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                ))
            })
            .map_err(storage("list the quarantine"))?;
        rows.collect::<Result<_, _>>()
            .map_err(storage("list the quarantine"))
    }

    fn release_quarantined(&mut self, key: &str, stream_id: i64) -> Result<bool, MetaError> {
        let changed = self
            .conn
            .execute(
                "DELETE FROM quarantine WHERE segment_key = ?1 AND stream_id = ?2",
                params![key, stream_id],
            )
            .map_err(storage("release quarantined records"))?;
        Ok(changed > 0)
    }

    fn consumer(
        &mut self,
        scope: &str,
        id: &str,
    ) -> Result<Option<(String, Option<String>)>, MetaError> {
        self.conn
            .query_row(
                "SELECT document, wake FROM consumers WHERE scope = ?1 AND id = ?2",
                params![scope, id],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()
            .map_err(storage("read a consumer"))
    }

    fn put_consumer(
        &mut self,
        scope: &str,
        id: &str,
        document: &str,
        wake: Option<&str>,
        now_ms: i64,
    ) -> Result<(), MetaError> {
        self.conn
            .execute(
                "INSERT INTO consumers (scope, id, document, wake, updated_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (scope, id) DO UPDATE SET document = excluded.document,
                 wake = excluded.wake, updated_ms = excluded.updated_ms",
                params![scope, id, document, wake, now_ms],
            )
            .map_err(storage("write a consumer"))?;
        Ok(())
    }

    fn delete_consumer(&mut self, scope: &str, id: &str) -> Result<bool, MetaError> {
        let changed = self
            .conn
            .execute(
                "DELETE FROM consumers WHERE scope = ?1 AND id = ?2",
                params![scope, id],
            )
            .map_err(storage("delete a consumer"))?;
        Ok(changed > 0)
    }

    fn consumers(&mut self, waking_only: bool) -> Result<Vec<ConsumerColumns>, MetaError> {
        let sql = if waking_only {
            "SELECT scope, id, document, wake FROM consumers WHERE wake IS NOT NULL
             ORDER BY scope, id"
        } else {
            "SELECT scope, id, document, wake FROM consumers ORDER BY scope, id"
        };
        let mut query = self
            .conn
            .prepare(sql)
            .map_err(storage("list the consumers"))?;
        query
            .query_map([], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .and_then(|rows| rows.collect())
            .map_err(storage("list the consumers"))
    }

    fn consumers_after(
        &mut self,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<ConsumerColumns>, MetaError> {
        let (scope, id) = after.unwrap_or(("", ""));
        let mut query = self
            .conn
            .prepare_cached(
                "SELECT scope, id, document, wake FROM consumers
                 WHERE ?1 = 0 OR (scope, id) > (?2, ?3) ORDER BY scope, id LIMIT ?4",
            )
            .map_err(storage("list a page of consumers"))?;
        query
            .query_map(params![after.is_some(), scope, id, limit], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .and_then(|rows| rows.collect())
            .map_err(storage("list a page of consumers"))
    }

    fn consumer_total(&mut self) -> Result<u64, MetaError> {
        let count: i64 = self
            .conn
            .query_row(
                "SELECT count(*) FROM consumers INDEXED BY consumers_scope",
                [],
                |row| row.get(0),
            )
            .map_err(storage("count the consumers"))?;
        Ok(count.max(0) as u64)
    }

    fn consumer_count(&mut self, scope: &str) -> Result<u64, MetaError> {
        let count: i64 = self
            .conn
            .query_row(
                // The narrow index, never the table's key: its cells are whole rows.
                "SELECT count(*) FROM consumers INDEXED BY consumers_scope WHERE scope = ?1",
                params![scope],
                |row| row.get(0),
            )
            .map_err(storage("count the consumers"))?;
        Ok(count.max(0) as u64)
    }

    fn streams(&mut self) -> Result<Vec<StreamColumns>, MetaError> {
        let mut query = self
            .conn
            .prepare(concat!(select_stream!(), " ORDER BY id"))
            .map_err(storage("prepare stream load"))?;
        query
            .query_map([], stream_columns)
            .and_then(|rows| rows.collect())
            .map_err(storage("load streams"))
    }

    fn segments(&mut self) -> Result<Vec<SegmentColumns>, MetaError> {
        let mut query = self
            .conn
            .prepare(backend::SELECT_SEGMENTS)
            .map_err(storage("prepare segment load"))?;
        query
            .query_map([], |row| Ok(segment_columns!(row, get)))
            .and_then(|rows| rows.collect())
            .map_err(storage("load segments"))
    }

    fn segment_totals(&mut self) -> Result<(i64, i64), MetaError> {
        self.conn
            .query_row(
                "SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM segments",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .map_err(storage("sum segment sizes"))
    }

    fn stream_ids_reached(&mut self) -> Result<i64, MetaError> {
        // AUTOINCREMENT keeps the highest id ever given in `sqlite_sequence` (schema.rs).
        self.conn
            .query_row(
                "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'streams'), 0)",
                [],
                |row| row.get(0),
            )
            .map_err(storage("read the stream id sequence"))
    }

    fn catalog_id(&mut self) -> Result<Option<String>, MetaError> {
        self.conn
            .query_row("SELECT MIN(id) FROM catalog_identity", [], |row| row.get(0))
            .map_err(storage("read the catalog's identity"))
    }

    fn stream_starts(&mut self, ids: &[i64]) -> Result<Vec<(i64, i64)>, MetaError> {
        self.per_stream(
            "SELECT start_offset FROM streams WHERE id = ?1",
            ids,
            "stream start",
        )
    }

    fn stream_names(&mut self, ids: &[i64]) -> Result<Vec<(i64, String)>, MetaError> {
        self.per_stream("SELECT name FROM streams WHERE id = ?1", ids, "stream name")
    }

    fn segment_row(&mut self, key: &str) -> Result<Option<SegmentColumns>, MetaError> {
        self.conn
            .prepare_cached(backend::SELECT_SEGMENT_BY_KEY)
            .and_then(|mut query| {
                query
                    .query_row([key], |row| Ok(segment_columns!(row, get)))
                    .optional()
            })
            .map_err(storage("look up segment"))
    }

    fn for_each_entry_between(
        &mut self,
        first: i64,
        last: i64,
        visit: &mut dyn FnMut(i64, Result<EntryColumns, String>) -> Result<(), MetaError>,
    ) -> Result<(), MetaError> {
        let mut query = self
            .conn
            .prepare_cached(backend::SELECT_ENTRIES_BETWEEN)
            .map_err(storage("prepare segment entry range"))?;
        let mut rows = query
            .query([first, last])
            .map_err(storage("load segment entries"))?;
        while let Some(row) = rows.next().map_err(storage("load segment entries"))? {
            visit_entry(row, visit)?;
        }
        Ok(())
    }

    fn for_each_entry(
        &mut self,
        visit: &mut dyn FnMut(i64, Result<EntryColumns, String>) -> Result<(), MetaError>,
    ) -> Result<(), MetaError> {
        let mut query = self
            .conn
            .prepare(backend::SELECT_ENTRIES)
            .map_err(storage("prepare segment entry load"))?;
        let mut rows = query.query([]).map_err(storage("load segment entries"))?;
        while let Some(row) = rows.next().map_err(storage("load segment entries"))? {
            visit_entry(row, visit)?;
        }
        Ok(())
    }
}

/// Hands one row of the segment entry queries to `visit`: its sequence number, and its
/// columns or why they could not be read.
fn visit_entry(
    row: &rusqlite::Row<'_>,
    visit: &mut dyn FnMut(i64, Result<EntryColumns, String>) -> Result<(), MetaError>,
) -> Result<(), MetaError> {
    let seq: i64 = row.get(0).map_err(storage("read segment entry"))?;
    let columns = (|| Ok(entry_columns!(row, get)))();
    visit(
        seq,
        columns.map_err(|error: rusqlite::Error| error.to_string()),
    )
}
