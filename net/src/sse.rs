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
//! : keep-alive                     every 15 s while idle, so proxies keep the connection
//! ```
//!
//! The response ends when the stream is closed and fully delivered, when it is deleted, or at
//! `--sse-max-duration-sec` (the client reconnects with `Last-Event-ID`).

use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pico_engine::{limits, CoreHandle, Op, ReadBatch, ReadFrom, ReadRequest, Reply};

use crate::codec;
use crate::http1::BodyStream;

/// Idle time between `: keep-alive` comments.
pub const KEEP_ALIVE_INTERVAL_MS: u64 = 15_000;
/// The `retry:` hint.
pub const RETRY_HINT_MS: u64 = 1_000;

struct State {
    core: Rc<CoreHandle>,
    name: String,
    position: u64,
    chunk_bytes: usize,
    deadline: Instant,
    announced_up_to_date: bool,
    done: bool,
    queue: VecDeque<Bytes>,
}

/// The event stream from `from` (already resolved against the stream's tail).
pub fn events(
    core: Rc<CoreHandle>,
    name: String,
    from: u64,
    chunk_bytes: usize,
    max_duration_ms: u64,
) -> BodyStream {
    let state = State {
        core,
        name,
        position: from,
        chunk_bytes,
        deadline: Instant::now() + Duration::from_millis(max_duration_ms),
        announced_up_to_date: false,
        done: false,
        queue: VecDeque::from([Bytes::from(format!("retry: {RETRY_HINT_MS}\n\n"))]),
    };
    Box::pin(futures_lite::stream::unfold(
        state,
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
    let now = Instant::now();
    if now >= state.deadline {
        state.done = true;
        return;
    }
    let wait_ms = (state.deadline - now)
        .as_millis()
        .min(u128::from(KEEP_ALIVE_INTERVAL_MS)) as u64;
    let request = ReadRequest {
        from: ReadFrom::Offset(state.position),
        max_records: limits::RECORDS_PER_READ_MAX,
        max_bytes: state.chunk_bytes,
        wait_ms: Some(if state.announced_up_to_date {
            wait_ms
        } else {
            0
        }),
        with_content_type: false,
        bound: None,
    };
    let Some((batch, last)) = live_read(&state.core, &state.name, request).await else {
        state.done = true;
        return;
    };
    if !batch.records.is_empty() {
        let mut data = Vec::with_capacity(64);
        data.extend_from_slice(format!("event: data\nid: {}\ndata:", batch.next_offset).as_bytes());
        data.extend_from_slice(&codec::encode_json(&batch.records));
        data.extend_from_slice(b"\n\n");
        state.queue.push_back(data.into());
        state.queue.push_back(control_event(&batch));
        state.position = batch.next_offset;
        state.announced_up_to_date = batch.up_to_date();
        state.done = batch.closed;
    } else if batch.closed {
        state.queue.push_back(control_event(&batch));
        state.done = true;
    } else if !state.announced_up_to_date {
        state.queue.push_back(control_event(&batch));
        state.announced_up_to_date = true;
    } else if Instant::now() < state.deadline {
        state
            .queue
            .push_back(Bytes::from_static(b": keep-alive\n\n"));
    }
    state.done |= last;
}

/// One read of a live response (both protocols): the batch, and whether it must be the
/// response's last because the node is stopping (it ends cleanly once that batch is sent).
/// `None` when the stream is deleted, expired or failing: the response ends, and the client's
/// reconnect gets the error.
pub(crate) async fn live_read(
    core: &CoreHandle,
    name: &str,
    request: ReadRequest,
) -> Option<(ReadBatch, bool)> {
    match core.call(name, Op::Read(request)).await {
        Ok(Reply::Read(batch)) => Some((batch, core.is_stopping())),
        _ => None,
    }
}
