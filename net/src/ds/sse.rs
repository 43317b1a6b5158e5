//! Server-sent events of the Durable Streams protocol (`live=sse`): `data` events carrying the
//! records (base64 for binary streams) and `control` events carrying the next offset, the
//! cursor and whether the reader is up to date.

use std::rc::Rc;

use base64::Engine as _;
use bytes::Bytes;
use pico_engine::{CoreHandle, ReadBatch, ReadFrom, ReadRequest};
use pico_proto::header::*;

use super::encode::{encode, joined, next_cursor};
use super::error::DsError;
use super::params::{is_json, DsSettings};
use crate::live_response::{encoded_once, EventEncoding, LiveCursor, LiveEvents};
use crate::transport::message::{Request, Response};

struct SseState {
    /// Where it reads; its queue holds a data event and the control event behind it.
    live: LiveCursor,
    skip_bytes: u64,
    json: bool,
    base64: bool,
    cursor: Option<String>,
    /// The first read: answered without waiting so the client learns the tail at once.
    first: bool,
}

/// Starts an SSE response: `event: data` with the records of each read, each followed by an
/// `event: control` with the offset to resume from (camelCase JSON).
pub(super) async fn sse(
    core: &Rc<CoreHandle>,
    settings: &DsSettings,
    request: &Request,
    from: ReadFrom,
    skip_bytes: u64,
    cursor: Option<String>,
) -> Result<Response, DsError> {
    // Checked before the response starts, so a missing stream is a plain 404.
    let info = core.head(&request.path).await?;
    let json = is_json(&info.content_type);
    let text = info
        .content_type
        .trim()
        .to_ascii_lowercase()
        .starts_with("text/");
    let base64 = !json && !text;
    let state = SseState {
        live: LiveCursor::new(
            core.clone(),
            request.path.clone(),
            from,
            settings.max_chunk_size,
            settings.long_poll_timeout_ms,
            settings.sse_max_duration_ms,
        ),
        skip_bytes,
        json,
        base64,
        cursor,
        first: true,
    };
    let mut response = Response::event_stream(Box::new(state));
    if base64 {
        response = response.header(STREAM_SSE_DATA_ENCODING, "base64");
    }
    Ok(response)
}

/// One read (waiting at the tail) and the events it gives: the control event, or the data
/// event with the control event behind it (the data event is shared by the core's
/// subscribers, not copied). The response ends when the stream is closed and delivered,
/// deleted, or at the reconnect interval.
impl LiveEvents for SseState {
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
        let wait = !self.first;
        self.live.next_read(wait)
    }

    fn answer(&mut self, read: Option<&(ReadBatch, bool)>) {
        let first = std::mem::replace(&mut self.first, false);
        let live = &mut self.live;
        let Some(&(ref batch, last)) = read.filter(|_| !live.tokens_reloaded()) else {
            live.done = true;
            return;
        };
        live.done |= last;
        if batch.records.is_empty() && !batch.closed && live.last_round && !first {
            // The wait ran to the deadline: the response ends without another control event.
            live.done = true;
            return;
        }
        if !batch.records.is_empty() {
            let (json, base64) = (self.json, self.base64);
            let data = if self.skip_bytes == 0 {
                encoded_once(batch, EventEncoding::Ds { json, base64 }, || {
                    data_event(batch, json, base64, 0)
                })
            } else {
                data_event(batch, json, base64, self.skip_bytes)
            };
            self.live.queue.push(data);
        }
        self.skip_bytes = 0;
        self.live.from = ReadFrom::Offset(batch.next_offset);
        let control = control_event(self, batch);
        self.live.queue.push(control);
    }

    fn at_tail(&self) -> bool {
        let live = &self.live;
        !live.done && !self.first && live.queue.is_empty() && self.skip_bytes == 0
    }

    fn deadline(&self) -> Option<std::time::Instant> {
        Some(self.live.write_deadline())
    }
}

/// The control event after a read: where to resume, the cursor (or that the stream is closed)
/// and whether the reader is up to date.
fn control_event(state: &mut SseState, batch: &ReadBatch) -> Bytes {
    let mut out = Vec::with_capacity(CONTROL_EVENT_BYTES_MAX);
    // The keys in the order serde_json writes a map's (sorted), so the event reads as other
    // encoders write it; offsets and cursors are digits and `_`, which JSON strings take as
    // they are.
    out.extend_from_slice(b"event: control\ndata:{");
    if batch.closed {
        out.extend_from_slice(b"\"streamClosed\":true,");
    } else {
        let cursor = next_cursor(state.cursor.as_deref());
        out.extend_from_slice(b"\"streamCursor\":\"");
        out.extend_from_slice(cursor.as_bytes());
        out.extend_from_slice(b"\",");
        state.cursor = Some(cursor);
    }
    out.extend_from_slice(b"\"streamNextOffset\":\"");
    pico_proto::offset::format_into(&mut out, batch.next_offset, 0);
    out.push(b'"');
    if batch.closed || batch.up_to_date() {
        out.extend_from_slice(b",\"upToDate\":true");
    }
    out.extend_from_slice(b"}\n\n");
    state.live.done |= batch.closed;
    out.into()
}

/// The longest control event: its text with a cursor and an offset of 20 digits each.
const CONTROL_EVENT_BYTES_MAX: usize = 160;

/// The `data` event of a batch's records, the first `skip_bytes` of the first left out.
fn data_event(batch: &ReadBatch, json: bool, base64: bool, skip_bytes: u64) -> Bytes {
    let payload = joined(encode(batch, json, skip_bytes));
    let mut out = Vec::with_capacity(payload.len() * 4 / 3 + 64);
    out.extend_from_slice(b"event: data\n");
    if base64 {
        let encoded = base64::engine::general_purpose::STANDARD.encode(&payload);
        data_lines(&mut out, encoded.as_bytes());
    } else {
        data_lines(&mut out, &payload);
    }
    out.push(b'\n');
    out.into()
}

/// One `data:` line per line of the payload (CR, LF and CRLF all end a line), so an embedded
/// blank line can never end the event early. A line starting with a space gets `data: `, as
/// event-stream parsers drop one space after the colon.
pub(super) fn data_lines(out: &mut Vec<u8>, payload: &[u8]) {
    let line = |out: &mut Vec<u8>, text: &[u8]| {
        out.extend_from_slice(if text.first() == Some(&b' ') {
            b"data: "
        } else {
            b"data:"
        });
        out.extend_from_slice(text);
        out.push(b'\n');
    };
    let mut start = 0;
    let mut i = 0;
    while i < payload.len() {
        if matches!(payload[i], b'\r' | b'\n') {
            line(out, &payload[start..i]);
            if payload[i] == b'\r' && payload.get(i + 1) == Some(&b'\n') {
                i += 1;
            }
            start = i + 1;
        }
        i += 1;
    }
    line(out, &payload[start..]);
}

/// What a subscriber's state between reads takes (tested in `live_response.rs`).
#[cfg(test)]
pub(crate) const STATE_BYTES: usize = std::mem::size_of::<SseState>();
