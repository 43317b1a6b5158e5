//! The metadata thread and its handle, [`MetaStore`].
//!
//! ```text
//!  any thread / executor                       pico-meta thread (owns the connection)
//!  MetaStore::create_stream ──┐
//!  MetaStore::commit_segment ─┼─ crossbeam ──▶ recv() one command, try_recv() the rest (≤ 1024)
//!  MetaStore::close_stream ───┤   (unbounded)   BEGIN (SQLite: IMMEDIATE)
//!  MetaStore::trim_stream ────┘
//!                                                 SAVEPOINT / apply / RELEASE   per command
//!        ◀──────── oneshot, in order ───────────  COMMIT (one fsync for the whole batch)
//! ```
//!
//! Everything here is the same for SQLite and Postgres; the SQL itself is behind
//! [`Backend`] (`sqlite.rs`, `pg.rs`).

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::Arc;
use std::sync::Mutex;
use std::thread::JoinHandle;

use crossbeam_channel::Receiver;
use crossbeam_channel::Sender;
use futures_channel::oneshot;

use crate::backend;
use crate::backend::Backend;
use crate::backend::NewStream;
use crate::backend::NodeId;
use crate::backend::StreamColumns;
use crate::backend::StreamUpdate;
use crate::fence::{Fence, Ownership, SegmentFence};
use crate::pg::Postgres;
use crate::rows::{commit, segment_entry, storable, stream_row, unsigned};
use crate::sqlite::Sqlite;
use crate::CreateOutcome;
use crate::ForkRow;
use crate::MetaError;
use crate::MetaUrl;
use crate::Reply;
use crate::Retention;
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
        owner: Option<NodeId>,
        reply: oneshot::Sender<Result<CreateOutcome, MetaError>>,
    },
    Delete {
        id: u64,
        fence: Option<Fence>,
        reply: oneshot::Sender<Result<bool, MetaError>>,
    },
    Update {
        id: u64,
        update: StreamUpdate,
        fence: Option<Fence>,
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
    /// Any other command: runs in the batch's transaction like the rest, and answers its
    /// caller itself (see [`pending`]).
    Job(Box<dyn Job>),
    /// Stop after the commands queued before this one.
    Shutdown,
}

impl MetaStore {
    /// Opens (creating if needed) the metadata log, migrates it, loads the startup [`Snapshot`]
    /// and starts the `pico-meta` thread.
    ///
    /// Blocking (SQLite I/O, or connecting to Postgres): call it at startup, before the
    /// executors run, not from one. The connection is made on the metadata thread itself, which
    /// owns it from then on.
    pub fn open(url: &MetaUrl) -> Result<(MetaStore, Snapshot), MetaError> {
        let url = url.clone();
        let (ready, started) = mpsc::sync_channel(1);
        let (commands, receiver) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name(THREAD_NAME.to_string())
            .spawn(move || {
                let opened = open_backend(&url).and_then(|mut db| {
                    let snapshot = startup_snapshot(db.as_mut())?;
                    Ok((db, snapshot))
                });
                match opened {
                    Ok((db, snapshot)) => {
                        // `open` waits for this answer, so the send cannot fail.
                        let _ = ready.send(Ok(snapshot));
                        run(db, receiver);
                    }
                    Err(error) => {
                        let _ = ready.send(Err(error));
                    }
                }
            })
            .map_err(|error| {
                MetaError::Storage(format!("spawn the {THREAD_NAME} thread: {error}"))
            })?;
        let snapshot = match started.recv() {
            Ok(Ok(snapshot)) => snapshot,
            Ok(Err(error)) => {
                let _ = thread.join();
                return Err(error);
            }
            Err(mpsc::RecvError) => {
                let _ = thread.join();
                return Err(MetaError::Storage(format!(
                    "the {THREAD_NAME} thread panicked while opening the metadata log"
                )));
            }
        };
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
        self.create_stream_owned(name, config, fork, now_ms, None)
    }

