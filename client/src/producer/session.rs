//! The session task: fills the current batch, seals it when full or lingered, launches sealed
//! batches into free request slots, resolves each record's waiter from its batch's
//! acknowledgement (offsets of duplicates included), and poisons the session on a final
//! failure.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::config::ProducerConfig;
use super::delivery::{Delivery, Progress};
use super::shared::{closed, Command, Item, Shared, Waiter};
use crate::answers::ProducerAck;
use crate::client::Client;
use crate::codec::{self, NewRecord};
use crate::error::ClientError;

/// A sealed batch waiting for a request slot.
struct Sealed {
    seq: u64,
    body: Bytes,
}

/// The session task's state.
pub(super) struct Session {
    client: Client,
    stream: String,
    config: ProducerConfig,
    shared: Arc<Shared>,
    inbox: mpsc::UnboundedReceiver<Command>,
    input_closed: bool,
    /// The batch being filled.
    pending: Vec<Item>,
    pending_bytes: usize,
    linger_deadline: Option<Instant>,
    /// Sealed, not yet sent.
    ready: VecDeque<Sealed>,
    /// Per sealed, unacknowledged batch: its records' waiters, in order.
    waiters: BTreeMap<u64, Vec<Waiter>>,
    /// Record count per batch from `done_below` on (for duplicate offsets).
    sizes: BTreeMap<u64, u64>,
    /// Sequence of the next batch to seal.
    next_seq: u64,
    /// Acknowledged batches at or above `done_below`.
    done: BTreeSet<u64>,
    done_below: u64,
    /// Flush callers and the sequence below which everything must be acknowledged.
    flushes: Vec<(u64, oneshot::Sender<Result<(), ClientError>>)>,
    in_flight: JoinSet<(u64, Result<ProducerAck, ClientError>)>,
    progress: watch::Sender<Progress>,
}

impl Session {
    /// A session on `stream` that reads its commands from `inbox`; nothing runs until
    /// [`Session::run`] is spawned.
    pub(super) fn new(
        client: Client,
        stream: &str,
        config: ProducerConfig,
        shared: Arc<Shared>,
        inbox: mpsc::UnboundedReceiver<Command>,
    ) -> Session {
        let (progress, _) = watch::channel(Progress::default());
        Session {
            client,
            stream: stream.to_owned(),
            config,
            shared,
            inbox,
            input_closed: false,
            pending: Vec::new(),
            pending_bytes: 0,
            linger_deadline: None,
            ready: VecDeque::new(),
            waiters: BTreeMap::new(),
            sizes: BTreeMap::new(),
            next_seq: 0,
            done: BTreeSet::new(),
            done_below: 0,
            flushes: Vec::new(),
            in_flight: JoinSet::new(),
            progress,
        }
    }

    pub(super) async fn run(mut self) {
        loop {
            self.seal_if_due();
            self.launch();
            if self.input_closed
                && self.pending.is_empty()
                && self.ready.is_empty()
                && self.in_flight.is_empty()
            {
                break;
            }
            let linger = match self.linger_deadline {
                Some(deadline) if self.slot_free() => Some(deadline),
                _ => None,
            };
            tokio::select! {
                joined = self.in_flight.join_next(), if !self.in_flight.is_empty() => {
                    match joined {
                        Some(Ok((seq, result))) => self.finish(seq, result),
                        // Aborted after poisoning: its waiters were failed already.
                        Some(Err(e)) if e.is_cancelled() => {}
                        Some(Err(e)) => self.poison(ClientError::Stopped(format!(
                            "a producer request task failed: {e}"
                        ))),
                        None => {}
                    }
                }
                command = self.inbox.recv(), if !self.input_closed => match command {
                    Some(Command::Send(item)) => self.add(item),
                    Some(Command::Flush(done)) => self.flush(done),
                    None => self.input_closed = true,
                },
                _ = sleep_until(linger), if linger.is_some() => {
                    self.seal();
                }
            }
        }
        self.fail_flushes();
    }

    fn slot_free(&self) -> bool {
        self.ready.is_empty() && self.in_flight.len() < self.config.max_in_flight
    }

    fn add(&mut self, item: Item) {
        if let Some(error) = self.shared.poisoned() {
            let _ = item.waiter.ack.send(Err(error));
            return;
        }
        if !self.pending.is_empty() && self.pending_bytes + item.size > self.config.max_batch_bytes
        {
            self.seal();
        }
        if self.pending.is_empty() {
            self.linger_deadline = Some(Instant::now() + self.config.linger);
        }
        self.pending_bytes += item.size;
        self.pending.push(item);
        if self.pending.len() >= self.config.max_batch_records
            || self.pending_bytes >= self.config.max_batch_bytes
        {
            self.seal();
        }
    }

