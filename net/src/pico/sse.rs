//! Server-sent events for `live=sse` (and `Accept: text/event-stream`).
//!
//! ```text
//! retry: <ms>                      sent first: how long a client waits before reconnecting
//!
//! event: data                      one per chunk of records (up to --max-chunk-size bytes)
//! id: <next_seq after the chunk>   resume with Last-Event-ID: <id>
//! data:[{"seq":..},...]            exactly the json read format
//!
//! event: control                   after every data event, and once when caught up
//! id: <next_seq>
//! data:{["closed":true,]"next_seq":N,"up_to_date":B}
//!
//! : keep-alive                     while idle, every --long-poll-timeout-sec, so proxies keep
//!                                  the connection
//! ```
//!
//! The response ends when the stream is closed and fully delivered, when it is deleted, or at
//! `--sse-max-duration-sec` (the client reconnects with `Last-Event-ID`).
//!
//! Both protocols keep an idle live response quiet for at most `--long-poll-timeout-sec`: a
//! long-poll answers then, an SSE response sends a keep-alive (Durable Streams: a control
//! event). A proxy's idle timeout bounds both alike, so one setting tunes both.

use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pico_engine::{limits, CoreHandle, ReadBatch, ReadFrom, ReadRequest};

use crate::live::{encoded_once, live_read, EventEncoding, IdleRound, KEEP_ALIVE_MIN_MS};

use crate::codec;
use crate::transport::message::BodyStream;

/// The `retry:` hint.
pub const RETRY_HINT_MS: u64 = 1_000;

struct State {
    core: Rc<CoreHandle>,
    name: String,
    from: ReadFrom,
    chunk_bytes: usize,
    keep_alive_ms: u64,
    deadline: Instant,
    announced_up_to_date: bool,
    done: bool,
    queue: VecDeque<Bytes>,
}

/// The event stream from `from` (the tail already resolved to an offset); idle, it sends a
/// keep-alive every `keep_alive_ms`.
pub fn events(
    core: Rc<CoreHandle>,
    name: String,
    from: ReadFrom,
    chunk_bytes: usize,
    keep_alive_ms: u64,
    max_duration_ms: u64,
) -> BodyStream {
    let state = State {
        core,
        name,
        from,
        chunk_bytes,
        keep_alive_ms: keep_alive_ms.max(KEEP_ALIVE_MIN_MS),
        deadline: Instant::now() + Duration::from_millis(max_duration_ms),
        announced_up_to_date: false,
        done: false,
        queue: VecDeque::from([Bytes::from(format!("retry: {RETRY_HINT_MS}\n\n"))]),
    };
    // The state boxed: an unfold keeps room for its state twice (held between items, and
    // moved into the future that makes the next one), for as long as the subscriber lives.
    Box::pin(futures_lite::stream::unfold(
        Box::new(state),
        |mut state| async move {
            loop {
                if let Some(event) = state.queue.pop_front() {
                    return Some((event, state));
                }
                if state.done {
                    return None;
                }
                next_events(&mut state).await;
            }
        },
    ))
}

fn control_event(batch: &ReadBatch) -> Bytes {
    let closed = if batch.closed { "\"closed\":true," } else { "" };
    Bytes::from(format!(
        "event: control\nid: {}\ndata:{{{closed}\"next_seq\":{},\"up_to_date\":{}}}\n\n",
        batch.next_offset,
        batch.next_offset,
        batch.up_to_date()
    ))
}

/// Reads (waiting for new records at the tail) and queues the events that result.
async fn next_events(state: &mut State) {
    let Some(round) = IdleRound::next(state.deadline, state.keep_alive_ms) else {
        state.done = true;
        return;
    };
    let request = ReadRequest {
        from: state.from,
        max_records: limits::RECORDS_PER_READ_MAX,
        max_bytes: state.chunk_bytes,
        wait_ms: Some(if state.announced_up_to_date {
            round.wait_ms
        } else {
            0
        }),
        with_content_type: false,
        bound: None,
    };
    let Some((batch, last)) = live_read(&state.core, &state.name, &request).await else {
        state.done = true;
        return;
    };
    if !batch.records.is_empty() {
        // Both events in one piece, made once for all the core's subscribers of this read.
        let events = encoded_once(&batch, EventEncoding::Pico, || {
            let json = codec::encode_json(&batch.records);
            let control = control_event(&batch);
            let mut events = Vec::with_capacity(json.len() + control.len() + 64);
            events.extend_from_slice(
                format!("event: data\nid: {}\ndata:", batch.next_offset).as_bytes(),
            );
            events.extend_from_slice(&json);
            events.extend_from_slice(b"\n\n");
            events.extend_from_slice(&control);
            events.into()
        });
        state.queue.push_back(events);
        state.announced_up_to_date = batch.up_to_date();
        state.done = batch.closed;
    } else if batch.closed {
        state.queue.push_back(control_event(&batch));
        state.done = true;
    } else if !state.announced_up_to_date {
        state.queue.push_back(control_event(&batch));
        state.announced_up_to_date = true;
    } else if round.last {
        // The wait ran to the deadline: the response ends, a keep-alive would be its last word.
        state.done = true;
    } else {
        state
            .queue
            .push_back(Bytes::from_static(b": keep-alive\n\n"));
    }
    // An empty batch's next offset is where it read: a start resolved by the engine.
    state.from = ReadFrom::Offset(batch.next_offset);
    state.done |= last;
}

/// What a subscriber's wait for its next events takes (tested in `live.rs`).
#[cfg(test)]
pub(crate) fn waiting_for_events_bytes() -> usize {
    crate::live::future_size::<&'static mut State, _>(next_events)
}
