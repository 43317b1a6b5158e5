//! What the metadata thread needs from a database, whichever it is.
//!
//! ```text
//!   shared by both databases                           one impl per database
//!   batch.rs: command loop, group commit,     ──▶  Backend  ──┬─ sqlite.rs  (rusqlite, a file)
//!     savepoints                                              └─ pg/        (postgres, a server)
//!   apply.rs: what each command does, garbage
//!   rows.rs: validation, blob formats,
//!     row ↔ StreamRow / SegmentRecord conversion
//! ```
//!
//! A backend only executes SQL: every decision (what a create returns, which rows a command
//! touches, how blobs are packed, what a damaged row is) is made once, in the shared files, so
//! the engine cannot tell the backends apart. Integers cross this trait as they are stored
//! (signed 64-bit); `rows.rs` checks every conversion to and from `u64`.

use crate::MetaError;

/// The savepoint every command of a batch runs in (the same SQL on both databases).
pub(crate) const SAVEPOINT: &str = "SAVEPOINT command";
/// Keeps a command's writes.
pub(crate) const RELEASE: &str = "RELEASE SAVEPOINT command";
/// Undoes a failed command's writes and leaves the batch's transaction usable.
pub(crate) const ROLL_BACK_COMMAND: &str =
    "ROLLBACK TO SAVEPOINT command; RELEASE SAVEPOINT command";
/// Ends a batch.
pub(crate) const COMMIT: &str = "COMMIT";

/// The registry's columns in [`StreamColumns`] order, for both databases (a macro, so `concat!`
/// can add the `WHERE` / `ORDER BY` of each use).
macro_rules! select_stream {
    () => {
        "SELECT id, name, content_type, ttl_sec, expires_at_ms, closed, created_ms, start_offset,
                COALESCE(last_access_ms, created_ms), fork_source, fork_source_id, fork_offset,
                fork_partial_bytes, soft_deleted, owner_node, owner_epoch, transfer_to,
                retention_age_ms, retention_bytes, delete_on_empty_ms
         FROM streams"
    };
}
pub(crate) use select_stream;

/// A [`StreamColumns`] from a row of [`select_stream`]'s columns; `$get` is the client's
/// fallible by-position getter (`get` of rusqlite, `try_get` of postgres), its error goes to `?`.
macro_rules! stream_columns {
    ($row:expr, $get:ident) => {
        $crate::backend::StreamColumns {
            id: $row.$get(0)?,
            name: $row.$get(1)?,
            content_type: $row.$get(2)?,
            ttl_sec: $row.$get(3)?,
            expires_at_ms: $row.$get(4)?,
            closed: $row.$get(5)?,
            created_ms: $row.$get(6)?,
            start_offset: $row.$get(7)?,
            last_access_ms: $row.$get(8)?,
            fork_source: $row.$get(9)?,
            fork_source_id: $row.$get(10)?,
            fork_offset: $row.$get(11)?,
            fork_partial_bytes: $row.$get(12)?,
            soft_deleted: $row.$get(13)?,
            owner_node: $row.$get(14)?,
            owner_epoch: $row.$get(15)?,
            transfer_to: $row.$get(16)?,
            retention_age_ms: $row.$get(17)?,
            retention_bytes: $row.$get(18)?,
            delete_on_empty_ms: $row.$get(19)?,
        }
    };
}
pub(crate) use stream_columns;

/// Every segment, in commit order.
pub(crate) const SELECT_SEGMENTS: &str =
    "SELECT seq, key, size_bytes, created_ms FROM segments ORDER BY seq";

/// A [`SegmentColumns`] from a row of [`SELECT_SEGMENTS`] (see [`stream_columns`]).
macro_rules! segment_columns {
    ($row:expr, $get:ident) => {
        $crate::backend::SegmentColumns {
            seq: $row.$get(0)?,
            key: $row.$get(1)?,
            size_bytes: $row.$get(2)?,
            created_ms: $row.$get(3)?,
        }
    };
}
pub(crate) use segment_columns;

