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
//! `Backend` (`sqlite.rs`, `pg/`).
//!
//! This file is the handle; the thread's loop is in `batch.rs`, the commands in `command.rs`,
//! what each one does in `apply.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::sync::Mutex;
use std::thread::JoinHandle;

use crossbeam_channel::Sender;
use futures_channel::oneshot;

use crate::apply::retention_columns;
use crate::backend::Backend;
use crate::backend::NodeId;
use crate::backend::StreamUpdate;
use crate::batch::{open_backend, run, startup_snapshot, THREAD_NAME};
use crate::command::{answer_closed, Command, JobWith};
use crate::fence::{Fence, SegmentFence};
use crate::CreateOutcome;
use crate::ForkRow;
use crate::MetaError;
use crate::MetaUrl;
use crate::Reply;
use crate::Retention;
use crate::SegmentRecord;
use crate::Snapshot;
use crate::StreamConfig;
use crate::StreamRow;

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
    /// Transactions the thread committed, for [`MetaStore::transactions_committed`].
    committed: Arc<AtomicU64>,
    /// Taken by the first shutdown, so later ones (and `Drop`) do not join twice.
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl MetaStore {
    /// Opens (creating if needed) the metadata log, migrates it, loads the startup [`Snapshot`]
    /// and starts the `pico-meta` thread.
    ///
    /// Blocking (SQLite I/O, or connecting to Postgres): call it at startup, before the
    /// executors run, not from one. The connection is made on the metadata thread itself, which
    /// owns it from then on.
    pub fn open(url: &MetaUrl) -> Result<(MetaStore, Snapshot), MetaError> {
        let (store, snapshot) = MetaStore::start(url, true)?;
        let snapshot = snapshot.ok_or_else(|| {
            MetaError::Storage("the metadata thread loaded no snapshot".to_string())
        })?;
        Ok((store, snapshot))
    }

    /// [`MetaStore::open`] without the snapshot: a cluster node reads it with
    /// [`MetaStore::load_snapshot`] once it has registered, so that nothing an earlier
    /// incarnation of it commits can be missing from it (registering fences that incarnation).
    pub fn open_unloaded(url: &MetaUrl) -> Result<MetaStore, MetaError> {
        MetaStore::start(url, false).map(|(store, _)| store)
    }

    /// The whole catalog as one [`Snapshot`], read in a read transaction of its own once every
    /// command queued before this call is answered. Reads every stream and segment: for a
    /// node's start, not for serving.
    pub fn load_snapshot(&self) -> Reply<Snapshot> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Snapshot { reply });
        answer
    }

    /// Opens the metadata log (see [`MetaStore::open`]), with the startup snapshot when `load`.
    fn start(url: &MetaUrl, load: bool) -> Result<(MetaStore, Option<Snapshot>), MetaError> {
        let url = url.clone();
        let (ready, started) = mpsc::sync_channel(1);
        let (commands, receiver) = crossbeam_channel::unbounded();
        let committed = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&committed);
        let thread = std::thread::Builder::new()
            .name(THREAD_NAME.to_string())
            .spawn(move || {
                let opened = open_backend(&url).and_then(|mut db| {
                    let snapshot = if load {
                        Some(startup_snapshot(db.as_mut())?)
                    } else {
                        None
                    };
                    Ok((db, snapshot))
                });
                match opened {
                    Ok((db, snapshot)) => {
                        // `open` waits for this answer, so the send cannot fail.
                        let _ = ready.send(Ok(snapshot));
                        run(db, receiver, &counter);
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
            committed,
            thread: Mutex::new(Some(thread)),
        };
        Ok((
            MetaStore {
                inner: Arc::new(inner),
            },
            snapshot,
        ))
    }

    /// Registers `name`, open, unless a live stream already has it.
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
        self.create_stream_owned(name, config, false, fork, now_ms, None)
    }

    /// [`MetaStore::create_fork_stream`] of a stream `closed` or not, in a cluster: a new row is
    /// owned by `owner` at epoch 1; the outcome tells who owns the row that holds the name.
    pub fn create_stream_owned(
        &self,
        name: &str,
        config: StreamConfig,
        closed: bool,
        fork: Option<ForkRow>,
        now_ms: i64,
        owner: Option<NodeId>,
    ) -> Reply<CreateOutcome> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Create {
            name: name.to_string(),
            config,
            closed,
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

    /// Keys of committed segments that no stream needs: every stream they hold is gone (has no
    /// row), or was trimmed (as the catalog records it) past all of its records there and left
    /// no producer state or close marker in it. Only segments sealed before `sealed_before_ms`
    /// are considered, so one still being read back by the node that wrote it is left alone.
    /// The pass reads the segments and the streams they name, not the whole stream table.
    pub fn garbage_segments(&self, sealed_before_ms: i64) -> Reply<Vec<String>> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Garbage {
            sealed_before_ms,
            reply,
        });
        answer
    }

    /// How many segments the catalog lists and their bytes: the objects it keeps in the
    /// bucket (those garbage collection has not deleted yet included). One aggregate query.
    pub fn catalog_usage(&self) -> Reply<crate::CatalogUsage> {
        self.job(|db| {
            let (segments, bytes) = db.segment_totals()?;
            let count = |value: i64, what: &str| {
                u64::try_from(value).map_err(|_| {
                    MetaError::Storage(format!("the catalog's {what} is negative: {value}"))
                })
            };
            Ok(crate::CatalogUsage {
                segments: count(segments, "segment count")?,
                bytes: count(bytes, "segment byte sum")?,
            })
        })
    }

    /// The objects `pico admin verify` reads: every catalog object a stream still reads (what
    /// [`MetaStore::garbage_segments`] would not collect) and every quarantined object, each
    /// with the runs readers reach in it; with `only`, that key's (empty once nothing needs
    /// it). Reads the segments and the streams they name, like a collection pass.
    pub fn stored_objects(&self, only: Option<String>) -> Reply<Vec<crate::StoredObject>> {
        self.job(move |db| crate::verify::stored_objects(db, only.as_deref()))
    }

    /// The names of the streams of `ids` that have a row, by id (for reports).
    pub fn stream_names(&self, ids: Vec<u64>) -> Reply<Vec<(u64, String)>> {
        self.job(move |db| {
            let ids: Vec<i64> = ids
                .iter()
                .filter_map(|&id| i64::try_from(id).ok())
                .collect();
            Ok(db
                .stream_names(&ids)?
                .into_iter()
                .map(|(id, name)| (id as u64, name))
                .collect())
        })
    }

    /// Every quarantined entry, oldest first.
    pub fn quarantined(&self) -> Reply<Vec<crate::Quarantined>> {
        self.job(|db| {
            db.quarantined()?
                .into_iter()
                .map(|(segment_key, stream_id, runs, reason, created_ms)| {
                    let runs = crate::runs::decode(&runs).ok_or_else(|| {
                        MetaError::Storage(format!(
                            "quarantine entry {segment_key} / {stream_id}: bad runs"
                        ))
                    })?;
                    Ok(crate::Quarantined {
                        stream_id: u64::try_from(stream_id).unwrap_or_default(),
                        segment_key,
                        runs,
                        reason,
                        created_ms,
                    })
                })
                .collect()
        })
    }

    /// Drops a quarantined entry (the operator has what they need); its segment is garbage
    /// again once nothing else holds it. Whether there was one.
    pub fn release_quarantined(&self, key: &str, stream_id: u64) -> Reply<bool> {
        let key = key.to_string();
        self.job(move |db| {
            let id = i64::try_from(stream_id)
                .map_err(|_| MetaError::NotFound(format!("no stream id {stream_id}")))?;
            db.release_quarantined(&key, id)
        })
    }

    /// Which of `keys` the catalog has committed segments of, read now (not from a snapshot).
    pub fn committed_segments(&self, keys: Vec<String>) -> Reply<Vec<String>> {
        self.job(move |db| {
            let mut found = Vec::new();
            for key in keys {
                if db.segment_exists(&key)? {
                    found.push(key);
                }
            }
            Ok(found)
        })
    }

    /// Forgets these segments (their objects must be deleted first: a row without its object
    /// is harmless garbage found again next time, an object without its row would leak).
    pub fn drop_segments(&self, keys: Vec<String>) -> Reply<()> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::DropSegments { keys, reply });
        answer
    }

    /// Swaps consecutive committed segments of one writer for one entry under the first one's
    /// key, whose object must already hold all their bytes in order (`compact.rs` says why
    /// under that key, and what is checked); the others stay as rows without entries until
    /// the garbage collector deletes their objects after `retire_at_ms`. Idempotent: a repeat
    /// after a lost answer answers [`crate::CompactOutcome::AlreadySwapped`].
    pub fn compact_segments(&self, request: crate::CompactRequest) -> Reply<crate::CompactOutcome> {
        self.job(move |db| crate::compact::compact(db, &request))
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

    /// Queues a [`Command::Lookup`] (`MetaStore::lookup_stream`, in `cluster.rs`).
    pub(crate) fn lookup(
        &self,
        name: String,
    ) -> Reply<Option<(StreamRow, crate::fence::Ownership)>> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Lookup { name, reply });
        answer
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

    /// How many batch transactions committed since [`MetaStore::open`]: with commands that
    /// arrive together (concurrent creates), far fewer than commands.
    pub fn transactions_committed(&self) -> u64 {
        self.inner.committed.load(Ordering::Relaxed)
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
