//! The metadata thread and its handle, [`MetaStore`].
//!
//! ```text
//!  any thread / executor                       pico-meta thread (owns the Connection)
//!  MetaStore::create_stream ──┐
//!  MetaStore::commit_segment ─┼─ crossbeam ──▶ recv() one command, try_recv() the rest (≤ 1024)
//!  MetaStore::close_stream ───┤   (unbounded)   BEGIN IMMEDIATE
//!  MetaStore::trim_stream ────┘
//!                                                 SAVEPOINT / apply / RELEASE   per command
//!        ◀──────── oneshot, in order ───────────  COMMIT (one fsync for the whole batch)
//! ```

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::thread::JoinHandle;

use crossbeam_channel::Receiver;
use crossbeam_channel::Sender;
use futures_channel::oneshot;
use rusqlite::params;
use rusqlite::Connection;
use rusqlite::OptionalExtension;
use rusqlite::TransactionBehavior;

use crate::producers;
use crate::runs;
use crate::schema;
use crate::schema::storage;
use crate::CreateOutcome;
use crate::ForkRow;
use crate::MetaError;
use crate::MetaUrl;
use crate::ProducerState;
use crate::Reply;
use crate::SegmentRecord;
use crate::SegmentStreamEntry;
use crate::Snapshot;
use crate::StreamConfig;
use crate::StreamRow;

/// Most commands applied in one transaction.
///
/// Bounds how long one batch holds the write lock and how many answers wait on one fsync. A
/// batch is ~1 ms of CPU at this size; more would only delay the first caller's answer, fewer
/// would add fsyncs under a burst of stream creations.
pub const MAX_BATCH_COMMANDS: usize = 1024;

/// The name of the metadata thread, as seen in `top -H` and panics.
const THREAD_NAME: &str = "pico-meta";

/// A handle to the metadata thread. Cheap to clone, `Send + Sync`; every method returns at once
/// with a [`Reply`] that resolves after the command's transaction committed (or failed).
///
/// The command channel is unbounded on purpose: an async caller must never block on it, and the
/// volume is bounded upstream (one command per stream lifecycle event or sealed segment, never per
/// append; the engine's own limits cap those).
///
/// Dropping the last handle, like [`MetaStore::shutdown`], lets the thread finish every command
/// already queued, then joins it.
///
/// A reply resolving to `Err(Canceled)` means the answer was dropped unsent: the thread panicked,
/// or a command was sent in the instant the thread was exiting. Treat it as [`MetaError::Closed`].
#[derive(Clone)]
pub struct MetaStore {
    inner: Arc<Inner>,
}

/// Shared by all clones; its `Drop` is the "last handle dropped" shutdown.
struct Inner {
    commands: Sender<Command>,
    /// Taken by the first shutdown, so later ones (and `Drop`) do not join twice.
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// A request to the metadata thread, with the one-shot its answer goes to.
enum Command {
    Create {
        name: String,
        config: StreamConfig,
        fork: Option<ForkRow>,
        now_ms: i64,
        reply: oneshot::Sender<Result<CreateOutcome, MetaError>>,
    },
    Delete {
        id: u64,
        reply: oneshot::Sender<Result<bool, MetaError>>,
    },
    Close {
        id: u64,
        reply: oneshot::Sender<Result<(), MetaError>>,
    },
    SoftDelete {
        id: u64,
        reply: oneshot::Sender<Result<(), MetaError>>,
    },
    Trim {
        id: u64,
        start_offset: u64,
        reply: oneshot::Sender<Result<(), MetaError>>,
    },
    Touch {
        id: u64,
        last_access_ms: i64,
        reply: oneshot::Sender<Result<(), MetaError>>,
    },
    Garbage {
        live: HashMap<u64, u64>,
        sealed_before_ms: i64,
        reply: oneshot::Sender<Result<Vec<String>, MetaError>>,
    },
    DropSegments {
        keys: Vec<String>,
        reply: oneshot::Sender<Result<(), MetaError>>,
    },
    Commit {
        segment: SegmentRecord,
        reply: oneshot::Sender<Result<(), MetaError>>,
    },
    /// Stop after the commands queued before this one.
    Shutdown,
}

impl MetaStore {
    /// Opens (creating if needed) the metadata log, migrates it, loads the startup [`Snapshot`]
    /// and starts the `pico-meta` thread.
    ///
    /// Blocking (SQLite I/O): call it at startup, before the executors run, not from one.
    pub fn open(url: &MetaUrl) -> Result<(MetaStore, Snapshot), MetaError> {
        let mut conn = match url {
            MetaUrl::SqliteMemory => {
                Connection::open_in_memory().map_err(storage("open in-memory SQLite"))?
            }
            MetaUrl::SqliteFile(path) => open_file(path)?,
            MetaUrl::Postgres(_) => {
                return Err(MetaError::Unsupported(
                    "postgres metadata is not available yet; use sqlite:<path>".to_string(),
                ))
            }
        };
        schema::configure(&conn, matches!(url, MetaUrl::SqliteMemory))?;
        schema::migrate(&mut conn)?;
        let snapshot = load_snapshot(&conn)?;
        let (commands, receiver) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name(THREAD_NAME.to_string())
            .spawn(move || run(conn, receiver))
            .map_err(|error| {
                MetaError::Storage(format!("spawn the {THREAD_NAME} thread: {error}"))
            })?;
        let inner = Inner {
            commands,
            thread: Mutex::new(Some(thread)),
        };
        Ok((
            MetaStore {
                inner: Arc::new(inner),
            },
            snapshot,
        ))
    }