/// Every segment entry, by segment and position; column 0 is the segment's seq.
pub(crate) const SELECT_ENTRIES: &str =
    "SELECT segment_seq, stream_id, runs, last_timestamp_ms, closed, producers, closed_by,
            writer_seq
     FROM segment_streams ORDER BY segment_seq, ord";

/// The entries of the segments in a range of seqs (`$1`, `$2`, both included), columns as
/// [`SELECT_ENTRIES`]'s; SQLite takes `$n` parameters too.
pub(crate) const SELECT_ENTRIES_BETWEEN: &str =
    "SELECT segment_seq, stream_id, runs, last_timestamp_ms, closed, producers, closed_by,
            writer_seq
     FROM segment_streams WHERE segment_seq BETWEEN $1 AND $2 ORDER BY segment_seq, ord";

/// One segment's row by key (`$1`), columns as [`SELECT_SEGMENTS`]'s.
pub(crate) const SELECT_SEGMENT_BY_KEY: &str =
    "SELECT seq, key, size_bytes, created_ms FROM segments WHERE key = $1";

/// An [`EntryColumns`] from a row of [`SELECT_ENTRIES`] (see [`stream_columns`]).
macro_rules! entry_columns {
    ($row:expr, $get:ident) => {
        $crate::backend::EntryColumns {
            stream_id: $row.$get(1)?,
            runs: $row.$get(2)?,
            last_timestamp_ms: $row.$get(3)?,
            closed: $row.$get(4)?,
            producers: $row.$get(5)?,
            closed_by: $row.$get(6)?,
            writer_seq: $row.$get(7)?,
        }
    };
}
pub(crate) use entry_columns;

/// One `streams` row as stored. `last_access_ms` is already `created_ms` where the column is
/// NULL (rows written before migration 3).
#[derive(Clone, Debug)]
pub(crate) struct StreamColumns {
    pub id: i64,
    pub name: String,
    pub content_type: String,
    pub ttl_sec: Option<i64>,
    pub expires_at_ms: Option<i64>,
    pub closed: bool,
    pub created_ms: i64,
    pub start_offset: i64,
    pub last_access_ms: i64,
    pub fork_source: Option<String>,
    pub fork_source_id: Option<i64>,
    pub fork_offset: Option<i64>,
    pub fork_partial_bytes: Option<i64>,
    pub soft_deleted: bool,
    /// The owning node of a cluster (`None`: a single node's row, or one no node claimed yet).
    pub owner_node: Option<i64>,
    /// Raised by every change of owner: the fencing token of the owner's writes.
    pub owner_epoch: i64,
    /// A transfer asked for and not done yet: the node the stream goes to.
    pub transfer_to: Option<i64>,
    /// The retention policy's limits (NULL: off).
    pub retention_age_ms: Option<i64>,
    pub retention_bytes: Option<i64>,
    pub delete_on_empty_ms: Option<i64>,
}

/// The columns of a new `streams` row; the others take their defaults.
pub(crate) struct NewStream<'a> {
    pub name: &'a str,
    pub content_type: &'a str,
    pub ttl_sec: Option<i64>,
    pub expires_at_ms: Option<i64>,
    pub closed: bool,
    pub created_ms: i64,
    pub fork_source: Option<&'a str>,
    pub fork_source_id: Option<i64>,
    pub fork_offset: Option<i64>,
    pub fork_partial_bytes: Option<i64>,
    /// The creating node, in a cluster; the row starts at owner epoch 1.
    pub owner_node: Option<i64>,
    /// Retention limits, `[age_ms, bytes, delete_on_empty_ms]` (NULL: off).
    pub retention: [Option<i64>; 3],
}

/// One `segments` row.
pub(crate) struct SegmentColumns {
    pub seq: i64,
    pub key: String,
    pub size_bytes: i64,
    pub created_ms: i64,
}

/// One `segment_streams` row without its segment and position, blobs still packed.
pub(crate) struct EntryColumns {
    pub stream_id: i64,
    pub runs: Vec<u8>,
    pub last_timestamp_ms: i64,
    pub closed: bool,
    pub producers: Vec<u8>,
    pub closed_by: Option<Vec<u8>>,
    pub writer_seq: Option<String>,
}

