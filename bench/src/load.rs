//! The throughput benchmark: writers, optional producers, catch-up readers, and the clock
//! that runs warmup, progress lines and the measured window (shared with `--live-latency`).

use pico_proto::header::*;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use reqwest::header::CONTENT_TYPE;
use reqwest::StatusCode;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::args::{BenchArgs, Output};
use crate::pacing::{self, Pacer};
use crate::report::{self, Latency, Summary, Throughput};
use crate::wire::{self, AppendShape, BATCH_CONTENT_TYPE, READ_PAGE_BYTES};
use crate::{Connection, Protocol};

/// Whole-request limit of writers and catch-up readers.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Readers sleep this long when caught up.
const CAUGHT_UP_SLEEP: Duration = Duration::from_millis(10);

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

async fn sleep_until_or_stop(shared: &Shared, at: Instant) {
    tokio::select! {
        _ = tokio::time::sleep_until(at.into()) => {}
        _ = shared.until_stopped() => {}
    }
}

/// Creates the streams with this content type (a PUT in both protocols).
pub(crate) async fn create_streams(
    client: &reqwest::Client,
    base: &str,
    names: &[String],
    content_type: &str,
) -> Result<(), String> {
    for (i, name) in names.iter().enumerate() {
        let what = format!("create {name}");
        let resp = client
            .put(format!("{base}{name}"))
            .header(CONTENT_TYPE, content_type)
            .send()
            .await
            .map_err(|e| format!("{what}: {}", wire::describe(&e)));
        let outcome = match resp {
            Ok(resp) if resp.status().is_success() => Ok(()),
            Ok(resp) => Err(wire::status_error(&what, resp).await),
            Err(e) => Err(e),
        };
        if let Err(e) = outcome {
            delete_streams(client, base, &names[..i]).await;
            return Err(e);
        }
    }
    Ok(())
}

/// Deletes the streams; failures are reported on stderr but do not fail the run.
pub(crate) async fn delete_streams(client: &reqwest::Client, base: &str, names: &[String]) {
    for name in names {
        match client.delete(format!("{base}{name}")).send().await {
            Ok(resp) if resp.status().is_success() || resp.status() == StatusCode::NOT_FOUND => {}
            Ok(resp) => {
                eprintln!(
                    "warning: {}",
                    wire::status_error(&format!("delete {name}"), resp).await
                )
            }
            Err(e) => eprintln!("warning: delete {name}: {}", wire::describe(&e)),
        }
    }
}