    /// Registers `name` unless a live stream already has it.
    ///
    /// Atomic (the thread is the only writer and the name is `UNIQUE`): of two racing creates
    /// exactly one gets `created: true`; the other gets the winner's row and `created: false`, and
    /// decides itself whether the existing config matches. `config` is stored as given.
    pub fn create_stream(
        &self,
        name: &str,
        config: StreamConfig,
        now_ms: i64,
    ) -> Reply<CreateOutcome> {
        self.create_fork_stream(name, config, None, now_ms)
    }

    /// [`MetaStore::create_stream`] for a fork: the row records where its inherited records
    /// come from, in the same transaction as the insert.
    pub fn create_fork_stream(
        &self,
        name: &str,
        config: StreamConfig,
        fork: Option<ForkRow>,
        now_ms: i64,
    ) -> Reply<CreateOutcome> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Create {
            name: name.to_string(),
            config,
            fork,
            now_ms,
            reply,
        });
        answer
    }

    /// Marks `id` deleted for clients while forks still read its records: the row (and so its
    /// name and its segments) stays until the last fork is gone and the row is deleted.
    pub fn soft_delete_stream(&self, id: u64) -> Reply<()> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::SoftDelete { id, reply });
        answer
    }

    /// Removes the registry row of `id`; `false` if there is none (already deleted, never made).
    ///
    /// The name becomes free at once and a later create gets a new id. Catalog entries of the
    /// stream stay (segments are shared by many streams; GC is later work) but never bring the
    /// stream back: the snapshot's streams come from the registry alone.
    pub fn delete_stream(&self, id: u64) -> Reply<bool> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Delete { id, reply });
        answer
    }

    /// Marks `id` closed. Idempotent; an unknown id is `Ok` because a close racing a delete has
    /// nothing left to protect.
    pub fn close_stream(&self, id: u64) -> Reply<()> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Close { id, reply });
        answer
    }

    /// Raises the first readable offset of `id` to `start_offset`; never lowers it (the stored
    /// value becomes the larger of the two), so a retried or reordered trim is harmless.
    /// Idempotent; an unknown id is `Ok`, like [`MetaStore::close_stream`].
    ///
    /// Rejected (as [`MetaError::Storage`], nothing written) when `start_offset` exceeds
    /// `i64::MAX`, the largest integer SQLite stores.
    pub fn trim_stream(&self, id: u64, start_offset: u64) -> Reply<()> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Trim {
            id,
            start_offset,
            reply,
        });
        answer
    }

    /// Moves the idle clock of a stream with a sliding TTL forward to `last_access_ms`; never
    /// backwards. Callers write it only when it moved by a good part of the TTL, so this is a
    /// rare command, not one per read.
    pub fn touch_stream(&self, id: u64, last_access_ms: i64) -> Reply<()> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Touch {
            id,
            last_access_ms,
            reply,
        });
        answer
    }

    /// Keys of committed segments that no live stream needs: every stream they hold is gone
    /// (not in `live`, which maps each live stream id to its first readable offset), or was
    /// trimmed past all of its records there and left no producer state or close marker in it.
    /// Only segments sealed before `sealed_before_ms` are considered, so one sealed after the
    /// caller gathered `live` (possibly holding streams created since) is never reported.
    pub fn garbage_segments(
        &self,
        live: HashMap<u64, u64>,
        sealed_before_ms: i64,
    ) -> Reply<Vec<String>> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Garbage {
            live,
            sealed_before_ms,
            reply,
        });
        answer
    }

    /// Forgets these segments (their objects must be deleted first: a row without its object
    /// is harmless garbage found again next time, an object without its row would leak).
    pub fn drop_segments(&self, keys: Vec<String>) -> Reply<()> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::DropSegments { keys, reply });
        answer
    }

    /// Records a sealed segment and what it holds of each stream, in one transaction.
    ///
    /// Call it only after the object is stored: the catalog must never point at a missing
    /// object. Idempotent by `key`: re-committing replaces the entries but keeps the segment's
    /// place in commit order, so a retry after a lost answer changes nothing. Entries of deleted
    /// stream ids are accepted.
    ///
    /// Rejected (as [`MetaError::Storage`], nothing written) when the record contradicts itself:
    /// a run with `first_offset > next_offset` or `byte_start > byte_end`, a run ending past
    /// `size_bytes`, runs of one stream unsorted or overlapping in offsets, the same stream
    /// twice in one segment, an entry's producers not sorted by id or with an id twice, or a
    /// producer id (in `producers` or `closed_by`) longer than 65535 bytes.
    pub fn commit_segment(&self, seg: SegmentRecord) -> Reply<()> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Commit {
            segment: seg,
            reply,
        });
        answer
    }

    /// Stops the thread once every command queued before this call is committed and answered,
    /// and waits for it (so it blocks, briefly: call it from a plain thread). Later calls on any
    /// clone answer [`MetaError::Closed`]. Idempotent.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    /// Queues a command; when the thread is gone the command's reply is answered `Closed` here,
    /// so a caller never waits on a one-shot that nobody will complete.
    fn send(&self, command: Command) {
        if let Err(crossbeam_channel::SendError(command)) = self.inner.commands.send(command) {
            answer_closed(command);
        }
    }
}