/// A change to one stream row; each only ever moves the row forward.
#[derive(Clone, Copy, Debug)]
pub(crate) enum StreamUpdate {
    /// `closed` becomes true.
    Close,
    /// `soft_deleted` becomes true.
    SoftDelete,
    /// `start_offset` becomes the larger of itself and this.
    RaiseStart(i64),
    /// `last_access_ms` (NULL counting as `created_ms`) becomes the larger of itself and this.
    RaiseLastAccess(i64),
    /// The retention limits become `[age_ms, bytes, delete_on_empty_ms]` (NULL: off).
    SetRetention([Option<i64>; 3]),
}

/// A quarantine row as stored: segment key, stream id, packed runs, reason, created ms.
pub(crate) type QuarantineColumns = (String, i64, Vec<u8>, String, i64);

/// A consumer row: (scope, id, document, wake).
pub(crate) type ConsumerColumns = (String, String, String, Option<String>);

/// What a transaction whose COMMIT failed came to ([`Backend::resolve_commit`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CommitOutcome {
    /// It committed: the answer was lost, not the transaction.
    Committed,
    /// It did not commit.
    Failed,
    /// The database could not be asked in time; the message says why.
    Unknown(String),
}

/// The SQL side of the metadata thread. Errors of data statements are [`MetaError::Storage`]
/// naming what was being done; transaction control reports a bare message that `batch.rs`
/// prefixes.
pub(crate) trait Backend {
    /// Starts the transaction of one batch of commands. A backend whose connection can drop
    /// re-establishes it here (and fails while it cannot).
    fn begin(&mut self) -> Result<(), MetaError>;

    /// Starts a read-only transaction that sees one consistent state (the startup snapshot).
    fn begin_read(&mut self) -> Result<(), MetaError>;

    /// Runs statements without parameters or results (savepoints, COMMIT).
    fn execute_batch(&mut self, sql: &str) -> Result<(), MetaError>;

    /// Ends a transaction that failed, throwing its writes away; best effort (the connection
    /// may be gone, and then so is the transaction).
    fn rollback(&mut self);

    /// Whether the batch's transaction committed, after its COMMIT failed. SQLite runs in this
    /// process: a failed COMMIT did not commit. A database across a network may have committed
    /// a transaction whose answer was lost; it is asked.
    fn resolve_commit(&mut self) -> CommitOutcome {
        CommitOutcome::Failed
    }

    /// Called after a batch's transaction committed and its commands were answered (SQLite
    /// keeps its high-water mark, `high_water.rs`).
    fn committed(&mut self) {}

    /// `Some(why)` when the database has already abandoned the open transaction on its own
    /// (SQLite does after I/O errors), so the commands applied in it must not be reported
    /// committed.
    fn transaction_lost(&mut self) -> Option<MetaError>;

    /// The row named `name`, if any.
    fn find_stream(&mut self, name: &str) -> Result<Option<StreamColumns>, MetaError>;

