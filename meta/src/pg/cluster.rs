//! The [`ClusterSql`] statements on Postgres: node registration and leases, stream ownership
//! and transfers, all timed by the database's clock.

use super::connection::Postgres;
use super::errors::storage;
use super::rows::{node_row, stream_columns, triples};
use crate::backend::entry_columns;
use crate::backend::select_stream;
use crate::backend::{
    Backend, ClusterSql, EdgeRuns, EntryColumns, NodeRow, SegmentColumns, StreamColumns,
};
use crate::MetaError;

/// The database clock in Unix ms (`clock_timestamp`, not the transaction's start: a batch
/// may be long).
macro_rules! now_ms {
    () => {
        "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT"
    };
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

    fn node_epoch(&mut self, node: i64) -> Result<Option<i64>, MetaError> {
        let rows = self.query(
            "SELECT epoch FROM nodes WHERE node_id = $1 FOR SHARE",
            &[&node],
            "check the node's incarnation",
        )?;
        rows.first()
            .map(|row| row.try_get(0))
            .transpose()
            .map_err(storage("check the node's incarnation"))
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
        super::rows::quadruples(&rows, "list pending transfers")
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

    fn newest_entries(
        &mut self,
        ids: &[i64],
        except_key: &str,
    ) -> Result<Vec<(i64, String, Vec<u8>)>, MetaError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = ids.to_vec();
        // One backward step of segment_streams_stream_seq per stream (past this key's entry,
        // when it is a re-commit).
        let rows = self.query(
            "SELECT i.id, n.key, n.runs
             FROM unnest($1::BIGINT[]) AS i (id)
             CROSS JOIN LATERAL (
                 SELECT s.key, e.runs FROM segment_streams e JOIN segments s ON s.seq = e.segment_seq
                 WHERE e.stream_id = i.id AND s.key <> $2
                 ORDER BY e.segment_seq DESC LIMIT 1) n",
            &[&ids, &except_key],
            "read streams' newest entries",
        )?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
            .collect::<Result<_, postgres::Error>>()
            .map_err(storage("read streams' newest entries"))
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

    fn page_of_streams(
        &mut self,
        prefix: &str,
        start_after: &str,
        limit: i64,
    ) -> Result<Vec<StreamColumns>, MetaError> {
        // `COLLATE "C"`: bytewise, the order of a single node's listing and of `start_after`.
        const SQL: &str = concat!(
            select_stream!(),
            " WHERE NOT soft_deleted AND starts_with(name, $1) AND name COLLATE \"C\" > $2
              ORDER BY name COLLATE \"C\" LIMIT $3"
        );
        let rows = self.query(SQL, &[&prefix, &start_after, &limit], "list streams")?;
        rows.iter()
            .map(stream_columns)
            .collect::<Result<_, _>>()
            .map_err(storage("list streams"))
    }

    fn edge_entries(&mut self, ids: &[i64]) -> Result<Vec<EdgeRuns>, MetaError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = ids.to_vec();
        let rows = self.query(
            "SELECT f.stream_id, f.runs, l.runs
             FROM (SELECT DISTINCT ON (stream_id) stream_id, runs FROM segment_streams
                   WHERE stream_id = ANY($1) ORDER BY stream_id, segment_seq) f
             JOIN (SELECT DISTINCT ON (stream_id) stream_id, runs FROM segment_streams
                   WHERE stream_id = ANY($1) ORDER BY stream_id, segment_seq DESC) l
               ON l.stream_id = f.stream_id",
            &[&ids],
            "read streams' first and last entries",
        )?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
            .collect::<Result<_, postgres::Error>>()
            .map_err(storage("read streams' first and last entries"))
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