impl Inner {
    fn shutdown(&self) {
        // A send error means the thread already left its loop; joining is still right.
        let _ = self.commands.send(Command::Shutdown);
        let thread = match self.thread.lock() {
            Ok(mut guard) => guard.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(thread) = thread {
            // Joining ourselves would deadlock; the metadata thread holds no handle, but be sure.
            if thread.thread().id() != std::thread::current().id() && thread.join().is_err() {
                log::error!("the {THREAD_NAME} thread panicked");
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Opens a SQLite file, creating its parent directory first (SQLite creates the file, not the
/// directories above it).
fn open_file(path: &Path) -> Result<Connection, MetaError> {
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent).map_err(|error| {
            MetaError::Storage(format!("create directory {}: {error}", parent.display()))
        })?;
    }
    Connection::open(path)
        .map_err(|error| MetaError::Storage(format!("open {}: {error}", path.display())))
}

/// The thread's loop: block for one command, drain what else is queued, apply as one batch.
fn run(mut conn: Connection, receiver: Receiver<Command>) {
    let mut batch = Vec::with_capacity(MAX_BATCH_COMMANDS);
    // `recv` fails only when every handle is gone and the queue is empty: nothing left to do.
    while let Ok(first) = receiver.recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH_COMMANDS {
            match receiver.try_recv() {
                Ok(command) => batch.push(command),
                Err(_) => break,
            }
        }
        let shutdown_at = batch
            .iter()
            .position(|command| matches!(command, Command::Shutdown));
        let after_shutdown = shutdown_at.map(|at| batch.split_off(at));
        apply_batch(&mut conn, std::mem::take(&mut batch));
        if let Some(rest) = after_shutdown {
            // Commands that raced the shutdown: answered, never silently dropped.
            rest.into_iter().for_each(answer_closed);
            receiver.try_iter().for_each(answer_closed);
            break;
        }
    }
    log::debug!("{THREAD_NAME} thread stopped");
}

/// A command whose result is decided but not yet sent (answers wait for the COMMIT).
enum Pending {
    Create(
        oneshot::Sender<Result<CreateOutcome, MetaError>>,
        Result<CreateOutcome, MetaError>,
    ),
    Delete(
        oneshot::Sender<Result<bool, MetaError>>,
        Result<bool, MetaError>,
    ),
    Unit(
        oneshot::Sender<Result<(), MetaError>>,
        Result<(), MetaError>,
    ),
    Keys(
        oneshot::Sender<Result<Vec<String>, MetaError>>,
        Result<Vec<String>, MetaError>,
    ),
}

impl Pending {
    fn is_ok(&self) -> bool {
        match self {
            Pending::Create(_, result) => result.is_ok(),
            Pending::Delete(_, result) => result.is_ok(),
            Pending::Unit(_, result) => result.is_ok(),
            Pending::Keys(_, result) => result.is_ok(),
        }
    }

    /// The transaction did not commit: a success computed inside it is not true any more.
    fn fail(&mut self, why: &str) {
        match self {
            Pending::Create(_, result) if result.is_ok() => *result = failed(why),
            Pending::Delete(_, result) if result.is_ok() => *result = failed(why),
            Pending::Unit(_, result) if result.is_ok() => *result = failed(why),
            Pending::Keys(_, result) if result.is_ok() => *result = failed(why),
            _ => {}
        }
    }

    /// Sends the answer; a caller that stopped waiting (dropped receiver) is fine.
    fn answer(self) {
        let _ = match self {
            Pending::Create(reply, result) => reply.send(result).map_err(drop),
            Pending::Delete(reply, result) => reply.send(result).map_err(drop),
            Pending::Unit(reply, result) => reply.send(result).map_err(drop),
            Pending::Keys(reply, result) => reply.send(result).map_err(drop),
        };
    }
}

/// Applies `batch` (no `Shutdown` in it) in one transaction and answers every command in order.
///
/// Each command runs inside its own savepoint, so one failing command (a bad segment record, a
/// constraint) is rolled back alone and the others still commit. Only a failure of the
/// transaction itself (BEGIN, COMMIT, an I/O error that made SQLite abandon the transaction)
/// fails every command of the batch.
fn apply_batch(conn: &mut Connection, batch: Vec<Command>) {
    if batch.is_empty() {
        return;
    }
    let mut pending = Vec::with_capacity(batch.len());
    let outcome = apply_in_transaction(conn, batch, &mut pending);
    if let Err(why) = outcome {
        log::error!("metadata batch of {} commands failed: {why}", pending.len());
        pending.iter_mut().for_each(|entry| entry.fail(&why));
    }
    let failed = pending.iter().filter(|entry| !entry.is_ok()).count();
    if failed > 0 {
        log::warn!("{failed} of {} metadata commands failed", pending.len());
    }
    pending.into_iter().for_each(Pending::answer);
}

/// The transactional part of [`apply_batch`]. Every command of `batch` ends up in `pending`,
/// even on error, so every caller gets an answer.
fn apply_in_transaction(
    conn: &mut Connection,
    batch: Vec<Command>,
    pending: &mut Vec<Pending>,
) -> Result<(), String> {
    let mut commands = batch.into_iter();
    // IMMEDIATE takes the write lock now instead of at the first write, so a concurrent reader
    // cannot turn it into a mid-batch SQLITE_BUSY.
    let mut tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(error) => return abandon(pending, commands, format!("begin transaction: {error}")),
    };
    while let Some(command) = commands.next() {
        let mut savepoint = match tx.savepoint() {
            Ok(savepoint) => savepoint,
            Err(error) => {
                let rest = std::iter::once(command).chain(commands);
                return abandon(pending, rest, format!("savepoint: {error}"));
            }
        };
        let entry = apply_command(&savepoint, command);
        let settled = if entry.is_ok() {
            savepoint.commit()
        } else {
            savepoint.rollback().and_then(|()| savepoint.commit())
        };
        pending.push(entry);
        if let Err(error) = settled {
            return abandon(pending, commands, format!("settle savepoint: {error}"));
        }
        // Some errors (SQLITE_FULL, SQLITE_IOERR) make SQLite roll the whole transaction back;
        // then earlier commands are gone too and must not be reported as committed.
        if tx.is_autocommit() {
            let why = "SQLite rolled the transaction back after an error".to_string();
            return abandon(pending, commands, why);
        }
    }
    tx.commit().map_err(|error| format!("commit: {error}"))
}

/// Gives every command not yet applied the batch's error; returns that error for
/// [`apply_batch`] to fail the commands applied so far.
fn abandon(
    pending: &mut Vec<Pending>,
    commands: impl Iterator<Item = Command>,
    why: String,
) -> Result<(), String> {
    pending.extend(commands.map(|command| match command {
        Command::Create { reply, .. } => Pending::Create(reply, failed(&why)),
        Command::Delete { reply, .. } => Pending::Delete(reply, failed(&why)),
        Command::Close { reply, .. }
        | Command::SoftDelete { reply, .. }
        | Command::Trim { reply, .. }
        | Command::Touch { reply, .. }
        | Command::DropSegments { reply, .. }
        | Command::Commit { reply, .. } => Pending::Unit(reply, failed(&why)),
        Command::Garbage { reply, .. } => Pending::Keys(reply, failed(&why)),
        Command::Shutdown => unreachable!("run() splits the batch at Shutdown"),
    }));
    Err(why)
}

fn failed<T>(why: &str) -> Result<T, MetaError> {
    Err(MetaError::Storage(why.to_string()))
}

/// Answers a command that will never run, because the thread is stopping or gone.
fn answer_closed(command: Command) {
    let _ = match command {
        Command::Create { reply, .. } => reply.send(Err(MetaError::Closed)).map_err(drop),
        Command::Delete { reply, .. } => reply.send(Err(MetaError::Closed)).map_err(drop),
        Command::Close { reply, .. }
        | Command::SoftDelete { reply, .. }
        | Command::Trim { reply, .. }
        | Command::Touch { reply, .. }
        | Command::DropSegments { reply, .. }
        | Command::Commit { reply, .. } => reply.send(Err(MetaError::Closed)).map_err(drop),
        Command::Garbage { reply, .. } => reply.send(Err(MetaError::Closed)).map_err(drop),
        Command::Shutdown => Ok(()),
    };
}

fn apply_command(conn: &Connection, command: Command) -> Pending {
    match command {
        Command::Create {
            name,
            config,
            fork,
            now_ms,
            reply,
        } => Pending::Create(reply, create(conn, name, config, fork, now_ms)),
        Command::SoftDelete { id, reply } => Pending::Unit(reply, soft_delete(conn, id)),
        Command::Delete { id, reply } => Pending::Delete(reply, delete(conn, id)),
        Command::Close { id, reply } => Pending::Unit(reply, close(conn, id)),
        Command::Trim {
            id,
            start_offset,
            reply,
        } => Pending::Unit(reply, trim(conn, id, start_offset)),
        Command::Touch {
            id,
            last_access_ms,
            reply,
        } => Pending::Unit(reply, touch(conn, id, last_access_ms)),
        Command::Commit { segment, reply } => Pending::Unit(reply, commit(conn, &segment)),
        Command::Garbage {
            live,
            sealed_before_ms,
            reply,
        } => Pending::Keys(
            reply,
            load_snapshot(conn).map(|snapshot| garbage(&snapshot, &live, sealed_before_ms)),
        ),
        Command::DropSegments { keys, reply } => Pending::Unit(reply, drop_segments(conn, &keys)),
        Command::Shutdown => unreachable!("run() splits the batch at Shutdown"),
    }
}

const SELECT_STREAM: &str = "SELECT id, name, content_type, ttl_sec, expires_at_ms, closed, \
                             created_ms, start_offset, coalesce(last_access_ms, created_ms), \
                             fork_source, fork_source_id, fork_offset, fork_partial_bytes, \
                             soft_deleted FROM streams";

fn stream_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<StreamRow> {
    Ok(StreamRow {
        id: row.get(0)?,
        name: row.get(1)?,
        config: StreamConfig {
            content_type: row.get(2)?,
            ttl_sec: row.get(3)?,
            expires_at_ms: row.get(4)?,
            closed: row.get(5)?,
        },
        created_ms: row.get(6)?,
        start_offset: row.get(7)?,
        last_access_ms: row.get(8)?,
        fork: match row.get::<_, Option<String>>(9)? {
            None => None,
            Some(source) => Some(ForkRow {
                source,
                source_id: row.get(10)?,
                offset: row.get(11)?,
                partial_bytes: row.get(12)?,
            }),
        },
        soft_deleted: row.get(13)?,
    })
}

fn create(
    conn: &Connection,
    name: String,
    config: StreamConfig,
    fork: Option<ForkRow>,
    now_ms: i64,
) -> Result<CreateOutcome, MetaError> {
    let existing = conn
        .query_row(
            &format!("{SELECT_STREAM} WHERE name = ?1"),
            [&name],
            stream_row,
        )
        .optional()
        .map_err(storage("look up stream"))?;
    if let Some(row) = existing {
        return Ok(CreateOutcome {
            row,
            created: false,
        });
    }
    let storable = |value: u64, what: &str| {
        i64::try_from(value)
            .map_err(|_| MetaError::Storage(format!("fork {what} {value} is not storable")))
    };
    let fork_columns = match &fork {
        None => (None, None, None, None),
        Some(f) => (
            Some(f.source.clone()),
            Some(storable(f.source_id, "source id")?),
            Some(storable(f.offset, "offset")?),
            Some(storable(f.partial_bytes, "partial bytes")?),
        ),
    };
    conn.execute(
        "INSERT INTO streams (name, content_type, ttl_sec, expires_at_ms, closed, created_ms,
                              fork_source, fork_source_id, fork_offset, fork_partial_bytes)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            name,
            config.content_type,
            config.ttl_sec,
            config.expires_at_ms,
            config.closed,
            now_ms,
            fork_columns.0,
            fork_columns.1,
            fork_columns.2,
            fork_columns.3
        ],
    )
    .map_err(storage("insert stream"))?;
    let id = conn.last_insert_rowid();
    // AUTOINCREMENT starts at 1 and only grows, so a rowid is always positive.
    assert!(
        id > 0,
        "SQLite gave stream {name:?} the non-positive id {id}"
    );
    let row = StreamRow {
        id: id as u64,
        name,
        config,
        created_ms: now_ms,
        start_offset: 0, // the column's default
        last_access_ms: now_ms,
        fork,
        soft_deleted: false,
    };
    Ok(CreateOutcome { row, created: true })
}

