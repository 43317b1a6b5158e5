//! The requests the metadata thread serves ([`Command`]) and how each is answered: a
//! [`Pending`] answer waits for its batch's COMMIT, a command that will never run is answered
//! [`MetaError::Closed`].

use futures_channel::oneshot;

use crate::backend::Backend;
use crate::backend::NodeId;
use crate::backend::StreamUpdate;
use crate::fence::Fence;
use crate::fence::Ownership;
use crate::CreateOutcome;
use crate::ForkRow;
use crate::MetaError;
use crate::SegmentRecord;
use crate::Snapshot;
use crate::StreamConfig;
use crate::StreamRow;

/// A request to the metadata thread, with the one-shot its answer goes to.
pub(crate) enum Command {
    Create {
        name: String,
        config: StreamConfig,
        closed: bool,
        fork: Option<ForkRow>,
        now_ms: i64,
        owner: Option<NodeId>,
        reply: oneshot::Sender<Result<CreateOutcome, MetaError>>,
    },
    /// A cluster's look-up of the row named `name` and its owner (`MetaStore::lookup_stream`):
    /// consecutive ones share one statement, like creates.
    Lookup {
        name: String,
        reply: oneshot::Sender<Result<Option<(StreamRow, Ownership)>, MetaError>>,
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
    /// A [`Snapshot`] of the whole catalog, read in a read transaction of its own after the
    /// commands queued before this one (`MetaStore::load_snapshot`).
    Snapshot {
        reply: oneshot::Sender<Result<Snapshot, MetaError>>,
    },
    /// Stop after the commands queued before this one.
    Shutdown,
}

/// A [`Command::Job`]: runs, or is refused without running.
pub(crate) trait Job: Send {
    fn run(self: Box<Self>, db: &mut dyn Backend) -> Pending;
    fn refuse(self: Box<Self>, error: MetaError);
}

pub(crate) struct JobWith<T, F> {
    pub(crate) reply: oneshot::Sender<Result<T, MetaError>>,
    pub(crate) job: F,
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
    /// true any more, and is answered with this instead ([`MetaError::Unknown`] when whether
    /// it committed is not known). An error computed inside the transaction is still the
    /// command's own, and is kept: its savepoint is gone either way.
    failed: Option<MetaError>,
    send: Box<dyn FnOnce(Option<MetaError>) + Send>,
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
                Some(why) if result.is_ok() => Err(why),
                _ => result,
            };
            // A caller that stopped waiting (dropped receiver) is fine.
            let _ = reply.send(result);
        }),
    }
}

impl Pending {
    pub(crate) fn is_ok(&self) -> bool {
        self.ok && self.failed.is_none()
    }

    pub(crate) fn fail(&mut self, why: &MetaError) {
        if self.failed.is_none() {
            self.failed = Some(why.clone());
        }
    }

    pub(crate) fn answer(self) {
        (self.send)(self.failed)
    }
}

pub(crate) fn failed<T>(why: &MetaError) -> Result<T, MetaError> {
    Err(why.clone())
}

/// Answers a command that will never run, because the thread is stopping or gone.
pub(crate) fn answer_closed(command: Command) {
    let _ = match command {
        Command::Create { reply, .. } => reply.send(Err(MetaError::Closed)).map_err(drop),
        Command::Lookup { reply, .. } => reply.send(Err(MetaError::Closed)).map_err(drop),
        Command::Delete { reply, .. } => reply.send(Err(MetaError::Closed)).map_err(drop),
        Command::Update { reply, .. }
        | Command::DropSegments { reply, .. }
        | Command::Commit { reply, .. } => reply.send(Err(MetaError::Closed)).map_err(drop),
        Command::Garbage { reply, .. } => reply.send(Err(MetaError::Closed)).map_err(drop),
        Command::Job(job) => {
            job.refuse(MetaError::Closed);
            Ok(())
        }
        Command::Snapshot { reply } => reply.send(Err(MetaError::Closed)).map_err(drop),
        Command::Shutdown => Ok(()),
    };
}
