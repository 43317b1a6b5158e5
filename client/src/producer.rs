//! An idempotent producer session (Pico protocol only; docs/api.md, "Append").
//!
//! Records handed to [`Producer::send`] are grouped into binary batches; each batch is one
//! `POST` carrying `Pico-Producer-Id`, `Pico-Producer-Epoch` and one `Pico-Producer-Seq`
//! (sequences count batches, from 0). The server applies a batch only if its sequence is the
//! next one of the producer and answers a re-sent batch as a duplicate, so retrying a batch
//! whose outcome is unknown (connection reset, timeout, server restart) writes its records
//! exactly once, and batches land in sequence order whatever order the requests arrive in.
//!
//! * **Batching:** a batch is sealed when it reaches `max_batch_records` records or
//!   `max_batch_bytes` bytes, or `linger` after its first record if a request slot is free
//!   (while all slots are busy it keeps filling, so a slow server gets bigger batches).
//! * **In flight:** up to `max_in_flight` batches are sent concurrently. A batch that
//!   overtakes its predecessor gets `409 sequence_gap` (or `400` if it even overtook the
//!   producer's first batch); it then waits until every earlier batch is acknowledged and is
//!   sent again (that wait does not use up its attempts).
//! * **Retries:** transport errors, `429`, `5xx` (and a sequence gap that persists although
//!   every earlier batch is acknowledged) are retried with exponential backoff and jitter
//!   (`initial_backoff` ×2 up to `max_backoff`; at least the server's `Retry-After`, up to
//!   5 s, when it sends one), at most `max_attempts` sends and within `delivery_timeout`
//!   from the batch's first send.
//! * **Poisoning:** a batch that fails for good (attempts or deadline exhausted, `403 fenced`,
//!   `404`, `409 closed`, `400`, ...) poisons the session: the sequence cannot skip a hole.
//!   Every unacknowledged record, and every later `send`/`flush`, fails with that error.
//! * **Backpressure:** records waiting for their acknowledgement may hold at most
//!   `max_buffered_bytes`; `send` waits for room.
//! * **Offsets:** a record's offset is `Pico-Start-Seq` + its index in the batch. For a
//!   duplicate (the first send was applied but its answer was lost) the server only says the
//!   tail and the producer's highest accepted sequence, so the offsets are derived as
//!   `Pico-Next-Seq` − the records of this and the producer's later applied batches. That
//!   is exact unless other writers appended to the stream in between.
//!
//! A session must use a producer id and epoch that no earlier session used with a higher
//! sequence: a new session starts at sequence 0, which the server would take for a
//! duplicate of that earlier session's first batch. The default id is unique per session;
//! to fence an older session of the same id, start the new one with a higher epoch.
//!
//! The session runs as a task on the current tokio runtime (a current-thread runtime works:
//! the task makes progress whenever the caller awaits).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::{Client, ProducerAck, Protocol};
use crate::codec::{self, NewRecord};
use crate::error::ClientError;

/// The longest `Retry-After` a producer honours.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(5);

/// Settings of a producer session. [`ProducerConfig::default`] gives the defaults below and a
/// fresh unique producer id.
#[derive(Clone, Debug)]
pub struct ProducerConfig {
    /// `Pico-Producer-Id`: must not be empty.
    pub producer_id: String,
    /// `Pico-Producer-Epoch` (default 0). A session with a higher epoch fences older ones.
    pub epoch: u64,
    /// How long a batch may wait for more records once it has one (default 5 ms).
    pub linger: Duration,
    /// Records per batch at most (default 500).
    pub max_batch_records: usize,
    /// Encoded bytes per batch at most (default 1 MiB); a larger record travels alone.
    pub max_batch_bytes: usize,
    /// Batches sent concurrently (default 1).
    pub max_in_flight: usize,
    /// Bytes of records handed over and not yet acknowledged (default 32 MiB); `send`
    /// waits while the budget is used up.
    pub max_buffered_bytes: usize,
    /// Sends of one batch at most, the first included (default 12). With the default
    /// backoff, 12 attempts ride out about half a second without a server; to ride out
    /// restarts, raise it and let `delivery_timeout` bound the wait instead.
    pub max_attempts: u32,
    /// First retry delay (default 1 ms); doubles per retry.
    pub initial_backoff: Duration,
    /// Largest retry delay (default 100 ms).
    pub max_backoff: Duration,
    /// A batch fails if it is not acknowledged this long after its first send (default 2 min).
    pub delivery_timeout: Duration,
}

