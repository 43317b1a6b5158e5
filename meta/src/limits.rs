//! Every limit of the metadata crate in one place: how much one transaction batches, how long a
//! database may keep us waiting, how long a stored producer id may be. Each says what happens
//! when it is hit. (Format sizes such as a packed run's 32 bytes stay with their format.)

/// Most commands applied in one transaction.
///
/// Bounds how long one batch holds the write lock and how many answers wait on one fsync. A
/// batch is ~1 ms of CPU at this size; more would only delay the first caller's answer, fewer
/// would add fsyncs under a burst of stream creations. When hit, the rest of the queue waits
/// for the next batch (nothing is refused).
pub const MAX_BATCH_COMMANDS: usize = 1024;

/// Most creates registered by one look-up and one insert statement (`apply::create_group`).
///
/// Consecutive creates of a batch go to the database together: on Postgres two round trips
/// for the group instead of four per create. Bounds the statements' array parameters (on
/// Postgres ~100 KiB of names at 200 bytes each). When hit, the next creates form another
/// group in the same transaction (nothing is refused).
pub const MAX_CREATES_PER_GROUP: usize = 512;

/// The longest producer id a segment entry stores, in bytes (the packed format's length prefix
/// is a `u16`). A segment commit naming a longer id is refused with
/// [`MetaError::Storage`](crate::MetaError::Storage), nothing written.
pub(crate) const PRODUCER_ID_MAX_BYTES: usize = u16::MAX as usize;

/// How long SQLite waits for a lock another connection holds before the statement fails with
/// "database is locked" (a [`MetaError::Storage`](crate::MetaError::Storage)).
pub(crate) const SQLITE_BUSY_TIMEOUT_SECS: u64 = 5;

/// Failed metadata batches get one log line per this many ms, counting the others: a full
/// disk fails every create, at the rate clients send them.
pub(crate) const BATCH_FAILURE_LOG_INTERVAL_MS: u64 = 10_000;

/// Postgres reconnects while the server is away: the first attempt at once, then at most one per
/// period, which doubles from this first period to [`PG_RETRY_LAST_MS`]. Until a reconnect
/// succeeds, each batch fails at once with [`MetaError::Storage`](crate::MetaError::Storage).
pub(crate) const PG_RETRY_FIRST_MS: u64 = 100;
/// The longest period between two Postgres reconnect attempts (see [`PG_RETRY_FIRST_MS`]).
pub(crate) const PG_RETRY_LAST_MS: u64 = 5_000;

/// How long a batch whose COMMIT got no answer (the connection broke at COMMIT: a fast
/// shutdown, a network cut) keeps asking the server whether its transaction committed, by its
/// transaction id on a new connection. Within it, every command of the batch gets its true
/// answer; past it, [`MetaError::Unknown`](crate::MetaError::Unknown), never a guess. The
/// metadata thread waits that long at most, once per such commit.
pub(crate) const PG_COMMIT_RESOLVE_MS: u64 = 30_000;

/// Default when the URL sets no `connect_timeout`: a dead address must not hang startup. When
/// hit, opening the store (or the batch that reconnects) fails with
/// [`MetaError::Storage`](crate::MetaError::Storage).
pub(crate) const PG_CONNECT_TIMEOUT_SECS: u64 = 10;

/// Default when the URL sets no `tcp_user_timeout`: a server that stops answering mid-statement
/// must not hang the metadata thread. When hit, the connection is dropped and the batch in
/// flight fails with [`MetaError::Storage`](crate::MetaError::Storage).
pub(crate) const PG_TCP_USER_TIMEOUT_SECS: u64 = 30;
