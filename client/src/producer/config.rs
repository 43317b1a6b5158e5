//! The settings of a producer session, their defaults and their checks, and the default
//! producer id (unique per session).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::error::ClientError;

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

    pub(super) fn validate(&self) -> Result<(), ClientError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
