//! HTTP counters per core and the Prometheus text rendering of `/metrics`.
//!
//! Like the engine's, each core writes only its own [`HttpMetrics`]; the admin listener reads
//! them all. Labels are core, protocol, operation and status code: bounded, never per stream.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use pico_engine::metrics::{CoreMetrics, Histogram, NodeMetrics, OpKind, LATENCY_BUCKETS_US};
use pico_engine::{CoreHandle, ReadBatch, ReadRequest};

use crate::admin::usage::StorageUsage;
use crate::config::Protocol;
use crate::transport::message::{Body, LiveBody, LiveEvents, Response};

/// Status codes counted one by one; anything else is counted as `other`.
const STATUS_CODES: [u16; 25] = [
    200, 201, 202, 204, 304, 307, 400, 401, 403, 404, 405, 408, 409, 410, 412, 413, 417, 429, 431,
    500, 501, 502, 503, 505, 507,
];

/// The answers by which the node declines work because of a limit or its own state, not
/// because the request was wrong or the node failed: a body too large (`413`), too much in
/// flight (`429`), a head too large (`431`), unavailable or shedding load (`503`), out of
/// storage (`507`). The dashboard's refusal rate counts these.
pub const REFUSAL_CODES: [u16; 5] = [413, 429, 431, 503, 507];
const PROTOCOLS: [(Protocol, &str); 2] =
    [(Protocol::Pico, "pico"), (Protocol::DurableStreams, "ds")];

/// One core's HTTP counters.
#[derive(Default)]
pub struct HttpMetrics {
    /// `[protocol][status index]`; the last index is `other`.
    responses: [[AtomicU64; STATUS_CODES.len() + 1]; PROTOCOLS.len()],
    /// Open connections on this core (all listeners).
    pub connections: AtomicU64,
    /// SSE responses being streamed.
    pub sse_streams: AtomicU64,
}

impl HttpMetrics {
    /// Counts a response; an event stream also counts as an SSE stream for as long as it lasts.
    pub fn respond(self: &Arc<Self>, protocol: Protocol, mut response: Response) -> Response {
        self.count(protocol, response.status);
        if let Some(live) = response.take_live() {
            response.body = Body::Live(counted(live, self.clone()));
        }
        response
    }
}

/// Responses of every core and protocol, by status code.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResponseCounts {
    /// `(code, count)` of the codes counted one by one, in code order.
    pub by_code: Vec<(u16, u64)>,
    /// Codes not counted one by one.
    pub other: u64,
}

impl ResponseCounts {
    pub fn of(http: &[Arc<HttpMetrics>]) -> ResponseCounts {
        let mut counts = ResponseCounts {
            by_code: STATUS_CODES.iter().map(|&code| (code, 0)).collect(),
            other: 0,
        };
        for metrics in http {
            for per_protocol in &metrics.responses {
                for (s, counter) in per_protocol.iter().enumerate() {
                    let n = counter.load(Ordering::Relaxed);
                    match counts.by_code.get_mut(s) {
                        Some((_, count)) => *count = count.saturating_add(n),
                        None => counts.other = counts.other.saturating_add(n),
                    }
                }
            }
        }
        counts
    }

    fn sum(&self, include: impl Fn(u16) -> bool) -> u64 {
        self.by_code
            .iter()
            .filter(|(code, _)| include(*code))
            .fold(0u64, |sum, (_, n)| sum.saturating_add(*n))
    }

    pub fn total(&self) -> u64 {
        self.sum(|_| true).saturating_add(self.other)
    }

    /// `5xx` answers that are not refusals: the node failed.
    pub fn server_errors(&self) -> u64 {
        self.sum(|code| code >= 500 && !REFUSAL_CODES.contains(&code))
    }

    /// `4xx` answers that are not refusals: the request was wrong (or named nothing).
    pub fn client_errors(&self) -> u64 {
        self.sum(|code| (400..500).contains(&code) && !REFUSAL_CODES.contains(&code))
    }

