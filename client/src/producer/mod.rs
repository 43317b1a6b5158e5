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
//!
//! Files: `config` (the settings), `shared` (what this handle and the session task share),
//! `session` (the task: batching, sealing, in-flight slots, acknowledgements), `delivery` (one
//! batch's sends and retries).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::client::{Client, Protocol};
use crate::codec::NewRecord;
use crate::error::ClientError;

mod config;
mod delivery;
mod session;
mod shared;

pub use config::ProducerConfig;
use session::Session;
use shared::{record_size, stopped, Command, Item, Shared, Waiter};

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
        let max_buffered_bytes = config.max_buffered_bytes;
        let session = Session::new(client, stream, config, shared.clone(), inbox);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_can_be_shared_between_tasks_and_threads() {
        fn shareable<T: Send + Sync + 'static>() {}
        shareable::<Producer>();
        shareable::<SendHandle>();
        shareable::<ProducerConfig>();
    }
}
