//! `--fan-out N`: N live subscribers on one stream, one writer.
//!
//! Every subscriber is its own HTTP/1.1 connection following the stream live (`--live-mode`
//! sse or long-poll, either protocol). The writer appends one record every
//! `--append-interval-ms`; each record's body is `f<seq>:<µs>;` (padded with `x` to
//! `--record-size`), the record's number and the instant just before its append was sent, in
//! microseconds since the run started: writer and subscribers share this process's clock, so
//! append-to-delivery latency needs no server cooperation and no offsets. Each subscriber
//! checks that it sees 0, 1, 2, ... in order (a gap is a miss, a repeat a duplicate).
//!
//! The subscribers speak HTTP/1.1 on raw sockets ([`http1`]): a generic client per
//! connection costs more client CPU per event than the server under test spends, and the
//! client must not be what is measured. Per subscriber it keeps one read buffer, a few
//! counters and the token scanner's state; nothing is allocated per event.

mod http1;
mod scan;

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use reqwest::header::CONTENT_TYPE;
use reqwest::StatusCode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::args::{BenchArgs, LiveMode, Output};
use crate::load;
use crate::report::{self, FanOutSummary, Latency, Summary, Throughput};
use crate::wire::{self, REQUEST_TIMEOUT};
use crate::{Connection, Protocol};

use scan::{Delivery, KeyCapture, TokenScanner};

/// Connection attempts in flight at once: more overflow the server's accept backlog, and
/// the refused ones then wait out a SYN retransmit (a second or more).
const CONNECTS_IN_FLIGHT_MAX: usize = 256;
/// Initial capacity of a subscriber's read buffer.
const READ_BUFFER_BYTES: usize = 4096;
/// How long the run waits for every subscriber to be connected before it starts writing.
const CONNECT_PHASE_MAX: Duration = Duration::from_secs(120);
/// Wait after the last subscriber is connected, so its request is parked on the server
/// before the first append.
const SETTLE: Duration = Duration::from_millis(500);
/// After the last append, how long subscribers may take to catch up before the run ends.
const DRAIN_MAX: Duration = Duration::from_secs(10);
/// Pause before a subscriber retries after an error (a refused connection, a `429`).
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// Latency histograms the subscribers record into (by index), merged at the end: one lock
/// for 10,000 subscribers would be contended on every event.
const HISTOGRAM_SHARDS: usize = 16;
/// File descriptors kept for the writer, the runtime and stdio beyond one per subscriber.
const SPARE_FDS: u64 = 64;

/// One subscriber's counters, published after every read (one task writes each).
#[derive(Default)]
struct SubCounters {
    /// Records seen in order (0, 1, ... without a gap or repeat): the next expected is this.
    next_seq: AtomicU64,
    /// Distinct records delivered (in order, or past a gap).
    delivered: AtomicU64,
    duplicates: AtomicU64,
    /// Records skipped: a record arrived before one that was never delivered.
    gaps: AtomicU64,
    /// Requests that failed (connect, I/O, an error status); each is retried.
    errors: AtomicU64,
}

/// What every subscriber task shares.
struct Ctx {
    addr: SocketAddr,
    host: String,
    path: String,
    protocol: Protocol,
    mode: LiveMode,
    authorization: Option<String>,
    start: Instant,
    subs: Vec<SubCounters>,
    hists: Vec<Mutex<Histogram<u64>>>,
    /// Subscribers whose first request is in (long-poll) or answered (SSE).
    connected: AtomicUsize,
    connect_gate: Semaphore,
    /// The first error a subscriber saw, for the summary.
    first_error: Mutex<Option<String>>,
    stopping: AtomicBool,
}

impl Ctx {
    fn note_error(&self, index: usize, message: String) {
        self.subs[index].errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_error.lock().unwrap_or_else(|e| e.into_inner());
        if first.is_none() {
            *first = Some(message);
        }
    }

    fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }
}

/// Where a subscriber resumes: the Pico sequence, or the Durable Streams offset and cursor.
struct Position {
    next_seq: u64,
    ds_offset: String,
    cursor: Option<String>,
}

