//! Log lines a fault repeats at a rate no one reads (every damaged read, every failed upload
//! retry of hundreds of pending segments, every metadata batch a full disk fails, at the rate
//! clients send requests), cut to one line per interval that counts the ones
//! it left out: an operator sees the fault and its scale, and a disk that is full already is
//! not filled further by the log.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// At most one line per `interval`, counting the events in between.
pub struct LogLimit {
    interval: Duration,
    logged_at: Cell<Option<Instant>>,
    unlogged: Cell<u64>,
}

impl LogLimit {
    pub fn new(interval_ms: u64) -> LogLimit {
        LogLimit {
            interval: Duration::from_millis(interval_ms),
            logged_at: Cell::new(None),
            unlogged: Cell::new(0),
        }
    }

    /// Whether an event met `now` gets a line (none in the last interval), with how many went
    /// unlogged before it; otherwise it is counted for the next line.
    pub fn due(&self, now: Instant) -> Option<u64> {
        if self
            .logged_at
            .get()
            .is_some_and(|at| now.saturating_duration_since(at) < self.interval)
        {
            self.unlogged.set(self.unlogged.get().saturating_add(1));
            return None;
        }
        self.logged_at.set(Some(now));
        Some(self.unlogged.replace(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_of_the_events_in_between() {
        let limit = LogLimit::new(10_000);
        let start = Instant::now();
        let interval = Duration::from_millis(10_000);
        assert_eq!(limit.due(start), Some(0));
        assert_eq!(limit.due(start + interval / 3), None);
        assert_eq!(limit.due(start + interval / 2), None);
        assert_eq!(limit.due(start + interval), Some(2));
    }
}