    /// [`MetaStore::create_fork_stream`] in a cluster: a new row is owned by `owner` at epoch 1;
    /// the outcome tells who owns the row that holds the name.
    pub fn create_stream_owned(
        &self,
        name: &str,
        config: StreamConfig,
        fork: Option<ForkRow>,
        now_ms: i64,
        owner: Option<NodeId>,
    ) -> Reply<CreateOutcome> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Create {
            name: name.to_string(),
            config,
            fork,
            now_ms,
            owner,
            reply,
        });
        answer
    }

    /// Marks `id` deleted for clients while forks still read its records: the row (and so its
    /// name and its segments) stays until the last fork is gone and the row is deleted.
    pub fn soft_delete_stream(&self, id: u64) -> Reply<()> {
        self.update_stream(id, StreamUpdate::SoftDelete, None)
    }

    /// A change to one stream row, refused with [`MetaError::Fenced`] when `fence` is given
    /// and the row's owner or owner epoch differs from it (a cluster node that lost the
    /// stream must not write to it).
    fn update_stream(&self, id: u64, update: StreamUpdate, fence: Option<Fence>) -> Reply<()> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Update {
            id,
            update,
            fence,
            reply,
        });
        answer
    }

    /// Replaces the retention policy of `id` (fenced, see [`MetaStore::close_stream_fenced`]).
    /// Rejected (as [`MetaError::Storage`], nothing written) when a limit exceeds `i64::MAX`.
    pub fn configure_stream_fenced(
        &self,
        id: u64,
        retention: Retention,
        fence: Option<Fence>,
    ) -> Reply<()> {
        match retention_columns(&retention) {
            Ok(columns) => self.update_stream(id, StreamUpdate::SetRetention(columns), fence),
            Err(e) => {
                let (reply, answer) = oneshot::channel();
                let _ = reply.send(Err(e));
                answer
            }
        }
    }

    /// [`MetaStore::soft_delete_stream`], fenced (see [`MetaStore::close_stream_fenced`]).
    pub fn soft_delete_stream_fenced(&self, id: u64, fence: Option<Fence>) -> Reply<()> {
        self.update_stream(id, StreamUpdate::SoftDelete, fence)
    }

    /// Removes the registry row of `id`; `false` if there is none (already deleted, never made).
    ///
    /// The name becomes free at once and a later create gets a new id. Catalog entries of the
    /// stream stay (segments are shared by many streams; GC is later work) but never bring the
    /// stream back: the snapshot's streams come from the registry alone.
    pub fn delete_stream(&self, id: u64) -> Reply<bool> {
        self.delete_stream_fenced(id, None)
    }

    /// [`MetaStore::delete_stream`], fenced (see [`MetaStore::close_stream_fenced`]).
    pub fn delete_stream_fenced(&self, id: u64, fence: Option<Fence>) -> Reply<bool> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Delete { id, fence, reply });
        answer
    }

    /// Marks `id` closed. Idempotent; an unknown id is `Ok` because a close racing a delete has
    /// nothing left to protect.
    pub fn close_stream(&self, id: u64) -> Reply<()> {
        self.update_stream(id, StreamUpdate::Close, None)
    }

    /// [`MetaStore::close_stream`] by the owner `fence` names: refused with
    /// [`MetaError::Fenced`] when the row has another owner or epoch now.
    pub fn close_stream_fenced(&self, id: u64, fence: Option<Fence>) -> Reply<()> {
        self.update_stream(id, StreamUpdate::Close, fence)
    }

    /// Raises the first readable offset of `id` to `start_offset`; never lowers it (the stored
    /// value becomes the larger of the two), so a retried or reordered trim is harmless.
    /// Idempotent; an unknown id is `Ok`, like [`MetaStore::close_stream`].
    ///
    /// Rejected (as [`MetaError::Storage`], nothing written) when `start_offset` exceeds
    /// `i64::MAX`, the largest integer the databases store.
    pub fn trim_stream(&self, id: u64, start_offset: u64) -> Reply<()> {
        self.trim_stream_fenced(id, start_offset, None)
    }

    /// [`MetaStore::trim_stream`], fenced (see [`MetaStore::close_stream_fenced`]).
    pub fn trim_stream_fenced(
        &self,
        id: u64,
        start_offset: u64,
        fence: Option<Fence>,
    ) -> Reply<()> {
        let (reply, answer) = oneshot::channel();
        let Ok(offset) = i64::try_from(start_offset) else {
            let _ = reply.send(Err(MetaError::Storage(format!(
                "trim stream {id}: start offset {start_offset} exceeds the largest storable {}",
                i64::MAX
            ))));
            return answer;
        };
        self.send(Command::Update {
            id,
            update: StreamUpdate::RaiseStart(offset),
            fence,
            reply,
        });
        answer
    }

    /// Moves the idle clock of a stream with a sliding TTL forward to `last_access_ms`; never
    /// backwards. Callers write it only when it moved by a good part of the TTL, so this is a
    /// rare command, not one per read.
    pub fn touch_stream(&self, id: u64, last_access_ms: i64) -> Reply<()> {
        self.touch_stream_fenced(id, last_access_ms, None)
    }

    /// [`MetaStore::touch_stream`], fenced (see [`MetaStore::close_stream_fenced`]).
    pub fn touch_stream_fenced(
        &self,
        id: u64,
        last_access_ms: i64,
        fence: Option<Fence>,
    ) -> Reply<()> {
        self.update_stream(id, StreamUpdate::RaiseLastAccess(last_access_ms), fence)
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

    /// [`MetaStore::commit_segment`] by a cluster node: the entries of streams that `fence.node`
    /// does not own (at the epoch `fence` lists for them, when it lists one) are left out, and
    /// their ids are the answer. The rows are share-locked while checked, so a takeover commits
    /// either before this (and these entries are left out) or after it (and sees them).
    pub fn commit_segment_fenced(
        &self,
        seg: SegmentRecord,
        fence: SegmentFence,
    ) -> Reply<Vec<u64>> {
        self.job(move |db| crate::fence::commit_fenced(db, seg, &fence))
    }

    /// Runs `job` on the metadata thread, in the transaction of the batch it lands in (in its
    /// own savepoint, like every command).
    pub(crate) fn job<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut dyn Backend) -> Result<T, MetaError> + Send + 'static,
    ) -> Reply<T> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Job(Box::new(JobWith { reply, job })));
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

