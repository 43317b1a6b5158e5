//! `--live-latency`: append-to-delivery latency for a live reader.
//!
//! One writer appends one record every 10 ms (sequentially) to a fresh stream, so the
//! record of its `i`-th append has offset `i`; the instant just before each append is sent
//! is kept by offset. One reader follows the stream live (SSE, or long-poll with
//! `format=binary`); when a record arrives, now − its send instant goes into the delivery
//! histogram. A second histogram takes delivery − acknowledgement (the instant the writer has
//! the append's `200`), 0 when the reader had the record first: that is the delivery path
//! alone, without the append's round trip and `fdatasync`.

use pico_proto::header::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::StatusCode;

use crate::args::{BenchArgs, LiveMode, Output};
use crate::load::{self, Shared};
use crate::report::{self, LiveSummary, Summary};
use crate::wire::{self, BATCH_CONTENT_TYPE, REQUEST_TIMEOUT};
use crate::{Connection, Protocol};

/// Time between two appends of the live writer.
pub(crate) const APPEND_EVERY: Duration = Duration::from_millis(10);

/// What happened to each record, by offset.
#[derive(Default)]
struct Timeline {
    sent: Vec<Instant>,
    acked: Vec<Option<Instant>>,
    delivered: Vec<Option<Instant>>,
}

impl Timeline {
    fn send(&mut self) -> Instant {
        let now = Instant::now();
        self.sent.push(now);
        self.acked.push(None);
        self.delivered.push(None);
        now
    }

    /// Notes the acknowledgement (or, with `delivered`, the delivery) of `seq`; once both are
    /// known, returns delivery − acknowledgement in µs (0 when delivered first).
    fn note(&mut self, seq: u64, at: Instant, delivered: bool) -> Option<u64> {
        let i = seq as usize;
        let slot = if delivered {
            self.delivered.get_mut(i)?
        } else {
            self.acked.get_mut(i)?
        };
        *slot = Some(at);
        let (acked, delivered) = (self.acked[i]?, self.delivered[i]?);
        Some(delivered.saturating_duration_since(acked).as_micros() as u64)
    }
}

type SendTimes = Arc<Mutex<Timeline>>;

pub(crate) async fn run(args: &BenchArgs, conn: &Connection) -> Result<Summary, String> {
    let base = conn.base()?;
    let writer_client = wire::build_client(conn, Some(REQUEST_TIMEOUT))?;
    // The reader's requests last long (SSE up to the server's limit): no whole-request limit.
    let reader_client = wire::build_client(conn, None)?;
    let names = crate::stream_names(1);
    let name = names[0].clone();
    load::create_streams(&writer_client, &base, &names, wire::OCTET_STREAM).await?;
    if args.output == Output::Text {
        eprintln!("{}", report::created_line(1, Protocol::Pico));
    }
    let shared = Shared::new();
    let times: SendTimes = Arc::new(Mutex::new(Timeline::default()));
    let url = format!("{base}{name}");
    let reader = tokio::spawn(read_live(
        shared.clone(),
        reader_client,
        url.clone(),
        name.clone(),
        args.live_mode,
        args.record_size as u64,
        times.clone(),
    ));
    let writer = tokio::spawn(write_every(
        shared.clone(),
        writer_client.clone(),
        url,
        name,
        args.record_size,
        times,
    ));
    let window = load::clock(&shared, args, true).await;
    for task in [writer, reader] {
        if let Err(e) = task.await {
            shared.fail(format!("a bench task failed: {e}"));
        }
    }
    if !args.keep {
        load::delete_streams(&writer_client, &base, &names).await;
    }
    if let Some(error) = shared.error() {
        return Err(error);
    }
    Ok(Summary {
        protocol: Protocol::Pico,
        record_size: args.record_size,
        batch: 1,
        in_flight: 1,
        streams: 1,
        connections: 1,
        elapsed_sec: window.elapsed_sec,
        write: window.counters.write,
        append_latency: window.append_latency,
        read: Some(window.counters.read),
        live: Some(LiveSummary {
            mode: args.live_mode.name(),
            records: window.live_latency.count,
            latency: window.live_latency,
            after_ack: window.after_ack_latency,
        }),
        fan_out: None,
    })
}

/// Appends one record every 10 ms, one at a time; checks that the `i`-th lands at offset `i`.
async fn write_every(
    shared: Arc<Shared>,
    client: reqwest::Client,
    url: String,
    name: String,
    record_size: usize,
    times: SendTimes,
) {
    let body = wire::encode_batch(1, record_size);
    let mut ticks = tokio::time::interval(APPEND_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut expected = 0u64;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = shared.until_stopped() => return,
        }
        if shared.stopped() {
            return;
        }
        let sent = times.lock().unwrap_or_else(|e| e.into_inner()).send();
        let resp = client
            .post(&url)
            .header(CONTENT_TYPE, BATCH_CONTENT_TYPE)
            .body(body.clone())
            .send()
            .await;
        match resp {
            Ok(resp) if resp.status() == StatusCode::OK => {
                let start = resp
                    .headers()
                    .get(PICO_START_SEQ)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok());
                let _ = resp.bytes().await;
                let acked = Instant::now();
                let micros = acked.duration_since(sent).as_micros() as u64;
                if start != Some(expected) {
                    shared.fail(format!(
                        "append to {name}: landed at offset {start:?}, expected {expected} (another writer on the stream?)"
                    ));
                    return;
                }
                let after_ack = times
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .note(expected, acked, false);
                if let Some(after_ack) = after_ack {
                    shared.record_after_ack(after_ack);
                }
                expected += 1;
                shared.record_write(1, record_size as u64, Some(micros));
            }
            Ok(resp) => {
                shared.fail(wire::status_error(&format!("append to {name}"), resp).await);
                return;
            }
            Err(e) => {
                shared.fail(format!("append to {name}: {}", wire::describe(&e)));
                return;
            }
        }
    }
}

