//! What both protocols' live SSE responses share: the floor of their keep-alive interval, the
//! length of one idle round, and one read at the tail (docs/api.md, "Read").

use std::time::Instant;

use pico_engine::{CoreHandle, ReadBatch, ReadRequest};

/// The shortest idle time between keep-alives: a `--long-poll-timeout-sec` of 0 (long-polls
/// answer at once) must not turn an idle SSE response into a stream of keep-alives.
pub const KEEP_ALIVE_MIN_MS: u64 = 100;

/// The wait of one round of a live SSE response (both protocols) that is idle at the tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IdleRound {
    /// Wait this long for new records...
    pub wait_ms: u64,
    /// ...and if none came, the response is over: the wait ran to its deadline.
    pub last: bool,
}

impl IdleRound {
    /// A keep-alive interval's wait, or the rest of the response's time if that is shorter;
    /// `None` once the deadline has passed. The rest is rounded up to a whole millisecond, and
    /// the round that reaches the deadline is marked last, so the end of a response never
    /// turns into zero-length waits that each send a keep-alive.
    pub fn next(deadline: Instant, interval_ms: u64) -> Option<IdleRound> {
        let rest = deadline.checked_duration_since(Instant::now())?;
        if rest.is_zero() {
            return None;
        }
        let rest_ms = u64::try_from(rest.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
        Some(if rest_ms <= interval_ms {
            IdleRound {
                wait_ms: rest_ms,
                last: true,
            }
        } else {
            IdleRound {
                wait_ms: interval_ms,
                last: false,
            }
        })
    }
}

/// One read of a live response (both protocols): the batch, and whether it must be the
/// response's last because the node is stopping (it ends cleanly once that batch is sent).
/// `None` when the stream is deleted, expired or failing: the response ends, and the client's
/// reconnect gets the error.
pub(crate) async fn live_read(
    core: &CoreHandle,
    name: &str,
    request: ReadRequest,
) -> Option<(ReadBatch, bool)> {
    match core.read(name, request).await {
        Ok(batch) => Some((batch, core.is_stopping())),
        _ => None,
    }
}