pub(crate) async fn run(args: &BenchArgs, conn: &Connection) -> Result<Summary, String> {
    let base = conn.base()?;
    let subscribers = args.fan_out;
    let text = args.output == Output::Text;
    let fd_limit = raise_fd_limit();
    let fds_needed = subscribers as u64 + SPARE_FDS;
    if fd_limit < fds_needed && text {
        eprintln!(
            "warning: file descriptors are limited to {fd_limit} (hard limit): at most about {} of the {subscribers} subscribers can connect",
            fd_limit.saturating_sub(SPARE_FDS)
        );
    }
    let url = reqwest::Url::parse(&base).map_err(|e| format!("invalid endpoint: {e}"))?;
    if url.scheme() != "http" {
        return Err("--fan-out speaks cleartext HTTP/1.1 only: use an http:// endpoint".into());
    }
    let host = url.host_str().unwrap_or("127.0.0.1").to_owned();
    let port = url.port_or_known_default().unwrap_or(80);
    let addr = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("cannot resolve {host}"))?;
    let writer = wire::build_client(conn, Some(REQUEST_TIMEOUT))?;
    let names = crate::stream_names(1);
    let name = names[0].clone();
    load::create_streams(&writer, &base, &names, TEXT_PLAIN).await?;
    if text {
        eprintln!(
            "created 1 stream for {} fan-out bench: {subscribers} {} subscribers",
            conn.protocol.name(),
            args.live_mode.name()
        );
    }
    let ctx = Arc::new(Ctx {
        addr,
        host: format!("{host}:{port}"),
        path: name.clone(),
        protocol: conn.protocol,
        mode: args.live_mode,
        authorization: conn.token.as_ref().map(|t| format!("Bearer {t}")),
        start: Instant::now(),
        subs: (0..subscribers).map(|_| SubCounters::default()).collect(),
        hists: (0..HISTOGRAM_SHARDS)
            .map(|_| Mutex::new(report::new_histogram()))
            .collect(),
        connected: AtomicUsize::new(0),
        connect_gate: Semaphore::new(CONNECTS_IN_FLIGHT_MAX),
        first_error: Mutex::new(None),
        stopping: AtomicBool::new(false),
    });
    let rss_before = args.server_pid.and_then(rss_bytes);
    let tasks: Vec<_> = (0..subscribers)
        .map(|i| tokio::spawn(subscribe(ctx.clone(), i)))
        .collect();
    let connect_started = Instant::now();
    let mut last_print = connect_started;
    while ctx.connected.load(Ordering::Relaxed) < subscribers
        && connect_started.elapsed() < CONNECT_PHASE_MAX
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if text && last_print.elapsed() >= Duration::from_secs(1) {
            last_print = Instant::now();
            eprintln!(
                "connecting: {} of {subscribers}",
                ctx.connected.load(Ordering::Relaxed)
            );
        }
    }
    let connected = ctx.connected.load(Ordering::Relaxed);
    let connect_sec = connect_started.elapsed().as_secs_f64();
    tokio::time::sleep(SETTLE).await;
    let rss_after = args.server_pid.and_then(rss_bytes);
    if text {
        eprintln!("{connected} of {subscribers} subscribers connected in {connect_sec:.1}s");
    }

    let cpu_before = cpu_time();
    let window_start = Instant::now();
    let written = write_every(&ctx, &writer, &base, &name, args).await;
    let elapsed_sec = window_start.elapsed().as_secs_f64();
    let (records, append_hist, write_error) = written;
    let drain_start = Instant::now();
    while drain_start.elapsed() < DRAIN_MAX
        && ctx
            .subs
            .iter()
            .any(|s| s.next_seq.load(Ordering::Relaxed) < records)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let busy_sec = window_start.elapsed().as_secs_f64();
    let cpu_sec = cpu_time() - cpu_before;
    ctx.stopping.store(true, Ordering::Relaxed);
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        let _ = task.await;
    }
    if !args.keep {
        load::delete_streams(&writer, &base, &names).await;
    }
    if let Some(error) = write_error {
        return Err(error);
    }
    let mut latency = report::new_histogram();
    for hist in &ctx.hists {
        let hist = hist.lock().unwrap_or_else(|e| e.into_inner());
        latency
            .add(&*hist)
            .expect("histograms with the same bounds");
    }
    let tally = Tally::of(&ctx.subs, records);
    let fan_out = FanOutSummary {
        mode: args.live_mode.name(),
        subscribers,
        connected,
        connect_sec,
        records,
        complete: tally.complete,
        delivered_min: tally.delivered_min,
        delivered_max: tally.delivered_max,
        missed: tally.missed,
        duplicates: tally.duplicates,
        errors: tally.errors,
        first_error: ctx
            .first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone(),
        latency: Latency::of(&latency),
        client_cpu_percent: if busy_sec > 0.0 {
            100.0 * cpu_sec / busy_sec
        } else {
            0.0
        },
        server_rss_growth_bytes: rss_before.zip(rss_after).map(|(b, a)| a as i64 - b as i64),
    };
    let record_size = args.record_size.max(scan::TOKEN_BYTES_MAX);
    Ok(Summary {
        protocol: conn.protocol,
        record_size,
        batch: 1,
        in_flight: 1,
        streams: 1,
        connections: subscribers + 1,
        elapsed_sec,
        write: Throughput {
            bytes: records * record_size as u64,
            records,
        },
        append_latency: Latency::of(&append_hist),
        read: Some(Throughput {
            bytes: tally.delivered_total * record_size as u64,
            records: tally.delivered_total,
        }),
        live: None,
        fan_out: Some(fan_out),
    })
}