/// The throughput benchmark.
pub(crate) async fn run(args: &BenchArgs, conn: &Connection) -> Result<Summary, String> {
    let base = conn.base()?;
    let clients = (0..args.connections)
        .map(|_| wire::build_client(conn, Some(REQUEST_TIMEOUT)))
        .collect::<Result<Vec<_>, _>>()?;
    let shape = match conn.protocol {
        Protocol::Pico => AppendShape::pico(args.batch, args.record_size),
        Protocol::DurableStreams => AppendShape::ds(args.batch, args.record_size),
    };
    let names = crate::stream_names(args.streams);
    create_streams(&clients[0], &base, &names, shape.stream_type).await?;
    if args.output == Output::Text {
        eprintln!("{}", report::created_line(names.len(), conn.protocol));
    }

    let shared = Shared::new();
    let pacer = pacing::bytes_per_sec(args.target_mibps).map(|rate| Arc::new(Pacer::new(rate)));
    let mut tasks: Vec<JoinHandle<()>> = Vec::new();
    let record_size = args.record_size;

    if args.producer {
        // One producer per stream; writer w feeds producer w % streams.
        let mut senders = Vec::new();
        for (s, name) in names.iter().enumerate() {
            let writers = (0..args.in_flight)
                .filter(|w| w % args.streams == s)
                .count();
            let (tx, rx) = mpsc::unbounded_channel();
            senders.push(tx);
            let producer = ProducerTask {
                client: clients[s % clients.len()].clone(),
                url: format!("{base}{name}"),
                name: name.clone(),
                id: format!("bench-{}-{s}", &name["/bench/".len()..]),
                batch: args.batch,
                record_size,
                max_requests: writers.div_ceil(args.batch).max(1),
                shared: shared.clone(),
            };
            tasks.push(tokio::spawn(producer.run(rx)));
        }
        for w in 0..args.in_flight {
            let tx = senders[w % args.streams].clone();
            tasks.push(tokio::spawn(producer_writer(
                shared.clone(),
                tx,
                record_size as u64,
                pacer.clone(),
            )));
        }
    } else {
        let direct = direct_connections(args, conn, &base, &clients[0], &names).await?;
        for w in 0..args.in_flight {
            let name = &names[w % args.streams];
            let transport = match &direct {
                Some(conns) => Transport::Direct(conns[w % conns.len()].clone()),
                None => Transport::Reqwest(clients[w % clients.len()].clone()),
            };
            tasks.push(tokio::spawn(writer(
                shared.clone(),
                transport,
                format!("{base}{name}"),
                name.clone(),
                shape.clone(),
                args.batch as u64,
                (args.batch * record_size) as u64,
                pacer.clone(),
            )));
        }
    }
    if !args.no_read {
        for (s, name) in names.iter().enumerate() {
            let (client, url) = (clients[s % clients.len()].clone(), format!("{base}{name}"));
            tasks.push(match conn.protocol {
                Protocol::Pico => tokio::spawn(reader(shared.clone(), client, url, name.clone())),
                Protocol::DurableStreams => tokio::spawn(ds_reader(
                    shared.clone(),
                    client,
                    url,
                    name.clone(),
                    shape.stream_type == wire::JSON_TYPE,
                    record_size,
                )),
            });
        }
    }

    let window = clock(&shared, args, false).await;
    for task in tasks {
        if let Err(e) = task.await {
            shared.fail(format!("a bench task failed: {e}"));
        }
    }
    if !args.keep {
        delete_streams(&clients[0], &base, &names).await;
    }
    if let Some(error) = shared.error() {
        return Err(error);
    }
    Ok(Summary {
        protocol: conn.protocol,
        record_size,
        batch: args.batch,
        in_flight: args.in_flight,
        streams: args.streams,
        connections: args.connections,
        elapsed_sec: window.elapsed_sec,
        write: window.counters.write,
        append_latency: window.append_latency,
        read: (!args.no_read).then_some(window.counters.read),
        live: None,
    })
}

/// How writers send their appends.
enum Transport {
    Reqwest(reqwest::Client),
    /// `--http2` to an `http://` endpoint that serves the streams itself.
    Direct(crate::h2direct::H2Conn),
}

/// The writers' own HTTP/2 connections, when they measure the same thing as reqwest would:
/// `--http2` (cleartext) and every stream served by the endpoint itself (no cluster redirect).
async fn direct_connections(
    args: &BenchArgs,
    conn: &Connection,
    base: &str,
    client: &reqwest::Client,
    names: &[String],
) -> Result<Option<Vec<crate::h2direct::H2Conn>>, String> {
    let Some(authority) = conn
        .http2
        .then(|| crate::h2direct::cleartext_authority(base))
        .flatten()
    else {
        return Ok(None);
    };
    for name in names {
        let url = format!("{base}{name}");
        let served_here = match client.head(&url).send().await {
            Ok(resp) => resp.url().as_str() == url,
            Err(_) => false,
        };
        if !served_here {
            return Ok(None);
        }
    }
    let mut conns = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        conns.push(crate::h2direct::H2Conn::connect(&authority, conn.token.as_deref()).await?);
    }
    Ok(Some(conns))
}