/// Connects to the database of `url` and brings its schema up to date.
fn open_backend(url: &MetaUrl) -> Result<Box<dyn Backend>, MetaError> {
    Ok(match url {
        MetaUrl::SqliteMemory => Box::new(Sqlite::open_in_memory()?),
        MetaUrl::SqliteFile(path) => Box::new(Sqlite::open(path)?),
        MetaUrl::Postgres(_) => Box::new(Postgres::open(url)?),
    })
}

/// The startup snapshot, read in one read transaction so it is one consistent state even while
/// another node writes.
fn startup_snapshot(db: &mut dyn Backend) -> Result<Snapshot, MetaError> {
    db.begin_read()
        .map_err(|why| MetaError::Storage(format!("begin snapshot: {why}")))?;
    let snapshot = load_snapshot(db).and_then(|snapshot| {
        db.execute_batch(backend::COMMIT)
            .map_err(|why| MetaError::Storage(format!("end snapshot: {why}")))?;
        Ok(snapshot)
    });
    if snapshot.is_err() {
        db.rollback();
    }
    snapshot
}

/// The thread's loop: block for one command, drain what else is queued, apply as one batch.
fn run(mut db: Box<dyn Backend>, receiver: Receiver<Command>) {
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
        apply_batch(db.as_mut(), std::mem::take(&mut batch));
        if let Some(rest) = after_shutdown {
            // Commands that raced the shutdown: answered, never silently dropped.
            rest.into_iter().for_each(answer_closed);
            receiver.try_iter().for_each(answer_closed);
            break;
        }
    }
    log::debug!("{THREAD_NAME} thread stopped");
}

/// A [`Command::Job`]: runs, or is refused without running.
pub(crate) trait Job: Send {
    fn run(self: Box<Self>, db: &mut dyn Backend) -> Pending;
    fn refuse(self: Box<Self>, error: MetaError);
}

struct JobWith<T, F> {
    reply: oneshot::Sender<Result<T, MetaError>>,
    job: F,
}

