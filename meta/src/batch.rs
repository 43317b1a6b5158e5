//! The metadata thread itself: open the database, load the startup snapshot, then loop: block
//! for one command, drain what else is queued (at most [`MAX_BATCH_COMMANDS`]), apply them as
//! one transaction with a savepoint per command (per group of consecutive creates, which share
//! their statements), answer them in order.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::Receiver;

use crate::apply::{apply_command, load_snapshot, name_group, CreateArgs};
use crate::backend;
use crate::backend::{Backend, CommitOutcome};
use crate::command::{answer_closed, failed, pending, Command, Pending};
use crate::fence::Ownership;
use crate::limits::{BATCH_FAILURE_LOG_INTERVAL_MS, MAX_BATCH_COMMANDS, MAX_CREATES_PER_GROUP};
use crate::log_limit::LogLimit;
use crate::pg::Postgres;
use crate::sqlite::Sqlite;
use crate::CreateOutcome;
use crate::MetaError;
use crate::MetaUrl;
use crate::Snapshot;
use crate::StreamRow;

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
    db.begin_read().map_err(|why| why.doing("begin snapshot"))?;
    let snapshot = load_snapshot(db).and_then(|snapshot| {
        db.execute_batch(backend::COMMIT)
            .map_err(|why| why.doing("end snapshot"))?;
        Ok(snapshot)
    });
    if snapshot.is_err() {
        db.rollback();
    }
    snapshot
}

