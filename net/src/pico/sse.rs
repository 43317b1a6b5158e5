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

use std::rc::Rc;

use bytes::Bytes;
use pico_engine::{CoreHandle, ReadBatch, ReadFrom, ReadRequest};

use crate::codec;
use crate::live_response::{encoded_once, EventEncoding, LiveBody, LiveCursor, LiveEvents};

/// The `retry:` hint.
pub const RETRY_HINT_MS: u64 = 1_000;

struct State {
    live: LiveCursor,
    announced_up_to_date: bool,
}

/// The event stream of `live` (its start already resolved to an offset), the `retry:` hint
/// first; idle, it sends a keep-alive every round.
pub(crate) fn events(live: LiveCursor) -> LiveBody {
    let mut state = Box::new(State {
        live,
        announced_up_to_date: false,
    });
    let retry = Bytes::from(format!("retry: {RETRY_HINT_MS}\n\n"));
    state.live.queue.push(retry);
    state
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
impl LiveEvents for State {
    fn core(&self) -> &Rc<CoreHandle> {
        &self.live.core
    }

    fn stream_name(&self) -> &str {
        &self.live.name
    }

    fn pop_event(&mut self) -> Option<Bytes> {
        self.live.queue.pop()
    }

    fn next_read(&mut self) -> Option<ReadRequest> {
        // Until it has said it is up to date, a read answers at once.
        self.live.next_read(self.announced_up_to_date)
    }

    fn answer(&mut self, read: Option<&(ReadBatch, bool)>) {
        let live = &mut self.live;
        let Some(&(ref batch, last)) = read.filter(|_| !live.tokens_reloaded()) else {
            live.done = true;
            return;
        };
        if !batch.records.is_empty() {
            // Both events in one piece, made once for all the core's subscribers of this read.
            let events = encoded_once(batch, EventEncoding::Pico, || {
                let json = codec::encode_json(&batch.records);
                let control = control_event(batch);
                let mut events = Vec::with_capacity(json.len() + control.len() + 64);
                events.extend_from_slice(
                    format!("event: data\nid: {}\ndata:", batch.next_offset).as_bytes(),
                );
                events.extend_from_slice(&json);
                events.extend_from_slice(b"\n\n");
                events.extend_from_slice(&control);
                events.into()
            });
            live.queue.push(events);
            self.announced_up_to_date = batch.up_to_date();
            live.done = batch.closed;
        } else if batch.closed {
            live.queue.push(control_event(batch));
            live.done = true;
        } else if !self.announced_up_to_date {
            live.queue.push(control_event(batch));
            self.announced_up_to_date = true;
        } else if live.last_round {
            // The wait ran to the deadline: the response ends, a keep-alive would be its last
            // word.
            live.done = true;
        } else {
            live.queue.push(Bytes::from_static(b": keep-alive\n\n"));
        }
        // An empty batch's next offset is where it read: a start resolved by the engine.
        live.from = ReadFrom::Offset(batch.next_offset);
        live.done |= last;
    }

    fn at_tail(&self) -> bool {
        !self.live.done && self.announced_up_to_date && self.live.queue.is_empty()
    }

    fn deadline(&self) -> Option<std::time::Instant> {
        Some(self.live.write_deadline())
    }
}

/// What a subscriber's state between reads takes (tested in `live_response.rs`).
#[cfg(test)]
pub(crate) const STATE_BYTES: usize = std::mem::size_of::<State>();
