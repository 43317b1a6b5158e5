//! The metadata thread itself: open the database, load the startup snapshot, then loop: block
//! for one command, drain what else is queued (at most [`MAX_BATCH_COMMANDS`]), apply them as
//! one transaction with a savepoint per command (per group of consecutive creates, which share
//! their statements), answer them in order.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::Receiver;

use crate::apply::{apply_command, create_group, load_snapshot, lookup_group, CreateArgs};
use crate::fence::Ownership;
use crate::StreamRow;
use crate::backend;
use crate::backend::Backend;
use crate::command::{answer_closed, failed, pending, Command, Pending};
use crate::limits::{MAX_BATCH_COMMANDS, MAX_CREATES_PER_GROUP};
use crate::CreateOutcome;
use crate::pg::Postgres;
use crate::sqlite::Sqlite;
use crate::MetaError;
use crate::MetaUrl;
use crate::Snapshot;

/// The name of the metadata thread, as seen in `top -H` and panics.
pub(crate) const THREAD_NAME: &str = "pico-meta";

/// Connects to the database of `url` and brings its schema up to date.
pub(crate) fn open_backend(url: &MetaUrl) -> Result<Box<dyn Backend>, MetaError> {
    Ok(match url {
        MetaUrl::SqliteMemory => Box::new(Sqlite::open_in_memory()?),
        MetaUrl::SqliteFile(path) => Box::new(Sqlite::open(path)?),
        MetaUrl::Postgres(_) => Box::new(Postgres::open(url)?),
    })
}

