//! The state the tasks of one run share (stop signal, counters, latency histograms, first
//! error) and the clock: warmup, progress lines, the measured window.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tokio::sync::watch;

use crate::args::{BenchArgs, Output};
use crate::report::{self, Latency, Throughput};

/// State shared by the tasks of one run.
pub(crate) struct Shared {
    stop: watch::Sender<bool>,
    error: Mutex<Option<String>>,
    write_records: AtomicU64,
    write_bytes: AtomicU64,
    read_records: AtomicU64,
    read_bytes: AtomicU64,
    /// Append latency (µs): per request, per record in producer mode.
    pub(crate) hist: Mutex<Histogram<u64>>,
    /// Send-to-delivery latency (µs) of `--live-latency`.
    pub(crate) live_hist: Mutex<Histogram<u64>>,
    /// Acknowledgement-to-delivery latency (µs) of `--live-latency` (0 when the reader had the
    /// record before the writer had its acknowledgement).
    pub(crate) after_ack_hist: Mutex<Histogram<u64>>,
}

/// Counters at one instant.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counters {
    pub write: Throughput,
    pub read: Throughput,
}

impl Counters {
    fn minus(self, earlier: Counters) -> Counters {
        let sub = |a: Throughput, b: Throughput| Throughput {
            bytes: a.bytes.saturating_sub(b.bytes),
            records: a.records.saturating_sub(b.records),
        };
        Counters {
            write: sub(self.write, earlier.write),
            read: sub(self.read, earlier.read),
        }
    }
}

impl Shared {
    pub(crate) fn new() -> Arc<Shared> {
        Arc::new(Shared {
            stop: watch::channel(false).0,
            error: Mutex::new(None),
            write_records: AtomicU64::new(0),
            write_bytes: AtomicU64::new(0),
            read_records: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            hist: Mutex::new(report::new_histogram()),
            live_hist: Mutex::new(report::new_histogram()),
            after_ack_hist: Mutex::new(report::new_histogram()),
        })
    }

    pub(crate) fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    pub(crate) fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// Resolves once the run is stopping.
    pub(crate) async fn until_stopped(&self) {
        let mut rx = self.stop.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Keeps the first error and stops everything.
    pub(crate) fn fail(&self, message: String) {
        let mut error = self.error.lock().unwrap_or_else(|e| e.into_inner());
        if error.is_none() {
            *error = Some(message);
        }
        drop(error);
        self.stop();
    }

    pub(crate) fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn record_write(&self, records: u64, bytes: u64, micros: Option<u64>) {
        self.write_records.fetch_add(records, Ordering::Relaxed);
        self.write_bytes.fetch_add(bytes, Ordering::Relaxed);
        if let Some(us) = micros {
            report::record_us(&mut self.hist.lock().unwrap_or_else(|e| e.into_inner()), us);
        }
    }

    pub(crate) fn record_read(&self, records: u64, bytes: u64) {
        self.read_records.fetch_add(records, Ordering::Relaxed);
        self.read_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn record_live(&self, micros: u64) {
        report::record_us(
            &mut self.live_hist.lock().unwrap_or_else(|e| e.into_inner()),
            micros,
        );
    }

    pub(crate) fn record_after_ack(&self, micros: u64) {
        report::record_us(
            &mut self
                .after_ack_hist
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
            micros,
        );
    }

    fn counters(&self) -> Counters {
        Counters {
            write: Throughput {
                bytes: self.write_bytes.load(Ordering::Relaxed),
                records: self.write_records.load(Ordering::Relaxed),
            },
            read: Throughput {
                bytes: self.read_bytes.load(Ordering::Relaxed),
                records: self.read_records.load(Ordering::Relaxed),
            },
        }
    }

    /// End of warmup: counters and histograms start over.
    fn reset(&self) {
        for c in [
            &self.write_records,
            &self.write_bytes,
            &self.read_records,
            &self.read_bytes,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        for hist in [&self.hist, &self.live_hist, &self.after_ack_hist] {
            hist.lock().unwrap_or_else(|e| e.into_inner()).reset();
        }
    }

    fn latency(&self, hist: &Mutex<Histogram<u64>>) -> Latency {
        Latency::of(&hist.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// What the measured window saw.
pub(crate) struct Window {
    pub elapsed_sec: f64,
    pub counters: Counters,
    pub append_latency: Latency,
    pub live_latency: Latency,
    pub after_ack_latency: Latency,
}

/// Runs warmup (then resets), prints progress lines, and stops everything at the end of the
/// measured window (or at the first error). Progress percentiles are those of the append
/// latency, or of the delivery latency with `live`.
pub(crate) async fn clock(shared: &Shared, args: &BenchArgs, live: bool) -> Window {
    let text = args.output == Output::Text;
    if args.warmup > 0 {
        let end = Instant::now() + Duration::from_secs(args.warmup);
        sleep_until_or_stop(shared, end).await;
        shared.reset();
        if text && !shared.stopped() {
            eprintln!("warmup of {}s discarded", args.warmup);
        }
    }
    let start = Instant::now();
    let deadline = start + Duration::from_secs(args.duration);
    let interval = (args.interval > 0.0).then(|| Duration::from_secs_f64(args.interval));
    let mut last = (start, Counters::default());
    let mut next_tick = interval.map(|i| start + i);
    loop {
        let wake = next_tick.map_or(deadline, |t| t.min(deadline));
        sleep_until_or_stop(shared, wake).await;
        let now = Instant::now();
        if shared.stopped() {
            break;
        }
        if let (Some(tick), Some(step)) = (next_tick, interval) {
            if now >= tick {
                let current = shared.counters();
                let delta = current.minus(last.1);
                let secs = now.duration_since(last.0).as_secs_f64();
                if text {
                    eprintln!(
                        "{}",
                        report::progress_line(
                            now.duration_since(start).as_secs_f64(),
                            delta.write,
                            delta.read,
                            secs,
                            &shared.latency(if live {
                                &shared.live_hist
                            } else {
                                &shared.hist
                            }),
                        )
                    );
                }
                last = (now, current);
                next_tick = Some(tick + step);
            }
        }
        if now >= deadline {
            break;
        }
    }
    // The window closes here: later acknowledgements are not counted.
    let window = Window {
        elapsed_sec: start.elapsed().as_secs_f64(),
        counters: shared.counters(),
        append_latency: shared.latency(&shared.hist),
        live_latency: shared.latency(&shared.live_hist),
        after_ack_latency: shared.latency(&shared.after_ack_hist),
    };
    shared.stop();
    window
}

pub(super) async fn sleep_until_or_stop(shared: &Shared, at: Instant) {
    tokio::select! {
        _ = tokio::time::sleep_until(at.into()) => {}
        _ = shared.until_stopped() => {}
    }
}