impl<T, F> Job for JobWith<T, F>
where
    T: Send + 'static,
    F: FnOnce(&mut dyn Backend) -> Result<T, MetaError> + Send + 'static,
{
    fn run(self: Box<Self>, db: &mut dyn Backend) -> Pending {
        let JobWith { reply, job } = *self;
        pending(reply, job(db))
    }

    fn refuse(self: Box<Self>, error: MetaError) {
        let _ = self.reply.send(Err(error));
    }
}

/// A command whose result is decided but not yet sent (answers wait for the COMMIT).
pub(crate) struct Pending {
    ok: bool,
    /// Why the transaction did not commit, once known: a success computed inside it is not
    /// true any more.
    failed: Option<String>,
    send: Box<dyn FnOnce(Option<String>) + Send>,
}

/// The [`Pending`] answer `result` to `reply`.
pub(crate) fn pending<T: Send + 'static>(
    reply: oneshot::Sender<Result<T, MetaError>>,
    result: Result<T, MetaError>,
) -> Pending {
    Pending {
        ok: result.is_ok(),
        failed: None,
        send: Box::new(move |why| {
            let result = match why {
                Some(why) if result.is_ok() => failed(&why),
                _ => result,
            };
            // A caller that stopped waiting (dropped receiver) is fine.
            let _ = reply.send(result);
        }),
    }
}

impl Pending {
    fn is_ok(&self) -> bool {
        self.ok && self.failed.is_none()
    }

    fn fail(&mut self, why: &str) {
        if self.failed.is_none() {
            self.failed = Some(why.to_string());
        }
    }

    fn answer(self) {
        (self.send)(self.failed)
    }
}

