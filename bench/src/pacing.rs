//! `--target-mibps`: pacing on the bytes handed to the HTTP client.
//!
//! A shared schedule hands out send slots: each request of `n` bytes occupies `n / rate`
//! seconds of it. Writers sleep until their slot, so the offered load stays at the target
//! whatever the server does; a slow server shows up as latency (and, once every writer waits
//! for an answer, as lower throughput). A writer that falls behind the schedule may catch up
//! by at most [`BURST`], so timer granularity does not eat into the rate but a stall is not
//! followed by an unbounded burst.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How far behind the schedule may lag before it is moved up to now.
pub(crate) const BURST: Duration = Duration::from_millis(20);

/// Bytes per second for a target in MiB/s; `None` for 0 (unlimited).
pub(crate) fn bytes_per_sec(target_mibps: f64) -> Option<f64> {
    (target_mibps > 0.0).then_some(target_mibps * 1024.0 * 1024.0)
}

/// How long `bytes` occupy the schedule at `rate` bytes per second.
pub(crate) fn slot_length(bytes: u64, rate: f64) -> Duration {
    Duration::from_secs_f64(bytes as f64 / rate)
}

#[derive(Debug)]
pub(crate) struct Pacer {
    rate: f64,
    /// The schedule: `(anchor, bytes)` puts the next slot at `anchor + bytes / rate`
    /// (computed from the total, so rounding does not accumulate).
    schedule: Mutex<Option<(Instant, u64)>>,
}

impl Pacer {
    /// A pacer at `rate` bytes per second (must be positive).
    pub(crate) fn new(rate: f64) -> Pacer {
        assert!(rate > 0.0 && rate.is_finite());
        Pacer {
            rate,
            schedule: Mutex::new(None),
        }
    }

    /// Reserves the next slot for `bytes` and returns when it starts (send at or after it).
    pub(crate) fn reserve(&self, bytes: u64, now: Instant) -> Instant {
        let mut schedule = self.schedule.lock().unwrap_or_else(|e| e.into_inner());
        let earliest = now.checked_sub(BURST).unwrap_or(now);
        // The very first slot starts now; later ones where the schedule is, unless it lags
        // by more than BURST: then it restarts at now - BURST.
        let (anchor, offered) = match *schedule {
            None => (now, 0),
            Some((anchor, offered)) => {
                let next = anchor + slot_length(offered, self.rate);
                if next >= earliest {
                    (anchor, offered)
                } else {
                    (earliest, 0)
                }
            }
        };
        *schedule = Some((anchor, offered + bytes));
        anchor + slot_length(offered, self.rate)
    }

    /// Waits for the slot of `bytes`.
    pub(crate) async fn pace(&self, bytes: u64) {
        let now = Instant::now();
        let slot = self.reserve(bytes, now);
        if slot > now {
            tokio::time::sleep_until(slot.into()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_conversion() {
        assert_eq!(bytes_per_sec(0.0), None);
        assert_eq!(bytes_per_sec(1.0), Some(1_048_576.0));
        assert_eq!(bytes_per_sec(2.5), Some(2.5 * 1_048_576.0));
        assert_eq!(
            slot_length(1024, 1_048_576.0),
            Duration::from_micros(976) + Duration::from_nanos(562)
        );
        assert_eq!(slot_length(1_048_576, 1_048_576.0), Duration::from_secs(1));
    }

    #[test]
    fn slots_follow_the_rate() {
        // 1 MiB/s, 1 KiB requests: a slot every 1/1024 s.
        let pacer = Pacer::new(1_048_576.0);
        let t0 = Instant::now() + Duration::from_secs(1);
        assert_eq!(pacer.reserve(1024, t0), t0);
        // Many writers asking at the same instant get consecutive slots.
        for i in 1..100u64 {
            assert_eq!(
                pacer.reserve(1024, t0),
                t0 + slot_length(1024 * i, 1_048_576.0)
            );
        }
        // 1024 requests of 1 KiB take one second of schedule.
        let pacer = Pacer::new(1_048_576.0);
        let mut last = t0;
        for _ in 0..1024 {
            last = pacer.reserve(1024, t0);
        }
        let next = pacer.reserve(1024, t0);
        assert_eq!(next, t0 + Duration::from_secs(1));
        assert!(last < next);
    }

    #[test]
    fn lag_is_bounded_by_the_burst() {
        let pacer = Pacer::new(1_048_576.0);
        let t0 = Instant::now() + Duration::from_secs(1);
        assert_eq!(pacer.reserve(1024, t0), t0);
        // A writer arriving much later does not get a slot in the distant past...
        let late = t0 + Duration::from_secs(10);
        let slot = pacer.reserve(1024, late);
        assert_eq!(slot, late - BURST);
        // ...and the schedule continues from there at the rate.
        assert_eq!(
            pacer.reserve(1024, late),
            late - BURST + slot_length(1024, 1_048_576.0)
        );
        // A small lag (timer granularity) is caught up fully.
        let pacer = Pacer::new(1_048_576.0);
        assert_eq!(pacer.reserve(1024, t0), t0);
        let slightly_late = t0 + Duration::from_millis(5);
        assert_eq!(
            pacer.reserve(1024, slightly_late),
            t0 + slot_length(1024, 1_048_576.0)
        );
    }
}
