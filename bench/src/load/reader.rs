//! Catch-up readers, one per stream: Pico pages (`format=binary`) or Durable Streams chunks
//! from the start, a short sleep when caught up.

use pico_proto::header::*;
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;

use super::clock::Shared;
use crate::wire::{self, READ_PAGE_BYTES};

/// Readers sleep this long when caught up.
const CAUGHT_UP_SLEEP: Duration = Duration::from_millis(10);

/// What a reader's request came back with.
pub(super) enum Page {
    /// `200`: its headers and whole body.
    Ready(reqwest::header::HeaderMap, bytes::Bytes),
    /// Throttled (`429`/`503`): ask again after a short pause.
    Retry,
    /// Failed (recorded) or the run is over.
    Stop,
}

pub(super) async fn fetch_page(
    shared: &Shared,
    name: &str,
    request: reqwest::RequestBuilder,
) -> Page {
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
pub(super) fn header(headers: &reqwest::header::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// A reader caught up waits a moment before asking again; `false` once the run is over.
pub(super) async fn pause_caught_up(shared: &Shared) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(CAUGHT_UP_SLEEP) => true,
        _ = shared.until_stopped() => false,
    }
}

/// One catch-up reader: pages of up to 4 MiB (`format=binary`) from the beginning, 10 ms of
/// sleep when caught up.
pub(super) async fn reader(
    shared: Arc<Shared>,
    client: reqwest::Client,
    url: String,
    name: String,
) {
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
pub(super) async fn ds_reader(
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
