//! The [`Backend`] statements on Postgres: transactions, the stream registry and the segment
//! catalog.

use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator;
use postgres::types::ToSql;
use postgres::Client;
use postgres::Row;

use super::connection::Postgres;
use super::errors::{describe, pg_error, storage};
use super::rows::stream_columns;
use crate::backend;
use crate::backend::entry_columns;
use crate::backend::segment_columns;
use crate::backend::select_stream;
use crate::backend::Backend;
use crate::backend::ClusterSql;
use crate::backend::CommitOutcome;
use crate::backend::ConsumerColumns;
use crate::backend::EntryColumns;
use crate::backend::NewStream;
use crate::backend::QuarantineColumns;
use crate::backend::SegmentColumns;
use crate::backend::StreamColumns;
use crate::backend::StreamUpdate;
use crate::limits::{PG_COMMIT_RESOLVE_MS, PG_RETRY_FIRST_MS};
use crate::MetaError;

impl Backend for Postgres {
    fn begin(&mut self) -> Result<(), MetaError> {
        self.txid = None;
        let begun = begin_with_txid(self.connected().map_err(MetaError::Storage)?);
        let txid = match begun {
            Ok(txid) => txid,
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
                begin_with_txid(self.connected().map_err(MetaError::Storage)?)
                    .map_err(|error| pg_error(&error))?
            }
        };
        self.txid = txid;
        Ok(())
    }

    fn begin_read(&mut self) -> Result<(), MetaError> {
        self.connected()
            .map_err(MetaError::Storage)?
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .map_err(|error| pg_error(&error))
    }

    fn execute_batch(&mut self, sql: &str) -> Result<(), MetaError> {
        let client = self
            .client
            .as_mut()
            .ok_or_else(|| MetaError::Storage(format!("not connected to {}", self.url)))?;
        client.batch_execute(sql).map_err(|error| pg_error(&error))
    }

    fn rollback(&mut self) {
        if let Some(client) = self.client.as_mut() {
            if client.batch_execute("ROLLBACK").is_err() {
                // The transaction cannot be ended, so the connection is of no further use.
                self.disconnect();
            }
        }
    }

    fn resolve_commit(&mut self) -> CommitOutcome {
        let Some(txid) = self.txid.take() else {
            return CommitOutcome::Unknown("the transaction has no id".into());
        };
        // The broken connection is of no use; a new one asks about the transaction by id.
        self.disconnect();
        let deadline = Instant::now() + Duration::from_millis(PG_COMMIT_RESOLVE_MS);
        loop {
            self.retry_at = Instant::now();
            let why = match self.connected() {
                Err(why) => why,
                Ok(client) => match client.query_one("SELECT txid_status($1)", &[&txid]) {
                    Ok(row) => match row.get::<_, Option<String>>(0).as_deref() {
                        Some("committed") => return CommitOutcome::Committed,
                        Some("aborted") => return CommitOutcome::Failed,
                        // The server has not finished with it yet (the old session is still
                        // ending): ask again.
                        status => format!(
                            "transaction {txid} is {}",
                            status.unwrap_or("unknown to the server")
                        ),
                    },
                    Err(error) => {
                        self.disconnect();
                        describe(&error)
                    }
                },
            };
            if Instant::now() >= deadline {
                return CommitOutcome::Unknown(format!(
                    "asked {} for {PG_COMMIT_RESOLVE_MS} ms: {why}",
                    self.url
                ));
            }
            std::thread::sleep(Duration::from_millis(PG_RETRY_FIRST_MS));
        }
    }

    fn transaction_lost(&mut self) -> Option<MetaError> {
        self.client
            .as_ref()
            .is_none_or(Client::is_closed)
            .then(|| MetaError::Storage(format!("the connection to {} was lost", self.url)))
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

    fn find_streams(&mut self, names: &[&str]) -> Result<Vec<StreamColumns>, MetaError> {
        const SQL: &str = concat!(select_stream!(), " WHERE name = ANY($1)");
        let rows = self.query(SQL, &[&names], "look up streams")?;
        rows.iter()
            .map(stream_columns)
            .collect::<Result<_, _>>()
            .map_err(storage("look up streams"))
    }

    fn insert_streams(&mut self, streams: &[NewStream<'_>]) -> Result<Vec<Option<i64>>, MetaError> {
        // One array per column, so the statement's parameter count stays 14 however many rows
        // (the protocol allows 65,535 parameters).
        let column = |pick: fn(&NewStream<'_>) -> Option<i64>| -> Vec<Option<i64>> {
            streams.iter().map(pick).collect()
        };
        let names: Vec<&str> = streams.iter().map(|s| s.name).collect();
        let content_types: Vec<&str> = streams.iter().map(|s| s.content_type).collect();
        let closed: Vec<bool> = streams.iter().map(|s| s.closed).collect();
        let created_ms: Vec<i64> = streams.iter().map(|s| s.created_ms).collect();
        let fork_sources: Vec<Option<&str>> = streams.iter().map(|s| s.fork_source).collect();
        let rows = self.query(
            "INSERT INTO streams (name, content_type, ttl_sec, expires_at_ms, closed, created_ms,
                                  fork_source, fork_source_id, fork_offset, fork_partial_bytes,
                                  owner_node, retention_age_ms, retention_bytes,
                                  delete_on_empty_ms)
             SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::bool[],
                                  $6::int8[], $7::text[], $8::int8[], $9::int8[], $10::int8[],
                                  $11::int8[], $12::int8[], $13::int8[], $14::int8[])
             ON CONFLICT (name) DO NOTHING
             RETURNING id, name",
            &[
                &names,
                &content_types,
                &column(|s| s.ttl_sec),
                &column(|s| s.expires_at_ms),
                &closed,
                &created_ms,
                &fork_sources,
                &column(|s| s.fork_source_id),
                &column(|s| s.fork_offset),
                &column(|s| s.fork_partial_bytes),
                &column(|s| s.owner_node),
                &column(|s| s.retention[0]),
                &column(|s| s.retention[1]),
                &column(|s| s.retention[2]),
            ],
            "insert streams",
        )?;
        // RETURNING's order is not the input's: match the ids back by name (names are distinct).
        let mut ids = std::collections::HashMap::with_capacity(rows.len());
        for row in &rows {
            let id: i64 = row.try_get(0).map_err(storage("insert streams"))?;
            let name: &str = row.try_get(1).map_err(storage("insert streams"))?;
            ids.insert(name, id);
        }
        Ok(names.iter().map(|name| ids.get(name).copied()).collect())
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

    fn rename_segment(&mut self, from: &str, to: &str) -> Result<(), MetaError> {
        self.execute(
            "UPDATE segments SET key = $1 WHERE key = $2",
            &[&to, &from],
            "rename segment",
        )
        .map(drop)
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

    fn segment_exists(&mut self, key: &str) -> Result<bool, MetaError> {
        let rows = self.query(
            "SELECT EXISTS (SELECT 1 FROM segments WHERE key = $1)",
            &[&key],
            "look up segment",
        )?;
        rows.first()
            .map(|row| row.try_get(0))
            .transpose()
            .map_err(storage("look up segment"))
            .map(|found| found.unwrap_or(false))
    }

    fn quarantine(
        &mut self,
        key: &str,
        stream_id: i64,
        runs: &[u8],
        reason: &str,
        now_ms: i64,
    ) -> Result<(), MetaError> {
        self.execute(
            "INSERT INTO quarantine (segment_key, stream_id, runs, reason, created_ms)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (segment_key, stream_id)
             DO UPDATE SET runs = EXCLUDED.runs, reason = EXCLUDED.reason",
            &[&key, &stream_id, &runs, &reason, &now_ms],
            "quarantine refused records",
        )?;
        Ok(())
    }

    fn quarantined(&mut self) -> Result<Vec<QuarantineColumns>, MetaError> {
        let rows = self.query(
            "SELECT segment_key, stream_id, runs, reason, created_ms FROM quarantine
             ORDER BY created_ms, segment_key, stream_id",
            &[],
            "list the quarantine",
        )?;
        rows.iter()
            .map(|row| {
                Ok((
                    row.try_get(0)?,
                    row.try_get(1)?,
                    row.try_get(2)?,
                    row.try_get(3)?,
                    row.try_get(4)?,
                ))
            })
            .collect::<Result<_, postgres::Error>>()
            .map_err(storage("list the quarantine"))
    }

    fn release_quarantined(&mut self, key: &str, stream_id: i64) -> Result<bool, MetaError> {
        let changed = self.execute(
            "DELETE FROM quarantine WHERE segment_key = $1 AND stream_id = $2",
            &[&key, &stream_id],
            "release quarantined records",
        )?;
        Ok(changed > 0)
    }

    fn consumer(
        &mut self,
        scope: &str,
        id: &str,
    ) -> Result<Option<(String, Option<String>)>, MetaError> {
        let rows = self.query(
            "SELECT document, wake FROM consumers WHERE scope = $1 AND id = $2 FOR UPDATE",
            &[&scope, &id],
            "read a consumer",
        )?;
        rows.first()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .transpose()
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
        self.execute(
            "INSERT INTO consumers (scope, id, document, wake, updated_ms)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (scope, id) DO UPDATE SET document = excluded.document,
             wake = excluded.wake, updated_ms = excluded.updated_ms",
            &[&scope, &id, &document, &wake, &now_ms],
            "write a consumer",
        )?;
        Ok(())
    }

    fn delete_consumer(&mut self, scope: &str, id: &str) -> Result<bool, MetaError> {
        let changed = self.execute(
            "DELETE FROM consumers WHERE scope = $1 AND id = $2",
            &[&scope, &id],
            "delete a consumer",
        )?;
        Ok(changed > 0)
    }

    fn consumers(&mut self, waking_only: bool) -> Result<Vec<ConsumerColumns>, MetaError> {
        let sql = if waking_only {
            "SELECT scope, id, document, wake FROM consumers WHERE wake IS NOT NULL
             ORDER BY scope, id"
        } else {
            "SELECT scope, id, document, wake FROM consumers ORDER BY scope, id"
        };
        let rows = self.query(sql, &[], "list the consumers")?;
        super::rows::quadruples(&rows, "list the consumers")
    }

    fn consumers_after(
        &mut self,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<ConsumerColumns>, MetaError> {
        let (scope, id) = after.unwrap_or(("", ""));
        let rows = self.query(
            "SELECT scope, id, document, wake FROM consumers
             WHERE NOT $1 OR (scope, id) > ($2, $3) ORDER BY scope, id LIMIT $4",
            &[&after.is_some(), &scope, &id, &i64::from(limit)],
            "list a page of consumers",
        )?;
        super::rows::quadruples(&rows, "list a page of consumers")
    }

    fn consumer_total(&mut self) -> Result<u64, MetaError> {
        let rows = self.query("SELECT count(*) FROM consumers", &[], "count the consumers")?;
        super::rows::count(&rows, "count the consumers")
    }

    fn consumer_count(&mut self, scope: &str) -> Result<u64, MetaError> {
        let rows = self.query(
            "SELECT count(*) FROM consumers WHERE scope = $1",
            &[&scope],
            "count the consumers",
        )?;
        super::rows::count(&rows, "count the consumers")
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

    fn stream_ids_reached(&mut self) -> Result<i64, MetaError> {
        // The identity column's sequence: NULL until it first gave an id.
        const SQL: &str = "SELECT COALESCE(pg_sequence_last_value(\
                           pg_get_serial_sequence('streams', 'id')), 0)";
        self.query_value(SQL, "read the stream id sequence")
    }

    fn catalog_id(&mut self) -> Result<Option<String>, MetaError> {
        self.query_value(
            "SELECT MIN(id) FROM catalog_identity",
            "read the catalog's identity",
        )
    }

    fn segment_totals(&mut self) -> Result<(i64, i64), MetaError> {
        // SUM of BIGINT is NUMERIC in PostgreSQL: cast back (sizes stay far below 2^63).
        const SQL: &str = "SELECT COUNT(*), COALESCE(SUM(size_bytes), 0)::BIGINT FROM segments";
        let rows = self.query(SQL, &[], "sum segment sizes")?;
        let row = rows
            .first()
            .ok_or_else(|| MetaError::Storage("sum segment sizes: no row".into()))?;
        Ok((
            row.try_get(0).map_err(storage("sum segment sizes"))?,
            row.try_get(1).map_err(storage("sum segment sizes"))?,
        ))
    }

    fn stream_starts(&mut self, ids: &[i64]) -> Result<Vec<(i64, i64)>, MetaError> {
        const SQL: &str = "SELECT id, start_offset FROM streams WHERE id = ANY($1)";
        let rows = self.query(SQL, &[&ids], "look up stream starts")?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<_, postgres::Error>>()
            .map_err(storage("look up stream starts"))
    }

    fn stream_names(&mut self, ids: &[i64]) -> Result<Vec<(i64, String)>, MetaError> {
        const SQL: &str = "SELECT id, name FROM streams WHERE id = ANY($1)";
        let rows = self.query(SQL, &[&ids], "look up stream names")?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<_, postgres::Error>>()
            .map_err(storage("look up stream names"))
    }

    fn cluster(&mut self) -> Option<&mut dyn ClusterSql> {
        Some(self)
    }

    fn segment_row(&mut self, key: &str) -> Result<Option<SegmentColumns>, MetaError> {
        let doing = "look up segment";
        let rows = self.query(backend::SELECT_SEGMENT_BY_KEY, &[&key], doing)?;
        rows.first()
            .map(|row| Ok(segment_columns!(row, try_get)))
            .transpose()
            .map_err(storage(doing))
    }

    fn for_each_entry_between(
        &mut self,
        first: i64,
        last: i64,
        visit: &mut dyn FnMut(i64, Result<EntryColumns, String>) -> Result<(), MetaError>,
    ) -> Result<(), MetaError> {
        let doing = "load segment entries";
        let rows = self.query(backend::SELECT_ENTRIES_BETWEEN, &[&first, &last], doing)?;
        for row in rows {
            visit_entry(&row, visit)?;
        }
        Ok(())
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
            visit_entry(&row, visit)?;
        }
        Ok(())
    }
}

/// Hands one row of the segment entry queries to `visit`: its sequence number, and its
/// columns or why they could not be read.
fn visit_entry(
    row: &postgres::Row,
    visit: &mut dyn FnMut(i64, Result<EntryColumns, String>) -> Result<(), MetaError>,
) -> Result<(), MetaError> {
    let seq: i64 = row.try_get(0).map_err(storage("read segment entry"))?;
    let columns = (|| Ok(entry_columns!(row, try_get)))();
    visit(
        seq,
        columns.map_err(|error: postgres::Error| describe(&error)),
    )
}

/// Starts a batch transaction and learns its id in the same round trip.
fn begin_with_txid(client: &mut Client) -> Result<Option<i64>, postgres::Error> {
    let answers = client.simple_query("BEGIN; SELECT txid_current()")?;
    let txid = answers.iter().find_map(|answer| match answer {
        postgres::SimpleQueryMessage::Row(row) => row.get(0)?.parse().ok(),
        _ => None,
    });
    Ok(txid)
}