/// The thread's loop: block for one command, drain what else is queued, apply as one batch.
/// A snapshot is read in a read transaction of its own, after the commands before it; a
/// shutdown answers the commands after it as closed and ends the loop.
/// `committed` counts the transactions that committed (see `MetaStore::transactions_committed`).
pub(crate) fn run(mut db: Box<dyn Backend>, receiver: Receiver<Command>, committed: &AtomicU64) {
    let mut batch = Vec::with_capacity(MAX_BATCH_COMMANDS);
    let failure_log = LogLimit::new(BATCH_FAILURE_LOG_INTERVAL_MS);
    // `recv` fails only when every handle is gone and the queue is empty: nothing left to do.
    'commands: while let Ok(first) = receiver.recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH_COMMANDS {
            match receiver.try_recv() {
                Ok(command) => batch.push(command),
                Err(_) => break,
            }
        }
        loop {
            let stop_at = batch.iter().position(|command| {
                matches!(command, Command::Snapshot { .. } | Command::Shutdown)
            });
            let after = stop_at.map_or_else(Vec::new, |at| batch.split_off(at));
            if apply_batch(db.as_mut(), std::mem::take(&mut batch), &failure_log) {
                committed.fetch_add(1, Ordering::Relaxed);
                db.committed();
            }
            let mut after = after.into_iter();
            match after.next() {
                None => break,
                Some(Command::Snapshot { reply }) => {
                    let _ = reply.send(startup_snapshot(db.as_mut()));
                    batch.extend(after);
                }
                Some(_shutdown) => {
                    // Commands that raced the shutdown: answered, never silently dropped.
                    after.for_each(answer_closed);
                    receiver.try_iter().for_each(answer_closed);
                    break 'commands;
                }
            }
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
fn apply_batch(db: &mut dyn Backend, batch: Vec<Command>, failure_log: &LogLimit) -> bool {
    if batch.is_empty() {
        return false;
    }
    let mut pending = Vec::with_capacity(batch.len());
    let outcome = apply_in_transaction(db, batch, &mut pending).and_then(|()| {
        let Err(error) = db.execute_batch(backend::COMMIT) else {
            return Ok(());
        };
        // The COMMIT may have reached the server and committed, its answer lost: the answers
        // are true or false depending on which, so the server is asked.
        match db.resolve_commit() {
            CommitOutcome::Committed => {
                log::warn!(
                    "metadata batch of {} commands: the answer to COMMIT was lost ({error}), \
                     but the transaction committed",
                    pending.len()
                );
                Ok(())
            }
            CommitOutcome::Failed => Err(error.doing("commit")),
            CommitOutcome::Unknown(why) => {
                let why = MetaError::Unknown(format!(
                    "commit: {}; whether it committed is unknown: {why}",
                    error.detail()
                ));
                log::error!("metadata batch of {} commands: {why}", pending.len());
                Err(why)
            }
        }
    });
    if let Err(why) = &outcome {
        db.rollback();
        if let Some(unlogged) = failure_log.due(std::time::Instant::now()) {
            log::error!(
                "metadata batch of {} commands failed ({unlogged} more failed batches or \
                 commands since the last line): {why}",
                pending.len()
            );
        }
        pending.iter_mut().for_each(|entry| entry.fail(why));
    } else {
        let failed = pending.iter().filter(|entry| !entry.is_ok()).count();
        if failed > 0 {
            if let Some(unlogged) = failure_log.due(std::time::Instant::now()) {
                log::warn!(
                    "{failed} of {} metadata commands failed ({unlogged} more failed batches \
                     or commands since the last line)",
                    pending.len()
                );
            }
        }
    }
    pending.into_iter().for_each(Pending::answer);
    outcome.is_ok()
}

/// The transactional part of [`apply_batch`] up to its COMMIT. Every command of `batch` ends
/// up in `pending`, even on error, so every caller gets an answer; on error the transaction is
/// still open (the caller rolls it back).
fn apply_in_transaction(
    db: &mut dyn Backend,
    batch: Vec<Command>,
    pending: &mut Vec<Pending>,
) -> Result<(), MetaError> {
    let mut commands = batch.into_iter().peekable();
    if let Err(error) = db.begin() {
        return abandon(pending, commands, error.doing("begin transaction"));
    }
    while let Some(command) = commands.next() {
        let command = match command {
            Command::Create { .. } | Command::Lookup { .. } => {
                let group = take_group(command, &mut commands);
                apply_group(db, group, pending)?;
                if let Some(why) = db.transaction_lost() {
                    return abandon(pending, commands, why);
                }
                continue;
            }
            command => command,
        };
        if let Err(error) = db.execute_batch(backend::SAVEPOINT) {
            let rest = std::iter::once(command).chain(commands);
            return abandon(pending, rest, error.doing("savepoint"));
        }
        let entry = apply_command(db, command);
        let settled = if entry.is_ok() {
            db.execute_batch(backend::RELEASE)
        } else {
            db.execute_batch(backend::ROLL_BACK_COMMAND)
        };
        pending.push(entry);
        if let Err(error) = settled {
            return abandon(pending, commands, error.doing("settle savepoint"));
        }
        // Some errors (SQLITE_FULL, SQLITE_IOERR, a lost connection) end the whole transaction;
        // then earlier commands are gone too and must not be reported as committed.
        if let Some(why) = db.transaction_lost() {
            return abandon(pending, commands, why);
        }
    }
    Ok(())
}

type LookupReply =
    futures_channel::oneshot::Sender<Result<Option<(StreamRow, Ownership)>, MetaError>>;
type CreateReply = futures_channel::oneshot::Sender<Result<CreateOutcome, MetaError>>;

/// Consecutive creates and look-ups of a batch, taken apart for [`name_group`]; `order` says
/// which came when (`true`: a create), so the answers keep the batch's order.
#[derive(Default)]
struct Group {
    creates: Vec<CreateArgs>,
    create_replies: Vec<CreateReply>,
    lookups: Vec<String>,
    lookup_replies: Vec<LookupReply>,
    order: Vec<bool>,
}

/// `first` (a create or a look-up) and the creates and look-ups right after it in `commands`,
/// up to [`MAX_CREATES_PER_GROUP`] and not past a name already in the group: a repeated name
/// waits for the next group, so it sees the first one's row exactly as it would have
/// sequentially. (In a cluster every create follows its own look-up, and 64 clients' requests
/// interleave them: grouping only one kind would split the batch into groups of one.)
fn take_group(
    first: Command,
    commands: &mut std::iter::Peekable<impl Iterator<Item = Command>>,
) -> Group {
    let mut group = Group::default();
    let mut names = HashSet::new();
    let mut next = Some(first);
    while let Some(command) = next.take() {
        match command {
            Command::Create {
                name,
                config,
                closed,
                fork,
                now_ms,
                owner,
                reply,
            } => {
                names.insert(name.clone());
                group.creates.push(CreateArgs {
                    name,
                    config,
                    closed,
                    fork,
                    now_ms,
                    owner,
                });
                group.create_replies.push(reply);
                group.order.push(true);
            }
            Command::Lookup { name, reply } => {
                names.insert(name.clone());
                group.lookups.push(name);
                group.lookup_replies.push(reply);
                group.order.push(false);
            }
            _ => unreachable!("only creates and look-ups are taken into a group"),
        }
        if group.order.len() == MAX_CREATES_PER_GROUP {
            break;
        }
        let joins = matches!(
            commands.peek(),
            Some(Command::Create { name, .. } | Command::Lookup { name, .. })
                if !names.contains(name)
        );
        if joins {
            next = commands.next();
        }
    }
    group
}

/// Applies a group in one savepoint: every command gets its answer in `pending`, in the
/// group's order. A failed statement rolls the group back and fails each of its commands;
/// `Err` only when the savepoint itself failed (the transaction is then unusable, the caller
/// abandons it).
fn apply_group(
    db: &mut dyn Backend,
    group: Group,
    pending: &mut Vec<Pending>,
) -> Result<(), MetaError> {
    let Group {
        creates,
        create_replies,
        lookups,
        lookup_replies,
        order,
    } = group;
    let count = order.len();
    let begun = db.execute_batch(backend::SAVEPOINT);
    let (answers, settled) = match &begun {
        Err(error) => {
            let why = error.clone().doing("savepoint");
            let creates = creates.iter().map(|_| failed(&why)).collect();
            let lookups = lookups.iter().map(|_| failed(&why)).collect();
            ((creates, lookups), Err(why))
        }
        Ok(()) => match name_group(db, creates, &lookups) {
            Ok(answers) => (answers, db.execute_batch(backend::RELEASE)),
            Err(error) => {
                log::warn!("a group of {count} creates and look-ups failed: {error}");
                let why = error;
                let creates = create_replies.iter().map(|_| failed(&why)).collect();
                let lookups = lookups.iter().map(|_| failed(&why)).collect();
                (
                    (creates, lookups),
                    db.execute_batch(backend::ROLL_BACK_COMMAND),
                )
            }
        },
    };
    let (create_answers, lookup_answers): (Vec<_>, Vec<_>) = answers;
    let mut creates = create_replies.into_iter().zip(create_answers);
    let mut lookups = lookup_replies.into_iter().zip(lookup_answers);
    for is_create in order {
        let entry = if is_create {
            creates
                .next()
                .map(|(reply, answer)| self::pending(reply, answer))
        } else {
            lookups
                .next()
                .map(|(reply, answer)| self::pending(reply, answer))
        };
        pending.extend(entry);
    }
    if begun.is_err() {
        return settled.map(drop);
    }
    settled.map_err(|error| error.doing("settle savepoint"))
}

/// Gives every command not yet applied the batch's error; returns that error for
/// [`apply_batch`] to fail the commands applied so far.
fn abandon(
    pending: &mut Vec<Pending>,
    commands: impl Iterator<Item = Command>,
    why: MetaError,
) -> Result<(), MetaError> {
    for command in commands {
        match command {
            Command::Create { reply, .. } => pending.push(self::pending(reply, failed(&why))),
            Command::Lookup { reply, .. } => pending.push(self::pending(reply, failed(&why))),
            Command::Delete { reply, .. } => pending.push(self::pending(reply, failed(&why))),
            Command::Update { reply, .. }
            | Command::DropSegments { reply, .. }
            | Command::Commit { reply, .. } => pending.push(self::pending(reply, failed(&why))),
            Command::Garbage { reply, .. } => pending.push(self::pending(reply, failed(&why))),
            Command::Job(job) => job.refuse(why.clone()),
            Command::Snapshot { .. } | Command::Shutdown => {
                unreachable!("run() splits the batch at Snapshot and Shutdown")
            }
        }
    }
    Err(why)
}