/// Applies `batch` (no `Shutdown` in it) in one transaction and answers every command in order.
///
/// Each command runs inside its own savepoint, so one failing command (a bad segment record, a
/// constraint) is rolled back alone and the others still commit. Only a failure of the
/// transaction itself (BEGIN, COMMIT, an I/O error that made SQLite abandon the transaction, a
/// lost connection to Postgres) fails every command of the batch.
fn apply_batch(db: &mut dyn Backend, batch: Vec<Command>) {
    if batch.is_empty() {
        return;
    }
    let mut pending = Vec::with_capacity(batch.len());
    let outcome = apply_in_transaction(db, batch, &mut pending);
    if let Err(why) = outcome {
        db.rollback();
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
/// even on error, so every caller gets an answer; on error the transaction is still open (the
/// caller rolls it back).
fn apply_in_transaction(
    db: &mut dyn Backend,
    batch: Vec<Command>,
    pending: &mut Vec<Pending>,
) -> Result<(), String> {
    let mut commands = batch.into_iter();
    if let Err(error) = db.begin() {
        return abandon(pending, commands, format!("begin transaction: {error}"));
    }
    while let Some(command) = commands.next() {
        if let Err(error) = db.execute_batch(backend::SAVEPOINT) {
            let rest = std::iter::once(command).chain(commands);
            return abandon(pending, rest, format!("savepoint: {error}"));
        }
        let entry = apply_command(db, command);
        let settled = if entry.is_ok() {
            db.execute_batch(backend::RELEASE)
        } else {
            db.execute_batch(backend::ROLL_BACK_COMMAND)
        };
        pending.push(entry);
        if let Err(error) = settled {
            return abandon(pending, commands, format!("settle savepoint: {error}"));
        }
        // Some errors (SQLITE_FULL, SQLITE_IOERR, a lost connection) end the whole transaction;
        // then earlier commands are gone too and must not be reported as committed.
        if let Some(why) = db.transaction_lost() {
            return abandon(pending, commands, why);
        }
    }
    db.execute_batch(backend::COMMIT)
        .map_err(|error| format!("commit: {error}"))
}

/// Gives every command not yet applied the batch's error; returns that error for
/// [`apply_batch`] to fail the commands applied so far.
fn abandon(
    pending: &mut Vec<Pending>,
    commands: impl Iterator<Item = Command>,
    why: String,
) -> Result<(), String> {
    for command in commands {
        match command {
            Command::Create { reply, .. } => pending.push(self::pending(reply, failed(&why))),
            Command::Delete { reply, .. } => pending.push(self::pending(reply, failed(&why))),
            Command::Update { reply, .. }
            | Command::DropSegments { reply, .. }
            | Command::Commit { reply, .. } => pending.push(self::pending(reply, failed(&why))),
            Command::Garbage { reply, .. } => pending.push(self::pending(reply, failed(&why))),
            Command::Job(job) => job.refuse(MetaError::Storage(why.clone())),
            Command::Shutdown => unreachable!("run() splits the batch at Shutdown"),
        }
    }
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
        Command::Update { reply, .. }
        | Command::DropSegments { reply, .. }
        | Command::Commit { reply, .. } => reply.send(Err(MetaError::Closed)).map_err(drop),
        Command::Garbage { reply, .. } => reply.send(Err(MetaError::Closed)).map_err(drop),
        Command::Job(job) => {
            job.refuse(MetaError::Closed);
            Ok(())
        }
        Command::Shutdown => Ok(()),
    };
}

fn apply_command(db: &mut dyn Backend, command: Command) -> Pending {
    match command {
        Command::Create {
            name,
            config,
            fork,
            now_ms,
            owner,
            reply,
        } => pending(reply, create(db, name, config, fork, now_ms, owner)),
        Command::Delete { id, fence, reply } => pending(
            reply,
            crate::fence::check_fence(db, id, fence).and_then(|()| delete(db, id)),
        ),
        Command::Update {
            id,
            update: change,
            fence,
            reply,
        } => pending(
            reply,
            crate::fence::check_fence(db, id, fence).and_then(|()| update(db, id, change)),
        ),
        Command::Commit { segment, reply } => pending(reply, commit(db, &segment)),
        Command::Garbage {
            live,
            sealed_before_ms,
            reply,
        } => pending(
            reply,
            load_snapshot(db).map(|snapshot| garbage(&snapshot, &live, sealed_before_ms)),
        ),
        Command::DropSegments { keys, reply } => pending(reply, drop_segments(db, &keys)),
        Command::Job(job) => job.run(db),
        Command::Shutdown => unreachable!("run() splits the batch at Shutdown"),
    }
}

/// `value` as the signed 64-bit integer both databases store, or an error naming `what`.
/// A retention policy as its three columns (NULL: off).
fn retention_columns(retention: &Retention) -> Result<[Option<i64>; 3], MetaError> {
    let column = |value: Option<u64>, what: &'static str| {
        value.map(|v| storable(v, || what.to_string())).transpose()
    };
    Ok([
        column(retention.age_ms, "retention age")?,
        column(retention.bytes, "retention bytes")?,
        column(retention.delete_on_empty_ms, "delete-on-empty time")?,
    ])
}

fn create(
    db: &mut dyn Backend,
    name: String,
    config: StreamConfig,
    fork: Option<ForkRow>,
    now_ms: i64,
    owner: Option<NodeId>,
) -> Result<CreateOutcome, MetaError> {
    let existing = |columns: StreamColumns| {
        let ownership = crate::fence::ownership(&columns);
        Ok::<_, MetaError>(CreateOutcome {
            row: stream_row(columns)?,
            created: false,
            ownership,
        })
    };
    if let Some(columns) = db.find_stream(&name)? {
        return existing(columns);
    }
    let ttl_sec = match config.ttl_sec {
        Some(ttl) => Some(storable(ttl, || "ttl_sec".to_string())?),
        None => None,
    };
    let fork_columns = match &fork {
        None => (None, None, None, None),
        Some(f) => (
            Some(f.source.as_str()),
            Some(storable(f.source_id, || "fork source id".to_string())?),
            Some(storable(f.offset, || "fork offset".to_string())?),
            Some(storable(f.partial_bytes, || {
                "fork partial bytes".to_string()
            })?),
        ),
    };
    let new = NewStream {
        name: &name,
        content_type: &config.content_type,
        ttl_sec,
        expires_at_ms: config.expires_at_ms,
        closed: config.closed,
        created_ms: now_ms,
        fork_source: fork_columns.0,
        fork_source_id: fork_columns.1,
        fork_offset: fork_columns.2,
        fork_partial_bytes: fork_columns.3,
        owner_node: owner.map(i64::from),
        retention: retention_columns(&config.retention)?,
    };
    let Some(id) = db.insert_stream(&new)? else {
        // Registered since our look-up by someone else sharing the database (another node on
        // the same Postgres): theirs is the row, as if it had been there first.
        let columns = db.find_stream(&name)?.ok_or_else(|| {
            MetaError::Storage(format!("stream {name:?} was registered and is gone again"))
        })?;
        return existing(columns);
    };
    // Ids start at 1 and only grow (AUTOINCREMENT, an identity column), so they are positive.
    assert!(id > 0, "stream {name:?} got the non-positive id {id}");
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
    Ok(CreateOutcome {
        row,
        created: true,
        ownership: Ownership {
            node: owner,
            epoch: 1,
            transfer_to: None,
        },
    })
}