    /// The refusals, by code (every one of [`REFUSAL_CODES`], zeros included).
    pub fn refusals(&self) -> Vec<(u16, u64)> {
        REFUSAL_CODES
            .iter()
            .map(|&code| (code, self.sum(|c| c == code)))
            .collect()
    }
}

/// Every core's samples of one histogram, added up: `(cumulative buckets, sum µs, count)`.
pub fn merged_histogram<'a>(
    histograms: impl Iterator<Item = &'a Histogram>,
) -> (Vec<u64>, u64, u64) {
    let mut buckets = vec![0u64; LATENCY_BUCKETS_US.len() + 1];
    let (mut sum_us, mut count) = (0u64, 0u64);
    for histogram in histograms {
        let (cumulative, sum, n) = histogram.snapshot();
        for (total, value) in buckets.iter_mut().zip(cumulative) {
            *total = total.saturating_add(value);
        }
        sum_us = sum_us.saturating_add(sum);
        count = count.saturating_add(n);
    }
    (buckets, sum_us, count)
}

thread_local! {
    /// This core's counters, for the answers its connections give without a handler: the
    /// transport's refusals (a body or head too large, a request too slow, no budget left).
    static CORE_HTTP_METRICS: RefCell<Option<Arc<HttpMetrics>>> = const { RefCell::new(None) };
}

impl HttpMetrics {
    /// Makes these the counters of [`count_connection_error`] on the calling core's thread.
    pub fn install_on_this_core(self: &Arc<Self>) {
        CORE_HTTP_METRICS.with(|slot| *slot.borrow_mut() = Some(self.clone()));
    }
}

/// Counts an answer the transport gave in `protocol`'s style (its `connection_error`), on the
/// counters installed on this core; nothing where none are (unit tests). A read answer the
/// transport replaces with the `503` of a full unsent-answers budget was counted when its
/// handler answered, and is counted again as that `503`.
pub fn count_connection_error(protocol: Protocol, status: u16) {
    CORE_HTTP_METRICS.with(|slot| {
        if let Some(metrics) = slot.borrow().as_ref() {
            metrics.count(protocol, status);
        }
    });
}

impl HttpMetrics {
    fn count(&self, protocol: Protocol, status: u16) {
        let p = PROTOCOLS
            .iter()
            .position(|(known, _)| *known == protocol)
            .unwrap_or(0);
        let s = STATUS_CODES
            .iter()
            .position(|&code| code == status)
            .unwrap_or(STATUS_CODES.len());
        self.responses[p][s].fetch_add(1, Ordering::Relaxed);
    }
}

/// Wraps an SSE body so `sse_streams` counts it until the response ends (or the client goes).
fn counted(live: LiveBody, metrics: Arc<HttpMetrics>) -> LiveBody {
    struct Counted {
        inner: LiveBody,
        metrics: Arc<HttpMetrics>,
    }
    impl LiveEvents for Counted {
        fn core(&self) -> &Rc<CoreHandle> {
            self.inner.core()
        }
        fn stream_name(&self) -> &str {
            self.inner.stream_name()
        }
        fn pop_event(&mut self) -> Option<Bytes> {
            self.inner.pop_event()
        }
        fn next_read(&mut self) -> Option<ReadRequest> {
            self.inner.next_read()
        }
        fn answer(&mut self, read: Option<&(ReadBatch, bool)>) {
            self.inner.answer(read)
        }
        fn at_tail(&self) -> bool {
            self.inner.at_tail()
        }
        fn deadline(&self) -> Option<std::time::Instant> {
            self.inner.deadline()
        }
    }
    impl Drop for Counted {
        fn drop(&mut self) {
            self.metrics.sse_streams.fetch_sub(1, Ordering::Relaxed);
        }
    }
    metrics.sse_streams.fetch_add(1, Ordering::Relaxed);
    Box::new(Counted {
        inner: live,
        metrics,
    })
}