impl Default for ProducerConfig {
    fn default() -> ProducerConfig {
        ProducerConfig {
            producer_id: unique_producer_id(),
            epoch: 0,
            linger: Duration::from_millis(5),
            max_batch_records: 500,
            max_batch_bytes: 1 << 20,
            max_in_flight: 1,
            max_buffered_bytes: 32 << 20,
            max_attempts: 12,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(100),
            delivery_timeout: Duration::from_secs(120),
        }
    }
}

impl ProducerConfig {
    /// The defaults with this producer id.
    pub fn with_id(producer_id: impl Into<String>) -> ProducerConfig {
        ProducerConfig {
            producer_id: producer_id.into(),
            ..ProducerConfig::default()
        }
    }

    fn validate(&self) -> Result<(), ClientError> {
        let bad = |m: &str| {
            Err(ClientError::InvalidArgument(format!(
                "producer config: {m}"
            )))
        };
        if self.producer_id.is_empty() {
            return bad("the producer id must not be empty");
        }
        if self.max_batch_records == 0 || self.max_batch_bytes == 0 {
            return bad("batches must allow at least one record and one byte");
        }
        if self.max_in_flight == 0 {
            return bad("max_in_flight must be at least 1");
        }
        if self.max_buffered_bytes == 0 || self.max_buffered_bytes > Semaphore::MAX_PERMITS {
            return bad("max_buffered_bytes must be between 1 and 2^61");
        }
        if self.max_attempts == 0 {
            return bad("max_attempts must be at least 1");
        }
        Ok(())
    }
}

/// `pico-<pid>-<clock>-<counter>`: unique per session, across processes and restarts.
fn unique_producer_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "pico-{:x}-{:x}-{}",
        std::process::id(),
        nanos,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Resolves to the record's offset once it is durable, or to the error that poisoned the
/// session.
#[derive(Debug)]
pub struct SendHandle(oneshot::Receiver<Result<u64, ClientError>>);

impl Future for SendHandle {
    type Output = Result<u64, ClientError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.unwrap_or_else(|_| Err(stopped())))
    }
}

fn stopped() -> ClientError {
    ClientError::Stopped("the producer session stopped (its runtime shut down)".into())
}

fn closed() -> ClientError {
    ClientError::Stopped("the producer session is closed".into())
}

/// State shared by the handle and the session task.
struct Shared {
    /// The error that poisoned the session, once set never cleared.
    poison: Mutex<Option<ClientError>>,
    /// Permits = bytes of the buffer budget.
    budget: Arc<Semaphore>,
}