    /// Inserts a row unless the name is taken (by a row this transaction cannot see yet, too:
    /// another node's); its new id, or `None` when the name was taken.
    fn insert_stream(&mut self, stream: &NewStream<'_>) -> Result<Option<i64>, MetaError>;

    /// The rows named in `names` (a name without a row is left out), for a group of creates.
    /// One statement on a database across the network; in-process SQLite looks them up one by
    /// one (each a few microseconds).
    fn find_streams(&mut self, names: &[&str]) -> Result<Vec<StreamColumns>, MetaError> {
        names
            .iter()
            .filter_map(|name| self.find_stream(name).transpose())
            .collect()
    }

    /// [`Backend::insert_stream`] for every row of `streams` (distinct names), in order: each
    /// new id, or `None` where the name was taken. One statement on Postgres, like
    /// [`Backend::find_streams`].
    fn insert_streams(&mut self, streams: &[NewStream<'_>]) -> Result<Vec<Option<i64>>, MetaError> {
        streams
            .iter()
            .map(|stream| self.insert_stream(stream))
            .collect()
    }

    /// Deletes row `id`; whether there was one.
    fn delete_stream(&mut self, id: i64) -> Result<bool, MetaError>;

    /// Applies `update` to row `id` (none: nothing happens).
    fn update_stream(&mut self, id: i64, update: StreamUpdate) -> Result<(), MetaError>;

    /// Inserts a segment row, or updates the size and time of the row with this key; the
    /// row's `seq` (kept by an update).
    fn upsert_segment(
        &mut self,
        key: &str,
        size_bytes: i64,
        created_ms: i64,
    ) -> Result<i64, MetaError>;

    /// Replaces every entry of segment `seq` with `entries`, at positions 0, 1, ….
    fn replace_entries(&mut self, seq: i64, entries: &[EntryColumns]) -> Result<(), MetaError>;

    /// Deletes the segment with this key and its entries.
    fn delete_segment(&mut self, key: &str) -> Result<(), MetaError>;

    /// Whether a segment with this key is committed.
    fn segment_exists(&mut self, key: &str) -> Result<bool, MetaError>;

    /// Gives the segment row with key `from` the key `to` (no row has it), keeping its `seq`
    /// and its entries: compaction's merged object takes the first old segment's place in
    /// commit order.
    fn rename_segment(&mut self, from: &str, to: &str) -> Result<(), MetaError>;

    /// The row of the segment with this key, if committed.
    fn segment_row(&mut self, key: &str) -> Result<Option<SegmentColumns>, MetaError>;

    /// Calls `visit` with every entry of the segments whose seq is in `first..=last`, by
    /// segment seq then position (as [`Backend::for_each_entry`]): what a compaction's swap
    /// reads of the segments it merges and those committed between them.
    fn for_each_entry_between(
        &mut self,
        first: i64,
        last: i64,
        visit: &mut dyn FnMut(i64, Result<EntryColumns, String>) -> Result<(), MetaError>,
    ) -> Result<(), MetaError>;

    /// Keeps a refused entry's records (`runs` packed as in `segment_streams`) for an
    /// operator; replaces an earlier row of the same segment and stream.
    fn quarantine(
        &mut self,
        key: &str,
        stream_id: i64,
        runs: &[u8],
        reason: &str,
        now_ms: i64,
    ) -> Result<(), MetaError>;

    /// Every quarantined entry: (segment key, stream id, packed runs, reason, created ms).
    fn quarantined(&mut self) -> Result<Vec<QuarantineColumns>, MetaError>;

    /// Drops one quarantined entry; whether there was one.
    fn release_quarantined(&mut self, key: &str, stream_id: i64) -> Result<bool, MetaError>;

    /// The document and wake of consumer `id` in `scope`, locked for the rest of the
    /// transaction where the database has row locks (Postgres: `FOR UPDATE`), so two nodes
    /// changing one consumer take turns.
    fn consumer(
        &mut self,
        scope: &str,
        id: &str,
    ) -> Result<Option<(String, Option<String>)>, MetaError>;

    /// Writes (inserts or replaces) consumer `id`'s document and wake.
    fn put_consumer(
        &mut self,
        scope: &str,
        id: &str,
        document: &str,
        wake: Option<&str>,
        now_ms: i64,
    ) -> Result<(), MetaError>;

    /// Deletes consumer `id`; whether there was one.
    fn delete_consumer(&mut self, scope: &str, id: &str) -> Result<bool, MetaError>;

    /// Every consumer (only those with a wake when `waking_only`), by scope then id.
    fn consumers(&mut self, waking_only: bool) -> Result<Vec<ConsumerColumns>, MetaError>;

    /// How many consumers `scope` has.
    fn consumer_count(&mut self, scope: &str) -> Result<u64, MetaError>;

    /// At most `limit` consumers after `(scope, id)` (from the first without it), by scope
    /// then id: a page of the listing, so a report never loads every document at once.
    fn consumers_after(
        &mut self,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<ConsumerColumns>, MetaError>;

    /// How many consumers there are, in every scope.
    fn consumer_total(&mut self) -> Result<u64, MetaError>;

    /// Every stream row, by id.
    fn streams(&mut self) -> Result<Vec<StreamColumns>, MetaError>;

    /// Every segment row, by seq.
    fn segments(&mut self) -> Result<Vec<SegmentColumns>, MetaError>;

    /// `(segment rows, sum of their size_bytes)`: what the catalog has in the bucket.
    fn segment_totals(&mut self) -> Result<(i64, i64), MetaError>;

    /// The highest stream id the catalog ever handed out (0 for none), deleted streams
    /// included: ids only grow.
    fn stream_ids_reached(&mut self) -> Result<i64, MetaError>;

    /// The catalog's identity (schema version 13), made once; `None` when its row is gone.
    fn catalog_id(&mut self) -> Result<Option<String>, MetaError>;

    /// `(id, start_offset)` of the streams among `ids` that have a row (deleted ones have
    /// none), in any order: what the garbage collector needs of the streams its segments name,
    /// without reading every stream.
    fn stream_starts(&mut self, ids: &[i64]) -> Result<Vec<(i64, i64)>, MetaError>;

    /// `(id, name)` of each stream of `ids` that has a row.
    fn stream_names(&mut self, ids: &[i64]) -> Result<Vec<(i64, String)>, MetaError>;

    /// Calls `visit` with every entry, by segment seq then position: the entry's segment seq
    /// and its columns, or why they could not be read.
    fn for_each_entry(
        &mut self,
        visit: &mut dyn FnMut(i64, Result<EntryColumns, String>) -> Result<(), MetaError>,
    ) -> Result<(), MetaError>;

    /// The statements of a cluster (node leases, ownership, transfers); `None` for a database
    /// only one node can use (SQLite).
    fn cluster(&mut self) -> Option<&mut dyn ClusterSql> {
        None
    }
}

/// A node id (`--node-id`): positive, stable across restarts, unique in the cluster.
pub type NodeId = u32;

/// One `nodes` row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRow {
    pub id: NodeId,
    pub epoch: u64,
    /// The advertised base URL of the node's Pico listener (`--http-address` when that is
    /// `--listen`), used verbatim in the Pico protocol's `307` locations; empty: none.
    pub address: String,
    /// The same for its Durable Streams listener; empty: none.
    pub ds_address: String,
    /// Placement weight; 0 takes no new streams.
    pub slots: u64,
    /// Database clock, Unix ms.
    pub lease_expires_ms: i64,
    pub registered_ms: i64,
}

impl NodeRow {
    /// Holds an unexpired lease at `now_ms` (the database clock of the same answer).
    pub fn is_live(&self, now_ms: i64) -> bool {
        self.lease_expires_ms > now_ms
    }
}

/// `(stream id, runs of its first entry, runs of its last entry)`, by commit order (packed as
/// `runs.rs` stores them).
pub(crate) type EdgeRuns = (i64, Vec<u8>, Vec<u8>);

/// The SQL of a cluster; only a shared database (Postgres) has it.
pub(crate) trait ClusterSql {
    /// The database clock, Unix ms.
    fn clock_ms(&mut self) -> Result<i64, MetaError>;
    /// The row of `node`, locked until the transaction ends.
    fn lock_node(&mut self, node: i64) -> Result<Option<NodeRow>, MetaError>;
    /// The incarnation `node` is registered at, its row share-locked until the transaction
    /// ends (a registration waits for it).
    fn node_epoch(&mut self, node: i64) -> Result<Option<i64>, MetaError>;
    /// Inserts or replaces the row of `node`, its lease running `lease_ms` from now.
    fn upsert_node(
        &mut self,
        node: i64,
        epoch: i64,
        address: &str,
        slots: i64,
        lease_ms: i64,
    ) -> Result<(), MetaError>;
    /// Extends the lease of `node` at `epoch` (0 rows: another incarnation took the id over).
    fn renew(&mut self, node: i64, epoch: i64, lease_ms: i64) -> Result<bool, MetaError>;
    /// Ends the lease of `node` at `epoch` now.
    fn release(&mut self, node: i64, epoch: i64) -> Result<(), MetaError>;
    fn set_slots(&mut self, node: i64, slots: i64) -> Result<bool, MetaError>;
    /// Sets the advertised addresses of `node` at `epoch`; whether that incarnation is current.
    fn set_address(
        &mut self,
        node: i64,
        epoch: i64,
        address: &str,
        ds_address: &str,
    ) -> Result<bool, MetaError>;
    fn nodes(&mut self) -> Result<Vec<NodeRow>, MetaError>;
    /// Rows no node owns (written before the cluster existed) become `node`'s.
    fn adopt_unowned(&mut self, node: i64) -> Result<u64, MetaError>;
    /// `(id, name, owner epoch, transfer_to)` of `node`'s streams with a pending transfer.
    fn transfers_of(&mut self, node: i64) -> Result<Vec<(i64, String, i64, i64)>, MetaError>;
    /// `(id, owner node, transfer_to)` of every pending transfer.
    fn all_transfers(&mut self) -> Result<Vec<(i64, Option<i64>, i64)>, MetaError>;
    /// `(id, owner epoch, fork source id)` of every stream `node` owns; with `lock`, the rows
    /// are locked for update until the transaction ends (by id, so lockers never deadlock).
    fn owned_by(
        &mut self,
        node: i64,
        lock: bool,
    ) -> Result<Vec<(i64, i64, Option<i64>)>, MetaError>;
    /// `(id, owner node, owner epoch)` of these rows, share-locked until the transaction ends.
    fn owners(&mut self, ids: &[i64]) -> Result<Vec<(i64, Option<i64>, i64)>, MetaError>;
    /// The streams that already have an entry in the committed segment with this key (none
    /// when it is not committed).
    fn committed_streams(&mut self, key: &str) -> Result<Vec<i64>, MetaError>;
    /// For each of these streams with entries in committed segments other than `except_key`:
    /// the stream id, the key of the newest such segment (by commit order) and that entry's
    /// runs (packed as `runs.rs` stores them).
    fn newest_entries(
        &mut self,
        ids: &[i64],
        except_key: &str,
    ) -> Result<Vec<(i64, String, Vec<u8>)>, MetaError>;
    /// Moves these rows to `node` at their next owner epoch, clearing any pending transfer.
    fn reassign(&mut self, ids: &[i64], node: i64) -> Result<(), MetaError>;
    fn set_transfer(&mut self, id: i64, to: Option<i64>) -> Result<(), MetaError>;
    /// Moves row `id` from `from` at `epoch` to `to` if that is still its state and `to` is
    /// its pending transfer; the new epoch, or `None`.
    fn finish_transfer(
        &mut self,
        id: i64,
        from: i64,
        epoch: i64,
        to: i64,
    ) -> Result<Option<i64>, MetaError>;
    /// The row named `name`.
    fn find(&mut self, name: &str) -> Result<Option<StreamColumns>, MetaError>;
    /// The row with this id.
    fn find_id(&mut self, id: i64) -> Result<Option<StreamColumns>, MetaError>;
    /// How many rows are forks of `id`.
    fn fork_count(&mut self, id: i64) -> Result<u64, MetaError>;
    /// Streams per owner node.
    fn owner_counts(&mut self) -> Result<Vec<(Option<i64>, u64)>, MetaError>;
    /// Every catalog entry of stream `id` with its segment, in commit order.
    fn entries_of(&mut self, id: i64) -> Result<Vec<(SegmentColumns, EntryColumns)>, MetaError>;
    /// At most `limit` rows whose names start with `prefix` and sort after `start_after` (bytewise,
    /// exclusive), in name order, soft-deleted ones left out.
    fn page_of_streams(
        &mut self,
        prefix: &str,
        start_after: &str,
        limit: i64,
    ) -> Result<Vec<StreamColumns>, MetaError>;
    /// The first and last catalog entries' runs of each of these streams that has entries.
    fn edge_entries(&mut self, ids: &[i64]) -> Result<Vec<EdgeRuns>, MetaError>;
}