/// Records the delivery of `seqs` observed at `now`.
fn delivered(shared: &Shared, times: &SendTimes, seqs: &[u64], now: Instant, record_size: u64) {
    let mut times = times.lock().unwrap_or_else(|e| e.into_inner());
    for &seq in seqs {
        if let Some(sent) = times.sent.get(seq as usize) {
            let micros = now.saturating_duration_since(*sent).as_micros() as u64;
            shared.record_live(micros);
        }
        if let Some(after_ack) = times.note(seq, now, true) {
            shared.record_after_ack(after_ack);
        }
    }
    drop(times);
    shared.record_read(seqs.len() as u64, seqs.len() as u64 * record_size);
}

async fn read_live(
    shared: Arc<Shared>,
    client: reqwest::Client,
    url: String,
    name: String,
    mode: LiveMode,
    record_size: u64,
    times: SendTimes,
) {
    let result = tokio::select! {
        r = async {
            match mode {
                LiveMode::Sse => follow_sse(&shared, &client, &url, &name, record_size, &times).await,
                LiveMode::LongPoll => {
                    follow_long_poll(&shared, &client, &url, &name, record_size, &times).await
                }
            }
        } => r,
        _ = shared.until_stopped() => Ok(()),
    };
    if let Err(e) = result {
        if !shared.stopped() {
            shared.fail(e);
        }
    }
}

async fn follow_sse(
    shared: &Shared,
    client: &reqwest::Client,
    url: &str,
    name: &str,
    record_size: u64,
    times: &SendTimes,
) -> Result<(), String> {
    let what = format!("live read of {name}");
    let mut next = 0u64;
    loop {
        let mut resp = client
            .get(wire::with_query(
                url,
                &[("live", "sse"), ("seq", &next.to_string())],
            ))
            .header(ACCEPT, pico_proto::media::EVENT_STREAM)
            .send()
            .await
            .map_err(|e| format!("{what}: {}", wire::describe(&e)))?;
        if resp.status() != StatusCode::OK {
            return Err(wire::status_error(&what, resp).await);
        }
        let mut buf = Vec::new();
        // The server ends the response after its SSE limit: reconnect where it stopped.
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| format!("{what}: {}", wire::describe(&e)))?
        {
            let now = Instant::now();
            buf.extend_from_slice(&chunk);
            for data in wire::drain_sse_data(&mut buf) {
                let seqs = wire::json_seqs(&data).map_err(|e| format!("{what}: {e}"))?;
                if let Some(last) = seqs.last() {
                    next = next.max(last + 1);
                }
                delivered(shared, times, &seqs, now, record_size);
            }
        }
    }
}

async fn follow_long_poll(
    shared: &Shared,
    client: &reqwest::Client,
    url: &str,
    name: &str,
    record_size: u64,
    times: &SendTimes,
) -> Result<(), String> {
    let what = format!("live read of {name}");
    let mut next = 0u64;
    let mut cursor: Option<String> = None;
    loop {
        let seq = next.to_string();
        let mut query = vec![("live", "long-poll"), ("format", "binary"), ("seq", &seq)];
        if let Some(c) = &cursor {
            query.push(("cursor", c));
        }
        let resp = client
            .get(wire::with_query(url, &query))
            .send()
            .await
            .map_err(|e| format!("{what}: {}", wire::describe(&e)))?;
        let status = resp.status();
        if status != StatusCode::OK && status != StatusCode::NO_CONTENT {
            return Err(wire::status_error(&what, resp).await);
        }
        let header = |h: &str| {
            resp.headers()
                .get(h)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let next_header = header(PICO_NEXT_SEQ).and_then(|v| v.parse::<u64>().ok());
        if let Some(c) = header(PICO_CURSOR) {
            cursor = Some(c);
        }
        let body = resp
            .bytes()
            .await
            .map_err(|e| format!("{what}: {}", wire::describe(&e)))?;
        let now = Instant::now();
        if status == StatusCode::OK {
            let page = wire::parse_page(&body, true).map_err(|e| format!("{what}: {e}"))?;
            delivered(shared, times, &page.seqs, now, record_size);
            next = page.seqs.last().map_or(next, |s| s + 1);
        }
        if let Some(n) = next_header {
            next = n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_ack_latency_needs_both_instants_and_is_zero_when_delivered_first() {
        let mut timeline = Timeline::default();
        let sent = timeline.send();
        timeline.send();
        let ms = Duration::from_millis;
        // Acknowledged, then delivered 2 ms later.
        assert_eq!(timeline.note(0, sent + ms(1), false), None);
        assert_eq!(timeline.note(0, sent + ms(3), true), Some(2000));
        // Delivered before the writer saw the acknowledgement.
        assert_eq!(timeline.note(1, sent + ms(5), true), None);
        assert_eq!(timeline.note(1, sent + ms(6), false), Some(0));
        // A record never sent (another writer's) is ignored.
        assert_eq!(timeline.note(7, sent, true), None);
    }
}