fn delete(conn: &Connection, id: u64) -> Result<bool, MetaError> {
    let Ok(id) = i64::try_from(id) else {
        return Ok(false); // no row can have an id above i64::MAX
    };
    let removed = conn
        .execute("DELETE FROM streams WHERE id = ?1", [id])
        .map_err(storage("delete stream"))?;
    Ok(removed > 0)
}

fn soft_delete(conn: &Connection, id: u64) -> Result<(), MetaError> {
    let Ok(id) = i64::try_from(id) else {
        return Ok(()); // unknown id
    };
    conn.execute("UPDATE streams SET soft_deleted = 1 WHERE id = ?1", [id])
        .map_err(storage("soft-delete stream"))?;
    Ok(())
}

fn close(conn: &Connection, id: u64) -> Result<(), MetaError> {
    let Ok(id) = i64::try_from(id) else {
        return Ok(()); // unknown id
    };
    conn.execute("UPDATE streams SET closed = 1 WHERE id = ?1", [id])
        .map_err(storage("close stream"))?;
    Ok(())
}

fn trim(conn: &Connection, id: u64, start_offset: u64) -> Result<(), MetaError> {
    let Ok(id) = i64::try_from(id) else {
        return Ok(()); // unknown id
    };
    let Ok(start_offset) = i64::try_from(start_offset) else {
        return Err(MetaError::Storage(format!(
            "trim stream {id}: start offset {start_offset} exceeds the largest storable {}",
            i64::MAX
        )));
    };
    // The two-argument max() is SQLite's scalar function: the larger of the stored and the
    // given offset, so a trim never moves the start backwards.
    conn.execute(
        "UPDATE streams SET start_offset = max(start_offset, ?2) WHERE id = ?1",
        [id, start_offset],
    )
    .map_err(storage("trim stream"))?;
    Ok(())
}