/// One writer: appends `shape.body` until stopped, one request outstanding.
#[allow(clippy::too_many_arguments)]
async fn writer(
    shared: Arc<Shared>,
    transport: Transport,
    url: String,
    name: String,
    shape: AppendShape,
    records: u64,
    bytes: u64,
    pacer: Option<Arc<Pacer>>,
) {
    while !shared.stopped() {
        if let Some(pacer) = &pacer {
            tokio::select! {
                _ = pacer.pace(bytes) => {}
                _ = shared.until_stopped() => break,
            }
        }
        let sent = Instant::now();
        match transport
            .append(&url, &shape, &format!("append to {name}"))
            .await
        {
            Ok(()) => {
                let micros = sent.elapsed().as_micros() as u64;
                shared.record_write(records, bytes, Some(micros));
            }
            Err(message) => {
                shared.fail(message);
                break;
            }
        }
    }
}

impl Transport {
    /// One append; `Err` says why it was not acknowledged, starting with `what`.
    async fn append(&self, url: &str, shape: &AppendShape, what: &str) -> Result<(), String> {
        match self {
            Transport::Reqwest(client) => {
                let resp = client
                    .post(url)
                    .header(CONTENT_TYPE, shape.content_type)
                    .body(shape.body.clone())
                    .send()
                    .await
                    .map_err(|e| format!("{what}: {}", wire::describe(&e)))?;
                if resp.status() != shape.ok {
                    return Err(wire::status_error(what, resp).await);
                }
                let _ = resp.bytes().await;
                Ok(())
            }
            Transport::Direct(h2) => {
                let posted = tokio::time::timeout(
                    REQUEST_TIMEOUT,
                    h2.post(url, shape.content_type, shape.body.clone()),
                )
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {REQUEST_TIMEOUT:?}")))
                .map_err(|e| format!("{what}: {e}"))?;
                match posted {
                    (status, _) if status == shape.ok => Ok(()),
                    (status, body) => Err(wire::error_message(
                        what,
                        status.as_u16(),
                        &String::from_utf8_lossy(&body),
                    )),
                }
            }
        }
    }
}

/// What a reader's request came back with.
enum Page {
    /// `200`: its headers and whole body.
    Ready(reqwest::header::HeaderMap, bytes::Bytes),
    /// Throttled (`429`/`503`): ask again after a short pause.
    Retry,
    /// Failed (recorded) or the run is over.
    Stop,
}

async fn fetch_page(shared: &Shared, name: &str, request: reqwest::RequestBuilder) -> Page {
    let resp = match request.send().await {
        Ok(resp) => resp,
        Err(e) => {
            if !shared.stopped() {
                shared.fail(format!("read of {name}: {}", wire::describe(&e)));
            }
            return Page::Stop;
        }
    };
    let status = resp.status();
    if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
        let _ = resp.bytes().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        return Page::Retry;
    }
    if status != StatusCode::OK {
        shared.fail(wire::status_error(&format!("read of {name}"), resp).await);
        return Page::Stop;
    }
    let headers = resp.headers().clone();
    match resp.bytes().await {
        Ok(body) => Page::Ready(headers, body),
        Err(e) => {
            if !shared.stopped() {
                shared.fail(format!("read of {name}: {}", wire::describe(&e)));
            }
            Page::Stop
        }
    }
}

/// A response header as text.
fn header(headers: &reqwest::header::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// A reader caught up waits a moment before asking again; `false` once the run is over.
async fn pause_caught_up(shared: &Shared) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(CAUGHT_UP_SLEEP) => true,
        _ = shared.until_stopped() => false,
    }
}