/// Totals across cores, for the admin API and the dashboard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoreLoad {
    pub appends: u64,
    pub records_appended: u64,
    pub bytes_appended: u64,
    pub reads: u64,
    pub bytes_read: u64,
    pub streams: u64,
    pub upload_backlog_bytes: u64,
    pub memory_bytes: u64,
    pub connections: u64,
    pub live_waiters: u64,
}

pub fn core_load(engine: &CoreMetrics, http: &HttpMetrics) -> CoreLoad {
    let get = CoreMetrics::get;
    CoreLoad {
        appends: get(&engine.op(OpKind::Append).total),
        records_appended: get(&engine.records_appended),
        bytes_appended: get(&engine.bytes_appended),
        reads: get(&engine.op(OpKind::Read).total),
        bytes_read: get(&engine.bytes_read),
        streams: get(&engine.streams),
        upload_backlog_bytes: get(&engine.upload_backlog_bytes),
        memory_bytes: get(&engine.memory_bytes),
        connections: get(&http.connections),
        live_waiters: get(&engine.live_waiters),
    }
}

/// The Prometheus text exposition of every core's counters.
pub fn render(
    build: crate::config::BuildInfo,
    engine: &NodeMetrics,
    wal_salvaged_files: usize,
    recovered_unstored_files: usize,
    http: &[Arc<HttpMetrics>],
    usage: &StorageUsage,
    uptime_sec: f64,
) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let header = |out: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    let per_core = |out: &mut String,
                    name: &str,
                    kind: &str,
                    help: &str,
                    value: &dyn Fn(&CoreMetrics) -> u64| {
        header(out, name, kind, help);
        for (core, metrics) in engine.iter().enumerate() {
            let _ = writeln!(out, "{name}{{core=\"{core}\"}} {}", value(metrics));
        }
    };
    header(
        &mut out,
        "pico_build_info",
        "gauge",
        "Always 1; its labels say which version and git commit the node runs.",
    );
    let _ = writeln!(
        out,
        "pico_build_info{{version=\"{}\",commit=\"{}\"}} 1",
        build.version, build.commit
    );
    header(
        &mut out,
        "pico_uptime_seconds",
        "gauge",
        "Seconds since the node started.",
    );
    let _ = writeln!(out, "pico_uptime_seconds {uptime_sec:.3}");

    header(
        &mut out,
        "pico_wal_salvaged_files",
        "gauge",
        "Damaged WAL files this run was started past with --wal-salvage (acknowledged records \
         were lost: see /ready and the kept reports).",
    );
    let _ = writeln!(out, "pico_wal_salvaged_files {wal_salvaged_files}");
    header(
        &mut out,
        "pico_recovered_wal_files_unstored",
        "gauge",
        "WAL files recovered at start that the bucket has not taken yet: their records are \
         served from memory, and no newer segment is stored before them.",
    );
    let _ = writeln!(
        out,
        "pico_recovered_wal_files_unstored {recovered_unstored_files}"
    );

    header(
        &mut out,
        "pico_ops_total",
        "counter",
        "Engine operations by core and operation.",
    );
    for (core, metrics) in engine.iter().enumerate() {
        for kind in OpKind::ALL {
            let total = CoreMetrics::get(&metrics.op(kind).total);
            let _ = writeln!(
                out,
                "pico_ops_total{{core=\"{core}\",op=\"{}\"}} {total}",
                kind.name()
            );
        }
    }
    header(
        &mut out,
        "pico_op_errors_total",
        "counter",
        "Engine operations that failed, by core and operation.",
    );
    for (core, metrics) in engine.iter().enumerate() {
        for kind in OpKind::ALL {
            let errors = CoreMetrics::get(&metrics.op(kind).errors);
            let _ = writeln!(
                out,
                "pico_op_errors_total{{core=\"{core}\",op=\"{}\"}} {errors}",
                kind.name()
            );
        }
    }
    header(
        &mut out,
        "pico_op_latency_seconds",
        "histogram",
        "Engine operation latency (live reads excluded), by core and operation.",
    );
    for (core, metrics) in engine.iter().enumerate() {
        for kind in OpKind::ALL {
            let labels = format!("core=\"{core}\",op=\"{}\"", kind.name());
            histogram(
                &mut out,
                "pico_op_latency_seconds",
                &labels,
                &metrics.op(kind).latency,
            );
        }
    }
    per_core(
        &mut out,
        "pico_records_appended_total",
        "counter",
        "Records appended.",
        &|m| CoreMetrics::get(&m.records_appended),
    );
    per_core(
        &mut out,
        "pico_retention_trimmed_records_total",
        "counter",
        "Records made unreadable by streams' retention policies (segments left holding nothing readable are reclaimed by garbage collection).",
        &|m| CoreMetrics::get(&m.retention_records),
    );
    per_core(
        &mut out,
        "pico_retention_deleted_streams_total",
        "counter",
        "Streams deleted by retention (empty and idle past their delete-on-empty time).",
        &|m| CoreMetrics::get(&m.retention_deleted_streams),
    );
    per_core(
        &mut out,
        "pico_gc_segments_deleted_total",
        "counter",
        "Segments garbage collection deleted from the bucket and the catalog (nothing readable left in them: deleted, expired, trimmed or retained-away data).",
        &|m| CoreMetrics::get(&m.gc_segments_deleted),
    );
    for (name, help, counter) in [
        (
            "pico_compactions_total",
            "Merged objects compaction wrote (object durability: small segments of a core merged into one, within the node's PUT budget).",
            (|m: &CoreMetrics| CoreMetrics::get(&m.compactions)) as fn(&CoreMetrics) -> u64,
        ),
        (
            "pico_compacted_segments_total",
            "Segment objects compaction merged into others (retired; garbage collection deletes them after a grace).",
            |m| CoreMetrics::get(&m.compacted_segments),
        ),
        (
            "pico_compacted_bytes_total",
            "Bytes compaction rewrote into merged objects.",
            |m| CoreMetrics::get(&m.compacted_bytes),
        ),
        (
            "pico_compaction_puts_total",
            "PUTs compaction made (each takes a slot of --object-puts-per-second, as flushes do).",
            |m| CoreMetrics::get(&m.compaction_puts),
        ),
        (
            "pico_compaction_failures_total",
            "Compactions that failed or that the catalog refused (the segments stay as they were; nothing is lost).",
            |m| CoreMetrics::get(&m.compaction_failures),
        ),
    ] {
        per_core(&mut out, name, "counter", help, &counter);
    }
    per_core(
        &mut out,
        "pico_bytes_appended_total",
        "counter",
        "Record body bytes appended.",
        &|m| CoreMetrics::get(&m.bytes_appended),
    );
    per_core(
        &mut out,
        "pico_records_read_total",
        "counter",
        "Records returned by reads.",
        &|m| CoreMetrics::get(&m.records_read),
    );
    per_core(
        &mut out,
        "pico_bytes_read_total",
        "counter",
        "Record body bytes returned by reads.",
        &|m| CoreMetrics::get(&m.bytes_read),
    );
    per_core(
        &mut out,
        "pico_live_waiters",
        "gauge",
        "Readers waiting at a stream's tail (long-poll, SSE).",
        &|m| CoreMetrics::get(&m.live_waiters),
    );
    per_core(
        &mut out,
        "pico_live_reads_parked",
        "gauge",
        "Reads parked at the tail of a stream this core owns: the readers of one core waiting \
         at one place share one.",
        &|m| CoreMetrics::get(&m.live_reads_parked),
    );
    per_core(
        &mut out,
        "pico_wal_health",
        "gauge",
        "Whether the core's WAL takes appends: 0 ok, 1 degraded (its next file cannot be made, \
         usually a full disk; retried), 2 failed (no appends until a restart).",
        &|m| m.wal_health.state() as u64,
    );
    per_core(
        &mut out,
        "pico_wal_fsyncs_total",
        "counter",
        "WAL group commits (one durable write each: RWF_DSYNC, as a write and an fdatasync).",
        &|m| CoreMetrics::get(&m.wal_fsyncs),
    );
    header(
        &mut out,
        "pico_wal_fsync_latency_seconds",
        "histogram",
        "Latency of a WAL group commit's durable write (the write and the device's flush).",
    );
    for (core, metrics) in engine.iter().enumerate() {
        histogram(
            &mut out,
            "pico_wal_fsync_latency_seconds",
            &format!("core=\"{core}\""),
            &metrics.wal_fsync_latency,
        );
    }
    per_core(
        &mut out,
        "pico_segment_seals_total",
        "counter",
        "Segments sealed for upload.",
        &|m| CoreMetrics::get(&m.segment_seals),
    );
    per_core(
        &mut out,
        "pico_uploads_total",
        "counter",
        "Segments stored in the object store and committed to the catalog.",
        &|m| CoreMetrics::get(&m.uploads),
    );
    per_core(
        &mut out,
        "pico_damaged_reads_total",
        "counter",
        "Reads that found stored bytes damaged (a frame failing its CRC, an object shorter \
         than the catalog says); the node's log names the stream, offset and object.",
        &|m| CoreMetrics::get(&m.damaged_reads),
    );
    per_core(
        &mut out,
        "pico_upload_failures_total",
        "counter",
        "Failed upload attempts (each is retried).",
        &|m| CoreMetrics::get(&m.upload_failures),
    );
    header(
        &mut out,
        "pico_upload_latency_seconds",
        "histogram",
        "Seal to committed upload, retries included.",
    );
    for (core, metrics) in engine.iter().enumerate() {
        histogram(
            &mut out,
            "pico_upload_latency_seconds",
            &format!("core=\"{core}\""),
            &metrics.upload_latency,
        );
    }
    for (name, help, pick) in [
        (
            "pico_object_put_latency_seconds",
            "One segment PUT to the object store, per attempt that succeeded.",
            (|m: &CoreMetrics| &m.object_put_latency) as fn(&CoreMetrics) -> &Histogram,
        ),
        (
            "pico_meta_commit_latency_seconds",
            "One segment's catalog commit, from its turn (seal order) to committed.",
            |m: &CoreMetrics| &m.meta_commit_latency,
        ),
    ] {
        header(&mut out, name, "histogram", help);
        for (core, metrics) in engine.iter().enumerate() {
            histogram(&mut out, name, &format!("core=\"{core}\""), pick(metrics));
        }
    }
    per_core(
        &mut out,
        "pico_upload_backlog_bytes",
        "gauge",
        "Sealed bytes not yet in the object store.",
        &|m| CoreMetrics::get(&m.upload_backlog_bytes),
    );
    per_core(
        &mut out,
        "pico_meta_commits_total",
        "counter",
        "Segment commits to the metadata log.",
        &|m| CoreMetrics::get(&m.meta_commits),
    );
    per_core(
        &mut out,
        "pico_cache_hits_total",
        "counter",
        "Reads of uploaded segments served from the block cache.",
        &|m| CoreMetrics::get(&m.cache_hits),
    );
    per_core(
        &mut out,
        "pico_cache_misses_total",
        "counter",
        "Block cache misses (ranged GETs).",
        &|m| CoreMetrics::get(&m.cache_misses),
    );
    per_core(
        &mut out,
        "pico_memory_bytes",
        "gauge",
        "Segment buffers and cached blocks in memory.",
        &|m| CoreMetrics::get(&m.memory_bytes),
    );
    per_core(
        &mut out,
        "pico_streams",
        "gauge",
        "Streams owned by the core.",
        &|m| CoreMetrics::get(&m.streams),
    );
    per_core(
        &mut out,
        "pico_segments",
        "gauge",
        "Segments known to the core.",
        &|m| CoreMetrics::get(&m.segments),
    );

    header(
        &mut out,
        "pico_disk_bytes",
        "gauge",
        "Bytes the node's files take on its disk (allocated, as du counts), by dir: wal (the \
         WAL directory with the node's state files) and meta (the SQLite catalog). Measured \
         every few seconds; absent until measured.",
    );
    for (dir, bytes) in [("wal", usage.wal_bytes), ("meta", usage.meta_bytes)] {
        if let Some(bytes) = bytes {
            let _ = writeln!(out, "pico_disk_bytes{{dir=\"{dir}\"}} {bytes}");
        }
    }
    // Each family's samples follow its own header (the text format groups them).
    for (name, help, value) in [
        (
            "pico_bucket_bytes",
            "Bytes of the segment objects the catalog lists in the bucket (cluster-wide with a \
             shared catalog; garbage not yet collected included). Measured every few seconds.",
            usage.bucket.map(|b| b.bytes),
        ),
        (
            "pico_bucket_segments",
            "Segment objects the catalog lists in the bucket.",
            usage.bucket.map(|b| b.segments),
        ),
    ] {
        header(&mut out, name, "gauge", help);
        if let Some(value) = value {
            let _ = writeln!(out, "{name} {value}");
        }
    }

    header(
        &mut out,
        "pico_http_responses_total",
        "counter",
        "HTTP responses by core, protocol and status code.",
    );
    for (core, metrics) in http.iter().enumerate() {
        for (p, (_, protocol)) in PROTOCOLS.iter().enumerate() {
            for (s, counter) in metrics.responses[p].iter().enumerate() {
                let count = counter.load(Ordering::Relaxed);
                if count == 0 {
                    continue;
                }
                let code = STATUS_CODES
                    .get(s)
                    .map_or("other".to_string(), u16::to_string);
                let _ = writeln!(out, "pico_http_responses_total{{core=\"{core}\",protocol=\"{protocol}\",code=\"{code}\"}} {count}");
            }
        }
    }
    header(
        &mut out,
        "pico_http_connections",
        "gauge",
        "Open HTTP connections.",
    );
    for (core, metrics) in http.iter().enumerate() {
        let _ = writeln!(
            out,
            "pico_http_connections{{core=\"{core}\"}} {}",
            metrics.connections.load(Ordering::Relaxed)
        );
    }
    header(
        &mut out,
        "pico_connection_panics_total",
        "counter",
        "Panics caught while serving a connection or request (each closed it; the core served on).",
    );
    let _ = writeln!(
        out,
        "pico_connection_panics_total {}",
        crate::panics::CONNECTION_PANICS.load(Ordering::Relaxed)
    );
    header(
        &mut out,
        "pico_sse_streams",
        "gauge",
        "Server-sent event responses in progress.",
    );
    for (core, metrics) in http.iter().enumerate() {
        let _ = writeln!(
            out,
            "pico_sse_streams{{core=\"{core}\"}} {}",
            metrics.sse_streams.load(Ordering::Relaxed)
        );
    }
    header(
        &mut out,
        "pico_sse_parked",
        "gauge",
        "Server-sent event responses waiting at the tail of a plain HTTP/1.1 connection, held by their core without a task (also counted in pico_sse_streams).",
    );
    let _ = writeln!(
        out,
        "pico_sse_parked {}",
        crate::transport::http1::PARKED_SUBSCRIBERS.load(Ordering::Relaxed)
    );
    out
}

fn histogram(out: &mut String, name: &str, labels: &str, histogram: &Histogram) {
    let (buckets, sum_us, count) = histogram.snapshot();
    for (i, cumulative) in buckets.iter().enumerate() {
        let le = LATENCY_BUCKETS_US
            .get(i)
            .map_or("+Inf".to_string(), |us| format!("{}", *us as f64 / 1e6));
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", sum_us as f64 / 1e6);
    let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
}

#[cfg(test)]
mod tests;