/// The segments of `snapshot` that no live stream needs (see [`MetaStore::garbage_segments`]).
pub(crate) fn garbage(
    snapshot: &Snapshot,
    live: &HashMap<u64, u64>,
    sealed_before_ms: i64,
) -> Vec<String> {
    let needed = |entry: &SegmentStreamEntry| match live.get(&entry.stream_id) {
        None => false,
        Some(&start) => {
            let records_readable = entry.runs.iter().any(|run| run.next_offset > start);
            records_readable
                || entry.closed
                || entry.closed_by.is_some()
                || entry.writer_seq.is_some()
                || !entry.producers.is_empty()
        }
    };
    snapshot
        .segments
        .iter()
        .filter(|segment| segment.created_ms < sealed_before_ms)
        .filter(|segment| !segment.streams.iter().any(needed))
        .map(|segment| segment.key.clone())
        .collect()
}

fn drop_segments(conn: &Connection, keys: &[String]) -> Result<(), MetaError> {
    for key in keys {
        // The foreign key cascades to the segment's stream entries.
        conn.execute("DELETE FROM segments WHERE key = ?1", [key])
            .map_err(storage("drop segment"))?;
    }
    Ok(())
}

fn touch(conn: &Connection, id: u64, last_access_ms: i64) -> Result<(), MetaError> {
    let Ok(id) = i64::try_from(id) else {
        return Ok(()); // unknown id
    };
    conn.execute(
        "UPDATE streams SET last_access_ms = max(coalesce(last_access_ms, created_ms), ?2) \
         WHERE id = ?1",
        [id, last_access_ms],
    )
    .map_err(storage("touch stream"))?;
    Ok(())
}