impl Shared {
    fn poisoned(&self) -> Option<ClientError> {
        self.poison
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

enum Command {
    Send(Item),
    Flush(oneshot::Sender<Result<(), ClientError>>),
}

/// A record handed over, with what must be released when it resolves.
struct Item {
    record: NewRecord,
    size: usize,
    waiter: Waiter,
}

struct Waiter {
    ack: oneshot::Sender<Result<u64, ClientError>>,
    /// Dropped with the waiter: returns the record's bytes to the budget.
    _permit: OwnedSemaphorePermit,
}

/// An idempotent producer session on one stream; see the module documentation.
///
/// ```no_run
/// # async fn demo() -> Result<(), pico_client::ClientError> {
/// use pico_client::{Client, ClientConfig, Producer, ProducerConfig};
/// let client = Client::new(ClientConfig::new("http://127.0.0.1:4437"))?;
/// let producer = Producer::new(client, "/streams/orders", ProducerConfig::default())?;
/// let first = producer.send("one").await?; // waits only for buffer room
/// producer.send("two").await?;
/// let offset = first.await?; // durable
/// producer.close().await?; // everything durable
/// # let _ = offset;
/// # Ok(())
/// # }
/// ```
pub struct Producer {
    commands: mpsc::UnboundedSender<Command>,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
    max_buffered_bytes: usize,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("poisoned", &self.shared.poisoned())
            .finish_non_exhaustive()
    }
}

impl Producer {
    /// Starts a session on `stream` (which must exist). Must be called inside a tokio
    /// runtime: the session runs as a task on it.
    pub fn new(
        client: Client,
        stream: &str,
        config: ProducerConfig,
    ) -> Result<Producer, ClientError> {
        if client.protocol() != Protocol::Pico {
            return Err(ClientError::Unsupported(
                "producer sessions are a Pico protocol feature; use --protocol pico".into(),
            ));
        }
        config.validate()?;
        // Fail early on a bad name rather than in the first batch.
        client.stream_url(stream)?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            ClientError::InvalidArgument(
                "Producer::new must be called inside a tokio runtime".into(),
            )
        })?;
        let shared = Arc::new(Shared {
            poison: Mutex::new(None),
            budget: Arc::new(Semaphore::new(config.max_buffered_bytes)),
        });
        let (commands, inbox) = mpsc::unbounded_channel();
        let (progress, _) = watch::channel(Progress::default());
        let max_buffered_bytes = config.max_buffered_bytes;
        let session = Session {
            client,
            stream: stream.to_owned(),
            config,
            shared: shared.clone(),
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
        };
        let task = runtime.spawn(session.run());
        Ok(Producer {
            commands,
            shared,
            task,
            max_buffered_bytes,
        })
    }

    /// Hands a record over. Waits while the buffer budget is used up, then returns a handle
    /// that resolves to the record's offset once it is durable. Fails at once if the session
    /// is poisoned (with the error that poisoned it).
    pub async fn send(&self, record: impl Into<NewRecord>) -> Result<SendHandle, ClientError> {
        if let Some(error) = self.shared.poisoned() {
            return Err(error);
        }
        let record = record.into();
        let size = record_size(&record);
        // A record larger than the whole budget takes all of it.
        let permits = size.clamp(1, self.max_buffered_bytes);
        let permits = u32::try_from(permits).unwrap_or(u32::MAX);
        let permit = match self.shared.budget.clone().acquire_many_owned(permits).await {
            Ok(permit) => permit,
            // The budget is closed when the session is poisoned.
            Err(_) => return Err(self.shared.poisoned().unwrap_or_else(stopped)),
        };
        let (ack, handle) = oneshot::channel();
        let item = Item {
            record,
            size,
            waiter: Waiter {
                ack,
                _permit: permit,
            },
        };
        self.commands
            .send(Command::Send(item))
            .map_err(|_| self.shared.poisoned().unwrap_or_else(stopped))?;
        Ok(SendHandle(handle))
    }

    /// Waits until every record handed over before this call is durable (sending a partly
    /// filled batch at once). Fails with the poisoning error if any of them failed.
    pub async fn flush(&self) -> Result<(), ClientError> {
        if let Some(error) = self.shared.poisoned() {
            return Err(error);
        }
        let (done, result) = oneshot::channel();
        self.commands
            .send(Command::Flush(done))
            .map_err(|_| self.shared.poisoned().unwrap_or_else(stopped))?;
        result.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Flushes, then ends the session.
    pub async fn close(self) -> Result<(), ClientError> {
        let flushed = self.flush().await;
        drop(self.commands);
        // The task ends once the (now empty) queue is closed.
        let _ = self.task.await;
        flushed
    }

    /// The error that poisoned the session, if any.
    pub fn error(&self) -> Option<ClientError> {
        self.shared.poisoned()
    }
}

/// What a record costs in a batch (and in the buffer budget).
fn record_size(record: &NewRecord) -> usize {
    let headers: usize = record
        .headers
        .iter()
        .map(|(n, v)| 8 + n.len() + v.len())
        .sum();
    8 + headers + record.body.len()
}

/// Broadcast to the batch tasks.
#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    /// Every batch with a lower sequence is acknowledged.
    done_below: u64,
    poisoned: bool,
}

/// A sealed batch waiting for a request slot.
struct Sealed {
    seq: u64,
    body: Bytes,
}