/// Type of the fan-out stream: records are ASCII, so both protocols deliver them as text
/// (Pico JSON `body`, Durable Streams SSE without base64).
const TEXT_PLAIN: &str = "text/plain";

/// What the subscribers' counters add up to, given `records` written.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    /// Subscribers that got every record, in order, once.
    complete: usize,
    delivered_min: u64,
    delivered_max: u64,
    delivered_total: u64,
    /// Records some subscriber never got, summed over subscribers.
    missed: u64,
    duplicates: u64,
    errors: u64,
}

impl Tally {
    fn of(subs: &[SubCounters], records: u64) -> Tally {
        let mut tally = Tally {
            delivered_min: if subs.is_empty() { 0 } else { u64::MAX },
            ..Tally::default()
        };
        for sub in subs {
            let delivered = sub.delivered.load(Ordering::Relaxed);
            let duplicates = sub.duplicates.load(Ordering::Relaxed);
            let gaps = sub.gaps.load(Ordering::Relaxed);
            tally.delivered_min = tally.delivered_min.min(delivered);
            tally.delivered_max = tally.delivered_max.max(delivered);
            tally.delivered_total += delivered;
            tally.missed += records.saturating_sub(delivered);
            tally.duplicates += duplicates;
            tally.errors += sub.errors.load(Ordering::Relaxed);
            if delivered == records && duplicates == 0 && gaps == 0 {
                tally.complete += 1;
            }
        }
        tally
    }
}

/// The record body of append `seq` sent at `sent_us`: the token, padded to `size`.
fn record_body(seq: u64, sent_us: u64, size: usize) -> Vec<u8> {
    let mut body = format!("f{seq}:{sent_us};").into_bytes();
    if body.len() < size {
        body.resize(size, b'x');
    }
    body
}

