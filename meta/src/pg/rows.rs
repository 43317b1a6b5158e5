//! Postgres rows decoded into the column sets the shared code converts (`crate::rows`).

use postgres::types::FromSqlOwned;
use postgres::Row;

use super::errors::storage;
use crate::backend::stream_columns;
use crate::backend::{NodeId, NodeRow, StreamColumns};
use crate::MetaError;

/// Rows of three columns as tuples (a column of another type is a storage error).
pub(super) fn triples<A, B, C>(rows: &[Row], doing: &str) -> Result<Vec<(A, B, C)>, MetaError>
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

/// Rows of four columns as tuples (a column of another type is a storage error).
pub(super) fn quadruples<A, B, C, D>(
    rows: &[Row],
    doing: &str,
) -> Result<Vec<(A, B, C, D)>, MetaError>
where
    A: FromSqlOwned,
    B: FromSqlOwned,
    C: FromSqlOwned,
    D: FromSqlOwned,
{
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
        .map_err(storage(doing))
}

/// The one `count(*)` of a query's answer, never negative.
pub(super) fn count(rows: &[Row], doing: &str) -> Result<u64, MetaError> {
    let count: i64 = rows
        .first()
        .map(|row| row.try_get(0))
        .transpose()
        .map_err(storage(doing))?
        .unwrap_or(0);
    Ok(count.max(0) as u64)
}

pub(super) fn stream_columns(row: &Row) -> Result<StreamColumns, postgres::Error> {
    Ok(stream_columns!(row, try_get))
}

/// A `nodes` row, in the column order of [`super::cluster`]'s `SELECT`s.
pub(super) fn node_row(row: &Row) -> Result<NodeRow, postgres::Error> {
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
