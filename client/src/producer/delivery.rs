//! Delivering one sealed batch: send it as the producer, wait out a sequence gap behind earlier
//! batches, retry transient failures with jittered backoff, give up after the attempts or the
//! delivery timeout.

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::answers::ProducerAck;
use crate::client::Client;
use crate::error::ClientError;

/// The longest `Retry-After` a producer honours.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(5);

/// Broadcast to the batch tasks.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Progress {
    /// Every batch with a lower sequence is acknowledged.
    pub(super) done_below: u64,
    pub(super) poisoned: bool,
}

/// Sends one batch until it is acknowledged or fails for good.
pub(super) struct Delivery {
    pub(super) client: Client,
    pub(super) stream: String,
    pub(super) producer_id: String,
    pub(super) epoch: u64,
    pub(super) seq: u64,
    pub(super) body: Bytes,
    pub(super) max_attempts: u32,
    pub(super) initial_backoff: Duration,
    pub(super) max_backoff: Duration,
    pub(super) deadline: Instant,
    pub(super) progress: watch::Receiver<Progress>,
}

impl Delivery {
    pub(super) async fn run(mut self) -> (u64, Result<ProducerAck, ClientError>) {
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
            // refusal arrives (checking only afterwards would make that race a failure).
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
}