/// Appends one record every `--append-interval-ms` for `--duration` seconds, one at a time;
/// returns the records acknowledged, their append latency, and the error that stopped it.
async fn write_every(
    ctx: &Ctx,
    client: &reqwest::Client,
    base: &str,
    name: &str,
    args: &BenchArgs,
) -> (u64, Histogram<u64>, Option<String>) {
    let url = format!("{base}{name}");
    let mut hist = report::new_histogram();
    let mut ticks = tokio::time::interval(Duration::from_millis(args.append_interval_ms));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let end = Instant::now() + Duration::from_secs(args.duration);
    let mut seq = 0u64;
    let mut last_print = Instant::now();
    let text = args.output == Output::Text;
    loop {
        ticks.tick().await;
        if Instant::now() >= end {
            return (seq, hist, None);
        }
        let sent_us = ctx.now_us();
        let body = record_body(seq, sent_us, args.record_size);
        let (content_type, body, ok) = match ctx.protocol {
            Protocol::Pico => (
                wire::BATCH_CONTENT_TYPE,
                pico_proto::batch::encode_bodies(&[&body[..]])
                    .expect("a record of at most --record-size bytes"),
                StatusCode::OK,
            ),
            Protocol::DurableStreams => (TEXT_PLAIN, body.into(), StatusCode::NO_CONTENT),
        };
        let outcome = client
            .post(&url)
            .header(CONTENT_TYPE, content_type)
            .body(body)
            .send()
            .await;
        let what = format!("append to {name}");
        match outcome {
            Ok(resp) if resp.status() == ok || resp.status() == StatusCode::OK => {
                let _ = resp.bytes().await;
                report::record_us(&mut hist, ctx.now_us().saturating_sub(sent_us));
                seq += 1;
            }
            Ok(resp) => return (seq, hist, Some(wire::status_error(&what, resp).await)),
            Err(e) => return (seq, hist, Some(format!("{what}: {}", wire::describe(&e)))),
        }
        if text && last_print.elapsed() >= Duration::from_secs(1) {
            last_print = Instant::now();
            let behind = ctx
                .subs
                .iter()
                .filter(|s| s.next_seq.load(Ordering::Relaxed) + 1 < seq)
                .count();
            let mut merged = report::new_histogram();
            for h in &ctx.hists {
                let _ = merged.add(&*h.lock().unwrap_or_else(|e| e.into_inner()));
            }
            let lat = Latency::of(&merged);
            eprintln!(
                "[{:5.1}s] appended {seq} | subscribers behind by 2+: {behind} | delivery p50 {:.2}ms p99 {:.2}ms max {:.2}ms",
                ctx.start.elapsed().as_secs_f64(),
                lat.p50_ms,
                lat.p99_ms,
                lat.max_ms
            );
        }
    }
}