fn commit(conn: &Connection, segment: &SegmentRecord) -> Result<(), MetaError> {
    validate_segment(segment)?;
    // Upsert keeps `seq` (the commit-order position) of an already committed key.
    let seq: i64 = conn
        .query_row(
            "INSERT INTO segments (key, size_bytes, created_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT (key) DO UPDATE
                SET size_bytes = excluded.size_bytes, created_ms = excluded.created_ms
             RETURNING seq",
            params![segment.key, segment.size_bytes, segment.created_ms],
            |row| row.get(0),
        )
        .map_err(storage("insert segment"))?;
    conn.execute("DELETE FROM segment_streams WHERE segment_seq = ?1", [seq])
        .map_err(storage("replace segment entries"))?;
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO segment_streams
                (segment_seq, ord, stream_id, runs, last_timestamp_ms, closed,
                 producers, closed_by, writer_seq)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )
        .map_err(storage("prepare segment entry insert"))?;
    for (ord, entry) in segment.streams.iter().enumerate() {
        // validate_segment checked the id lengths, so neither encoding can fail here.
        let too_long = || {
            MetaError::Storage(format!(
                "segment {}: stream {}: producer id too long",
                segment.key, entry.stream_id
            ))
        };
        let producers = producers::encode(&entry.producers).ok_or_else(too_long)?;
        let closed_by = match &entry.closed_by {
            Some(producer) => Some(producers::encode_one(producer).ok_or_else(too_long)?),
            None => None,
        };
        insert
            .execute(params![
                seq,
                ord as i64,
                entry.stream_id,
                runs::encode(&entry.runs),
                entry.last_timestamp_ms,
                entry.closed,
                producers,
                closed_by,
                entry.writer_seq,
            ])
            .map_err(storage("insert segment entry"))?;
    }
    Ok(())
}