/// The startup snapshot, read in one read transaction so it is one consistent state even while
/// another node writes.
pub(crate) fn startup_snapshot(db: &mut dyn Backend) -> Result<Snapshot, MetaError> {
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
/// `committed` counts the transactions that committed (see `MetaStore::transactions_committed`).
pub(crate) fn run(mut db: Box<dyn Backend>, receiver: Receiver<Command>, committed: &AtomicU64) {
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
        if apply_batch(db.as_mut(), std::mem::take(&mut batch)) {
            committed.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(rest) = after_shutdown {
            // Commands that raced the shutdown: answered, never silently dropped.
            rest.into_iter().for_each(answer_closed);
            receiver.try_iter().for_each(answer_closed);
            break;
        }
    }
    log::debug!("{THREAD_NAME} thread stopped");
}

/// Applies `batch` (no `Shutdown` in it) in one transaction and answers every command in order;
/// whether a transaction committed.
///
/// Each command runs inside its own savepoint, so one failing command (a bad segment record, a
/// constraint) is rolled back alone and the others still commit. Only a failure of the
/// transaction itself (BEGIN, COMMIT, an I/O error that made SQLite abandon the transaction, a
/// lost connection to Postgres) fails every command of the batch.
fn apply_batch(db: &mut dyn Backend, batch: Vec<Command>) -> bool {
    if batch.is_empty() {
        return false;
    }
    let mut pending = Vec::with_capacity(batch.len());
    let outcome = apply_in_transaction(db, batch, &mut pending);
    if let Err(why) = &outcome {
        db.rollback();
        log::error!("metadata batch of {} commands failed: {why}", pending.len());
        pending.iter_mut().for_each(|entry| entry.fail(&why));
    }
    let failed = pending.iter().filter(|entry| !entry.is_ok()).count();
    if failed > 0 {
        log::warn!("{failed} of {} metadata commands failed", pending.len());
    }
    pending.into_iter().for_each(Pending::answer);
    outcome.is_ok()
}

/// The transactional part of [`apply_batch`]. Every command of `batch` ends up in `pending`,
/// even on error, so every caller gets an answer; on error the transaction is still open (the
/// caller rolls it back).
fn apply_in_transaction(
    db: &mut dyn Backend,
    batch: Vec<Command>,
    pending: &mut Vec<Pending>,
) -> Result<(), String> {
    let mut commands = batch.into_iter().peekable();
    if let Err(error) = db.begin() {
        return abandon(pending, commands, format!("begin transaction: {error}"));
    }
    while let Some(command) = commands.next() {
        let command = match command {
            Command::Create { .. } => {
                let group = take_creates(command, &mut commands);
                apply_creates(db, group, pending)?;
                if let Some(why) = db.transaction_lost() {
                    return abandon(pending, commands, why);
                }
                continue;
            }
            Command::Lookup { name, reply } => {
                let mut group = vec![(name, reply)];
                while group.len() < MAX_CREATES_PER_GROUP
                    && matches!(commands.peek(), Some(Command::Lookup { .. }))
                {
                    if let Some(Command::Lookup { name, reply }) = commands.next() {
                        group.push((name, reply));
                    }
                }
                apply_lookups(db, group, pending)?;
                if let Some(why) = db.transaction_lost() {
                    return abandon(pending, commands, why);
                }
                continue;
            }
            command => command,
        };
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

/// A create and its reply, taken apart for [`create_group`].
type CreateWithReply = (
    CreateArgs,
    futures_channel::oneshot::Sender<Result<CreateOutcome, MetaError>>,
);

/// `first` (a create) and the creates right after it in `commands`, up to
/// [`MAX_CREATES_PER_GROUP`] and not past a name already in the group: a repeated name waits
/// for the next group, so it finds the first one's row exactly as a sequential create would.
fn take_creates(
    first: Command,
    commands: &mut std::iter::Peekable<impl Iterator<Item = Command>>,
) -> Vec<CreateWithReply> {
    let mut group = Vec::new();
    let mut names = HashSet::new();
    let mut next = Some(first);
    while let Some(Command::Create {
        name,
        config,
        fork,
        now_ms,
        owner,
        reply,
    }) = next.take()
    {
        names.insert(name.clone());
        let args = CreateArgs {
            name,
            config,
            fork,
            now_ms,
            owner,
        };
        group.push((args, reply));
        if group.len() == MAX_CREATES_PER_GROUP {
            break;
        }
        let joins = matches!(
            commands.peek(),
            Some(Command::Create { name, .. }) if !names.contains(name)
        );
        if joins {
            next = commands.next();
        }
    }
    group
}

/// Applies a group of creates in one savepoint: every create gets its answer in `pending`. A
/// failed statement rolls the group back and fails each of its creates; `Err` only when the
/// savepoint itself failed (the transaction is then unusable, the caller abandons it).
fn apply_creates(
    db: &mut dyn Backend,
    group: Vec<CreateWithReply>,
    pending: &mut Vec<Pending>,
) -> Result<(), String> {
    let (creates, replies): (Vec<_>, Vec<_>) = group.into_iter().unzip();
    if let Err(error) = db.execute_batch(backend::SAVEPOINT) {
        let why = format!("savepoint: {error}");
        pending.extend(replies.into_iter().map(|reply| self::pending(reply, failed(&why))));
        return Err(why);
    }
    let count = creates.len();
    let (answers, settled) = match create_group(db, creates) {
        Ok(answers) => (answers, db.execute_batch(backend::RELEASE)),
        Err(error) => {
            log::warn!("a group of {count} creates failed: {error}");
            let why = error.to_string();
            let answers = (0..count).map(|_| failed(&why)).collect();
            (answers, db.execute_batch(backend::ROLL_BACK_COMMAND))
        }
    };
    pending.extend(
        replies
            .into_iter()
            .zip(answers)
            .map(|(reply, answer)| self::pending(reply, answer)),
    );
    settled.map_err(|error| format!("settle savepoint: {error}"))
}

/// A look-up and its reply, for [`lookup_group`].
type LookupWithReply = (
    String,
    futures_channel::oneshot::Sender<Result<Option<(StreamRow, Ownership)>, MetaError>>,
);

/// Answers a group of look-ups with one statement, in a savepoint (a failed statement must not
/// end the batch's transaction); `Err` as [`apply_creates`].
fn apply_lookups(
    db: &mut dyn Backend,
    group: Vec<LookupWithReply>,
    pending: &mut Vec<Pending>,
) -> Result<(), String> {
    let (names, replies): (Vec<_>, Vec<_>) = group.into_iter().unzip();
    if let Err(error) = db.execute_batch(backend::SAVEPOINT) {
        let why = format!("savepoint: {error}");
        pending.extend(replies.into_iter().map(|reply| self::pending(reply, failed(&why))));
        return Err(why);
    }
    let (answers, settled) = match lookup_group(db, &names) {
        Ok(answers) => (answers, db.execute_batch(backend::RELEASE)),
        Err(error) => {
            let answer = || match &error {
                MetaError::Unsupported(why) => Err(MetaError::Unsupported(why.clone())),
                error => failed(&error.to_string()),
            };
            let answers = names.iter().map(|_| answer()).collect();
            (answers, db.execute_batch(backend::ROLL_BACK_COMMAND))
        }
    };
    pending.extend(
        replies
            .into_iter()
            .zip(answers)
            .map(|(reply, answer)| self::pending(reply, answer)),
    );
    settled.map_err(|error| format!("settle savepoint: {error}"))
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
            Command::Lookup { reply, .. } => pending.push(self::pending(reply, failed(&why))),
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