/// One subscriber: follows the stream until aborted, reconnecting after an error or the end
/// of a response.
async fn subscribe(ctx: Arc<Ctx>, index: usize) {
    let sub = &ctx.subs[index];
    let hist = &ctx.hists[index % HISTOGRAM_SHARDS];
    let mut pos = Position {
        next_seq: 0,
        ds_offset: "-1".to_owned(),
        cursor: None,
    };
    let mut delivery = Delivery::default();
    let mut buf: Vec<u8> = Vec::with_capacity(READ_BUFFER_BYTES);
    let mut request: Vec<u8> = Vec::with_capacity(256);
    let mut kept: Option<TcpStream> = None;
    let mut counted_connected = false;
    loop {
        let mut stream = match kept.take() {
            Some(stream) => stream,
            None => {
                let permit = ctx.connect_gate.acquire().await;
                let connected = TcpStream::connect(ctx.addr).await;
                drop(permit);
                match connected {
                    Ok(stream) => {
                        let _ = stream.set_nodelay(true);
                        stream
                    }
                    Err(e) => {
                        ctx.note_error(index, format!("connect to {}: {e}", ctx.addr));
                        tokio::time::sleep(RETRY_PAUSE).await;
                        continue;
                    }
                }
            }
        };
        buf.clear();
        request.clear();
        write_request(&ctx, &pos, &mut request);
        if let Err(e) = stream.write_all(&request).await {
            ctx.note_error(index, format!("send a live read: {e}"));
            tokio::time::sleep(RETRY_PAUSE).await;
            continue;
        }
        if ctx.mode == LiveMode::LongPoll && !counted_connected {
            counted_connected = true;
            ctx.connected.fetch_add(1, Ordering::Relaxed);
        }
        let head = match http1::read_head(&mut stream, &mut buf).await {
            Ok(head) => head,
            Err(e) => {
                if !ctx.stopping.load(Ordering::Relaxed) {
                    ctx.note_error(index, e);
                }
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
        };
        if !counted_connected {
            counted_connected = true;
            ctx.connected.fetch_add(1, Ordering::Relaxed);
        }
        let ok = head.status == 200 || head.status == 204;
        let mut scanner = TokenScanner::default();
        let mut offset_capture = KeyCapture::new(DS_NEXT_OFFSET_KEY);
        let want_offset = ctx.protocol == Protocol::DurableStreams && ctx.mode == LiveMode::Sse;
        let mut error_body: Vec<u8> = Vec::new();
        let body = http1::read_body(&mut stream, &mut buf, head.framing, |payload, now| {
            if !ok {
                let room = ERROR_BODY_BYTES_MAX.saturating_sub(error_body.len());
                error_body.extend_from_slice(&payload[..payload.len().min(room)]);
                return;
            }
            let now_us = now.duration_since(ctx.start).as_micros() as u64;
            scanner.feed(payload, |seq, sent_us| {
                if delivery.deliver(seq) {
                    report::record_us(
                        &mut hist.lock().unwrap_or_else(|e| e.into_inner()),
                        now_us.saturating_sub(sent_us),
                    );
                }
            });
            if want_offset {
                offset_capture.feed(payload);
            }
            delivery.publish(sub);
        })
        .await;
        if !ok {
            let text = String::from_utf8_lossy(&error_body);
            ctx.note_error(
                index,
                wire::error_message("live read", head.status, text.trim()),
            );
            tokio::time::sleep(RETRY_PAUSE).await;
            continue;
        }
        // Where the next request starts.
        pos.next_seq = delivery.next_seq;
        match ctx.protocol {
            Protocol::Pico => {
                if let Some(next) = head.pico_next_seq {
                    pos.next_seq = pos.next_seq.max(next);
                }
            }
            Protocol::DurableStreams => {
                match offset_capture.take().or(head.ds_next_offset.clone()) {
                    Some(offset) => pos.ds_offset = offset,
                    // Without it the next request asks for the same records again, as fast
                    // as they come: a node answering the Pico protocol does that.
                    None if head.status == 200 && !ctx.stopping.load(Ordering::Relaxed) => {
                        ctx.note_error(index, NO_NEXT_OFFSET.to_owned());
                        tokio::time::sleep(RETRY_PAUSE).await;
                        continue;
                    }
                    None => {}
                }
            }
        }
        if head.cursor.is_some() {
            pos.cursor = head.cursor.clone();
        }
        match body {
            Ok(()) if head.keep_alive && buf.is_empty() => kept = Some(stream),
            Ok(()) => {}
            Err(e) => {
                if !ctx.stopping.load(Ordering::Relaxed) {
                    ctx.note_error(index, e);
                }
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}

/// A Durable Streams live read answered without saying where to resume.
const NO_NEXT_OFFSET: &str = "a live read was answered without Stream-Next-Offset: is the \
     server speaking the Durable Streams protocol (`pico serve --protocol ds`)?";
/// Bytes of an error response's body kept for the message.
const ERROR_BODY_BYTES_MAX: usize = 512;
/// The field of a Durable Streams SSE `control` event that names where to resume.
const DS_NEXT_OFFSET_KEY: &[u8] = b"\"streamNextOffset\":\"";

/// The live read request from `pos` (HTTP/1.1, keep-alive).
fn write_request(ctx: &Ctx, pos: &Position, out: &mut Vec<u8>) {
    use std::io::Write;
    let _ = write!(out, "GET {}?", ctx.path);
    match (ctx.protocol, ctx.mode) {
        (Protocol::Pico, LiveMode::Sse) => {
            let _ = write!(out, "live=sse&seq={}", pos.next_seq);
        }
        (Protocol::Pico, LiveMode::LongPoll) => {
            let _ = write!(out, "live=long-poll&format=json&seq={}", pos.next_seq);
        }
        (Protocol::DurableStreams, mode) => {
            let _ = write!(out, "live={}&offset=", mode.name());
            percent_encode_into(&pos.ds_offset, out);
        }
    }
    if ctx.mode == LiveMode::LongPoll {
        if let Some(cursor) = &pos.cursor {
            out.extend_from_slice(b"&cursor=");
            percent_encode_into(cursor, out);
        }
    }
    let _ = write!(out, " HTTP/1.1\r\nHost: {}\r\n", ctx.host);
    if ctx.mode == LiveMode::Sse {
        out.extend_from_slice(b"Accept: text/event-stream\r\n");
    }
    if let Some(auth) = &ctx.authorization {
        let _ = write!(out, "Authorization: {auth}\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Query-component encoding of an offset or cursor (both are normally digits, `_` and `-`).
fn percent_encode_into(value: &str, out: &mut Vec<u8>) {
    for &b in value.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the limit now in force.
fn raise_fd_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by reference.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return raised.rlim_cur;
            }
        }
    }
    limit.rlim_cur
}

/// User + system CPU seconds of this process so far.
fn cpu_time() -> f64 {
    // SAFETY: a zeroed rusage is a valid value; getrusage fills it in.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return 0.0;
        }
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// Resident set size of process `pid` (`VmRSS` of `/proc/<pid>/status`), if readable.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_bodies_carry_their_token_and_are_padded() {
        assert_eq!(record_body(7, 1234, 0), b"f7:1234;");
        let padded = record_body(7, 1234, 12);
        assert_eq!(padded, b"f7:1234;xxxx");
        let mut scanner = TokenScanner::default();
        let mut seen = Vec::new();
        scanner.feed(&padded, |seq, us| seen.push((seq, us)));
        assert_eq!(seen, vec![(7, 1234)]);
    }

    #[test]
    fn tally_counts_misses_duplicates_and_complete_subscribers() {
        let subs: Vec<SubCounters> = (0..3).map(|_| SubCounters::default()).collect();
        // 0: all 5; 1: 4 of 5 and a duplicate; 2: 4 of 5, one skipped (a gap).
        let set = |s: &SubCounters, delivered, dup, gaps| {
            s.delivered.store(delivered, Ordering::Relaxed);
            s.duplicates.store(dup, Ordering::Relaxed);
            s.gaps.store(gaps, Ordering::Relaxed);
        };
        set(&subs[0], 5, 0, 0);
        set(&subs[1], 4, 1, 0);
        set(&subs[2], 4, 0, 1);
        subs[2].errors.store(2, Ordering::Relaxed);
        let tally = Tally::of(&subs, 5);
        assert_eq!(
            tally,
            Tally {
                complete: 1,
                delivered_min: 4,
                delivered_max: 5,
                delivered_total: 13,
                missed: 2,
                duplicates: 1,
                errors: 2,
            }
        );
        assert_eq!(Tally::of(&[], 5).delivered_min, 0);
    }

    #[test]
    fn requests_for_each_protocol_and_mode() {
        let ctx = |protocol, mode| Ctx {
            addr: "127.0.0.1:1".parse().unwrap(),
            host: "127.0.0.1:1".into(),
            path: "/bench/s".into(),
            protocol,
            mode,
            authorization: Some("Bearer t".into()),
            start: Instant::now(),
            subs: Vec::new(),
            hists: Vec::new(),
            connected: AtomicUsize::new(0),
            connect_gate: Semaphore::new(1),
            first_error: Mutex::new(None),
            stopping: AtomicBool::new(false),
        };
        let pos = Position {
            next_seq: 3,
            ds_offset: "0_12".into(),
            cursor: Some("a b".into()),
        };
        let line = |protocol, mode| {
            let mut out = Vec::new();
            write_request(&ctx(protocol, mode), &pos, &mut out);
            String::from_utf8(out).unwrap()
        };
        let sse = line(Protocol::Pico, LiveMode::Sse);
        assert!(
            sse.starts_with("GET /bench/s?live=sse&seq=3 HTTP/1.1\r\nHost: 127.0.0.1:1\r\nAccept: text/event-stream\r\n"),
            "{sse}"
        );
        assert!(sse.ends_with("Authorization: Bearer t\r\n\r\n"), "{sse}");
        assert!(line(Protocol::Pico, LiveMode::LongPoll).starts_with(
            "GET /bench/s?live=long-poll&format=json&seq=3&cursor=a%20b HTTP/1.1\r\n"
        ));
        assert!(line(Protocol::DurableStreams, LiveMode::Sse)
            .starts_with("GET /bench/s?live=sse&offset=0_12 HTTP/1.1\r\n"));
        assert!(line(Protocol::DurableStreams, LiveMode::LongPoll)
            .starts_with("GET /bench/s?live=long-poll&offset=0_12&cursor=a%20b HTTP/1.1\r\n"));
    }

    #[test]
    fn vm_rss_parsing() {
        let status = "Name:\tpico\nVmPeak:\t  10 kB\nVmRSS:\t   2048 kB\nThreads: 3\n";
        assert_eq!(parse_vm_rss(status), Some(2 * 1024 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        assert!(rss_bytes(std::process::id()).unwrap() > 0);
    }

    #[test]
    fn the_fd_limit_is_at_least_what_it_was() {
        let before = {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit writes the struct passed by reference.
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
            limit
        };
        let now = raise_fd_limit();
        assert!(now >= before.rlim_cur);
        assert!(now <= before.rlim_max);
    }
}