/// Checks a segment record against itself before anything is written (see
/// [`MetaStore::commit_segment`] for the rules). A record breaking them is an engine bug; storing
/// it would make recovery serve wrong bytes later, so it is refused now, loudly.
fn validate_segment(segment: &SegmentRecord) -> Result<(), MetaError> {
    let reject = |why: String| {
        Err(MetaError::Storage(format!(
            "segment {}: {why}",
            segment.key
        )))
    };
    if segment.key.is_empty() {
        return reject("empty object key".to_string());
    }
    let mut seen = std::collections::HashSet::with_capacity(segment.streams.len());
    for entry in &segment.streams {
        if !seen.insert(entry.stream_id) {
            return reject(format!("stream {} listed twice", entry.stream_id));
        }
        validate_runs(segment.size_bytes, entry).or_else(reject)?;
        validate_producers(entry).or_else(reject)?;
    }
    Ok(())
}

fn validate_runs(size_bytes: u64, entry: &SegmentStreamEntry) -> Result<(), String> {
    let stream = entry.stream_id;
    for run in &entry.runs {
        if run.first_offset > run.next_offset || run.byte_start > run.byte_end {
            return Err(format!("stream {stream}: run {run:?} is inverted"));
        }
        if run.byte_end > size_bytes {
            return Err(format!(
                "stream {stream}: run {run:?} ends past the object's {size_bytes} bytes"
            ));
        }
    }
    for pair in entry.runs.windows(2) {
        if pair[0].next_offset > pair[1].first_offset {
            return Err(format!(
                "stream {stream}: runs {:?} and {:?} are unsorted or overlap",
                pair[0], pair[1]
            ));
        }
    }
    Ok(())
}