fn delete(db: &mut dyn Backend, id: u64) -> Result<bool, MetaError> {
    let Ok(id) = i64::try_from(id) else {
        return Ok(false); // no row can have an id above i64::MAX
    };
    db.delete_stream(id)
}

/// Close, soft delete, touch: idempotent, and an unknown id is `Ok`.
fn update(db: &mut dyn Backend, id: u64, update: StreamUpdate) -> Result<(), MetaError> {
    let Ok(id) = i64::try_from(id) else {
        return Ok(()); // unknown id
    };
    db.update_stream(id, update)
}

/// The segments of `snapshot` that no live stream needs (see [`MetaStore::garbage_segments`]).
pub(crate) fn garbage(
    snapshot: &Snapshot,
    live: &HashMap<u64, u64>,
    sealed_before_ms: i64,
) -> Vec<String> {
    // Every registered stream counts as live, also those this node does not hold (another
    // node's in a cluster): a node must never collect what another still serves.
    let mut live = live.clone();
    for row in &snapshot.streams {
        live.entry(row.id).or_insert(row.start_offset);
    }
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

fn drop_segments(db: &mut dyn Backend, keys: &[String]) -> Result<(), MetaError> {
    // The foreign key cascades to the segment's stream entries.
    keys.iter().try_for_each(|key| db.delete_segment(key))
}

/// Reads everything a node needs at startup: live streams, and every committed segment in
/// commit order with its entries in the order they were given.
pub(crate) fn load_snapshot(db: &mut dyn Backend) -> Result<Snapshot, MetaError> {
    let streams = db
        .streams()?
        .into_iter()
        .map(stream_row)
        .collect::<Result<Vec<_>, _>>()?;
    let mut segments = Vec::new();
    for columns in db.segments()? {
        let key = columns.key;
        let size_bytes = unsigned(Some(columns.size_bytes), || format!("segment {key}: size"))?;
        let segment = SegmentRecord {
            key,
            size_bytes,
            created_ms: columns.created_ms,
            streams: Vec::new(),
        };
        segments.push((columns.seq, segment));
    }
    // Both lists are sorted by seq, so one forward walk pairs every entry with its segment.
    // An entry of a segment not in the list belongs to a segment committed after the first
    // query: at startup both run in one read transaction, so it cannot happen there, but the
    // garbage collector's pass runs them in the batch's READ COMMITTED transaction while other
    // nodes commit (Postgres). Such a segment is left for the next pass: a segment in the list
    // has all its entries (they commit with it), so nothing is taken for garbage too early.
    let mut cursor = 0;
    db.for_each_entry(&mut |seq, columns| {
        while cursor < segments.len() && segments[cursor].0 < seq {
            cursor += 1;
        }
        if cursor == segments.len() || segments[cursor].0 != seq {
            return Ok(());
        }
        let segment = &mut segments[cursor].1;
        let entry = segment_entry(&segment.key, columns)?;
        segment.streams.push(entry);
        Ok(())
    })?;
    let segments = segments.into_iter().map(|(_, segment)| segment).collect();
    Ok(Snapshot { streams, segments })
}