/// One catch-up reader: pages of up to 4 MiB (`format=binary`) from the beginning, 10 ms of
/// sleep when caught up.
async fn reader(shared: Arc<Shared>, client: reqwest::Client, url: String, name: String) {
    let mut next = 0u64;
    while !shared.stopped() {
        let request = client.get(wire::with_query(
            &url,
            &[
                ("seq", &next.to_string()),
                ("format", "binary"),
                ("bytes", &READ_PAGE_BYTES.to_string()),
            ],
        ));
        let (headers, body) = match fetch_page(&shared, &name, request).await {
            Page::Ready(headers, body) => (headers, body),
            Page::Retry => continue,
            Page::Stop => return,
        };
        let next_header = header(&headers, PICO_NEXT_SEQ).and_then(|v| v.parse::<u64>().ok());
        let up_to_date = header(&headers, PICO_UP_TO_DATE).is_some_and(|v| v == "true");
        let page = match wire::parse_page(&body, false) {
            Ok(page) => page,
            Err(e) => {
                shared.fail(format!("read of {name}: {e}"));
                return;
            }
        };
        shared.record_read(page.records, page.body_bytes);
        next = next_header.unwrap_or(next + page.records);
        if (up_to_date || page.records == 0) && !pause_caught_up(&shared).await {
            return;
        }
    }
}

/// One Durable Streams catch-up reader: chunks (the server's chunk size) from offset `-1`,
/// following `Stream-Next-Offset`, 10 ms of sleep when caught up. A JSON chunk says how many
/// messages it holds; an octet-stream chunk is bodies back to back, so whole records are
/// counted over all bytes read so far.
async fn ds_reader(
    shared: Arc<Shared>,
    client: reqwest::Client,
    url: String,
    name: String,
    json: bool,
    record_size: usize,
) {
    let mut offset = "-1".to_string();
    let mut total_bytes = 0u64;
    while !shared.stopped() {
        let request = client.get(wire::with_query(&url, &[("offset", &offset)]));
        let (headers, body) = match fetch_page(&shared, &name, request).await {
            Page::Ready(headers, body) => (headers, body),
            Page::Retry => continue,
            Page::Stop => return,
        };
        let Some(next) = header(&headers, STREAM_NEXT_OFFSET) else {
            shared.fail(format!("read of {name}: no Stream-Next-Offset"));
            return;
        };
        let up_to_date = header(&headers, STREAM_UP_TO_DATE).is_some_and(|v| v == "true");
        let records = if json {
            wire::ds_json_chunk_records(body.len(), record_size)
        } else {
            let before = total_bytes / record_size as u64;
            total_bytes += body.len() as u64;
            total_bytes / record_size as u64 - before
        };
        shared.record_read(records, records * record_size as u64);
        // No progress is as good as caught up, even without Stream-Up-To-Date.
        let empty = offset == next;
        offset = next;
        if (up_to_date || empty) && !pause_caught_up(&shared).await {
            return;
        }
    }
}

/// A record handed to a producer: where to report its durability.
struct Pending {
    done: oneshot::Sender<Result<(), ()>>,
}

/// Producer mode writer: hands one record at a time to its stream's producer and waits for
/// it to be durable; latency per record.
async fn producer_writer(
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<Pending>,
    record_size: u64,
    pacer: Option<Arc<Pacer>>,
) {
    while !shared.stopped() {
        if let Some(pacer) = &pacer {
            tokio::select! {
                _ = pacer.pace(record_size) => {}
                _ = shared.until_stopped() => break,
            }
        }
        let (done, acked) = oneshot::channel();
        let sent = Instant::now();
        if tx.send(Pending { done }).is_err() {
            break;
        }
        match acked.await {
            Ok(Ok(())) => {
                let micros = sent.elapsed().as_micros() as u64;
                shared.record_write(1, record_size, Some(micros));
            }
            // The producer failed (and recorded why) or stopped.
            _ => break,
        }
    }
}

/// An idempotent producer over the raw headers: `Pico-Producer-Id`, `-Epoch` (0) and
/// `-Seq` (one per request, from 0). Records queued by the writers are sent in batches of up
/// to `batch`, with up to `max_requests` requests in flight; a request that overtakes its
/// predecessor (`409 sequence_gap`) is sent again once every earlier one is acknowledged.
struct ProducerTask {
    client: reqwest::Client,
    url: String,
    name: String,
    id: String,
    batch: usize,
    record_size: usize,
    max_requests: usize,
    shared: Arc<Shared>,
}

