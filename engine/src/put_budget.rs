//! The node's budget of object-store PUTs for flushes under object durability: what bounds
//! their cost, where a fixed flush window would make every lone writer wait it out.
//!
//! A core flushes its active segment as soon as its uploader is free (`shard/flush.rs`), so a
//! lone writer waits one PUT and one catalog commit, not a window. Left alone, a fast store
//! and a trickle of appends would then make one PUT per append; every PUT is billed, so the
//! node shares one budget of `object_puts_per_second` across its cores. It is a token bucket
//! kept as one "next free slot" time (the generic cell rate algorithm), taken with a
//! compare-and-swap: no lock, and cores never wait for each other, only for the clock.
//!
//! ```text
//!   spacing = 1 s / object_puts_per_second        burst = one PUT per core at once
//!   take():  start = max(next_free, now);  next_free = start + spacing
//!            wait  = start - now - (burst - 1) × spacing, at least 0
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::clock::Clock;

/// Shared by every core of a node (an `Arc` in each core's seed).
pub(crate) struct PutBudget {
    origin: Instant,
    /// Where `origin` and now are read.
    clock: Clock,
    spacing_us: u64,
    /// How far ahead of the clock slots may be handed out without waiting.
    burst_us: u64,
    /// Microseconds since `origin` at which the next slot is free.
    next_free_us: AtomicU64,
}

impl PutBudget {
    /// `puts_per_second` is at least 1 (`EngineConfig::check`); `burst` PUTs may go at once.
    pub(crate) fn new(puts_per_second: u32, burst: usize, clock: Clock) -> PutBudget {
        let spacing_us = 1_000_000 / u64::from(puts_per_second.max(1));
        let burst = burst.max(1) as u64;
        PutBudget {
            origin: clock.now(),
            clock,
            spacing_us,
            burst_us: spacing_us.saturating_mul(burst - 1),
            next_free_us: AtomicU64::new(0),
        }
    }

    /// Takes the next slot: how long the caller must wait before its PUT starts.
    pub(crate) fn take(&self) -> Duration {
        let elapsed = self.clock.now().saturating_duration_since(self.origin);
        let now_us = elapsed.as_micros().min(u128::from(u64::MAX)) as u64;
        self.take_at(now_us)
    }

    fn take_at(&self, now_us: u64) -> Duration {
        let mut next_free = self.next_free_us.load(Ordering::Relaxed);
        loop {
            let start = next_free.max(now_us);
            let next = start.saturating_add(self.spacing_us);
            match self.next_free_us.compare_exchange_weak(
                next_free,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    let wait_us = start.saturating_sub(now_us.saturating_add(self.burst_us));
                    return Duration::from_micros(wait_us);
                }
                Err(seen) => next_free = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_spaced_by_the_rate_after_the_burst() {
        // 200 PUTs/s: a slot every 5 ms; two may go at once.
        let budget = PutBudget::new(200, 2, Clock::real());
        assert_eq!(budget.take_at(1_000), Duration::ZERO);
        assert_eq!(budget.take_at(1_000), Duration::ZERO);
        assert_eq!(budget.take_at(1_000), Duration::from_millis(5));
        assert_eq!(budget.take_at(1_000), Duration::from_millis(10));
    }

    #[test]
    fn an_idle_budget_does_not_save_up_more_than_its_burst() {
        let budget = PutBudget::new(100, 1, Clock::real());
        assert_eq!(budget.take_at(0), Duration::ZERO);
        // Ten seconds idle: the next slot is free at once, but only one.
        assert_eq!(budget.take_at(10_000_000), Duration::ZERO);
        assert_eq!(budget.take_at(10_000_000), Duration::from_millis(10));
    }

    /// A simulated clock drives the budget: slots free up only as it is advanced.
    #[test]
    fn the_budget_reads_its_clock() {
        let clock = Clock::simulated(0);
        let budget = PutBudget::new(100, 1, clock.clone());
        assert_eq!(budget.take(), Duration::ZERO);
        assert_eq!(budget.take(), Duration::from_millis(10));
        clock.advance(Duration::from_millis(25));
        assert_eq!(
            budget.take(),
            Duration::ZERO,
            "the second slot went by at 20 ms"
        );
    }

    #[test]
    fn the_rate_holds_over_many_takes_from_many_threads() {
        let budget = std::sync::Arc::new(PutBudget::new(1_000, 4, Clock::real()));
        let waits: Vec<Duration> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let budget = budget.clone();
                    scope.spawn(move || (0..250).map(|_| budget.take_at(0)).collect::<Vec<_>>())
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("taker"))
                .collect()
        });
        // 1,000 slots at 1 ms each, 4 of them free: every wait is distinct, the longest 996 ms.
        let mut sorted: Vec<u128> = waits.iter().map(|w| w.as_micros()).collect();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 997, "the 4 free slots share a wait of 0");
        assert_eq!(sorted.last(), Some(&996_000));
    }
}