fn validate_producers(entry: &SegmentStreamEntry) -> Result<(), String> {
    let stream = entry.stream_id;
    let long_id = |producer: &ProducerState| {
        (producer.id.len() > producers::MAX_ID_BYTES).then(|| {
            format!(
                "stream {stream}: producer id of {} bytes is longer than {}",
                producer.id.len(),
                producers::MAX_ID_BYTES
            )
        })
    };
    if let Some(why) = entry
        .producers
        .iter()
        .chain(&entry.closed_by)
        .find_map(long_id)
    {
        return Err(why);
    }
    for pair in entry.producers.windows(2) {
        if pair[0].id >= pair[1].id {
            return Err(format!(
                "stream {stream}: producers {:?} and {:?} are unsorted or duplicated",
                pair[0].id, pair[1].id
            ));
        }
    }
    Ok(())
}

/// Reads everything a node needs at startup: live streams, and every committed segment in
/// commit order with its entries in the order they were given.
fn load_snapshot(conn: &Connection) -> Result<Snapshot, MetaError> {
    let mut streams_query = conn
        .prepare(&format!("{SELECT_STREAM} ORDER BY id"))
        .map_err(storage("prepare stream load"))?;
    let streams = streams_query
        .query_map([], stream_row)
        .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(storage("load streams"))?;

    let mut segments_query = conn
        .prepare("SELECT seq, key, size_bytes, created_ms FROM segments ORDER BY seq")
        .map_err(storage("prepare segment load"))?;
    let mut segments = segments_query
        .query_map([], |row| {
            let seq: i64 = row.get(0)?;
            let segment = SegmentRecord {
                key: row.get(1)?,
                size_bytes: row.get(2)?,
                created_ms: row.get(3)?,
                streams: Vec::new(),
            };
            Ok((seq, segment))
        })
        .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(storage("load segments"))?;

    let mut entries_query = conn
        .prepare(
            "SELECT segment_seq, stream_id, runs, last_timestamp_ms, closed, producers, closed_by,
                    writer_seq
             FROM segment_streams ORDER BY segment_seq, ord",
        )
        .map_err(storage("prepare segment entry load"))?;
    let mut entries = entries_query
        .query([])
        .map_err(storage("load segment entries"))?;
    // Both lists are sorted by seq, so one forward walk pairs every entry with its segment.
    let mut cursor = 0;
    while let Some(row) = entries.next().map_err(storage("load segment entries"))? {
        let seq: i64 = row.get(0).map_err(storage("read segment entry"))?;
        while cursor < segments.len() && segments[cursor].0 < seq {
            cursor += 1;
        }
        if cursor == segments.len() || segments[cursor].0 != seq {
            // The foreign key makes this impossible in a database we wrote.
            return Err(MetaError::Storage(format!(
                "segment entry of unknown segment #{seq}"
            )));
        }
        let key = &segments[cursor].1.key;
        // Past this point every error names the segment, so an operator knows where to look.
        let unreadable = |error: rusqlite::Error| {
            MetaError::Storage(format!("segment {key}: read entry: {error}"))
        };
        let stream_id: u64 = row.get(1).map_err(unreadable)?;
        let damaged = |what: &str, blob: &[u8]| {
            MetaError::Storage(format!(
                "segment {key}: stream {stream_id}: damaged {what} ({} bytes)",
                blob.len()
            ))
        };
        let blob: Vec<u8> = row.get(2).map_err(unreadable)?;
        let runs = runs::decode(&blob).ok_or_else(|| damaged("runs", &blob))?;
        let blob: Vec<u8> = row.get(5).map_err(unreadable)?;
        let producers = producers::decode(&blob).ok_or_else(|| damaged("producers", &blob))?;
        let closed_by = match row.get::<_, Option<Vec<u8>>>(6).map_err(unreadable)? {
            Some(blob) => {
                Some(producers::decode_one(&blob).ok_or_else(|| damaged("closed_by", &blob))?)
            }
            None => None,
        };
        let entry = SegmentStreamEntry {
            stream_id,
            runs,
            last_timestamp_ms: row.get(3).map_err(unreadable)?,
            closed: row.get(4).map_err(unreadable)?,
            producers,
            closed_by,
            writer_seq: row.get(7).map_err(unreadable)?,
        };
        segments[cursor].1.streams.push(entry);
    }
    let segments = segments.into_iter().map(|(_, segment)| segment).collect();
    Ok(Snapshot { streams, segments })
}