impl ProducerTask {
    async fn run(self, mut rx: mpsc::UnboundedReceiver<Pending>) {
        let this = Arc::new(self);
        let mut next_seq = 0u64;
        // Number of requests acknowledged without a hole (all sequences below it).
        let (acked_tx, acked_rx) = watch::channel(0u64);
        let mut done = BTreeSet::new();
        let mut in_flight: JoinSet<(u64, Vec<Pending>, Result<(), String>)> = JoinSet::new();
        let mut open = true;
        loop {
            tokio::select! {
                joined = in_flight.join_next(), if !in_flight.is_empty() => {
                    let Some(Ok((seq, pendings, result))) = joined else {
                        this.shared.fail(format!("producer of {} failed", this.name));
                        break;
                    };
                    match result {
                        Ok(()) => {
                            for p in pendings {
                                let _ = p.done.send(Ok(()));
                            }
                            done.insert(seq);
                            let mut contiguous = *acked_tx.borrow();
                            while done.remove(&contiguous) {
                                contiguous += 1;
                            }
                            acked_tx.send_replace(contiguous);
                        }
                        Err(e) => {
                            this.shared.fail(e);
                            break;
                        }
                    }
                }
                first = rx.recv(), if open && in_flight.len() < this.max_requests => {
                    let Some(first) = first else {
                        open = false;
                        continue;
                    };
                    let mut pendings = vec![first];
                    while pendings.len() < this.batch {
                        match rx.try_recv() {
                            Ok(p) => pendings.push(p),
                            Err(_) => break,
                        }
                    }
                    let seq = next_seq;
                    next_seq += 1;
                    let body = wire::encode_batch(pendings.len(), this.record_size);
                    let task = this.clone();
                    let acked = acked_rx.clone();
                    in_flight.spawn(async move {
                        let result = task.send(seq, body, acked).await;
                        (seq, pendings, result)
                    });
                }
                _ = this.shared.until_stopped(), if open => {
                    // No new requests; finish the ones in flight.
                    open = false;
                    rx.close();
                }
                else => break,
            }
        }
        // Anything still queued fails (its writer stops).
        in_flight.abort_all();
        rx.close();
        while rx.try_recv().is_ok() {}
    }

    async fn send(
        &self,
        seq: u64,
        body: Bytes,
        mut acked: watch::Receiver<u64>,
    ) -> Result<(), String> {
        let what = format!("append to {} (producer seq {seq})", self.name);
        loop {
            // Every earlier request acknowledged before this send: a gap is then real.
            let acked_before = *acked.borrow();
            let predecessors_done = acked_before >= seq;
            let resp = self
                .client
                .post(&self.url)
                .header(CONTENT_TYPE, BATCH_CONTENT_TYPE)
                .header(PICO_PRODUCER_ID, &self.id)
                .header(PICO_PRODUCER_EPOCH, "0")
                .header(PICO_PRODUCER_SEQ, seq.to_string())
                .body(body.clone())
                .send()
                .await
                .map_err(|e| format!("{what}: {}", wire::describe(&e)))?;
            let status = resp.status();
            if status == StatusCode::OK {
                let _ = resp.bytes().await;
                return Ok(());
            }
            // Overtaking shows as `409 sequence_gap`, or as `400` while the server has not
            // seen the producer's sequence 0 yet (a new producer must start at 0).
            let overtaken = (status == StatusCode::CONFLICT
                || (status == StatusCode::BAD_REQUEST && acked_before == 0))
                && !predecessors_done;
            if overtaken {
                let text = resp.text().await.unwrap_or_default();
                let code = wire::error_code(&text);
                if matches!(code.as_deref(), Some("sequence_gap" | "bad_request")) {
                    // Overtook an earlier request: wait for it, then send again.
                    acked
                        .wait_for(|n| *n >= seq)
                        .await
                        .map_err(|_| format!("{what}: the producer stopped"))?;
                    continue;
                }
                return Err(format!("{what}: HTTP {status}: {text}"));
            }
            return Err(wire::status_error(&what, resp).await);
        }
    }
}
