//! The body of a Durable Streams read (a JSON array of messages, or the records' bytes back to
//! back) and the `Stream-Cursor` of a live answer; both reads and SSE events use them.

use bytes::Bytes;
use pico_engine::ReadBatch;

/// Cursor intervals count from this instant (2024-10-09T00:00:00Z), 20 s each: the Durable
/// Streams protocol's fixed epoch and interval, so cursors agree with other servers'.
const CURSOR_EPOCH_MS: u64 = 1_728_432_000_000;
const CURSOR_INTERVAL_MS: u64 = 20_000;

/// The body of a read: a JSON array of the messages, or the records' bytes back to back
/// (the first `skip_bytes` of the first record left out: a read from inside a record). The
/// records' stored buffers are used as they are, not joined.
pub(super) fn encode(batch: &ReadBatch, json: bool, skip_bytes: u64) -> Vec<Bytes> {
    const OPEN: Bytes = Bytes::from_static(b"[");
    const COMMA: Bytes = Bytes::from_static(b",");
    const CLOSE: Bytes = Bytes::from_static(b"]");
    if json {
        let mut parts = Vec::with_capacity(batch.records.len() * 2 + 1);
        parts.push(OPEN);
        for (i, record) in batch.records.iter().enumerate() {
            if i > 0 {
                parts.push(COMMA);
            }
            parts.push(record.body.clone());
        }
        parts.push(CLOSE);
        return parts;
    }
    batch
        .records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            if i == 0 && batch.from == r.offset {
                r.body.slice((skip_bytes as usize).min(r.body.len())..)
            } else {
                r.body.clone()
            }
        })
        .collect()
}

/// Joins the parts of a body (an SSE event needs its payload in one piece).
pub(super) fn joined(parts: Vec<Bytes>) -> Bytes {
    match parts.len() {
        0 => Bytes::new(),
        1 => parts.into_iter().next().unwrap_or_default(),
        _ => parts.concat().into(),
    }
}

/// The `Stream-Cursor` of a live response: the current 20 s interval, or past the client's
/// cursor by a random jitter when it echoed one at or ahead of that, so cursors never repeat.
pub(super) fn next_cursor(client: Option<&str>) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let interval = (now.as_millis() as u64).saturating_sub(CURSOR_EPOCH_MS) / CURSOR_INTERVAL_MS;
    match client.and_then(|c| c.parse::<u64>().ok()) {
        Some(cursor) if cursor >= interval => {
            // 1 to 180 intervals (up to an hour) of jitter, from the clock's nanoseconds.
            let jitter = 1 + u64::from(now.subsec_nanos()) % 180;
            // Saturating: a client's cursor near u64::MAX must not wrap to a smaller one.
            cursor.saturating_add(jitter).to_string()
        }
        _ => interval.to_string(),
    }
}