/// The session task's state.
struct Session {
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
    async fn run(mut self) {
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

/// Sends one batch until it is acknowledged or fails for good.
struct Delivery {
    client: Client,
    stream: String,
    producer_id: String,
    epoch: u64,
    seq: u64,
    body: Bytes,
    max_attempts: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
    deadline: Instant,
    progress: watch::Receiver<Progress>,
}

impl Delivery {
    async fn run(mut self) -> (u64, Result<ProducerAck, ClientError>) {
        let seq = self.seq;
        (seq, self.deliver().await)
    }

    async fn deliver(&mut self) -> Result<ProducerAck, ClientError> {
        let mut attempts = 0u32;
        let mut jitter = Jitter::new(self.seq);
        loop {
            attempts += 1;
            // Whether an earlier batch was still unacknowledged when this one left: then a
            // refusal may be ordering even if that batch is acknowledged by the time the
            // refusal arrives (checking only afterwards made that race a failure).
            let overtaking = self.progress.borrow().done_below < self.seq;
            let send = self.client.append_as_producer(
                &self.stream,
                self.body.clone(),
                &self.producer_id,
                self.epoch,
                self.seq,
            );
            let error = match tokio::time::timeout_at(self.deadline, send).await {
                Ok(Ok(ack)) => return Ok(ack),
                Ok(Err(error)) => error,
                Err(_) => return Err(self.timed_out(attempts, None)),
            };
            // A batch that overtook an earlier one is refused: `409 sequence_gap`, or `400`
            // while the server has not seen the producer (or this epoch) at all yet ("New
            // epoch must start with sequence 0"). While an earlier batch is unacknowledged
            // either may be ordering, not failure: wait for the earlier batches, then send
            // again, without counting an attempt. Once they are all acknowledged, a 400 is
            // final.
            let reordered = error.is_sequence_gap() || error.status() == Some(400);
            if reordered && overtaking {
                attempts -= 1;
                let seq = self.seq;
                let progress = &mut self.progress;
                let wait = async move {
                    progress
                        .wait_for(|p| p.done_below >= seq || p.poisoned)
                        .await
                        .map(|p| p.poisoned)
                };
                match tokio::time::timeout_at(self.deadline, wait).await {
                    Ok(Ok(false)) => continue,
                    // Poisoned (or the session is gone): the session fails the batch.
                    Ok(_) => return Err(error),
                    Err(_) => return Err(self.timed_out(attempts, Some(&error))),
                }
            }
            if !(error.is_retryable() || error.is_sequence_gap()) {
                return Err(error);
            }
            if attempts >= self.max_attempts {
                return Err(error);
            }
            let mut delay = jitter.backoff(self.initial_backoff, self.max_backoff, attempts);
            if let Some(asked) = error.retry_after() {
                // An overloaded server (429) says when to come back: honour it, within reason.
                delay = delay.max(asked.min(MAX_RETRY_AFTER));
            }
            if Instant::now() + delay >= self.deadline {
                return Err(self.timed_out(attempts, Some(&error)));
            }
            tokio::time::sleep(delay).await;
        }
    }

    fn timed_out(&self, attempts: u32, last: Option<&ClientError>) -> ClientError {
        let mut message = format!(
            "producer batch {} not acknowledged within the delivery timeout ({attempts} attempts)",
            self.seq
        );
        if let Some(last) = last {
            message.push_str(&format!("; last error: {last}"));
        }
        ClientError::Transport(message)
    }
}

/// Exponential backoff with jitter from a small xorshift generator (no `rand` dependency).
struct Jitter(u64);

impl Jitter {
    fn new(seed: u64) -> Jitter {
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        Jitter((clock ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// The delay after failed attempt `attempt` (1-based): `initial × 2^(attempt−1)`
    /// capped at `max`, then a uniformly random value in its upper half.
    fn backoff(&mut self, initial: Duration, max: Duration, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(30);
        let base = initial.saturating_mul(1 << exp).min(max);
        let half = base / 2;
        let nanos = half.as_nanos() as u64;
        let extra = if nanos == 0 {
            0
        } else {
            self.next() % (nanos + 1)
        };
        half + Duration::from_nanos(extra)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter() {
        let mut jitter = Jitter::new(1);
        let initial = Duration::from_millis(1);
        let max = Duration::from_millis(100);
        for attempt in 1..=20u32 {
            let base = (initial * 2u32.pow(attempt.min(20) - 1)).min(max);
            for _ in 0..50 {
                let d = jitter.backoff(initial, max, attempt);
                assert!(
                    d >= base / 2 && d <= base,
                    "attempt {attempt}: {d:?} vs {base:?}"
                );
            }
        }
        assert_eq!(jitter.backoff(Duration::ZERO, max, 3), Duration::ZERO);
    }

    #[test]
    fn sessions_can_be_shared_between_tasks_and_threads() {
        fn shareable<T: Send + Sync + 'static>() {}
        shareable::<Producer>();
        shareable::<SendHandle>();
        shareable::<ProducerConfig>();
    }

    #[test]
    fn config_is_validated() {
        assert!(ProducerConfig::default().validate().is_ok());
        let bad = [
            ProducerConfig::with_id(""),
            ProducerConfig {
                max_in_flight: 0,
                ..ProducerConfig::default()
            },
            ProducerConfig {
                max_batch_records: 0,
                ..ProducerConfig::default()
            },
            ProducerConfig {
                max_attempts: 0,
                ..ProducerConfig::default()
            },
        ];
        for config in bad {
            assert!(config.validate().is_err(), "{config:?}");
        }
        assert_ne!(
            ProducerConfig::default().producer_id,
            ProducerConfig::default().producer_id
        );
    }
}
