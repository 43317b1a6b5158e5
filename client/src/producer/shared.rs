//! What the producer handle and its session task share: the poison and the buffer budget,
//! the commands the handle sends, and a record on its way with the waiter of its offset.

use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::codec::NewRecord;
use crate::error::ClientError;

pub(super) fn stopped() -> ClientError {
    ClientError::Stopped("the producer session stopped (its runtime shut down)".into())
}

pub(super) fn closed() -> ClientError {
    ClientError::Stopped("the producer session is closed".into())
}

/// State shared by the handle and the session task.
pub(super) struct Shared {
    /// The error that poisoned the session, once set never cleared.
    pub(super) poison: Mutex<Option<ClientError>>,
    /// Permits = bytes of the buffer budget.
    pub(super) budget: Arc<Semaphore>,
}

impl Shared {
    pub(super) fn poisoned(&self) -> Option<ClientError> {
        self.poison
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

pub(super) enum Command {
    Send(Item),
    Flush(oneshot::Sender<Result<(), ClientError>>),
}

/// A record handed over, with what must be released when it resolves.
pub(super) struct Item {
    pub(super) record: NewRecord,
    pub(super) size: usize,
    pub(super) waiter: Waiter,
}

pub(super) struct Waiter {
    pub(super) ack: oneshot::Sender<Result<u64, ClientError>>,
    /// Dropped with the waiter: returns the record's bytes to the budget.
    pub(super) _permit: OwnedSemaphorePermit,
}

/// What a record costs in a batch (and in the buffer budget).
pub(super) fn record_size(record: &NewRecord) -> usize {
    let headers: usize = record
        .headers
        .iter()
        .map(|(n, v)| 8 + n.len() + v.len())
        .sum();
    8 + headers + record.body.len()
}