    fn flush(&mut self, done: oneshot::Sender<Result<(), ClientError>>) {
        if let Some(error) = self.shared.poisoned() {
            let _ = done.send(Err(error));
            return;
        }
        self.seal();
        let target = self.next_seq;
        if self.done_below >= target {
            let _ = done.send(Ok(()));
        } else {
            self.flushes.push((target, done));
        }
    }

    /// Seals the pending batch when nothing is gained by waiting longer.
    fn seal_if_due(&mut self) {
        if self.pending.is_empty() || !self.slot_free() {
            return;
        }
        let lingered = self
            .linger_deadline
            .is_some_and(|deadline| Instant::now() >= deadline);
        if lingered || self.input_closed {
            self.seal();
        }
    }

    fn seal(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let items = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        self.linger_deadline = None;
        let records: Vec<NewRecord> = items.iter().map(|i| i.record.clone()).collect();
        let seq = self.next_seq;
        match codec::encode_binary_batch_records(&records) {
            Ok(body) => {
                self.next_seq += 1;
                self.sizes.insert(seq, records.len() as u64);
                self.waiters
                    .insert(seq, items.into_iter().map(|i| i.waiter).collect());
                self.ready.push_back(Sealed { seq, body });
            }
            Err(e) => {
                // Nothing was sent under this sequence, but the caller's records cannot be
                // delivered: treat it like any batch that failed for good.
                let error = ClientError::InvalidArgument(format!("cannot encode a batch: {e}"));
                for item in items {
                    let _ = item.waiter.ack.send(Err(error.clone()));
                }
                self.poison(error);
            }
        }
    }

    fn launch(&mut self) {
        if self.shared.poisoned().is_some() {
            self.ready.clear();
            return;
        }
        while self.in_flight.len() < self.config.max_in_flight {
            let Some(batch) = self.ready.pop_front() else {
                break;
            };
            let delivery = Delivery {
                client: self.client.clone(),
                stream: self.stream.clone(),
                producer_id: self.config.producer_id.clone(),
                epoch: self.config.epoch,
                seq: batch.seq,
                body: batch.body,
                max_attempts: self.config.max_attempts,
                initial_backoff: self.config.initial_backoff,
                max_backoff: self.config.max_backoff,
                deadline: Instant::now() + self.config.delivery_timeout,
                progress: self.progress.subscribe(),
            };
            self.in_flight.spawn(delivery.run());
        }
    }

    /// A batch task ended.
    fn finish(&mut self, seq: u64, result: Result<ProducerAck, ClientError>) {
        let ack = match result {
            Ok(ack) => ack,
            Err(error) => {
                self.poison(error);
                return;
            }
        };
        let start = match ack.start {
            Some(start) => start,
            None => {
                // Duplicate: the tail includes this batch and any later batches of ours the
                // server applied (up to its highest accepted sequence).
                let highest = ack.producer_seq.unwrap_or(seq).max(seq);
                let ours: u64 = self.sizes.range(seq..=highest).map(|(_, n)| n).sum();
                ack.next.saturating_sub(ours)
            }
        };
        if let Some(waiters) = self.waiters.remove(&seq) {
            for (index, waiter) in waiters.into_iter().enumerate() {
                let _ = waiter.ack.send(Ok(start + index as u64));
            }
        }
        self.done.insert(seq);
        while self.done.remove(&self.done_below) {
            self.done_below += 1;
        }
        let done_below = self.done_below;
        self.sizes = self.sizes.split_off(&done_below);
        self.progress.send_modify(|p| p.done_below = done_below);
        let (satisfied, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.flushes)
            .into_iter()
            .partition(|(target, _)| done_below >= *target);
        self.flushes = waiting;
        for (_, done) in satisfied {
            let _ = done.send(Ok(()));
        }
    }

    /// The first failure for good: everything unacknowledged fails with it, and so does
    /// everything handed over later.
    fn poison(&mut self, error: ClientError) {
        {
            let mut poison = self.shared.poison.lock().unwrap_or_else(|e| e.into_inner());
            if poison.is_some() {
                return;
            }
            *poison = Some(error.clone());
        }
        self.shared.budget.close();
        self.progress.send_modify(|p| p.poisoned = true);
        self.in_flight.abort_all();
        for (_, waiters) in std::mem::take(&mut self.waiters) {
            for waiter in waiters {
                let _ = waiter.ack.send(Err(error.clone()));
            }
        }
        for item in std::mem::take(&mut self.pending) {
            let _ = item.waiter.ack.send(Err(error.clone()));
        }
        self.pending_bytes = 0;
        self.linger_deadline = None;
        self.ready.clear();
        self.fail_flushes();
    }

    fn fail_flushes(&mut self) {
        let error = self.shared.poisoned().unwrap_or_else(closed);
        for (_, done) in std::mem::take(&mut self.flushes) {
            let _ = done.send(Err(error.clone()));
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
