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
//!
//! Files: `connection` (the connection, reconnecting with back-off, prepared statements),
//! `migrations` (the schema and its upgrades), `registry` (the [`Backend`] statements: streams
//! and the segment catalog), `cluster` (the [`ClusterSql`] statements: nodes and ownership);
//! `errors` and `rows` are the small helpers they share.
//!
//! [`Backend`]: crate::backend::Backend
//! [`ClusterSql`]: crate::backend::ClusterSql

mod cluster;
mod connection;
mod errors;
mod migrations;
mod registry;
mod rows;

pub(crate) use connection::Postgres;

#[cfg(test)]
mod tests {
    use super::migrations;

    /// A migration is added to both backends under one number (the schema comparison against a
    /// live server is in `tests/pg_contract.rs`).
    #[test]
    fn numbered_like_the_sqlite_migrations() {
        assert_eq!(migrations::SCHEMA_VERSION, crate::schema::SCHEMA_VERSION);
    }
}
