//! The engine's clock: monotonic instants for deadlines and ages, and wall-clock Unix
//! milliseconds for record timestamps and expiry. Real by default; a test hands a shard a
//! simulated one ([`Clock::simulated`]) and moves it forward ([`Clock::advance`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Wall-clock Unix milliseconds: the one clock of record timestamps and expiry.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Where a shard reads the time. A real clock is a plain call to the system's; a simulated
/// one stands still until advanced, both its instants and its wall-clock milliseconds.
#[derive(Clone, Default)]
pub struct Clock {
    simulated: Option<Arc<Simulated>>,
}

struct Simulated {
    base: Instant,
    base_ms: i64,
    advanced_ms: AtomicU64,
}

impl Clock {
    /// The system's clock.
    pub fn real() -> Clock {
        Clock::default()
    }

    /// A clock that starts at wall-clock `start_ms` and moves only when advanced.
    pub fn simulated(start_ms: i64) -> Clock {
        Clock {
            simulated: Some(Arc::new(Simulated {
                base: Instant::now(),
                base_ms: start_ms,
                advanced_ms: AtomicU64::new(0),
            })),
        }
    }

    /// Moves a simulated clock forward (a real one moves on its own: no effect).
    pub fn advance(&self, by: Duration) {
        if let Some(sim) = &self.simulated {
            sim.advanced_ms
                .fetch_add(by.as_millis() as u64, Ordering::Relaxed);
        }
    }

    /// The monotonic now, for deadlines and ages.
    #[inline]
    pub fn now(&self) -> Instant {
        match &self.simulated {
            None => Instant::now(),
            Some(sim) => sim.base + Duration::from_millis(sim.advanced_ms.load(Ordering::Relaxed)),
        }
    }

    /// Wall-clock Unix milliseconds, for record timestamps and expiry.
    #[inline]
    pub fn now_ms(&self) -> i64 {
        match &self.simulated {
            None => now_ms(),
            Some(sim) => sim.base_ms + sim.advanced_ms.load(Ordering::Relaxed) as i64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simulated_clock_moves_only_when_advanced() {
        let clock = Clock::simulated(1_700_000_000_000);
        let (at, at_ms) = (clock.now(), clock.now_ms());
        assert_eq!(at_ms, 1_700_000_000_000);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(
            (clock.now(), clock.now_ms()),
            (at, at_ms),
            "it stands still"
        );
        let shared = clock.clone();
        shared.advance(Duration::from_secs(90));
        assert_eq!(clock.now() - at, Duration::from_secs(90));
        assert_eq!(clock.now_ms(), at_ms + 90_000);
    }

    #[test]
    fn a_real_clock_reads_the_system() {
        let clock = Clock::real();
        let before = now_ms();
        let read = clock.now_ms();
        assert!(read >= before && read - before < 60_000);
        clock.advance(Duration::from_secs(3600));
        assert!(
            clock.now_ms() - before < 60_000,
            "advancing a real clock does nothing"
        );
    }
}
