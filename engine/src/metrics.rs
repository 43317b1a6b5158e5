//! Per-core counters and latency histograms for `/metrics` and the admin API.
//!
//! Each core writes only its own [`CoreMetrics`] (relaxed atomics on memory no other core
//! writes, so no lock and no shared cache line on the hot path); the admin listener reads all
//! of them when scraped. Everything is per core and per operation, never per stream, so the
//! series count stays bounded whatever the number of streams.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Upper bounds of the latency histogram buckets, in microseconds (plus `+Inf`).
pub const LATENCY_BUCKETS_US: [u64; 14] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
    5_000_000,
];

/// A cumulative latency histogram (Prometheus semantics: bucket `i` counts samples ≤ bound `i`
/// once rendered; stored per bucket and summed when read).
#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let us = elapsed.as_micros().min(u128::from(u64::MAX)) as u64;
        let bucket = LATENCY_BUCKETS_US
            .iter()
            .position(|&bound| us <= bound)
            .unwrap_or(LATENCY_BUCKETS_US.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Cumulative counts per bucket bound (the last is `+Inf`), the sum in µs and the count.
    pub fn snapshot(&self) -> (Vec<u64>, u64, u64) {
        let mut total = 0;
        let cumulative = self
            .buckets
            .iter()
            .map(|b| {
                total += b.load(Ordering::Relaxed);
                total
            })
            .collect();
        (
            cumulative,
            self.sum_us.load(Ordering::Relaxed),
            self.count.load(Ordering::Relaxed),
        )
    }
}

/// The engine operations counted separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Create,
    Append,
    Read,
    Head,
    Delete,
    Trim,
    Fork,
    Configure,
}

impl OpKind {
    pub const ALL: [OpKind; 8] = [
        OpKind::Create,
        OpKind::Append,
        OpKind::Read,
        OpKind::Head,
        OpKind::Delete,
        OpKind::Trim,
        OpKind::Fork,
        OpKind::Configure,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Create => "create",
            OpKind::Append => "append",
            OpKind::Read => "read",
            OpKind::Head => "head",
            OpKind::Delete => "delete",
            OpKind::Trim => "trim",
            OpKind::Fork => "fork",
            OpKind::Configure => "configure",
        }
    }
}

/// One operation's counters.
#[derive(Default)]
pub struct OpMetrics {
    pub total: AtomicU64,
    pub errors: AtomicU64,
    pub latency: Histogram,
}

/// Everything one core counts.
#[derive(Default)]
pub struct CoreMetrics {
    pub ops: [OpMetrics; OpKind::ALL.len()],
    pub records_appended: AtomicU64,
    pub bytes_appended: AtomicU64,
    pub records_read: AtomicU64,
    pub bytes_read: AtomicU64,
    /// Readers waiting at a stream's tail (long-poll and SSE reads), on the core their
    /// request came in on.
    pub live_waiters: AtomicU64,
    /// Reads parked at the tail of a stream this core owns: one per core and place that
    /// readers wait at, however many wait there (`live.rs`).
    pub live_reads_parked: AtomicU64,
    pub wal_fsyncs: AtomicU64,
    pub wal_fsync_latency: Histogram,
    pub segment_seals: AtomicU64,
    pub uploads: AtomicU64,
    pub upload_failures: AtomicU64,
    pub upload_latency: Histogram,
    /// One segment PUT to the object store (the floor of an object-durability ack).
    pub object_put_latency: Histogram,
    /// One segment's catalog commit, after its turn came (the rest of that floor).
    pub meta_commit_latency: Histogram,
    /// Sealed bytes not yet in the object store.
    pub upload_backlog_bytes: AtomicU64,
    pub meta_commits: AtomicU64,
    /// Reads that met damaged stored bytes (`StorageFault::is_damage`); each is logged,
    /// at most one line per `limits::DAMAGE_LOG_INTERVAL_MS`.
    pub damaged_reads: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    /// Segment buffers and cached blocks held in memory.
    pub memory_bytes: AtomicU64,
    /// Streams this core owns (set on every create and removal).
    pub streams: AtomicU64,
    /// Segments this core knows (open, sealed and uploaded).
    pub segments: AtomicU64,
    /// Whether the core's WAL takes appends (`/ready`, `pico_wal_health`).
    pub wal_health: crate::health::HealthReport,
    /// Records made unreadable by retention (its trims), and streams it deleted (empty).
    pub retention_records: AtomicU64,
    pub retention_deleted_streams: AtomicU64,
    /// Segments garbage collection deleted from the bucket and the catalog (core 0 runs it).
    pub gc_segments_deleted: AtomicU64,
    /// Compaction (object durability): merged objects written, the segments they replaced,
    /// their bytes, the PUTs it made (each within the node's PUT budget) and the compactions
    /// that failed or were refused (nothing lost: the segments stay as they were).
    pub compactions: AtomicU64,
    pub compacted_segments: AtomicU64,
    pub compacted_bytes: AtomicU64,
    pub compaction_puts: AtomicU64,
    pub compaction_failures: AtomicU64,
}

impl CoreMetrics {
    pub fn op(&self, kind: OpKind) -> &OpMetrics {
        &self.ops[kind as usize]
    }

    pub fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }

    pub fn set(gauge: &AtomicU64, value: u64) {
        gauge.store(value, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// Every core's metrics, in core order.
pub type NodeMetrics = Arc<Vec<Arc<CoreMetrics>>>;

/// Decrements a gauge when dropped (a parked reader that leaves for any reason).
pub struct GaugeGuard<'a>(&'a AtomicU64);

impl<'a> GaugeGuard<'a> {
    pub fn enter(gauge: &'a AtomicU64) -> GaugeGuard<'a> {
        gauge.fetch_add(1, Ordering::Relaxed);
        GaugeGuard(gauge)
    }
}

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(40));
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_secs(60));
        let (buckets, sum, count) = h.snapshot();
        assert_eq!(count, 3);
        assert_eq!(sum, 40 + 300 + 60_000_000);
        assert_eq!(buckets[0], 1, "≤ 50 µs");
        assert_eq!(buckets[3], 2, "≤ 500 µs");
        assert_eq!(buckets[LATENCY_BUCKETS_US.len() - 1], 2);
        assert_eq!(*buckets.last().unwrap(), 3, "+Inf holds every sample");
    }

    #[test]
    fn gauge_guards_give_back_what_they_took() {
        let gauge = AtomicU64::new(0);
        {
            let _a = GaugeGuard::enter(&gauge);
            let _b = GaugeGuard::enter(&gauge);
            assert_eq!(CoreMetrics::get(&gauge), 2);
        }
        assert_eq!(CoreMetrics::get(&gauge), 0);
    }
}
