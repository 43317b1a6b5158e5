//! The metadata thread itself: open the database, load the startup snapshot, then loop: block
//! for one command, drain what else is queued (at most [`MAX_BATCH_COMMANDS`]), apply them as
//! one transaction with a savepoint per command, answer them in order.

use crossbeam_channel::Receiver;

use crate::apply::{apply_command, load_snapshot};
use crate::backend;
use crate::backend::Backend;
use crate::command::{answer_closed, failed, pending, Command, Pending};
use crate::limits::MAX_BATCH_COMMANDS;
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
pub(crate) fn run(mut db: Box<dyn Backend>, receiver: Receiver<Command>) {
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
